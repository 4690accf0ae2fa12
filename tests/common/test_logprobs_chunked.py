"""Chunked log-probabilities and varlen attention give the same values and gradients as the dense path."""

from __future__ import annotations

import copy

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.varlen import use_varlen


def packed_batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    seq_lens_N = torch.tensor([5, 9, 3, 7])
    input_ids_T = torch.randint(0, vocab, (int(seq_lens_N.sum()),), generator=g)
    position_ids_T = torch.cat([torch.arange(n) for n in seq_lens_N.tolist()])
    return input_ids_T, position_ids_T, seq_lens_N


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def values_and_grads(model, with_entropy: bool, **kwargs):
    model.zero_grad()
    ids, pos, lens = packed_batch(model.config.vocab_size)
    out = packed_token_logprobs(model, ids, pos, lens, temperature=0.7, with_entropy=with_entropy, **kwargs)
    lp, ent = out if with_entropy else (out, torch.zeros(()))
    (lp.sum() + 0.3 * ent.sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("with_entropy", [False, True])
# rtol 1e-5 beside atol: float32 sums over the 49k-token vocabulary in another order; on an AMD EPYC
# logprobs near -10 differ by 1.1e-5 (1.1e-6 relative), also with the code before 2026-11-25
def test_chunked_logprobs_equal_full_logprobs(model, with_entropy):
    lp, ent, grads = values_and_grads(model, with_entropy)
    lp_c, ent_c, grads_c = values_and_grads(model, with_entropy, chunk_size=4)  # 23 targets: uneven last chunk
    torch.testing.assert_close(lp_c, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_c, ent, atol=1e-5, rtol=1e-5)
    assert grads.keys() == grads_c.keys()
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], atol=1e-5, rtol=1e-4)


def test_varlen_attention_equals_the_block_diagonal_mask(model):
    lp, ent, grads = values_and_grads(model, True)
    varlen = copy.deepcopy(model)
    use_varlen(varlen)
    lp_v, ent_v, grads_v = values_and_grads(varlen, True, chunk_size=8)
    torch.testing.assert_close(lp_v, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_v, ent, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads_v[name], grads[name], atol=1e-5, rtol=1e-4)


def test_sequence_starts_get_zero_and_sequences_do_not_see_each_other(model):
    varlen = copy.deepcopy(model)
    use_varlen(varlen)
    ids, pos, lens = packed_batch(model.config.vocab_size)
    with torch.no_grad():
        packed = packed_token_logprobs(varlen, ids, pos, lens, chunk_size=5)
        alone = packed_token_logprobs(varlen, ids[5:14], pos[5:14], lens[1:2], chunk_size=5)
    assert packed[pos == 0].abs().max() == 0
    torch.testing.assert_close(packed[5:14], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [0, 4])
def test_only_the_needed_tokens_get_logprobs_with_the_full_paths_values_and_gradients(model, chunk_size):
    """needed_T: the LM head runs only on the positions predicting the needed tokens; their logprobs,
    entropies and gradients equal the full path's, every other token gets 0."""
    ids, pos, lens = packed_batch(model.config.vocab_size)
    needed_T = torch.zeros(len(ids), dtype=torch.bool)
    needed_T[[1, 2, 3, 7, 8, 15, 16, 21, 22, 23]] = True  # completions; 8 and 15 are ordinary tokens, 14/21 a start
    needed_T[14] = True  # position 0 of the third sequence: no prediction, stays 0
    weights_T = torch.linspace(-1.0, 2.0, len(ids))

    def run(**kwargs):
        model.zero_grad()
        lp, ent = packed_token_logprobs(
            model, ids, pos, lens, temperature=0.7, with_entropy=True, chunk_size=chunk_size, **kwargs
        )
        mask_T = needed_T & (pos != 0)
        ((lp * weights_T * mask_T).sum() + 0.3 * (ent * mask_T).sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lp_full, ent_full, grads_full = run()
    lp, ent, grads = run(needed_T=needed_T)
    kept = needed_T & (pos != 0)
    torch.testing.assert_close(lp[kept], lp_full[kept], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[kept], ent_full[kept], atol=1e-5, rtol=1e-5)
    assert lp[~kept].abs().max() == 0 and ent[~kept].abs().max() == 0
    assert grads.keys() == grads_full.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_full[name], atol=1e-5, rtol=1e-4)


def test_no_needed_token_still_runs_the_model(model):
    """A micro-batch without loss tokens (a rank's zero-loss stand-in) gives zeros and a gradient path."""
    ids, pos, lens = packed_batch(model.config.vocab_size)
    for chunk_size in (0, 4):
        lp = packed_token_logprobs(
            model, ids, pos, lens, chunk_size=chunk_size, needed_T=torch.zeros(len(ids), dtype=torch.bool)
        )
        assert lp.shape == ids.shape and lp.abs().max() == 0 and lp.requires_grad
        (lp.sum() * 0).backward()
