"""Processes, threads and waiting, for tests that run servers and subprocesses."""

from __future__ import annotations

import threading
import time


def process_group_gone(pgid: int, within: float) -> bool:
    """True once no process of the group `pgid` is left, waiting up to `within` seconds (a killed worker
    may linger as a zombie until reaped)."""
    import os

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    """Run fn(*args) in a daemon thread; the list gets its result."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    return thread, result


def wait_until(condition, timeout: float = 10.0) -> None:
    """Poll `condition` every 10 ms until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
