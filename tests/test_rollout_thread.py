"""Co-locate `fit`: the rollout thread runs from on_train_start to on_train_end (RolloutThread).

It starts only after the engine shares the trainer's base weights (a generation running during the
swap would read the freed copy on a GPU) and stops before Lightning's teardown moves the model off the
device and empties the CUDA cache (which must not run during the engine's graph capture or decode).
"""

from __future__ import annotations

import threading

from lightning.pytorch.strategies import Strategy

from grpokit.inference.builtin import BuiltinEngine
from grpokit.main import main
from grpokit.orchestrator.datamodule import Orchestrator
from grpokit.testing import tiny_fit_argv


def rollout_thread_alive() -> bool:
    return any(t.name == "grpokit-orchestrator" and t.is_alive() for t in threading.enumerate())


def test_the_rollout_thread_starts_after_the_weights_are_shared_and_ends_before_teardown(
    tmp_path, tiny_model, monkeypatch
):
    events: list[tuple[str, bool]] = []

    def record(name, original):
        def wrapper(self, *args, **kwargs):
            events.append((name, rollout_thread_alive()))
            return original(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(BuiltinEngine, "share_base_weights", record("share", BuiltinEngine.share_base_weights))
    monkeypatch.setattr(Orchestrator, "start", record("start", Orchestrator.start))
    monkeypatch.setattr(Strategy, "teardown", record("teardown", Strategy.teardown))
    assert main(tiny_fit_argv(tmp_path, tiny_model, "run", "--trainer.max_steps", "2")) == 0
    names = [name for name, _ in events]
    assert names.index("share") < names.index("start") < names.index("teardown"), events
    assert not any(alive for name, alive in events if name in ("share", "teardown")), events
