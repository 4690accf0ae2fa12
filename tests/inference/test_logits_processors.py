"""The logits processors against hand computations and HF's reference processors, in float64."""

import pytest
import torch
from transformers import MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor

from grpokit.inference.logits_processors import apply_min_tokens, apply_repetition_penalty, mark_seen, seen_tokens

INF = float("inf")


def test_min_tokens_masks_stop_tokens_only_in_rows_below_the_bound():
    logits_BV = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    out_BV = apply_min_tokens(logits_BV, torch.tensor([0, 2, 3]), 3, torch.tensor([1, 3]))
    expected = torch.tensor([[1.0, -INF, 3.0, -INF], [1.0, -INF, 3.0, -INF], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    assert torch.equal(out_BV, expected)
    assert torch.equal(logits_BV[0], torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))  # input untouched


def test_min_tokens_per_row_bound_and_duplicate_stop_ids():
    logits_BV = torch.zeros(2, 3, dtype=torch.float64)
    out_BV = apply_min_tokens(logits_BV, torch.tensor([1, 1]), torch.tensor([2, 1]), torch.tensor([2, 2]))
    assert out_BV[0, 2] == -INF and out_BV[1, 2] == 0 and out_BV[:, :2].eq(0).all()


def test_min_tokens_matches_hf_min_new_tokens():
    logits_BV = torch.randn(2, 11, dtype=torch.float64)
    prompt_len, generated = 4, 2
    input_ids = torch.randint(0, 11, (2, prompt_len + generated))
    hf = MinNewTokensLengthLogitsProcessor(prompt_len, min_new_tokens=3, eos_token_id=[0, 7])(
        input_ids, logits_BV.clone()
    )
    ours = apply_min_tokens(logits_BV, torch.full((2,), generated), 3, torch.tensor([0, 7]))
    assert torch.equal(ours, hf)


def test_repetition_penalty_by_hand():
    logits_BV = torch.tensor([[2.0, -2.0, 0.0, 3.0]], dtype=torch.float64)
    seen_BV = torch.tensor([[True, True, True, False]])
    out_BV = apply_repetition_penalty(logits_BV, seen_BV, 2.0)
    assert torch.equal(out_BV, torch.tensor([[1.0, -4.0, 0.0, 3.0]], dtype=torch.float64))
    assert torch.equal(apply_repetition_penalty(logits_BV, seen_BV, 1.0), logits_BV)


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_hf(penalty):
    torch.manual_seed(0)
    logits_BV = torch.randn(3, 20, dtype=torch.float64)
    ids_BT = torch.randint(0, 20, (3, 9))
    hf = RepetitionPenaltyLogitsProcessor(penalty)(ids_BT, logits_BV.clone())
    ours = apply_repetition_penalty(
        logits_BV, seen_tokens(ids_BT, torch.ones_like(ids_BT, dtype=torch.bool), 20), penalty
    )
    assert torch.allclose(ours, hf, rtol=0, atol=1e-12)


def test_repetition_penalty_per_row():
    logits_BV = torch.tensor([[2.0, 2.0], [2.0, 2.0]], dtype=torch.float64)
    seen_BV = torch.tensor([[True, False], [True, False]])
    out_BV = apply_repetition_penalty(logits_BV, seen_BV, torch.tensor([2.0, 1.0]))
    assert torch.equal(out_BV, torch.tensor([[1.0, 2.0], [2.0, 2.0]], dtype=torch.float64))


def test_seen_tokens_ignores_padding_and_mark_seen_adds():
    ids_BT = torch.tensor([[0, 0, 3, 4], [5, 5, 5, 1]])  # row 0 is left-padded with id 0
    valid_BT = torch.tensor([[False, False, True, True], [True, True, True, True]])
    seen_BV = seen_tokens(ids_BT, valid_BT, 6)
    assert seen_BV.tolist() == [[False, False, False, True, True, False], [False, True, False, False, False, True]]
    mark_seen(seen_BV, torch.tensor([0, 2]))
    assert seen_BV[0, 0] and seen_BV[1, 2]
