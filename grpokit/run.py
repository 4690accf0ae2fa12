"""One run as every role sees it: the start's state, the run folder and resume point, and the engine
wiring that fit, infer and orchestrate share (one path, written once).

`Startup` replaces two module-level globals: whether the recipe is parsed, built and wired (errors
before that are a bad value or a missing file, printed as one line; errors after it are training
failures and keep their traceback), and the run folder this start created (removed again when the
start fails before writing a file).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from grpokit.common.models import load_tokenizer
from grpokit.common.noisy_norms import check_engine_accepts_norms
from grpokit.common.run_context import RunContext
from grpokit.trainer.checkpoint import (
    archive_unfinished_attempt,
    check_no_earlier_run,
    checkpoint_steps,
    newest_archive,
    resume_path,
    started_as_other_rank,
)

log = logging.getLogger(__name__)


@dataclass
class Startup:
    """How far one start got, and how it ended; grpokit.main reads it for the exit code and the form of
    an error (one line before training starts, its traceback after)."""

    started: bool = False
    role: str = "fit"  # the command: infer and orchestrate are restarted as they were, not resumed
    created_run_dir: Path | None = None
    interrupted: bool = False  # a signal ended training before max_steps (StopOnInterrupt: its exit_code)


def open_run(config, role: str, trains: bool, startup: Startup) -> RunContext:
    """The run folder and resume point of a parsed recipe (`config`: its run_name, output_dir, ckpt),
    checked before anything is built: a fresh trainer refuses a folder with an earlier run's checkpoints,
    a fresh fit archives an attempt that stopped before its first checkpoint. Creates the folder last, so
    a refused start leaves none; `startup` records a folder it created. `trains`: this process runs the
    Lightning trainer (fit, train), which loads the checkpoint itself (config.ckpt_path is set)."""
    if role != "fit" and not config.run_name:
        raise ValueError(
            f"grpokit {role} needs --run_name: the processes of a run share the folder output_dir/run_name"
        )
    run = RunContext(run_dir=Path(config.output_dir) / (config.run_name or time.strftime("run_%Y%m%d-%H%M%S")),
                     run_name_given=bool(config.run_name), restore_buffer=not config.ckpt.skip_buffer)  # fmt: skip
    config.run_name = run.run_dir.name
    if role in ("fit", "train") and config.ckpt.resume_step is None and not started_as_other_rank():
        check_no_earlier_run(run.run_dir)
        if role == "fit" and (archive := archive_unfinished_attempt(run.run_dir)):
            log.warning(
                "%s held batches of an earlier attempt that stopped before its first checkpoint; moved them to %s",
                run.run_dir,
                archive,
            )
    run.resuming = config.ckpt.resume_step is not None and not config.ckpt.skip_progress
    if config.ckpt.resume_step is not None and (run.resuming or trains):
        path, step = resume_path(_checkpoint_folder(run.run_dir, config.ckpt.skip_progress), config.ckpt.resume_step)
        if run.resuming:
            run.start_step = step
        if trains and run.resuming:  # the trainer's process loads the checkpoint
            config.ckpt_path, config.weights_only = str(path), True  # tensors and plain data: nothing is unpickled
        elif trains:  # skip_progress: weights only, and a new count
            run.restart_from = (path, step)
    if not run.run_dir.exists():
        startup.created_run_dir = run.run_dir  # removed again if the start fails before a file is written
    run.run_dir.mkdir(parents=True, exist_ok=True)
    return run


def _checkpoint_folder(run_dir: Path, skip_progress: bool) -> Path:
    """Where the checkpoint to resume from is: checkpoints/, or, on a DDP rank > 0 restarting the count
    (ckpt.skip_progress), the archive rank 0 moved the earlier count's checkpoints to before this rank started."""
    folder = run_dir / "checkpoints"
    if skip_progress and not checkpoint_steps(folder) and started_as_other_rank():
        return newest_archive(run_dir) / "checkpoints"
    return folder


def start_engine(engine, broadcast, policy, run_dir: Path, data=None):
    """The engine side of every role that samples (fit, infer, orchestrate), in one order: refuse QeRL
    norms the engine cannot take, load the tokenizer and with it the environments and filters of
    `data` (the Orchestrator, in the roles that sample prompts: a bad dataset stops the start before
    the model loads), open the broadcast in the run folder, tell a remote engine the run's name, load
    the policy's model into the engine. Returns the policy's tokenizer."""
    check_engine_accepts_norms(engine, policy.noise_scheduler, broadcast)
    tokenizer = load_tokenizer(policy.model_name)
    if data is not None:
        data.prepare(tokenizer)
    broadcast.setup(run_dir)
    if hasattr(engine, "run_name"):  # RemoteEngine: a grpokit server that serves another run is refused
        engine.run_name = Path(run_dir).name
    engine.setup(policy.model_name)
    return tokenizer
