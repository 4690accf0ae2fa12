"""The builtin engine's streaming decode loop: groups admitted together into an idle stream decode
exactly as `generate`; rows joining a running batch keep their own logprobs; a weight update between
decode steps continues the unfinished rows with the new weights, each token's logprob that of its own
weights over the whole sequence."""

from __future__ import annotations

import pytest
import torch

from grpokit.bench.generate import forward_logprobs
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.streams import BatchedStream, GroupRequest
from grpokit.types import WeightUpdate
from tests.support import drain

PROMPTS = [[1, 520, 9531, 198], [1, 40, 1130], [1, 77, 88, 99, 1100, 12], [1, 5]]


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = BuiltinEngine(device="cpu", prefix_cache_tokens=0)
    engine.setup(tiny_model)
    engine.weight_step = 0
    return engine


def test_groups_admitted_together_decode_exactly_as_generate(engine):
    sampling = SamplingSettings(temperature=1.0, max_tokens=10, stop=["e"], seed=11, min_tokens=2)
    expected = engine.generate(PROMPTS, 3, sampling)
    stream = engine.open_stream(sampling, max_rows=64)
    assert type(stream).__name__ == "DecodeStream"
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 3, seed=11))
    got = drain(stream)
    for i in range(len(PROMPTS)):
        assert [c.token_ids for c in got[i]] == [c.token_ids for c in expected[i]]
        assert [c.logprobs for c in got[i]] == [c.logprobs for c in expected[i]]
        assert [c.is_truncated for c in got[i]] == [c.is_truncated for c in expected[i]]
        assert all(c.token_steps is None and c.policy_step == 0 for c in got[i])


def test_rows_joining_a_running_batch_keep_their_own_logprobs(engine):
    """max_rows 4 with groups of 2: later groups join as earlier ones finish, at other widths."""
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=5, repetition_penalty=1.3)
    stream = engine.open_stream(sampling, max_rows=4)
    for i, p in enumerate(PROMPTS * 2):
        stream.submit(GroupRequest(i, p, 2))
    seen_inflight = []
    out = {}
    while stream.inflight:
        seen_inflight.append(len(stream.rows))
        for group in stream.advance():
            out[group.request.key] = group.completions
    assert sorted(out) == list(range(8)) and max(seen_inflight) <= 4
    assert sum(1 for a, b in zip(seen_inflight, seen_inflight[1:]) if b > a) >= 1  # a group joined mid-flight
    assert all(0 < len(c.token_ids) == len(c.logprobs) <= 12 for cs in out.values() for c in cs)
    # without the repetition penalty the recorded logprobs are the model's own: check against a full forward
    stream = engine.open_stream(SamplingSettings(temperature=0.7, max_tokens=12, stop=["e"], seed=6), max_rows=4)
    for i, p in enumerate(PROMPTS * 2):
        stream.submit(GroupRequest(i, p, 2))
    for key, completions in drain(stream).items():
        for c in completions:
            ref = forward_logprobs(engine.model, (PROMPTS * 2)[key], c.token_ids, 0.7).tolist()
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4


def _perturbed(engine, step: int) -> tuple[WeightUpdate, dict]:
    torch.manual_seed(step)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items() if v.is_floating_point()}
    return WeightUpdate(step=step, tensors=state), state


@pytest.mark.parametrize("on_update", ["continue", "regenerate"])
def test_a_weight_update_between_decode_steps_continues_with_the_new_weights(tiny_model, on_update):
    from transformers import AutoModelForCausalLM

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    engine.weight_step = 0
    old = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    update, _ = _perturbed(engine, 1)
    sampling = SamplingSettings(temperature=1.0, max_tokens=16, seed=2)  # no stop: every row runs 16 tokens
    stream = engine.open_stream(sampling, max_rows=16, on_update=on_update)
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2))
    out = {}
    for _ in range(5):
        for group in stream.advance():
            out[group.request.key] = group.completions
    stream.load_weights(update)  # between two decode steps: 5 tokens sampled with step 0's weights
    out.update(drain(stream))
    new = engine.model
    for key, completions in out.items():
        for c in completions:
            assert len(c.token_ids) == 16
            if on_update == "regenerate":
                assert c.token_steps is None and c.policy_step == 1  # restarted from the prompt
                per_token = [1] * 16
            else:
                assert c.token_steps == [0] * 5 + [1] * 11 and c.policy_step == 0
                per_token = c.token_steps
            ref_old = forward_logprobs(old, PROMPTS[key], c.token_ids).tolist()
            ref_new = forward_logprobs(new, PROMPTS[key], c.token_ids).tolist()
            ref = [o if s == 0 else n for o, n, s in zip(ref_old, ref_new, per_token)]
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4
            assert max(abs(a - b) for a, b in zip(c.logprobs[5:], ref_old[5:])) > 1e-3  # the update mattered


def test_engines_without_a_decode_loop_stream_whole_batches(engine):
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=4)
    stream = BatchedStream(engine, sampling, max_rows=4)
    for i, p in enumerate(PROMPTS):
        stream.submit(GroupRequest(i, p, 2, seed=4))
    first = stream.advance()
    assert [g.request.key for g in first] == [0, 1] and stream.inflight == 2
    assert [c.token_ids for c in first[0].completions] == [
        c.token_ids for c in engine.generate(PROMPTS[:2], 2, sampling)[0]
    ]
    assert [g.request.key for g in stream.advance()] == [2, 3] and stream.inflight == 0


def test_servers_stream_one_request_per_group(tiny_model):
    """RemoteEngine's stream: a request per group, answered as they come; groups of one block (one seed)
    still sample apart, and each completion carries the step the server sampled with."""
    from grpokit.inference.remote import RemoteEngine
    from grpokit.inference.streams import ConcurrentStream
    from tests.support import serving

    with serving(tiny_model) as (served, server):
        served.weight_step = 3
        engine = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0, timeout=60, max_concurrency=2)
        engine.setup(tiny_model)
        stream = engine.open_stream(SamplingSettings(temperature=1.0, max_tokens=6, seed=1), max_rows=8)
        assert isinstance(stream, ConcurrentStream)
        for i in range(4):
            stream.submit(GroupRequest(i, PROMPTS[0], 2, seed=7))
        out = drain(stream)
        stream.close()
    assert sorted(out) == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for cs in out.values() for c in cs}) > 2  # not one sample repeated
    assert all(c.policy_step == 3 and len(c.token_ids) <= 6 for cs in out.values() for c in cs)


def test_finish_on_update_needs_a_server_engine(engine):
    """`on_update: finish` keeps a rollout on the weights it began with: BuiltinEngine holds one set."""
    with pytest.raises(ValueError, match="on_update: finish .*server engine.*continue or regenerate"):
        engine.open_stream(SamplingSettings(max_tokens=4), max_rows=4, on_update="finish")
