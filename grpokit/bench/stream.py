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
`--model` may be a shape (random weights, e.g. qwen3-0.6b). Reported per variant: seconds per step
(median and total), decode steps, occupancy (rows decoding per decode step / row capacity: the
engine's busy fraction as an accelerator sees it, where a decode step costs about the same at any batch
size up to capacity; on a CPU a step with fewer rows is cheaper, so wall-clock gains are smaller than
occupancy gains), and generated tokens per second of finished groups.
Streaming ends with groups still in flight (their tokens not counted), as a run's last step does. The
trainer is not simulated: with max_async_level >= 1 a step takes max(generation, training), and this is
the generation side. `repeats` runs the pair again (order alternating) and reports the median.
"""

from __future__ import annotations

import statistics
import time

import torch

from grpokit.bench.generate import device_name
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
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    max_inflight = max_inflight or groups
    fast = "on" if device.startswith("cuda") else "off"  # the builtin engine's default path per device
    options = dict(fast=fast, prefix_cache_tokens=0, compile=False)  # CUDA graphs, no minute-long compiles
    if model_name in SHAPES:  # random weights of a published shape (no tokenizer)
        engine = shape_engine(model_name, getattr(torch, dtype), device, **options)
    else:
        engine = BuiltinEngine(dtype=dtype, device=device, **options)
        engine.setup(model_name)
        engine.weight_step = 0
    g = torch.Generator().manual_seed(seed)
    count = steps * groups + max_inflight  # streaming submits up to max_inflight beyond the last step's groups
    prompts = [torch.randint(3, engine.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(count)]
    u = torch.rand(count, generator=g, dtype=torch.float64)
    lengths = [min(max_tokens, int(min_tokens * x ** (-1.0 / alpha))) for x in u.tolist()]
    sampling = SamplingSettings(temperature=1.0, max_tokens=max_tokens, min_tokens=max_tokens, seed=seed)
    engine.generate([prompts[0][:4]], 1, SamplingSettings(max_tokens=2))  # warm-up: first-call costs
    work = dict(steps=steps, groups=groups, group_size=group_size, prompts=prompts, lengths=lengths)
    results: dict[str, list[dict]] = {"whole_batch": [], "streaming": []}
    for r in range(repeats):
        for name in ("whole_batch", "streaming") if r % 2 == 0 else ("streaming", "whole_batch"):
            if name == "whole_batch":
                results[name].append(whole_batch(engine, sampling, **work))
            else:
                results[name].append(streaming(engine, sampling, max_inflight, **work))
    summary = {name: _median(runs) for name, runs in results.items()}
    summary["speedup"] = summary["whole_batch"]["total_seconds"] / summary["streaming"]["total_seconds"]
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
        "path": "fast" if fast == "on" else "plain",
        "repeats": repeats,
        "torch": torch.__version__,
        **summary,
    }


def whole_batch(engine, sampling, steps, groups, group_size, prompts, lengths) -> dict:
    stream = engine.open_stream(sampling, groups * group_size)
    seconds, tokens = [], 0
    for s in range(steps):
        start = time.perf_counter()
        for k in range(s * groups, (s + 1) * groups):
            stream.submit(GroupRequest(k, prompts[k], group_size, max_tokens=lengths[k]))
        while stream.inflight:
            tokens += sum(len(c.token_ids) for f in stream.advance() for c in f.completions)
        seconds.append(time.perf_counter() - start)
    return _report(stream, seconds, tokens, groups * group_size)


def streaming(engine, sampling, max_inflight, steps, groups, group_size, prompts, lengths) -> dict:
    stream = engine.open_stream(sampling, max_inflight * group_size)
    seconds, tokens, finished, k = [], 0, 0, 0
    start = time.perf_counter()
    while len(seconds) < steps:
        while stream.inflight < max_inflight:
            stream.submit(GroupRequest(k, prompts[k], group_size, max_tokens=lengths[k]))
            k += 1
        for f in stream.advance():
            finished += 1
            tokens += sum(len(c.token_ids) for c in f.completions)
            if finished == groups:
                now = time.perf_counter()
                seconds.append(now - start)
                start, finished = now, 0
    report = _report(stream, seconds, tokens, max_inflight * group_size)
    stream.close()
    return report


def _report(stream, seconds: list[float], tokens: int, capacity: int) -> dict:
    return {
        "seconds_per_step": statistics.median(seconds),
        "total_seconds": sum(seconds),
        "decode_steps": stream.decode_steps,
        "occupancy": stream.decoded_rows / max(stream.decode_steps * capacity, 1),
        "tokens_per_second": tokens / sum(seconds),
    }


def _median(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}
