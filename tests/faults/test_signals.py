"""SIGTERM (a scheduler's stop, a preemption, `kill`) and Ctrl-C to the training commands, in subprocesses
(the exit code and the signal matter): each stops within a bound, exits 128 + the signal (143 for
SIGTERM, 130 for SIGINT) so no scheduler or sweep takes the run for finished, and a stopped `grpokit fit`
resumes with --ckpt.resume_step -1 to the metrics of a straight run, each step trained once.

Lightning's own SIGTERM handling raised SystemExit() after the step: exit 0, no checkpoint
(grpokit.trainer.callbacks.StopOnInterrupt says what replaced it); `grpokit train` waiting for a batch
that never came ignored SIGTERM and the first Ctrl-C until data.timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from grpokit.main import main
from grpokit.sweep.launchers import LocalLauncher
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import load_sweep
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.checkpoint import checkpoint_steps
from tests.sft.test_sft_cli import sft_argv
from tests.support import in_background, read_metrics
from tests.support.processes import start_grpokit, wait_for_file

STEPS = 6
WAIT = 120  # seconds a start may take before the test fails (never hangs)
STOP_WITHIN = 10.0  # seconds from the signal to the exit of a process waiting (for a batch, for weights)
# ... of `grpokit fit`, which first ends its step and the generation in progress, writes a checkpoint and
# tears down: ~3.5 s alone on 2 CPU cores, 18 s seen with a second fit and other tests on them
FIT_STOP_WITHIN = 45.0
# synchronous sampling and no eval: a step's metrics depend only on the weights and the step, so a
# stopped and resumed run can match a straight one (as tests/trainer/test_interrupt.py)
SYNC = ("--seed_everything", "0", "--data.max_async_level", "0", "--data.eval", "null")


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_left():
    """Every process a test started is killed when it ends, passed or failed."""
    yield
    while STARTED:
        proc = STARTED.pop()
        proc.kill()
        proc.wait()


def start(tmp_path: Path, argv: list[str], name: str) -> tuple[subprocess.Popen, Path]:
    proc, log = start_grpokit(tmp_path, argv, name)
    STARTED.append(proc)
    return proc, log


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    wait_for_file(path, proc, WAIT)


def stop(proc: subprocess.Popen, signum: int) -> tuple[int, float]:
    """Send `signum`; the exit code and the seconds it took (the process is killed if it outlives WAIT)."""
    sent = time.monotonic()
    proc.send_signal(signum)
    return proc.wait(timeout=WAIT), time.monotonic() - sent


def clean(log: Path) -> str:
    text = log.read_text()
    assert "terminate called" not in text and "Traceback" not in text, text[-3000:]
    return text


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_time")} for r in rows]


def test_sigterm_to_fit_exits_143_after_the_step_and_resume_matches_a_straight_run(
    tmp_path, tiny_model, straight_sync_fit
):
    def argv(name, *extra):
        return tiny_fit_argv(tmp_path, tiny_model, name, "--trainer.max_steps", str(STEPS), "--ckpt.interval", "5",
                             *SYNC, *extra)  # fmt: skip

    run = tmp_path / "stopped"
    # alongside (one start's wait, not two); the same straight run as tests/trainer/test_interrupt.py's
    straight, straight_log, straight_run = straight_sync_fit(argv("straight"))
    proc, log = start(tmp_path, argv("stopped"), "stopped")
    wait_for(run / "rollouts" / "step_3.safetensors", proc)  # sampled after step 2: the trainer is on step 3
    code, seconds = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < FIT_STOP_WITHIN, (code, seconds, log.read_text()[-3000:])
    text = clean(log)
    assert "grpokit: SIGTERM: stopping after the current step" in text and "stopped by SIGTERM after" in text
    trained = [int(r["step"]) for r in read_metrics(run)]
    assert trained == list(range(len(trained))) and 3 <= len(trained) < STEPS
    assert checkpoint_steps(run / "checkpoints") == [len(trained)]  # the step reached, not the interval's

    resumed, resumed_log = start(tmp_path, argv("stopped", "--ckpt.resume_step", "-1"), "resumed")
    assert resumed.wait(timeout=WAIT) == 0, resumed_log.read_text()[-3000:]
    assert straight.wait(timeout=WAIT) == 0, straight_log.read_text()[-3000:]
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(STEPS))  # no step lost or trained twice
    assert without_timings(rows) == without_timings(read_metrics(straight_run))
    final = [torch.load(r / "checkpoints" / f"step_{STEPS}.ckpt", weights_only=True)["state_dict"]
             for r in (run, straight_run)]  # fmt: skip
    assert final[0].keys() == final[1].keys()
    for name, tensor in final[0].items():
        torch.testing.assert_close(tensor, final[1][name], msg=name)


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_train_waiting_for_a_batch_that_never_comes_stops_within_seconds(tmp_path, tiny_model, signum, code, said):
    """No `grpokit orchestrate` runs: the trainer waits for the batch of step 0 (data.timeout is an hour)."""
    run = tmp_path / "waiting"
    argv = tiny_fit_argv(tmp_path, tiny_model, "waiting", "--ckpt.interval", "1", *SYNC, command="train")
    proc, log = start(tmp_path, argv, "waiting")
    wait_for(run / "broadcasts" / "step_0" / "STABLE", proc)  # training started: step 0's weights are out
    time.sleep(1.5)  # inside the wait for the batch
    exit_code, seconds = stop(proc, signum)
    assert exit_code == code and seconds < STOP_WITHIN, (exit_code, seconds, log.read_text()[-3000:])
    assert f"grpokit: {said}: stopping after the current step" in clean(log)
    assert not (run / "metrics.csv").exists() or not read_metrics(run)
    assert checkpoint_steps(run / "checkpoints") == []  # nothing trained: no checkpoint of step 0


def test_sigterm_to_train_after_its_steps_keeps_them_in_a_checkpoint(tmp_path, tiny_model):
    """`grpokit orchestrate` sends the batches of steps 0 and 1 only; the trainer trains them, then waits
    for step 2's. SIGTERM: the wait ends, the checkpoint holds the two steps (the interval's would be at 10)."""
    run, common = tmp_path / "two", ("--ckpt.interval", "10", *SYNC)
    train, log = start(tmp_path, tiny_fit_argv(tmp_path, tiny_model, "two", *common, command="train"), "train")
    orchestrate, orchestrate_log = start(
        tmp_path,
        tiny_fit_argv(tmp_path, tiny_model, "two", "--trainer.max_steps", "2", *common, command="orchestrate"),
        "orchestrate",
    )
    assert orchestrate.wait(timeout=WAIT) == 0, orchestrate_log.read_text()[-3000:]
    wait_for(run / "broadcasts" / "step_2" / "STABLE", train)  # step 1 trained and published: waiting for 2
    time.sleep(1.5)
    code, seconds = stop(train, signal.SIGTERM)
    assert code == 143 and seconds < STOP_WITHIN, (code, seconds, log.read_text()[-3000:])
    assert "stopped by SIGTERM after 2 steps (of 50)" in clean(log)  # the recipe's max_steps
    assert [int(r["step"]) for r in read_metrics(run)] == [0, 1]
    assert checkpoint_steps(run / "checkpoints") == [2]


def test_sigterm_to_sft_exits_143_with_a_checkpoint_and_the_resume_trains_each_step_once(tmp_path, tiny_model):
    run, steps = tmp_path / "sft", 12
    argv = sft_argv(tmp_path, tiny_model, "sft", "--trainer.max_steps", str(steps), "--ckpt.interval", "2")
    proc, log = start(tmp_path, argv, "sft")
    wait_for(run / "checkpoints" / "step_2.ckpt", proc)
    code, seconds = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < FIT_STOP_WITHIN, (code, seconds, log.read_text()[-3000:])
    assert "grpokit: SIGTERM: stopping after the current step" in clean(log)
    stopped = checkpoint_steps(run / "checkpoints")[-1]
    assert [int(r["step"]) for r in read_metrics(run)] == list(range(stopped)) and stopped < steps
    assert not (run / "model").exists()  # written once max_steps is reached

    assert main([*argv, "--ckpt.resume_step", "-1"]) == 0
    assert [int(r["step"]) for r in read_metrics(run)] == list(range(steps)) and (run / "model").is_dir()


def test_sigterm_to_orchestrate_waiting_for_weights_exits_143(tmp_path, tiny_model):
    """No trainer runs: the orchestrator waits for the weights of step 0 to sample its batch."""
    proc, log = start(tmp_path, tiny_fit_argv(tmp_path, tiny_model, "orch", *SYNC, command="orchestrate"), "orch")
    deadline = time.monotonic() + WAIT
    while "orchestrating run" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    exit_code, seconds = stop(proc, signal.SIGTERM)
    assert exit_code == 143 and seconds < STOP_WITHIN, (exit_code, seconds, log.read_text()[-3000:])
    assert "orchestrator stopped; the same command continues" in clean(log)


def test_a_sweep_run_stopped_by_sigterm_is_not_done(tmp_path, tiny_model):
    """The sweep (in this process) launches a real `grpokit fit`; SIGTERM reaches that run alone, as a
    scheduler's would. Before, the run exited 0 and the sweep marked it done with a few of its steps. (A
    rerun resumes a run that is not done from its checkpoint: tests/sweep/test_run_completion.py,
    tests/sweep/test_sweep_e2e.py.)"""
    sweep_file, steps, only = tmp_path / "one.yaml", 8, "00-lr=0.0001"
    sweep_file.write_text(yaml.safe_dump({"axes": {"model.lr": [1.0e-4]}}))
    fit = tiny_fit_argv(tmp_path, tiny_model, "unused", "--trainer.max_steps", str(steps), "--ckpt.interval", "1",
                        *SYNC)  # fmt: skip
    assert fit[3] == "--output_dir" and fit[5] == "--run_name"
    recipe_argv = fit[1:3] + fit[7:]  # the sweep names the run's folder
    runner = SweepRunner(load_sweep(sweep_file), recipe_argv, tmp_path / "sweep", LocalLauncher(), 1)
    run, saved = tmp_path / "sweep" / only, tmp_path / "sweep" / "sweep.json"

    thread, result = in_background(runner.run)
    deadline = time.monotonic() + WAIT
    while not (run / "checkpoints" / "step_2.ckpt").exists():
        assert thread.is_alive() and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.01)
    os.kill(int(json.loads(saved.read_text())["runs"][only]["job_id"]), signal.SIGTERM)
    thread.join(timeout=WAIT)
    stopped = json.loads(saved.read_text())["runs"][only]
    assert result == [1] and (stopped["state"], stopped["returncode"]) == ("failed", 143)
    assert 2 <= stopped["steps"] < steps
    assert checkpoint_steps(run / "checkpoints")[-1] == stopped["steps"]  # where the rerun resumes
    assert runner.command(runner.spec.runs[0])[1] == stopped["steps"]
