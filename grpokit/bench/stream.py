"""`grpokit bench stream`: whole-batch vs streaming generation on the builtin engine, side by side in one
process, on a long-tailed length distribution.

Workload: `steps` steps of `groups` groups x `group_size` completions from random prompts of `prompt_len`
tokens. Each group's length is drawn from a Pareto(`alpha`) distribution above `min_tokens`, cut at
`max_tokens` (most completions short, a few long: the tail of reasoning lengths), and every row of a group
runs exactly that long (EOS masked until then, the group's own max_tokens), so both variants do the same
decode work per group:

- whole-batch: each step's groups are admitted together into an idle stream and decoded until the
  last one finishes, as `generate` does (grpokit.orchestrator.loop without data.streaming);
- streaming: `max_inflight` groups in the stream (default: `groups`, the same row capacity), a new group
  submitted as soon as one finishes, a step's batch complete when `groups` more have finished
  (grpokit.orchestrator.streaming).

On CUDA the fast path streams (grpokit.inference.fast.stream, CUDA graphs, no torch.compile), and
`--model` may be a shape (random weights, e.g. qwen3-0.6b). The engine's max_batch_size (the fast
path's slots) is the larger variant's rows, so neither queues rows behind its slots. Reported per
variant: seconds per step (median and total), decode steps, rows, occupancy (rows decoding per decode
step / rows: the engine's busy fraction as an accelerator sees it, where a decode step costs about the
same at any batch size up to capacity; on a CPU a step with fewer rows is cheaper, so wall-clock gains
are smaller than occupancy gains), and generated tokens per second of finished groups.
Streaming ends with groups still in flight (their tokens not counted), as a run's last step does.
`repeats` runs the pair again (order alternating) and reports the median.

With `train`, each variant also runs overlapped with training (grpokit.bench.overlap): one optimizer step
of grpokit's Policy per batch (LoRA, `micro_tokens` micro-batches; a step's tokens are its groups' prompts
and mean completion length, a group's rows share their prompt, the completions are trained on), with
generation in a thread under `max_async_level` `async_level`: whole-batch starts a step's groups once the
weights allow, streaming submits a group once the weights allow the step it will land in (as
grpokit.orchestrator.streaming counts it) and decodes the groups in flight meanwhile. Reported per
variant: the overlapped step time, its ratio to max(generation alone, training alone) (the figure a whole
async GRPO step is judged by: 1.0 is a perfect overlap) and to their sum (above 1.0: overlapping cost
more than running one after the other, as when both share a CPU's few cores).
"""

from __future__ import annotations

import statistics
import time

import torch

from grpokit.bench.generate import device_name
from grpokit.bench.overlap import AsyncBound, overlapped, training_step
from grpokit.bench.shapes import SHAPES, shape_engine
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.streams import GroupRequest


def run(
    model_name: str,
    steps: int = 6,
    groups: int = 8,
    group_size: int = 4,
    prompt_len: int = 32,
    min_tokens: int = 8,
    max_tokens: int = 128,
    alpha: float = 1.2,
    max_inflight: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    repeats: int = 1,
    threads: int | None = None,
    seed: int = 0,
    train: bool = False,
    micro_tokens: int = 8192,
    lora_rank: int = 16,
    async_level: int = 1,
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    max_inflight = max_inflight or groups
    engine = _engine(model_name, dtype, device, max(groups, max_inflight) * group_size)
    count = steps * groups + max_inflight  # streaming submits up to max_inflight beyond the last step's groups
    prompts, lengths = _workload(engine.vocab_size, count, prompt_len, min_tokens, max_tokens, alpha, seed)
    sampling = SamplingSettings(temperature=1.0, max_tokens=max_tokens, min_tokens=max_tokens, seed=seed)
    engine.generate([prompts[0][:4]], 1, SamplingSettings(max_tokens=2))  # warm-up: first-call costs
    work = dict(steps=steps, groups=groups, group_size=group_size, prompts=prompts, lengths=lengths)
    work["max_len"] = prompt_len + max_tokens  # the KV cache's length; the model's own context would be GiBs
    variants = {
        "whole_batch": lambda bound=None: whole_batch(engine, sampling, **work, bound=bound),
        "streaming": lambda bound=None: streaming(engine, sampling, max_inflight, **work, bound=bound),
    }
    trainer = None
    if train:
        mean_len = statistics.mean(lengths[: steps * groups])
        tokens = round(groups * group_size * (prompt_len + mean_len))  # a step's packed tokens
        seq_len = prompt_len + round(mean_len)
        shape = (tokens, seq_len, micro_tokens, lora_rank, group_size, prompt_len)
        fn, seconds = training_step(model_name, getattr(torch, dtype), device, *shape)
        trainer = dict(fn=fn, seconds=seconds, tokens_per_step=tokens, micro_tokens=micro_tokens, lora_rank=lora_rank)
    summary = _measure(variants, repeats, trainer, steps, device, async_level)
    return {
        "bench": "stream",
        "model": model_name,
        "device": device_name(device),
        "dtype": dtype,
        "steps": steps,
        "groups": groups,
        "group_size": group_size,
        "prompt_len": prompt_len,
        "lengths": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths), "alpha": alpha},
        "max_inflight": max_inflight,
        "path": "fast" if engine.fast else "plain",
        "repeats": repeats,
        "torch": torch.__version__,
        **summary,
    }


def _measure(variants: dict, repeats: int, trainer: dict | None, steps: int, device: str, async_level: int) -> dict:
    """Each variant alone, and overlapped with `trainer`'s step when there is one, `repeats` times (the
    order alternating); the medians, and the speedups of streaming over whole-batch."""
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(repeats):
        for name in list(variants) if r % 2 == 0 else reversed(list(variants)):
            result = variants[name]()
            if trainer:
                result |= overlapped(variants[name], trainer["fn"], steps, device, async_level)
                generation, training = result["seconds_per_step"], trainer["seconds"]
                result["ratio_to_max"] = result["overlapped_step_s"] / max(generation, training)
                result["ratio_to_sum"] = result["overlapped_step_s"] / (generation + training)
            results[name].append(result)
    summary = {name: _median(runs) for name, runs in results.items()}
    summary["speedup"] = summary["whole_batch"]["total_seconds"] / summary["streaming"]["total_seconds"]
    if trainer:
        summary["training"] = {k: v for k, v in trainer.items() if k != "fn"} | {"async_level": async_level}
        whole, streamed = summary["whole_batch"], summary["streaming"]
        summary["step_speedup"] = whole["overlapped_step_s"] / streamed["overlapped_step_s"]
    return summary


def _engine(model_name: str, dtype: str, device: str, rows: int) -> BuiltinEngine:
    """The builtin engine on its default path for `device` (the fast one on CUDA: CUDA graphs, no
    minute-long compiles; the plain one elsewhere), around a shape's random weights or a real model,
    decoding `rows` rows at once (its max_batch_size: the fast path's slots)."""
    fast = "on" if device.startswith("cuda") else "off"
    options = dict(fast=fast, prefix_cache_tokens=0, compile=False, max_batch_size=rows)
    if model_name in SHAPES:  # random weights of a published shape (no tokenizer)
        return shape_engine(model_name, getattr(torch, dtype), device, **options)
    engine = BuiltinEngine(dtype=dtype, device=device, **options)
    engine.setup(model_name)
    engine.weight_step = 0
    return engine


def _workload(vocab: int, count: int, prompt_len: int, min_tokens: int, max_tokens: int, alpha: float, seed: int):
    """`count` random prompts and their groups' lengths: Pareto(alpha) above min_tokens, cut at max_tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(count)]
    u = torch.rand(count, generator=g, dtype=torch.float64)
    return prompts, [min(max_tokens, int(min_tokens * x ** (-1.0 / alpha))) for x in u.tolist()]


def whole_batch(engine, sampling, steps, groups, group_size, prompts, lengths, max_len=None, bound=None) -> dict:
    """`steps` steps of `groups` groups each, a step's groups started together once `bound` allows."""
    bound = bound or AsyncBound(None)
    stream = engine.open_stream(sampling, groups * group_size, max_len=max_len)
    seconds, tokens = [], 0
    for s in range(steps):
        bound.wait_to_start(s)
        start = time.perf_counter()
        for k in range(s * groups, (s + 1) * groups):
            stream.submit(GroupRequest(k, prompts[k], group_size, max_tokens=lengths[k]))
        while stream.inflight:
            tokens += sum(len(c.token_ids) for f in stream.advance() for c in f.completions)
        seconds.append(time.perf_counter() - start)
        bound.batch_done()
    report = _report(stream, seconds, tokens)
    stream.close()  # its KV cache and graphs go now, not at the next collection
    return report


def streaming(
    engine, sampling, max_inflight, steps, groups, group_size, prompts, lengths, max_len=None, bound=None
) -> dict:
    """Up to `max_inflight` groups in the stream until `steps` batches of `groups` have finished; group k
    lands in batch k // groups and is submitted once `bound` allows that batch."""
    bound = bound or AsyncBound(None)
    stream = engine.open_stream(sampling, max_inflight * group_size, max_len=max_len)
    seconds, tokens, finished, k = [], 0, 0, 0
    start = time.perf_counter()
    while len(seconds) < steps:
        if not stream.inflight:
            bound.wait_to_start(k // groups)
        while stream.inflight < max_inflight and bound.may_start(k // groups):
            stream.submit(GroupRequest(k, prompts[k], group_size, max_tokens=lengths[k]))
            k += 1
        for f in stream.advance():
            finished += 1
            tokens += sum(len(c.token_ids) for c in f.completions)
            if finished == groups:
                now = time.perf_counter()
                seconds.append(now - start)
                start, finished = now, 0
                bound.batch_done()
    report = _report(stream, seconds, tokens)
    stream.close()
    return report


def _report(stream, seconds: list[float], tokens: int) -> dict:
    """Occupancy counts against the rows the stream decodes at once (its max_rows, at most the engine's
    max_batch_size), not the rows asked for."""
    return {
        "seconds_per_step": statistics.median(seconds),
        "total_seconds": sum(seconds),
        "decode_steps": stream.decode_steps,
        "rows": stream.max_rows,
        "occupancy": stream.decoded_rows / max(stream.decode_steps * stream.max_rows, 1),
        "tokens_per_second": tokens / sum(seconds),
    }


def _median(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}
