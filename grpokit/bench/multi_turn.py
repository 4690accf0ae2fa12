"""`grpokit bench multiturn`: the builtin engine's plain path on a multi-turn workload, its prefix KV cache
(grpokit.inference.prefix_cache) on and off, side by side in one process.

`conversations` conversations of `turns` turns each start from a random prompt of `prompt_len` tokens.
Every turn samples exactly `new_tokens` tokens per conversation (min_tokens = max_tokens: no row stops
early, so both variants do the same decode work), then `env_tokens` random tokens (the environment's
answer) are appended, and the next turn's prompt is the whole conversation so far, one `generate` call per
turn as grpokit.environments.multi_turn makes it. Both variants run on one engine (one copy of the
weights), each with its own cache and its own conversations, alternating turn by turn (which one goes
first alternates too), so that other load on the machine hits both alike; `repeats` runs the whole
workload again from fresh caches and reports each turn's median seconds. Reported per turn and variant:
prompt tokens sent, prefill tokens computed and reused, wall seconds; and whether the variants sampled
the same tokens (same seeds) with the largest |logprob difference| between them.
"""

from __future__ import annotations

import functools
import statistics

import torch

from grpokit.bench.generate import device_name
from grpokit.bench.timing import timed
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.prefix_cache import PrefixCache


def run(
    model_name: str,
    conversations: int,
    turns: int,
    prompt_len: int,
    new_tokens: int,
    env_tokens: int,
    cache_tokens: int,
    dtype: str = "float32",
    device: str = "cpu",
    repeats: int = 1,
    threads: int | None = None,
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    engine = BuiltinEngine(dtype=dtype, device=device, fast="off", prefix_cache_tokens=cache_tokens)
    engine.setup(model_name)
    g = torch.Generator().manual_seed(0)
    start = [torch.randint(3, engine.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(conversations)]
    env = [
        [torch.randint(3, engine.vocab_size, (env_tokens,), generator=g).tolist() for _ in start] for _ in range(turns)
    ]
    engine.generate([start[0][:4]], 1, SamplingSettings(max_tokens=2))  # warm-up: first-call costs
    capacity = engine.prefix_cache.max_tokens  # 0 where the model cannot use one
    runs = [workload(engine, capacity, start, env, new_tokens, device) for _ in range(repeats)]
    per_turn = runs[0]
    for turn, row in enumerate(per_turn):  # the same tokens every repeat (same seeds); seconds: the median
        for name in ("off", "on"):
            row[name]["seconds"] = statistics.median(r[turn][name]["seconds"] for r in runs)
        row["speedup"] = row["off"]["seconds"] / row["on"]["seconds"]
    total = {
        name: {k: sum(r[name][k] for r in per_turn) for k in ("prefill_tokens", "reused_tokens", "seconds")}
        for name in ("off", "on")
    }
    total["speedup"] = total["off"]["seconds"] / total["on"]["seconds"]
    sizes = dict(conversations=conversations, turns=turns, prompt_len=prompt_len, new_tokens=new_tokens)
    return {
        "bench": "multiturn",
        "model": model_name,
        "device": device_name(device),
        "dtype": dtype,
        **sizes,
        "env_tokens": env_tokens,
        "prefix_cache_tokens": cache_tokens,
        "repeats": repeats,
        "torch": torch.__version__,
        "per_turn": per_turn,
        "total": total,
    }


def workload(engine: BuiltinEngine, capacity: int, start: list, env: list, new_tokens: int, device) -> list[dict]:
    """Every turn once for both variants, from fresh caches and the same first prompts."""
    caches = {"off": PrefixCache(0), "on": PrefixCache(capacity)}
    convs = {name: [list(p) for p in start] for name in caches}
    return [one_turn(engine, turn, caches, convs, env[turn], new_tokens, device) for turn in range(len(env))]


def one_turn(engine: BuiltinEngine, turn: int, caches: dict, convs: dict, env: list, new_tokens: int, device) -> dict:
    """One generate call per variant (the first alternates), timed; each variant's conversations grow by
    their replies and `env`."""
    sampling = SamplingSettings(temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens, seed=1 + turn)
    row, replies = {"turn": turn}, {}
    for name in ("off", "on") if turn % 2 == 0 else ("on", "off"):
        cache = engine.prefix_cache = caches[name]
        computed, reused = cache.computed_tokens, cache.reused_tokens
        seconds, result = timed(functools.partial(engine.generate, convs[name], 1, sampling), device)
        replies[name] = [group[0] for group in result]
        row[name] = {
            "prompt_tokens": sum(map(len, convs[name])),
            "prefill_tokens": cache.computed_tokens - computed,
            "reused_tokens": cache.reused_tokens - reused,
            "seconds": seconds,
        }
        convs[name] = [c + r.token_ids + e for c, r, e in zip(convs[name], replies[name], env)]
    return {**row, **agreement(replies["on"], replies["off"])}


def agreement(on: list, off: list) -> dict:
    """Rows whose tokens are the same with and without the cache, and the largest |logprob difference|
    over those rows."""
    same = [(a, b) for a, b in zip(on, off) if a.token_ids == b.token_ids]
    diffs = [abs(x - y) for a, b in same for x, y in zip(a.logprobs, b.logprobs)]
    return {"same_tokens": f"{len(same)}/{len(on)}", "max_abs_logprob_diff": max(diffs, default=0.0)}
