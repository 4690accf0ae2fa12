"""Per-step rollout metrics: rewards, lengths, truncation, finish reasons, off-policy gap, filter fractions."""

from __future__ import annotations

import torch

from grpokit.inference.finish import FINISH_REASONS
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
        **finish_fractions(rollouts),
        "off_policy_gap": float(gaps.mean()),
        "off_policy_gap_max": float(gaps.max()),
    }
    for key in sorted({k for r in rollouts for k in r.metrics}):
        metrics[f"env/{key}"] = sum(r.metrics.get(key, 0.0) for r in rollouts) / len(rollouts)
        if key.startswith("reward/"):
            metrics.update(spread(f"env/{key}", [r.metrics.get(key, 0.0) for r in rollouts]))
    for name, flagged in flags.items():
        metrics[f"filter/{name}"] = sum(flagged) / len(flagged)
    return metrics


def finish_fractions(rollouts: list[Rollout]) -> dict[str, float]:
    """`rollout/finish_<reason>`: the fraction of the batch's rollouts that ended so, for each finish reason
    (grpokit.inference.finish), 0 included, so an abort is counted, never silent."""
    return {
        f"rollout/finish_{reason}": sum(r.finish_reason == reason for r in rollouts) / len(rollouts)
        for reason in FINISH_REASONS
    }


def spread(name: str, values: list[float]) -> dict[str, float]:
    """A reward function's (a judge's) score distribution over the step besides its mean: `<name>_std`
    (population), `<name>_min`, `<name>_max`, so that a judge's score moving beyond its noise, or a few
    outliers moving the mean, shows in metrics.csv."""
    t = torch.tensor(values, dtype=torch.float64)
    return {f"{name}_std": float(t.std(correction=0)), f"{name}_min": float(t.min()), f"{name}_max": float(t.max())}
