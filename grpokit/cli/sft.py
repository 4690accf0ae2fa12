"""`grpokit sft --config recipe.yaml`: supervised fine-tuning on `grpokit fit`'s recipe surface.

The same LightningCLI as `fit` (GrpoCLI: parsing, component swaps, --print_config, the run folder,
resume with --ckpt.resume_step -1, metrics.csv and the recipe's loggers, DDP/FSDP2 `trainer.*`), built
with SFTPolicy (the trainer's Policy: `model.*` as in fit, `model.loss` NLL by default) and SFTData
(`data.*`: grpokit/sft/). No engine, broadcast or orchestrator: the recipe has no `inference`,
`broadcast` or `server` section. The run folder holds config.yaml, metrics.csv, checkpoints/ and,
once trainer.max_steps is reached, model/ (what `grpokit fit` starts from with `model.init_from`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from jsonargparse import lazy_instance
from lightning.pytorch.cli import LightningArgumentParser

from grpokit.cli.checks import check_max_steps, check_run_location, fill_seeds
from grpokit.cli.errors import GrpoArgumentParser
from grpokit.cli.lightning_cli import GrpoCLI, MarkStarted, with_csv_logger
from grpokit.cli.stages import sft_stage_argv
from grpokit.registry.losses.nll import NLL
from grpokit.run import Startup, open_run
from grpokit.sft.datamodule import SFTData
from grpokit.trainer.checkpoint import Checkpointer, CheckpointSettings, LoadWeights, archive_progress
from grpokit.trainer.distributed import check_strategy_name, check_trainer_processes
from grpokit.trainer.progress import use_step_progress_bar
from grpokit.trainer.sft import SaveSFTModel, SFTEval, SFTPolicy

log = logging.getLogger(__name__)


class SftCLI(GrpoCLI):
    """GrpoCLI for `grpokit sft`: the recipe's model, data, trainer, ckpt and run sections only."""

    role = "sft"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--output_dir", type=str, default="outputs", help="Folder that holds one run per subfolder."
        )
        parser.add_argument("--run_name", type=str | None, default=None, help="Run folder (default run_<time>).")
        parser.add_argument("--num_threads", type=int | None, default=None, help="torch CPU threads.")
        parser.add_class_arguments(CheckpointSettings, "ckpt")
        parser.set_defaults(
            {
                "model.loss": lazy_instance(NLL),
                "trainer.max_steps": 20,
                "trainer.log_every_n_steps": 1,
                "trainer.enable_checkpointing": False,
                "trainer.devices": 1,
                "trainer.num_sanity_val_steps": 0,
                "trainer.enable_model_summary": False,
            }
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_max_steps(config.trainer.max_steps, "fit")  # -1: one pass over the examples
        check_run_location(config.output_dir, config.run_name)
        check_strategy_name(config.trainer.strategy)
        fill_seeds(config)
        self.run = open_run(config, "fit", trains=True, startup=self.startup)
        config.trainer.default_root_dir = str(self.run.run_dir)
        resume = self.run.start_step if self.run.resuming else None
        config.trainer.logger = with_csv_logger(config.trainer.logger, self.run.run_dir, resume)
        if config.num_threads:
            import torch

            torch.set_num_threads(config.num_threads)

    def before_fit(self) -> None:
        """Read and render the data (a bad example stops the start before the model loads), then the
        callbacks: Ctrl-C, checkpoints, evaluation, and the final model folder."""
        use_step_progress_bar(self.trainer, "SFT step")  # not "GRPO step"
        check_trainer_processes(self.trainer, self.run.run_name_given)
        config, run, data = self.config_init[self.subcommand], self.run, self.datamodule
        if run.restart_from is not None:  # ckpt.skip_progress: the checkpoint's weights, a new count
            path, _ = run.restart_from
            if self.trainer.is_global_zero:
                log.warning("ckpt.skip_progress: earlier files moved to %s", archive_progress(run.run_dir))
            self.trainer.callbacks.append(LoadWeights(run.run_dir, Path("checkpoints") / path.name))
        if run.resuming and self.trainer.is_global_zero:
            self._archive_abandoned_history()
        data.prepare(data.tokenizer_for(self.model.model_name))
        steps = data.connect(self.trainer.max_steps, run.start_step)
        if self.trainer.max_steps == -1:
            self.trainer.fit_loop.epoch_loop.max_steps = steps  # what trainer.max_steps reads
            log.warning("trainer.max_steps -1: one pass over the examples is %d SFT steps", steps)
        self._stop_on_interrupt()
        if config["ckpt"].interval:
            self.trainer.callbacks.append(Checkpointer(run.run_dir / "checkpoints", config["ckpt"]))
        if data.eval_examples:
            self.trainer.callbacks.append(SFTEval(data.eval_batch(), data.eval_interval))
        self.trainer.callbacks.append(SaveSFTModel(run.run_dir / "model"))
        self.trainer.callbacks.append(MarkStarted(self.startup))

    def after_fit(self) -> None:
        self.startup.interrupted = self.interrupt.stopped_at is not None  # grpokit.main exits with 130 or 143


def make_sft_cli(argv: list[str], run: bool = True, startup: Startup | None = None) -> SftCLI:
    """Parse `argv` (the options after `grpokit sft`), build SFTPolicy and SFTData, and train (unless
    `run` is False: parse and build only)."""
    cls = type("SftCLI_run", (SftCLI,), {"startup": startup or Startup()})
    argv = sft_stage_argv(argv)  # a pipeline recipe's `sft:` section is this command's recipe
    return cls(
        SFTPolicy,
        SFTData,
        args=["fit", *argv] if run else argv,
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_class=GrpoArgumentParser.for_command("grpokit sft"),
    )
