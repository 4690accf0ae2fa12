"""`grpokit bench generate`: the builtin engine's fast path vs Hugging Face `generate`, same model and batch.

Both sample `batch` completions of exactly `new_tokens` tokens (no stop token) from random prompts of
`prompt_len` tokens at temperature 1. Reported per path: tokens/s (new tokens / wall time, prefill
included), ms per decode step (wall time / new_tokens), peak memory; and the ratio. The roofline
estimate is the best a decode step can do when it is bound by memory: every weight byte plus the KV
cache of the average context (prompt_len + new_tokens / 2) read once per step, at the bandwidth
measured by a device-to-device copy in the same run. The engine's logprobs are checked against a plain
forward of the same model on the sampled sequences (token_mult_prob_error = mean exp|dlogp|, 1 = equal).
"""

from __future__ import annotations

import torch

from grpokit.bench.shapes import build_model, kv_bytes_per_token, measured_bandwidth, weight_bytes
from grpokit.bench.timing import peak_gib, reset_peak, timed
from grpokit.inference import SamplingSettings
from grpokit.inference.fast.continuous import generate_continuous
from grpokit.inference.fast.runner import LENGTH_BUCKET, ModelRunner


def engine_generate(
    model, prompts: list[list[int]], new_tokens: int, cuda_graphs: bool, compile: bool = True, seed: int = 0
):
    max_len = -(-(len(prompts[0]) + new_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
    runner = ModelRunner(model, num_slots=len(prompts), max_len=max_len, use_cuda_graphs=cuda_graphs, compile=compile)
    sampling = SamplingSettings(temperature=1.0, max_tokens=new_tokens, seed=seed)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    return runner, lambda: generate_continuous(runner, prompts, sampling, set(), gen)


def hf_generate(model, input_ids, new_tokens: int):
    return model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )


def forward_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Each completion token's logprob under `model` (temperature-scaled), from one plain forward over
    prompt + completion: the reference an engine's recorded logprobs are checked against."""
    ids = torch.tensor([prompt + completion], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


def logprob_agreement(model, prompts, results, count: int = 16) -> dict[str, float]:
    """Engine logprobs vs a plain forward of the same weights on `count` sampled sequences."""
    errors, max_abs = [], 0.0
    device = next(model.parameters()).device
    for prompt, (tokens, logprobs, _) in list(zip(prompts, results))[:count]:
        want = forward_logprobs(model, prompt, tokens)
        delta = torch.tensor(logprobs, device=device) - want
        errors.append(torch.exp(delta.abs()).mean().item())
        max_abs = max(max_abs, delta.abs().max().item())
    return {"token_mult_prob_error": sum(errors) / len(errors), "max_abs_logprob_diff": max_abs}


def with_lora(model, rank: int):
    """`model` under a peft LoRA adapter of `rank` on q/k/v/o with non-zero random weights."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return model.eval()


def run(
    model_name: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    dtype: torch.dtype,
    device: str,
    baseline: bool = True,
    cuda_graphs: bool = True,
    compile: bool = True,
    lora_rank: int = 0,
) -> dict:
    model = build_model(model_name, dtype, device)
    if lora_rank:
        model = with_lora(model, lora_rank)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    prompts = input_ids.tolist()
    out = {
        "bench": "generate",
        "model": model_name,
        "device": device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "lora_rank": lora_rank,
        "torch": torch.__version__,
    }
    import transformers

    out["transformers"] = transformers.__version__
    new = batch * new_tokens

    reset_peak(device)
    runner, fn = engine_generate(model, prompts, new_tokens, cuda_graphs, compile)
    warmup, _ = timed(fn, device)  # compiles and captures the graphs of every (slot, length) bucket used
    seconds, results = timed(fn, device)
    out["grpokit"] = {
        "seconds": seconds,
        "tokens_per_s": new / seconds,
        "ms_per_decode_step": 1e3 * seconds / new_tokens,
        "peak_gib": peak_gib(device),
        "cuda_graphs": runner.use_cuda_graphs,
        "graphs_captured": len(runner.graphs),
        "compiled": runner.kernels.compiled,
        "warmup_seconds": warmup,
    }
    out["logprobs_vs_forward"] = logprob_agreement(model, prompts, results)
    del runner, fn, results
    if baseline:
        reset_peak(device)
        ids = input_ids.to(device)
        with torch.no_grad():
            hf_generate(model, ids, 4)  # warm-up
            seconds, _ = timed(lambda: hf_generate(model, ids, new_tokens), device)
        out["hf_generate"] = {
            "seconds": seconds,
            "tokens_per_s": new / seconds,
            "ms_per_decode_step": 1e3 * seconds / new_tokens,
            "peak_gib": peak_gib(device),
        }
        out["speedup_vs_hf"] = out["grpokit"]["tokens_per_s"] / out["hf_generate"]["tokens_per_s"]
    bandwidth = measured_bandwidth(device)
    step_bytes = weight_bytes(model) + batch * (prompt_len + new_tokens / 2) * kv_bytes_per_token(model)
    out["roofline"] = {
        "bandwidth_gb_s": bandwidth / 1e9,
        "bytes_per_step_gb": step_bytes / 1e9,
        "tokens_per_s": batch * bandwidth / step_bytes,
    }
    out["fraction_of_roofline"] = out["grpokit"]["tokens_per_s"] / out["roofline"]["tokens_per_s"]
    return out


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import os

    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
