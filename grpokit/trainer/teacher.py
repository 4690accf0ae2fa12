"""The frozen teacher model of on-policy distillation (`model.teacher_model`).

The trainer scores every micro-batch's tokens under the teacher, as it does under the reference policy,
and hands them to the loss as `teacher_logprobs_T`. The tokens are the policy's, so the teacher must
use the same tokenizer: a teacher whose vocabulary differs is refused here, before any step, since its
logprobs of the policy's token ids would be of other strings.
"""

from __future__ import annotations

import torch

from grpokit.common.models import load_causal_lm, load_tokenizer


def load_teacher(name: str, policy_name: str, dtype: torch.dtype) -> torch.nn.Module:
    """The teacher `name` in eval mode without gradients, after checking it shares the policy's tokenizer."""
    if load_tokenizer(name).get_vocab() != load_tokenizer(policy_name).get_vocab():
        raise ValueError(
            f"model.teacher_model {name!r} has a different tokenizer from model.model {policy_name!r}: the teacher "
            "scores the policy's token ids, so pick a teacher of the same model family (same vocabulary)"
        )
    return load_causal_lm(name, dtype=dtype).eval().requires_grad_(False)
