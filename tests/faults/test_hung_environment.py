"""Environment code that never returns: a hung tool call times out (counted, and a WARNING names the tool),
hung calls never starve healthy ones, a hung `respond` stops the run naming the environment and example,
and in every case the process still exits (the calls' threads are daemons, never joined)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from grpokit.common.errors import RunDataError
from grpokit.environments import tools
from grpokit.environments.environment import Example
from grpokit.environments.tools import parse_tool_calls, run_tool_calls
from grpokit.environments.workers import ToolPool
from tests.support import ChatLengthEnv, play

REPO = Path(__file__).resolve().parents[2]
RELEASE = threading.Event()  # set at the end of each test, so its hung calls' threads finish


@pytest.fixture(autouse=True)
def _release_hung_calls():
    RELEASE.clear()
    yield
    RELEASE.set()


def hang() -> str:
    RELEASE.wait()
    return "late"


def add(a: int, b: int) -> int:
    return a + b


def test_hung_calls_do_not_starve_healthy_ones_and_are_reported(caplog, monkeypatch):
    """Eight hung calls used to fill the pool of 8: every later call timed out for the rest of the run."""
    monkeypatch.setattr(tools, "_TIMEOUTS", tools.Counter())
    monkeypatch.setattr(tools, "TIMEOUT_WARN_EVERY", 4)
    hung = parse_tool_calls('<tool_call>{"name": "hang", "arguments": {}}</tool_call>' * 9)
    healthy = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    with caplog.at_level(logging.WARNING, logger="grpokit.environments.tools"):
        results = run_tool_calls({"hang": hang}, hung, 0.05, "environment 'calc' example 3")
        assert [r.status for r in results] == ["timeout"] * 9
        start = time.perf_counter()
        for _ in range(3):
            (result,) = run_tool_calls({"add": add}, healthy, 5.0)
            assert (result.status, result.content) == ("ok", "5")
        assert time.perf_counter() - start < 1
    warnings = [r.getMessage() for r in caplog.records if "'hang'" in r.getMessage()]
    assert len(warnings) == 3  # the 1st, 4th and 8th timeout
    assert all(w.startswith("tool 'hang' took longer than 0.05 s (environment 'calc' example 3)") for w in warnings)
    assert "8 timed-out call(s) of it so far" in warnings[-1] and "thread(s) still run calls" in warnings[-1]
    assert tools.POOL.stuck >= 8


def test_a_pool_replaces_workers_given_up_on_and_they_end_when_their_call_returns():
    pool = ToolPool(2, "test-pool")
    release = threading.Event()
    stuck = [pool.submit(release.wait) for _ in range(2)]
    queued = pool.submit(lambda: "queued")
    for future in stuck:
        with pytest.raises(TimeoutError):
            future.result(timeout=0.05)
        pool.abandon(future)
    assert queued.result(timeout=2) == "queued" and pool.stuck == 2
    release.set()
    deadline = time.monotonic() + 5
    while pool.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stuck == 0 and [f.result() for f in stuck] == [True, True]
    assert [pool.submit(add, 1, b).result(timeout=2) for b in range(4)] == [1, 2, 3, 4]


class HungRespond:
    respond_timeout = 0.2

    def respond(self, messages, state):
        RELEASE.wait()


def test_a_hung_respond_stops_the_run_naming_the_environment_and_example():
    start = time.perf_counter()
    with pytest.raises(RunDataError) as error:
        play(ChatLengthEnv(), Example(5, [{"role": "user", "content": "hi"}], HungRespond()), ["hello"])
    assert time.perf_counter() - start < 2
    assert str(error.value).startswith(
        "environment 'three-turn' example 5: respond() did not return within 0.2 s (the task's respond_timeout"
    )


HUNG_SCRIPT = """
import sys
import threading

from grpokit.common.errors import RunDataError
from grpokit.environments.environment import Example
from grpokit.environments.tools import parse_tool_calls, run_tool_calls
from tests.support import ChatLengthEnv, play


def hang():
    threading.Event().wait()


class HungRespond:
    respond_timeout = 0.2

    def respond(self, messages, state):
        threading.Event().wait()


calls = parse_tool_calls('<tool_call>{"name": "hang", "arguments": {}}</tool_call>' * 10)
print([r.status for r in run_tool_calls({"hang": hang}, calls, 0.1)].count("timeout"), flush=True)
try:
    play(ChatLengthEnv(), Example(1, [{"role": "user", "content": "hi"}], HungRespond()), ["hello"])
except RunDataError as e:
    print(e, flush=True)
sys.exit(3)
"""


def test_the_process_exits_with_hung_tool_calls_and_a_hung_respond(tmp_path):
    """The tool pool was joined at exit: one call that never returned kept the process alive for good."""
    script = tmp_path / "hung.py"
    script.write_text(textwrap.dedent(HUNG_SCRIPT))
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert done.returncode == 3, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "10" and lines[1].startswith("environment 'three-turn' example 1: respond() did not return")
    assert time.perf_counter() - start < 30
