"""max_async_level: the off-policy gap stays within the bound, and engine and trainer work at the same time."""

import json

from grpokit.common.timeline import read_timeline
from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_async_level_2_bounds_the_gap_and_overlaps(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.batch_size",
        "16",
        "--data.sampling.max_tokens",
        "16",
        "--data.seq_len",
        "256",
        "--data.max_async_level",
        "2",
        "--trainer.max_steps",
        "8",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    run = tmp_path / "r"
    for line in open(run / "samples.jsonl"):
        s = json.loads(line)
        assert 0 <= s["step"] - s["policy_step"] <= 2
    rows = read_metrics(run)
    assert len(rows) == 8 and all(float(r["off_policy_gap_max"]) <= 2 for r in rows)

    timeline = read_timeline(run)
    gen = [(e["start"], e["end"]) for e in timeline if e["role"] == "orchestrator"]
    train = [(e["start"], e["end"]) for e in timeline if e["role"] == "trainer"]
    assert len(gen) == 8 and len(train) == 8
    overlapping = [(g, t) for g in gen for t in train if g[0] < t[1] and t[0] < g[1]]
    assert overlapping, "the engine never generated while the trainer trained"
    # each batch waited for weights no older than step - 2
    assert all(e["step"] - e["policy_step"] <= 2 for e in timeline if e["role"] == "orchestrator")
