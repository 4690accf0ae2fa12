"""Co-locate `fit`: the rollout thread stops at on_train_end (StopRolloutThread), before Lightning's
teardown moves the model off the device and empties the CUDA cache, which must not run during the
engine's graph capture or decode. Training that ends early (a Ctrl-C, StopOnInterrupt) leaves the
thread generating later steps: without the callback it ran on into that teardown."""

from __future__ import annotations

import threading
from pathlib import Path

import lightning as L
from lightning.pytorch.strategies import Strategy

from grpokit.main import main
from grpokit.testing import tiny_fit_argv


def rollout_thread_alive() -> bool:
    return any(t.name == "grpokit-orchestrator" and t.is_alive() for t in threading.enumerate())


class StopAfterFirstStep(L.Callback):
    """What StopOnInterrupt does at a Ctrl-C: end training after the step in progress."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = True


def test_training_that_ends_early_stops_the_rollout_thread_before_teardown(tmp_path, tiny_model, monkeypatch):
    seen: list[bool] = []
    teardown = Strategy.teardown

    def recording_teardown(self, *args, **kwargs):
        seen.append(rollout_thread_alive())
        return teardown(self, *args, **kwargs)

    monkeypatch.setattr(Strategy, "teardown", recording_teardown)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the callback below, by class path
    argv = tiny_fit_argv(tmp_path, tiny_model, "run", "--trainer.max_steps", "6", "--data.max_async_level", "2")
    argv += ["--trainer.callbacks+=test_rollout_thread.StopAfterFirstStep"]
    assert main(argv) == 0
    assert seen == [False]


def test_a_resumed_lora_run_samples_only_after_the_engine_shares_the_trainers_base_weights(
    tmp_path, tiny_model, monkeypatch
):
    """A resumed run's engine holds weights to sample with before `trainer.fit` starts, while
    ShareBaseWeights frees the engine's base weights at on_train_start: the rollout thread must wait
    for it (ShareBaseWeights.ready), or it decodes from freed memory or graphs captured over it."""
    from grpokit.inference.builtin import BuiltinEngine

    def run(name: str, *more: str) -> None:
        argv = tiny_fit_argv(tmp_path, tiny_model, "run", "--ckpt.interval", "2", *more)
        assert main(argv) == 0, name

    run("first", "--trainer.max_steps", "2")
    events: list[str] = []
    share, open_stream = BuiltinEngine.share_base_weights, BuiltinEngine.open_stream

    def recording_share(self, *args, **kwargs):
        events.append("share")
        return share(self, *args, **kwargs)

    def recording_open_stream(self, *args, **kwargs):  # the rollout driver samples through a stream
        events.append("sample")
        return open_stream(self, *args, **kwargs)

    monkeypatch.setattr(BuiltinEngine, "share_base_weights", recording_share)
    monkeypatch.setattr(BuiltinEngine, "open_stream", recording_open_stream)
    run("resumed", "--trainer.max_steps", "4", "--ckpt.resume_step", "-1")
    assert events[0] == "share" and events.count("share") == 1 and "sample" in events
