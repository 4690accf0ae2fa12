"""data.deterministic in the three-process mode: `grpokit infer | orchestrate | train` twice on one recipe
and seed give the same metrics, samples and final checkpoint. The orchestrator waits for exactly the
scheduled step and each request asks the server for weights of at most that step (`max_weight_step`),
so a trainer that has already published newer weights changes nothing. Streamed (RemoteEngine's
OrderedStream): each group's request carries the step held when it was submitted, the server gets them
in submission order, and the groups come back in it, so the batches are the schedule's, not the
server's timing's."""

import csv
import json

import pytest
import torch

from grpokit.testing import free_port
from tests.integration.test_three_roles import check_run, stop, three_roles, wait_ok

COMPARED = ("reward", "tokens", "loss", "grad_norm", "kl", "off_policy_gap_max")
STREAMING = ["--data.streaming", "{max_inflight: 4}"]  # two steps' groups in flight


def _run(tmp_path, tiny_model, k: int, steps: int, streaming: bool):
    tmp_path.mkdir()
    extra = ["--data.max_async_level", str(k), "--ckpt.interval", str(steps), "--data.num_logged_samples", "16"]
    with three_roles(tmp_path, tiny_model, free_port(), steps, extra + (STREAMING if streaming else [])) as procs:
        wait_ok(procs, tmp_path)
        stop(procs, tmp_path)
    run = tmp_path / "mp"
    check_run(run, steps, max_lag=k + 1 if streaming else k)  # streamed: a late group trains a step later
    rows = [{c: r[c] for c in COMPARED} for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")]
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    state = torch.load(run / "checkpoints" / f"step_{steps}.ckpt", map_location="cpu", weights_only=False)
    return rows, samples, state["state_dict"]


@pytest.mark.parametrize(
    ("k", "steps", "streaming"),
    [(1, 4, False), (2, 4, False), (1, 3, True), (2, 4, True)],
    ids=["k1", "k2", "k1-streaming", "k2-streaming"],
)
def test_two_three_process_runs_are_identical(tmp_path, tiny_model, k, steps, streaming):
    rows_a, samples_a, state_a = _run(tmp_path / "a", tiny_model, k, steps, streaming)
    rows_b, samples_b, state_b = _run(tmp_path / "b", tiny_model, k, steps, streaming)
    assert rows_a == rows_b and len(rows_a) == steps
    assert samples_a == samples_b
    if not streaming:  # exactly the scheduled weights (a stream's group may land a step later)
        assert all(s["policy_step"] == max(0, s["step"] - k) for s in samples_a)
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert torch.equal(tensor, state_b[name]), name
