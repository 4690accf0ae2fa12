"""`grpokit infer | orchestrate | train` as three OS processes on one recipe: filesystem and ZMQ
transports over the filesystem broadcast, and the broadcasts only the server may poll (NCCLBroadcast
over gloo, IPCBroadcast's shared memory), where the orchestrator learns the trainer's progress from the
server's GET /v1/weights."""

import contextlib
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from grpokit.testing import free_port, tiny_fit_argv
from tests.support import MULTI_TURN_GAME_FLAGS, read_metrics

STEPS = 4


@contextlib.contextmanager
def three_roles(
    tmp_path: Path, tiny_model: str, http_port: int, steps: int, extra: list[str], train_extra: list[str] = ()
):
    """Start train, orchestrate and infer (in that order: each waits for the others) and yield them by role;
    whatever still runs on leaving is killed."""
    overrides = [
        "--data.eval",
        "null",
        "--data.timeout",
        "120",
        "--trainer.max_steps",
        str(steps),
        "--ckpt.interval",
        "0",
        "--server.port",
        str(http_port),
        "--inference",
        "RemoteEngine",
        "--inference.init_args.base_url",
        f"http://127.0.0.1:{http_port}/v1",
        *extra,
    ]
    log = {role: open(tmp_path / f"{role}.log", "w") for role in ("infer", "orchestrate", "train")}
    argv = {
        role: [sys.executable, "-m", "grpokit", *tiny_fit_argv(tmp_path, tiny_model, "mp", *overrides, command=role)]
        for role in log
    }
    argv["train"] += train_extra
    procs = {
        role: subprocess.Popen(argv[role], stdout=log[role], stderr=subprocess.STDOUT)
        for role in ("train", "orchestrate", "infer")
    }
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()


def check_run(run: Path, steps: int, max_lag: int = 1) -> None:
    """Steps 0..steps-1 trained once each; every rollout names the weights that sampled it (its oldest
    token's), as reported by the server, within max_async_level 1 (`max_lag` 2 when streamed: a group
    that finishes after its step's batch was formed trains in the next); the server followed the
    trainer's updates."""
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(steps))
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert {s["step"] for s in samples} == set(range(steps))
    lags = sorted({s["step"] - s["policy_step"] for s in samples})
    assert all(0 <= lag <= max_lag for lag in lags), lags
    assert max(s["policy_step"] for s in samples) >= 1


def stop(procs: dict, tmp_path: Path) -> None:
    procs["infer"].send_signal(signal.SIGTERM)
    assert procs["infer"].wait(timeout=30) == 0, (tmp_path / "infer.log").read_text()[-3000:]


def wait_ok(procs: dict, tmp_path: Path) -> None:
    assert procs["train"].wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
    assert procs["orchestrate"].wait(timeout=60) == 0, (tmp_path / "orchestrate.log").read_text()[-3000:]


@pytest.mark.parametrize("transport", ["filesystem", "zmq"])
def test_three_processes_train_together(tmp_path, tiny_model, transport):
    """Filesystem transport on the single-turn recipe, rollouts streamed; ZMQ on a multi-turn game, whose
    conversations go through `grpokit infer` turn by turn and whose environment tokens the trainer never
    trains on (its logprobs match the server's on every trained token)."""
    http_port = free_port()
    extra = (
        ["--data.transport", "ZMQTransport", "--data.transport.init_args.port", str(free_port())]
        + list(MULTI_TURN_GAME_FLAGS)
        + ["--data.num_logged_samples", "64", "--data.max_async_level", "0"]  # like with like: step n's weights
        if transport == "zmq"
        else ["--data.streaming", "{max_inflight: 4}"]  # RemoteEngine streams a request per group
    )
    with three_roles(tmp_path, tiny_model, http_port, STEPS, extra) as procs:
        wait_ok(procs, tmp_path)
        orchestrator = procs["orchestrate"].pid
        stop(procs, tmp_path)
    run = tmp_path / "mp"
    check_run(run, STEPS, max_lag=1 if transport == "zmq" else 2)
    # each process says what it does: where the server listens, each batch the orchestrator sent
    assert f"serving {tiny_model} on 127.0.0.1:{http_port}" in (tmp_path / "infer.log").read_text()
    said = (tmp_path / "orchestrate.log").read_text()
    assert "step 0: batch sent (reward" in said and f"every batch up to step {STEPS - 1} sent" in said, said[-2000:]
    # an orchestrator that ended withdrew its broadcast ack (one left behind kept old steps for an hour)
    assert not [a.name for a in (run / "broadcasts" / "acks").glob(f"*-{orchestrator}-*.json")]
    if transport == "zmq":
        samples = [json.loads(line) for line in open(run / "samples.jsonl")]
        turns = [sum(m["role"] == "assistant" for m in s["messages"]) for s in samples]
        assert max(turns) >= 2, turns
        assert {s["env"] for s in samples} == {"guess-number", "user-sim+reverse-text"}  # a game, an Env's episodes
        rows = read_metrics(run)
        assert all(float(r["env/turns"]) >= 1 for r in rows)
        errors = [float(r["token_mult_prob_error"]) for r in rows]
        assert all(abs(e - 1) < 1e-4 for e in errors), errors
    stable = sorted(int(p.parent.name[5:]) for p in (run / "broadcasts").glob("step_*/STABLE"))
    assert stable[-1] == STEPS


BROADCASTS = {
    "nccl": lambda: [
        "--broadcast",
        "NCCLBroadcast",
        "--broadcast.init_args.backend",
        "gloo",
        "--broadcast.init_args.port",
        str(free_port()),
        "--broadcast.init_args.timeout",
        "120",
    ],
    "ipc": lambda: ["--broadcast", "IPCBroadcast"],
}


@pytest.mark.parametrize("broadcast", ["nccl", "ipc"])
def test_three_processes_with_a_broadcast_only_the_server_polls(tmp_path, tiny_model, broadcast):
    """The orchestrator never polls the broadcast (NCCL: it would join the trainer's group as a second
    engine); the server's weights after the run are the trainer's last published ones, bit for bit."""
    steps, http_port = 3, free_port()
    checksums = ["--trainer.callbacks+=grpokit.trainer.callbacks.RankChecksums"]  # the trainer's sha256 per step
    with three_roles(tmp_path, tiny_model, http_port, steps, BROADCASTS[broadcast](), checksums) as procs:
        wait_ok(procs, tmp_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/weights?sha256=true", timeout=60) as r:
            served = json.loads(r.read())
        stop(procs, tmp_path)
    run = tmp_path / "mp"
    check_run(run, steps)
    trained = {row["step"]: row["sha256"] for row in map(json.loads, open(run / "rank_checksums" / "rank_0.jsonl"))}
    # NCCL: the receiver holds the last step it got; IPC: the trainer unlinks its segments when it exits,
    # so the server keeps the last step it loaded before that (at least step 1: the batch of step 2 needed it)
    assert served["weight_step"] == steps if broadcast == "nccl" else 1 <= served["weight_step"] <= steps
    assert served["sha256"] == trained[served["weight_step"]]
    assert not (run / "broadcasts").exists()  # nothing went through the filesystem broadcast
