"""Policy: the LightningModule that trains the causal LM on TrainingBatches.

One training_step is one optimizer step over all micro-batches of the step's batch (gradient
accumulation), with manual optimization so the step is exactly: logprobs -> loss -> backward per
micro-batch, then clip, optimizer step, scheduler step, log. The model is built by
grpokit.trainer.model_setup and what the engine receives by grpokit.trainer.publish; this class holds
the recipe's `model.*` settings, the step and the optimizer.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from grpokit.common.collectives import rank_and_world
from grpokit.common.graph_capture import capture_lock
from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm, parse_dtype
from grpokit.common.prefix_tree import attach_prefix_trees, tree_of
from grpokit.common.timeline import record_timeline
from grpokit.loss import Loss, LossInputs, check_experts, checked_output
from grpokit.noise import NoiseScheduler
from grpokit.registry.losses.aipo import AIPO
from grpokit.trainer.distributed import gather_step, rank_share
from grpokit.trainer.fsdp import is_fsdp, is_sharded
from grpokit.trainer.guards import EmptyStepWatch, NonFiniteGuard
from grpokit.trainer.init_from import sft_model
from grpokit.trainer.lora import LoraSettings
from grpokit.trainer.lr_schedule import check_optimizer_settings, lr_factor
from grpokit.trainer.metrics import mismatch_metrics, weighted_mean
from grpokit.trainer.model_setup import build_model, chunk_size, set_attention, shares_prefixes
from grpokit.trainer.publish import noise_sigma, noisy_norm_weights, weight_update
from grpokit.trainer.quantization import build_optimizer, check_optimizer, check_policy_settings
from grpokit.trainer.teacher import load_teacher
from grpokit.trainer.vision_parts import VisionTraining, vision_parameter_names
from grpokit.types import MicroBatch, TrainingBatch, WeightUpdate


class Policy(L.LightningModule):
    """A Hugging Face causal LM (optionally with a LoRA adapter) trained by a registry loss."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        lora: LoraSettings | None = None,
        loss: Loss | None = None,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        lr_schedule: Literal["constant", "cosine"] = "constant",
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.0,
        max_grad_norm: float = 1.0,
        dtype: Literal["float32", "bfloat16"] = "float32",
        gradient_checkpointing: bool = False,
        max_nonfinite_steps: int = 3,
        quantization: Literal["nf4"] | None = None,
        optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw",
        noise_scheduler: NoiseScheduler | None = None,
        teacher_model: str | None = None,
        attention: Literal["auto", "dense", "varlen"] = "auto",
        logprob_chunk_size: int | None = None,
        compile: bool = False,
        activation_memory_budget: float | None = None,
        share_prefixes: bool | None = None,
        init_from: str | None = None,
        vision: VisionTraining | None = None,
    ) -> None:
        """
        Args:
            model: `smollm2-135m` (embedded default), an HF id or a local folder.
            lora: LoRA settings; null trains all weights.
            loss: the policy loss (kind `loss`); default AIPO.
            lr: peak learning rate of AdamW.
            weight_decay: AdamW weight decay.
            betas: AdamW betas.
            lr_schedule: constant, or cosine decay to min_lr_ratio * lr at max_steps.
            warmup_steps: linear warm-up steps from 0 to lr.
            min_lr_ratio: floor of the cosine schedule as a fraction of lr.
            max_grad_norm: gradients are clipped to this global norm (0 disables clipping).
            dtype: dtype of the trained weights.
            gradient_checkpointing: recompute activations in backward to save memory.
            max_nonfinite_steps: a non-finite loss or grad norm skips the optimizer step (counted in
                skipped_steps); this many in a row stop the run with the batch saved to bad_batches/ (0: never stop).
            quantization: nf4 = QLoRA: the base's linear layers in bitsandbytes 4-bit NF4 with bf16 compute,
                the other weights in float32, LoRA on top (needs model.lora and `pip install grpokit[qlora]`).
            optimizer: adamw (torch), adamw_8bit or paged_adamw_8bit (bitsandbytes; paged needs CUDA).
            noise_scheduler: QeRL noise on the engine's RMSNorm weights (kind `noise`, e.g. QeRL); null = none.
                The trainer's weights stay clean; each weight push carries clean norms + N(0, sigma(step)^2).
            teacher_model: a frozen teacher (alias, HF id or local folder) with the policy's tokenizer;
                its logprobs of each micro-batch's tokens, at the sampling temperature, reach the loss as
                teacher_logprobs_T (AIPO's teacher_tau). Loaded once on first use, eval mode, no gradient.
            attention: how packed sequences are kept apart: "varlen" (per-sequence flash attention from
                cumulative lengths, grpokit.common.varlen; no [T, T] mask), "dense" (block-diagonal [T, T] mask),
                "auto" = varlen on CUDA, dense on CPU.
            logprob_chunk_size: tokens per chunk when computing log-probabilities from the final hidden
                states (never a full [tokens, vocab] float32 tensor; grpokit.common.logprobs.chunked_logprobs);
                0 = full logits; null = 2048 on CUDA, 0 on CPU.
            compile: torch.compile each decoder layer (grpokit.common.models.compile_decoder_layers); the first
                step compiles. Measured on GPU in docs/benchmarks.md.
            activation_memory_budget: with `compile` and without gradient_checkpointing, the fraction
                (0, 1] of each compiled layer's activations kept for backward; AOTAutograd recomputes
                the cheapest of the rest (torch._functorch.config.activation_memory_budget). On an H100,
                0.2 ran a LoRA step 1.55x faster than full checkpointing at 1.2x its memory.
            share_prefixes: run the model once per distinct prefix of a micro-batch's sequences (a tree
                with an ancestor mask, grpokit.common.prefix_tree): a GRPO batch repeats each prompt G times.
                Same logprobs and gradients; needs dense attention. null = on with dense attention and
                LoRA dropout 0 (with dropout, copies of a prompt would share one dropout mask).
            init_from: a finished `grpokit sft` run's folder (output_dir/run_name): start from its weights
                (its model/ folder, the SFT adapter merged), which the engine samples first and reference
                terms compare against; `model` must be the base it was fine-tuned from; `lora` adds a
                fresh adapter (grpokit.trainer.init_from).
            vision: a vision-language model's vision parts that train beside its language model
                (`{train: [projector, tower], lr: ...}`; default: both frozen; grpokit.trainer.vision_parts).
        """
        super().__init__()
        if loss is None:
            loss = AIPO()
        self.model_name = model if init_from is None else sft_model(init_from, model)  # the weights it loads
        self.base_model, self.init_from = model, init_from  # model.model: the base and tokenizer, as named
        self.lora, self.loss = lora, loss
        self.vision = vision or VisionTraining()
        self.lr, self.weight_decay, self.betas = lr, weight_decay, tuple(betas)
        self.lr_schedule, self.warmup_steps, self.min_lr_ratio = lr_schedule, warmup_steps, min_lr_ratio
        self.max_grad_norm, self.dtype_name, self.gradient_checkpointing = max_grad_norm, dtype, gradient_checkpointing
        self.automatic_optimization = False
        self.guard, self.empty_steps = NonFiniteGuard(max_nonfinite_steps), EmptyStepWatch()
        self.strict_loading = False  # checkpoints hold only the trainable weights
        check_policy_settings(quantization, optimizer, lora is not None)
        check_optimizer_settings(lr, weight_decay, tuple(betas), warmup_steps, min_lr_ratio, max_grad_norm)
        self.quantization, self.optimizer_name, self.noise_scheduler = quantization, optimizer, noise_scheduler
        if (teacher_model is not None) != loss.needs_teacher:
            raise ValueError(
                f"model.teacher_model is {teacher_model!r} but model.loss {type(loss).__name__} "
                f"{'needs' if loss.needs_teacher else 'does not use'} teacher logprobs: set "
                "both (e.g. AIPO teacher_tau > 0 with model.teacher_model) or neither"
            )
        self.teacher_model = teacher_model
        self.attention, self._chunk_size, self.compile_layers = attention, logprob_chunk_size, compile
        if activation_memory_budget is not None and not (compile and 0 < activation_memory_budget <= 1):
            raise ValueError(
                f"model.activation_memory_budget ({activation_memory_budget}) "
                "needs model.compile: true and a value in (0, 1]"
            )
        self.activation_memory_budget = activation_memory_budget
        if share_prefixes and attention == "varlen":
            raise ValueError(
                "model.share_prefixes: true needs dense attention (a tree mask); "
                "set model.attention: dense or model.share_prefixes: false"
            )
        self._share_prefixes = share_prefixes
        self.lm: torch.nn.Module | None = None
        self.ref_lm: torch.nn.Module | None = None  # full fine-tuning's frozen reference, loaded on first use
        self.teacher_lm: torch.nn.Module | None = None  # loaded on first use
        self.last_weight_sync_time, self._last_step_end = 0.0, None

    def configure_model(self) -> None:
        """Build the model once (grpokit.trainer.model_setup), sharded when the trainer runs FSDP2."""
        if self.lm is not None:
            return
        mesh = self.trainer.strategy.device_mesh if self._attached and is_fsdp(self.trainer.strategy) else None
        self.lm = build_model(self, self._training_device(), mesh)

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded over ranks (FSDP2): reading them whole is then a collective."""
        return is_sharded(self.lm)

    @property
    def share_prefixes(self) -> bool:
        return shares_prefixes(self._share_prefixes, self.attention, self.lora, self._training_device())

    @property
    def logprob_chunk_size(self) -> int:
        return chunk_size(self._chunk_size, self._training_device())

    def _with_attention(self, lm: torch.nn.Module) -> torch.nn.Module:
        """A frozen model (reference, teacher) on the policy's attention path."""
        return set_attention(lm, self.attention, self._training_device())

    # ---- with or without a Lightning Trainer (grpokit bench calls train_batch without one) ----------
    @property
    def _attached(self) -> bool:
        return self._trainer is not None

    def _training_device(self) -> torch.device:
        """The training device: the trainer's, or (bench, tests) CUDA when there is one."""
        if self._attached:
            return self.trainer.strategy.root_device
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def _max_steps(self) -> int:
        """trainer.max_steps (1 without a Trainer): the length the lr and noise schedules run over."""
        return max(int(self.trainer.max_steps or 0), 1) if self._attached else 1

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep only trainable weights (the adapter under LoRA): the frozen base is the model file."""
        trainable = {f"lm.{name}" for name, p in self.lm.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    # ---- weights for the engine (grpokit.trainer.publish) ------------------------------------------
    publish_probe = False  # the wiring sets it for engines checked by the weight probe (VLLMEngine)

    def weight_update(self, step: int) -> WeightUpdate:
        """The current trainable weights as a WeightUpdate, with the engine's noisy norms of `step` (and the
        weight probe's logprobs when `publish_probe`); under FSDP2 every rank must call it."""
        return weight_update(self.lm, self.lora, step, self.noisy_norm_weights(step), self.publish_probe)

    def noise_sigma(self, step: int) -> float:
        """Sigma of the QeRL noise on the weights published as `step` (0 without an enabled scheduler)."""
        return noise_sigma(self.noise_scheduler, step, self._max_steps())

    def noisy_norm_weights(self, step: int) -> dict[str, torch.Tensor]:
        """The engine's RMSNorm weights for `step` ({} without an enabled noise scheduler)."""
        return noisy_norm_weights(self.lm, self.noise_scheduler, step, self._max_steps())

    # ---- training ---------------------------------------------------------------------------------
    def training_step(self, dataloader_iter) -> None:
        # Taking the iterator (not a batch) turns off Lightning's one-batch prefetch: the batch for step
        # n+1 may need the weights this step produces (max_async_level 0), so prefetching would deadlock.
        received: TrainingBatch | None = next(dataloader_iter)[0]
        if received is None:  # `grpokit train` stopped waiting: a signal asked to stop (StopOnInterrupt)
            return None  # no step: global_step stays, the Checkpointer saves the step reached
        if self.share_prefixes:
            attach_prefix_trees(received.micro_batches)  # on the host, once per micro-batch (the orchestrator may have)
        batch = move_data_to_device(received, self.device)  # with the iterator, Lightning leaves the transfer to us
        check_experts(self.loss, batch)
        start, wall_start = time.perf_counter(), time.time()
        opt, sched = self.optimizers(), self.lr_schedulers()
        result = self.train_batch(batch, opt, received)
        if not result.stepped:
            self._count_skipped_step()
        sched.step()
        logs = {
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "lr": sched.get_last_lr()[0],
            "tokens": float(sum(mb.num_tokens for mb in batch.micro_batches)),
        }
        logs["skipped_steps"] = float(self.guard.skipped)
        if self.noise_scheduler is not None:
            logs["noise_sigma"] = self.noise_sigma(batch.step)  # of the weights published as this step
        logs.update(weighted_mean(result.metrics, result.weights))
        logs.update(batch.metrics)
        self.empty_steps.observe(batch.step, batch.num_loss_tokens, batch.metrics)
        logs["loss_tokens"] = float(batch.num_loss_tokens)
        logs["train_time"] = time.perf_counter() - start
        logs["weight_sync_time"] = self.last_weight_sync_time
        now = time.perf_counter()
        logs["step_time"], self._last_step_end = now - (self._last_step_end or start), now
        self._log_step(batch.step, logs)
        if self._attached and self.trainer.default_root_dir and self.trainer.is_global_zero:
            record_timeline(self.trainer.default_root_dir, "trainer", batch.step, wall_start, time.time())

    def train_batch(
        self, batch: TrainingBatch, opt: torch.optim.Optimizer, received: TrainingBatch | None = None
    ) -> StepResult:
        """One optimizer step on `batch` (on the training device): this rank's share of the micro-batches
        (grpokit.trainer.distributed) forward and backward, the step's loss and metrics gathered from every rank,
        gradient clipping, and the optimizer step unless the non-finite guard refuses it (it then saves
        `received`, the batch as it arrived, to bad_batches/). What training_step runs and `grpokit bench` times.
        On CUDA it holds `capture_lock`: a co-located engine captures no CUDA graph meanwhile.
        """
        with capture_lock(self.device):
            return self._train_batch(batch, opt, received)

    def _train_batch(self, batch: TrainingBatch, opt: torch.optim.Optimizer, received: TrainingBatch | None):
        totals, mb_metrics, weights = torch.zeros((), dtype=torch.float64), [], []
        rank, world = rank_and_world()  # several ranks: each trains its share
        share = rank_share(batch.micro_batches, rank, world, equal=self.sharded)  # FSDP2: every forward is a collective
        for i, (mb, counts) in enumerate(share):
            inputs = self.loss_inputs(mb, batch)
            loss, metrics = checked_output(self.loss, self.loss(inputs))
            with self._gradient_sync(i == len(share) - 1):
                self._backward(loss * world)  # DDP averages over ranks: the sum over micro-batches stays
            if not counts:
                continue
            totals += loss.detach().double().cpu()
            metrics.update(self.sampling_metrics(inputs))
            mb_metrics.append(metrics)
            weights.append(float(inputs.loss_mask_T.sum()))
        totals, mb_metrics, weights = (
            gather_step(float(totals), mb_metrics, weights) if world > 1 else (float(totals), mb_metrics, weights)
        )
        grad_norm = self._clip_gradients()
        bad_dir = self.trainer.default_root_dir if self._attached and rank == 0 else None
        stepped = self.guard.allows_step(totals, grad_norm, received if received is not None else batch, bad_dir)
        if stepped:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return StepResult(totals, grad_norm, mb_metrics, weights, stepped)

    def sampling_metrics(self, inputs: LossInputs) -> dict[str, torch.Tensor]:
        """How far the engine's sampling distribution is from the trainer's on the loss tokens
        (grpokit.trainer.metrics.mismatch_metrics); SFT, where nothing was sampled, reports none."""
        return mismatch_metrics(inputs.trainer_logprobs_T.detach(), inputs.inference_logprobs_T, inputs.loss_mask_T)

    def _backward(self, loss: torch.Tensor) -> None:
        """Lightning's manual_backward under a Trainer (precision, strategy hooks); plain backward without (bench)."""
        self.manual_backward(loss) if self._attached else loss.backward()

    def _gradient_sync(self, sync: bool):
        """A context that skips the gradient all-reduce (DDP's no_sync) or reduce-scatter (FSDP2) of a
        backward unless `sync`, so each rank syncs once per step; a no-op on one device."""
        if self.sharded:
            self.lm.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        block = getattr(self.trainer.strategy, "block_backward_sync", None) if self._attached else None
        return contextlib.nullcontext() if sync or block is None else block()

    def loss_inputs(self, mb: MicroBatch, batch: TrainingBatch) -> LossInputs:
        """The trainer's logprobs (with gradient) and everything else the loss may use for one micro-batch."""
        out = self._logprobs(self.lm, mb, batch.temperature, with_entropy=self.loss.needs_entropy)
        logprobs_T, entropy_T = out if self.loss.needs_entropy else (out, None)
        ref_logprobs_T = self.reference_logprobs(mb, batch.temperature) if self.loss.needs_reference else None
        return LossInputs(
            trainer_logprobs_T=logprobs_T,
            inference_logprobs_T=mb.inference_logprobs_T.float(),
            advantages_T=mb.advantages_T.float(),
            loss_mask_T=mb.loss_mask_T.float(),
            seq_ids_T=mb.seq_ids_T().to(logprobs_T.device),
            num_seqs=len(mb.seq_lens_N),
            loss_normalizer=float(max(batch.num_loss_tokens, 1)),
            step_num_seqs=max(batch.num_loss_seqs, 1),
            is_truncated_N=mb.is_truncated_N,
            ref_logprobs_T=ref_logprobs_T,
            entropy_T=entropy_T,
            num_micro_batches=len(batch.micro_batches),
            teacher_logprobs_T=self.teacher_logprobs(mb, batch.temperature) if self.teacher_model else None,
            expert_mask_T=mb.expert_mask_T.float(),
            expert_normalizer=float(max(batch.num_expert_tokens, 1)),
            step=self.trainer.global_step if self._attached else 0,
            max_steps=self._max_steps(),
        )

    @torch.no_grad()
    def reference_logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        """Logprobs under the initial policy: the base model with the adapter off, or a frozen copy."""
        if self.lora is not None:
            with self.lm.disable_adapter():
                return self._logprobs(self.lm, mb, temperature)
        if self.ref_lm is None:
            self.ref_lm = self._with_attention(
                load_causal_lm(self.model_name, dtype=parse_dtype(self.dtype_name))
                .to(self.device)
                .eval()
                .requires_grad_(False)
            )
        return self._logprobs(self.ref_lm, mb, temperature)

    @torch.no_grad()
    def teacher_logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        """Logprobs under the frozen teacher (`teacher_model`), loaded on first use."""
        if self.teacher_lm is None:
            self.teacher_lm = self._with_attention(
                load_teacher(self.teacher_model, self.model_name, parse_dtype(self.dtype_name)).to(self.device)
            )
        return self._logprobs(self.teacher_lm, mb, temperature)

    def _logprobs(self, model: torch.nn.Module, mb: MicroBatch, temperature: float, with_entropy: bool = False):
        """`model`'s logprobs of the micro-batch's loss and expert tokens (0 on the others: the LM head
        never runs on prompt tokens)."""
        needed_T = (mb.loss_mask_T > 0) | (mb.expert_mask_T > 0)
        shared = self.share_prefixes and mb.vision is None  # a row with images: never by prefix tree
        return packed_token_logprobs(
            model,
            mb.input_ids_T,
            mb.position_ids_T,
            mb.seq_lens_N,
            temperature,
            with_entropy=with_entropy,
            chunk_size=self.logprob_chunk_size,
            compile=self.compile_layers,
            needed_T=needed_T,
            share_prefixes=shared,
            tree=tree_of(mb) if shared else None,  # one tree for policy, reference and teacher
            vision=mb.vision,
        )

    def _count_skipped_step(self) -> None:
        """Advance Lightning's step counter without touching the weights or the optimizer state, so the
        step numbering (weights published as step n, max_steps, checkpoints) stays one per batch."""
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()

    def _clip_gradients(self) -> float:
        params = [p for p in self.lm.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor over the shards

    def _log_step(self, step: int, logs: dict[str, float]) -> None:
        """One metrics row per step, straight to the loggers (Lightning's self.log would repeat values of
        earlier steps, such as eval metrics, in later rows); the progress bar shows a few of them."""
        for logger in self.loggers:
            logger.log_metrics(logs, step=step)
        for name in ("reward", "kl", "step_time"):
            if name in logs:
                self.log(
                    name, float(logs[name]), prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1
                )

    def on_train_start(self) -> None:
        self._last_step_end: float | None = time.perf_counter()

    def make_optimizer(self) -> torch.optim.Optimizer:
        """The model.optimizer over the trainable weights (configure_optimizers, and grpokit bench)."""
        check_optimizer(self.optimizer_name, self.device)
        trained = [(n, p) for n, p in self.lm.named_parameters() if p.requires_grad]
        params = [p for _, p in trained]
        if self.vision.lr is not None and (vision := vision_parameter_names(self.lm)):
            params = [
                {"params": [p for n, p in trained if n not in vision]},
                {"params": [p for n, p in trained if n in vision], "lr": self.vision.lr},
            ]
        return build_optimizer(self.optimizer_name, params, self.lr, self.betas, self.weight_decay)

    def configure_optimizers(self):
        opt = self.make_optimizer()
        max_steps = self._max_steps()
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, self.warmup_steps, max_steps, self.lr_schedule, self.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@dataclass
class StepResult:
    """What Policy.train_batch reports: the step's loss (summed over micro-batches and ranks), the
    gradient norm before clipping, every counted micro-batch's metrics and loss-token weight, and whether
    the optimizer stepped (False: the non-finite guard skipped it)."""

    loss: float
    grad_norm: float
    metrics: list[dict]
    weights: list[float]
    stepped: bool
