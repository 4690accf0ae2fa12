"""Where a decode step's time goes on GPU: graph replay per length bucket, sampling, bookkeeping.

PYTHONPATH=. python bench/gpu_profile_decode.py [--model qwen3-0.6b --batch 256]
"""

from __future__ import annotations

import argparse
import json

import torch

from grpokit.bench.shapes import build_model
from grpokit.inference.fast.runner import ModelRunner
from grpokit.inference.fast.sampling import sample_tokens


def cuda_ms(fn, n: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    model = build_model(args.model, torch.bfloat16, "cuda")
    runner = ModelRunner(model, num_slots=args.batch, max_len=384, use_cuda_graphs=True)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (args.batch, 64), generator=g).tolist()
    runner.prefill(prompts, list(range(args.batch)))
    runner.positions_B.fill_(64)
    report = {}
    for s in (128, 256, 384):
        report[f"replay_s{s}_ms"] = cuda_ms(lambda s=s: runner.step(args.batch, s))
        runner.use_cuda_graphs = False
        report[f"eager_s{s}_ms"] = cuda_ms(lambda s=s: runner.step(args.batch, s), n=10)
        runner.use_cuda_graphs = True
    logits = runner.logits_BV[: args.batch]
    gen = torch.Generator(device="cuda").manual_seed(0)
    report["sample_gumbel_ms"] = cuda_ms(lambda: sample_tokens(logits, 1.0, 1.0, gen))
    report["sample_multinomial_ms"] = cuda_ms(
        lambda: torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)
    )
    report["lm_head_only_ms"] = cuda_ms(
        lambda: model.lm_head(torch.zeros(args.batch, model.config.hidden_size, device="cuda", dtype=torch.bfloat16))
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
