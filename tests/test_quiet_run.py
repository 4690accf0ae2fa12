"""A run prints what a user can act on: none of the library notices every run used to print (transformers'
past_key_values rename, Lightning's weights_only default and dataloader_iter notices, deprecations
inside Lightning and peft, Lightning's advert for its cloud logger)."""

import subprocess
import sys

import pytest

from grpokit.testing import tiny_fit_argv

NOTICES = ("past_key_values", "weights_only", "dataloader_iter", "LeafSpec", "is_gradient_checkpointing", "litlogger")


def test_a_fit_with_checkpoints_prints_no_library_notices(tmp_path, tiny_model):
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "2", "--ckpt.interval", "1")
    done = subprocess.run([sys.executable, "-m", "grpokit", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert list((tmp_path / "r" / "checkpoints").glob("step_*.ckpt")), "the run saved checkpoints (Lightning's notice)"
    assert [n for n in NOTICES if n in printed] == [], printed[-3000:]


@pytest.mark.unit
@pytest.mark.parametrize("level", [None, "debug", "WARNING", "loud"])
def test_grpokit_log_lines_reach_stderr_once_at_the_level_set(level, monkeypatch, capsys):
    """Python drops INFO records when nothing is configured, so `grpokit infer` served without saying
    where; `grpokit` now shows its own log lines from INFO up (GRPOKIT_LOG_LEVEL changes the level), once
    however often main runs, and leaves a program that configured logging itself alone."""
    import logging

    from grpokit.main import show_grpokit_logs

    ours = logging.getLogger("grpokit")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a plain `grpokit` process (pytest adds some)
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    monkeypatch.delenv("GRPOKIT_LOG_LEVEL", raising=False)
    if level:
        monkeypatch.setenv("GRPOKIT_LOG_LEVEL", level)
    if level == "loud":
        with pytest.raises(ValueError, match="GRPOKIT_LOG_LEVEL='LOUD': set it to one of DEBUG, INFO, WARNING, ERROR"):
            show_grpokit_logs()
        return
    show_grpokit_logs()
    show_grpokit_logs()
    logging.getLogger("grpokit.cli.roles").info("serving on 127.0.0.1:8000")
    logging.getLogger("grpokit.x").debug("a capture")
    printed = capsys.readouterr().err
    assert printed.count("serving on 127.0.0.1:8000") == (0 if level == "WARNING" else 1), printed
    assert ("DEBUG grpokit.x: a capture" in printed) == (level == "debug")


@pytest.mark.unit
def test_a_long_wait_says_so_once_then_every_interval(caplog):
    from grpokit.common.waits import WaitNotice

    notice = WaitNotice("waiting for the trainer's weights of step >= 3", after=0.0, every=3600.0)
    with caplog.at_level("INFO", logger="grpokit.waits"):
        for _ in range(3):
            notice.tick()
    assert [r.getMessage().split(" (waiting")[0] for r in caplog.records] == [
        "waiting for the trainer's weights of step >= 3"
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("role", "advice"),
    [
        ("train", "(training stopped; once that is fixed, continue from the newest checkpoint with --ckpt"),
        ("orchestrate", "(grpokit orchestrate stopped; once that is fixed, run the same command again"),
        ("infer", "(grpokit infer stopped; once that is fixed, run the same command again"),
    ],
)
def test_an_io_error_after_start_gives_the_roles_own_advice(role, advice, monkeypatch, capsys):
    """`grpokit infer` on a busy port and `grpokit orchestrate` with its server down were told to resume
    from a checkpoint, which only the trainer has; they are restarted with the same command."""
    import grpokit.main as entry_point

    def fails(argv, startup):
        startup.role, startup.started = role, True
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(entry_point, "main", fails)
    monkeypatch.delenv("GRPOKIT_TRACEBACK", raising=False)
    assert entry_point.entry([role]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit: error: [Errno 111] Connection refused\n") and advice in err, err
