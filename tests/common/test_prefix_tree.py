"""Shared prefixes (grpokit.common.prefix_tree): the tree of a packed row, its mask, and logprobs, entropies and
gradients through it equal to the packed row's."""

from __future__ import annotations

import hashlib

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.prefix_tree import prefix_tree


def packed(seqs: list[list[int]]):
    ids = torch.tensor([t for s in seqs for t in s])
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    return ids, pos, torch.tensor([len(s) for s in seqs])


def test_the_tree_has_one_node_per_distinct_prefix_and_a_mask_of_ancestors():
    seqs = [[5, 6, 7], [5, 6, 8, 9], [5, 6, 7, 1], [4, 6]]
    tree = prefix_tree(*packed(seqs))
    # nodes in creation order: 5 6 7 | 8 9 | 1 | 4 6'
    assert tree.input_ids_U.tolist() == [5, 6, 7, 8, 9, 1, 4, 6]
    assert tree.position_ids_U.tolist() == [0, 1, 2, 2, 3, 3, 0, 1]
    assert tree.parent_U.tolist() == [-1, 0, 1, 1, 3, 2, -1, 6]
    assert tree.node_T.tolist() == [0, 1, 2, 0, 1, 3, 4, 0, 1, 2, 5, 6, 7]
    allowed = tree.attention_mask(torch.float32)[0, 0] == 0
    expected = {0: {0}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 1, 2, 5}, 6: {6}, 7: {6, 7}}
    assert {q: set(allowed[q].nonzero().squeeze(-1).tolist()) for q in range(8)} == expected


def test_positions_that_do_not_restart_at_zero_are_refused():
    ids, pos, lens = packed([[1, 2, 3]])
    with pytest.raises(ValueError, match="model.share_prefixes"):
        prefix_tree(ids, pos + 1, lens)


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)


def grpo_batch(vocab: int):
    """Two prompts sharing a system prefix, three completions each (two of them start alike), one
    unrelated sequence; the completions are the needed tokens."""
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, vocab, (6,), generator=g).tolist()
    seqs, needed = [], []
    for user in ([11, 12], [13]):
        prompt = system + user
        for completion in ([21, 22, 23], [21, 22, 24, 25], [26]):
            seqs.append(prompt + completion)
            needed += [False] * len(prompt) + [True] * len(completion)
    seqs.append([31, 32, 33, 34])
    needed += [False, True, True, True]
    return *packed(seqs), torch.tensor(needed)


@pytest.mark.parametrize("chunk_size", [0, 3])
def test_logprobs_entropies_and_gradients_through_the_tree_equal_the_packed_rows(model, chunk_size):
    ids, pos, lens, needed = grpo_batch(model.config.vocab_size)
    weights_T = torch.linspace(-1.0, 2.0, len(ids), dtype=torch.float64)

    def run(share: bool):
        model.zero_grad()
        lp, ent = packed_token_logprobs(
            model, ids, pos, lens, 0.7, with_entropy=True, chunk_size=chunk_size, needed_T=needed, share_prefixes=share
        )
        ((lp * weights_T).sum() + 0.3 * ent.sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lp, ent, grads = run(False)
    lp_tree, ent_tree, grads_tree = run(True)
    assert (
        prefix_tree(ids, pos, lens).num_nodes == 6 + 2 + 1 + 2 * 6 + 4
    )  # system, the users' turns, 6 completion nodes per user, the other (of 55 tokens)
    torch.testing.assert_close(lp_tree, lp, atol=1e-10, rtol=0)
    torch.testing.assert_close(ent_tree, ent, atol=1e-10, rtol=0)
    assert lp[needed & (pos > 0)].abs().min() > 0 and lp[~needed].abs().max() == 0
    assert grads.keys() == grads_tree.keys()
    for name in grads:  # transformers' RMSNorm computes in float32, so summing a shared node's gradients
        # before or after it differs by float32 rounding (~5e-8 of the norm), even in a float64 model
        assert float((grads_tree[name] - grads[name]).norm() / grads[name].norm()) < 1e-6, name


def test_varlen_attention_refuses_shared_prefixes(model):
    import copy

    from grpokit.common.varlen import use_varlen

    varlen = copy.deepcopy(model)
    use_varlen(varlen)
    ids, pos, lens, needed = grpo_batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="model.share_prefixes needs dense attention"):
        packed_token_logprobs(varlen, ids, pos, lens, share_prefixes=True)


@pytest.mark.parametrize("chunk_size", [0, 64])
def test_gradients_through_the_tree_repeat_bit_for_bit_on_two_threads(chunk_size):
    """A prompt node predicts the first token of each of its G completions, so the head's input rows
    repeat; their gradients must be summed in a fixed order (grpokit.common.logprobs._RowsThenHead).
    transformers' advanced indexing summed them with parallel atomic adds: the last bits changed from
    one backward to the next with 2 threads (seen on the demo's SmolLM2, and here on a model wide
    enough for torch to split the work)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4
    )
    lm = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    seqs, needed = [], []
    for _ in range(24):  # 24 prompts x 8 completions of 1-12 tokens, many starting alike
        prompt = torch.randint(3, 300, (6,), generator=g).tolist()
        for _ in range(8):
            n = int(torch.randint(1, 13, (1,), generator=g))
            completion = (
                torch.randint(3, 6, (2,), generator=g).tolist() + torch.randint(3, 300, (n,), generator=g).tolist()
            )
            seqs.append(prompt + completion)
            needed += [False] * len(prompt) + [True] * len(completion)
    ids, pos, lens = packed(seqs)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        digests = set()
        for _ in range(10):
            lm.zero_grad()
            lp = packed_token_logprobs(
                lm, ids, pos, lens, chunk_size=chunk_size, needed_T=torch.tensor(needed), share_prefixes=True
            )
            lp.sum().backward()
            grads = [p.grad for p in lm.parameters() if p.grad is not None]
            digests.add(hashlib.sha256(b"".join(g.numpy().tobytes() for g in grads)).hexdigest())
    finally:
        torch.set_num_threads(threads)
    assert len(digests) == 1
