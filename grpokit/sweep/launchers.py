"""Where a sweep's runs execute: child processes of the sweep (`local`) or SLURM jobs (`submitit`).

A launcher starts one run's command with its output appended to the run's log.txt and reports the exit
code once it has ended; the sweep's own loop (runner.py) decides what to start and when. Other
schedulers are not re-implemented here: submitit covers SLURM, and a wandb sweep agent can call
`grpokit fit` itself (docs/sweeps.md).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from grpokit.sweep.spec import SweepError


class Launcher(ABC):
    """Contract: `start` returns a handle at once; `poll(handle)` is None while the run goes on, then its exit code."""

    @abstractmethod
    def start(self, command: list[str], log_path: Path) -> Any:
        """Start `command` (output appended to `log_path`) and return a handle."""

    @abstractmethod
    def poll(self, handle: Any) -> int | None:
        """The run's exit code once it has ended, else None."""

    def job_id(self, handle: Any) -> str | None:
        """The run's id where it runs (a process id, a SLURM job id), recorded in sweep.json."""
        return None


class LocalLauncher(Launcher):
    """Runs are child processes of the sweep; on Linux they are killed when the sweep process dies, so a
    resumed sweep never races a leftover run of the killed one."""

    def start(self, command: list[str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            log.write(f"# {' '.join(command)}\n".encode())
            log.flush()
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent(os.getpid()),
            )

    def poll(self, handle: subprocess.Popen) -> int | None:
        return handle.poll()

    def job_id(self, handle: subprocess.Popen) -> str | None:
        return str(handle.pid)


def _die_with_parent(parent_pid: int):
    """A preexec_fn asking Linux to SIGKILL the child when the sweep process ends (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # the sweep died before prctl took effect
            os._exit(1)

    return set_death_signal


class RunCommand:
    """A submitit job body: run a command with its output appended to a log file; fail on a non-zero exit."""

    def __init__(self, command: list[str], log_path: str, cwd: str) -> None:
        self.command, self.log_path, self.cwd = command, log_path, cwd

    def __call__(self) -> int:
        with open(self.log_path, "ab") as log:
            log.write(f"# {' '.join(self.command)}\n".encode())
            log.flush()
            subprocess.run(self.command, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, check=True)
        return 0


class SubmititLauncher(Launcher):
    """Each run is a SLURM job submitted with submitit (`pip install submitit`; not a grpokit dependency).

    Args:
        folder: submitit's folder for job scripts and logs.
        name: the job name.
        cluster: None (SLURM when available), "slurm", "local" or "debug" (submitit's executors).
        parameters: submitit's `update_parameters` arguments (timeout_min, slurm_partition, gpus_per_node, ...).
    """

    def __init__(self, folder: Path, name: str, cluster: str | None = None, **parameters: Any) -> None:
        try:
            import submitit
        except ImportError:
            raise SweepError(
                "launcher: submitit needs the submitit package (pip install "
                "submitit), which grpokit does not install; or use launcher: local"
            ) from None
        self.executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
        self.executor.update_parameters(name=name, **parameters)

    def start(self, command: list[str], log_path: Path) -> Any:
        return self.executor.submit(RunCommand(command, str(log_path), os.getcwd()))

    def poll(self, job: Any) -> int | None:
        if not job.done():
            return None
        return 0 if job.exception() is None else 1

    def job_id(self, job: Any) -> str | None:
        return str(job.job_id)


def make_launcher(settings: dict[str, Any], sweep_dir: Path, sweep_name: str) -> Launcher:
    """The launcher a sweep file's `launcher:` names (`local`, or `submitit` with its parameters)."""
    settings = dict(settings)
    name = settings.pop("name")
    if name == "local":
        if settings:
            raise SweepError(f"launcher: local takes no settings, got {sorted(settings)}")
        return LocalLauncher()
    if name == "submitit":
        cluster = settings.pop("cluster", None)
        return SubmititLauncher(sweep_dir / "submitit", f"grpokit-{sweep_name}", cluster, **settings)
    raise SweepError(
        f"launcher: {name!r} is not a launcher; use local or submitit (a "
        "wandb sweep agent can run `grpokit fit` itself, see docs/sweeps.md)"
    )
