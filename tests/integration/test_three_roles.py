"""`grpokit infer | orchestrate | train` as three OS processes on one recipe (filesystem and ZMQ transports)."""

import csv
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")
STEPS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("transport", ["filesystem", "zmq"])
def test_three_processes_train_together(tmp_path, tiny_model, transport):
    http_port = free_port()
    common = [
        "--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "mp", "--model.model", tiny_model,
        "--model.lora.rank", "4", "--data.batch_size", "8", "--data.rollouts_per_example", "4",
        "--data.sampling.max_tokens", "8", "--data.seq_len", "128", "--data.filters", "[]", "--data.eval", "null",
        "--data.timeout", "120", "--trainer.max_steps", str(STEPS), "--ckpt.interval", "0",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--server.port", str(http_port),
        "--inference", "RemoteEngine", "--inference.init_args.base_url", f"http://127.0.0.1:{http_port}/v1",
    ]
    if transport == "zmq":
        common += ["--data.transport", "ZMQTransport", "--data.transport.init_args.port", str(free_port())]
    log = {role: open(tmp_path / f"{role}.log", "w") for role in ("infer", "orchestrate", "train")}
    # start order: trainer first, then orchestrator, then the server: each waits for the others
    procs = {role: subprocess.Popen([sys.executable, "-m", "grpokit.cli", role, *common], stdout=log[role], stderr=subprocess.STDOUT) for role in ("train", "orchestrate", "infer")}
    try:
        assert procs["train"].wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
        assert procs["orchestrate"].wait(timeout=60) == 0, (tmp_path / "orchestrate.log").read_text()[-3000:]
        procs["infer"].send_signal(signal.SIGTERM)
        assert procs["infer"].wait(timeout=30) == 0, (tmp_path / "infer.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    run = tmp_path / "mp"
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")]
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    # every rollout names the weights that sampled it, as reported by the server, within max_async_level 1
    assert {s["step"] for s in samples} == set(range(STEPS))
    assert all(max(0, s["step"] - 1) <= s["policy_step"] <= s["step"] for s in samples)
    assert max(s["policy_step"] for s in samples) >= 1  # the server loaded the trainer's updates
    stable = sorted(int(p.parent.name[5:]) for p in (run / "broadcasts").glob("step_*/STABLE"))
    assert stable[-1] == STEPS
