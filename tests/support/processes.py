"""Processes, threads and waiting, for tests that run servers and subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


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


def kill_after_checkpoint(argv: list[str], checkpoint: Path, timeout: float = 300.0) -> None:
    """Run `grpokit argv` in a fresh process and SIGKILL it as soon as `checkpoint` exists (a crash mid-run);
    fail if the process ends first or no checkpoint appears within `timeout`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    while not checkpoint.exists():
        assert proc.poll() is None, f"grpokit {argv[0]} ended before it could be killed"
        assert time.monotonic() < deadline, f"no {checkpoint.name} after {timeout:g} s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def start_grpokit(log_dir: Path, argv: list[str], name: str, **popen) -> tuple[subprocess.Popen, Path]:
    """`python -m grpokit ARGV` in the background, stdout and stderr to `log_dir/NAME.log`: (process, log)."""
    log = log_dir / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit", *argv], stdout=open(log, "w"), stderr=subprocess.STDOUT, **popen
    )
    return proc, log


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until `path` exists; fail (never hang) if `proc` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"grpokit exited with {proc.returncode} before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)
