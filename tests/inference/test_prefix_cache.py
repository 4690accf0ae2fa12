"""The builtin engine's prefix KV cache (grpokit.inference.prefix_cache): a conversation's next turn prefills
only its new tokens, and samples what it samples without the cache (same seeds: the same tokens, logprobs
equal to float32 rounding); the cache is dropped whenever the weights change and never outgrows its bound."""

from __future__ import annotations

import pytest
import torch

from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.prefix_cache import PrefixCache, supports
from grpokit.types import WeightUpdate
from tests.support import ChatLengthEnv, ToolReplyTask

PROMPTS = [[1, 520, 9531, 198], [1, 4093, 198, 6004, 2, 198, 1, 520]]  # different lengths: left padding
ENV = [[100, 200, 300], [4093, 198, 6004, 2, 9531]]  # "environment" tokens appended after turn t's reply
# measured on the tiny model: up to 1.9e-6 (the sums over keys run in another order, masked holes between)
ROUNDING = 1e-5


def make_engine(tiny_model: str, prefix_cache_tokens: int, **kwargs) -> BuiltinEngine:
    e = BuiltinEngine(device="cpu", prefix_cache_tokens=prefix_cache_tokens, **kwargs)
    e.setup(tiny_model)
    return e


def settings(turn: int, **kwargs) -> SamplingSettings:
    # a random model rarely samples EOS: stop on a common letter so that replies end at different lengths
    return SamplingSettings(**{"temperature": 1.0, "max_tokens": 12, "stop": ["e"], "seed": 10 + turn, **kwargs})


def converse(engine: BuiltinEngine, turns: int = 3, n: int = 2, **kwargs) -> list[list[list]]:
    """Turn 0 samples n replies per prompt; turn t > 0 sends each conversation so far (prompt, replies,
    environment tokens), one reply each, as grpokit.environments.multi_turn does. Per turn, per
    conversation: (token ids, logprobs, is_truncated)."""
    out = engine.generate(PROMPTS, n, settings(0, **kwargs))
    convs = [list(p) for p in PROMPTS for _ in range(n)]
    replies = [c for group in out for c in group]
    turns_out = [[(c.token_ids, c.logprobs, c.is_truncated) for c in replies]]
    for t in range(1, turns):
        convs = [c + r.token_ids + ENV[t % 2] for c, r in zip(convs, replies)]
        replies = [group[0] for group in engine.generate(convs, 1, settings(t, **kwargs))]
        turns_out.append([(c.token_ids, c.logprobs, c.is_truncated) for c in replies])
    return turns_out


def assert_same_samples(cached, plain) -> float:
    """Same tokens and truncation, logprobs within float32 rounding; returns the largest difference."""
    worst = 0.0
    for turn_a, turn_b in zip(cached, plain, strict=True):
        for (ids_a, lp_a, tr_a), (ids_b, lp_b, tr_b) in zip(turn_a, turn_b, strict=True):
            assert ids_a == ids_b and tr_a == tr_b
            worst = max([worst, *(abs(a - b) for a, b in zip(lp_a, lp_b))])
    assert worst <= ROUNDING, worst
    return worst


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"repetition_penalty": 1.3, "top_p": 0.9, "min_tokens": 2}, {"temperature": 0.0}],
    ids=["plain", "processors", "greedy"],
)
def test_a_three_turn_conversation_samples_what_it_samples_without_the_cache(tiny_model, kwargs):
    on, off = make_engine(tiny_model, 4096), make_engine(tiny_model, 0)
    cached, plain = converse(on, **kwargs), converse(off, **kwargs)
    assert_same_samples(cached, plain)
    assert off.prefix_cache.reused_tokens == 0 and not off.prefix_cache.entries
    assert on.prefix_cache.reused_tokens > on.prefix_cache.computed_tokens  # turns 1, 2 ran only the new tokens
    # the same prompts: every token was either run or reused
    assert on.prefix_cache.computed_tokens + on.prefix_cache.reused_tokens == off.prefix_cache.computed_tokens


@pytest.mark.parametrize("max_batch_size", [64, 2])
def test_a_batch_mixing_hits_misses_and_repeats(tiny_model, max_batch_size):
    """Rows with different cached lengths, rows without a hit (a new prompt, a prompt sent again), repeats
    of one prompt (n = 2), and batches split by max_batch_size."""
    on, off = (make_engine(tiny_model, tokens, max_batch_size=max_batch_size) for tokens in (4096, 0))
    first = [e.generate(PROMPTS, 1, settings(0)) for e in (on, off)]
    assert_same_samples(*[[[(c.token_ids, c.logprobs, c.is_truncated) for g in x for c in g]] for x in first])
    replies = [g[0].token_ids for g in first[0]]
    batch = [
        PROMPTS[0] + replies[0] + ENV[0],  # a hit
        [1, 33, 71, 9, 4093, 198, 6004, 2, 198, 1, 520, 77, 88, 99],  # a miss, longer than any new part
        PROMPTS[1],  # sent again: a miss (only prompts that extend an entry hit)
        PROMPTS[1] + replies[1] + ENV[1],  # a hit, another cached length
    ]
    reused = on.prefix_cache.reused_tokens
    outs = [e.generate(batch, 2, settings(1)) for e in (on, off)]
    flat = [[(c.token_ids, c.logprobs, c.is_truncated) for g in out for c in g] for out in outs]
    assert_same_samples([flat[0]], [flat[1]])
    hits = [len(PROMPTS[0] + replies[0]) - 1, len(PROMPTS[1] + replies[1]) - 1]
    # each distinct prompt is looked up once per batch (batches of 2 rows hold one prompt and its repeat)
    assert on.prefix_cache.reused_tokens - reused == sum(hits)


def test_multi_turn_rollouts_are_the_same_with_the_cache(tiny_model):
    from grpokit.common.models import load_tokenizer
    from grpokit.environments.environment import Example
    from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts

    tokenizer = load_tokenizer("smollm2-135m")
    prompts = [
        (ChatLengthEnv(), Example(i, [{"role": "user", "content": text}], ToolReplyTask()))
        for i, text in enumerate(["hello there", "what is the weather like today?"])
    ]
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=3)
    results = []
    for tokens in (4096, 0):
        e = make_engine(tiny_model, tokens)
        groups = generate_rollouts(e, tokenizer, prompts, 3, sampling, 0, turns=TurnLimits(8, 400))
        results.append(([r for g in groups for r in g], e.prefix_cache))
    (cached, cache_on), (plain, cache_off) = results
    assert any(r.metrics["turns"] == 3 for r in cached) and cache_on.reused_tokens > 0
    assert cache_on.computed_tokens + cache_on.reused_tokens == cache_off.computed_tokens
    same = ("prompt_ids", "completion_ids", "completion_mask", "reward", "is_truncated", "step_rewards", "step_ends")
    for a, b in zip(cached, plain, strict=True):
        assert all(getattr(a, f) == getattr(b, f) for f in same) and a.metrics["turns"] == b.metrics["turns"]
        assert max(abs(x - y) for x, y in zip(a.completion_logprobs, b.completion_logprobs)) <= ROUNDING


def _full_update(engine: BuiltinEngine) -> WeightUpdate:
    gen = torch.Generator().manual_seed(1)
    tensors = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in engine.model.state_dict().items()}
    return WeightUpdate(step=1, tensors=tensors)


def _norm_update(engine: BuiltinEngine) -> WeightUpdate:
    from grpokit.common.noisy_norms import noisy_norms, norm_weights

    return WeightUpdate(step=2, tensors={}, norm_tensors=noisy_norms(norm_weights(engine.model), 0.3, seed=0, step=2))


def _lora_update(tiny_model) -> WeightUpdate:
    from grpokit.trainer.policy import LoraSettings, Policy

    policy = Policy(model=tiny_model, lora=LoraSettings(rank=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    policy.configure_model()
    gen = torch.Generator().manual_seed(0)
    for name, param in policy.lm.named_parameters():
        if "lora_B" in name:
            param.data.copy_(torch.randn(param.shape, generator=gen) * 0.5)  # an adapter that changes the outputs
    return policy.weight_update(3)


def test_every_weight_change_drops_the_cache(tiny_model):
    """Full weights, QeRL's noisy norms, a LoRA adapter (merged copies: merge_lora auto in float32), and a
    parameter written in place outside load_weights: the next turn samples what a cache-less engine with
    the same weights samples, which stale keys and values (computed by the old weights) would not."""
    on, off = make_engine(tiny_model, 4096), make_engine(tiny_model, 0)
    updates = {}  # each update made once, from the first engine, and loaded into both

    def load(make):
        def change(e: BuiltinEngine) -> None:
            if make not in updates:
                updates[make] = make(e)
            e.load_weights(updates[make])

        return change

    changes = [
        load(_full_update),
        load(_norm_update),
        load(lambda e: _lora_update(tiny_model)),
        lambda e: e.model.get_base_model().model.layers[0].mlp.up_proj.weight.mul_(1.5),
    ]
    convs, turn = [list(p) for p in PROMPTS], 0
    for change in [None, *changes]:
        if change is not None:
            with torch.no_grad():
                change(on), change(off)
            assert (change is changes[-1]) or not on.prefix_cache.entries  # load_weights clears at once
        outs = [e.generate(convs, 1, settings(turn)) for e in (on, off)]
        assert_same_samples(*[[[(g[0].token_ids, g[0].logprobs, g[0].is_truncated) for g in out]] for out in outs])
        assert turn == 0 or on.prefix_cache.reused_tokens == 0  # nothing survived the change
        on.prefix_cache.reused_tokens = 0
        convs = [c + g[0].token_ids + ENV[0] for c, g in zip(convs, outs[0])]
        turn += 1
    assert on.merged is not None  # the adapter was sampled merged
    outs = [e.generate(convs, 1, settings(turn)) for e in (on, off)]  # no change: now the cache is used
    assert_same_samples(*[[[(g[0].token_ids, g[0].logprobs, g[0].is_truncated) for g in out]] for out in outs])
    assert on.prefix_cache.reused_tokens > 0


def test_the_cache_stays_within_its_bound(tiny_model):
    e = make_engine(tiny_model, 24)
    converse(e, turns=3, n=2)
    assert 0 < e.prefix_cache.tokens <= 24 and e.prefix_cache.tokens == sum(map(len, e.prefix_cache.entries))


@pytest.mark.unit
def test_lookup_takes_the_longest_entry_and_evicts_the_least_recently_used():
    def kv(n: int) -> torch.Tensor:  # [layers, 2, heads, tokens, head dim], tokens numbered
        return torch.arange(n, dtype=torch.float32).expand(2, 2, 1, n)[..., None].clone()

    cache = PrefixCache(max_tokens=10)
    cache._store((1, 2, 3), kv(3))
    cache._store((1, 2, 9), kv(3))
    assert cache.lookup([1, 2, 3, 4])[0] == 3 and cache.lookup([1, 2, 9, 4, 4])[0] == 3
    assert cache.lookup([1, 2, 3])[0] == 0  # a prompt sent again: no hit, so the same numbers as before
    assert cache.lookup([1, 2, 8, 8])[0] == 0 and cache.lookup([7])[0] == 0
    cache._store((1, 2, 3, 4, 5), kv(5))  # extends (1, 2, 3), which is dropped
    assert list(cache.entries) == [(1, 2, 9), (1, 2, 3, 4, 5)] and cache.tokens == 8
    k, found = cache.lookup([1, 2, 3, 4, 5, 6])
    assert k == 5 and torch.equal(found, kv(5))
    cache._store((5, 6, 7), kv(3))  # 11 tokens: the least recently used, (1, 2, 9), goes
    assert list(cache.entries) == [(1, 2, 3, 4, 5), (5, 6, 7)] and cache.tokens == 8
    past = cache.past([(2, kv(5)), (0, None), (3, kv(3))], width=4)
    keys = past.layers[0].keys[:, 0, :, 0]
    assert keys.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 2]]  # right-aligned, holes zero


@pytest.mark.unit
def test_only_plain_full_attention_models_and_the_plain_path_use_it():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    assert supports(LlamaConfig()) and supports(Qwen2Config())
    assert not supports(MistralConfig(sliding_window=4096))
    assert not supports(
        Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=1, num_hidden_layers=2)
    )
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        BuiltinEngine(device="cpu", prefix_cache_tokens=-1)


def test_the_fast_path_keeps_no_prefix_cache(tiny_model):
    e = make_engine(tiny_model, 4096, fast="on", cuda_graphs=False, compile=False)
    assert not e.prefix_cache.enabled
