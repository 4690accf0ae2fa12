"""Where the orchestrator gets its engine's weights, and with them the trainer's progress.

The orchestrator waits for weights of a step before it samples that step's batch (max_async_level):
`source.poll(engine.weight_step)` returns a newer WeightUpdate, which it loads into its engine and then
checks the engine holds (grpokit.common.loaded_weights: a mismatch stops the run naming the step). The
source is the broadcast itself, unless the broadcast is one only the engine's process may poll
(`observable = False`: NCCLBroadcast, IPCBroadcast) and the engine is a client of servers that load it
themselves (`servers_load_weights`: RemoteEngine in front of `grpokit infer`). Then the source is the
servers: the step they hold is what the next batch will be sampled with, and polling the broadcast here
would take the engine's place in it (NCCL) or map weights this process never uses (IPC).
"""

from __future__ import annotations

import logging
import time

from grpokit.broadcast import WeightBroadcast
from grpokit.common.loaded_weights import check_loaded, update_source
from grpokit.common.waits import WaitNotice
from grpokit.inference import InferenceEngine
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)


class ServedWeights:
    """The servers' weights as a poll: an update without tensors (they are in the servers already)
    whose step is the oldest any server holds, once it is newer than `after_step`."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine

    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        step = self.engine.served_weight_step(upto)
        return WeightUpdate(step=step, tensors={}, in_engine=True) if step > after_step else None


def weight_source(engine: InferenceEngine, broadcast: WeightBroadcast) -> WeightBroadcast | ServedWeights:
    """The broadcast, or the engine's servers when only they may poll it; refuses more servers than the
    broadcast reaches (NCCLBroadcast: one)."""
    if broadcast.observable or not engine.servers_load_weights:
        return broadcast
    servers = len(engine.base_urls)
    if broadcast.max_engines is not None and servers > broadcast.max_engines:
        raise ValueError(
            f"broadcast: {type(broadcast).__name__} reaches {broadcast.max_engines} engine process(es), but "
            f"inference.init_args.base_url lists {servers} servers. List one, or use broadcast: FilesystemBroadcast "
            "(any number of servers poll it)."
        )
    return ServedWeights(engine)


class WeightSchedule:
    """Which weights sample which generation, and the waits for them: the one place that holds
    data.max_async_level, data.deterministic and the weights timeout (whole-batch and streaming alike).

    Generation g (its first step n = g x steps_per_generation) is sampled with weights of step
    `needed(g) = max(0, n - max_async_level)`. Deterministic (the default): with exactly that step, even
    when the trainer has published newer ones (the broadcast keeps them: `poll(held, upto=step)`), so the
    weights that sample a batch are a function of the step and two runs of a recipe and seed sample the
    same rollouts. Not deterministic (`data.deterministic: false`): with the newest step published,
    at least `needed(g)`, loaded as soon as it appears (a little more throughput; which step samples a
    batch then depends on timing).

    A step that can no longer be loaded (a resumed run whose broadcast pruned it) is replaced by the
    oldest newer one, with a warning that the run no longer reproduces bit for bit. At max_async_level 0
    the newest published step is the scheduled one (the trainer cannot publish past it without the
    batch), so any broadcast serves; at k >= 1 the broadcast must keep steps (`keeps_steps`).
    """

    def __init__(
        self,
        engine: InferenceEngine,
        broadcast: WeightBroadcast,
        max_async_level: int,
        steps_per_generation: int,
        deterministic: bool,
        timeout: float,
        timeout_key: str,
    ) -> None:
        # at max_async_level 0 the newest published step is the scheduled one (the trainer cannot be ahead)
        self.exact = deterministic and max_async_level > 0
        if self.exact and not broadcast.keeps_steps:
            raise ValueError(
                f"data.deterministic samples each batch with one given weight step, which {type(broadcast).__name__} "
                "cannot hand out (it keeps only the newest): set data.deterministic: false, or use "
                "broadcast: FilesystemBroadcast"
            )
        self.engine, self.broadcast = engine, broadcast
        self.source = weight_source(engine, broadcast)  # the broadcast, or the servers when only they may poll it
        self.max_async_level, self.steps_per_generation = max_async_level, steps_per_generation
        self.deterministic, self.timeout, self.timeout_key = deterministic, timeout, timeout_key
        self._missing_checked: tuple[int, float] | None = None  # (step, when): the last look for a pruned step

    def needed(self, generation: int) -> int:
        """The weight step that samples `generation` (deterministic), or the oldest that may."""
        return max(0, generation * self.steps_per_generation - self.max_async_level)

    def deliverable(self, step: int, generations_sent: int) -> bool:
        """Whether the trainer can publish `step` without another batch from us: it has every batch of the
        first `generations_sent` generations, so it publishes steps up to generations_sent x
        steps_per_generation. A stream may wait for a deliverable step without deadlocking."""
        return step <= generations_sent * self.steps_per_generation

    def poll(self, step: int, load=None) -> bool:
        """One look at the published weights: load what the schedule allows toward `step` (through `load`,
        default the engine's load_weights); True once the engine holds `step` (or newer)."""
        held = self.engine.weight_step
        if held >= step:
            return True
        update = self.source.poll(held, upto=step) if self.exact else self.source.poll(held)
        if update is None and self.exact:
            update = self._replacement(step)
        if update is not None:
            (load or self.engine.load_weights)(update)
            check_loaded(self.engine, update, update_source(self.broadcast, update))
        return self.engine.weight_step >= step

    def _replacement(self, step: int):
        """The oldest step newer than `step` when `step` itself is gone from the broadcast (steps are
        published in order, so a newer one without it means it will never come); looked for at most
        once a second, since reading an update reads its tensors."""
        now = time.monotonic()
        if self._missing_checked is not None and self._missing_checked[0] == step:
            if now - self._missing_checked[1] < 1.0:
                return None
        self._missing_checked = (step, now)
        held = self.engine.weight_step
        newer = self.source.poll(held)
        if newer is None or newer.step <= step:
            return None
        again = self.source.poll(held, upto=step)  # published meanwhile, just before the newer one?
        if again is not None:
            return again
        log.warning(
            "weights of step %d are gone from the broadcast (pruned before this resumed run needed them); "
            "sampling with step %d instead: from here this run does not reproduce bit for bit",
            step,
            newer.step,
        )
        return newer

    def wait(self, step: int, stopping, announce: bool = False, load=None) -> None:
        """Block until the engine holds `step` (see `poll`); raises TimeoutError after the weights timeout
        and RuntimeError when `stopping` is set."""
        deadline = time.monotonic() + self.timeout
        notice = WaitNotice(
            f"waiting for the trainer's weights of step {step} ({type(self.broadcast).__name__}); "
            f"the engine holds step {self.engine.weight_step}"
        )
        while not self.poll(step, load):
            if stopping.is_set():
                raise RuntimeError("orchestrator stopped while waiting for weights")
            if announce:
                notice.tick()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no weights of step >= {step} after {self.timeout:.0f}s ({self.timeout_key}): "
                    "is the trainer (`grpokit train`) running and publishing through the same "
                    f"broadcast ({type(self.broadcast).__name__}){self._source_hint()}?"
                )
            time.sleep(0.05)

    def _source_hint(self) -> str:
        if self.source is self.broadcast:
            return ""
        return (
            " to the server (`grpokit infer`: only it may poll this broadcast, "
            f"so the orchestrator asks it; it holds step {self.engine.weight_step})"
        )
