"""`grpokit` command line: `fit` (LightningCLI over one YAML recipe) and `registry list`.

A recipe has Lightning's sections (model = Policy, data = Orchestrator, trainer) plus `inference` (the
engine), `broadcast` (trainer -> engine weights), `output_dir` and `run_name`. Each run writes
`{output_dir}/{run_name}/`: config.yaml (the resolved recipe), metrics.csv, samples.jsonl, and the
rollouts/ and broadcasts/ folders the roles talk through.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from grpokit.broadcast import WeightBroadcast
from grpokit.callbacks import ShareBaseWeights, WeightSync
from grpokit.checkpoint import (
    Checkpointer,
    CheckpointSettings,
    LoadWeights,
    archive_progress,
    archive_unfinished_attempt,
    check_no_earlier_run,
    checkpoint_steps,
    newest_archive,
    resume_path,
    started_as_other_rank,
)
from grpokit.cli_errors import GrpoArgumentParser
from grpokit.component_args import check_component_names, reset_carried_init_args
from grpokit.components import clashes, components, discover
from grpokit.distributed import check_strategy_name, check_trainer_processes
from grpokit.inference import InferenceEngine
from grpokit.inference.vllm_launch import start_for_fit
from grpokit.models import load_tokenizer
from grpokit.norm_noise import check_engine_accepts_norms
from grpokit.orchestrator import Orchestrator
from grpokit.policy import Policy
from grpokit.progress import use_step_progress_bar
from grpokit.recipe_files import check_recipe_files
from grpokit.roles import ServerSettings, first_unsent_step

log = logging.getLogger(__name__)
CSV_LOGGER = "grpokit.loggers.ResumableCSVLogger"
USAGE = """usage: grpokit COMMAND [options]   (`grpokit COMMAND --help` for a command's options)

  fit          train in one process: engine, orchestrator and trainer (grpokit fit --config recipe.yaml)
  train        the trainer of a multi-process run (docs/multi-process.md)
  orchestrate  the orchestrator of a multi-process run: sampling requests, rewards, batches
  infer        an inference server (builtin engine or vLLM) of a multi-process run
  registry     list components: grpokit registry list [KIND]
  bench        benchmarks: grpokit bench generate|train|step (docs/benchmarks.md)
  sweep        run a grid of recipes (docs/sweeps.md)
  report       compare the runs of a sweep
  rollouts     record a run's batches, or train variants on recorded batches
"""
STARTED = [False]  # whether the recipe is parsed, built and wired (main: errors before that print as one line)
NEW_RUN_DIR: list[Path | None] = [None]  # the run folder this process created, if it did
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # root_cause: which exceptions grpokit raised
# bitsandbytes (imported by peft) warns at import, on CPUs with AVX512-BF16, that an optional CPU kernel
# for 4-bit matmuls is not installed; grpokit's QLoRA runs on CUDA, so the line is noise
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "kernels-community" not in record.getMessage()
)
SUBCOMMANDS = ("fit", "train", "orchestrate", "infer", "registry", "bench", "sweep", "report", "rollouts")


class GrpoCLI(LightningCLI):
    """LightningCLI with grpokit's extra recipe sections and the co-locate wiring for `fit`.

    `role` is "fit" (all three roles in this process), "train" (only the trainer), or "infer" /
    "orchestrate" (parse and build only; grpokit.roles runs them).
    """

    role = "fit"

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse the recipe (as LightningCLI does, minus its warning about `args` beside sys.argv: grpokit
        always passes its own argv), then reset what a swapped component carried over from the class it
        replaced (grpokit.component_args); `--print_config[=flags]` prints the recipe after that."""
        printing = [a for a in args if a == "--print_config" or a.startswith("--print_config=")]
        args = [a for a in args if a not in printing]
        self.config = parser.parse_args(args)
        sub = self.config.get("subcommand")
        config, subparser = (self.config[sub], self._subcommand_parsers[sub]) if sub else (self.config, parser)
        reset_carried_init_args(args, config, subparser.get_defaults())
        if printing:
            flags = {f for f in printing[-1].partition("=")[2].split(",") if f}
            sys.stdout.write(
                subparser.dump(
                    config,
                    skip_unset=bool(flags & {"skip_unset", "skip_null"}),
                    skip_default="skip_default" in flags,
                    with_comments="comments" in flags,
                )
            )
            raise SystemExit(0)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        from grpokit.broadcast.filesystem import FilesystemBroadcast
        from grpokit.inference.builtin import BuiltinEngine

        parser.add_argument(
            "--output_dir", type=str, default="outputs", help="Folder that holds one subfolder per run."
        )
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Run folder name (default run_<timestamp>); set it to share a run between processes.",
        )
        parser.add_argument(
            "--num_threads", type=int | None, default=None, help="torch CPU threads (default: torch's choice)."
        )
        parser.add_class_arguments(CheckpointSettings, "ckpt")
        parser.add_class_arguments(ServerSettings, "server")
        parser.add_subclass_arguments(
            InferenceEngine, "inference", default=lazy_instance(BuiltinEngine), required=False
        )
        parser.add_subclass_arguments(
            WeightBroadcast, "broadcast", default=lazy_instance(FilesystemBroadcast), required=False
        )
        parser.set_defaults(
            {
                "trainer.max_steps": 20,
                "trainer.log_every_n_steps": 1,
                "trainer.enable_checkpointing": False,
                "trainer.devices": 1,
                "trainer.num_sanity_val_steps": 0,
            }
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.trainer.max_steps is None or config.trainer.max_steps < 1:
            raise ValueError(
                f"trainer.max_steps must be a positive number of GRPO steps, got {config.trainer.max_steps}"
            )
        if self.role != "fit" and not config.run_name:
            raise ValueError(
                f"grpokit {self.role} needs --run_name: the processes of a run share the folder output_dir/run_name"
            )
        self.run_name_given = bool(config.run_name)
        run_name = config.run_name or time.strftime("run_%Y%m%d-%H%M%S")
        config.run_name = run_name
        self.run_dir = Path(config.output_dir) / run_name
        check_strategy_name(config.trainer.strategy)
        if self.role in ("fit", "train") and config.ckpt.resume_step is None and not started_as_other_rank():
            check_no_earlier_run(self.run_dir)
            if self.role == "fit" and (archive := archive_unfinished_attempt(self.run_dir)):
                log.warning(
                    "%s held batches of an earlier attempt that stopped before its first checkpoint; moved them to %s",
                    self.run_dir,
                    archive,
                )
        config.trainer.default_root_dir = str(self.run_dir)
        self.start_step, self.restart_from = 0, None
        self.restore_buffer = not config.ckpt.skip_buffer
        resuming = config.ckpt.resume_step is not None and not config.ckpt.skip_progress
        if config.ckpt.resume_step is not None and (resuming or self.subcommand):
            folder = self.run_dir / "checkpoints"
            if config.ckpt.skip_progress and not checkpoint_steps(folder) and started_as_other_rank():
                folder = (
                    newest_archive(self.run_dir) / "checkpoints"
                )  # rank 0 archived the earlier count before starting this rank
            path, step = resume_path(folder, config.ckpt.resume_step)
            if resuming:
                self.start_step = step
            if self.subcommand and resuming:  # the trainer's process loads the checkpoint
                config.ckpt_path, config.weights_only = str(path), True  # tensors and plain data: nothing is unpickled
            elif self.subcommand:  # skip_progress: weights only, and a new count (before_fit)
                self.restart_from = (path, step)
        if not self.run_dir.exists():
            NEW_RUN_DIR[0] = self.run_dir  # entry removes it again if the start fails before anything is written
        self.run_dir.mkdir(parents=True, exist_ok=True)  # after the checks above: a refused start leaves no folder
        config.trainer.logger = with_csv_logger(
            config.trainer.logger, self.run_dir, self.start_step if resuming else None
        )
        if config.num_threads:
            torch.set_num_threads(config.num_threads)

    def before_fit(self) -> None:
        use_step_progress_bar(self.trainer)  # "GRPO step 12/50", not Lightning's "Epoch 0/-2"
        self._wire_roles()
        STARTED[0] = True  # from here on, an error is a training failure: its traceback is printed

    def _wire_roles(self) -> None:
        config = self.config_init[self.subcommand]
        check_trainer_processes(self.trainer, self.run_name_given)
        if self.restart_from is not None:
            self._restart_count(*self.restart_from)
        if self.role == "train" or not self.trainer.is_global_zero:
            # batches come from `grpokit orchestrate` (or, on DDP ranks > 0, from rank 0); rank 0 publishes weights
            config["broadcast"].setup(self.run_dir)
            self._discard_stale_weights(config["broadcast"])
            self.datamodule.connect_trainer(self.run_dir, self.trainer.max_steps, self.start_step)
            self.trainer.callbacks.append(WeightSync(config["broadcast"]))
            self._add_checkpointer(config)
            return
        engine: InferenceEngine = config["inference"]
        broadcast: WeightBroadcast = config["broadcast"]
        check_engine_accepts_norms(engine, self.model.noise_scheduler, broadcast)
        broadcast.setup(self.run_dir)
        self._discard_stale_weights(broadcast)
        engine.setup(self.model.model_name)
        self.datamodule.connect(
            engine,
            broadcast,
            load_tokenizer(self.model.model_name),
            self.run_dir,
            self.trainer.max_steps,
            self.start_step,
            self.restore_buffer,
            trainer_shares_prefixes=self.model.share_prefixes and self.trainer.world_size == 1,
        )  # DDP: keep a micro-batch per rank
        if getattr(engine, "share_weights", False) and self.model.lora is not None:
            self.trainer.callbacks.append(
                ShareBaseWeights(engine)
            )  # before WeightSync: shared before the first publish
        self.trainer.callbacks.append(WeightSync(broadcast))
        self._add_checkpointer(config)
        vllm = start_for_fit(self, engine, broadcast, config["server"])  # VLLMEngine with `serve`: fit runs vLLM itself
        if vllm is not None:
            self.trainer.callbacks.append(vllm)  # last: it stops vLLM after WeightSync's final publish
        # resumed: batches the killed run sent are still on disk (kept from its checkpoint on); train on
        # them rather than sample those steps again with weights newer than the steps
        self.datamodule.start(first_unsent_step(self.datamodule, self.start_step) if self.start_step else None)

    def _discard_stale_weights(self, broadcast: WeightBroadcast) -> None:
        """Weights of steps >= start_step in the run folder are a killed run's (or an earlier run's): this
        trainer publishes its own, so no engine samples a batch with weights newer than the batch's step."""
        if self.trainer.is_global_zero:
            broadcast.discard_after(self.start_step - 1)

    def _restart_count(self, path: Path, step: int) -> None:
        """ckpt.skip_progress: archive the earlier count's files, keep its easy/hard pools (unless
        ckpt.skip_buffer), and load the checkpoint's weights when fit starts. Global rank 0 alone
        archives; every rank loads the weights from the archive (LoadWeights)."""
        from grpokit.orchestrator.pools import restart_log

        if self.trainer.is_global_zero:
            archive = archive_progress(self.run_dir)
            data = self.datamodule
            if data.buffer.uses_pools:
                restart_log(self.run_dir / "buffer.jsonl", data.shape.locate(step)[0] if self.restore_buffer else None)
            print(
                "ckpt.skip_progress: counting from step 0 with the weights "
                f"of {path.name}; the earlier files are in {archive}",
                file=sys.stderr,
            )
        self.trainer.callbacks.append(LoadWeights(self.run_dir, Path("checkpoints") / path.name))

    def _add_checkpointer(self, config) -> None:
        settings: CheckpointSettings = config["ckpt"]
        if settings.interval:
            self.trainer.callbacks.append(
                Checkpointer(self.run_dir / "checkpoints", settings, self.datamodule.transport)
            )


def with_csv_logger(logger, run_dir: Path, resume_step: int | None):
    """The recipe's loggers plus a CSV logger writing run_dir/metrics.csv (always on)."""
    csv = {"class_path": CSV_LOGGER, "init_args": {"save_dir": str(run_dir), "resume_step": resume_step}}
    if logger in (None, True, False):
        return [csv]
    loggers = list(logger) if isinstance(logger, list) else [logger]
    return [lg for lg in loggers if "CSVLogger" not in str(getattr(lg, "class_path", ""))] + [csv]


def registry_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="grpokit registry", description="List registered components.")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list components, optionally of one kind")
    ls.add_argument("kind", nargs="?", help="loss, advantage, filter, noise, transport, broadcast or inference")
    ls.add_argument("--markdown", action="store_true", help="print a Markdown table (docs/components.md)")
    ls.add_argument("--builtin", action="store_true", help="only grpokit's own components, not plugins")
    args = parser.parse_args(argv)
    found = [c for c in components(args.kind) if not args.builtin or c.class_path.startswith("grpokit.")]
    print(components_markdown(found) if args.markdown else components_table(found), end="")
    for line in clashes(found):
        print(f"error: {line}", file=sys.stderr)
    return 1 if clashes(found) else 0


def components_table(found: list) -> str:
    width = max((len(c.name) for c in found), default=4)
    return "".join(f"{c.kind:<10} {c.name:<{width}}  {c.class_path:<55} {c.summary}\n" for c in found)


def components_markdown(found: list) -> str:
    rows = "".join(f"| {c.kind} | `{c.name}` | `{c.class_path}` | {c.summary} |\n" for c in found)
    return (
        "# Components\n\n"
        "Generated by `grpokit registry list --builtin --markdown > docs/components.md`; "
        "tests/test_docs.py fails when it is stale. A recipe names a component by its short name or class path.\n\n"
        "| kind | name | class path | summary |\n|---|---|---|---|\n" + rows
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    STARTED[0] = False
    if argv[:1] == ["bench"]:
        from grpokit.bench.cli import main as bench_main

        return bench_main(argv[1:])
    discover()
    if argv[:1] == ["registry"]:
        return registry_main(argv[1:])
    if argv[:1] in (["sweep"], ["report"], ["rollouts"]):
        from grpokit.sweep import commands

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
    check_recipe_files(argv)
    check_component_names(argv)
    if argv[:1] in (["infer"], ["orchestrate"]):
        from grpokit import roles

        cli = make_cli(argv[1:], run=False, role=argv[0])
        STARTED[0] = True
        return roles.infer(cli) if argv[0] == "infer" else roles.orchestrate(cli)
    make_cli(["fit", *argv[1:]], role="train") if argv[0] == "train" else make_cli(argv)
    return 0


def entry(argv: list[str] | None = None) -> int:
    """The `grpokit` command: `main`, with a ValueError or FileNotFoundError raised before training starts
    (a bad value, a missing file or checkpoint: the message names the key and the fix) printed as one
    line instead of a traceback; GRPOKIT_TRACEBACK=1 shows the traceback. Failures during training
    keep theirs."""
    NEW_RUN_DIR[0] = None
    try:
        return main(argv)
    except (ValueError, FileNotFoundError) as e:
        if STARTED[0] or os.environ.get("GRPOKIT_TRACEBACK"):
            raise
        print(f"grpokit: error: {root_cause(e)}\n(set GRPOKIT_TRACEBACK=1 for the traceback)", file=sys.stderr)
        remove_if_no_files(NEW_RUN_DIR[0])
        return 2


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


def make_cli(argv: list[str], run: bool = True, role: str = "fit") -> GrpoCLI:
    """Parse `argv` (a subcommand first when run=True) and build every component; run it if asked."""
    cls = type(f"GrpoCLI_{role}", (GrpoCLI,), {"role": role}) if role != "fit" else GrpoCLI
    return cls(
        Policy,
        Orchestrator,
        args=argv,
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_class=GrpoArgumentParser.for_command(f"grpokit {role}"),
    )


if __name__ == "__main__":
    sys.exit(entry())
