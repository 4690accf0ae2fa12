"""The check that an engine holds the weights it was handed: after every weight update, the engine's
tensors (InferenceEngine.loaded_tensors) are compared with the update's.

Together with the broadcast's own check of what it read (FilesystemBroadcast: each file against the
checksum the trainer published in STABLE) this shows that the engine samples with exactly the published
weights: a load that was skipped, loaded other weights, or left names out (a full update's
`load_state_dict(strict=False)` ignores names the model lacks) stops the run with a
WeightsNotLoadedError naming the step and the broadcast, instead of sampling on with stale weights that
every metric calls new.

What is compared: every element of an update up to FULL_CHECK_BYTES (a LoRA adapter: every step,
every weight); above it (full fine-tuning: 540 MB for a 135M model in float32, where a full compare or
a sha256 would add most of a second a step on a CPU, docs/reliability.md), SAMPLES evenly spaced
elements of every tensor, the last one included. Every tensor changes at every optimizer step, so a
skipped or wrong load differs in nearly every sample; damage to the bytes in transit is the
broadcast's checksum's to catch, not this one's.
"""

from __future__ import annotations

import torch

from grpokit.types import WeightUpdate

FULL_CHECK_BYTES = 64 << 20
SAMPLES = 1024


class WeightsNotLoadedError(RuntimeError):
    """The engine's weights after a load are not the update's."""


def check_loaded(engine, update: WeightUpdate, source: str) -> None:
    """Raise WeightsNotLoadedError unless `engine` holds `update`'s tensors (and noisy norm weights).
    `source` names where the update came from (the broadcast). Updates the broadcast put into the engine
    itself (`in_engine`: VLLMNCCLBroadcast, the servers' own loads) and engines that cannot show their
    tensors (loaded_tensors is None: vLLM, remote servers, which check their own loads) are not checked."""
    expected = {**update.tensors, **update.norm_tensors}  # the noisy norms win over a full update's clean ones
    if update.in_engine or not expected:
        return
    show = getattr(engine, "loaded_tensors", None)  # an engine not built on InferenceEngine cannot show them
    loaded = show(update) if show is not None else None
    if loaded is None:
        return
    if engine.weight_step != update.step:
        _fail(update, source, f"the engine reports step {engine.weight_step} after loading")
    sampled = sum(t.numel() * t.element_size() for t in expected.values()) > FULL_CHECK_BYTES
    for name in sorted(expected):
        problem = _difference(loaded.get(name), expected[name], sampled)
        if problem is not None:
            _fail(update, source, f"its {name!r} {problem}")


def update_source(broadcast, update: WeightUpdate) -> str:
    """Where an update came from, for error messages: the broadcast, and its folder when it has one."""
    name = type(broadcast).__name__
    return f"{name} ({update.path})" if update.path else name


def _difference(held: torch.Tensor | None, published: torch.Tensor, sampled: bool) -> str | None:
    """Why `held` (the engine's tensor) is not `published` (None if it is), in the engine's dtype."""
    if held is None:
        return "is not a weight of the engine's model (not loaded)"
    if held.shape != published.shape:
        return f"has shape {tuple(held.shape)}, published {tuple(published.shape)}"
    held, published = held.detach().reshape(-1), published.detach().reshape(-1)
    if sampled and held.numel() > SAMPLES:
        index = torch.arange(SAMPLES) * (held.numel() - 1) // (SAMPLES - 1)  # from the first to the last
        held, published = held[index.to(held.device)], published[index.to(published.device)]
    if not torch.equal(held.cpu(), published.to(held.dtype).cpu()):
        return "differs from the published one"
    return None


def _fail(update: WeightUpdate, source: str, why: str) -> None:
    raise WeightsNotLoadedError(
        f"the engine did not load the weights of step {update.step} from {source}: {why}. Sampling on would "
        f"train on rollouts of other weights while every metric names step {update.step}; stopping"
    )
