"""A sweep's run is done only when it exited 0 having trained every step asked: a run stopped by SIGTERM
(exit 143) or one that exited 0 short of trainer.max_steps (what a SIGTERM'd `grpokit fit` did before it
exited 143) is launched again by the rerun, and the report leaves it out of its curves and tables and
says so. The runs here are stand-in processes that write a metrics.csv of N steps and exit with a given
code (no training): tests/faults/test_signals.py stops a real run."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from grpokit.sweep.launchers import LocalLauncher
from grpokit.sweep.report import write_report
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import load_sweep
from grpokit.sweep.state import run_outcome

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")
STEPS = 4
IDS = ("00-lr=0.0001", "01-lr=0.0002", "02-lr=0.0003")
# a run's stand-in: the metrics.csv rows of steps 0..N-1 (as a resumed run keeps the earlier ones), then exit
STAND_IN = """
import csv, sys
path, steps, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "loss", "reward"])
    w.writerows([[s, 0.5, 0.1 * s] for s in range(steps)])
raise SystemExit(code)
"""


def sweep_runner(tmp_path: Path, outcomes: dict[str, tuple[int, int]]) -> SweepRunner:
    """A 3-run sweep whose run `id` writes outcomes[id] = (steps, exit code)."""
    path = tmp_path / "lrs.yaml"
    path.write_text(yaml.safe_dump({"axes": {"model.lr": [1.0e-4, 2.0e-4, 3.0e-4]}}))
    argv = ["--config", RECIPE, "--trainer.max_steps", str(STEPS)]
    runner = SweepRunner(load_sweep(path), argv, tmp_path / "sweep", LocalLauncher(), 3)

    def command(run):
        steps, code = outcomes[run.id]
        metrics = str(runner.run_dir(run) / "metrics.csv")
        return [sys.executable, "-c", STAND_IN, metrics, str(steps), str(code)], None

    runner.command = command
    return runner


def states(tmp_path: Path) -> dict[str, dict]:
    return json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"]


def test_a_sigtermed_run_and_one_short_of_its_steps_are_not_done_and_run_again(tmp_path):
    first = {IDS[0]: (2, 143), IDS[1]: (2, 0), IDS[2]: (STEPS, 0)}
    assert sweep_runner(tmp_path, first).run() == 1
    ended = states(tmp_path)
    assert {k: (v["state"], v["returncode"], v["steps"]) for k, v in ended.items()} == {
        IDS[0]: ("failed", 143, 2),
        IDS[1]: ("incomplete", 0, 2),
        IDS[2]: ("done", 0, STEPS),
    }

    report = write_report(tmp_path / "sweep", ["reward"], last_k=2).read_text()
    assert (
        f"**Left out of the curves and tables, not finished**: {IDS[0]} (failed (exit 143), 2 of {STEPS} steps), "
        f"{IDS[1]} (incomplete, 2 of {STEPS} steps)." in report
    )
    assert f"| {IDS[2]} | model.lr=0.0003 | done | {STEPS} of {STEPS} | 1 |" in report
    assert "| model.lr=0.0003 | 1 |" in report and "| model.lr=0.0001 | 1 |" not in report  # final table

    assert sweep_runner(tmp_path, dict.fromkeys(IDS, (STEPS, 0))).run() == 0
    again = states(tmp_path)
    assert {k: (v["state"], v["attempts"]) for k, v in again.items()} == {
        IDS[0]: ("done", 2),
        IDS[1]: ("done", 2),
        IDS[2]: ("done", 1),  # finished runs are skipped
    }
    report = write_report(tmp_path / "sweep", ["reward"], last_k=2).read_text()
    assert "Left out" not in report and "| model.lr=0.0001 | 1 |" in report


def test_a_run_an_older_sweep_marked_done_short_of_its_steps_is_left_out_and_run_again(tmp_path):
    """sweep.json of a grpokit that took a SIGTERM'd `grpokit fit`'s exit 0 for done."""
    assert sweep_runner(tmp_path, {IDS[0]: (2, 0), IDS[1]: (STEPS, 0), IDS[2]: (STEPS, 0)}).run() == 1
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    saved["runs"][IDS[0]]["state"] = "done"
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(saved))

    report = write_report(tmp_path / "sweep", ["reward"], last_k=2).read_text()
    assert f"{IDS[0]} (incomplete, 2 of {STEPS} steps)" in report
    assert f"| {IDS[0]} | model.lr=0.0001 | incomplete | 2 of {STEPS} | 1 |" in report

    assert sweep_runner(tmp_path, dict.fromkeys(IDS, (STEPS, 0))).run() == 0
    assert {k: (v["state"], v["attempts"]) for k, v in states(tmp_path).items()} == {
        IDS[0]: ("done", 2),
        IDS[1]: ("done", 1),
        IDS[2]: ("done", 1),
    }


@pytest.mark.parametrize(
    ("returncode", "steps", "asked", "outcome"),
    [
        (0, 4, 4, "done"),
        (0, 2, 4, "incomplete"),
        (143, 2, 4, "failed"),
        (130, 4, 4, "failed"),  # a non-zero exit is never done, whatever metrics.csv holds
        (0, 7, None, "done"),  # trainer.max_steps -1: the count is known once the run starts
        (1, 0, None, "failed"),
    ],
)
def test_run_outcome(returncode, steps, asked, outcome):
    assert run_outcome(returncode, steps, asked) == outcome
