"""The `grpokit` program: one entry point that dispatches to the recipe commands (fit, train, infer,
orchestrate: grpokit.cli), the registry listing, and the tools built on the recipe CLI (sweep, report,
rollouts: grpokit.sweep; bench: grpokit.bench; eval: grpokit.evaluate; export: grpokit.export). It sits
above them all, so none of them imports it and the package has no import cycle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

import grpokit
from grpokit.bench.command import main as bench_main
from grpokit.cli import judge_role, make_cli, roles
from grpokit.cli.component_args import check_component_names
from grpokit.cli.discovery import discover
from grpokit.cli.recipe_files import check_recipe_files, resolve_recipe_names
from grpokit.cli.recipes_cmd import recipes_main
from grpokit.cli.registry_cmd import registry_main
from grpokit.cli.sft import make_sft_cli
from grpokit.common.errors import RunDataError
from grpokit.evaluate.command import eval_main
from grpokit.export.command import export_main
from grpokit.pretrain.command import pretrain_main
from grpokit.run import Startup
from grpokit.sweep import commands

USAGE = """usage: grpokit COMMAND [options]   (`grpokit COMMAND --help` for a command's options)

  fit          train in one process: engine, orchestrator and trainer (grpokit fit --config recipe.yaml)
  sft          supervised fine-tuning before GRPO, on the same recipe surface (docs/sft.md)
  train        the trainer of a multi-process run (docs/multi-process.md)
  orchestrate  the orchestrator of a multi-process run: sampling requests, rewards, batches
  infer        an inference server (builtin engine or vLLM) of a multi-process run
  judge        the recipe's judge model served at its judge.base_url (docs/judges.md)
  registry     list components: grpokit registry list [KIND]
  recipes      list the shipped recipes (--config takes them by name), or copy one: grpokit recipes cp NAME DEST
  bench        benchmarks: grpokit bench generate|train|step|multiturn|stream|server (docs/benchmarks.md)
  sweep        run a grid of recipes (docs/sweeps.md)
  report       compare the runs of a sweep
  rollouts     record a run's batches, or train variants on recorded batches
  eval         pass@k, maj@k and mean reward of a run's weights and/or the base model (docs/evaluation.md)
  export       a run's weights as a peft adapter or (--merge) a full Hugging Face model folder (docs/export.md)
  pretrain-vision  a VLM's vision tower pretrained on an environment's labelled pictures (docs/vision.md)
"""
SUBCOMMANDS = (
    "fit", "sft", "train", "orchestrate", "infer", "judge", "registry", "recipes", "bench", "sweep", "report",
    "rollouts", "eval", "export",
)  # fmt: skip
PACKAGE_DIR = os.path.dirname(os.path.abspath(grpokit.__file__)) + os.sep  # root_cause: which errors grpokit raised


# Warnings every run printed that a user cannot act on: grpokit's training_step takes Lightning's
# `dataloader_iter` on purpose (one batch per GRPO step, fetched when the step starts), and the other two
# are deprecations inside Lightning (torch's pytree) and peft (transformers' checkpointing flag).
LIBRARY_NOTICES = (
    r"You are using the `dataloader_iter` step flavor",
    r"Found `dataloader_iter` argument in the `training_step`",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"`is_gradient_checkpointing` is deprecated",
)


class DropLines(logging.Filter):
    """Drops a logger's records whose message contains one of `texts`."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


# Log lines of the same kind, by logger: bitsandbytes (imported by peft) warns at import, on CPUs with
# AVX512-BF16, that an optional CPU kernel for 4-bit matmuls is not installed (grpokit's QLoRA runs on
# CUDA); Lightning advertises its cloud logger, lists the accelerators it found (the recipe's
# trainer.accelerator decides), the seed (config.yaml records it), the devices and ranks it set up, and
# says max_steps was reached (grpokit's run summary says what ran). One filter object each, so adding
# them again at the next command adds nothing.
LOGGED_NOTICES = (
    ("bitsandbytes.backends.cpu.ops", DropLines("kernels-community")),
    (
        "lightning.pytorch.utilities.rank_zero",
        DropLines("litlogger", "GPU available: ", "TPU available: ", "HPU available: ", "` stopped: `max_steps="),
    ),
    ("lightning.fabric.utilities.seed", DropLines("Seed set to ")),
    ("lightning.pytorch.accelerators.cuda", DropLines("CUDA_VISIBLE_DEVICES: ")),
    ("lightning.fabric.utilities.distributed", DropLines("Initializing distributed: ")),
    ("lightning.fabric.utilities.rank_zero", DropLines("All distributed processes registered")),
)
# transformers' progress bars of the same kind: a second of "Loading weights" per model (the trainer's,
# the engine's), "Writing model shards" when SFT and export save one. Downloads keep theirs
# (huggingface_hub's bars).
QUIET_PROGRESS_BARS = ("Loading weights", "Writing model shards")


def quiet_library_notices() -> None:
    """Silence LIBRARY_NOTICES, LOGGED_NOTICES and QUIET_PROGRESS_BARS; GRPOKIT_LOG_LEVEL=DEBUG keeps them
    all (and Lightning's model summary: grpokit.cli.lightning_cli)."""
    if os.environ.get("GRPOKIT_LOG_LEVEL", "").upper() == "DEBUG":
        return
    for message in LIBRARY_NOTICES:
        warnings.filterwarnings("ignore", message=message)
    for logger, drop in LOGGED_NOTICES:
        logging.getLogger(logger).addFilter(drop)
    if hasattr(hf_logging, "set_tqdm_hook"):  # transformers >= 5, which shows the bars
        hf_logging.set_tqdm_hook(quiet_bars)


def quiet_bars(factory, args: tuple, kwargs: dict):
    """transformers' tqdm hook: the bars of QUIET_PROGRESS_BARS are made disabled, the others as asked."""
    if str(kwargs.get("desc", "")).startswith(QUIET_PROGRESS_BARS):
        kwargs = {**kwargs, "disable": True}
    return factory(*args, **kwargs)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def show_grpokit_logs() -> None:
    """grpokit's log lines on stderr from INFO up, as Lightning shows its own: a server's address, a
    GGUF converted, the weights a server loaded, base weights shared. Python drops INFO records when
    nothing is configured, so `grpokit infer` used to serve without saying where. GRPOKIT_LOG_LEVEL
    sets the level (WARNING for warnings only); a program that configured logging itself (a handler on
    the root logger: pytest, a notebook's basicConfig) keeps its own setup."""
    level = os.environ.get("GRPOKIT_LOG_LEVEL", "INFO").upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"GRPOKIT_LOG_LEVEL={level!r}: set it to one of {', '.join(LOG_LEVELS)}, or unset it (INFO)")
    logger = logging.getLogger("grpokit")
    if logging.getLogger().handlers or any(getattr(h, "grpokit_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.grpokit_cli = True  # type: ignore[attr-defined]  # added once however often main runs
    logger.addHandler(handler)
    logger.setLevel(level)


def main(argv: list[str] | None = None, startup: Startup | None = None) -> int:
    """Run one `grpokit` command; `startup` records how far a recipe command got (entry reads it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    startup = startup or Startup()
    quiet_library_notices()
    show_grpokit_logs()
    argv = resolve_recipe_names(argv)  # `--config reverse_text`: a shipped recipe, for every command
    if argv[:1] == ["recipes"]:
        return recipes_main(argv[1:])
    if argv[:1] == ["bench"]:
        return bench_main(argv[1:])
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    discover()
    if argv[:1] == ["registry"]:
        return registry_main(argv[1:])
    if argv[:1] == ["pretrain-vision"]:
        return pretrain_main(argv[1:])
    if argv[:1] in (["sweep"], ["report"], ["rollouts"]):
        return {"sweep": commands.sweep_main, "report": commands.report_main, "rollouts": commands.rollouts_main}[
            argv[0]
        ](argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(
            f"{USAGE}grpokit: error: unknown command {argv[0]!r}; choose one of: {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    startup.role = argv[0]
    check_recipe_files(argv)
    check_component_names(argv)
    with torch_threads_kept():  # `num_threads` is this command's, not the process's
        return recipe_command(argv, startup)


@contextlib.contextmanager
def torch_threads_kept():
    """Give torch its thread count back when a command ends: `num_threads` (torch.set_num_threads) is
    process-wide, so a command run in a process that runs more (a notebook, the tests) left its count to
    the next, whose float sums then round differently than in a fresh process."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def recipe_command(argv: list[str], startup: Startup) -> int:
    """A command that reads a recipe (argv[0] one of SUBCOMMANDS, whose files are checked)."""
    if argv[0] == "eval":
        return eval_main(argv[1:], startup)
    if argv[0] == "judge":
        return judge_role.judge(argv[1:], startup)
    if argv[:1] in (["infer"], ["orchestrate"]):
        cli = make_cli(argv[1:], run=False, role=argv[0], startup=startup)
        startup.started = True
        return roles.infer(cli) if argv[0] == "infer" else roles.orchestrate(cli)
    if argv[0] == "sft":
        return signal_exit_code(make_sft_cli(argv[1:], startup=startup))
    if argv[0] == "train":
        return signal_exit_code(make_cli(["fit", *argv[1:]], role="train", startup=startup))
    return signal_exit_code(make_cli(argv, startup=startup))


def signal_exit_code(cli) -> int:
    """A training command's exit code: 0 when it trained to max_steps; 128 + the signal that stopped it
    before (130 Ctrl-C, 143 SIGTERM: the shell's codes), so a scheduler or a sweep never takes a run cut
    short for a finished one (grpokit.trainer.callbacks.StopOnInterrupt)."""
    interrupt = getattr(cli, "interrupt", None)
    return interrupt.exit_code if interrupt is not None else 0


def entry(argv: list[str] | None = None) -> int:
    """The `grpokit` command: `main`, with two kinds of error printed as one line instead of a traceback
    (GRPOKIT_TRACEBACK=1 shows the traceback):
    - a ValueError, FileNotFoundError or ImportError raised before training starts (a bad value, a missing
      file or checkpoint, a plugin or optional package that does not import: the message names the key
      or package and the fix): exit code 2;
    - an I/O error during training (a full disk, a file that cannot be written, in the trainer or the
      rollout thread): the message names the file; exit code 1. The writes are atomic, so the files
      already written are whole and the run continues from its newest checkpoint once it is fixed;
    - a RunDataError during training (a reward that is not a moderate number, a batch file of another
      step or cut short): the message names the environment and example or the file, and the fix; exit
      code 1, nothing trained on that data.
    Other failures during training keep their traceback."""
    startup = Startup()
    try:
        return main(argv, startup)
    except Exception as e:
        if os.environ.get("GRPOKIT_TRACEBACK"):
            raise
        if not startup.started and isinstance(e, (ValueError, FileNotFoundError, ImportError)):
            print(f"grpokit: error: {root_cause(e)}\n(set GRPOKIT_TRACEBACK=1 for the traceback)", file=sys.stderr)
            remove_if_no_files(startup.created_run_dir)
            return 2
        stopped = "training stopped" if startup.role in ("fit", "sft", "train") else f"grpokit {startup.role} stopped"
        if startup.started and (data_error := cause_of_type(e, RunDataError)) is not None:
            hint = f"({stopped}; set GRPOKIT_TRACEBACK=1 for the traceback)"
            print(f"grpokit: error: {data_error}\n{hint}", file=sys.stderr)
            return 1
        if startup.started and (io_error := cause_of_type(e, OSError)) is not None:
            again = (
                "continue from the newest checkpoint with --ckpt.resume_step -1"
                if startup.role in ("fit", "sft", "train")
                else "run the same command again: it continues where the run is"
            )
            print(
                f"grpokit: error: {io_error}\n({stopped}; once that is fixed, {again}; "
                "set GRPOKIT_TRACEBACK=1 for the traceback)",
                file=sys.stderr,
            )
            return 1
        raise


def cause_of_type(e: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The exception of type `kind` that `e` is or was raised from (the rollout thread's arrives
    wrapped by the trainer's RuntimeError), or None."""
    while e is not None and not isinstance(e, kind):
        e = e.__cause__
    return e


def remove_if_no_files(folder: Path | None) -> None:
    """Remove a run folder that a failed start created and left without a single file (empty
    subfolders only), so failed attempts do not pile up as empty run_<time> folders; one holding a file
    (a vLLM log, a batch) is kept for diagnosis."""
    if folder is None or not folder.is_dir() or any(p.is_file() or p.is_symlink() for p in folder.rglob("*")):
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        sub.rmdir()
    folder.rmdir()


def root_cause(e: BaseException) -> BaseException:
    """The exception to show for `e`: the outermost one in its `raise ... from` chain that grpokit raised
    (its message names the key and the fix), else the innermost (jsonargparse wraps a component's own
    ValueError inside its longer one; a library's wrapper hides the real cause)."""
    chain = [e]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    return next((c for c in chain if raised_in_grpokit(c)), chain[-1])


def raised_in_grpokit(e: BaseException) -> bool:
    """Whether the frame that raised `e` is in grpokit's own source."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(PACKAGE_DIR)


if __name__ == "__main__":
    sys.exit(entry())
