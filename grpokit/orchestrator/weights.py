"""Where the orchestrator gets its engine's weights, and with them the trainer's progress.

The orchestrator waits for weights of a step before it samples that step's batch (max_async_level):
`source.poll(engine.weight_step)` returns a newer WeightUpdate, which it loads into its engine. The
source is the broadcast itself, unless the broadcast is one only the engine's process may poll
(`observable = False`: NCCLBroadcast, IPCBroadcast) and the engine is a client of servers that load it
themselves (`servers_load_weights`: RemoteEngine in front of `grpokit infer`). Then the source is the
servers: the step they hold is what the next batch will be sampled with, and polling the broadcast here
would take the engine's place in it (NCCL) or map weights this process never uses (IPC).
"""

from __future__ import annotations

from grpokit.broadcast import WeightBroadcast
from grpokit.inference import InferenceEngine
from grpokit.types import WeightUpdate


class ServedWeights:
    """The servers' weights as a poll: an update without tensors (they are in the servers already)
    whose step is the oldest any server holds, once it is newer than `after_step`."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine

    def poll(self, after_step: int) -> WeightUpdate | None:
        step = self.engine.served_weight_step()
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
