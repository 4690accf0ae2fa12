"""verifiers Toolsets as grpokit tool sources, in process: a taskset whose Task (per rollout) and Taskset (per
run) return `vf.Toolset`s loads by id as a multi-turn environment; its `@vf.tool` methods, sync and async,
run with grpokit's timeout and error messages, read and write the rollout's verifiers State (which the
rubric sees), and are set up and torn down with verifiers' lifetimes."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest

from grpokit.environments.conversation import Conversation, environment_turn, is_multi_turn
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.environments.toolsets import close_toolsets, tool_methods
from grpokit.inference import Completion, SamplingSettings
from tests.support import ReplyEngine

pytestmark = pytest.mark.unit

MODULE = "grpokit_test_toolsets_env"
ENV_SOURCE = '''
import asyncio
import time

import verifiers.v1 as vf

EVENTS = []  # (what, toolset id) of every setup, setup_task and teardown
CANCELLED = []


class Counter(vf.State):
    calls: int = 0


class Calc(vf.Toolset[vf.ToolsetConfig, Counter]):
    TOOL_PREFIX = None  # bare names: add, times, ...

    async def setup(self):
        EVENTS.append(("setup", id(self)))
        self._exit_stack.push_async_callback(self._bye)

    async def setup_task(self, data):
        EVENTS.append(("setup_task", id(self), data.answer))

    async def _bye(self):
        EVENTS.append(("teardown", id(self)))

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.calls += 1
        return a + b

    @vf.tool(name="times")
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        await asyncio.sleep(0)
        self.state.calls += 1
        return a * b

    @vf.tool
    def boom(self) -> str:
        """Always fails."""
        raise ValueError("boom")

    @vf.tool
    def slow(self) -> str:
        """Blocks for a while."""
        time.sleep(1.5)
        return "late"

    @vf.tool
    async def hang(self) -> str:
        """Never answers."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            CANCELLED.append(True)
            raise
        return "never"


class Notes(vf.Toolset[vf.ToolsetConfig]):  # the default prefix: notes_read
    async def setup(self):
        EVENTS.append(("setup", id(self)))

    @vf.tool
    def read(self, key: str) -> str:
        """Read a note."""
        return {"pin": "1234"}.get(key, "no such note")


class CalcData(vf.TaskData):
    answer: int


class CalcTask(vf.Task[CalcData, Counter]):
    tool_timeout = 0.3
    max_turns = 3

    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.metric
    async def state_calls(self, trace) -> float:
        return float(trace.state.calls)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Notes(vf.ToolsetConfig())]

    def load(self):
        for i in range(2):
            yield CalcTask(CalcData(prompt=f"What is 2 + {i}?", answer=2 + i, id=f"calc-{i}"), self.config.task)


__all__ = ["CalcTaskset"]
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The taskset above, loaded by its id through verifiers' loader."""
    folder = tmp_path_factory.mktemp("toolset-env")
    (folder / f"{MODULE}.py").write_text(ENV_SOURCE)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield Environment(EnvSpec(id=MODULE.replace("_", "-")))
    sys.modules.pop(MODULE, None)


@pytest.fixture
def mod(env):
    module = sys.modules[MODULE]
    module.EVENTS.clear()
    return module


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def reply(conv: Conversation, text: str, last_turn: bool = False):
    conv.messages.append({"role": "assistant", "content": text})
    turn = environment_turn(conv, last_turn=last_turn)
    conv.messages += turn.messages
    return turn


def test_names_and_schemas_are_verifiers_own(env):
    ex = env.examples[0]
    assert is_multi_turn(ex.task, ex.toolsets) and not is_multi_turn(ex.task)
    assert ex.toolsets.names == ["add", "boom", "hang", "times", "slow", "notes_read"]  # by method name, as verifiers
    add = next(s for s in ex.toolsets.schemas if s["function"]["name"] == "add")
    assert add == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
                "required": ["a", "b"],
                "title": "addArguments",
                "type": "object",
            },
        },
    }
    notes = sys.modules[MODULE].Notes
    notes.TOOL_PREFIX = "memo"
    try:
        assert list(tool_methods(notes(notes._config_cls()()))) == ["memo_read"]
    finally:
        notes.TOOL_PREFIX = ""


def test_the_prompt_lists_the_schemas_for_templates_that_list_tools(env):
    from grpokit.orchestrator.prompt_length import prompt_token_ids

    seen = {}

    class Tokenizer:
        def apply_chat_template(self, messages, **kwargs):
            seen.update(kwargs)
            return [1, 2]

    prompt_token_ids(Tokenizer(), env.examples[0])
    assert seen["tools"] == env.examples[0].toolsets.schemas


def test_tool_calls_run_in_process_with_grpokits_rules(env, mod):
    conv = Conversation(env, env.examples[0], [], [dict(m) for m in env.examples[0].messages])
    start = time.perf_counter()
    turn = reply(
        conv,
        call("add", a=2, b="3")  # coerced, as MCP's validation does
        + call("times", a=4, b=5)
        + call("notes_read", key="pin")
        + call("boom")
        + call("add", a=1)
        + call("add", a=1, b=2, c=3)
        + call("slow")
        + call("hang")
        + call("nope"),
    )
    assert time.perf_counter() - start < 1.2  # the timeouts (0.3 s) ran concurrently
    contents = [m["content"] for m in turn.messages]
    assert contents[:3] == ["5", "20", "1234"]
    assert contents[3] == "Error: ValueError: boom"
    assert "ValidationError" in contents[4] and "Missing required argument" in contents[4]
    assert "Unexpected keyword argument" in contents[5]
    assert contents[6] == contents[7].replace("hang", "slow") == "Error: the tool 'slow' took longer than 0.3 s"
    assert "unknown tool 'nope'" in contents[8] and "'notes_read'" in contents[8]
    assert (conv.tool_calls, conv.tool_errors, conv.tool_timeouts) == (9, 4, 2)
    assert conv.toolsets.state.calls == 2  # add and times wrote the rollout's State
    time.sleep(0.2)
    assert mod.CANCELLED  # an async tool past its timeout is cancelled, not left running
    close_toolsets([conv])


def test_lifetimes_and_state_mirror_verifiers(env, mod):
    ex = env.examples[1]
    shared_started = ex.toolsets.shared._started  # by an earlier test of this module, or not yet
    assert ex.toolsets.shared is env.examples[0].toolsets.shared
    a, b, quiet = (Conversation(env, ex, [], [dict(m) for m in ex.messages]) for _ in range(3))
    reply(a, call("add", a=1, b=1))
    reply(a, call("times", a=2, b=2))
    reply(b, call("add", a=1, b=1))
    reply(quiet, "3")  # no tool call: nothing is set up for this rollout
    own = [e for e in mod.EVENTS if e[0] == "setup_task"]
    assert len(own) == 2 and own[0][1] != own[1][1] and own[0][2] == 3  # one Calc per rollout, given the task
    shared = [e for e in mod.EVENTS if e[0] == "setup" and e[1] not in {o[1] for o in own}]
    assert len(shared) == (0 if shared_started else 1)  # one Notes for the run, set up once
    assert (a.toolsets.state.calls, b.toolsets.state.calls, quiet.toolsets) == (2, 1, None)
    close_toolsets([a, b, quiet])
    assert sorted(e[1] for e in mod.EVENTS if e[0] == "teardown") == sorted(o[1] for o in own)
    (_, metrics_a), (_, metrics_q) = env.score_conversations(
        [ex, ex], [a.messages, quiet.messages], [a.toolsets.state, None]
    )
    assert metrics_a["state_calls"] == 2.0 and metrics_q["state_calls"] == 0.0  # trace.state is the rollout's


def test_a_toolset_state_of_another_type_is_copied_in_and_back():
    import verifiers.v1 as vf

    from grpokit.environments.toolsets import RolloutToolsets, _bound

    class Mine(vf.State):
        calls: int = 0

    class Theirs(vf.State):
        calls: int = 0
        other: str = "kept"

    class Tools(vf.Toolset[vf.ToolsetConfig, Mine]):
        @vf.tool
        def bump(self) -> int:
            self.state.calls += 1
            return self.state.calls

    tools = Tools(vf.ToolsetConfig())
    rollout = RolloutToolsets(Theirs(calls=4), [])
    assert _bound(tools.bump, tools, rollout)() == 5
    assert isinstance(rollout.state, Theirs) and (rollout.state.calls, rollout.state.other) == (5, "kept")


def test_a_setup_that_raises_stops_the_run_naming_the_environment():
    import verifiers.v1 as vf

    from grpokit.environments.toolsets import tool_sources

    class Broken(vf.Toolset[vf.ToolsetConfig]):
        async def setup(self):
            raise RuntimeError("no database")

        @vf.tool
        def look(self) -> str:
            return "x"

    class Task(vf.Task):
        @classmethod
        def toolsets(cls, config):
            return [Broken(vf.ToolsetConfig())]

    task = Task(vf.TaskData(prompt="hi"))
    (source,) = tool_sources(SimpleNamespace(), [task])
    example = SimpleNamespace(index=7, task=task, toolsets=source)
    conv = Conversation(SimpleNamespace(name="db"), example, [], [])
    with pytest.raises(ValueError, match="environment 'db' example 7: setting up .*RuntimeError: no database"):
        reply(conv, call("broken_look"))


def test_duplicate_names_and_mcp_proxies_are_refused_at_load():
    import verifiers.v1 as vf

    from grpokit.environments.toolsets import tool_sources

    class A(vf.Toolset[vf.ToolsetConfig]):
        TOOL_PREFIX = None

        @vf.tool
        def look(self) -> str:
            return "a"

    class Task(vf.Task):
        @classmethod
        def toolsets(cls, config):
            return [A(vf.ToolsetConfig()), A(vf.ToolsetConfig())]

    with pytest.raises(ValueError, match=r"tool names \['look'\] are given twice"):
        tool_sources(SimpleNamespace(), [Task(vf.TaskData(prompt="hi"))])

    class Proxy(A):  # tools served by another MCP server (as Harbor's toolset does): not callable in process
        def register(self, mcp):
            pass

    class ProxyTask(vf.Task):
        @classmethod
        def toolsets(cls, config):
            return [Proxy(vf.ToolsetConfig())]

    with pytest.raises(ValueError, match=r"toolsets \['Proxy'\] serve their tools through their own MCP"):
        tool_sources(SimpleNamespace(), [ProxyTask(vf.TaskData(prompt="hi"))])


class ScriptedEngine(ReplyEngine):
    """Calls `add` on its first turn, then answers with the tool's result."""

    def reply(self, ids, i):
        text = self.tok.decode(ids)
        result = text.split("<|im_start|>tool\n")[-1].split("<|im_end|>")[0] if "<|im_start|>tool" in text else None
        ids = self.tok.encode(result or call("add", a=2, b=1), add_special_tokens=False) + [self.end]
        return Completion(ids, [-0.5] * len(ids), False, 0)


def test_rollouts_through_generate_rollouts(env, mod):
    from grpokit.common.models import load_tokenizer
    from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts

    tokenizer = load_tokenizer("smollm2-135m")
    sampling = SamplingSettings(max_tokens=40, seed=0)
    ex = env.examples[1]
    (group,) = generate_rollouts(
        ScriptedEngine(tokenizer), tokenizer, [(env, ex)], 2, sampling, 0, turns=TurnLimits(4, 1024)
    )
    for r in group:
        assert [m["role"] for m in r.messages] == ["user", "assistant", "tool", "assistant"]
        assert r.messages[2]["content"] == "3" and r.reward == 1.0
        assert (r.metrics["turns"], r.metrics["tool_calls"], r.metrics["state_calls"]) == (2.0, 1.0, 1.0)
        assert 0 in r.completion_mask and r.completion_mask[-1] == 1
    setups = [e[1] for e in mod.EVENTS if e[0] == "setup_task"]
    assert len(setups) == 2 and sorted(e[1] for e in mod.EVENTS if e[0] == "teardown") == sorted(setups)


def test_async_plain_tools_run_on_the_tool_loop():
    """A task's plain `tools` may be `async def` too (grpokit.environments.tools)."""
    import asyncio

    from grpokit.environments.tools import parse_tool_calls, run_tool_calls

    async def lookup(key: str) -> str:
        await asyncio.sleep(0)
        return key.upper()

    async def stuck() -> str:
        await asyncio.sleep(30)
        return "never"

    calls = parse_tool_calls(call("lookup", key="ab") + call("lookup") + call("stuck"))
    results = run_tool_calls({"lookup": lookup, "stuck": stuck}, calls, timeout=0.2)
    assert [r.status for r in results] == ["ok", "error", "timeout"] and results[0].content == "AB"
    assert "TypeError" in results[1].content
