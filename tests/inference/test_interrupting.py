"""In-flight weight updates on servers (grpokit.inference.interrupting): a weight update aborts the
requests in flight and resubmits their continuations. Against grpokit's real server (the tiny model,
each forward slowed so that an update lands mid-answer): a rollout spanning the update carries both
steps on its tokens, and every token's logprob is that of the weights that sampled it over the whole
sequence; `regenerate` restarts from the prompt; `finish` keeps the request on its weights. Against a
stub of vLLM's streamed answers: the continuation's body (prompt + tokens so far, the rest of the
budget, the new adapter, no seed) is in tests/inference/test_vllm_engine.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grpokit.bench.generate import forward_logprobs
from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.models import load_causal_lm
from grpokit.inference import SamplingSettings
from grpokit.inference.interrupting import InterruptingStream
from grpokit.inference.remote import RemoteEngine
from grpokit.inference.streams import ConcurrentStream, GroupRequest
from grpokit.types import WeightUpdate
from tests.support import drain, serving, slow_forwards, wait_until

pytestmark = pytest.mark.unit
PROMPT = [1, 520, 9531, 198]
TOKENS = 24


def perturbed(model, step: int) -> WeightUpdate:
    torch.manual_seed(step)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items() if v.is_floating_point()}
    if model.config.tie_word_embeddings:  # one tensor under two names, as a trainer publishes it
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    return WeightUpdate(step=step, tensors=state)


def stream_across_an_update(tiny_model, tmp_path, on_update: str, groups: int = 1):
    """Groups of 2 streamed from grpokit's server (step 0), which runs one request at a time; step 1
    published and loaded into the stream after 6 forwards (a prefill and 5 decode steps of the first
    group). (the first group's completions, step 0 model, step 1 model, stream, every group by key)."""
    trainer, reader = FilesystemBroadcast(), FilesystemBroadcast()
    trainer.setup(tmp_path)
    reader.setup(tmp_path)
    with serving(tiny_model, reader) as (served, server), slow_forwards(served, 0.03) as calls:
        served.weight_step = 0
        old = load_causal_lm(tiny_model, dtype=torch.float32).eval()
        update = perturbed(old, 1)
        engine = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0, timeout=60)
        engine.setup(tiny_model)
        engine.weight_step = 0
        stream = engine.open_stream(SamplingSettings(temperature=1.0, max_tokens=TOKENS, seed=3), 8, on_update)
        for g in range(groups):
            stream.submit(GroupRequest(g, PROMPT, 2))
        assert stream.advance() == []
        wait_until(lambda: len(calls) >= 6, timeout=10)
        trainer.publish(update)
        stream.load_weights(reader.read(1))
        out = drain(stream)
        stream.close()
        new = load_causal_lm(tiny_model, dtype=torch.float32).eval()
        new.load_state_dict(update.tensors, strict=False)
    return out[0], old, new, stream, out


def test_a_rollout_spanning_an_update_continues_with_the_new_weights(tiny_model, tmp_path):
    group, old, new, stream, _ = stream_across_an_update(tiny_model, tmp_path, "continue")
    assert isinstance(stream, InterruptingStream) and stream.interruptions == 1
    for c in group:
        assert len(c.token_ids) == TOKENS and c.policy_step == 0
        assert c.token_steps is not None and c.token_steps == sorted(c.token_steps)
        cut = c.token_steps.index(1)
        assert 3 <= cut < 20  # both steps sampled a part of it
        ref_old = forward_logprobs(old, PROMPT, c.token_ids).tolist()
        ref_new = forward_logprobs(new, PROMPT, c.token_ids).tolist()
        ref = [o if s == 0 else n for o, n, s in zip(ref_old, ref_new, c.token_steps)]
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4
        assert max(abs(a - b) for a, b in zip(c.logprobs[cut:], ref_old[cut:])) > 1e-3  # the update mattered


def test_a_request_the_server_starts_after_the_update_runs_on(tiny_model, tmp_path):
    """Of two groups sent at once, the one the server queues waits through the update, then is answered
    with step 1's weights: it is not closed (only the running one is continued), and it is all step 1."""
    _, _, new, stream, out = stream_across_an_update(tiny_model, tmp_path, "continue", groups=2)
    mixed = [key for key, group in out.items() if any(c.token_steps is not None for c in group)]
    assert stream.interruptions == 1 and len(mixed) == 1
    for c in out[1 - mixed[0]]:
        assert c.token_steps is None and c.policy_step == 1 and len(c.token_ids) == TOKENS
        ref = forward_logprobs(new, PROMPT, c.token_ids).tolist()
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4


def test_regenerate_restarts_the_unfinished_rollouts_from_their_prompt(tiny_model, tmp_path):
    group, _, new, stream, _ = stream_across_an_update(tiny_model, tmp_path, "regenerate")
    assert stream.interruptions == 1
    for c in group:
        assert c.token_steps is None and c.policy_step == 1 and len(c.token_ids) == TOKENS
        ref = forward_logprobs(new, PROMPT, c.token_ids).tolist()
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4


def test_finish_keeps_the_request_on_the_weights_it_was_sent_with(tiny_model, tmp_path):
    group, old, _, stream, _ = stream_across_an_update(tiny_model, tmp_path, "finish")
    assert type(stream) is ConcurrentStream
    for c in group:
        assert c.token_steps is None and c.policy_step == 0 and len(c.token_ids) == TOKENS
        ref = forward_logprobs(old, PROMPT, c.token_ids).tolist()
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < 1e-4


def test_without_updates_a_stream_samples_what_generate_samples(tiny_model):
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=5)
    with serving(tiny_model) as (served, server):
        served.weight_step = 2
        engine = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0, timeout=60)
        engine.setup(tiny_model)
        stream = engine.open_stream(sampling, 8)
        stream.submit(GroupRequest("g", PROMPT, 3, seed=5))
        [streamed] = drain(stream).values()
        stream.close()
        [expected] = engine.generate([PROMPT], 3, replace(sampling, seed=5 * 1_000_003))
    assert [c.token_ids for c in streamed] == [c.token_ids for c in expected]
    for got, want in zip(streamed, expected):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-6)
    assert all(c.policy_step == 2 and c.token_steps is None for c in streamed)
