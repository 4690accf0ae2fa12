"""verifiers Toolsets as tool sources, in process: no MCP server, no subprocess.

A verifiers (v1) Task whose `toolsets(config)` classmethod, or a Taskset whose `toolsets(config)`,
returns `vf.Toolset`s runs as a multi-turn task in grpokit. The model calls their `@vf.tool` methods as it
calls a task's plain `tools` (grpokit.environments.tools: Hermes syntax, grpokit's `tool_timeout`,
every failure an `Error: ...` tool message), each a plain method call in this process.

- Names are the ones verifiers advertises: `<server_name>_<tool>`, where `server_name` is the
  Toolset's TOOL_PREFIX ("", the default, is the snake-cased class name), or the bare tool name when
  TOOL_PREFIX is None; the tool is `@vf.tool(name=...)` or the method's name. Two tools of one task
  with one name are an error at load, as in verifiers.
- Schemas: each Toolset is registered on an in-memory MCP server (`mcp.server.mcpserver.MCPServer`, what
  verifiers' tool subprocess builds) and `list_tools` is read back into the OpenAI function format
  verifiers' harness sends, so the model sees verifiers' schemas exactly (the whole docstring as the
  description; parameters from pydantic). transformers' `get_json_schema` is not equivalent: it splits a
  docstring's `Args:` into per-parameter descriptions and refuses methods without them. The prompt lists
  them for templates that list tools (grpokit.orchestrator.prompt_length).
- Arguments are validated and coerced by pydantic (`validate_call`), as MCP does; an unknown argument
  is an error message (MCP drops it silently).
- Lifetimes mirror verifiers': a Task's toolsets are built anew for each rollout (`setup()`, then
  `setup_task(task.data)`, before its first tool call) and torn down (their `_exit_stack`, which
  verifiers' server closes on exit) when the step's conversations end; a Taskset's are built once per
  environment, `setup()` at the first call (never `setup_task`, as verifiers), torn down at exit.
  setup runs on the tool loop within SETUP_TIMEOUT; one that raises or hangs stops the run, naming the
  environment (an environment's fault, like a `respond` that raises).
- State: each rollout has one verifiers State of the task's State type (what verifiers' `trace.state`
  is); a tool reads and writes it as `self.state` (the same object when the Toolset's State type is
  the task's, a validated copy written back after a successful call otherwise; base `State` toolsets get
  a fresh one per call, as verifiers syncs none), and the rubric reads it as `trace.state`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpokit.environments.tools import run_async

log = logging.getLogger(__name__)
SETUP_TIMEOUT = 60.0  # seconds a rollout's (or the run's) toolsets may take to set up


class SharedToolsets:
    """A Taskset's toolsets: one instance each for the run, set up at the first tool call, torn down at exit."""

    def __init__(self, toolsets: list) -> None:
        self.toolsets = toolsets
        self._started = False
        self._lock = threading.Lock()

    def started(self) -> list:
        with self._lock:
            if not self._started:
                for ts in self.toolsets:
                    if _overrides(ts, "setup_task"):
                        log.warning(
                            "shared toolset %r overrides setup_task, which verifiers never calls for a taskset's "
                            "toolsets; build it in Task.toolsets to run it per rollout",
                            type(ts).__name__,
                        )
                run_async(_set_up(self.toolsets, None), SETUP_TIMEOUT)
                self._started = True
                atexit.register(self.close)
        return self.toolsets

    def close(self) -> None:
        with self._lock:
            if self._started:
                self._started = False
                _tear_down(self.toolsets)


@dataclass
class ToolSource:
    """Where the examples of one task class (and config) get Toolsets: `task_toolsets` builds the task's
    own for each rollout, `shared` holds the taskset's; `names` and `schemas` are their tools'."""

    task_toolsets: Callable[[], list] | None
    shared: SharedToolsets | None
    names: list[str]
    schemas: list[dict[str, Any]]

    def open(self, task: Any) -> RolloutToolsets:
        """One rollout's toolsets: its own set up for it, the shared ones, its tools bound to its State."""
        from verifiers.v1.state import state_cls

        rollout = RolloutToolsets(state_cls(type(task))(), self.task_toolsets() if self.task_toolsets else [])
        run_async(_set_up(rollout.own, task.data.model_copy(deep=True)), SETUP_TIMEOUT)
        for ts in [*rollout.own, *(self.shared.started() if self.shared else [])]:
            rollout.tools.update({name: _bound(fn, ts, rollout) for name, fn in tool_methods(ts).items()})
        return rollout


@dataclass
class RolloutToolsets:
    """The live toolsets of one rollout: its own instances, its verifiers State, its callable tools."""

    state: Any
    own: list
    tools: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def close(self) -> None:
        own, self.own = self.own, []
        _tear_down(own)


def tool_sources(taskset: Any, tasks: list) -> list[ToolSource | None]:
    """Each task's ToolSource (one per task class and config), or None for a task without toolsets."""
    shared_list = list(taskset.toolsets(taskset.config)) if hasattr(taskset, "toolsets") else []
    shared = SharedToolsets(shared_list) if shared_list else None
    sources: dict[tuple[type, int], ToolSource | None] = {}
    out = []
    for task in tasks:
        key = (type(task), id(getattr(task, "config", None)))
        if key not in sources:
            sources[key] = _source(task, shared)
        out.append(sources[key])
    return out


def _source(task: Any, shared: SharedToolsets | None) -> ToolSource | None:
    cls, config = type(task), getattr(task, "config", None)
    own = list(cls.toolsets(config)) if callable(getattr(cls, "toolsets", None)) else []
    if not own and shared is None:
        return None
    probes = [*own, *(shared.toolsets if shared else [])]
    proxies = [type(ts).__name__ for ts in probes if _overrides(ts, "register")]
    if proxies:
        raise ValueError(
            f"{cls.__name__}: toolsets {proxies} serve their tools through their own MCP `register` (a proxy to "
            "another MCP server, e.g. Harbor's), which needs verifiers' tool servers; grpokit calls `@vf.tool` "
            "methods in process only"
        )
    names = [name for ts in probes for name in tool_methods(ts)]
    duplicates = sorted({n for n in names if names.count(n) > 1} | {n for n in names if n in _plain_names(task)})
    if duplicates:
        raise ValueError(
            f"{cls.__name__}: tool names {duplicates} are given twice (by its toolsets, its taskset's or its "
            "`tools`); give one toolset a distinct TOOL_PREFIX"
        )
    factory = functools.partial(_task_toolsets, cls, config) if own else None
    return ToolSource(factory, shared, names, toolset_schemas(probes))


def _task_toolsets(cls: type, config: Any) -> list:
    return list(cls.toolsets(config))


def _plain_names(task: Any) -> set[str]:
    return {fn.__name__ for fn in getattr(task, "tools", None) or []}


def tool_methods(toolset: Any) -> dict[str, Callable[..., Any]]:
    """A Toolset's `@vf.tool` methods (bound), by the name verifiers gives the model."""
    from verifiers.v1.utils.decorators import discover_decorated

    prefix = toolset.server_name
    out = {}
    for fn in discover_decorated(toolset, "tool"):
        name = getattr(fn, "tool_name", None) or fn.__name__
        out[f"{prefix}_{name}" if prefix else name] = fn
    return out


def toolset_schemas(toolsets: list) -> list[dict[str, Any]]:
    """The OpenAI-style function schemas of the toolsets' tools, as verifiers lists them to the model
    (from MCP's `list_tools` of each Toolset registered on an in-memory server)."""
    from mcp.server.mcpserver import MCPServer

    schemas = []
    for ts in toolsets:
        server = MCPServer(ts.server_name or type(ts).__name__)
        ts.register(server)
        for tool in run_async(server.list_tools(), SETUP_TIMEOUT):
            name = f"{ts.server_name}_{tool.name}" if ts.server_name else tool.name
            function = {"name": name, "description": tool.description or "", "parameters": tool.input_schema}
            schemas.append({"type": "function", "function": function})
    return schemas


def close_toolsets(conversations: list) -> None:
    """Tear down the rollouts' own toolsets (those whose rollout made a tool call)."""
    for conv in conversations:
        if conv.toolsets is not None:
            conv.toolsets.close()


def _bound(fn: Callable[..., Any], toolset: Any, rollout: RolloutToolsets) -> Callable[..., Any]:
    """The tool as grpokit calls it: arguments checked by pydantic, `self.state` the rollout's State."""
    func, state_type = getattr(fn, "__func__", None), toolset._state_cls
    validated = _validated(fn) if func is None else functools.partial(_validated(func), toolset)
    if inspect.iscoroutinefunction(fn):

        async def call(**arguments):
            with _state_of(rollout, state_type):
                return await validated(**arguments)

    else:

        def call(**arguments):
            with _state_of(rollout, state_type):
                return validated(**arguments)

    return call


@functools.cache
def _validated(function: Callable[..., Any]) -> Callable[..., Any]:
    import pydantic

    return pydantic.validate_call(function)


@contextlib.contextmanager
def _state_of(rollout: RolloutToolsets, state_type: type):
    """verifiers' per-call state (`ServerBase.state` reads the `_call_state` context variable): the
    rollout's State, or a copy of it validated into the Toolset's State type, pushed back on success."""
    from verifiers.v1.mcp.server import _call_state
    from verifiers.v1.state import State

    copied = state_type is not State and not isinstance(rollout.state, state_type)
    if state_type is State:
        state = State()
    else:
        state = state_type.model_validate_json(rollout.state.model_dump_json()) if copied else rollout.state
    before = state.model_dump_json() if copied else None
    token = _call_state.set(state)
    try:
        yield
        if copied and state.model_dump_json() != before:
            rollout.state = type(rollout.state).model_validate_json(state.model_dump_json())
    finally:
        _call_state.reset(token)


async def _set_up(toolsets: list, task_data: Any) -> None:
    """verifiers' server start: `setup()`, then `setup_task(data)` for a rollout's own toolsets; on a
    failure the ones already set up are torn down."""
    try:
        for ts in toolsets:
            await ts.setup()
            if task_data is not None:
                await ts.setup_task(task_data)
    except BaseException:
        await _aclose(toolsets)
        raise


def _tear_down(toolsets: list) -> None:
    try:
        run_async(_aclose(toolsets), SETUP_TIMEOUT)
    except Exception as e:  # a teardown's failure loses nothing the run needs
        log.warning(
            "tearing down toolsets %s failed: %s: %s", [type(t).__name__ for t in toolsets], type(e).__name__, e
        )


async def _aclose(toolsets: list) -> None:
    """Close each toolset's exit stack (all of them, even after one fails); the first failure is raised."""
    errors = []
    for ts in toolsets:
        stack = getattr(ts, "_exit_stack", None)
        try:
            if stack is not None:
                await stack.aclose()
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


def _overrides(toolset: Any, method: str) -> bool:
    """Whether the toolset's class replaces verifiers' own `method` (vf.Toolset's, or the one it inherits)."""
    from verifiers.v1.mcp.toolset import Toolset

    return getattr(type(toolset), method) is not getattr(Toolset, method)
