"""A judge's server that the run starts: `judge.serve: true` (with the judge's `base_url`).

The rollout loop (`grpokit fit`'s, or `grpokit orchestrate`'s) starts `grpokit judge` as a child process
for each such judge when it starts, on the judge's base_url, waits until it lists the judge's model
(`startup_timeout` seconds), asks it over HTTP as it would a server started by hand, and stops it when
the loop ends. The child is grpokit.common.server_process's: its own session, SIGTERM'd by Linux if the
run dies first, so no judge server outlives its run; its output goes to `{run_dir}/judge_<name>.log`.
The child reads a recipe of its own, `{run_dir}/judge_<name>.json`: the environment's id and this one
judge (with `serve` off), so it serves exactly the settings the run judges with.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import socket
import sys
from pathlib import Path

from grpokit.common.io import atomic_write_text
from grpokit.common.server_process import ServerProcess

log = logging.getLogger(__name__)


class JudgeServerProcess(ServerProcess):
    what = "grpokit judge"
    timeout_key = "judge.startup_timeout"
    missing_hint = "the Python that runs grpokit must be able to start it again"


def start_judge_servers(envs: list, run_dir: str | Path) -> list[JudgeServerProcess]:
    """Start a `grpokit judge` for each judge of `envs` with `serve` on; returns them, each serving."""
    started: list[JudgeServerProcess] = []
    try:
        for env in envs:
            for judge in getattr(env, "judges", ()):
                served = {s.url for s in started}
                if judge.settings.serve and judge.settings.base_url.rstrip("/") not in served:  # eval's too
                    started.append(start_judge_server(env.spec.id, judge.settings, Path(run_dir)))
    except BaseException:
        stop_judge_servers(started)
        raise
    return started


def start_judge_server(env_id: str, settings, run_dir: Path) -> JudgeServerProcess:
    from grpokit.judges.server import address_of  # the server's module imports uvicorn: only when one is started

    host, port = address_of(settings.base_url)
    check_free(host, port, settings.base_url)
    judge = {**dataclasses.asdict(settings), "serve": False}
    recipe = run_dir / f"judge_{settings.name}.json"  # JSON is YAML: the child's --config
    atomic_write_text(recipe, json.dumps({"data": {"env": [{"id": env_id, "judge": judge}]}}, indent=2))
    command = [sys.executable, "-m", "grpokit", "judge", "--config", str(recipe)]
    url, log_path = settings.base_url.rstrip("/"), run_dir / f"judge_{settings.name}.log"
    server = JudgeServerProcess(command, None, url, settings.model, log_path)  # env None: the run's own
    server.start()
    seconds = server.wait_ready(settings.startup_timeout)
    log.info("judge %r served at %s by the run (started in %.1fs)", settings.name, settings.base_url, seconds)
    return server


def stop_judge_servers(servers: list[JudgeServerProcess], timeout: float = 10.0) -> None:
    for server in servers:
        log.info("judge server at %s stopped (exit code %s)", server.url, server.stop(timeout))


def check_free(host: str, port: int, base_url: str) -> None:
    """Refuse a judge.base_url something listens at already (its answers would be taken for the judge's)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            why = "is taken by another server (a judge left running?)" if e.errno == errno.EADDRINUSE else e.strerror
            raise ValueError(
                f"judge.serve: judge.base_url {base_url} {why}: set another port, or set judge.serve false to "
                "use the server that is there"
            ) from None
