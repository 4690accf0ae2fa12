"""The rollout loop: the producer side of the orchestrator. For each step: wait for fresh enough
weights, sample and score a generation's groups, turn rewards into advantages, flag rollouts, pack
them into micro-batches and send the batch to the trainer.

Scheduling follows max_async_level k: the batch for step n is sampled with weights of a step
>= max(0, n - k), so the engine may run up to k steps ahead of the trainer. `grpokit fit` runs the loop
in a thread beside the trainer; `grpokit orchestrate` runs it in its own process.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpokit.broadcast import WeightBroadcast
from grpokit.common.run_context import RunContext
from grpokit.common.timeline import record_timeline
from grpokit.environments.environment import UnscoredEnvironment
from grpokit.filter import flag_all
from grpokit.inference import InferenceEngine
from grpokit.judges import attach_run
from grpokit.judges.launch import start_judge_servers, stop_judge_servers
from grpokit.orchestrator.accounting import RECORD, accounted_before, append_record, read_records, repair, step_record
from grpokit.orchestrator.driver import RolloutDriver
from grpokit.orchestrator.evaluation import Evaluator
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.kl_reward import KLInReward, ReferenceScorer
from grpokit.orchestrator.packing import num_positions, pack
from grpokit.orchestrator.pools import DifficultyPools, hash_key
from grpokit.orchestrator.prompt_length import prompt_token_limit
from grpokit.orchestrator.prompts import PromptSampler
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.orchestrator.settings import RolloutInputs, RolloutSettings
from grpokit.orchestrator.stats import batch_metrics
from grpokit.orchestrator.weights import WeightSchedule
from grpokit.transport import Transport
from grpokit.types import Rollout, TrainingBatch

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """One generation's sampled groups: every group sampled (what the metrics describe) and the groups
    kept for training, with the time it took and the eval metrics taken before it."""

    index: int
    generated: list[list[Rollout]]
    kept: list[list[Rollout]]
    gen_time: float
    eval_metrics: dict[str, float]
    prompts_too_long: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)  # positions never sampled, by rule (accounting)


def attach_judges(envs: list, run_dir: Path) -> list:
    """The judges of `envs` keep their replies in the run folder (a resume scores as the first run did),
    and those with `serve` get their `grpokit judge` started (grpokit.judges.launch); returns those."""
    attach_run(envs, run_dir)
    return start_judge_servers(envs, run_dir)


class RolloutLoop:
    """Produces the TrainingBatch of every step by `settings` (the recipe's `data` section) from `inputs`
    (the environments and experts the settings name, loaded: grpokit.orchestrator.settings.load_inputs),
    an engine, the weight broadcast, the policy's tokenizer and the transport it sends the batches by.

    `run`: the run folder, and the step it starts at (start_step). The easy/hard pools are restored as
    they were when the batch of start_step was sampled, or start empty with run.restore_buffer False
    (ckpt.skip_buffer). `trainer_shares_prefixes`: the trainer in this process runs each shared prefix
    once (data.packing auto then packs by prefix-tree nodes). `reference_model`: the policy's initial
    model (`model.model`), which data.kl_in_reward scores against.
    """

    def __init__(
        self,
        settings: RolloutSettings,
        inputs: RolloutInputs,
        engine: InferenceEngine,
        broadcast: WeightBroadcast,
        tokenizer,
        transport: Transport,
        run: RunContext,
        max_steps: int,
        *,
        trainer_shares_prefixes: bool = False,
        reference_model: str | None = None,
    ) -> None:
        self.settings, self.shape, self.inputs = settings, settings.shape, inputs
        self.engine, self.broadcast, self.tokenizer, self.transport = engine, broadcast, tokenizer, transport
        self.run_dir, self.max_steps, self.start_step = Path(run.run_dir), max_steps, run.start_step
        self.turns = TurnLimits(settings.max_turns, settings.seq_len, settings.pixel_budget)  # multi-turn limits
        self.pack_trees = settings.packing == "prefix_tree" or (settings.packing == "auto" and trainer_shares_prefixes)
        self.schedule = WeightSchedule(
            engine,
            broadcast,
            settings.max_async_level,
            self.shape.steps_per_rollout_generation,
            settings.deterministic,
            settings.weights_timeout or settings.timeout,
            "data.weights_timeout" if settings.weights_timeout else "data.timeout",
        )
        if hasattr(engine, "pin_weights"):  # RemoteEngine: each request asks for at most the step held, in order
            engine.pin_weights = settings.deterministic
        scored = inputs.training
        self.judge_servers = attach_judges([*scored, *(inputs.evaluation or [])], self.run_dir)
        self.envs = [UnscoredEnvironment(env) for env in scored] if settings.buffer.skip_verification else scored
        self.pools = self._restored_pools(run.restore_buffer)
        self.prompts = self._prompt_sampler()
        if max_steps == -1:  # trainer.max_steps -1: one pass over the data
            self.max_steps = self.one_pass_steps()
        self.images = self._image_prompts(inputs.evaluation or scored)  # None: no prompt has images
        self.prompt_limit = prompt_token_limit(
            settings.sampling.max_tokens, settings.seq_len, engine.context_length(), settings.max_prompt_tokens
        )
        self.evaluator = None
        if settings.eval_settings:
            self.evaluator = Evaluator(
                settings.eval_settings,
                inputs.evaluation or scored,
                settings.sampling,
                self.run_dir,
                self.start_step,
                self.turns,
                self.images,
            )
        self.kl_reward = None  # data.kl_in_reward: the reference loads on first use
        if settings.kl_in_reward is not None:
            scorer = ReferenceScorer(reference_model, row_tokens=settings.seq_len)
            self.kl_reward = KLInReward(settings.kl_in_reward, scorer)
        self.stopping = threading.Event()  # set by the trainer's side to end the loop
        self.announce = False  # `grpokit orchestrate`: log each batch sent and a long wait for weights
        self.generation: Generation | None = None  # the newest generation sampled
        self.driver = RolloutDriver(self, settings.streaming)  # whole-batch or streamed: the one producer

    def _image_prompts(self, evaluated: list) -> ImagePrompts | None:
        """The processor's renderer when prompts of data.env hold images (grpokit.orchestrator.image_prompts),
        refusing at start what cannot sample or train them yet."""
        settings = self.settings
        evaluated = evaluated if settings.eval_settings else []
        training = self.inputs.training
        return ImagePrompts.for_envs(self.tokenizer, training, evaluated, self.engine, settings.pixel_budget)

    def _restored_pools(self, restore_buffer: bool) -> DifficultyPools | None:
        settings = self.settings
        if not settings.buffer.uses_pools:
            return None
        pools = DifficultyPools(settings.buffer, self.run_dir / "buffer.jsonl", settings.seed)
        returned = pools.resume(self.shape.locate(self.start_step)[0], restore_buffer)
        log.info("easy/hard pools restored: %s (returned to sampling: %s)", pools.sizes(), returned)
        return pools

    def _prompt_sampler(self) -> PromptSampler:
        settings = self.settings
        ratios = [spec.ratio for spec in settings.env_specs]
        if any(r is not None for r in ratios) and any(r is None for r in ratios):
            raise ValueError("data.env: set ratio on every environment or on none")
        pools, rounds = self.pools, settings.buffer.rounds
        excluded = (lambda block: pools.excluded(block // rounds)) if pools is not None else None
        key = hash_key(settings.buffer.hash_keys) if settings.buffer.hash_keys else None
        ratios = None if ratios[0] is None else ratios
        return PromptSampler(self.envs, settings.seed, ratios=ratios, key=key, excluded=excluded)

    def one_pass_steps(self) -> int:
        """The optimizer steps in which the prompt order draws every example once (trainer.max_steps -1).
        A generation reserves `buffer.rounds` blocks (its resampling rounds), used or not."""
        generations = max(1, self.prompts.blocks_per_pass(self.prompts_per_block()) // self.settings.buffer.rounds)
        return generations * self.shape.steps_per_rollout_generation

    def run(self, first_step: int | None = None) -> None:
        """Produce and send the batches of steps first_step (default start_step) .. max_steps - 1; then
        close the stream of data.streaming (groups sampled ahead for later steps are dropped, and named
        in prompts.jsonl's closing line: grpokit.orchestrator.accounting)."""
        first = self.start_step if first_step is None else first_step
        self._resume_accounting(first)
        try:
            for step in range(first, self.max_steps):
                if self.stopping.is_set():
                    return
                batch = self.make_batch(step)
                self.transport.send(batch)
                if self.announce:
                    m = batch.metrics
                    log.info(
                        "step %d: batch sent (reward %.3f, %d groups, generation %.1fs)",
                        step,
                        m["reward"],
                        m["groups_trained"],
                        m["gen_time"],
                    )
            if first < self.max_steps:
                append_record(self.run_dir, {"step": None, "unfinished": self.driver.leftover()})
        finally:
            self.driver.close()
            stop_judge_servers(self.judge_servers)
            self.judge_servers = []

    def _resume_accounting(self, first: int) -> None:
        """Cut a killed writer's partial line of prompts.jsonl; a resumed stream continues at the first
        prompt the steps before `first` did not account for (RolloutDriver.resume)."""
        repair(self.run_dir)
        if not first:
            return
        records, _ = read_records(self.run_dir)
        if all(s in records for s in range(first)):
            self.driver.resume(accounted_before(self.run_dir, first))
        elif self.settings.streaming is not None:
            log.warning("%s lacks steps before %d: the stream resumes at its generation's block", RECORD, first)

    def make_batch(self, step: int) -> TrainingBatch:
        """The batch of `step`: its share of its generation's groups, advantages, filter flags, metrics, packed."""
        index, chunk, iteration = self.shape.locate(step)
        gen = self._generation(index)
        wall_start = time.time()
        per_step = self.shape.prompts_per_step
        chunk_groups = gen.kept[chunk * per_step : (chunk + 1) * per_step]
        groups = [g for g in chunk_groups if step - min(r.policy_step for r in g) <= self.settings.max_off_policy_steps]
        # what the metrics describe: the step's chunk when a generation feeds several steps
        generated = chunk_groups if self.shape.steps_per_generation > 1 and chunk_groups else gen.generated
        rollouts = [r for g in groups for r in g]
        all_rollouts = [r for g in generated for r in g] or rollouts
        check_not_from_the_future(step, all_rollouts)
        fresh = chunk == 0 and step % self.shape.steps_per_rollout_generation == 0
        flags = flag_all(self.settings.filters, rollouts)
        metrics = batch_metrics(step, all_rollouts, rewards_of(generated), flags)
        metrics.update(self.pools.sizes() if self.pools is not None else {})
        metrics.update(
            temperature=self.temperature(index),
            gen_time=gen.gen_time if fresh else 0.0,
            groups_generated=float(len(generated)),
            groups_trained=float(len(groups)),
            prompts_too_long=float(gen.prompts_too_long if fresh else 0),
            dropped_off_policy_groups=float(len(chunk_groups) - len(groups)),
            **(gen.eval_metrics if fresh else {}),
        )
        if self.settings.streaming is not None:  # rollouts whose tokens came from more than one weight step
            metrics["mixed_weight_rollouts"] = sum(r.token_steps is not None for r in all_rollouts) / len(all_rollouts)
        self._log_samples(step, all_rollouts)
        record = step_record(step, gen, iteration, groups, chunk_groups, self.settings.buffer.keep, fresh)
        append_record(self.run_dir, {**record, "reward": metrics["reward"]})
        temperature = self.temperature(index) or 1.0
        micro_batches = self._pack(step, groups, rollouts, flags, metrics, temperature)
        policy_step = min(r.policy_step for r in all_rollouts)
        start = wall_start - (gen.gen_time if fresh else 0.0)
        record_timeline(self.run_dir, "orchestrator", step, start, time.time(), policy_step=policy_step)
        return TrainingBatch(step=step, micro_batches=micro_batches, temperature=temperature, metrics=metrics)

    def _generation(self, index: int) -> Generation:
        """Generation `index`, sampled once (after waiting for fresh enough weights) and reused by each
        step it feeds (steps_per_generation, num_iterations)."""
        if self.generation is None or self.generation.index != index:
            if self.settings.streaming is None:  # a stream keeps decoding while it waits (its groups wait instead)
                self.wait_for_weights(self.schedule.needed(index))
            eval_metrics = self.evaluator.maybe_run(self.engine, self.tokenizer) if self.evaluator else {}
            start = time.perf_counter()
            generated, kept, too_long = self.driver.select_groups(index)
            elapsed, skipped = time.perf_counter() - start, self.driver.take_skipped()
            self.generation = Generation(index, generated, kept, elapsed, eval_metrics, too_long, skipped)
        return self.generation

    def _pack(self, step: int, groups, rollouts, flags, metrics, temperature: float) -> list:
        """The step's micro-batches: rollouts (masked where an enforcing filter flagged them) and expert
        completions (data.expert); records expert_seqs, expert_tokens and packing_efficiency in `metrics`.
        With data.kl_in_reward the advantages are of the shaped rewards (grpokit.orchestrator.kl_reward),
        everything else of the env's."""
        settings = self.settings
        shaped = groups
        if self.kl_reward is not None:
            shaped, kl_metrics = self.kl_reward.shape(groups, temperature)
            metrics.update(kl_metrics)
        advantages = settings.advantage.token_advantages(shaped)
        enforced = [name for name, f in zip(flags, settings.filters) if f.enforce]  # flags: in filter order
        trainable = [not any(flags[name][i] for name in enforced) for i in range(len(rollouts))]
        experts = self.inputs.experts.rollouts(step, groups) if self.inputs.experts is not None else []
        metrics["expert_seqs"] = float(len(experts))
        metrics["expert_tokens"] = float(sum(sum(r.completion_mask) for r in experts))
        micro_batches = pack(
            rollouts + experts,
            advantages + [[0.0] * len(r.completion_ids) for r in experts],
            trainable + [True] * len(experts),
            settings.seq_len,
            prefix_tree=self.pack_trees,
        )
        positions = sum(num_positions(mb, self.pack_trees) for mb in micro_batches)
        metrics["packing_efficiency"] = positions / max(len(micro_batches) * settings.seq_len, 1)
        return micro_batches

    def prompts_per_block(self) -> int:
        """Prompts a block of the prompt order holds: a generation's prompts, times buffer.oversampling_factor."""
        num_prompts = self.shape.prompts_per_step * self.shape.steps_per_generation
        return math.ceil(num_prompts * self.settings.buffer.oversampling_factor)

    def block_seed(self, block: int) -> int:
        """The sampling seed of prompt block `block` (its own, so a resumed run samples it again the same)."""
        return self.settings.sampling.seed * 1_000_003 + block

    def temperature(self, generation: int) -> float:
        """The sampling temperature of a generation (= step by default; the trainer scales its logits by it too)."""
        settings = self.settings
        if settings.temp_scheduler is not None:
            return settings.temp_scheduler.at(generation, -(-self.max_steps // self.shape.steps_per_rollout_generation))
        return 1.0 if settings.sampling.temperature is None else settings.sampling.temperature

    def wait_for_weights(self, step: int) -> None:
        """Block until the engine holds the weights of `step` (grpokit.orchestrator.weights.WeightSchedule)."""
        self.schedule.wait(step, self.stopping, self.announce, self.driver.load)

    def _log_samples(self, step: int, rollouts: list[Rollout]) -> None:
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for r in rollouts[: self.settings.num_logged_samples]:
                sample = {
                    "step": step,
                    "env": r.env_id,
                    "example_id": r.example_id,
                    "policy_step": r.policy_step,
                    "reward": r.reward,
                    "finish_reason": r.finish_reason,  # stop, length or abort (grpokit.inference.finish)
                    "completion": r.completion_text,
                }
                if r.turn_finish_reasons is not None:
                    sample["turn_finish_reasons"] = r.turn_finish_reasons
                if r.messages is not None:  # a multi-turn rollout: the whole chat, tool calls and results
                    sample["messages"] = r.messages
                if r.notes:  # e.g. a judge's reply, or a classifier's score (grpokit.judges)
                    sample["notes"] = r.notes
                f.write(json.dumps(sample) + "\n")


def rewards_of(groups: list[list[Rollout]]) -> torch.Tensor:
    """The groups' rewards as a [P, G] float64 tensor."""
    return torch.tensor([[r.reward for r in g] for g in groups], dtype=torch.float64)


def check_not_from_the_future(step: int, rollouts: list[Rollout]) -> None:
    """Refuse a batch sampled with weights newer than its step: the trainer restarted from an earlier
    checkpoint (discarding its newer weights) while a running engine kept them."""
    newest = max((r.policy_step for r in rollouts), default=-1)
    if newest > step:
        raise RuntimeError(
            f"the batch for step {step} was sampled with weights of step {newest}: the trainer "
            "restarted from an earlier checkpoint while the engine kept newer weights. Restart the "
            "engine (`grpokit infer`) after the trainer, then the orchestrator (docs/reliability.md)."
        )
