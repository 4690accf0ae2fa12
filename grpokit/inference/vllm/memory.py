"""An estimate of the trainer's GPU memory, to size a vLLM server that shares the trainer's GPU.

For a model of P parameters, L layers, hidden size H and vocabulary V, trained on micro-batches of
T tokens (data.seq_len), with b bytes per element of model.dtype:

    weights      = P * b                                  (+ P * b for a frozen reference copy: full
                                                            fine-tuning with a loss that needs one)
    trainable    = N = LoRA: sum over adapted linear layers (in, out) of r * (in + out), in float32
                   (peft keeps adapters in float32); full fine-tuning: P, in b bytes (then counted
                   in `weights` already)
    gradients    = N * (4 for LoRA, b for full fine-tuning)
    optimizer    = N * 8 (AdamW: two float32 moments; adamw_8bit / paged_adamw_8bit: N * 2)
    activations  = T * L * H * 17 * b without gradient checkpointing (Korthikanti et al. 2022, "Reducing
                   Activation Recomputation in Large Transformer Models": 34 * T * H bytes per layer in
                   16-bit with a memory-efficient attention, i.e. 17 values per token per hidden unit);
                   with gradient checkpointing T * L * H * b (each layer's input) + T * H * 17 * b (one
                   layer recomputed)
    logits       = C * V * 4 * 2, C = model.logprob_chunk_size tokens (float32 logits and their
                   gradient); C = T when the logits are not chunked
    overhead     = 2 GiB (CUDA context, cuBLAS workspaces, allocator fragmentation)

and a co-located vLLM server gets what is left, less a 5% margin:

    gpu_memory_utilization = (gpu_bytes - trainer_bytes) / gpu_bytes - 0.05

An estimate, not a measurement: the activation constant is for a GPT block with a 4H MLP (a Llama
block's SwiGLU, 3 projections of ~2.7H, stores about as much), and QLoRA's 4-bit base weights are not
modelled (the estimate is then high, which errs on the safe side).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.common.models import resolve_model

GIB = 1 << 30
OVERHEAD_BYTES = 2 * GIB
ACTIVATION_VALUES_PER_HIDDEN = 17
MARGIN = 0.05
MIN_UTILIZATION = 0.1


@dataclass(frozen=True)
class ModelShape:
    """The sizes the estimate needs. lora_params: trainable adapter elements (0 without LoRA)."""

    params: int
    layers: int
    hidden: int
    vocab: int
    lora_params: int = 0


def model_shape(
    model: str, lora_rank: int | None = None, target_modules: list[str] | tuple[str, ...] = ()
) -> ModelShape:
    """Read the shape of `model` (alias, HF id or folder) by building it on the meta device (no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in lm.parameters())  # tied weights are counted once
    lora = 0
    if lora_rank:
        targets = set(target_modules)
        for name, module in lm.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
                lora += lora_rank * (module.in_features + module.out_features)
    text = config.get_text_config()
    return ModelShape(
        params=params, layers=text.num_hidden_layers, hidden=text.hidden_size, vocab=text.vocab_size, lora_params=lora
    )


def trainer_bytes(
    shape: ModelShape,
    tokens: int,
    dtype_bytes: int,
    lora: bool,
    optimizer: str = "adamw",
    gradient_checkpointing: bool = False,
    logprob_chunk_size: int = 0,
    reference_copy: bool = False,
) -> dict[str, int]:
    """Each term of the formula above, in bytes, and their sum under "total"."""
    p, n = shape.params, shape.lora_params if lora else shape.params
    grad_bytes = 4 if lora else dtype_bytes
    per_layer = tokens * shape.hidden * dtype_bytes
    if gradient_checkpointing:
        activations = shape.layers * per_layer + ACTIVATION_VALUES_PER_HIDDEN * per_layer
    else:
        activations = shape.layers * ACTIVATION_VALUES_PER_HIDDEN * per_layer
    chunk = logprob_chunk_size if 0 < logprob_chunk_size < tokens else tokens
    terms = {
        "weights": p * dtype_bytes * (2 if reference_copy and not lora else 1),
        "trainable": n * 4 if lora else 0,
        "gradients": n * grad_bytes,
        "optimizer": n * (8 if optimizer == "adamw" else 2),
        "activations": activations,
        "logits": chunk * shape.vocab * 4 * 2,
        "overhead": OVERHEAD_BYTES,
    }
    terms["total"] = sum(terms.values())
    return terms


def colocated_gpu_memory_utilization(trainer_total: int, gpu_bytes: int) -> float:
    """The share of the GPU left for vLLM beside a trainer of `trainer_total` bytes (see the module doc)."""
    utilization = round((gpu_bytes - trainer_total) / gpu_bytes - MARGIN, 3)
    if utilization < MIN_UTILIZATION:
        raise ValueError(
            f"the trainer needs an estimated {trainer_total / GIB:.1f} GiB of the GPU's "
            f"{gpu_bytes / GIB:.1f} GiB, leaving vLLM {max(utilization, 0):.0%} (grpokit.inference.vllm.memory): set "
            "inference.init_args.serve.gpu_memory_utilization yourself, or shrink the trainer (data.seq_len, "
            "model.gradient_checkpointing, model.logprob_chunk_size), or give vLLM GPUs of its own"
        )
    return utilization


def policy_trainer_bytes(policy, seq_len: int) -> dict[str, int]:
    """trainer_bytes for a grpokit Policy (its model, LoRA, dtype, optimizer, checkpointing, chunking)."""
    lora = policy.lora
    shape = model_shape(policy.model_name, lora.rank if lora else None, lora.target_modules if lora else ())
    chunk = policy._chunk_size if policy._chunk_size is not None else 2048  # the Policy's CUDA default
    return trainer_bytes(
        shape,
        tokens=seq_len,
        dtype_bytes=torch.empty((), dtype=getattr(torch, policy.dtype_name)).element_size(),
        lora=lora is not None,
        optimizer=policy.optimizer_name,
        gradient_checkpointing=policy.gradient_checkpointing,
        logprob_chunk_size=chunk,
        reference_copy=policy.loss.needs_reference,
    )


def colocated_share(policy, seq_len: int) -> float | None:
    """gpu_memory_utilization for a vLLM server beside this Policy's trainer on GPU 0 (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    return colocated_gpu_memory_utilization(
        policy_trainer_bytes(policy, seq_len)["total"], torch.cuda.get_device_properties(0).total_memory
    )
