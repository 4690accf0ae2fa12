"""Finish reasons reach rewards and filters (issue 35, "no silent failure"): a completion cut at max_tokens
reaches its reward and the Overlong filter as "length", a natural stop as "stop", on the builtin engine
(generate and its stream) and through grpokit's server; a request the server aborted is never scored as
a natural stop (its reward sees "abort", it is not trained on, Overlong does not take it for a max_tokens
cut), and a streamed choice the server aborted is continued; samples.jsonl and metrics.csv show them.

The engines, servers, environment and filter are the real ones; the reward is a verifiers taskset whose
reward is the finish reason it sees (exact values, no tolerance). A vLLM server's abort is answered by a
real loopback server (tests.support.ScriptedServer) in vLLM's shape: vLLM does not run here."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from grpokit.common.models import load_tokenizer
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.environment import Environment, EnvSpec, Example
from grpokit.inference import FINISH_REASONS, SamplingSettings
from grpokit.inference.remote import RemoteEngine
from grpokit.inference.streams import GroupRequest
from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts
from grpokit.orchestrator.rollouts import sampled_group
from grpokit.orchestrator.stats import finish_fractions
from grpokit.registry.filters.overlong import Overlong
from tests.support import ChatLengthEnv, ScriptedServer, ToolReplyTask, drain, serving

FINISH_ENV = '''
"""A taskset whose reward is the finish reason its trace says (stop 1, length 2, abort 3), with verifiers'
own views of it as metrics."""
import verifiers.v1 as vf


class FinishData(vf.TaskData):
    answer: str = ""


class FinishTask(vf.Task[FinishData]):
    @vf.reward(weight=1.0)
    async def by_finish(self, trace: vf.Trace) -> float:
        return {"stop": 1.0, "length": 2.0, "abort": 3.0}[trace.info["finish_reason"]]

    @vf.metric
    async def truncated(self, trace: vf.Trace) -> float:
        return float(trace.is_truncated)

    @vf.metric
    async def aborted(self, trace: vf.Trace) -> float:
        return float(trace.stop_condition == "aborted")


class FinishConfig(vf.TasksetConfig):
    num_tasks: int = 2


class FinishTaskset(vf.Taskset[FinishTask, FinishConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            yield FinishTask(FinishData(prompt="Say something.", id=f"finish-{i}"), self.config.task)


__all__ = ["FinishTaskset"]
'''
REWARD = {"stop": 1.0, "length": 2.0, "abort": 3.0}


@pytest.fixture
def finish_env(tmp_path, monkeypatch) -> Environment:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "finish_reason_env.py").write_text(textwrap.dedent(FINISH_ENV))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "finish_reason_env", raising=False)
    yield Environment(EnvSpec(id="finish-reason-env"))
    sys.modules.pop("finish_reason_env", None)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


def cut(seed: int = 0) -> SamplingSettings:
    """Every completion reaches max_tokens: min_tokens masks EOS until then."""
    return SamplingSettings(temperature=1.0, max_tokens=3, min_tokens=3, seed=seed)


def stopped(tokenizer, seed: int = 0) -> SamplingSettings:
    """Every completion stops at its first token: every token is a stop token."""
    return SamplingSettings(temperature=1.0, max_tokens=3, seed=seed, stop_token_ids=list(range(len(tokenizer))))


def check_group(group, reason: str) -> None:
    """Each rollout ended with `reason`, its reward saw it, and Overlong flags exactly the "length" ones."""
    assert [r.finish_reason for r in group] == [reason] * len(group)
    assert [r.reward for r in group] == [REWARD[reason]] * len(group)
    assert [r.metrics["truncated"] for r in group] == [float(reason == "length")] * len(group)
    assert Overlong().flag(group) == [reason == "length"] * len(group)
    assert all(all(r.completion_mask) for r in group)  # stop and length are trained on
    assert finish_fractions(group) == {f"rollout/finish_{f}": float(f == reason) for f in FINISH_REASONS}


def test_builtin_engine_length_and_stop_reach_the_reward_and_overlong(tiny_model, tokenizer, finish_env):
    """generate (the plain path) and generate_rollouts (the engine's stream) alike."""
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    example = finish_env.examples[0]
    prompt = ChatTokens(tokenizer).prompt(example.messages)
    for sampling, reason in ((cut(), "length"), (stopped(tokenizer), "stop")):
        (completions,) = engine.generate([prompt], 2, sampling)
        assert [c.finish_reason for c in completions] == [reason] * 2
        check_group(sampled_group(finish_env, example, prompt, completions, 0, tokenizer), reason)
        (group,) = generate_rollouts(engine, tokenizer, [(finish_env, example)], 2, sampling, 0)
        check_group(group, reason)


def test_through_grpokit_server_length_and_stop_reach_the_reward(tiny_model, tokenizer, finish_env):
    """RemoteEngine reads the server's finish_reason, plain answers and streamed ones."""
    with serving(tiny_model) as (_, server):
        engine = RemoteEngine(base_url=server.url, model_name="tiny")
        engine.setup(tiny_model)
        for sampling, reason in ((cut(), "length"), (stopped(tokenizer), "stop")):
            (group,) = generate_rollouts(engine, tokenizer, [(finish_env, finish_env.examples[1])], 2, sampling, 0)
            check_group(group, reason)


def vllm_answer(*reasons: str | None) -> dict:
    """A vLLM /v1/completions answer of one prompt: choice i has two tokens and finish_reason reasons[i]."""
    choices = [
        {"index": i, "token_ids": [40, 41], "logprobs": {"token_logprobs": [-0.5, -0.25]}, "finish_reason": r}
        for i, r in enumerate(reasons)
    ]
    return {"choices": choices, "weight_step": 0}


@pytest.mark.parametrize("server_reason", ["abort", "error", None], ids=["abort", "error", "missing"])
def test_an_aborted_request_is_scored_as_abort_and_not_trained_on(tokenizer, finish_env, server_reason):
    """vLLM answers a request it aborted with finish_reason "abort" (or "error"); an answer that does not
    say why it ended is no natural stop either. The reward sees "abort", the rollout keeps its reward in
    the group but none of its tokens is trained on, and Overlong does not count it as a max_tokens cut."""
    with ScriptedServer([vllm_answer("stop", server_reason)]) as server:
        engine = RemoteEngine(base_url=server.url, vocab_size=len(tokenizer))
        engine.setup("unused")
        (completions,) = engine.generate([[1, 2]], 2, SamplingSettings(max_tokens=8))
    assert [(c.finish_reason, c.is_truncated) for c in completions] == [("stop", False), ("abort", False)]
    natural, aborted = sampled_group(finish_env, finish_env.examples[0], [1, 2], completions, 0, tokenizer)
    assert (natural.finish_reason, natural.reward, natural.completion_mask) == ("stop", 1.0, [1, 1])
    assert (aborted.finish_reason, aborted.reward, aborted.completion_mask) == ("abort", 3.0, [0, 0])
    assert (aborted.metrics["aborted"], aborted.metrics["truncated"], aborted.is_truncated) == (1.0, 0.0, False)
    assert Overlong().flag([natural, aborted]) == [False, False]
    assert finish_fractions([natural, aborted]) == {
        "rollout/finish_stop": 0.5,
        "rollout/finish_length": 0.0,
        "rollout/finish_abort": 0.5,
    }


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def test_a_streamed_choice_the_server_aborted_is_continued_not_stopped():
    """A streamed request whose choice ends "abort" is continued from its tokens so far (as a cut one is),
    and the completion ends with the continuation's own finish reason."""
    aborted = vllm_answer("abort")
    aborted["choices"][0].update(token_ids=[5], logprobs={"token_logprobs": [-0.5]})
    rest = vllm_answer("stop")
    with ScriptedServer([sse(aborted), sse(rest)]) as server:
        engine = RemoteEngine(base_url=server.url, max_retries=1, vocab_size=100)
        engine.setup("unused")
        stream = engine.open_stream(SamplingSettings(max_tokens=8), 8)
        stream.submit(GroupRequest("g", [1, 2], 1))
        try:
            (completion,) = drain(stream)["g"]
        finally:
            stream.close()
        assert server.request_bodies[1]["prompt"] == [[1, 2, 5]]  # continued after the aborted token
    assert (completion.token_ids, completion.finish_reason) == ([5, 40, 41], "stop")


def test_multi_turn_rollouts_keep_each_turns_finish_reason(tiny_model, tokenizer, finish_env):
    """Each turn's reason is on the rollout; the rollout's is its last turn's; the reward sees them all."""
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    example = Example(0, [{"role": "user", "content": "hi"}], ToolReplyTask())
    sampling = SamplingSettings(temperature=1.0, max_tokens=3, seed=3, stop_token_ids=[tokenizer.encode("a")[0]])
    (group,) = generate_rollouts(
        engine, tokenizer, [(ChatLengthEnv(), example)], 4, sampling, 0, turns=TurnLimits(3, 400)
    )
    for r in group:
        assert len(r.turn_finish_reasons) == r.metrics["turns"] and set(r.turn_finish_reasons) <= {"stop", "length"}
        assert r.finish_reason == r.turn_finish_reasons[-1] and r.is_truncated == (r.finish_reason == "length")
    chat = [*finish_env.examples[0].messages, {"role": "assistant", "content": "a"}]
    chat += [{"role": "user", "content": "more"}, {"role": "assistant", "content": "b"}]
    for reasons, reward, truncated in ((["stop", "length"], 2.0, 1.0), (["length", "stop"], 1.0, 0.0)):
        ((got, metrics),) = finish_env.score_conversations(finish_env.examples[:1], [chat], finish_reasons=[reasons])
        assert (got, metrics["truncated"]) == (reward, truncated)


def test_samples_jsonl_and_metrics_show_the_finish_reason(tmp_path, tiny_model):
    from grpokit.main import main
    from grpokit.testing import tiny_fit_argv
    from tests.support import read_metrics

    argv = tiny_fit_argv(tmp_path, tiny_model, "finish", "--data.eval", "null", "--trainer.max_steps", "2")
    main([*argv, "--data.sampling.max_tokens", "4", "--data.sampling.min_tokens", "4"])
    run = tmp_path / "finish"
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert samples and {s["finish_reason"] for s in samples} == {"length"}
    rows = read_metrics(run, "rollout/finish_length")
    assert rows and {(r["rollout/finish_length"], r["rollout/finish_abort"]) for r in rows} == {("1.0", "0.0")}
