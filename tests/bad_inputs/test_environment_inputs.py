"""What a model's text, a tool, a task's `respond` or a taskset can get wrong at the environment layer:
each is an error message to the model (counted), a logged and counted outcome, or an error naming the
environment and example (or data.env); none ends the run with a raw error naming nothing.

Hung tools and a hung `respond` (and that the process still exits) are in tests/faults/test_hung_environment.py.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch

from grpokit.common.errors import RunDataError
from grpokit.common.models import load_tokenizer
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.conversation import Conversation, EnvTurn
from grpokit.environments.environment import Environment, EnvSpec, Example
from grpokit.environments.multi_turn import take_turn
from grpokit.environments.tools import parse_tool_calls, run_tool_calls
from grpokit.inference import Completion
from grpokit.orchestrator.stats import batch_metrics
from tests.support import ChatLengthEnv, installed_module, make_rollout, play

pytestmark = pytest.mark.unit


def _circular() -> list:
    loop: list = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    "value,cause",
    [
        ({(1, 2): "a"}, "not tuple"),
        ({np.int64(3): "a"}, "numpy.int64"),
        (_circular(), "Circular reference"),
        (10**5000, "4300 digits"),
    ],
    ids=["tuple-keys", "numpy-keys", "circular", "5000-digit-int"],
)
def test_a_result_json_cannot_encode_is_an_error_message_naming_the_tool(value, cause, caplog):
    def lookup() -> object:
        return value

    task = type("Task", (), {"tools": [lookup]})()
    example = Example(4, [{"role": "user", "content": "look it up"}], task)
    with caplog.at_level(logging.WARNING, logger="grpokit.environments.tools"):
        conv = play(ChatLengthEnv(), example, ['<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "done"])
    message = conv.messages[2]["content"]
    assert message.startswith("Error: the tool 'lookup' returned a") and cause in message, message
    assert (conv.tool_calls, conv.tool_errors, conv.tool_timeouts) == (1, 1, 0)
    warned = [r.getMessage() for r in caplog.records if "'lookup'" in r.getMessage()]
    assert len(warned) <= 1 and all("example 4" in w and "JSON cannot encode" in w for w in warned)


def test_an_unencodable_result_is_warned_once_per_tool(caplog):
    def tupled() -> dict:
        return {(1,): 1}

    (call,) = parse_tool_calls('<tool_call>{"name": "tupled", "arguments": {}}</tool_call>')
    with caplog.at_level(logging.WARNING, logger="grpokit.environments.tools"):
        for _ in range(3):
            (result,) = run_tool_calls({"tupled": tupled}, [call], 5.0, "environment 'e' example 0")
            assert result.status == "error"
    assert sum("'tupled'" in r.getMessage() for r in caplog.records) == 1


def test_a_call_nested_past_the_recursion_limit_is_a_malformed_call():
    deep = '{"name": "add", "arguments": ' + '{"a": ' * 1100 + "1" + "}" * 1100 + "}"
    text = f"<tool_call>{'[' * 1100}{']' * 1100}</tool_call><tool_call>{deep}</tool_call>"
    calls = parse_tool_calls(text)
    assert [c.error for c in calls] == ["the tool call's JSON nests too deeply"] * 2
    string_args = '{"name": "add", "arguments": "' + "[" * 1100 + "]" * 1100 + '"}'
    (call,) = parse_tool_calls(f"<tool_call>{string_args}</tool_call>")
    assert call.error == "the tool call's arguments must be a JSON object"
    task = type("Task", (), {"tools": [lambda: "x"]})()
    conv = play(ChatLengthEnv(), Example(0, [{"role": "user", "content": "hi"}], task), [text, "done"])
    assert conv.tool_errors == 2 and conv.messages[3]["content"] == "Error: the tool call's JSON nests too deeply"


class HugeReply:
    """A task whose `respond` answers each reply with a 10 MB user message."""

    def respond(self, messages, state):
        return EnvTurn(messages=[{"role": "user", "content": "x" * 10_000_000}])


def test_a_turn_too_long_for_the_budget_ends_the_rollout_unrendered_and_is_counted(caplog):
    tokenizer = load_tokenizer("smollm2-135m")
    chat = ChatTokens(tokenizer)
    env, example = ChatLengthEnv(), Example(7, [{"role": "user", "content": "hi"}], HugeReply())
    prompt = chat.prompt(example.messages)
    conv = Conversation.opening(env, example, prompt)
    reply = tokenizer.encode("hello", add_special_tokens=False)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="grpokit.environments.conversation"):
        take_turn(conv, Completion(reply, [-0.1] * len(reply), False, 0), tokenizer, chat, 4096, 64, 5)
    assert time.perf_counter() - start < 2  # was a full tokenisation of 10 MB (tens of seconds)
    assert conv.done and conv.is_truncated and conv.messages[-1]["role"] == "assistant"
    assert conv.metrics()["oversized_turns"] == 1.0
    (warning,) = [r.getMessage() for r in caplog.records if "10000000 characters" in r.getMessage()]
    assert "environment 'three-turn' example 7" in warning and "env/oversized_turns" in warning
    # a turn that fits is rendered as before, and the metric is absent from rollouts without one
    fits = Conversation.opening(env, example, prompt)
    fits.example = Example(7, example.messages, type("Short", (), {"respond": lambda s, m, st: [m[-1]]})())
    take_turn(fits, Completion(reply, [-0.1] * len(reply), False, 0), tokenizer, chat, 4096, 64, 5)
    assert not fits.done and "oversized_turns" not in fits.metrics()


TASKSETS = """
import itertools

import verifiers.v1 as vf


class CountData(vf.TaskData):
    answer: str = ""


class CountTask(vf.Task[CountData]):
    @vf.reward(weight=0.7)
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)

    @vf.reward(weight=0.3)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or "") <= 3)


class CountConfig(vf.TasksetConfig):
    infinite: bool = False


class CountTaskset(vf.Taskset[CountTask, CountConfig]):
    def load(self):
        for i in itertools.count():
            if i == 3 and not self.config.infinite:
                return
            yield CountTask(CountData(prompt=f"Say {i}.", answer=str(i), id=f"count-{i}"), self.config.task)


class Forever(CountTaskset):
    INFINITE = True


__all__ = ["CountTaskset"]
"""


@pytest.fixture
def tasksets(tmp_path, monkeypatch):
    with installed_module(tmp_path, monkeypatch, "count_env", TASKSETS) as module:
        yield module


def test_an_infinite_taskset_is_refused_at_start_naming_data_env(tasksets, monkeypatch):
    import grpokit.environments.environment as environment

    taskset = tasksets.Forever(tasksets.CountConfig(id="count-env", infinite=True))
    monkeypatch.setattr(environment, "load_taskset", lambda spec: taskset)
    with pytest.raises(ValueError) as error:
        Environment(EnvSpec(id="count-env"))  # listing it used to hang
    message = str(error.value)
    assert "data.env id 'count-env'" in message and "Forever is infinite" in message and "islice" in message
    monkeypatch.setattr(environment, "load_taskset", lambda spec: taskset.take(5))  # a bounded view is fine
    assert len(Environment(EnvSpec(id="count-env")).examples) == 5


@pytest.mark.parametrize("env_id", ["json", "grpokit", "count-env-module-helpers"])
def test_an_id_naming_a_module_that_is_no_environment_names_data_env_and_the_fix(tasksets, tmp_path, env_id):
    """An installed module without a Taskset in `__all__` (a standard library module, a package without
    `__all__`, a helper module beside a taskset) is a ValueError naming data.env, the id and the fix, not
    verifiers' TypeError or AttributeError (the `grpokit` command prints it as one line, exit 2)."""
    (tmp_path / "site" / "count_env_module_helpers.py").write_text("__all__ = ['helper']\n\ndef helper():\n    pass\n")
    with pytest.raises(ValueError) as error:
        Environment(EnvSpec(id=env_id))
    message = str(error.value)
    assert message.startswith(f"data.env id {env_id!r} names the module ") and "which is not an environment" in message
    assert "set data.env id to a built-in environment (" in message and "__all__ = ['MyTaskset']" in message


def test_each_reward_function_of_a_rubric_is_logged(tasksets):
    env = Environment(EnvSpec(id="count-env"))
    scores = env.score(env.examples, ["0", "1 is my answer", "two"])
    assert [s for _, s in scores] == [
        {"reward/exact": 1.0, "reward/brief": 1.0},
        {"reward/exact": 0.0, "reward/brief": 0.0},
        {"reward/exact": 0.0, "reward/brief": 1.0},
    ]
    assert [r for r, _ in scores] == pytest.approx([1.0, 0.0, 0.3])
    rollouts = [make_rollout(reward=r, metrics=m) for r, m in scores]
    metrics = batch_metrics(0, rollouts, torch.tensor([[r for r, _ in scores]]), {})
    assert metrics["env/reward/exact"] == pytest.approx(1 / 3) and metrics["env/reward/brief"] == pytest.approx(2 / 3)


def test_a_bad_respond_timeout_names_the_environment_and_example():
    task = type("Task", (), {"respond": lambda self, m, s: None, "respond_timeout": float("nan")})()
    with pytest.raises(RunDataError, match=r"environment 'three-turn' example 2: the task's respond_timeout is nan"):
        play(ChatLengthEnv(), Example(2, [{"role": "user", "content": "hi"}], task), ["hello"])
