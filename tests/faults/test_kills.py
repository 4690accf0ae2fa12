"""SIGKILL at random points, then restart: the run reaches max_steps with every step trained exactly once.

Co-locate (`grpokit fit`): the one process is killed at a random moment after a checkpoint exists and
resumed with `--ckpt.resume_step -1` (GRPOKIT_FAULT_COLOCATE_KILLS times in a row, default 1: a resumed
process is killed again). Multi-process (`grpokit infer | orchestrate
| train`, filesystem transport): the engine server, the orchestrator and the trainer are each killed
once, in a random order and at random moments, and restarted with the same command (the trainer with
`--ckpt.resume_step -1`) while the other two keep running.

After the run, `audit` checks: metrics.csv holds steps 0..max_steps-1 once each; every batch file left
decodes whole and is the batch its step trained on (same reward); no rollout was sampled with weights
newer than its step or staler than the bounds; the last checkpoint and broadcast exist; and prompts:
the last line of each step in prompts.jsonl is the batch it trained (same reward), and those lines
account for every prompt of the data order from 0 up exactly once, trained or dropped by a named rule
(grpokit.orchestrator.accounting.audit; a streamed run's leftovers at its end are named too).

Seeds: GRPOKIT_FAULT_SEEDS (comma-separated, default "0") pick the kill order and moments; CI runs seed
0 with one co-locate kill (~2 min for this file), docs/reliability.md reports a longer sweep.
GRPOKIT_FAULT_SIGNAL=TERM sends SIGTERM instead of SIGKILL (a scheduler's stop): each process must then
also exit within STOP_WITHIN seconds, and a stopped `fit`, `train` or `orchestrate` non-zero (143, or
-15 when it lands before the process installed its handler; `grpokit infer` exits 0).
GRPOKIT_FAULT_STREAMING=1 runs both tests with `data.streaming` too, drawing ahead with groups that
finish out of order (the three processes: the server's requests finish on the weights they were sent with).
GRPOKIT_FAULT_FLAGS (a JSON list) adds recipe flags to both, e.g. the buffer's filters or
steps_per_generation, whose dropped and split generations the audit must account for too.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpokit.main import main
from grpokit.orchestrator import accounting
from grpokit.orchestrator.loop import check_not_from_the_future
from grpokit.testing import free_port, tiny_fit_argv
from grpokit.transport.codec import decode_batch
from tests.support import make_rollout, read_metrics

SEEDS = [int(s) for s in os.environ.get("GRPOKIT_FAULT_SEEDS", "0").split(",")]
COLOCATE_KILLS = int(os.environ.get("GRPOKIT_FAULT_COLOCATE_KILLS", "1"))
SIGNAL = signal.Signals["SIG" + os.environ.get("GRPOKIT_FAULT_SIGNAL", "KILL").upper().removeprefix("SIG")]
MODES = ["batch"] + (["streaming"] if os.environ.get("GRPOKIT_FAULT_STREAMING") == "1" else [])
FLAGS = json.loads(os.environ.get("GRPOKIT_FAULT_FLAGS", "[]"))  # more recipe flags for both tests (a sweep)
# a generation split over steps_per_generation steps feeds its later steps with the same older weights
SPLIT = int(dict(zip(FLAGS[::2], FLAGS[1::2])).get("--data.steps_per_generation", 1))
# three steps' prompts in flight, completions of different lengths (a stop string): groups finish out of
# order and a step is handed out while earlier prompts are still in flight, the case a resume got wrong
STREAMING = ("--data.streaming", "{max_inflight: 6}", "--data.sampling.stop", "[e]")
STOP_WITHIN = 30.0  # seconds from SIGTERM to the exit: a generation, the step in progress, a checkpoint, teardown
STEPS = 30
# kills land at steps 3..8 (co-locate) or 2..8 (multi-process); the tiny model trains a step in ~0.1-0.3 s,
# so the long tail keeps every process alive for the seconds between reaching a target and the kill
KILL_BEFORE = 9
# keep_last 1 deletes a batch as soon as the next is read, unless a checkpoint still needs it: a
# resumed trainer finds its batches only if that retention works
TRANSPORT = '{"class_path": "FilesystemTransport", "init_args": {"keep_last": 1}}'
WAIT = 240  # seconds any one stage may take before the test fails (never hangs)


def trained_steps(run: Path) -> int:
    """Steps the trainer has logged (0 while metrics.csv is missing or being rewritten by a resume)."""
    try:
        return len({r["step"] for r in read_metrics(run)})
    except (OSError, csv.Error, KeyError):
        return 0


def wait_for_progress(run: Path, target: int, since: float, procs: dict) -> None:
    """Block until the trainer has logged `target` steps, written a row after `since` (a restarted trainer
    is past its start) and a checkpoint exists; fail if a process dies or nothing moves for WAIT s."""
    deadline = time.monotonic() + WAIT
    while not (
        trained_steps(run) >= target
        and (run / "metrics.csv").stat().st_mtime > since
        and any((run / "checkpoints").glob("step_*.ckpt"))
    ):
        for role, p in procs.items():
            assert p.poll() is None or p.returncode == 0, f"{role} exited with {p.returncode} before step {target}"
        assert time.monotonic() < deadline, f"no step {target} after {WAIT} s"
        time.sleep(0.05)


def kill(proc: subprocess.Popen, role: str = "fit") -> bool:
    """SIGNAL to `proc` (SIGKILL by default); True if it was still running (the kill hit a live process).
    After SIGTERM the process must exit within STOP_WITHIN s, non-zero unless it is the server."""
    alive, sent = proc.poll() is None, time.monotonic()
    proc.send_signal(SIGNAL)
    if SIGNAL != signal.SIGTERM:
        proc.wait()
        return alive
    code = proc.wait(timeout=WAIT)
    assert time.monotonic() - sent < STOP_WITHIN, f"{role} took {time.monotonic() - sent:.1f} s to stop"
    if alive:
        assert code in ((0, -signal.SIGTERM) if role == "infer" else (143, -signal.SIGTERM)), (role, code)
    return alive


def audit(run: Path, steps: int, oldest_gap: int) -> dict[str, int]:
    """No step lost or duplicated, no partial batch, no rollout from weights newer than its step, no
    prompt skipped or trained twice. Returns the prompt counts (trained, and dropped by each rule)."""
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(steps)), "each step must be trained exactly once"
    for r in rows:
        path = run / "rollouts" / f"step_{r['step']}.safetensors"
        if path.exists():  # decodes whole, and is the batch this step trained on
            batch = decode_batch(path.read_bytes())
            assert batch.step == int(r["step"]) and batch.metrics["reward"] == float(r["reward"]), path
    last: dict[int, int] = {}
    for line in open(run / "samples.jsonl"):  # the last record of a step is the batch that was sent
        sample = json.loads(line)
        last[sample["step"]] = sample["policy_step"]
    assert sorted(last) == list(range(steps))
    assert all(step - oldest_gap <= policy_step <= step for step, policy_step in last.items()), last
    assert (run / "checkpoints" / f"step_{steps}.ckpt").exists()
    assert (run / "broadcasts" / f"step_{steps}" / "STABLE").exists()
    assert not list((run / "checkpoints").glob(".*.tmp")), "a killed checkpoint write left its temp file"
    records, _ = accounting.read_records(run)
    assert [records[int(r["step"])]["reward"] for r in rows] == [float(r["reward"]) for r in rows], "not the batch"
    counts = accounting.audit(run, steps)  # every prompt from 0 up: trained once, or dropped by a named rule
    assert counts["trained"] == sum(int(float(r["groups_trained"])) for r in rows), counts
    print(f"prompt accounting of {run.name}: {counts}")
    return counts


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_colocate_survives_kills(tmp_path, tiny_model, seed, mode):
    rng = random.Random(seed)
    run = tmp_path / "colo"
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "colo",
        "--trainer.max_steps",
        str(STEPS),
        "--ckpt.interval",
        "3",
        "--data.transport",
        TRANSPORT,
        "--data.eval",
        "null",
        "--data.sampling.max_tokens",
        "6",
        *(STREAMING if mode == "streaming" else ()),
        *FLAGS,
    )
    resume = ["--ckpt.resume_step", "-1"]
    survived = 0
    for attempt, target in enumerate(sorted(rng.sample(range(3, KILL_BEFORE), COLOCATE_KILLS))):
        log, started = open(tmp_path / f"fit_{attempt}.log", "w"), time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpokit", *argv, *(resume if attempt else [])],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_progress(run, target, started, {"fit": proc})
            time.sleep(
                rng.uniform(0.0, 1.0)
            )  # anywhere in a step: sampling, training, a batch, broadcast or checkpoint write
            survived += kill(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert main(argv + resume) == 0
    # streamed groups decode across updates, and one that finishes after its step's batch was formed trains
    # in a later step: their bound is max_off_policy_steps (8), as in the multi-process test
    audit(run, STEPS, oldest_gap=(8 if mode == "streaming" else 1) + SPLIT - 1)
    assert survived == COLOCATE_KILLS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_multi_process_survives_a_kill_of_each_role(tmp_path, tiny_model, seed, mode):
    rng = random.Random(seed)
    http_port, run = free_port(), tmp_path / "mp"
    common = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "mp",
        "--trainer.max_steps",
        str(STEPS),
        "--ckpt.interval",
        "2",
        "--data.transport",
        TRANSPORT,
        "--data.eval",
        "null",
        "--data.sampling.max_tokens",
        "6",
        "--data.timeout",
        str(WAIT),
        "--server.port",
        str(http_port),
        "--inference",
        "RemoteEngine",
        "--inference.init_args.base_url",
        f"http://127.0.0.1:{http_port}/v1",
        "--inference.init_args.max_retries",
        "8",  # ~90 s of backoff: longer than a server restart
        *(STREAMING if mode == "streaming" else ()),
        *FLAGS,
        command="",
    )[1:]
    logs = {role: open(tmp_path / f"{role}.log", "a") for role in ("infer", "orchestrate", "train")}

    def launch(role: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "grpokit", role, *common, *extra], stdout=logs[role], stderr=subprocess.STDOUT
        )

    procs = {role: launch(role) for role in ("train", "orchestrate", "infer")}
    survived, since = {}, 0.0
    try:
        victims, targets = rng.sample(list(procs), 3), sorted(rng.sample(range(2, KILL_BEFORE), 3))
        for victim, target in zip(victims, targets):
            wait_for_progress(run, target, since, procs)
            time.sleep(rng.uniform(0.0, 1.5))
            survived[victim], since = kill(procs[victim], victim), time.time()
            procs[victim] = launch(victim, *(["--ckpt.resume_step", "-1"] if victim == "train" else []))
        assert procs["train"].wait(timeout=WAIT) == 0, (tmp_path / "train.log").read_text()[-3000:]
        assert procs["orchestrate"].wait(timeout=WAIT) == 0, (tmp_path / "orchestrate.log").read_text()[-3000:]
        procs["infer"].send_signal(signal.SIGTERM)
        assert procs["infer"].wait(timeout=60) == 0, (tmp_path / "infer.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    # a server restarted after a trainer restart may serve older weights than the orchestrator waited
    # for; such rollouts are kept while within max_off_policy_steps (8), the bound checked here
    audit(run, STEPS, oldest_gap=8 + SPLIT - 1)
    assert survived == {"infer": True, "orchestrate": True, "train": True}, survived


def test_a_batch_sampled_with_weights_newer_than_its_step_is_refused():
    """ZMQ holds no batches on disk: after a trainer restart the orchestrator samples again, and an engine
    still holding the killed trainer's newer weights would hand it rollouts from the future."""
    rollout = make_rollout([2], policy_step=7)
    check_not_from_the_future(7, [rollout])
    with pytest.raises(
        RuntimeError,
        match=r"step 5 was sampled with weights of step 7: .*Restart the engine \(`grpokit infer`\) after the trainer",
    ):
        check_not_from_the_future(5, [rollout])
