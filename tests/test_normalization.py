"""The aggregation modes of grpokit.normalization against float64 hand computations."""

import math

import pytest
import torch

from grpokit.loss import LossInputs
from grpokit.normalization import check_normalization, normalize, token_mean


def make_inputs(mask, seq_ids, **kw):
    mask_t = torch.tensor(mask, dtype=torch.float64)
    return LossInputs(
        trainer_logprobs_T=torch.zeros(len(mask), dtype=torch.float64),
        inference_logprobs_T=torch.zeros(len(mask), dtype=torch.float64),
        advantages_T=torch.zeros(len(mask), dtype=torch.float64),
        loss_mask_T=mask_t,
        seq_ids_T=torch.tensor(seq_ids),
        num_seqs=max(seq_ids) + 1,
        **{"loss_normalizer": float(mask_t.sum().clamp(min=1)), **kw},
    )


# seq 0: tokens 0-2 (token 2 off the loss mask), seq 1: tokens 3-4. Loss tokens hold 1, 2 | 4, 5: sum 12.
VALUES = [1.0, 2.0, 3.0, 4.0, 5.0]
MASK, SEQ_IDS = [1, 1, 0, 1, 1], [0, 0, 0, 1, 1]


@pytest.mark.parametrize(
    "mode, kw, max_tokens, expected",
    [
        ("token", {"loss_normalizer": 10.0}, None, 12 / 10),  # 12 / loss tokens of the step
        ("sequence", {"step_num_seqs": 3}, None, (3 / 2 + 9 / 2) / 3),  # seq means 1.5 and 4.5, over 3 step seqs
        ("constant", {"step_num_seqs": 3}, 4, 12 / (4 * 3)),  # 12 / (max_tokens * step seqs)
        ("bnpo", {"loss_normalizer": 10.0, "num_micro_batches": 2}, None, 12 / 4 / 2),  # micro-batch token mean / 2
    ],
)
def test_modes_on_a_hand_case(mode, kw, max_tokens, expected):
    x = make_inputs(MASK, SEQ_IDS, **kw)
    out = normalize(torch.tensor(VALUES, dtype=torch.float64), x, mode, max_tokens)
    assert out.item() == pytest.approx(expected, abs=1e-12) and out.dim() == 0


@pytest.mark.parametrize("mode, max_tokens", [("token", None), ("sequence", None), ("constant", 7)])
def test_sum_over_micro_batches_equals_one_big_batch(mode, max_tokens):
    # 4 sequences split 2 + 2 over micro-batches; the step-level counts make the sum match the whole batch.
    torch.manual_seed(0)
    values = torch.randn(10, dtype=torch.float64)
    mask, seq_ids = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    step = {"loss_normalizer": 8.0, "step_num_seqs": 4, "num_micro_batches": 2}
    whole = normalize(values, make_inputs(mask, seq_ids, **step), mode, max_tokens)
    first = normalize(values[:5], make_inputs(mask[:5], seq_ids[:5], **step), mode, max_tokens)
    second = normalize(values[5:], make_inputs(mask[5:], [s - 2 for s in seq_ids[5:]], **step), mode, max_tokens)
    assert (first + second).item() == pytest.approx(whole.item(), abs=1e-12)


@pytest.mark.parametrize("mode", ["token", "sequence", "constant", "bnpo"])
def test_masked_non_finite_values_and_empty_sequences_give_no_nan(mode):
    # seq 1 has no loss tokens and holds inf/nan; only seq 0's value 2 counts.
    x = make_inputs([1, 0, 0], [0, 1, 1], step_num_seqs=1)
    values = torch.tensor([2.0, math.inf, math.nan], dtype=torch.float64, requires_grad=True)
    out = normalize(values, x, mode, 2 if mode == "constant" else None)
    out.backward()
    assert out.item() == pytest.approx(2.0 / (2 if mode == "constant" else 1), abs=1e-12)
    assert torch.isfinite(values.grad).all() and values.grad[1:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", ["token", "sequence", "constant", "bnpo"])
def test_all_tokens_masked_gives_zero_with_a_graph(mode):
    x = make_inputs([0, 0], [0, 0])
    values = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    out = normalize(values, x, mode, 3 if mode == "constant" else None)
    assert out.item() == 0.0 and out.requires_grad


def test_token_mean_is_over_masked_tokens_and_zero_when_empty():
    mask = torch.tensor([1.0, 0.0, 1.0])
    assert token_mean(torch.tensor([1.0, 100.0, 3.0]), mask).item() == pytest.approx(2.0)
    assert token_mean(torch.tensor([True, True, False]), mask).item() == pytest.approx(0.5)
    assert token_mean(torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3)).item() == 0.0


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="normalization must be one of"):
        check_normalization("mean", None)
    with pytest.raises(ValueError, match="needs max_tokens_normalizer >= 1"):
        check_normalization("constant", None)
    with pytest.raises(ValueError, match="max_tokens_normalizer is used only with normalization='constant'"):
        check_normalization("token", 1024)
