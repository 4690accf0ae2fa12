"""The OpenAI-compatible server: the official client talks to it, its logprobs are the trainer's, it
follows the broadcast, refuses bad requests with a 400 and shuts down cleanly."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.logprobs import packed_token_logprobs
from grpokit.inference import SamplingSettings
from grpokit.trainer.metrics import mismatch_metrics
from grpokit.types import WeightUpdate
from tests.support import serving

MESSAGES = [{"role": "user", "content": "Reverse the text: hello"}]
PROMPT_IDS = [1, 520, 9531, 198]


@pytest.fixture(scope="module")
def shared_server(tiny_model):
    """For tests that change nothing in the engine."""
    with serving(tiny_model) as (_, server):
        yield server


@pytest.fixture
def client_for():
    openai = pytest.importorskip("openai")
    return lambda server: openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def post(server, path: str, body) -> tuple[int, dict, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    return status, json.loads(text), text


def trainer_error(model, prompt: list[int], completion: list[int], logprobs: list[float], temperature: float) -> float:
    """token_mult_prob_error of the engine's logprobs against the trainer's, on the completion tokens."""
    ids = prompt + completion
    with torch.no_grad():
        trainer = packed_token_logprobs(
            model, torch.tensor(ids), torch.arange(len(ids)), torch.tensor([len(ids)]), temperature
        )
    mask = torch.tensor([0.0] * len(prompt) + [1.0] * len(completion))
    return float(mismatch_metrics(trainer, torch.tensor([0.0] * len(prompt) + logprobs), mask)["token_mult_prob_error"])


def test_chat_logprobs_and_token_ids_match_the_trainer(tiny_model, client_for):
    with serving(tiny_model) as (engine, server):
        client = client_for(server)
        models = client.models.list().data
        assert [m.id for m in models] == ["tiny"] and models[0].max_model_len == 512
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            n=2,
            max_tokens=5,
            temperature=0.7,
            seed=3,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        prompt = engine.tokenizer.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert r.prompt_token_ids == prompt and r.weight_step == -1 and len(r.choices) == 2
        for choice in r.choices:
            content = choice.logprobs.content
            assert len(choice.token_ids) == len(content) == 5 and choice.finish_reason == "length"
            assert all(c.top_logprobs == [] and c.bytes == list(c.token.encode()) for c in content)
            assert trainer_error(engine.model, prompt, choice.token_ids, [c.logprob for c in content], 0.7) < 1 + 1e-4
            assert choice.message.content == engine.tokenizer.decode(choice.token_ids, skip_special_tokens=True)
        assert (
            r.usage.prompt_tokens == len(prompt)
            and r.usage.completion_tokens == 10
            and r.usage.total_tokens == len(prompt) + 10
        )


def test_completions_with_token_ids_equal_the_engine(tiny_model, client_for):
    with serving(tiny_model) as (engine, server):
        client = client_for(server)
        r = client.completions.create(
            model="tiny",
            prompt=PROMPT_IDS,
            max_tokens=4,
            temperature=0,
            logprobs=0,
            extra_body={"return_token_ids": True},
        )
        (choice,) = r.choices
        direct = engine.generate([PROMPT_IDS], 1, SamplingSettings(temperature=0, max_tokens=4))[0][0]
        assert choice.prompt_token_ids == PROMPT_IDS and choice.token_ids == direct.token_ids
        assert choice.logprobs.token_logprobs == pytest.approx(direct.logprobs, abs=1e-6)
        assert choice.logprobs.tokens == [engine.tokenizer.decode([t]) for t in direct.token_ids]
        assert choice.logprobs.text_offset[0] == 0 and len(choice.logprobs.top_logprobs) == 4
        # a batch of a string and token ids: one choice group per prompt, in order
        text = "hello world"
        r = client.completions.create(
            model="tiny",
            prompt=[text, PROMPT_IDS],
            n=2,
            max_tokens=3,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        assert [c.prompt_token_ids for c in r.choices] == [engine.tokenizer.encode(text)] * 2 + [PROMPT_IDS] * 2
        assert r.choices[2].token_ids == direct.token_ids[:3] and r.choices[0].logprobs is None


def test_greedy_is_deterministic_and_a_seed_reproduces(tiny_model, client_for):
    with serving(tiny_model) as (_, server):
        client = client_for(server)

        def ids(**kwargs):
            r = client.chat.completions.create(
                model="tiny", messages=MESSAGES, n=2, max_tokens=6, extra_body={"return_token_ids": True}, **kwargs
            )
            return [c.token_ids for c in r.choices]

        greedy = ids(temperature=0)
        assert greedy[0] == greedy[1] and ids(temperature=0) == greedy
        assert ids(temperature=1.0, seed=5) == ids(temperature=1.0, seed=5)


def test_weight_step_follows_the_broadcast(tiny_model, tmp_path, client_for):
    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path)
    with serving(tiny_model, broadcast) as (engine, server):
        client = client_for(server)

        def greedy():
            return client.completions.create(
                model="tiny",
                prompt=PROMPT_IDS,
                max_tokens=4,
                temperature=0,
                logprobs=0,
                extra_body={"return_token_ids": True},
            )

        before = greedy()
        assert before.weight_step == -1
        g = torch.Generator().manual_seed(0)
        state = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in engine.model.state_dict().items()}
        if engine.model.config.tie_word_embeddings:  # one tensor under two names, as a trainer publishes it
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
        broadcast.publish(WeightUpdate(step=1, tensors=state))
        after = greedy()
        assert after.weight_step == 1 and engine.weight_step == 1 and client.models.list().weight_step == 1
        (choice,) = after.choices
        assert choice.logprobs.token_logprobs != before.choices[0].logprobs.token_logprobs
        assert trainer_error(engine.model, PROMPT_IDS, choice.token_ids, choice.logprobs.token_logprobs, 1.0) < 1 + 1e-4


def test_remote_engine_passes_min_tokens_and_repetition_penalty_through(tiny_model):
    from grpokit.inference.remote import RemoteEngine

    sampling = SamplingSettings(temperature=0, max_tokens=8, min_tokens=3, repetition_penalty=1.5)
    with serving(tiny_model) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny")
        remote.setup(tiny_model)
        (via_server,) = remote.generate([PROMPT_IDS], 1, sampling)[0]
        direct = engine.generate([PROMPT_IDS], 1, sampling)[0][0]
        plain = engine.generate([PROMPT_IDS], 1, SamplingSettings(temperature=0, max_tokens=8))[0][0]
    assert via_server.token_ids == direct.token_ids != plain.token_ids
    assert via_server.logprobs == pytest.approx(direct.logprobs, abs=1e-6)


def test_stop_token_ids_end_a_completion_on_the_engine_and_through_remote_engine(tiny_model):
    from grpokit.inference.remote import RemoteEngine

    with serving(tiny_model) as (engine, server):
        plain = engine.generate([PROMPT_IDS], 1, SamplingSettings(temperature=0, max_tokens=8))[0][0]
        ids = plain.token_ids
        j = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i]), 0)
        sampling = SamplingSettings(temperature=0, max_tokens=8, stop_token_ids=[ids[j]])
        direct = engine.generate([PROMPT_IDS], 1, sampling)[0][0]
        remote = RemoteEngine(base_url=server.url, model_name="tiny")  # sends vLLM's stop_token_ids
        remote.setup(tiny_model)
        (via_server,) = remote.generate([PROMPT_IDS], 1, sampling)[0]
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.generate([PROMPT_IDS], 1, SamplingSettings(max_tokens=2, stop_token_ids=[10**9]))
    assert direct.token_ids == via_server.token_ids == ids[: j + 1] and plain.is_truncated
    assert not direct.is_truncated and not via_server.is_truncated
    assert via_server.logprobs == pytest.approx(direct.logprobs, abs=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/chat/completions", {"model": "tiny"}, "messages", "messages"),
        ("/chat/completions", {"messages": MESSAGES, "n": 0}, "n", ">= 1"),
        ("/chat/completions", {"messages": MESSAGES, "temperature": "hot"}, "temperature", "a number"),
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": True}, "max_tokens", "an integer"),
        ("/chat/completions", {"messages": MESSAGES, "echo": True}, "echo", "echo is not supported"),
        ("/chat/completions", {"messages": MESSAGES, "stream": "yes"}, "stream", "a boolean"),
        ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        (
            "/chat/completions",
            {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            "in [0, 20] (server.limits.max_top_logprobs)",
        ),
        ("/completions", {"prompt": "x", "logprobs": -1}, "logprobs", "server.limits.max_top_logprobs"),
        ("/chat/completions", {"messages": [{"content": "no role"}]}, "messages", "role"),
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": 10_000}, "max_tokens", "context is 512"),
        ("/completions", {"prompt": [1, 10**9]}, "prompt", "token ids"),
        ("/completions", {"prompt": []}, "prompt", "prompt"),
        ("/completions", {"prompt": "x", "stop": 3}, "stop", "stop"),
        ("/completions", b"{not json", None, "not valid JSON"),
        ("/completions", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens", "in [0, max_tokens=4]"),
        ("/completions", {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", "in (0, 100]"),
        ("/chat/completions", {"messages": MESSAGES, "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(shared_server, path, body, param, message):
    status, payload, text = post(shared_server, path, body)
    assert status == 400 and payload["error"]["param"] == param and message in payload["error"]["message"]
    assert "Traceback" not in text


def test_client_errors_and_engine_failures_are_json(tiny_model, client_for):
    openai = pytest.importorskip("openai")
    with serving(tiny_model) as (engine, server):
        client = client_for(server)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MESSAGES, n=0)
        assert e.value.param == "n"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert post(server, "/nowhere", {})[0] == 404

        def fail(*args, **kwargs):
            raise RuntimeError("boom")

        engine.generate = fail
        status, payload, text = post(server, "/completions", {"prompt": "hi"})
        assert status == 500 and "boom" in payload["error"]["message"] and "Traceback" not in text


def test_concurrent_requests_run_one_at_a_time_on_one_thread(tiny_model):
    with serving(tiny_model) as (engine, server):
        generate, seen, active = engine.generate, [], []

        def tracked(*args, **kwargs):
            active.append(1)
            seen.append((threading.current_thread().name, len(active)))
            try:
                return generate(*args, **kwargs)
            finally:
                active.pop()

        engine.generate = tracked
        results = [None] * 4

        def request(i):
            results[i] = post(server, "/completions", {"prompt": PROMPT_IDS, "max_tokens": 3, "seed": i})[0]

        threads = [threading.Thread(target=request, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [200] * 4
    assert len({name for name, _ in seen}) == 1 and all(depth == 1 for _, depth in seen)


def test_shutdown_joins_the_threads_and_frees_the_port(tiny_model):
    with serving(tiny_model) as (engine, server):
        generate, engine_threads = engine.generate, []
        engine.generate = lambda *a, **k: engine_threads.append(threading.current_thread()) or generate(*a, **k)
        assert post(server, "/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
        threads, port = [server.thread, *engine_threads], server.server_address[1]
    assert len(threads) == 2 and not any(t.is_alive() for t in threads)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
