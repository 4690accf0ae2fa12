"""scripts/plot_timeline.py draws a run's timeline, streamed groups and weight updates included."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_timeline.py"


def load():
    spec = importlib.util.spec_from_file_location("plot_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_groups_take_the_lowest_free_lane():
    spans = [{"start": 0, "end": 2}, {"start": 1, "end": 3}, {"start": 2, "end": 4}, {"start": 2.5, "end": 5}]
    assert load().lanes(spans) == [0, 1, 0, 2]


def test_a_streamed_runs_timeline_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    events = [
        {"role": "orchestrator", "step": 0, "start": 0.0, "end": 1.0, "policy_step": 0},
        {"role": "trainer", "step": 0, "start": 1.0, "end": 2.0},
        {"role": "weights", "step": 1, "start": 2.0, "end": 2.01, "inflight": 2},
        {"role": "group", "step": 0, "start": 0.0, "end": 0.9, "group_id": 0, "first_weights": 0, "last_weights": 0},
        {"role": "group", "step": 1, "start": 0.5, "end": 2.5, "group_id": 1, "first_weights": 0, "last_weights": 1},
    ]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    load().main(str(tmp_path), str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 1000
