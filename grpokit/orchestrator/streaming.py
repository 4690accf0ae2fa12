"""`data.streaming`: the settings of streamed rollouts. The rollout driver (grpokit.orchestrator.driver)
plays them: up to `max_inflight` groups in the engine, a new one submitted as one finishes, finished
groups batched as they finish, and new weights loaded between two decode steps while unfinished
rollouts continue (`on_update: continue`: their KV cache recomputed; `regenerate`: they restart from
their prompts). The losses use the engine's recorded logprob of each token, so the importance ratio of
a mixed-weight rollout compares each token with the weights that sampled it (docs/orchestrator.md says
which losses this is sound for)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class StreamingSettings:
    """Streaming rollouts (grpokit.orchestrator.streaming).

    Args:
        max_inflight: groups in the engine at once; a new one is submitted as one finishes. The builtin
            engine decodes up to max_inflight x rollouts_per_example rows together.
        on_update: what unfinished rollouts do when new weights load between two decode steps:
            "continue" (partial rollouts: later tokens come from the new weights, each token records
            its weight step), "regenerate" (they restart from their prompts with the new weights), or,
            with a server engine (RemoteEngine, VLLMEngine), "finish" (they end on the weights they
            began with; the update applies to the groups sent after it). With data.deterministic a server
            engine's stream always finishes them, so that it reproduces (grpokit.inference.ordered).
    """

    max_inflight: int = 8
    on_update: Literal["continue", "regenerate", "finish"] = "continue"

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(f"data.streaming.max_inflight must be >= 1 (groups in flight), got {self.max_inflight}")
        if self.on_update not in ("continue", "regenerate", "finish"):
            raise ValueError(f"data.streaming.on_update must be continue, regenerate or finish, got {self.on_update!r}")
