"""GrpoCLI: the LightningCLI behind `grpokit fit | train | infer | orchestrate`, over one YAML recipe.

A recipe has Lightning's sections (model = Policy, data = Orchestrator, trainer) plus `inference` (the
engine), `broadcast` (trainer -> engine weights), `output_dir` and `run_name`. Each run writes
`{output_dir}/{run_name}/`: config.yaml (the resolved recipe), metrics.csv, samples.jsonl, and the
rollouts/ and broadcasts/ folders the roles talk through.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from jsonargparse import lazy_instance
from lightning.pytorch import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from grpokit.broadcast import WeightBroadcast
from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.cli.checks import check_recipe, check_vision_engine, fill_seeds
from grpokit.cli.component_args import reset_carried_init_args
from grpokit.cli.env_args import reset_carried_env_args
from grpokit.cli.errors import GrpoArgumentParser
from grpokit.cli.roles import ServerSettings, first_unsent_step
from grpokit.cli.stages import add_sft_section, init_from_sft_stage
from grpokit.cli.summary import recipe_args, run_summary
from grpokit.inference import InferenceEngine
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.vllm.launch import start_for_fit
from grpokit.orchestrator import Orchestrator
from grpokit.orchestrator.kl_reward import warn_if_loss_has_kl
from grpokit.orchestrator.pools import restart_log
from grpokit.run import RunContext, Startup, open_run, start_engine
from grpokit.trainer.callbacks import (
    ReleaseRolloutThread,
    ShareBaseWeights,
    StopOnInterrupt,
    StopRolloutThread,
    WeightSync,
)
from grpokit.trainer.checkpoint import (
    Checkpointer,
    CheckpointSettings,
    LoadWeights,
    archive_abandoned_history,
    archive_progress,
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
    resolve_only = False  # parse_recipe: stop after parsing, with the resolved recipe
    run: RunContext  # set by before_instantiate_classes

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse the recipe (as LightningCLI does, minus its warning about `args` beside sys.argv: grpokit
        always passes its own argv), then reset what a swapped component carried over from the class it
        replaced (grpokit.cli.component_args); `--print_config[=flags]` prints the recipe after that."""
        printing = [a for a in args if a == "--print_config" or a.startswith("--print_config=")]
        args = [a for a in args if a not in printing]
        self.recipe = recipe_args(args)  # for the end-of-run summary's eval command
        self.config = parser.parse_args(args)
        sub = self.config.get("subcommand")
        config, subparser = (self.config[sub], self._subcommand_parsers[sub]) if sub else (self.config, parser)
        reset_carried_init_args(args, config, subparser.get_defaults())
        reset_carried_env_args(args, config)
        if self.resolve_only:
            fill_seeds(config)  # what the run will use: a sweep and a replay compare resolved recipes
            raise _Resolved(subparser.dump(config, skip_unset=False, skip_default=False, with_comments=False))
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

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        """Lightning's parser; without a subcommand (infer, orchestrate, eval) it also takes the fit
        subcommand's own keys (ckpt_path, weights_only), which a run's saved config.yaml holds, so that file
        serves every command; they are ignored there."""
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if not add_subcommands:
            self.parser.add_method_arguments(self.trainer_class, "fit", skip=set(self.subcommands()["fit"]))

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:

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
        add_sft_section(parser)  # a pipeline recipe's SFT stage (grpokit.cli.stages)
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
                # Lightning's table of the one module (the policy) and its FLOPs, always 0: with
                # GRPOKIT_LOG_LEVEL=DEBUG, as the other start-up notices grpokit.main quiets
                "trainer.enable_model_summary": log.isEnabledFor(logging.DEBUG),
            }
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_recipe(config, self.role)  # values that go wrong only together, the run folder's place, the seeds
        init_from_sft_stage(config)  # a pipeline recipe: GRPO starts from its SFT stage's run
        check_strategy_name(config.trainer.strategy)
        self.run = open_run(config, self.role, trains=bool(self.subcommand), startup=self.startup)
        config.trainer.default_root_dir = str(self.run.run_dir)
        config.trainer.logger = with_csv_logger(
            config.trainer.logger, self.run.run_dir, self.run.start_step if self.run.resuming else None
        )
        if config.num_threads:
            torch.set_num_threads(config.num_threads)

    def before_fit(self) -> None:
        use_step_progress_bar(self.trainer)  # "GRPO step 12/50", not Lightning's "Epoch 0/-2"
        self._wire_roles()
        # the model is built (and its LoRA targets checked) inside trainer.fit: once training starts, an
        # error is a training failure and its traceback is printed
        self.trainer.callbacks.append(MarkStarted(self.startup))

    def _wire_roles(self) -> None:
        config, run = self.config_init[self.subcommand], self.run
        self.model.publish_probe = getattr(config["inference"], "checks_probe", False)  # VLLMEngine: weight probe
        check_vision_engine(self.model, config["inference"])
        check_trainer_processes(self.trainer, run.run_name_given)
        if self.trainer.max_steps == -1 and self.trainer.world_size > 1:  # every rank refuses, none waits
            raise ValueError(
                "trainer.max_steps -1 (one pass over the data) is counted on one trainer process; with "
                f"{self.trainer.world_size}, set the number (a one-process `grpokit fit` start logs it)"
            )
        if run.restart_from is not None:
            self._restart_count(*run.restart_from)
        if run.resuming and self.trainer.is_global_zero:
            self._archive_abandoned_history()
        if self.role == "train" or not self.trainer.is_global_zero:
            # batches come from `grpokit orchestrate` (or, on DDP ranks > 0, from rank 0); rank 0 publishes weights
            config["broadcast"].setup(run.run_dir)
            self._discard_stale_weights(config["broadcast"])
            self.datamodule.connect_trainer(run.run_dir, self.trainer.max_steps, run.start_step)
            self.trainer.callbacks.append(WeightSync(config["broadcast"]))
            self._stop_on_interrupt()
            self._add_checkpointer(config)
            return
        engine: InferenceEngine = config["inference"]
        broadcast: WeightBroadcast = config["broadcast"]
        tokenizer = start_engine(engine, broadcast, self.model, run.run_dir, self.datamodule)
        self._discard_stale_weights(broadcast)
        self.datamodule.connect(
            engine,
            broadcast,
            tokenizer,
            run,
            self.trainer.max_steps,
            # DDP: keep a micro-batch per rank
            trainer_shares_prefixes=self.model.share_prefixes and self.trainer.world_size == 1,
            reference_model=self.model.model_name,  # data.kl_in_reward's reference: the initial policy
        )
        warn_if_loss_has_kl(self.datamodule.settings.kl_in_reward, self.model.loss)
        if self.trainer.max_steps == -1:
            self._one_pass(self.datamodule.max_steps)
        if getattr(engine, "share_weights", False) and self.model.lora is not None:
            # before WeightSync: shared before the first publish
            self.trainer.callbacks.append(ShareBaseWeights(engine))
        release = ReleaseRolloutThread()  # after ShareBaseWeights
        self.trainer.callbacks.append(release)
        self.trainer.callbacks.append(WeightSync(broadcast))
        self.trainer.callbacks.append(StopRolloutThread(self.datamodule.stop))
        self._stop_on_interrupt()  # before the rollout thread starts: no Ctrl-C reaches Lightning's handler
        self._add_checkpointer(config)
        vllm = start_for_fit(self, engine, broadcast, config["server"])  # VLLMEngine with `serve`: fit runs vLLM itself
        if vllm is not None:
            self.trainer.callbacks.append(vllm)  # last: it stops vLLM after WeightSync's final publish
        # resumed: batches the killed run sent are still on disk (kept from its checkpoint on); train on
        # them rather than sample those steps again with weights newer than the steps
        first = first_unsent_step(self.datamodule, run.start_step) if run.start_step else None
        self.datamodule.start(first, after=release.ready)

    def after_fit(self) -> None:
        """Exit code 130 after a Ctrl-C, 143 after SIGTERM (grpokit.main reads `interrupt`); rank 0 of a
        run that trained a step prints the summary: rewards, checkpoint, and how to export and evaluate it
        (grpokit.cli.summary)."""
        self.startup.interrupted = self.interrupt.stopped_at is not None
        trainer = self.trainer
        if trainer.is_global_zero and trainer.global_step > self.run.start_step:
            summary = run_summary(
                self.run.run_dir,
                self.recipe,
                trainer.global_step,
                trainer.max_steps,
                self.startup.interrupted,
                self.interrupt.signal_name,
            )
            print(summary, end="", flush=True)

    def _stop_on_interrupt(self) -> None:
        """Ctrl-C or SIGTERM stops training after the current step (StopOnInterrupt); added before the Checkpointer,
        whose hook of that step then writes its checkpoint."""
        self.interrupt = StopOnInterrupt()
        self.interrupt.install()
        self.trainer.callbacks.append(self.interrupt)

    def _archive_abandoned_history(self) -> None:
        """A resume abandons what a killed or earlier run wrote after its checkpoint (grpokit.trainer.
        checkpoint.archive_abandoned_history): later checkpoints, and in `fit` the batches not to train on.
        `grpokit train` leaves rollouts/ alone: `grpokit orchestrate` writes there."""
        step = self.run.start_step
        if archive := archive_abandoned_history(self.run.run_dir, step, batches=self.role == "fit"):
            log.warning("resuming at step %d: the files of the run after it moved to %s", step, archive)

    def _one_pass(self, steps: int) -> None:
        """trainer.max_steps -1: train the steps of one pass over the data, as the rollout loop counted
        them (the lr and noise schedules run over them too)."""
        self.trainer.fit_loop.epoch_loop.max_steps = steps  # what trainer.max_steps reads
        log.warning("trainer.max_steps -1: one pass over the data is %d GRPO steps", steps)

    def _discard_stale_weights(self, broadcast: WeightBroadcast) -> None:
        """Weights of steps >= start_step in the run folder are a killed run's (or an earlier run's): this
        trainer publishes its own, so no engine samples a batch with weights newer than the batch's step."""
        if self.trainer.is_global_zero:
            broadcast.discard_after(self.run.start_step - 1)

    def _restart_count(self, path: Path, step: int) -> None:
        """ckpt.skip_progress: archive the earlier count's files, keep its easy/hard pools (unless
        ckpt.skip_buffer), and load the checkpoint's weights when fit starts. Global rank 0 alone
        archives; every rank loads the weights from the archive (LoadWeights)."""

        if self.trainer.is_global_zero:
            archive = archive_progress(self.run.run_dir)
            settings = self.datamodule.settings
            if settings.buffer.uses_pools:
                generation = settings.shape.locate(step)[0] if self.run.restore_buffer else None
                restart_log(self.run.run_dir / "buffer.jsonl", generation)
            print(
                "ckpt.skip_progress: counting from step 0 with the weights "
                f"of {path.name}; the earlier files are in {archive}",
                file=sys.stderr,
            )
        self.trainer.callbacks.append(LoadWeights(self.run.run_dir, Path("checkpoints") / path.name))

    def _add_checkpointer(self, config) -> None:
        settings: CheckpointSettings = config["ckpt"]
        if settings.interval:
            self.trainer.callbacks.append(
                Checkpointer(self.run.run_dir / "checkpoints", settings, self.datamodule.transport)
            )


class MarkStarted(Callback):
    """Records in `startup` that training began (grpokit.main prints errors before that as one line)."""

    def __init__(self, startup: Startup) -> None:
        self.startup = startup

    def on_train_start(self, trainer, pl_module) -> None:
        self.startup.started = True


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
    return _construct(cls, argv, run, GrpoArgumentParser.for_command(f"grpokit {role}"))


def parse_recipe(argv: list[str]) -> str:
    """The resolved recipe (YAML) of `grpokit fit argv`: the recipe files, overlays and flags parsed and
    checked, every default filled in, component swaps reset (grpokit.cli.component_args), nothing
    built. A recipe that does not parse raises RecipeError (a ValueError) with the parser's one-line
    message and its did-you-mean. What a sweep resolves each run with before launching any."""
    cls = type("GrpoCLI_resolve", (GrpoCLI,), {"resolve_only": True, "startup": Startup()})
    try:
        _construct(cls, ["fit", *argv], True, GrpoArgumentParser.for_command("grpokit fit", raise_errors=True))
    except _Resolved as resolved:
        return resolved.recipe
    raise AssertionError("GrpoCLI.parse_arguments returns the resolved recipe before anything is built")


def _construct(cls: type[GrpoCLI], argv: list[str], run: bool, parser_class) -> GrpoCLI:
    return cls(
        Policy,
        Orchestrator,
        args=argv,
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_class=parser_class,
    )


class _Resolved(Exception):  # noqa: N818 (control flow, not an error)
    """parse_recipe's way out of LightningCLI's constructor once the recipe is parsed."""

    def __init__(self, recipe: str) -> None:
        super().__init__("recipe resolved")
        self.recipe = recipe
