"""Supervised fine-tuning on the trainer's Policy (`grpokit sft`): no second trainer.

SFT batches are TrainingBatches whose loss mask covers the assistant tokens (grpokit/sft/), so
`Policy.training_step` trains them unchanged: model setup (LoRA, QLoRA, full weights, FSDP2), packed
logprobs, gradient accumulation normalised over the step, clipping, the lr schedule, the non-finite
guard and checkpoints are the GRPO trainer's. The objective is the recipe's `model.loss`, `NLL` by
default (grpokit/registry/losses/nll.py):

    L = -sum_{t in A} log p_theta(x_t | x_<t) / |A_step|        A: assistant tokens of the step

What SFT adds is here: no engine sampled the tokens, so the step reports no sampling-mismatch metrics;
held-out examples are evaluated (`SFTEval`: eval_loss, the same token mean, and eval_token_accuracy,
the share of assistant tokens that are the model's argmax); and a finished run leaves its weights as a
model folder `RUN/model/` (`SaveSFTModel`; the LoRA adapter merged into the base), which
`grpokit fit` starts from with `model.init_from: RUN` (grpokit/trainer/init_from.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from grpokit.common.io import atomic_folder, atomic_save_tensors, atomic_write_json
from grpokit.common.models import compute_dtype, load_causal_lm, parse_dtype
from grpokit.loss import LossInputs
from grpokit.trainer.init_from import SFT_MARKER
from grpokit.trainer.model_setup import uses_varlen
from grpokit.trainer.policy import Policy
from grpokit.types import MicroBatch, WeightUpdate
from grpokit.vision.render import save_tokenizer

log = logging.getLogger(__name__)


class SFTPolicy(Policy):
    """The Policy on SFT batches: `model.*` as in `grpokit fit`, model.loss NLL by default."""

    def sampling_metrics(self, inputs: LossInputs) -> dict[str, torch.Tensor]:
        return {}  # nothing was sampled: the batch's inference logprobs are zeros

    @torch.no_grad()
    def evaluate(self, micro_batches: list[MicroBatch]) -> dict[str, float]:
        """eval_loss (token-mean NLL over the assistant tokens) and eval_token_accuracy (argmax == token)
        of held-out sequences, one forward each, dropout off. Every rank runs it (FSDP2: forwards are
        collectives) on the same sequences."""
        nll, correct, tokens = 0.0, 0, 0
        self.lm.eval()
        try:
            for mb in micro_batches:
                mb = move_data_to_device(mb, self.device)
                lengths = mb.seq_lens_N.tolist()
                images = {}  # a sequence with images is a micro-batch of its own (SFTData.eval_batch)
                if mb.vision is not None:
                    images = mb.vision.model_kwargs(self.device, compute_dtype(self.lm))
                for ids_T, mask_T in zip(mb.input_ids_T.split(lengths), mb.loss_mask_T.split(lengths)):
                    logits_TV = self.lm(input_ids=ids_T[None], **self._single_sequence(len(ids_T)), **images)
                    logits_TV = logits_TV.logits[0, :-1]
                    keep_T = mask_T[1:] > 0  # token t + 1 is predicted from position t
                    logp_T = torch.log_softmax(logits_TV.float(), -1).gather(-1, ids_T[1:, None])[:, 0]
                    nll -= float(logp_T[keep_T].sum())
                    correct += int((logits_TV.argmax(-1) == ids_T[1:])[keep_T].sum())
                    tokens += int(keep_T.sum())
        finally:
            self.lm.train()
        n = max(tokens, 1)
        return {"eval_loss": nll / n, "eval_token_accuracy": correct / n, "eval_tokens": float(tokens)}

    def _single_sequence(self, length: int) -> dict:
        """The varlen backend's sequence bounds for one sequence (it takes no mask); nothing for SDPA."""
        if not uses_varlen(self.attention, self.device):
            return {}
        cu = torch.tensor([0, length], dtype=torch.int32, device=self.device)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": length, "max_length_k": length}

    def _log_step(self, step: int, logs: dict[str, float]) -> None:
        super()._log_step(step, logs)
        self.log("loss", float(logs["loss"]), prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1)


class SFTEval(L.Callback):
    """Evaluates the held-out micro-batches on the weights of steps 0, interval, 2 * interval, ... and the
    last, logging eval_* at that step (the weights published as step n have seen n optimizer steps)."""

    def __init__(self, micro_batches: list[MicroBatch], interval: int) -> None:
        self.micro_batches, self.interval = micro_batches, interval

    def on_train_start(self, trainer: L.Trainer, pl_module: SFTPolicy) -> None:
        if trainer.global_step % self.interval == 0:
            self._evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: SFTPolicy, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.interval == 0 or step >= trainer.max_steps:
            self._evaluate(trainer, pl_module)

    def _evaluate(self, trainer: L.Trainer, pl_module: SFTPolicy) -> None:
        metrics = pl_module.evaluate(self.micro_batches)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
            loss, accuracy = metrics["eval_loss"], metrics["eval_token_accuracy"]
            log.info("eval of step %d: loss %.4f, token accuracy %.3f", trainer.global_step, loss, accuracy)


class SaveSFTModel(L.Callback):
    """When training reaches max_steps, writes `folder` (RUN/model/): a model folder `grpokit fit` can
    start from (`model.init_from`) and any HF loader reads: the final weights, the LoRA adapter merged
    into a fresh copy of the base (the adapter itself under adapter/), the policy's tokenizer, and
    grpokit_sft.json naming the base model. Under FSDP2 every rank joins the weights' gather."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: L.Trainer, pl_module: Policy) -> None:
        step = trainer.global_step
        if step < trainer.max_steps:
            return  # stopped early (Ctrl-C): the checkpoints hold the weights; a resume finishes the run
        if trainer.is_global_zero or pl_module.sharded:
            update = pl_module.weight_update(step)
            if trainer.is_global_zero:
                write_model(self.folder, update, pl_module.model_name, pl_module.base_model, pl_module.dtype_name)
                log.info("SFT weights of step %d written to %s (fit: model.init_from)", step, self.folder.parent)


def write_model(folder: Path, update: WeightUpdate, start: str, base: str, dtype: str) -> None:
    """`update`'s weights as a full model folder: the weights training started from (`start`: model.model,
    or the folder of model.init_from) loaded afresh (not quantised), then the full state dict loaded into
    them, or the LoRA adapter merged into them (peft's merge_and_unload); `base` (model.model) recorded."""
    lm = load_causal_lm(start, dtype=parse_dtype(dtype))
    with atomic_folder(folder) as tmp:
        if update.lora_config is None:
            lm.load_state_dict(update.tensors)
        else:
            from peft import PeftModel

            adapter = tmp / "adapter"
            adapter.mkdir()
            atomic_save_tensors(adapter / "adapter_model.safetensors", update.tensors, metadata={"format": "pt"})
            atomic_write_json(adapter / "adapter_config.json", update.lora_config)
            lm = PeftModel.from_pretrained(lm, str(adapter)).merge_and_unload()
        lm.save_pretrained(tmp)
        save_tokenizer(start, tmp)
        marker = {"base_model": base, "step": update.step, "lora": update.lora_config is not None}
        atomic_write_json(tmp / SFT_MARKER, marker)
