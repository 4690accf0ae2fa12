"""Orchestrator: the LightningDataModule that produces one TrainingBatch per trainer step.

In `grpokit fit` a background thread runs the rollout loop (engine -> env -> advantage -> filters ->
pack -> transport.send) while the trainer, in the main thread, receives batches from the transport.
Scheduling follows max_async_level k: the batch for step n is sampled with weights of a step
>= max(0, n - k), so the engine may run up to k steps ahead of the trainer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

import lightning as L
import torch

from grpokit.advantage import Advantage
from grpokit.broadcast import WeightBroadcast
from grpokit.common.timeline import record_timeline
from grpokit.filter import Filter
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.orchestrator.batching import resolve_batch_shape
from grpokit.orchestrator.buffer import BufferSettings
from grpokit.orchestrator.environment import Environment, EnvSpec, UnscoredEnvironment
from grpokit.orchestrator.evaluation import EvalSettings, Evaluator
from grpokit.orchestrator.experts import ExpertSettings, expert_rollouts
from grpokit.orchestrator.packing import num_positions, pack
from grpokit.orchestrator.pools import DifficultyPools, hash_key
from grpokit.orchestrator.prompts import PromptSampler
from grpokit.orchestrator.rollouts import generate_rollouts
from grpokit.orchestrator.schedules import TemperatureSchedule
from grpokit.orchestrator.stats import batch_metrics
from grpokit.orchestrator.weights import weight_source
from grpokit.trainer.distributed import rank_and_world, share_batch
from grpokit.transport import Transport
from grpokit.types import Rollout, TrainingBatch

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
        packing: Literal["auto", "tokens", "prefix_tree"] = "auto",
        max_async_level: int = 1,
        max_off_policy_steps: int = 8,
        seed: int = 0,
        buffer: BufferSettings | None = None,
        eval: EvalSettings | None = None,
        num_logged_samples: int = 4,
        timeout: float = 1800.0,
        generation_batch_size: int | None = None,
        steps_per_generation: int | None = None,
        num_generations: int | None = None,
        num_iterations: int = 1,
        expert: ExpertSettings | None = None,
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
            packing: what seq_len counts: "tokens", or "prefix_tree" nodes (distinct prefixes) for a
                trainer that runs each shared prefix once (model.share_prefixes); "auto" = prefix_tree
                when this process's trainer shares prefixes (co-locate fit on one device; with DDP the
                fewer micro-batches would leave ranks idle), else tokens. Set
                prefix_tree for `grpokit orchestrate` only when the trainer shares prefixes: a packed-row
                trainer would get micro-batches of up to G x seq_len tokens.
            max_async_level: how many steps the engine's weights may lag the trainer (k >= 0).
            max_off_policy_steps: groups sampled more than this many steps before the step that would
                train on them are dropped (counted in dropped_off_policy_groups); matters when a
                generation feeds several steps (steps_per_generation, num_iterations).
            buffer: which groups are trained on (online difficulty filtering, dynamic sampling), which
                examples are sampled (easy/hard pools, dedup by hash_keys), skip_verification.
            eval: online evaluation every few steps (null disables it).
            seed: seed of the prompt order.
            num_logged_samples: completions per step written to samples.jsonl.
            timeout: seconds to wait for weights (orchestrator) or a batch (trainer) before failing.
            generation_batch_size: rollouts sampled per generation (ms-swift); = batch_size * steps_per_generation.
            steps_per_generation: optimizer steps one generation is split into (ms-swift/TRL).
            num_generations: alias of rollouts_per_example (ms-swift/TRL).
            num_iterations: optimizer passes over each generation (GRPO's mu; the importance ratio corrects
                for the weights moving in between).
            expert: add one expert completion per group, the example's reference answer (for losses
                that learn from demonstrations, such as Chord); null adds none.
        """
        super().__init__()
        self.shape = resolve_batch_shape(
            batch_size,
            rollouts_per_example,
            generation_batch_size,
            steps_per_generation,
            num_generations,
            num_iterations,
        )
        batch_size, rollouts_per_example = self.shape.batch_size, self.shape.rollouts_per_example
        if max_async_level < 0:
            raise ValueError(f"data.max_async_level must be >= 0, got {max_async_level}")
        if max_off_policy_steps < max_async_level:
            raise ValueError(
                f"data.max_off_policy_steps ({max_off_policy_steps}) must be >= "
                f"data.max_async_level ({max_async_level}): every batch may be that stale"
            )
        if advantage is None:
            from grpokit.registry.advantages.group_norm import GroupNorm

            advantage = GroupNorm()
        if transport is None:
            from grpokit.transport.filesystem import FilesystemTransport

            transport = FilesystemTransport()
        self.env_specs = env or [EnvSpec(id="reverse-text")]
        self.batch_size, self.rollouts_per_example = batch_size, rollouts_per_example
        self.advantage, self.filters, self.transport = advantage, list(filters or []), transport
        self.sampling = sampling or SamplingSettings()
        if temp_scheduler is not None and self.sampling.temperature is not None:
            raise ValueError(
                "set either data.sampling.temperature or data.temp_scheduler, "
                "not both (the schedule sets the temperature of each step)"
            )
        self.temp_scheduler = temp_scheduler
        self.seq_len, self.max_async_level, self.seed = seq_len, max_async_level, seed
        self.packing, self.trainer_shares_prefixes = packing, False
        self.max_off_policy_steps = max_off_policy_steps
        self.num_logged_samples, self.timeout = num_logged_samples, timeout
        self.buffer = buffer or BufferSettings()
        self.eval_settings = eval
        self.expert = expert
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._generation: tuple[int, list, list, float, dict] | None = None  # (index, generated, kept, gen_time, eval)

    # ---- wiring (done by the CLI) -------------------------------------------------------------------
    def connect(
        self,
        engine: InferenceEngine,
        broadcast: WeightBroadcast,
        tokenizer,
        run_dir: Path,
        max_steps: int,
        start_step: int = 0,
        restore_buffer: bool = True,
        trainer_shares_prefixes: bool = False,
    ) -> None:
        """Give the orchestrator its engine, broadcast, tokenizer and run folder (the rollout side), and
        whether the trainer in this process shares prefixes (packing auto).

        The easy/hard pools are restored as they were when the batch of start_step was sampled, or
        start empty with restore_buffer=False (ckpt.skip_buffer).
        """
        self.connect_trainer(run_dir, max_steps, start_step)
        self.engine, self.broadcast, self.tokenizer = engine, broadcast, tokenizer
        self.trainer_shares_prefixes = trainer_shares_prefixes
        self.weights = weight_source(engine, broadcast)  # the broadcast, or the servers when only they may poll it
        scored = [Environment(spec) for spec in self.env_specs]
        self.envs = [UnscoredEnvironment(env) for env in scored] if self.buffer.skip_verification else scored
        ratios = [spec.ratio for spec in self.env_specs]
        if any(r is not None for r in ratios) and any(r is None for r in ratios):
            raise ValueError("data.env: set ratio on every environment or on none")
        self.pools = (
            DifficultyPools(self.buffer, self.run_dir / "buffer.jsonl", self.seed) if self.buffer.uses_pools else None
        )
        if self.pools is not None:
            generation = self.shape.locate(start_step)[0]
            returned = self.pools.resume(generation, restore_buffer)
            log.info("easy/hard pools restored: %s (returned to sampling: %s)", self.pools.sizes(), returned)
        excluded = (lambda block: self.pools.excluded(block // self.buffer.rounds)) if self.pools is not None else None
        key = hash_key(self.buffer.hash_keys) if self.buffer.hash_keys else None
        self.prompts = PromptSampler(
            self.envs, self.seed, ratios=None if ratios[0] is None else ratios, key=key, excluded=excluded
        )
        self.evaluator = (
            Evaluator(self.eval_settings, scored, self.sampling, self.run_dir) if self.eval_settings else None
        )

    def connect_trainer(self, run_dir: Path, max_steps: int, start_step: int = 0) -> None:
        """Only the trainer's side: receive batches start_step .. max_steps - 1 (`grpokit train`)."""
        self.run_dir, self.max_steps, self.start_step = Path(run_dir), max_steps, start_step
        self.transport.setup(run_dir)

    # ---- the rollout loop -------------------------------------------------------------------------
    def start(self, first_step: int | None = None) -> None:
        """Run the rollout loop in a daemon thread (co-locate mode), from `first_step` (default start_step)."""
        self._thread = threading.Thread(
            target=self._run_guarded, args=(first_step,), name="grpokit-orchestrator", daemon=True
        )
        self._thread.start()

    def _run_guarded(self, first_step: int | None) -> None:
        try:
            self.run(first_step)
        except BaseException as e:  # surfaced to the trainer thread by receive()
            log.exception("orchestrator failed")
            self._error = e

    def run(self, first_step: int | None = None) -> None:
        """Produce the batches for steps first_step (default start_step) .. max_steps - 1."""
        for step in range(self.start_step if first_step is None else first_step, self.max_steps):
            if self._stop.is_set():
                return
            self.transport.send(self.make_batch(step))

    def make_batch(self, step: int) -> TrainingBatch:
        generation, chunk, _ = self.shape.locate(step)
        if self._generation is None or self._generation[0] != generation:
            first_step = generation * self.shape.steps_per_rollout_generation
            self.wait_for_weights(max(0, first_step - self.max_async_level))
            eval_metrics = self.evaluator.maybe_run(self.engine, self.tokenizer) if self.evaluator else {}
            start = time.perf_counter()
            generated, kept = self.select_groups(generation)
            self._generation = (generation, generated, kept, time.perf_counter() - start, eval_metrics)
        _, generated, kept, gen_time, eval_metrics = self._generation
        wall_start = time.time()
        per_step = self.shape.prompts_per_step
        chunk_groups = kept[chunk * per_step : (chunk + 1) * per_step]
        groups = [g for g in chunk_groups if step - min(r.policy_step for r in g) <= self.max_off_policy_steps]
        generated = (
            chunk_groups if self.shape.steps_per_generation > 1 and chunk_groups else generated
        )  # what the metrics describe
        rollouts = [r for g in groups for r in g]
        all_rollouts = [r for g in generated for r in g] or rollouts
        check_not_from_the_future(step, all_rollouts)
        advantages = self.advantage.token_advantages(groups)
        flags = {f.name: f.flag(rollouts) for f in self.filters}
        trainable = [not any(flags[f.name][i] for f in self.filters if f.enforce) for i in range(len(rollouts))]
        metrics = batch_metrics(
            step, all_rollouts, torch.tensor([[r.reward for r in g] for g in generated], dtype=torch.float64), flags
        )
        fresh = chunk == 0 and step % self.shape.steps_per_rollout_generation == 0
        metrics.update(self.pools.sizes() if self.pools is not None else {})
        metrics.update(
            temperature=self.temperature(generation),
            gen_time=gen_time if fresh else 0.0,
            groups_generated=float(len(generated)),
            groups_trained=float(len(groups)),
            dropped_off_policy_groups=float(len(chunk_groups) - len(groups)),
            **(eval_metrics if fresh else {}),
        )
        self._log_samples(step, all_rollouts)
        experts = expert_rollouts(groups, self.envs, self.tokenizer, self.expert) if self.expert else []
        metrics["expert_seqs"] = float(len(experts))
        tree = self.packing == "prefix_tree" or (self.packing == "auto" and self.trainer_shares_prefixes)
        micro_batches = pack(
            rollouts + experts,
            advantages + [[0.0] * len(r.completion_ids) for r in experts],
            trainable + [True] * len(experts),
            self.seq_len,
            prefix_tree=tree,
        )
        metrics["packing_efficiency"] = sum(num_positions(mb, tree) for mb in micro_batches) / max(
            len(micro_batches) * self.seq_len, 1
        )
        record_timeline(
            self.run_dir,
            "orchestrator",
            step,
            wall_start - (gen_time if fresh else 0.0),
            time.time(),
            policy_step=min(r.policy_step for r in all_rollouts),
        )
        return TrainingBatch(
            step=step, micro_batches=micro_batches, temperature=self.temperature(generation) or 1.0, metrics=metrics
        )

    def select_groups(self, generation: int) -> tuple[list[list[Rollout]], list[list[Rollout]]]:
        """(every group sampled for `generation`, the groups it trains on), per the buffer rules.

        Each generation owns a fixed block of `rounds * prompts` prompts and each round its own seed, so
        a generation's prompts and samples are a function of its index (a resumed run continues exactly).
        With one step per generation (the default) the generation index is the step.
        """
        num_prompts = self.shape.prompts_per_step * self.shape.steps_per_generation
        generated, kept = [], []
        for round_ in range(self.buffer.rounds):
            block = generation * self.buffer.rounds + round_
            sampling = replace(
                self.sampling, seed=self.sampling.seed * 1_000_003 + block, temperature=self.temperature(generation)
            )
            prompts = self.prompts.take(block, num_prompts)
            groups = generate_rollouts(
                self.engine, self.tokenizer, prompts, self.rollouts_per_example, sampling, block * num_prompts
            )
            for (env, ex), group in zip(prompts, groups) if self.pools is not None else ():
                self.pools.observe(generation, self.prompts.key_of(env, ex), sum(r.reward for r in group) / len(group))
            generated += groups
            kept += [g for g in groups if self.buffer.keep([r.reward for r in g])]
            if len(kept) >= num_prompts:
                break
        return generated, kept[:num_prompts]

    def temperature(self, generation: int) -> float:
        """The sampling temperature of a generation (= step by default; the trainer scales its logits by it too)."""
        if self.temp_scheduler is not None:
            return self.temp_scheduler.at(generation, -(-self.max_steps // self.shape.steps_per_rollout_generation))
        return 1.0 if self.sampling.temperature is None else self.sampling.temperature

    def wait_for_weights(self, min_step: int) -> None:
        """Load the newest published weights (or learn the step the servers hold); block until they are
        at least `min_step`."""
        deadline = time.monotonic() + self.timeout
        while True:
            update = self.weights.poll(self.engine.weight_step)
            if update is not None:
                self.engine.load_weights(update)
            if self.engine.weight_step >= min_step:
                return
            if self._stop.is_set():
                raise RuntimeError("orchestrator stopped while waiting for weights")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no weights of step >= {min_step} after {self.timeout:.0f}s (data.timeout): "
                    "is the trainer (`grpokit train`) running and publishing through the same "
                    f"broadcast ({type(self.broadcast).__name__}){self._source_hint()}?"
                )
            time.sleep(0.05)

    def _source_hint(self) -> str:
        if self.weights is self.broadcast:
            return ""
        return (
            " to the server (`grpokit infer`: only it may poll this broadcast, "
            f"so the orchestrator asks it; it holds step {self.engine.weight_step})"
        )

    def _log_samples(self, step: int, rollouts: list[Rollout]) -> None:
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for r in rollouts[: self.num_logged_samples]:
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "env": r.env_id,
                            "example_id": r.example_id,
                            "policy_step": r.policy_step,
                            "reward": r.reward,
                            "completion": r.completion_text,
                        }
                    )
                    + "\n"
                )

    # ---- the trainer's side -----------------------------------------------------------------------
    def train_dataloader(self):
        return BatchStream(self)

    def receive(self, step: int) -> TrainingBatch:
        """The batch for `step`, failing fast if the rollout thread died."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self._error is not None:
                raise RuntimeError(f"the orchestrator failed: {self._error!r}") from self._error
            try:
                return self.transport.receive(step, timeout=1.0)
            except TimeoutError as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no batch for step {step} after {self.timeout:.0f}s (data.timeout): "
                        "the orchestrator (`grpokit orchestrate`, or the rollout thread of "
                        f"`grpokit fit`) sent none. The transport says: {e}"
                    ) from None

    def teardown(self, stage: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.transport.close()


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


class BatchStream:
    """The trainer's dataloader: batch `step` for step = start_step, start_step + 1, ...

    With several trainer ranks (DDP) only rank 0 reads the transport and sends each batch to the
    others over the trainer's process group (grpokit.trainer.distributed).
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
