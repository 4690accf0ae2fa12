"""Argument parsing and printing for `grpokit bench`."""

from __future__ import annotations

import argparse
import json

import torch

from grpokit.common.io import atomic_write_text


def parse_args(argv: list[str]) -> argparse.Namespace:
    import grpokit.bench

    p = argparse.ArgumentParser(
        prog="grpokit bench", description=grpokit.bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    _multiturn_args(sub.add_parser("multiturn", help="the builtin engine's prefix KV cache on and off, multi-turn"))
    _stream_args(sub.add_parser("stream", help="whole-batch vs streaming generation, long-tailed lengths"))
    _server_args(sub.add_parser("server", help="`grpokit infer`'s req/s and p50/p99 latency, vs an older tree's"))
    for name in ("generate", "train", "step"):
        s = sub.add_parser(name)
        s.add_argument(
            "--model", default="qwen3-0.6b", help="a shape (qwen3-0.6b, smollm2-135m-shape, tiny) or a model name/path"
        )
        s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        s.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32 (CPU default)")
        s.add_argument("--no-baseline", action="store_true", help="skip the naive path")
        s.add_argument("--json", default=None, help="also write the result to this file")
        if name in ("generate", "step"):
            s.add_argument("--batch", type=int, default=256)
            s.add_argument("--prompt-len", type=int, default=64)
            s.add_argument("--new-tokens", type=int, default=256)
            s.add_argument("--no-cuda-graphs", action="store_true")
            s.add_argument("--no-compile", action="store_true", help="decode step without torch.compile fusion")
            s.add_argument(
                "--lora-rank", type=int, default=0, help="serve under a random LoRA adapter (q/k/v/o) of this rank"
            )
            if name == "step":
                s.add_argument("--micro-tokens", type=int, default=8192, help="packed tokens per training micro-batch")
                s.add_argument("--steps", type=int, default=2, help="timed overlapped steps")
        else:
            s.add_argument("--tokens", type=int, default=8192, help="packed tokens per micro-batch")
            s.add_argument("--seq-len", type=int, default=320, help="length of each packed sequence")
            s.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up)")
            s.add_argument("--chunk-size", type=int, default=1024, help="tokens per log-prob chunk")
            s.add_argument("--lora-rank", type=int, default=16)
            s.add_argument(
                "--variants",
                default=None,
                help="comma list of grpokit, grpokit_dense, grpokit_compile, grpokit_compile_no_ckpt, "
                "grpokit_compile_budget_0.5, grpokit_compile_budget_0.2, naive",
            )
            s.add_argument(
                "--group-size",
                type=int,
                default=0,
                help="GRPO-shaped batch: groups of this many sequences sharing a prompt (0: random sequences)",
            )
            s.add_argument(
                "--prompt-len",
                type=int,
                default=0,
                help="with --group-size: the shared prompt's tokens (not trained on)",
            )
    return p.parse_args(argv)


def _multiturn(args: argparse.Namespace) -> dict:
    from grpokit.bench import multi_turn

    sizes = (args.conversations, args.turns, args.prompt_len, args.new_tokens, args.env_tokens, args.cache_tokens)
    return multi_turn.run(
        args.model, *sizes, args.dtype or "float32", args.device, repeats=args.repeats, threads=args.threads
    )


def _multiturn_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", default="smollm2-135m", help="a model name or path (real weights: setup loads it)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default=None, help="float32 (default) or bfloat16")
    s.add_argument("--conversations", type=int, default=8)
    s.add_argument("--turns", type=int, default=4)
    s.add_argument("--prompt-len", type=int, default=32, help="tokens of each conversation's first prompt")
    s.add_argument("--new-tokens", type=int, default=16, help="tokens sampled per conversation per turn")
    s.add_argument("--env-tokens", type=int, default=20, help="environment tokens appended after each turn")
    s.add_argument("--cache-tokens", type=int, default=8192, help="the cache variant's prefix_cache_tokens")
    s.add_argument("--repeats", type=int, default=1, help="run the workload this often; median seconds per turn")
    s.add_argument("--threads", type=int, default=None, help="torch threads (1 on a CPU shared with other jobs)")
    s.add_argument("--json", default=None, help="also write the result to this file")


def _stream_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", default="smollm2-135m", help="a model name or path (real weights: setup loads it)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default=None, help="float32 (default) or bfloat16")
    s.add_argument("--steps", type=int, default=6)
    s.add_argument("--groups", type=int, default=8, help="groups per step")
    s.add_argument("--group-size", type=int, default=4, help="completions per group")
    s.add_argument("--prompt-len", type=int, default=32)
    s.add_argument("--min-tokens", type=int, default=8, help="the shortest group's length")
    s.add_argument("--max-tokens", type=int, default=128, help="the length cap of the long tail")
    s.add_argument("--alpha", type=float, default=1.2, help="Pareto shape of the lengths (smaller: longer tail)")
    s.add_argument("--max-inflight", type=int, default=None, help="streaming's groups in flight (default: --groups)")
    s.add_argument("--repeats", type=int, default=1, help="run both variants this often; medians")
    s.add_argument("--train", action="store_true", help="also overlap each variant with Policy's training steps")
    s.add_argument("--micro-tokens", type=int, default=8192, help="with --train: packed tokens per micro-batch")
    s.add_argument("--lora-rank", type=int, default=16, help="with --train: the policy's LoRA rank")
    s.add_argument("--async-level", type=int, default=1, help="with --train: max_async_level")
    s.add_argument("--threads", type=int, default=None, help="torch threads (1 on a CPU shared with other jobs)")
    s.add_argument("--json", default=None, help="also write the result to this file")


def _server_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", default="tiny", help="tiny (the tests' random 2-layer model) or a model name/path")
    s.add_argument("--levels", default="1,8,32", help="comma list of concurrent clients")
    s.add_argument("--requests", type=int, default=64, help="requests per level per round (at least one a client)")
    s.add_argument("--rounds", type=int, default=3, help="rounds; the servers alternate within each")
    s.add_argument("--warmup", type=int, default=8, help="requests to each server before measuring")
    s.add_argument("--max-tokens", type=int, default=8, help="tokens per completion (min_tokens too)")
    s.add_argument("--threads", type=int, default=1, help="each server's torch threads (--num_threads)")
    s.add_argument(
        "--baseline-src", default=None, help="source tree of an older grpokit (a git worktree) to measure too"
    )
    s.add_argument(
        "--src", default=None, help="measure this source tree's server as the new one (default: this grpokit)"
    )
    s.add_argument("--json", "--out", dest="json", default=None, help="also write the result to this file")


def _server(args: argparse.Namespace) -> dict:
    from grpokit.bench import server

    levels = tuple(int(c) for c in args.levels.split(","))
    sizes = (levels, args.requests, args.rounds, args.warmup, args.max_tokens, args.threads)
    return server.run(args.model, *sizes, baseline_src=args.baseline_src, src=args.src)


def _stream(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    from grpokit.bench import stream

    shape = (args.steps, args.groups, args.group_size, args.prompt_len, args.min_tokens, args.max_tokens, args.alpha)
    return stream.run(
        args.model,
        *shape,
        args.max_inflight,
        args.dtype or "float32",
        args.device,
        args.repeats,
        args.threads,
        train=args.train,
        micro_tokens=args.micro_tokens,
        lora_rank=args.lora_rank,
        async_level=args.async_level,
    )


def _generate(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    from grpokit.bench import generate

    return generate.run(
        args.model,
        args.batch,
        args.prompt_len,
        args.new_tokens,
        dtype,
        args.device,
        baseline=not args.no_baseline,
        cuda_graphs=not args.no_cuda_graphs,
        compile=not args.no_compile,
        lora_rank=args.lora_rank,
    )


def _step(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    from grpokit.bench import step

    return step.run(
        args.model, args.batch, args.prompt_len, args.new_tokens, args.micro_tokens, args.steps, dtype, args.device
    )


def _train(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    from grpokit.bench import train

    return train.run(
        args.model,
        args.tokens,
        args.seq_len,
        args.steps,
        dtype,
        args.device,
        chunk_size=args.chunk_size,
        lora_rank=args.lora_rank,
        baseline=not args.no_baseline,
        variants=args.variants.split(",") if args.variants else None,
        group_size=args.group_size,
        prompt_len=args.prompt_len,
    )


BENCHES = {
    "multiturn": lambda args, dtype: _multiturn(args),
    "server": lambda args, dtype: _server(args),
    "stream": _stream,
    "generate": _generate,
    "step": _step,
    "train": _train,
}


def main(argv: list[str] | None = None) -> int:
    import sys

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    device = getattr(args, "device", "cpu")  # `server` has neither: its servers choose
    dtype = getattr(torch, getattr(args, "dtype", None) or ("bfloat16" if device.startswith("cuda") else "float32"))
    result = BENCHES[args.what](args, dtype)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        atomic_write_text(args.json, text)
    return 0
