"""`grpokit bench train`: one LoRA policy-gradient step on `tokens` packed tokens, grpokit vs naive.

Both paths train the same LoRA adapter (rank `lora_rank` on q/k/v/o) on the same packed micro-batch
(sequences of `seq_len` tokens) with the loss -sum(logprob * advantage) / tokens and AdamW:
- naive: the model's full logits, a float32 log_softmax over the whole vocabulary, sequences kept
  apart by a dense block-diagonal [T, T] mask (grpokit's CPU default), no activation checkpointing;
- grpokit: what `grpokit fit` runs on CUDA: varlen attention (grpokit.varlen), log-probabilities in
  chunks of `chunk_size` tokens (grpokit.logprobs.chunked_logprobs), activation checkpointing, fused
  AdamW on CUDA;
- grpokit_compile: the same with `model.compile: true` (each decoder layer torch.compiled);
- grpokit_compile_no_ckpt: compiled, without activation checkpointing (more memory, no recompute);
- grpokit_compile_budget_B: compiled without checkpointing, but AOTAutograd recomputes the cheapest
  activations so that each layer saves at most the fraction B of them
  (torch._functorch.config.activation_memory_budget).
Reported: tokens/s and ms per step (mean of `steps` after one warm-up), peak memory, the ratios, and
the largest difference between the two paths' log-probabilities on the first step.
"""

from __future__ import annotations

import torch

from grpokit.bench.generate import device_name
from grpokit.bench.shapes import build_model
from grpokit.bench.timing import peak_gib, reset_peak, timed
from grpokit.logprobs import packed_token_logprobs


def packed_batch(tokens: int, seq_len: int, vocab: int, device: str):
    lens = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    g = torch.Generator().manual_seed(0)
    ids_T = torch.randint(3, vocab, (tokens,), generator=g).to(device)
    pos_T = torch.cat([torch.arange(n) for n in lens]).to(device)
    adv_T = torch.randn(tokens, generator=g).to(device)
    return ids_T, pos_T, torch.tensor(lens, device=device), adv_T


def lora_model(name: str, dtype: torch.dtype, device: str, rank: int, checkpointing: bool, varlen: bool, compile: bool = False):
    from peft import LoraConfig, get_peft_model

    lm = build_model(name, dtype, device)
    if checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm = get_peft_model(lm, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    if checkpointing:
        lm.enable_input_require_grads()
    if varlen:
        from grpokit.varlen import use_varlen

        use_varlen(lm)
    if compile:
        from grpokit.models import compile_decoder_layers

        compile_decoder_layers(lm)
    return lm.train()


def naive_logprobs(lm, ids_T, pos_T, lens_N):
    from grpokit.logprobs import packed_attention_mask

    mask = packed_attention_mask(lens_N, next(lm.parameters()).dtype)
    logits_TV = lm(input_ids=ids_T[None], position_ids=pos_T[None], attention_mask=mask).logits[0].float()
    picked = torch.log_softmax(logits_TV[:-1], -1).gather(-1, ids_T[1:, None]).squeeze(-1)
    return torch.cat([picked.new_zeros(1), torch.where(pos_T[1:] == 0, torch.zeros_like(picked), picked)])


VARIANTS = {  # name: (fast path, activation checkpointing, compile, compiled-region activation memory budget)
    "grpokit": (True, True, False, None),
    "grpokit_compile": (True, True, True, None),
    "grpokit_compile_no_ckpt": (True, False, True, None),
    "grpokit_compile_budget_0.5": (True, False, True, 0.5),
    "grpokit_compile_budget_0.2": (True, False, True, 0.2),
    "naive": (False, False, False, None),
}


def run(model_name: str, tokens: int, seq_len: int, steps: int, dtype: torch.dtype, device: str, chunk_size: int = 1024, lora_rank: int = 16, baseline: bool = True, variants: list[str] | None = None) -> dict:
    import transformers

    out = {"bench": "train", "model": model_name, "device": device_name(device), "dtype": str(dtype).replace("torch.", ""),
           "tokens": tokens, "seq_len": seq_len, "lora_rank": lora_rank, "chunk_size": chunk_size,
           "torch": torch.__version__, "transformers": transformers.__version__}
    first_logprobs = {}
    names = variants or (["grpokit"] + (["naive"] if baseline else []))
    for name in names:
        fast, ckpt, compile, budget = VARIANTS[name]
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = 1.0 if budget is None else budget
        torch._dynamo.reset()  # recompile under this variant's budget
        reset_peak(device)
        lm = lora_model(model_name, dtype, device, lora_rank, checkpointing=ckpt, varlen=fast, compile=compile)
        ids_T, pos_T, lens_N, adv_T = packed_batch(tokens, seq_len, lm.config.vocab_size, device)
        params = [p for p in lm.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5, fused=device.startswith("cuda") and fast)

        def step():
            lp_T = packed_token_logprobs(lm, ids_T, pos_T, lens_N, chunk_size=chunk_size, compile=compile) if fast else naive_logprobs(lm, ids_T, pos_T, lens_N)
            (-(lp_T * adv_T).sum() / tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return lp_T.detach()

        first_logprobs[name] = step()  # warm-up (same initial weights in both paths: seed 0)
        seconds, _ = timed(step, device, repeats=steps)
        out[name] = {"ms_per_step": 1e3 * seconds, "tokens_per_s": tokens / seconds, "peak_gib": peak_gib(device)}
        del lm, opt, params
    for name in names:
        if name != "naive" and "naive" in out:
            out[name]["speedup_vs_naive"] = out[name]["tokens_per_s"] / out["naive"]["tokens_per_s"]
            out[name]["memory_fraction_of_naive"] = out[name]["peak_gib"] / out["naive"]["peak_gib"]
    if "naive" in out and "grpokit" in out:
        out["speedup_vs_naive"] = out["grpokit"]["tokens_per_s"] / out["naive"]["tokens_per_s"]
        out["memory_fraction_of_naive"] = out["grpokit"]["peak_gib"] / out["naive"]["peak_gib"]
        out["max_abs_logprob_diff_first_step"] = (first_logprobs["grpokit"] - first_logprobs["naive"]).abs().max().item()
    return out
