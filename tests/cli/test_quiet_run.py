"""A run prints what a user can act on: none of the library notices every run used to print (transformers'
past_key_values rename and "Loading weights" bars, Lightning's weights_only default and dataloader_iter
notices, deprecations inside Lightning and peft, Lightning's advert for its cloud logger, its accelerator,
seed and max_steps lines and its model summary with "Total FLOPs: 0"), and ends with the run's summary.
GRPOKIT_LOG_LEVEL=DEBUG shows the notices again."""

import logging
import os
import subprocess
import sys
from importlib.resources import files

import pytest

from grpokit.testing import tiny_fit_argv

NOTICES = (
    "past_key_values",
    "weights_only",
    "dataloader_iter",
    "LeafSpec",
    "is_gradient_checkpointing",
    "litlogger",
    "GPU available",
    "TPU available",
    "Seed set to",
    "Total FLOPs",
    "Trainable params",
    "Loading weights",
    "`max_steps=2` reached",
)


def test_a_fit_with_checkpoints_prints_no_library_notices(tmp_path, tiny_model):
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "2", "--ckpt.interval", "1")
    env = {k: v for k, v in os.environ.items() if k != "GRPOKIT_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "grpokit", *argv], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert list((tmp_path / "r" / "checkpoints").glob("step_*.ckpt")), "the run saved checkpoints (Lightning's notice)"
    assert [n for n in NOTICES if n in printed] == [], printed[-3000:]
    run = tmp_path / "r"
    summary = done.stdout[done.stdout.index("grpokit: trained 2 steps: ") :].splitlines()
    assert summary[0] == f"grpokit: trained 2 steps: {run}"
    assert summary[1].startswith("  reward      ") and "(step 0) -> " in summary[1]
    assert summary[2].startswith("  eval reward ") and "(weights of step 0)" in summary[2]  # the recipe's eval
    assert summary[3:5] == [f"  checkpoint  {run}/checkpoints/step_2.ckpt", f"  export      grpokit export {run} "
                            f"--merge --out {run}/merged"]  # fmt: skip
    assert summary[5].startswith("  evaluate    grpokit eval --config reverse_text --model.model ")
    assert summary[5].endswith(f" --ckpt {run}") and "--trainer." not in summary[5]


@pytest.mark.unit
@pytest.mark.parametrize("level", [None, "debug"])
def test_library_notices_are_quiet_unless_grpokit_log_level_is_debug(level, monkeypatch):
    """The filters (LOGGED_NOTICES), the tqdm hook for transformers' "Loading weights" bars, and Lightning's
    model summary (a default of the recipe parser) all follow GRPOKIT_LOG_LEVEL=DEBUG."""
    import grpokit.main as program
    from grpokit.cli import parse_recipe

    hooks = []
    name = "tests.quiet_run.lightning"
    monkeypatch.setattr(program, "LOGGED_NOTICES", ((name, program.DropLines("GPU available: ", "Seed set to ")),))
    monkeypatch.setattr(program.hf_logging, "set_tqdm_hook", hooks.append)
    monkeypatch.setattr(logging.getLogger(name), "filters", [])
    monkeypatch.delenv("GRPOKIT_LOG_LEVEL", raising=False)
    if level:
        monkeypatch.setenv("GRPOKIT_LOG_LEVEL", level)
    program.quiet_library_notices()
    shown = [logging.getLogger(name).filter(logging.makeLogRecord({"msg": m})) for m in NOTICE_LINES]
    assert shown == ([True, True, True] if level else [False, False, True])
    assert hooks == ([] if level else [program.quiet_bars])
    ours, before = logging.getLogger("grpokit"), logging.getLogger("grpokit").level
    ours.setLevel(logging.DEBUG if level else logging.INFO)  # as show_grpokit_logs sets it
    try:
        recipe = parse_recipe(["--config", str(files("grpokit.recipes") / "reverse_text.yaml")])
    finally:
        ours.setLevel(before)
    assert f"enable_model_summary: {'true' if level else 'false'}" in recipe


NOTICE_LINES = ("GPU available: False, used: False", "Seed set to 0", "GPU available but not used. You can set it")


@pytest.mark.unit
def test_quiet_bars_disable_loading_weights_and_keep_the_others():
    from grpokit.main import quiet_bars

    def factory(*args, **kwargs):
        return args, kwargs

    assert quiet_bars(factory, ([1, 2],), {"desc": "Loading weights"}) == (
        ([1, 2],),
        {"desc": "Loading weights", "disable": True},
    )
    assert quiet_bars(factory, (), {"desc": "Downloading"}) == ((), {"desc": "Downloading"})


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
