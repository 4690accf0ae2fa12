"""Training batches for transport tests: a seeded random one, and an exact comparison of two."""

from __future__ import annotations

import torch

from grpokit.types import MicroBatch, TrainingBatch


def make_training_batch(step: int, tokens: int = 64) -> TrainingBatch:
    """A seeded TrainingBatch of two random micro-batches (for transport tests)."""
    g = torch.Generator().manual_seed(step)
    return TrainingBatch(
        step=step,
        micro_batches=[_random_micro_batch(g, tokens), _random_micro_batch(g, max(tokens // 2, 1))],
        temperature=0.7,
        metrics={"reward": 0.25 * step},
    )


def _random_micro_batch(g: torch.Generator, tokens: int) -> MicroBatch:
    return MicroBatch(
        input_ids_T=torch.randint(0, 1000, (tokens,), generator=g),
        position_ids_T=torch.arange(tokens),
        loss_mask_T=torch.ones(tokens),
        advantages_T=torch.randn(tokens, generator=g),
        inference_logprobs_T=-torch.rand(tokens, generator=g),
        seq_lens_N=torch.tensor([tokens]),
        is_truncated_N=torch.tensor([False]),
    )


def assert_same_batch(a: TrainingBatch, b: TrainingBatch) -> None:
    """Equal step, temperature, metrics, and every tensor and count of every micro-batch (prefix trees too)."""
    assert (a.step, a.temperature, a.metrics, len(a.micro_batches)) == (
        b.step,
        b.temperature,
        b.metrics,
        len(b.micro_batches),
    )
    for x, y in zip(a.micro_batches, b.micro_batches):
        for name, value in vars(x).items():
            other = getattr(y, name)
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other), name
            elif name == "prefix_tree" and value is not None and other is not None:
                for tree_name in ("input_ids_U", "position_ids_U", "node_T", "parent_U"):
                    assert torch.equal(getattr(value, tree_name), getattr(other, tree_name)), tree_name
            else:
                assert value == other, name
