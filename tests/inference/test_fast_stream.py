"""The fast path's stream (CPU here; bench/gpu_check_engine.py runs it on CUDA): groups admitted together
decode as `generate` does, and a weight update between two advances continues the unfinished requests
with the new weights, each token's logprob that of its own weights over the whole sequence."""

from __future__ import annotations

import pytest
import torch

from grpokit.bench.generate import forward_logprobs
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.streams import GroupRequest
from grpokit.types import WeightUpdate
from tests.support import drain, tiny_lora_update

PROMPTS = [[1, 520, 9531, 198], [1, 40, 1130], [1, 77, 88, 99, 1100, 12], [1, 5]]


def fast_engine(model: str) -> BuiltinEngine:
    engine = BuiltinEngine(device="cpu", fast="on", cuda_graphs=False, compile=False)
    engine.setup(model)
    engine.weight_step = 0
    return engine


def test_groups_admitted_together_decode_as_generate(tiny_model):
    engine = fast_engine(tiny_model)
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=11)
    expected = engine.generate(PROMPTS, 2, sampling)
    stream = engine.open_stream(sampling, max_rows=8, max_len=6 + 12)
    assert type(stream).__name__ == "FastStream"
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2, seed=11, max_tokens=12 if i else 5))
    got = drain(stream)
    assert [c.token_ids for c in got[1]] == [c.token_ids for c in expected[1]]
    for i in range(1, len(PROMPTS)):
        for a, b in zip(got[i], expected[i]):
            assert a.token_ids == b.token_ids and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    assert all(len(c.token_ids) <= 5 for c in got[0])  # a group's own max_tokens


@pytest.mark.parametrize("on_update", ["continue", "regenerate"])
def test_a_weight_update_between_advances_continues_with_the_new_weights(tiny_model, on_update):
    from transformers import AutoModelForCausalLM

    engine = fast_engine(tiny_model)
    old = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in old.state_dict().items() if v.is_floating_point()}
    sampling = SamplingSettings(temperature=1.0, max_tokens=24, seed=2)  # no stop: every request runs 24 tokens
    stream = engine.open_stream(sampling, max_rows=8, on_update=on_update, max_len=32)
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2))
    assert stream.advance() == []  # one look and a few decode steps with step 0's weights
    stream.load_weights(WeightUpdate(step=1, tensors=state))
    out = drain(stream)
    new = engine.model
    for key, completions in out.items():
        for c in completions:
            assert len(c.token_ids) == 24
            if on_update == "regenerate":
                assert c.token_steps is None and c.policy_step == 1
                per_token = [1] * 24
            else:
                cut = c.token_steps.index(1)
                assert 0 < cut < 24 and c.token_steps == [0] * cut + [1] * (24 - cut) and c.policy_step == 0
                per_token = c.token_steps
            ref_old = forward_logprobs(old, PROMPTS[key], c.token_ids).tolist()
            ref_new = forward_logprobs(new, PROMPTS[key], c.token_ids).tolist()
            ref = [o if s == 0 else n for o, n, s in zip(ref_old, ref_new, per_token)]
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4


def test_a_prompt_that_fills_the_streams_cache_is_refused_one_token_short_of_it_finishes(tiny_model):
    """A prompt as long as the cache leaves no position for its next token (it used to be admitted,
    its row's position set one past the cache for the decode graph); one token shorter gets one token."""
    engine = BuiltinEngine(device="cpu", fast="on", cuda_graphs=False, compile=False, max_model_len=16)
    engine.setup(tiny_model)
    engine.weight_step = 0
    stream = engine.open_stream(SamplingSettings(max_tokens=8, seed=0), max_rows=4, max_len=16)
    stream.submit(GroupRequest(0, list(range(5, 20)), 1))  # 15 tokens: room for one
    stream.submit(GroupRequest(1, PROMPTS[0], 2))
    got = drain(stream)
    assert len(got[0][0].token_ids) == 1 and got[0][0].is_truncated
    assert all(len(c.token_ids) == 8 for c in got[1])  # decoded beside (and after) the full row
    stream.submit(GroupRequest(2, list(range(5, 21)), 1))  # 16 tokens
    with pytest.raises(ValueError, match="leaves no room for a completion in the engine's KV cache of 16"):
        drain(stream)


def test_the_streams_batch_is_built_at_the_first_advance_and_rebuilt_when_an_adapter_wraps_the_model(tiny_model):
    """The batch (KV cache, graphs) is built in the sampling thread at the first advance, not when the
    stream opens (in `fit` that is before the trainer is on the GPU). The first LoRA update wraps the
    model in peft: the unfinished groups start over on a new batch, every token from the adapter's step."""
    engine = fast_engine(tiny_model)
    greedy = SamplingSettings(temperature=0.0, max_tokens=10)
    stream = engine.open_stream(greedy, max_rows=8, max_len=32)
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2))
    assert stream.batch is None and stream.decode_steps == 0
    stream.advance()
    assert stream.batch is not None and stream.decode_steps > 0
    stream.load_weights(tiny_lora_update(step=1))
    got = drain(stream)
    expected = engine.generate(PROMPTS, 2, greedy)  # the adapted model, from the start
    for i in range(len(PROMPTS)):
        assert [c.token_ids for c in got[i]] == [c.token_ids for c in expected[i]]
        assert all(c.policy_step == 1 and c.token_steps is None for c in got[i])


def test_a_stream_asking_for_more_rows_than_the_engines_slots_says_so_and_counts_its_real_rows(tiny_model, caplog):
    """The fast path decodes at most max_batch_size rows at once (its KV-cache slots). A stream opened
    for more (data.streaming.max_inflight x group size) used to queue the rest without a word, and the
    stream bench reported occupancy against the rows asked for: 0.5 on an H200 where every slot was
    busy. Now it warns, naming the key, and its max_rows is the slots it has."""
    engine = BuiltinEngine(device="cpu", fast="on", cuda_graphs=False, compile=False, max_batch_size=4)
    engine.setup(tiny_model)
    engine.weight_step = 0
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=0)  # no stop: every row runs 6 tokens
    with caplog.at_level("WARNING", logger="grpokit.inference.fast.stream"):
        stream = engine.open_stream(sampling, max_rows=8, max_len=16)
    assert "8 rows in flight" in caplog.text and "inference.init_args.max_batch_size" in caplog.text
    assert stream.max_rows == 4
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2))
    got = drain(stream)
    assert all(len(c.token_ids) == 6 for cs in got.values() for c in cs)
    assert stream.decoded_rows == stream.decode_steps * stream.max_rows  # every slot busy at every step
