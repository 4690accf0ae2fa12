"""data.deterministic (the default): async runs reproduce bit for bit.

Batch n is sampled with exactly the weights of step max(0, n - max_async_level), even when the trainer has
published newer ones, and a stream loads an update at a point fixed by the schedule; so two runs of one
recipe and seed give identical rollouts, rewards, losses, grad norms and final checkpoints, whether the
trainer or the engine happens to be faster."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.main import main
from grpokit.orchestrator.weights import WeightSchedule
from grpokit.testing import tiny_fit_argv
from grpokit.types import WeightUpdate
from tests.support import read_metrics

STEPS = 4
COMPARED = ("reward", "reward_std", "tokens", "loss", "grad_norm", "kl", "off_policy_gap_max", "completion_len")


class _Engine:
    """An engine that only records which weights it loaded."""

    servers_load_weights = False

    def __init__(self) -> None:
        self.weight_step, self.loaded = -1, []

    def load_weights(self, update: WeightUpdate) -> None:
        self.weight_step = update.step
        self.loaded.append(update.step)


def _published(tmp_path, steps) -> FilesystemBroadcast:
    broadcast = FilesystemBroadcast(keep_last=10)
    broadcast.setup(tmp_path)
    for step in steps:
        broadcast.publish(WeightUpdate(step=step, tensors={"w": torch.full((2,), float(step))}))
    return broadcast


def _schedule(broadcast, engine, deterministic: bool, k: int = 1) -> WeightSchedule:
    return WeightSchedule(engine, broadcast, k, 1, deterministic, 5.0, "data.timeout")


def test_the_schedule_loads_the_step_it_names_not_the_newest(tmp_path):
    broadcast, engine = _published(tmp_path, [0, 1, 2, 3]), _Engine()
    schedule = _schedule(broadcast, engine, deterministic=True)
    schedule.wait(schedule.needed(2), threading.Event())  # generation 2 at max_async_level 1: step 1
    assert engine.loaded == [1]
    schedule.wait(schedule.needed(3), threading.Event())
    assert engine.loaded == [1, 2]
    newest = _schedule(broadcast, _Engine(), deterministic=False)
    newest.wait(newest.needed(2), threading.Event())
    assert newest.engine.loaded == [3]  # data.deterministic false: the newest published


def test_a_pruned_step_is_replaced_by_the_next_with_a_warning(tmp_path, caplog):
    broadcast, engine = _published(tmp_path, [3, 4]), _Engine()  # steps 1 and 2 are gone (a resumed run)
    schedule = _schedule(broadcast, engine, deterministic=True)
    with caplog.at_level("WARNING"):
        schedule.wait(1, threading.Event())
    assert engine.loaded == [4] or engine.loaded == [3]
    assert "does not reproduce bit for bit" in caplog.text


def test_a_broadcast_that_keeps_only_the_newest_is_refused(tmp_path):
    broadcast = FilesystemBroadcast()
    broadcast.keeps_steps = False
    with pytest.raises(ValueError, match="data.deterministic: false"):
        _schedule(broadcast, _Engine(), deterministic=True)
    assert not _schedule(broadcast, _Engine(), deterministic=True, k=0).exact  # k = 0: the newest is the step


def _fit(tmp_path, tiny_model, name: str, *overrides: str) -> tuple[list[dict], dict]:
    argv = tiny_fit_argv(
        tmp_path, tiny_model, name, "--data.batch_size", "16", "--data.sampling.max_tokens", "12",
        "--data.seq_len", "256", "--trainer.max_steps", str(STEPS), "--ckpt.interval", str(STEPS),
        "--model.lr", "1e-3", "--data.eval", "null",
        *overrides,
    )  # fmt: skip
    assert main(argv) == 0
    run = tmp_path / name
    rows = [{k: r[k] for k in COMPARED if k in r} for r in read_metrics(run)]
    checkpoint = torch.load(run / "checkpoints" / f"step_{STEPS}.ckpt", map_location="cpu", weights_only=False)
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    return rows, {"state": checkpoint["state_dict"], "samples": samples}


def _assert_same(a, b) -> None:
    (rows_a, rest_a), (rows_b, rest_b) = a, b
    assert len(rows_a) == STEPS and rows_a == rows_b
    assert rest_a["samples"] == rest_b["samples"]
    assert rest_a["state"].keys() == rest_b["state"].keys()
    for name, tensor in rest_a["state"].items():
        assert torch.equal(tensor, rest_b["state"][name]), name


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole_batch", "streaming"])
def test_two_async_runs_of_one_recipe_are_identical(tmp_path, tiny_model, k, streaming):
    extra = ["--data.max_async_level", str(k)]
    if streaming:
        extra += ["--data.streaming", '{"max_inflight": 3}']
    first = _fit(tmp_path, tiny_model, "a", *extra)
    second = _fit(tmp_path, tiny_model, "b", *extra)
    _assert_same(first, second)
    for s in first[1]["samples"]:  # sampled with exactly the scheduled step (streaming: its oldest token)
        if not streaming:
            assert s["policy_step"] == max(0, s["step"] - k)
        else:
            assert max(0, s["step"] - k - 1) <= s["policy_step"] <= s["step"]


TASKS = {  # single-turn: tests/orchestrator/test_streaming.py
    "tool": ["--data.env", "[{id: calculator, args: {min_digits: 1, max_digits: 2}}]", "--data.max_turns", "3"],
    "multi_turn_game": ["--data.env", "[{id: guess-number, args: {num_tasks: 20}}]", "--data.max_turns", "3"],
    "env_episodes": [
        "--data.env",
        "[{id: user-sim+reverse-text, env_args: {user: {max_turns: 2}}}]",
        "--data.max_turns",
        "3",
    ],
}


@pytest.mark.parametrize("task", list(TASKS))
def test_whole_batch_equals_streaming_at_async_level_0(tmp_path, tiny_model, task):
    """One rollout driver: whole-batch generation is the stream that admits a step's prompts at once into
    an idle stream, so a stream that holds a step's prompts at max_async_level 0 trains on the same."""
    extra = ["--data.max_async_level", "0", "--data.sampling.max_tokens", "12", "--data.seq_len", "1024", *TASKS[task]]
    whole = _fit(tmp_path, tiny_model, "whole", *extra)
    streamed = _fit(tmp_path, tiny_model, "streamed", *extra, "--data.streaming", '{"max_inflight": 4}')
    _assert_same(whole, streamed)
