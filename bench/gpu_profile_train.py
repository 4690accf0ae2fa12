"""Top CUDA kernels of one grpokit LoRA optimizer step (bench train's grpokit path), via torch.profiler.

PYTHONPATH=. python bench/gpu_profile_train.py [--model qwen3-0.6b --tokens 8192]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from grpokit.bench.shapes import model_folder
from grpokit.bench.trainer import bench_policy, micro_batch, sample_with_policy
from grpokit.types import TrainingBatch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--checkpointing", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--compile", type=int, default=0)
    args = p.parse_args()
    with model_folder(args.model, torch.bfloat16, "cuda") as folder:
        policy = bench_policy(
            folder,
            torch.bfloat16,
            "cuda",
            16,
            args.chunk_size,
            checkpointing=bool(args.checkpointing),
            compile=bool(args.compile),
        )
    batch = TrainingBatch(
        step=0, micro_batches=[micro_batch(args.tokens, args.seq_len, policy.lm.config.vocab_size, "cuda")]
    )
    opt = policy.make_optimizer()
    sample_with_policy(policy, batch)
    policy.train_batch(batch, opt)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        policy.train_batch(batch, opt)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))


if __name__ == "__main__":
    main()
