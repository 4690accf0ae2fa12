"""Orchestrator: the LightningDataModule of the recipe's `data` section, and the trainer's batch stream.

Its keys (the recipe's `data.*`) become RolloutSettings (grpokit.orchestrator.settings: plain data,
checked when built), held as `settings`; the DataModule itself is the trainer's side: its dataloader
receives one TrainingBatch per step from the transport. The producer is a RolloutLoop
(grpokit.orchestrator.loop), made from the settings by connect(): in `grpokit fit` it runs in a
background thread (start()), in `grpokit orchestrate` in its own process.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Literal

import lightning as L

from grpokit.advantage import Advantage
from grpokit.broadcast import WeightBroadcast
from grpokit.common.collectives import rank_and_world
from grpokit.common.errors import RunDataError
from grpokit.common.run_context import RunContext
from grpokit.common.waits import WaitNotice
from grpokit.environments.environment import EnvSpec
from grpokit.filter import Filter
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.orchestrator.buffer import BufferSettings
from grpokit.orchestrator.evaluation import EvalSettings
from grpokit.orchestrator.experts import ExpertSettings
from grpokit.orchestrator.kl_reward import KLInRewardSettings
from grpokit.orchestrator.loop import RolloutLoop
from grpokit.orchestrator.schedules import TemperatureSchedule
from grpokit.orchestrator.settings import RolloutInputs, RolloutSettings, load_inputs
from grpokit.orchestrator.streaming import StreamingSettings
from grpokit.transport import Transport, checked_step, share_batch
from grpokit.transport.filesystem import FilesystemTransport
from grpokit.types import TrainingBatch
from grpokit.vision.images import PixelBudget

log = logging.getLogger(__name__)


class Orchestrator(L.LightningDataModule):
    """Samples rollouts, scores them and hands packed batches to the trainer."""

    def __init__(
        self,
        env: list[EnvSpec] | None = None,
        batch_size: int | None = None,
        rollouts_per_example: int | None = None,
        advantage: Advantage | None = None,
        filters: list[Filter] | None = None,
        transport: Transport | None = None,
        sampling: SamplingSettings | None = None,
        temp_scheduler: TemperatureSchedule | None = None,
        seq_len: int = 2048,
        max_prompt_tokens: int | None = None,
        packing: Literal["auto", "tokens", "prefix_tree"] = "auto",
        max_async_level: int = 1,
        deterministic: bool = True,
        max_off_policy_steps: int = 8,
        seed: int | None = None,
        buffer: BufferSettings | None = None,
        eval: EvalSettings | None = None,
        num_logged_samples: int = 4,
        timeout: float = 1800.0,
        weights_timeout: float | None = None,
        generation_batch_size: int | None = None,
        steps_per_generation: int | None = None,
        num_generations: int | None = None,
        num_iterations: int = 1,
        expert: ExpertSettings | None = None,
        kl_in_reward: KLInRewardSettings | None = None,
        max_turns: int = 8,
        streaming: StreamingSettings | None = None,
        pixel_budget: PixelBudget | None = None,
    ) -> None:
        """
        Args:
            env: environments to draw prompts from (default: reverse-text).
            batch_size: rollouts per optimizer step (prompts per step * rollouts_per_example; default 32).
            rollouts_per_example: completions sampled per prompt (the GRPO group size G; default 8).
            advantage: turns a group's rewards into advantages (kind `advantage`; default GroupNorm).
            filters: rollout filters (kind `filter`); enforcing ones mask flagged rollouts from the loss.
            transport: carries batches to the trainer (kind `transport`; default FilesystemTransport).
            sampling: temperature, top_p, max_tokens, stop, seed.
            temp_scheduler: per-step temperature (linear or cosine); excludes sampling.temperature.
            seq_len: tokens per packed micro-batch (its distinct prefixes with packing prefix_tree).
            max_prompt_tokens: prompts with more tokens (chat template applied) are skipped and counted in
                prompts_too_long (grpokit.orchestrator.prompt_length); null = what fits: seq_len, or the
                engine's context if smaller, minus sampling.max_tokens.
            packing: what seq_len counts: "tokens", or "prefix_tree" nodes (distinct prefixes) for a
                trainer that runs each shared prefix once (model.share_prefixes); "auto" = prefix_tree
                when this process's trainer shares prefixes (co-locate fit on one device; with DDP the
                fewer micro-batches would leave ranks idle), else tokens. Set
                prefix_tree for `grpokit orchestrate` only when the trainer shares prefixes: a packed-row
                trainer would get micro-batches of up to G x seq_len tokens.
            max_async_level: how many steps the engine's weights may lag the trainer (k >= 0).
            deterministic: sample the batch of step n with exactly the weights of step max(0, n - k), even
                when newer ones are published, and load them into a stream at a point fixed by the
                schedule, so two runs of a recipe and seed give the same rollouts, losses and checkpoints
                (grpokit.orchestrator.weights.WeightSchedule). false: the newest weights as soon as they
                are published (a little more throughput; which weights sample a batch depends on timing).
            max_off_policy_steps: groups sampled more than this many steps before the step that would
                train on them are dropped (counted in dropped_off_policy_groups); matters when a
                generation feeds several steps (steps_per_generation, num_iterations).
            buffer: which groups are trained on (online difficulty filtering, dynamic sampling), which
                examples are sampled (easy/hard pools, dedup by hash_keys), skip_verification.
            eval: online evaluation every few steps (null disables it).
            seed: seed of the prompt order (and of sampling, unless data.sampling.seed is set). null =
                seed_everything, so replicates over seed_everything differ in prompts and rollouts.
            num_logged_samples: completions per step written to samples.jsonl.
            timeout: seconds to wait for weights (orchestrator) or a batch (trainer) before failing.
            weights_timeout: seconds the orchestrator waits for fresh enough weights (a trainer step plus
                its publish); null = data.timeout.
            generation_batch_size: rollouts sampled per generation (ms-swift); = batch_size * steps_per_generation.
            steps_per_generation: optimizer steps one generation is split into (ms-swift/TRL).
            num_generations: alias of rollouts_per_example (ms-swift/TRL).
            num_iterations: optimizer passes over each generation (GRPO's mu; the importance ratio corrects
                for the weights moving in between).
            expert: expert completions for losses that learn from demonstrations (Chord): one per group,
                the example's reference answer (`{field, template}`), or `per_step` records a step of a
                separate SFT dataset (`{path, fields, per_step}`, as ms-swift's chord_sft_dataset; the
                records are rendered as `grpokit sft` renders them, only assistant tokens trained, those
                over seq_len dropped); null adds none.
            kl_in_reward: `{coef, estimator}`: each rollout's reward for the advantages becomes reward -
                coef * KL_seq, the KL estimator summed over its trained tokens, engine logprobs against
                the initial model (verl's use_kl_in_reward; grpokit.orchestrator.kl_reward); null = off.
            max_turns: the most assistant turns of a multi-turn rollout (environments with tools or a
                `respond` method; a task's own `max_turns` wins); its tokens also fit seq_len
                (grpokit.environments.multi_turn). Single-turn environments ignore it.
            streaming: stream rollouts (grpokit.orchestrator.streaming): `max_inflight` groups in the
                engine at once, new ones submitted as others finish, a step's batch the first groups that
                pass, new weights loaded between two decode steps (`on_update`: continue or regenerate
                the unfinished rollouts). null = whole-batch generation.
            pixel_budget: `{max_pixels, over_budget}` of the images in prompts (docs/vision.md): an image
                of more than max_pixels (width x height) is scaled down to fit, aspect ratio kept
                (`over_budget: resize`), or its prompt skipped as a bad image (`refuse`); null = no limit
                but the model processor's own.
        """
        super().__init__()
        self.settings = RolloutSettings.from_recipe(
            env=env,
            batch_size=batch_size,
            rollouts_per_example=rollouts_per_example,
            advantage=advantage,
            filters=filters,
            sampling=sampling,
            seed=seed,
            buffer=buffer,
            eval=eval,
            generation_batch_size=generation_batch_size,
            steps_per_generation=steps_per_generation,
            num_generations=num_generations,
            num_iterations=num_iterations,
            temp_scheduler=temp_scheduler,
            seq_len=seq_len,
            max_prompt_tokens=max_prompt_tokens,
            packing=packing,
            max_async_level=max_async_level,
            deterministic=deterministic,
            max_off_policy_steps=max_off_policy_steps,
            num_logged_samples=num_logged_samples,
            timeout=timeout,
            weights_timeout=weights_timeout,
            expert=expert,
            kl_in_reward=kl_in_reward,
            max_turns=max_turns,
            streaming=streaming,
            pixel_budget=pixel_budget,
        )
        self.transport = FilesystemTransport() if transport is None else transport
        self.loop: RolloutLoop | None = None  # the producer, once connect() gives it an engine
        self.inputs: RolloutInputs | None = None  # prepare()
        self.run_dir: Path | None = None  # connect_trainer sets these three
        self.max_steps, self.start_step = 0, 0
        self._thread: threading.Thread | None = None  # the loop's thread in co-locate mode
        self._error: BaseException | None = None  # what ended that thread, for receive()
        self.stop_requested = lambda: False  # StopOnInterrupt: a signal asks `grpokit train` to stop waiting

    # ---- wiring (done by the CLI) -------------------------------------------------------------------
    def prepare(self, tokenizer) -> RolloutInputs:
        """The environments, data.expert's source and the filters, loaded with the policy's tokenizer
        (grpokit.orchestrator.settings.load_inputs) once: the roles that sample call it before the engine
        loads the model, so a bad dataset or filter setting stops the start in seconds; connect() and
        `grpokit eval` reuse what it loaded."""
        if self.inputs is None:
            self.inputs = load_inputs(self.settings, tokenizer)
        return self.inputs

    def connect(
        self,
        engine: InferenceEngine,
        broadcast: WeightBroadcast,
        tokenizer,
        run: RunContext,
        max_steps: int,
        *,
        trainer_shares_prefixes: bool = False,
        reference_model: str | None = None,
    ) -> RolloutLoop:
        """Both sides: the trainer's (connect_trainer) and the rollout loop, which samples by
        `self.settings` from what prepare() loaded, given its engine, broadcast, tokenizer, the run (its
        folder, the step it starts at, whether to restore the easy/hard pools) and the policy's model name
        (grpokit.orchestrator.loop.RolloutLoop has the details)."""
        self.connect_trainer(run.run_dir, max_steps, run.start_step)
        self.loop = RolloutLoop(
            self.settings,
            self.prepare(tokenizer),
            engine,
            broadcast,
            tokenizer,
            self.transport,
            run,
            max_steps,
            trainer_shares_prefixes=trainer_shares_prefixes,
            reference_model=reference_model,
        )
        self.max_steps = self.loop.max_steps  # trainer.max_steps -1: the loop's count of one pass
        return self.loop

    def connect_trainer(self, run_dir: Path, max_steps: int, start_step: int = 0) -> None:
        """Only the trainer's side: receive batches start_step .. max_steps - 1 (`grpokit train`)."""
        self.run_dir, self.max_steps, self.start_step = Path(run_dir), max_steps, start_step
        self.transport.setup(run_dir)

    def start(self, first_step: int | None = None, after: threading.Event | None = None) -> None:
        """Run the rollout loop in a thread (co-locate mode), from `first_step` (default start_step).

        `after`: the thread touches the engine only once this is set (`grpokit fit` sets it when training
        starts: grpokit.trainer.callbacks.ReleaseRolloutThread says why).
        Not a daemon thread: the interpreter waits for it at exit instead of finalizing under a generation
        in progress, which aborts the process. Every way out of training stops it (on_train_end through
        StopRolloutThread, teardown, on_exception), so the wait is at most the rest of one generation."""
        args = (first_step, after)
        self._thread = threading.Thread(target=self._run_guarded, args=args, name="grpokit-orchestrator")
        self._thread.start()

    def _run_guarded(self, first_step: int | None, after: threading.Event | None = None) -> None:
        try:
            while after is not None and not after.wait(0.05):
                if self.loop.stopping.is_set():
                    return  # training ended before it started
            self.loop.run(first_step)
        except BaseException as e:  # surfaced to the trainer thread by receive()
            if self.loop.stopping.is_set():  # the trainer ended (done, Ctrl-C, its own error) and stopped it
                log.info("rollout thread stopped: %s", e)
                return
            if not isinstance(e, (RunDataError, OSError)):  # those `grpokit` prints as one line (main.entry)
                log.exception("orchestrator failed")
            self._error = e

    def stop(self) -> None:
        """End the rollout thread (co-locate mode) and wait for it; it stops at its next step or weight
        poll. Called at teardown and when training fails: a thread still inside torch when the interpreter
        exits aborts the process ("terminate called without an active exception")."""
        if self.loop is not None:
            self.loop.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                log.warning("the rollout thread did not stop within 60 s: the process ends once its generation does")

    def on_exception(self, exception: BaseException) -> None:
        self.stop()  # Lightning calls no teardown hook on this path

    # ---- the trainer's side -----------------------------------------------------------------------
    def train_dataloader(self):
        return BatchStream(self)

    def receive(self, step: int) -> TrainingBatch | None:
        """The batch for `step`, failing fast if the rollout thread died; None once `stop_requested` in
        `grpokit train` (SIGTERM, Ctrl-C: another process's batch may never come)."""
        deadline = time.monotonic() + self.settings.timeout
        source = type(self.transport).__name__
        notice = WaitNotice(f"waiting for the batch of step {step} from `grpokit orchestrate` ({source})")
        while True:
            if self._error is not None:
                raise RuntimeError(f"the orchestrator failed: {self._error!r}") from self._error
            try:
                return checked_step(self.transport.receive(step, timeout=1.0), step, self.transport)
            except TimeoutError as e:
                if self._thread is None:  # `grpokit train`: the orchestrator is another process
                    notice.tick()
                    if self.stop_requested():
                        return None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no batch for step {step} after {self.settings.timeout:.0f}s (data.timeout): "
                        "the orchestrator (`grpokit orchestrate`, or the rollout thread of "
                        f"`grpokit fit`) sent none. The transport says: {e}"
                    ) from None

    def teardown(self, stage: str) -> None:
        self.stop()
        self.transport.close()


class BatchStream:
    """The trainer's dataloader: batch `step` for step = start_step, start_step + 1, ...

    With several trainer ranks (DDP) only rank 0 reads the transport and sends each batch to the
    others over the trainer's process group (grpokit.transport.share_batch).
    """

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    def __iter__(self):
        rank, world = rank_and_world()
        step = self.orchestrator.start_step
        while step < self.orchestrator.max_steps:
            batch = self.orchestrator.receive(step) if rank == 0 else None
            yield share_batch(batch) if world > 1 else batch
            step += 1
