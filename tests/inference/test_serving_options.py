"""ServingOptions in the builtin engine, without the server: top logprobs are the top-k of the very
distribution each token's logprob is of and change nothing sampled; on_tokens sees every token as it is
decoded; a cancelled request stops between decode steps. The fast path (on CPU here) refuses top
logprobs, hands each completion over whole, and stops when cancelled."""

from __future__ import annotations

import threading

import pytest
import torch

from grpokit.inference import NewTokens, SamplingSettings, ServingOptions
from grpokit.inference.builtin import BuiltinEngine

PROMPTS = [[1, 520, 9531, 198], [1, 17, 230]]


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    return engine


@pytest.fixture(scope="module")
def fast_engine(tiny_model):
    engine = BuiltinEngine(device="cpu", fast="on", max_batch_size=4)
    engine.setup(tiny_model)
    return engine


def reference_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T) at each completion position, from one plain forward: T x V."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature if temperature else logits, -1)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.9), (1.0, 1.0), (0.0, 1.0)])
def test_top_logprobs_are_the_topk_of_the_sampled_tokens_distribution(engine, temperature, top_p):
    sampling = SamplingSettings(temperature=temperature, top_p=top_p, max_tokens=6, seed=4)
    plain = engine.generate(PROMPTS, 2, sampling)
    with_top = engine.generate(PROMPTS, 2, sampling, options=ServingOptions(top_logprobs=5))
    for prompt, group_plain, group_top in zip(PROMPTS, plain, with_top):
        for p, c in zip(group_plain, group_top):
            assert c.token_ids == p.token_ids and c.logprobs == p.logprobs and p.top_logprobs is None
            assert len(c.top_logprobs) == len(c.token_ids)
            reference = reference_logprobs(engine.model, prompt, c.token_ids, temperature)
            for t, (token, lp, top) in enumerate(zip(c.token_ids, c.logprobs, c.top_logprobs)):
                ids, values = [i for i, _ in top], [v for _, v in top]
                want_values, want_ids = reference[t].topk(5)
                assert values == sorted(values, reverse=True) and len(top) == 5
                torch.testing.assert_close(torch.tensor(values), want_values, atol=1e-4, rtol=0)
                assert ids == want_ids.tolist() or torch.allclose(reference[t][ids], want_values, atol=1e-4)
                assert lp <= values[0] + 1e-6 and (token not in ids or values[ids.index(token)] == pytest.approx(lp))
            if temperature == 0:
                assert [top[0][0] for top in c.top_logprobs] == c.token_ids


def test_on_tokens_sees_each_token_as_it_is_decoded(engine):
    sampling = SamplingSettings(temperature=1.0, max_tokens=5, seed=2)
    steps: list[list[NewTokens]] = []
    groups = engine.generate(PROMPTS, 3, sampling, options=ServingOptions(on_tokens=steps.append))
    flat = [c for group in groups for c in group]
    assert all(len(t.token_ids) == 1 for step in steps for t in step)  # one token per completion per step
    assert len(steps) == max(len(c.token_ids) for c in flat)
    for index, c in enumerate(flat):
        mine = [t for step in steps for t in step if t.index == index]
        assert [t.token_ids[0] for t in mine] == c.token_ids and [t.logprobs[0] for t in mine] == c.logprobs
    assert [c.token_ids for c in flat] == [
        c.token_ids for group in engine.generate(PROMPTS, 3, sampling) for c in group
    ]


def test_a_cancelled_request_stops_between_decode_steps(engine):
    cancelled, steps = threading.Event(), []

    def on_tokens(new):
        steps.append(new)
        if len(steps) == 3:
            cancelled.set()

    sampling = SamplingSettings(temperature=1.0, max_tokens=200, seed=1)
    options = ServingOptions(on_tokens=on_tokens, cancelled=cancelled)
    groups = engine.generate(PROMPTS, 2, sampling, options=options)
    assert len(steps) == 3 and all(len(c.token_ids) <= 3 for group in groups for c in group)
    assert [len(group) for group in groups] == [2, 2]


def test_a_request_cancelled_before_it_starts_samples_nothing(engine):
    cancelled = threading.Event()
    cancelled.set()
    sampling = SamplingSettings(max_tokens=50)
    groups = engine.generate(PROMPTS, 2, sampling, options=ServingOptions(cancelled=cancelled))
    assert [[c.token_ids for c in group] for group in groups] == [[[], []], [[], []]]


def test_the_fast_path_refuses_top_logprobs_and_streams_whole_completions(fast_engine):
    assert not fast_engine.reports_top_logprobs and fast_engine.takes_serving_options
    sampling = SamplingSettings(temperature=0.0, max_tokens=6)
    with pytest.raises(ValueError, match="fast path .* reports no top logprobs; set fast: off"):
        fast_engine.generate(PROMPTS, 1, sampling, options=ServingOptions(top_logprobs=2))
    seen: list[NewTokens] = []
    groups = fast_engine.generate(PROMPTS, 2, sampling, options=ServingOptions(on_tokens=seen.extend))
    flat = [c for group in groups for c in group]
    assert sorted(t.index for t in seen) == list(range(4))
    for t in seen:
        assert t.token_ids == flat[t.index].token_ids and t.logprobs == flat[t.index].logprobs
    cancelled = threading.Event()
    cancelled.set()
    groups = fast_engine.generate(PROMPTS, 2, sampling, options=ServingOptions(cancelled=cancelled))
    assert all(c.token_ids == [] and c.finish_reason == "abort" for group in groups for c in group)
