"""Packing rollouts into micro-batches of at most seq_len tokens (first-fit decreasing)."""

from __future__ import annotations

import torch

from grpokit.types import MicroBatch, Rollout


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Group item indices into bins whose lengths sum to <= capacity, longest items first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > capacity:
            raise ValueError(f"a sequence of {lengths[i]} tokens exceeds data.seq_len={capacity}: raise seq_len or lower sampling.max_tokens")
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def pack(rollouts: list[Rollout], advantages: list[list[float]], trainable: list[bool], seq_len: int) -> list[MicroBatch]:
    """Pack rollouts (prompt + completion each) into micro-batches.

    `advantages` holds one value per completion token of each rollout (Advantage.token_advantages).
    loss_mask is 1 on completion tokens the policy wrote, 0 on prompts and on rollouts that are not
    trainable (flagged by an enforcing filter). An expert rollout's completion tokens go to expert_mask
    instead of loss_mask.
    """
    bins = first_fit_decreasing([r.num_tokens for r in rollouts], seq_len)
    return [_micro_batch([rollouts[i] for i in b], [advantages[i] for i in b], [trainable[i] for i in b]) for b in bins]


def _micro_batch(rollouts: list[Rollout], advantages: list[list[float]], trainable: list[bool]) -> MicroBatch:
    ids, pos, mask, adv, logp, expert = [], [], [], [], [], []
    for r, a, keep in zip(rollouts, advantages, trainable):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids += r.prompt_ids + r.completion_ids
        pos += list(range(p + c))
        trained = [float(m) * keep for m in r.completion_mask]
        mask += [0.0] * p + ([0.0] * c if r.is_expert else trained)
        expert += [0.0] * p + (trained if r.is_expert else [0.0] * c)
        if len(a) != c:
            raise ValueError(f"rollout {r.example_id}: {len(a)} token advantages for {c} completion tokens")
        adv += [0.0] * p + list(a)
        logp += [0.0] * p + r.completion_logprobs
    return MicroBatch(
        input_ids_T=torch.tensor(ids, dtype=torch.long),
        position_ids_T=torch.tensor(pos, dtype=torch.long),
        loss_mask_T=torch.tensor(mask, dtype=torch.float32),
        advantages_T=torch.tensor(adv, dtype=torch.float32),
        inference_logprobs_T=torch.tensor(logp, dtype=torch.float32),
        seq_lens_N=torch.tensor([r.num_tokens for r in rollouts], dtype=torch.long),
        is_truncated_N=torch.tensor([r.is_truncated for r in rollouts], dtype=torch.bool),
        expert_mask_T=torch.tensor(expert, dtype=torch.float32),
    )
