"""min_tokens and repetition_penalty in the plain sampler: same tokens as HF `generate`, logprobs of the
processed distribution."""

import pytest
import torch

from grpokit.common.models import load_causal_lm, load_tokenizer
from grpokit.inference import SamplingSettings
from grpokit.inference.sampler import sample

PROMPT = [1, 520, 9531, 198, 520, 9531]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    return load_causal_lm(tiny_model).eval(), load_tokenizer(tiny_model)


def run(model, tokenizer, stop_ids, seed=0, **settings):
    generator = torch.Generator().manual_seed(seed)
    return sample(
        model, [PROMPT], SamplingSettings(**settings), stop_ids, tokenizer.pad_token_id, generator, tokenizer.decode
    )[0]


def hf_greedy(model, max_new_tokens, **kwargs):
    out = model.generate(
        torch.tensor([PROMPT]), do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0, **kwargs
    )
    return out[0, len(PROMPT) :].tolist()


def test_repetition_penalty_greedy_matches_hf_generate(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    plain = run(model, tokenizer, set(), temperature=0.0, max_tokens=12)[0]
    penalized = run(model, tokenizer, set(), temperature=0.0, max_tokens=12, repetition_penalty=1.5)[0]
    assert plain == hf_greedy(model, 12)
    assert penalized == hf_greedy(model, 12, repetition_penalty=1.5)
    assert penalized != plain  # the tiny model repeats itself; the penalty changes its choices


def test_min_tokens_masks_stop_tokens_until_reached_like_hf(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    first = run(model, tokenizer, set(), temperature=0.0, max_tokens=1)[0][0]
    tokens, _, truncated = run(model, tokenizer, {first}, temperature=0.0, max_tokens=8)
    assert tokens == [first] and not truncated  # the greedy first token, declared a stop token, ends it at once
    tokens, _, _ = run(model, tokenizer, {first}, temperature=0.0, max_tokens=8, min_tokens=3)
    assert first not in tokens[:2] and len(tokens) >= 3
    assert tokens == hf_greedy(model, 8, min_new_tokens=3, eos_token_id=first)[: len(tokens)]


def test_stop_strings_before_min_tokens_do_not_end_the_completion(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    tokens = run(model, tokenizer, set(), temperature=0.0, max_tokens=8)[0]
    stop = tokenizer.decode(tokens[:1])
    assert run(model, tokenizer, set(), temperature=0.0, max_tokens=8, stop=[stop])[0] == tokens[:1]
    later = run(model, tokenizer, set(), temperature=0.0, max_tokens=8, stop=[stop], min_tokens=4)[0]
    assert later == tokens[: len(later)] and len(later) >= 4
    assert tokenizer.decode(later).count(stop) > 1 or len(later) == 8  # ended only by a new occurrence


def test_logprobs_are_of_the_processed_distribution(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    stop_ids, temperature, penalty, min_tokens = {tokenizer.eos_token_id, 198}, 0.7, 1.3, 3
    tokens, logprobs, _ = run(
        model,
        tokenizer,
        stop_ids,
        seed=5,
        temperature=temperature,
        max_tokens=10,
        repetition_penalty=penalty,
        min_tokens=min_tokens,
    )
    with torch.no_grad():
        logits_TV = model(input_ids=torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1].double()
    expected = []
    for t, tok in enumerate(tokens):  # the processing by hand, one position at a time
        logits_V = logits_TV[t].clone()
        for seen in set(PROMPT + tokens[:t]):
            logits_V[seen] = logits_V[seen] / penalty if logits_V[seen] > 0 else logits_V[seen] * penalty
        if t < min_tokens:
            logits_V[sorted(stop_ids)] = float("-inf")
        expected.append(float(torch.log_softmax(logits_V / temperature, -1)[tok]))
    assert torch.allclose(
        torch.tensor(logprobs, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), atol=1e-4
    )


def test_invalid_settings_name_the_key():
    with pytest.raises(ValueError, match=r"data.sampling.min_tokens must be in \[0, max_tokens=4\]"):
        SamplingSettings(max_tokens=4, min_tokens=5)
    for penalty in (0.0, 1e300, float("nan")):
        with pytest.raises(ValueError, match=r"data.sampling.repetition_penalty must be in \(0, 100\]"):
            SamplingSettings(repetition_penalty=penalty)
    for temperature in (1e-45, 0.001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"data.sampling.temperature must be 0 \(greedy\) or a finite number"):
            SamplingSettings(temperature=temperature)
    assert SamplingSettings(temperature=0.0).temperature == 0.0 and SamplingSettings(temperature=0.01)


def test_repeated_prompts_are_prefilled_once_with_the_same_cache_and_logits(model_and_tokenizer):
    """A GRPO batch repeats each prompt G times: prefill computes each distinct prompt once and copies
    its cache rows; the rows equal a prefill of every row, and sampling continues per row."""
    from transformers import DynamicCache

    from grpokit.inference.sampler import prefill

    model, tokenizer = model_and_tokenizer
    short = PROMPT[:4]
    prompts = [PROMPT, short, PROMPT, short, PROMPT]
    with torch.no_grad():
        ids_BP, mask_BP, pos_BP, cache, logits_BV = prefill(model, prompts, tokenizer.pad_token_id, "cpu")
        full = DynamicCache()
        reference_BV = model(
            input_ids=ids_BP, attention_mask=mask_BP, position_ids=pos_BP, past_key_values=full, use_cache=True
        ).logits[:, -1]
    assert ids_BP.shape == (5, len(PROMPT)) and mask_BP[1].tolist() == [0, 0, 1, 1, 1, 1]
    torch.testing.assert_close(logits_BV, reference_BV, atol=1e-5, rtol=0)
    for layer, reference in zip(cache.layers, full.layers):
        torch.testing.assert_close(
            layer.keys[mask_BP.bool()[:, None, :].expand_as(layer.keys[..., 0])],
            reference.keys[mask_BP.bool()[:, None, :].expand_as(reference.keys[..., 0])],
            atol=1e-5,
            rtol=0,
        )
    greedy = sample(
        model,
        prompts,
        SamplingSettings(temperature=0.0, max_tokens=6),
        set(),
        tokenizer.pad_token_id,
        torch.Generator(),
        tokenizer.decode,
    )
    alone = [
        sample(
            model,
            [p],
            SamplingSettings(temperature=0.0, max_tokens=6),
            set(),
            tokenizer.pad_token_id,
            torch.Generator(),
            tokenizer.decode,
        )[0]
        for p in (PROMPT, short)
    ]
    assert [g[0] for g in greedy] == [alone[i][0] for i in (0, 1, 0, 1, 0)]
    for g, i in zip(greedy, (0, 1, 0, 1, 0)):
        assert g[1] == pytest.approx(alone[i][1], abs=1e-4)


def test_finished_rows_leave_the_batch_and_the_others_continue_unchanged(model_and_tokenizer):
    """Rows that stop early are dropped from the batch and the cache; every completion equals the one
    sampled alone (greedy), with and without the repetition penalty."""
    model, tokenizer = model_and_tokenizer
    short = PROMPT[:4]
    for penalty in (1.0, 1.3):
        settings = SamplingSettings(temperature=0.0, max_tokens=8, repetition_penalty=penalty)
        free, free_short = (
            sample(model, [p], settings, set(), tokenizer.pad_token_id, torch.Generator(), tokenizer.decode)[0][0]
            for p in (PROMPT, short)
        )
        k = next(k for k, tok in enumerate(free) if tok not in free_short)
        stop = {free[k]}  # PROMPT's completion stops after k + 1 tokens; the other prompt's runs to max_tokens
        prompts = [short, PROMPT, short, PROMPT]
        batch = sample(model, prompts, settings, stop, tokenizer.pad_token_id, torch.Generator(), tokenizer.decode)
        alone = [
            sample(model, [p], settings, stop, tokenizer.pad_token_id, torch.Generator(), tokenizer.decode)[0]
            for p in prompts
        ]
        assert batch[1][0] == free[: k + 1] and batch[1][2] is False and k + 1 < 8  # stopped early, not truncated
        assert batch[0][0] == free_short and batch[0][2] is True  # ran on without the stopped rows
        assert [r[0] for r in batch] == [r[0] for r in alone] and [r[2] for r in batch] == [r[2] for r in alone]
        for got, want in zip(batch, alone):
            assert got[1] == pytest.approx(want[1], abs=1e-4)
