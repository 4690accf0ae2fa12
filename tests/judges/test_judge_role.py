"""`grpokit judge`, the fourth role: the judge recipe (recipes/judge_exclaim.yaml) run as four OS
processes, with the judge's classifier on its own server (recipes/judge_exclaim_server.yaml) and the
policy on `grpokit infer`, on tiny models. The reward is the served judge's score alone, every logged
rollout carries it, and the judge server stops on SIGTERM with exit 0. And `grpokit judge` refuses a
recipe with no judge to serve in one line naming the key."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from grpokit.testing import free_port
from tests.judges.helpers import judge_fit_argv
from tests.support import read_metrics

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEPS = 3


def role_argv(role: str, tmp_path: Path, tiny_model: str, env: dict, http_port: int) -> list[str]:
    config = ["judge_exclaim.yaml", "multi_process.yaml", "judge_exclaim_server.yaml"]
    argv = [sys.executable, "-m", "grpokit", role, *(x for c in config for x in ("--config", str(RECIPES / c)))]
    argv += [
        "--output_dir", str(tmp_path), "--model.model", tiny_model, "--model.lora.rank", "4",
        "--data.batch_size", "8", "--data.rollouts_per_example", "4", "--data.sampling.max_tokens", "8",
        "--data.seq_len", "128", "--data.env", json.dumps([env]), "--data.timeout", "120",
        "--trainer.max_steps", str(STEPS), "--trainer.enable_progress_bar", "false", "--ckpt.interval", "0",
        "--server.port", str(http_port), "--inference.init_args.base_url", f"http://127.0.0.1:{http_port}/v1",
    ]  # fmt: skip
    return argv if role == "judge" else [*argv, "--run_name", "jx"]


def wait_until_up(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not come up: {log.read_text()[-3000:]}")


def test_the_judge_recipe_runs_as_four_processes(tmp_path, tiny_model, tiny_classifier):
    env = yaml.safe_load((RECIPES / "judge_exclaim_server.yaml").read_text())["data"]["env"][0]
    judge_port, http_port = free_port(), free_port()
    judge = {**env["judge"], "model": tiny_classifier, "base_url": f"http://127.0.0.1:{judge_port}/v1"}
    env = {**env, "args": {"num_tasks": 16}, "judge": judge}
    logs = {role: tmp_path / f"{role}.log" for role in ("judge", "train", "orchestrate", "infer")}
    procs = {
        role: subprocess.Popen(
            role_argv(role, tmp_path, tiny_model, env, http_port), stdout=open(log, "w"), stderr=subprocess.STDOUT
        )
        for role, log in logs.items()
    }
    try:
        wait_until_up(f"http://127.0.0.1:{judge_port}/health", procs["judge"], logs["judge"])
        for role in ("train", "orchestrate"):
            assert procs[role].wait(timeout=600) == 0, logs[role].read_text()[-3000:]
        procs["judge"].send_signal(signal.SIGTERM)
        assert procs["judge"].wait(timeout=30) == 0, logs["judge"].read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    run = tmp_path / "jx"
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    for r in rows:  # the reward is the served judge's score alone, none failed
        assert float(r["reward"]) == pytest.approx(float(r["env/reward/rm"]))
        assert float(r["env/judge/rm/down"]) == 0 and float(r["env/judge/rm/timeouts"]) == 0
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert samples and all(float(s["notes"]["judge/rm/reply"]) == pytest.approx(s["reward"]) for s in samples)
    assert "serving judge 'rm'" in logs["judge"].read_text()


def test_grpokit_judge_without_a_served_judge_names_the_key(tmp_path):
    argv = [sys.executable, "-m", "grpokit", "judge", "--config", str(RECIPES / "judge_exclaim.yaml")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "data.env[i].judge.base_url" in done.stderr, done.stderr


def test_a_fit_starts_and_stops_the_judge_server_it_serves(tmp_path, tiny_model, tiny_classifier):
    """judge.serve: `grpokit fit` starts `grpokit judge` at the judge's base_url for the run, judges over
    HTTP with it, and stops it at the end (the port is free again); its log is in the run folder."""
    import socket

    from grpokit.main import main

    port = free_port()
    judge = {"kind": "classifier", "model": tiny_classifier, "name": "rm", "serve": True}
    judge["base_url"] = f"http://127.0.0.1:{port}/v1"
    env = {"id": "exclaim", "args": {"num_tasks": 16}, "judge": judge}
    argv = judge_fit_argv(tmp_path, tiny_model, "s", env)
    assert main(argv) == 0
    run = tmp_path / "s"
    for r in read_metrics(run):
        assert float(r["reward"]) == pytest.approx(float(r["env/reward/rm"])) and float(r["env/judge/rm/down"]) == 0
    assert "serving judge 'rm'" in (run / "judge_rm.log").read_text()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # the judge server is gone
