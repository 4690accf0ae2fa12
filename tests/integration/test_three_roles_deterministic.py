"""data.deterministic in the three-process mode: `grpokit infer | orchestrate | train` twice on one recipe
and seed give the same metrics, samples and final checkpoint. The orchestrator waits for exactly the
scheduled step and each request asks the server for weights of at most that step (`max_weight_step`),
so a trainer that has already published newer weights changes nothing."""

import csv
import json

import pytest
import torch

from grpokit.testing import free_port
from tests.integration.test_three_roles import check_run, stop, three_roles, wait_ok

STEPS = 4
COMPARED = ("reward", "tokens", "loss", "grad_norm", "kl", "off_policy_gap_max")


def _run(tmp_path, tiny_model, k: int):
    tmp_path.mkdir()
    extra = ["--data.max_async_level", str(k), "--ckpt.interval", str(STEPS), "--data.num_logged_samples", "16"]
    with three_roles(tmp_path, tiny_model, free_port(), STEPS, extra) as procs:
        wait_ok(procs, tmp_path)
        stop(procs, tmp_path)
    run = tmp_path / "mp"
    check_run(run, STEPS, max_lag=k)
    rows = [{c: r[c] for c in COMPARED} for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")]
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    state = torch.load(run / "checkpoints" / f"step_{STEPS}.ckpt", map_location="cpu", weights_only=False)
    return rows, samples, state["state_dict"]


@pytest.mark.parametrize("k", [1, 2])
def test_two_three_process_runs_are_identical(tmp_path, tiny_model, k):
    rows_a, samples_a, state_a = _run(tmp_path / "a", tiny_model, k)
    rows_b, samples_b, state_b = _run(tmp_path / "b", tiny_model, k)
    assert rows_a == rows_b and len(rows_a) == STEPS
    assert samples_a == samples_b
    assert all(s["policy_step"] == max(0, s["step"] - k) for s in samples_a)  # exactly the scheduled weights
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert torch.equal(tensor, state_b[name]), name
