"""Per-step rollout metrics: rewards, lengths, truncation, off-policy gap, filter fractions."""

from __future__ import annotations

import torch

from grpokit.types import Rollout


def batch_metrics(
    step: int, rollouts: list[Rollout], rewards_PG: torch.Tensor, flags: dict[str, list[bool]]
) -> dict[str, float]:
    lengths = torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.float64)
    gaps = torch.tensor([step - r.policy_step for r in rollouts], dtype=torch.float64)
    metrics = {
        "reward": float(rewards_PG.mean()),
        "reward_std": float(rewards_PG.std(correction=0)),
        "zero_std_frac": float((rewards_PG.std(-1, correction=0) == 0).double().mean()),
        "seq_len": float(lengths.mean()),
        "truncated_frac": sum(r.is_truncated for r in rollouts) / len(rollouts),
        "off_policy_gap": float(gaps.mean()),
        "off_policy_gap_max": float(gaps.max()),
    }
    for key in sorted({k for r in rollouts for k in r.metrics}):
        metrics[f"env/{key}"] = sum(r.metrics.get(key, 0.0) for r in rollouts) / len(rollouts)
    for name, flagged in flags.items():
        metrics[f"filter/{name}"] = sum(flagged) / len(flagged)
    return metrics
