"""verifiers' train client on grpokit's server: renderers' own `generate` (what verifiers' TrainClient
calls: the prompt rendered client-side, POST /inference/v1/generate with `logprobs: 1` and the
renderer's `stop_token_ids`, `token_id:<id>` logprobs read back, /v1/models read for max_model_len)
gets the token ids and logprobs grpokit's chat route samples for the same request and seed;
`stop_token_ids` ends a completion; and a TrainClient turn loop (verifiers' trace graph, as its
interception server drives it) records the chat route's tokens and logprobs."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from tests.support import serving

openai = pytest.importorskip("openai")
renderers_client = pytest.importorskip("renderers.client")

MESSAGES = [{"role": "user", "content": "Reverse the text: hello"}]
SAMPLING = {"max_tokens": 6, "temperature": 0.7, "seed": 3}


@pytest.fixture(scope="module")
def served(tiny_model):
    with serving(tiny_model) as (engine, server):
        yield engine, server


@pytest.fixture(scope="module")
def renderer(tiny_model):
    """What TrainClient builds for a model without a typed renderer (SmolLM2's tokenizer): the default
    renderer, apply_chat_template, stopping at `<|im_end|>`."""
    from renderers import DefaultRendererConfig, create_renderer
    from renderers.base import load_tokenizer

    return create_renderer(load_tokenizer(tiny_model), DefaultRendererConfig())


class ExtraStop:
    """A renderer whose template ends a turn with one more token (as Qwen's two stop ids)."""

    def __init__(self, renderer, token_id: int) -> None:
        self.renderer, self.token_id = renderer, token_id

    def __getattr__(self, name):
        return getattr(self.renderer, name)

    def get_stop_token_ids(self) -> list[int]:
        return [*self.renderer.get_stop_token_ids(), self.token_id]


def generate(server, renderer, sampling: dict, messages=MESSAGES) -> dict:
    """renderers.client.generate, as verifiers' TrainClient calls it, against the server."""

    async def call():
        async with openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as client:
            return await renderers_client.generate(
                client=client, renderer=renderer, messages=messages, model="tiny", sampling_params=dict(sampling)
            )

    return asyncio.run(call())


def chat(server, messages=MESSAGES, **extra) -> dict:
    """grpokit's chat route; with `stream: true`, the streamed deltas' content joined."""
    body = {"model": "tiny", "messages": messages, "logprobs": True, "return_token_ids": True, **SAMPLING, **extra}
    request = urllib.request.Request(
        server.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        if not extra.get("stream"):
            return json.loads(r.read())
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: {")]
        return {"content": "".join(c["delta"].get("content") or "" for e in events for c in json.loads(e)["choices"])}


def test_renderers_generate_gets_the_chat_routes_token_ids_and_logprobs(served, renderer):
    out = generate(served[1], renderer, SAMPLING)
    answer = chat(served[1])
    choice = answer["choices"][0]
    assert out["prompt_ids"] == answer["prompt_token_ids"]  # the default renderer is the chat template
    assert out["completion_ids"] == choice["token_ids"] and len(out["completion_ids"]) == 6
    assert out["completion_logprobs"] == [c["logprob"] for c in choice["logprobs"]["content"]]
    assert out["finish_reason"] == choice["finish_reason"] == "length"
    assert out["usage"] == answer["usage"] and out["request_id"]


def test_the_renderers_stop_token_ids_end_the_completion(served, renderer):
    full = generate(served[1], renderer, SAMPLING)["completion_ids"]
    j = next(i for i in range(1, len(full)) if full[i] not in full[:i])
    out = generate(served[1], ExtraStop(renderer, full[j]), SAMPLING)
    assert out["completion_ids"] == full[: j + 1] and out["finish_reason"] == "stop"
    assert len(out["completion_logprobs"]) == j + 1
    answer = chat(served[1], stop_token_ids=[full[j]])  # vLLM's extension on the chat route too
    choice = answer["choices"][0]
    assert choice["token_ids"] == full[: j + 1] and choice["finish_reason"] == "stop"
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == out["completion_logprobs"]
    tokenizer = served[0].tokenizer
    assert choice["message"]["content"] == tokenizer.decode(full[:j], skip_special_tokens=True)  # as vLLM's text
    assert chat(served[1], stop_token_ids=[full[j]], stream=True)["content"] == choice["message"]["content"]


def test_renderers_reads_max_model_len_and_refuses_an_overlong_prompt_before_sending(served, renderer):
    async def cap():
        async with openai.AsyncOpenAI(base_url=served[1].url, api_key="unused", max_retries=0) as client:
            return await renderers_client._resolve_max_prompt_len(client, "tiny")

    assert asyncio.run(cap()) == 512
    with pytest.raises(renderers_client.OverlongPromptError):
        generate(served[1], renderer, SAMPLING, [{"role": "user", "content": "hello " * 600}])


def test_a_verifiers_train_client_turn_loop_records_the_chat_routes_tokens(served, tiny_model):
    vf = pytest.importorskip("verifiers.v1")
    from renderers import DefaultRendererConfig
    from verifiers.v1 import graph
    from verifiers.v1.clients.train import TrainClient
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.dialects.chat import ChatDialect
    from verifiers.v1.trace import AgentInfo, TraceTask

    async def rollout():
        config = vf.TrainClientConfig(
            base_url=served[1].url,
            api_key_var="GRPOKIT_TEST_NO_KEY",
            renderer=DefaultRendererConfig(),
            renderer_model_name=tiny_model,
        )
        client = TrainClient(config)
        task = vf.Task(vf.TaskData(idx=0, prompt=MESSAGES[0]["content"]))
        trace = vf.Trace(
            task=TraceTask(type="Task", data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=AgentConfig(model="tiny")),
        )
        messages, turns = [vf.UserMessage(content=MESSAGES[0]["content"])], []
        for _ in range(2):  # the interception server's part: one turn per chat request of the agent
            turn = graph.prepare_turn(trace, messages, [])
            response = await client.get_response(
                ChatDialect(), {"model": "tiny"}, vf.SamplingConfig(**SAMPLING), turn=turn
            )
            turn.commit(response)
            turns.append(response)
            messages = [*messages, response.message, vf.UserMessage(content="Again, please.")]
        await client.close()
        return trace, turns

    trace, turns = asyncio.run(rollout())
    wire = [{"role": "user", "content": MESSAGES[0]["content"]}]
    for response in turns:
        answer = chat(served[1], wire)
        choice = answer["choices"][0]
        assert response.tokens.prompt_ids == answer["prompt_token_ids"]
        assert response.tokens.completion_ids == choice["token_ids"]
        assert response.tokens.completion_logprobs == [c["logprob"] for c in choice["logprobs"]["content"]]
        wire += [
            {"role": "assistant", "content": response.message.content},
            {"role": "user", "content": "Again, please."},
        ]
    last = trace.branches[-1]  # a training sample: the sampled tokens carry their logprobs
    sampled = [(t, lp) for t, lp, m in zip(last.token_ids, last.logprobs, last.sampled_mask) if m]
    completion = turns[-1].tokens
    assert sampled[-len(completion.completion_ids) :] == list(
        zip(completion.completion_ids, completion.completion_logprobs)
    )
