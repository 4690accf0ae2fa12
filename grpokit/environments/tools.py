"""Tool calls: parsed from the model's text, run as Python functions with a timeout, answered as a
message the model reads. Nothing a model writes or a tool does ends the run: a malformed call, an unknown
tool, bad arguments, a tool that raises or runs past its timeout each become an error message in the
conversation, and are counted (`tool_errors`, `tool_timeouts`).

The call syntax is Hermes' (what Qwen 2.5/3 chat templates and most open tool-calling models use):

    <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>

or a JSON list of such objects in one block (SmolLM2's function-calling format).

Tool schemas for templates that list tools in the prompt come from the function's signature and
docstring through transformers' `get_json_schema` (Google-style "Args:" docstrings).

Timeouts run the tool in a worker thread (grpokit.environments.workers) and stop waiting after `timeout`
seconds. Python cannot kill a thread, so a tool that never returns keeps its thread; the workers are
daemons (the process still exits after the run's last step) and a call given up on frees its place in
the pool, so hung calls never starve healthy ones. Each timed-out call counts in `env/tool_timeouts`, and
a WARNING names the tool at its first timeout and every TIMEOUT_WARN_EVERY-th after, with the threads
still stuck. Tools that may hang for good should bound themselves (a subprocess with its own timeout).

A result that JSON cannot encode (tuple or NumPy keys, a circular object, an int of over 4,300 digits)
is an error message naming the tool, counted in `tool_errors`, and a WARNING once per tool (the tool's
author must fix it, the model cannot). A call nested deeper than the JSON parser recurses is a malformed
call, as is any block that is not JSON.

A tool may return a picture: a PIL image, or a list of strings, PIL images and text/image content parts
holding one (grpokit.environments.tool_images). Its message's content is then those parts, rendered by the
policy's processor (a vision-language model), and the picture joins the conversation's image inputs.

An `async def` tool runs as a task on one event loop per process (`tool_loop`, a daemon thread), where
a timeout cancels it; it must not block that loop (no `time.sleep`, no blocking I/O).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpokit.common.once import Once
from grpokit.environments.tool_images import picture_parts
from grpokit.environments.workers import POOL

log = logging.getLogger(__name__)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
MAX_RESULT_CHARS = 2000  # a tool's answer is cut here so one call cannot fill the sequence budget
TIMEOUT_WARN_EVERY = 100  # a tool's timeouts are logged at the first and every this many after
_TIMEOUTS: Counter = Counter()  # timed-out calls per tool name, this process
_UNENCODABLE = Once()  # tools whose result could not be encoded (warned once each)
_COUNT_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


@dataclass
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (or why it could not be read)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # set when the call's text is not a valid call


@dataclass
class ToolResult:
    """What a call returned, as the message content the model reads (text, or content parts when the tool
    returned a picture: grpokit.environments.tool_images), and how it went: ok, error or timeout."""

    call: ToolCall
    content: str | list[dict[str, Any]]
    status: str  # "ok" | "error" | "timeout"


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The Hermes tool calls in a reply, in order; a block that is not a JSON object with a string
    `name` and an object `arguments` is a ToolCall with `error` set (the model is told why)."""
    calls = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall(name="", error=f"the tool call is not valid JSON ({e.msg} at {e.pos})"))
            continue
        except RecursionError:  # brackets nested past the parser's recursion limit: the model's text, not ours
            calls.append(ToolCall(name="", error="the tool call's JSON nests too deeply"))
            continue
        # a JSON list of calls in one block is SmolLM2's (and APIGen's) variant of the syntax
        calls += [_call(item) for item in data] if isinstance(data, list) else [_call(data)]
    return calls


def _call(data) -> ToolCall:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(name="", error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=data["name"], error="the tool call's arguments must be a JSON object")
    return ToolCall(name=data["name"], arguments=arguments)


def run_tool_calls(
    tools: dict[str, Callable[..., Any]], calls: list[ToolCall], timeout: float, where: str = ""
) -> list[ToolResult]:
    """Run each call (concurrently, each with `timeout` seconds) and return its result message text.
    `where` (e.g. "environment 'calc' example 3") goes into the warnings a timeout or a result JSON
    cannot encode logs."""
    futures = [_submit(tools[c.name], c.arguments) if _callable(tools, c) else None for c in calls]
    return [_result(tools, call, future, timeout, where) for call, future in zip(calls, futures)]


def tool_loop() -> asyncio.AbstractEventLoop:
    """The event loop that async tools (and verifiers Toolsets' setup and teardown) run on: one per
    process, running in a daemon thread from the first use on."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="grpokit-tool-loop", daemon=True).start()
        return _LOOP


def run_async(coroutine, timeout: float | None = None) -> Any:
    """Run a coroutine on the tool loop and wait for its result; past `timeout` seconds it is cancelled
    and TimeoutError raised."""
    future = asyncio.run_coroutine_threadsafe(coroutine, tool_loop())
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


def _submit(fn: Callable[..., Any], arguments: dict[str, Any]) -> concurrent.futures.Future:
    """A call's future: an async tool as a task on the tool loop, any other in the thread pool."""
    if inspect.iscoroutinefunction(fn):
        return asyncio.run_coroutine_threadsafe(_awaited(fn, arguments), tool_loop())
    return POOL.submit(fn, **arguments)


async def _awaited(fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    return await fn(**arguments)  # inside the task, so bad arguments fail as the tool's error


def _callable(tools: dict[str, Callable[..., Any]], call: ToolCall) -> bool:
    return call.error is None and call.name in tools


def _result(tools, call: ToolCall, future, timeout: float, where: str) -> ToolResult:
    """One call's result message: the tool's answer (a picture as content parts, else JSON for anything but a
    str, cut at MAX_RESULT_CHARS), or an error the model reads (a malformed call, an unknown tool, a raise, a
    timeout, an answer JSON cannot encode): nothing a tool does may end the run."""
    if call.error is not None:
        return ToolResult(call, f"Error: {call.error}", "error")
    if future is None:
        return ToolResult(call, f"Error: unknown tool {call.name!r}; the tools are {sorted(tools)}", "error")
    try:
        value = future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()  # cancels an async tool's task; a thread already running cannot be stopped
        POOL.abandon(future)  # its worker's place goes to the next call
        _warn_timeout(call.name, timeout, where)
        return ToolResult(call, f"Error: the tool {call.name!r} took longer than {timeout:g} s", "timeout")
    except Exception as e:  # the model sees the tool's error and may try again; the run goes on
        return ToolResult(call, f"Error: {_error_text(e)}"[:MAX_RESULT_CHARS], "error")
    try:
        parts = picture_parts(value, MAX_RESULT_CHARS)  # a picture: content parts (grpokit.environments.tool_images)
    except Exception as e:  # a part beside the picture that is neither text nor an image, an unreadable image
        _warn_unencodable(call.name, e, where, "a picture grpokit cannot read")
        message = f"Error: the tool {call.name!r} returned a picture grpokit cannot read ({_error_text(e)})"
        return ToolResult(call, message[:MAX_RESULT_CHARS], "error")
    if parts is not None:
        return ToolResult(call, parts, "ok")
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except Exception as e:  # TypeError (tuple keys), ValueError (a cycle, a huge int), RecursionError
        _warn_unencodable(call.name, e, where)
        kind = type(value).__name__
        message = f"Error: the tool {call.name!r} returned a {kind} that JSON cannot encode ({_error_text(e)})"
        return ToolResult(call, message[:MAX_RESULT_CHARS], "error")
    return ToolResult(call, text[:MAX_RESULT_CHARS], "ok")


def _error_text(e: BaseException) -> str:
    """`Type: message` of an error, even one whose str() raises."""
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:
        return type(e).__name__


def _warn_timeout(name: str, timeout: float, where: str) -> None:
    """Count the tool's timeout; log a WARNING at its first and every TIMEOUT_WARN_EVERY-th after."""
    with _COUNT_LOCK:
        _TIMEOUTS[name] += 1
        count = _TIMEOUTS[name]
    if count == 1 or count % TIMEOUT_WARN_EVERY == 0:
        log.warning(
            "tool %r took longer than %g s%s: %d timed-out call(s) of it so far (env/tool_timeouts counts them); "
            "%d thread(s) still run calls that never returned; bound the tool or raise the task's tool_timeout",
            name,
            timeout,
            f" ({where})" if where else "",
            count,
            POOL.stuck,
        )


def _warn_unencodable(name: str, error: Exception, where: str, what: str = "a value JSON cannot encode") -> None:
    """Log, once per tool, that its result could not be encoded (JSON, or a picture's parts): its author's
    fix, not the model's."""
    if _UNENCODABLE.first(name):
        log.warning(
            "tool %r returned %s%s (%s); the model gets an error message (counted in "
            "env/tool_errors); return a str, JSON-encodable data with str keys, or a picture (docs/environments.md)",
            name,
            what,
            f" ({where})" if where else "",
            _error_text(error)[:200],
        )


def tool_schemas(tools: dict[str, Callable[..., Any]]) -> list[dict[str, Any]]:
    """OpenAI-style JSON schemas of the tools, for chat templates that list tools in the prompt."""
    from transformers.utils import get_json_schema

    return [get_json_schema(fn) for fn in tools.values()]
