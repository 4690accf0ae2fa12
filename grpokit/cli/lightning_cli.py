"""GrpoCLI: the LightningCLI behind `grpokit fit | train | infer | orchestrate`, over one YAML recipe.

A recipe has Lightning's sections (model = Policy, data = Orchestrator, trainer) plus `inference` (the
engine), `broadcast` (trainer -> engine weights), `output_dir` and `run_name`. Each run writes
`{output_dir}/{run_name}/`: config.yaml (the resolved recipe), metrics.csv, samples.jsonl, and the
rollouts/ and broadcasts/ folders the roles talk through.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from grpokit.broadcast import WeightBroadcast
from grpokit.cli.component_args import reset_carried_init_args
from grpokit.cli.errors import GrpoArgumentParser
from grpokit.cli.roles import ServerSettings, first_unsent_step
from grpokit.common.models import load_tokenizer
from grpokit.common.noisy_norms import check_engine_accepts_norms
from grpokit.inference import InferenceEngine
from grpokit.inference.vllm.launch import start_for_fit
from grpokit.orchestrator import Orchestrator
from grpokit.run import Startup
from grpokit.trainer.callbacks import ShareBaseWeights, WeightSync
from grpokit.trainer.checkpoint import (
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
from grpokit.trainer.distributed import check_strategy_name, check_trainer_processes
from grpokit.trainer.policy import Policy
from grpokit.trainer.progress import use_step_progress_bar

log = logging.getLogger(__name__)
CSV_LOGGER = "grpokit.trainer.loggers.ResumableCSVLogger"


class GrpoCLI(LightningCLI):
    """LightningCLI with grpokit's extra recipe sections and the co-locate wiring for `fit`.

    `role` is "fit" (all three roles in this process), "train" (only the trainer), or "infer" /
    "orchestrate" (parse and build only; grpokit.cli.roles runs them).
    """

    role = "fit"
    startup = Startup()  # make_cli gives each start its own

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse the recipe (as LightningCLI does, minus its warning about `args` beside sys.argv: grpokit
        always passes its own argv), then reset what a swapped component carried over from the class it
        replaced (grpokit.cli.component_args); `--print_config[=flags]` prints the recipe after that."""
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
            self.startup.created_run_dir = self.run_dir  # removed again if the start fails before a file is written
        self.run_dir.mkdir(parents=True, exist_ok=True)  # after the checks above: a refused start leaves no folder
        config.trainer.logger = with_csv_logger(
            config.trainer.logger, self.run_dir, self.start_step if resuming else None
        )
        if config.num_threads:
            torch.set_num_threads(config.num_threads)

    def before_fit(self) -> None:
        use_step_progress_bar(self.trainer)  # "GRPO step 12/50", not Lightning's "Epoch 0/-2"
        self._wire_roles()
        self.startup.started = True  # from here on, an error is a training failure: its traceback is printed

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


def make_cli(argv: list[str], run: bool = True, role: str = "fit", startup: Startup | None = None) -> GrpoCLI:
    """Parse `argv` (a subcommand first when run=True) and build every component; run it if asked.
    `startup` records how far the start got (grpokit.main prints errors before that as one line)."""
    cls = type(f"GrpoCLI_{role}", (GrpoCLI,), {"role": role, "startup": startup or Startup()})
    return cls(
        Policy,
        Orchestrator,
        args=argv,
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_class=GrpoArgumentParser.for_command(f"grpokit {role}"),
    )
