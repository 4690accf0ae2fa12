"""Packing: bins respect seq_len, every token lands once with the right masks and advantages."""

import pytest
import torch

from grpokit.orchestrator.packing import first_fit_decreasing, first_fit_decreasing_tree, num_positions, pack
from tests.support import make_rollout


def rollout(prompt_len, completion_len, reward=0.0):
    return make_rollout(range(100, 100 + completion_len), prompt_ids=range(1, prompt_len + 1), reward=reward)


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


def test_first_fit_decreasing_tree_counts_only_the_tokens_after_a_shared_prefix():
    shared = [7, 7, 7, 7]
    seqs = [shared + [1, 2], shared + [1, 3], shared + [4], [9, 9, 9]]  # a tree of 4 + 2 + 1 + 1 nodes, then 3
    assert first_fit_decreasing_tree(seqs, 8) == [[0, 1, 2], [3]]  # 8 nodes; the 9s share nothing: a new bin
    assert first_fit_decreasing_tree(seqs, 11) == [[0, 1, 2, 3]]
    assert first_fit_decreasing(list(map(len, seqs)), 11) == [
        [0, 2],
        [1, 3],
    ]  # counted as tokens (6 + 6 + 5 + 3): two bins
    with pytest.raises(ValueError, match="seq_len=5"):
        first_fit_decreasing_tree(seqs, 5)


def test_pack_by_prefix_tree_keeps_every_rollout_once_within_seq_len_nodes():
    system = list(range(1, 31))  # GRPO-shaped: 4 prompts x 8 completions behind one 30-token system prompt
    group = [
        make_rollout([300 + c] * (c % 5 + 1), prompt_ids=system + [200 + p] * 6, group_id=p)
        for p in range(4)
        for c in range(8)
    ]
    advantages = [[1.0] * len(r.completion_ids) for r in group]
    by_tokens = pack(group, advantages, [True] * 32, seq_len=200)
    by_tree = pack(group, advantages, [True] * 32, seq_len=200, prefix_tree=True)
    assert len(by_tokens) == 7 and len(by_tree) == 1  # 1,236 tokens; 30 + 4 x 6 + 4 x 21 nodes
    assert [num_positions(mb, True) for mb in by_tree] == [138] and num_positions(by_tree[0], False) == by_tree[
        0
    ].num_tokens == 1236

    def same(mbs):
        return sorted(
            tuple(mb.input_ids_T[s:e].tolist())
            for mb in mbs
            for s, e in zip(
                (torch.cumsum(mb.seq_lens_N, 0) - mb.seq_lens_N).tolist(), torch.cumsum(mb.seq_lens_N, 0).tolist()
            )
        )

    assert same(by_tree) == same(by_tokens)  # the same sequences, each once
