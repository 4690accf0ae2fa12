"""The trainer side of the benches: a grpokit.trainer.policy.Policy built as `grpokit fit` builds it, and its step.

`bench train`, `bench step` and bench/gpu_profile_train.py time this, so what they measure is what fit
runs: Policy.configure_model (peft LoRA, gradient checkpointing, the attention backend, compiled
decoder layers, the activation memory budget) and, per optimizer step, Policy.train_batch (chunked
log-probabilities -> loss -> backward per micro-batch, gradient clipping, the non-finite guard, the
optimizer step) with Policy.make_optimizer, the optimizer fit uses. Left out: Lightning's loop, the
lr schedule (it needs a Trainer) and the step's logging.

Shape legend: T packed tokens of a micro-batch, N sequences.
"""

from __future__ import annotations

import torch

from grpokit.trainer.policy import LoraSettings, Policy
from grpokit.types import MicroBatch, TrainingBatch


def bench_policy(
    model: str,
    dtype: torch.dtype,
    device: str,
    lora_rank: int,
    chunk_size: int,
    checkpointing: bool,
    compile: bool,
    activation_memory_budget: float | None = None,
    attention: str = "varlen",
) -> Policy:
    """A configured Policy on `device`: LoRA of rank `lora_rank` (alpha 2 x rank) on q/k/v/o of `model`
    (a name or a folder, see grpokit.bench.shapes.model_folder), `attention` (varlen: the CUDA default;
    dense: the CPU default, which shares prefixes), the default loss."""
    policy = Policy(
        model=model,
        lora=LoraSettings(rank=lora_rank, alpha=2.0 * lora_rank),
        lr=1e-5,
        dtype=str(dtype).removeprefix("torch."),
        gradient_checkpointing=checkpointing,
        attention=attention,
        logprob_chunk_size=chunk_size,
        compile=compile,
        activation_memory_budget=activation_memory_budget,
    )
    torch.manual_seed(0)  # the adapter's initialisation, the same in every run
    policy.configure_model()
    return policy.to(device)


def packed_batch(tokens: int, seq_len: int, vocab: int, device: str, group_size: int = 0, prompt_len: int = 0):
    """`tokens` random token ids packed as sequences of `seq_len` (the last one shorter), their positions,
    the sequence lengths, a random advantage per token and the loss mask (seed 0: the same batch for
    every path). By default every token but a sequence's first is trained on. With `group_size` G, the
    sequences come in groups of G that start with the same `prompt_len` tokens (a GRPO batch: G
    completions of each prompt), and only the completions are trained on."""
    lens = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    g = torch.Generator().manual_seed(0)
    ids_T = torch.randint(3, vocab, (tokens,), generator=g)
    pos_T = torch.cat([torch.arange(n) for n in lens])
    mask_T = pos_T > 0
    if group_size > 0:
        if not 0 < prompt_len < seq_len:
            raise ValueError(f"--prompt-len ({prompt_len}) must be in (0, --seq-len={seq_len}) with --group-size")
        starts = [sum(lens[:i]) for i in range(len(lens))]
        for i, (start, n) in enumerate(zip(starts, lens)):
            first = starts[i - i % group_size]  # the group's first sequence
            k = min(prompt_len, n)
            ids_T[start : start + k] = ids_T[first : first + k].clone()
        mask_T = pos_T >= prompt_len
    adv_T = torch.randn(tokens, generator=g)
    return (
        ids_T.to(device),
        pos_T.to(device),
        torch.tensor(lens, device=device),
        adv_T.to(device),
        mask_T.float().to(device),
    )


def micro_batch(
    tokens: int, seq_len: int, vocab: int, device: str, group_size: int = 0, prompt_len: int = 0
) -> MicroBatch:
    """packed_batch's tokens, advantages and loss mask as a MicroBatch."""
    ids_T, pos_T, lens_N, adv_T, mask_T = packed_batch(tokens, seq_len, vocab, device, group_size, prompt_len)
    return MicroBatch(
        input_ids_T=ids_T,
        position_ids_T=pos_T,
        loss_mask_T=mask_T,
        advantages_T=adv_T * mask_T,
        inference_logprobs_T=torch.zeros_like(mask_T),
        seq_lens_N=lens_N,
        is_truncated_N=torch.zeros_like(lens_N, dtype=torch.bool),
    )


@torch.no_grad()
def sample_with_policy(policy: Policy, batch: TrainingBatch) -> torch.Tensor:
    """Set the batch's inference logprobs to the policy's own (an engine with the trainer's weights: the
    importance ratios start at 1, as in a run); return the first micro-batch's."""
    for mb in {id(mb): mb for mb in batch.micro_batches}.values():  # a micro-batch may repeat
        mb.inference_logprobs_T = policy.loss_inputs(mb, batch).trainer_logprobs_T * mb.loss_mask_T
    return batch.micro_batches[0].inference_logprobs_T
