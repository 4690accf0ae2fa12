"""Top CUDA kernels of one grpokit LoRA train step (bench train's grpokit path), via torch.profiler.

    PYTHONPATH=. python bench/gpu_profile_train.py [--model qwen3-0.6b --tokens 8192]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from grpokit.bench.train import lora_model, packed_batch
from grpokit.logprobs import packed_token_logprobs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--checkpointing", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=1024)
    args = p.parse_args()
    lm = lora_model(args.model, torch.bfloat16, "cuda", 16, checkpointing=bool(args.checkpointing), varlen=True)
    ids, pos, lens, adv = packed_batch(args.tokens, args.seq_len, lm.config.vocab_size, "cuda")

    def step():
        lp = packed_token_logprobs(lm, ids, pos, lens, chunk_size=args.chunk_size)
        (-(lp * adv).sum() / args.tokens).backward()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))


if __name__ == "__main__":
    main()
