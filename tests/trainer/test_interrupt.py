"""Ctrl-C and an I/O error during `grpokit fit` (a subprocess: the exit code and the signal matter) end
the process cleanly: no SIGABRT from the rollout thread ("terminate called without an active
exception"), nothing written is lost, and the run continues with --ckpt.resume_step -1."""

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from grpokit.main import entry
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.checkpoint import checkpoint_steps
from tests.support import read_metrics
from tests.support.processes import start_grpokit, wait_for_file

STEPS = 6
WAIT = 300  # seconds any one stage may take before the test fails (never hangs)
# synchronous sampling (the batch of step n is sampled with the weights of step n) and no eval: the
# metrics of a step depend only on the weights and the step, so an interrupted run can match a straight one
SYNC = ("--seed_everything", "0", "--data.max_async_level", "0", "--data.eval", "null")


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    wait_for_file(path, proc, WAIT)


def step_rows(run: Path) -> list[dict]:
    return read_metrics(run)


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_time")} for r in rows]


def assert_clean_exit(log: Path) -> str:
    text = log.read_text()
    assert "terminate called" not in text and "Traceback" not in text, text[-3000:]
    return text


def test_ctrl_c_stops_after_the_step_with_its_checkpoint_and_resume_matches_a_straight_run(
    tmp_path, tiny_model, straight_sync_fit
):
    def argv(name, *extra):
        return tiny_fit_argv(tmp_path, tiny_model, name, "--trainer.max_steps", str(STEPS), "--ckpt.interval", "5",
                             *SYNC, *extra)  # fmt: skip

    run = tmp_path / "stopped"
    # the straight run alongside (the same one as tests/faults/test_signals.py's, started once per session)
    straight, straight_log, straight_run = straight_sync_fit(argv("straight"))
    proc, log = start_grpokit(tmp_path, argv("stopped"), "stopped")
    try:
        wait_for(run / "rollouts" / "step_3.safetensors", proc)  # sampled after step 2: the trainer is on step 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT) == 130
    finally:
        proc.kill()
    text = assert_clean_exit(log)
    assert "Ctrl-C: stopping after the current step" in text and "stopped by Ctrl-C after" in text
    trained = [int(r["step"]) for r in step_rows(run)]
    assert trained == list(range(len(trained))) and 3 <= len(trained) < STEPS
    assert checkpoint_steps(run / "checkpoints") == [len(trained)]  # the step reached, not the interval's

    # the resume and the straight run each in a fresh process too, as the stopped one: a process that
    # already ran other fits in-process (this test session) may round differently in the 7th digit
    proc, log = start_grpokit(tmp_path, argv("stopped", "--ckpt.resume_step", "-1"), "resumed")
    assert proc.wait(timeout=WAIT) == 0, log.read_text()[-3000:]
    assert straight.wait(timeout=WAIT) == 0, straight_log.read_text()[-3000:]
    resumed, straight = step_rows(run), step_rows(straight_run)
    assert [int(r["step"]) for r in resumed] == list(range(STEPS))
    assert without_timings(resumed) == without_timings(straight)


def test_a_second_ctrl_c_exits_at_once_and_a_resume_then_names_the_missing_checkpoint(tmp_path, tiny_model, capsys):
    """Both Ctrl-Cs land while the trainer waits for its first batch (long completions keep the rollout
    thread sampling): the second one does not wait for the step."""
    long = ("--data.sampling.max_tokens", "384", "--data.seq_len", "512")  # the tiny model allows 512 positions
    argv = tiny_fit_argv(tmp_path, tiny_model, "early", "--ckpt.interval", "0", *long, *SYNC)
    proc, log = start_grpokit(tmp_path, argv, "early")
    try:
        wait_for(tmp_path / "early" / "broadcasts" / "step_0" / "STABLE", proc)  # training started
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
    text = assert_clean_exit(log)
    assert "second Ctrl-C: exiting now" in text and "stopped by Ctrl-C after" not in text
    assert not (tmp_path / "early" / "metrics.csv").exists() or not step_rows(tmp_path / "early")

    assert entry([*argv, "--ckpt.resume_step", "-1"]) == 2
    assert "exists but has no checkpoint yet" in capsys.readouterr().err


def test_an_io_error_mid_run_exits_with_one_line_naming_the_file(tmp_path, tiny_model):
    """A file-size limit the checkpoint exceeds (the batches and weights of the tiny model are smaller):
    the write fails at step 2 with EFBIG, as it would on a full disk."""

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    run = tmp_path / "io"
    argv = tiny_fit_argv(tmp_path, tiny_model, "io", "--trainer.max_steps", "4", "--ckpt.interval", "2", *SYNC)
    proc, log = start_grpokit(tmp_path, argv, "io", preexec_fn=small_files)
    try:
        assert proc.wait(timeout=WAIT) == 1
    finally:
        proc.kill()
    text = assert_clean_exit(log)
    last_lines = text.strip().splitlines()[-2:]
    assert last_lines[0].startswith("grpokit: error: [Errno 27] cannot write the checkpoint "), last_lines
    assert f"{run / 'checkpoints' / 'step_2.ckpt'} (File too large)" in last_lines[0]
    assert "--ckpt.resume_step -1" in last_lines[1]
    assert [int(r["step"]) for r in step_rows(run)] == [0, 1]  # the steps before it are logged whole
    assert not os.listdir(run / "checkpoints")  # no partial checkpoint or temp file
