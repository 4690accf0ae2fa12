"""A server run as a child process: start it, wait until it serves, stop it; what `grpokit fit`,
`grpokit infer` and the orchestrator start for the length of a run (vLLM's server:
grpokit.inference.vllm.server; a judge's `grpokit judge`: grpokit.judges.launch).

The child runs in its own session, so a terminal's Ctrl-C reaches grpokit only (which stops it once);
on Linux it also gets SIGTERM if grpokit dies without stopping it (PR_SET_PDEATHSIG), so no server
outlives its run. Stopping is SIGTERM, then SIGKILL to its whole process group after a timeout.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)


class ServerProcess:
    """A server child process: start, wait until `/models` at `url` lists `served_name`, stop. `what`
    names it in messages, `timeout_key` the recipe key of its start-up timeout, `missing_hint` what to
    do when its program is missing."""

    what = "the server"
    timeout_key = "the start-up timeout"
    missing_hint = "check the command"

    def __init__(self, command: list[str], env: dict[str, str], url: str, served_name: str, log_path: Path) -> None:
        self.command, self.env, self.url, self.served_name, self.log_path = (
            command,
            env,
            url,
            served_name,
            Path(log_path),
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s: %s (output in %s)", self.what, " ".join(self.command), self.log_path)
        with open(self.log_path, "ab") as out:
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=_term_with_parent(os.getpid()),
                )
            except (FileNotFoundError, PermissionError) as e:
                raise FileNotFoundError(
                    f"cannot start {self.what}: {self.command[0]!r} ({e.strerror}). {self.missing_hint}"
                ) from e

    def wait_ready(self, timeout: float) -> float:
        """Block until /v1/models lists the served model; returns the seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.what} exited with code {self.process.returncode} while "
                    f"starting; the end of {self.log_path}:\n{self.log_tail()}"
                )
            if self.serves():
                return time.monotonic() - start
            time.sleep(1.0)
        self.stop(5.0)
        raise TimeoutError(
            f"{self.what} did not serve {self.served_name!r} at {self.url} within {timeout:.0f}s "
            f"({self.timeout_key}); the end of {self.log_path}:\n{self.log_tail()}"
        )

    def serves(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/models", timeout=5) as response:
                return self.served_name in response.read().decode()
        except OSError:
            return False

    def wait(self) -> int:
        """Block until the server exits; its exit code."""
        return self.process.wait()

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the server, SIGKILL its process group after `timeout` seconds; its exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs of SIGTERM: killing its process group", self.what, timeout)
        _kill_group(self.process.pid)  # its own children (vLLM's engine-core workers), if any outlived it
        return self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _term_with_parent(parent_pid: int):
    """A preexec_fn asking Linux to SIGTERM the server when grpokit dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # grpokit died before prctl took effect
            os._exit(1)

    return set_death_signal
