"""Per-token estimators of KL(p || q) on tokens sampled from p (Schulman 2020, "Approximating KL Divergence").

p is the policy (logp_T, with gradient), q the reference (logq_T, e.g. the initial policy). With
log r = logq - logp on each sampled token:

    k1 = -log r                = logp - logq                               unbiased for KL(p || q); high
                                                                           variance, negative on some tokens
    k2 = 0.5 (log r)^2         = 0.5 (logp - logq)^2                       biased, low variance: E_p[k2] equals
                                                                           KL(p || q) to second order as q -> p
    k3 = (r - 1) - log r       = exp(logq - logp) - (logq - logp) - 1      unbiased for KL(p || q), low
                                                                           variance, >= 0 on every token

Each is 0 where logp == logq. As a loss term differentiated through logp (samples held fixed), the
gradients target different things (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient
estimation for RL"):
    grad k1:  E_p[grad logp] = 0                                    no pull toward q in expectation
    grad k2:  E_p[(logp - logq) grad logp] = grad KL(p || q)         the reverse KL a penalty intends
    grad k3:  E_p[(1 - q/p) grad logp] = -E_q[grad logp] = grad KL(q || p)   the forward KL
In async GRPO the tokens come from the behaviour (inference) policy, not p: ClippedPG's
`use_on_policy_kl_approximation` reweights by p / p_behaviour to correct for that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]


def k1(logp_T: torch.Tensor, logq_T: torch.Tensor) -> torch.Tensor:
    """logp - logq: unbiased for KL(p || q), high variance."""
    return logp_T - logq_T


def k2(logp_T: torch.Tensor, logq_T: torch.Tensor) -> torch.Tensor:
    """0.5 (logp - logq)^2: low variance, biased; its gradient is KL(p || q)'s."""
    return 0.5 * (logp_T - logq_T) ** 2


def k3(logp_T: torch.Tensor, logq_T: torch.Tensor) -> torch.Tensor:
    """exp(logq - logp) - (logq - logp) - 1: unbiased for KL(p || q), never negative."""
    log_r_T = logq_T - logp_T
    return torch.exp(log_r_T) - log_r_T - 1


ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": k1, "k2": k2, "k3": k3}
