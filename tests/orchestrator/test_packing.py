"""Packing: bins respect seq_len, every token lands once with the right masks and advantages."""

import pytest
import torch

from grpokit.orchestrator.packing import first_fit_decreasing, pack
from grpokit.types import Rollout


def rollout(prompt_len, completion_len, reward=0.0):
    return Rollout(
        example_id=0, env_id="e", group_id=0, prompt_ids=list(range(1, prompt_len + 1)),
        completion_ids=list(range(100, 100 + completion_len)), completion_logprobs=[-0.5] * completion_len,
        completion_mask=[1] * completion_len, reward=reward, is_truncated=False, policy_step=0,
    )


def test_first_fit_decreasing_hand_case():
    assert first_fit_decreasing([5, 4, 3, 3, 1], 8) == [[0, 2], [1, 3, 4]]
    with pytest.raises(ValueError, match="seq_len=8"):
        first_fit_decreasing([9], 8)


def test_pack_fields():
    rollouts = [rollout(3, 2), rollout(2, 4), rollout(4, 1)]
    mbs = pack(rollouts, advantages=[[1.0] * 2, [-2.0] * 4, [0.5]], trainable=[True, True, False], seq_len=11)
    assert sum(mb.num_tokens for mb in mbs) == 5 + 6 + 5
    assert all(mb.num_tokens <= 11 for mb in mbs)
    assert sum(float(mb.loss_mask_T.sum()) for mb in mbs) == 2 + 4  # the untrainable rollout is masked
    for mb in mbs:
        assert int(mb.seq_lens_N.sum()) == mb.num_tokens
        starts = torch.cumsum(mb.seq_lens_N, 0) - mb.seq_lens_N
        assert torch.all(mb.position_ids_T[starts] == 0)
        assert torch.all(mb.advantages_T[mb.loss_mask_T == 1] != 0)
        assert torch.all(mb.inference_logprobs_T[mb.loss_mask_T == 1] == -0.5)
