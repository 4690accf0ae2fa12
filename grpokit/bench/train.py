"""`grpokit bench train`: one LoRA policy-gradient step on `tokens` packed tokens, grpokit vs naive.

Both paths train the same LoRA adapter (rank `lora_rank`, alpha 2 x rank, on q/k/v/o) of the same
weights on the same packed micro-batch (sequences of `seq_len` tokens, a random advantage per token):
- naive: the model's full logits, a float32 log_softmax over the whole vocabulary, sequences kept
  apart by a dense block-diagonal [T, T] mask (grpokit's CPU default), no activation checkpointing,
  the loss -sum(logprob * advantage) / tokens, AdamW;
- grpokit: what `grpokit fit` runs, through grpokit.trainer.policy.Policy (grpokit.bench.trainer): varlen
  attention (grpokit.common.varlen), log-probabilities in chunks of `chunk_size` tokens
  (grpokit.common.logprobs.chunked_logprobs), activation checkpointing, Policy's default loss (AIPO, with
  the engine's logprobs set to the policy's own before the first step), gradient clipping at 1.0,
  Policy's AdamW;
- grpokit_dense: what fit runs on the CPU: dense block-diagonal mask, full logits, no checkpointing,
  shared prefixes (grpokit.common.prefix_tree), the LM head on the trained tokens only;
- grpokit_compile: the same as grpokit with `model.compile: true` (each decoder layer torch.compiled);
- grpokit_compile_no_ckpt: compiled, without activation checkpointing (more memory, no recompute);
- grpokit_compile_budget_B: compiled without checkpointing, but AOTAutograd recomputes the cheapest
  activations so that each layer saves at most the fraction B of them (`model.activation_memory_budget`).
`group_size` G > 0 makes the batch GRPO-shaped: groups of G sequences that share their first
`prompt_len` tokens, trained on the rest only (default: random sequences, every token trained on).
Reported: tokens/s and ms per step (mean of `steps` after one warm-up), peak memory, the ratios, and
the largest difference between the two paths' log-probabilities before the first update.
"""

from __future__ import annotations

import functools

import torch

from grpokit.bench.generate import device_name
from grpokit.bench.shapes import build_model, model_folder
from grpokit.bench.timing import peak_gib, reset_peak, timed
from grpokit.bench.trainer import bench_policy, micro_batch, packed_batch, sample_with_policy
from grpokit.common.logprobs import packed_attention_mask
from grpokit.types import TrainingBatch


def naive_lora_model(name: str, dtype: torch.dtype, device: str, rank: int):
    from peft import LoraConfig, get_peft_model

    lm = build_model(name, dtype, device)
    lm = get_peft_model(
        lm,
        LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
        ),
    )
    return lm.train()


def naive_logprobs(lm, ids_T, pos_T, lens_N):

    mask = packed_attention_mask(lens_N, next(lm.parameters()).dtype)
    logits_TV = lm(input_ids=ids_T[None], position_ids=pos_T[None], attention_mask=mask).logits[0].float()
    picked = torch.log_softmax(logits_TV[:-1], -1).gather(-1, ids_T[1:, None]).squeeze(-1)
    return torch.cat([picked.new_zeros(1), torch.where(pos_T[1:] == 0, torch.zeros_like(picked), picked)])


def naive_step(
    model_name: str,
    tokens: int,
    seq_len: int,
    dtype: torch.dtype,
    device: str,
    lora_rank: int,
    group_size: int = 0,
    prompt_len: int = 0,
):
    """The naive path's step (loss -sum(logprob * advantage * mask) / tokens, AdamW) and its first logprobs
    on the trained tokens."""
    lm = naive_lora_model(model_name, dtype, device, lora_rank)
    ids_T, pos_T, lens_N, adv_T, mask_T = packed_batch(
        tokens, seq_len, lm.config.vocab_size, device, group_size, prompt_len
    )
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)

    def step():
        lp_T = naive_logprobs(lm, ids_T, pos_T, lens_N)
        (-(lp_T * adv_T * mask_T).sum() / tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (lp_T * mask_T).detach()  # the trained tokens', as grpokit's first logprobs (sample_with_policy)

    return step, step()  # the first call is the warm-up (same initial weights in both paths: seed 0)


VARIANTS = {  # grpokit variant: bench_policy settings
    "grpokit": {"checkpointing": True, "compile": False},
    "grpokit_dense": {
        "checkpointing": False,
        "compile": False,
        "attention": "dense",
        "chunk_size": 0,
    },  # fit's CPU default
    "grpokit_compile": {"checkpointing": True, "compile": True},
    "grpokit_compile_no_ckpt": {"checkpointing": False, "compile": True},
    "grpokit_compile_budget_0.5": {"checkpointing": False, "compile": True, "activation_memory_budget": 0.5},
    "grpokit_compile_budget_0.2": {"checkpointing": False, "compile": True, "activation_memory_budget": 0.2},
}


def grpokit_step(
    model: str,
    tokens: int,
    seq_len: int,
    dtype: torch.dtype,
    device: str,
    lora_rank: int,
    chunk_size: int,
    variant: str,
    group_size: int = 0,
    prompt_len: int = 0,
):
    """The Policy's optimizer step for `variant` and its logprobs before the first update (then one warm-up step)."""
    settings = {"chunk_size": chunk_size, **VARIANTS[variant]}
    policy = bench_policy(model, dtype, device, lora_rank, **settings)
    batch = TrainingBatch(
        step=0,
        micro_batches=[micro_batch(tokens, seq_len, policy.lm.config.vocab_size, device, group_size, prompt_len)],
    )
    opt = policy.make_optimizer()
    first_logprobs_T = sample_with_policy(policy, batch)
    step = functools.partial(policy.train_batch, batch, opt)
    step()  # warm-up (compiles)
    return step, first_logprobs_T


def run(
    model_name: str,
    tokens: int,
    seq_len: int,
    steps: int,
    dtype: torch.dtype,
    device: str,
    chunk_size: int = 1024,
    lora_rank: int = 16,
    baseline: bool = True,
    variants: list[str] | None = None,
    group_size: int = 0,
    prompt_len: int = 0,
) -> dict:
    import torch._functorch.config as functorch_config
    import transformers

    out = {
        "bench": "train",
        "model": model_name,
        "device": device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "tokens": tokens,
        "seq_len": seq_len,
        "lora_rank": lora_rank,
        "chunk_size": chunk_size,
        "group_size": group_size,
        "prompt_len": prompt_len,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    first_logprobs = {}
    names = variants or (["grpokit"] + (["naive"] if baseline else []))
    unknown = sorted(set(names) - set(VARIANTS) - {"naive"})
    if unknown:
        raise ValueError(f"unknown variants {unknown}: choose from {sorted(VARIANTS) + ['naive']}")
    with model_folder(model_name, dtype, device) as folder:
        for name in names:
            functorch_config.activation_memory_budget = 1.0  # Policy sets it for a variant with a budget
            torch._dynamo.reset()  # recompile under this variant's budget
            reset_peak(device)
            if name == "naive":
                step, first_logprobs[name] = naive_step(
                    model_name, tokens, seq_len, dtype, device, lora_rank, group_size, prompt_len
                )
            else:
                step, first_logprobs[name] = grpokit_step(
                    folder, tokens, seq_len, dtype, device, lora_rank, chunk_size, name, group_size, prompt_len
                )
            seconds, _ = timed(step, device, repeats=steps)
            out[name] = {"ms_per_step": 1e3 * seconds, "tokens_per_s": tokens / seconds, "peak_gib": peak_gib(device)}
            del step  # frees the model before the next variant's peak is measured
    for name in names:
        if name != "naive" and "naive" in out:
            out[name]["speedup_vs_naive"] = out[name]["tokens_per_s"] / out["naive"]["tokens_per_s"]
            out[name]["memory_fraction_of_naive"] = out[name]["peak_gib"] / out["naive"]["peak_gib"]
    if "naive" in out and "grpokit" in out:
        out["speedup_vs_naive"] = out["grpokit"]["tokens_per_s"] / out["naive"]["tokens_per_s"]
        out["memory_fraction_of_naive"] = out["grpokit"]["peak_gib"] / out["naive"]["peak_gib"]
    if "naive" in out:  # both paths' first logprobs are 0 outside the trained tokens
        for name in first_logprobs:
            if name != "naive":
                diff = (first_logprobs[name] - first_logprobs["naive"]).abs().max().item()
                out[name]["max_abs_logprob_diff_first_step"] = diff
                if name == "grpokit":
                    out["max_abs_logprob_diff_first_step"] = diff
    return out
