"""`grpokit bench step`: a whole GRPO step with max_async_level 1 on one device, vs its parts alone.

A GRPO step samples `batch` completions (prompt_len + new_tokens each, the builtin engine's fast path)
and trains one optimizer step on all their tokens (micro-batches of `micro_tokens` packed tokens,
grpokit.trainer.policy.Policy's step with model.compile on CUDA, see grpokit.bench.trainer). With
max_async_level 1 the engine samples step n+1's rollouts while the trainer trains on step n's, so the
ideal step time is max(generation, training).
Here both run on the same GPU: the engine in a thread on its own CUDA stream, the trainer on the main
stream. Reported: generation alone, training alone, the overlapped step (mean of `steps`), and the
ratio step / max(generation, training) (1.0 = perfect overlap, 2.0 = no overlap at all for equal parts).
"""

from __future__ import annotations

import threading
import time

import torch

from grpokit.bench.generate import device_name, engine_generate
from grpokit.bench.shapes import build_model, model_folder
from grpokit.bench.timing import sync, timed
from grpokit.bench.trainer import bench_policy, micro_batch, sample_with_policy
from grpokit.types import TrainingBatch


def run(
    model_name: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    micro_tokens: int,
    steps: int,
    dtype: torch.dtype,
    device: str,
) -> dict:
    engine_model = build_model(model_name, dtype, device)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, engine_model.config.vocab_size, (batch, prompt_len), generator=g).tolist()
    _, generate = engine_generate(
        engine_model, prompts, new_tokens, cuda_graphs=True, compile=device.startswith("cuda")
    )

    with model_folder(model_name, dtype, device) as folder:
        policy = bench_policy(folder, dtype, device, 16, 1024, checkpointing=True, compile=device.startswith("cuda"))
    seq_len = prompt_len + new_tokens
    total = batch * seq_len
    mb = micro_batch(micro_tokens, seq_len, policy.lm.config.vocab_size, device)
    train_batch = TrainingBatch(step=0, micro_batches=[mb] * -(-total // micro_tokens))
    opt = policy.make_optimizer()
    sample_with_policy(policy, train_batch)

    def train() -> None:
        policy.train_batch(train_batch, opt)

    generate()  # warm-ups: compile and capture
    train()
    gen_s, _ = timed(generate, device)
    train_s, _ = timed(train, device)

    side = torch.cuda.Stream() if device.startswith("cuda") else None

    def generate_on_side_stream() -> None:
        if side is None:
            generate()
            return
        with torch.cuda.stream(side):
            generate()
        side.synchronize()

    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        worker = threading.Thread(target=generate_on_side_stream)
        worker.start()  # rollouts for step n+1 ...
        train()  # ... while the trainer trains on step n
        worker.join()
        sync(device)
    step_s = (time.perf_counter() - start) / steps
    return {
        "bench": "step",
        "model": model_name,
        "device": device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "train_tokens": total,
        "micro_tokens": micro_tokens,
        "generation_s": gen_s,
        "training_s": train_s,
        "overlapped_step_s": step_s,
        "ratio_to_max": step_s / max(gen_s, train_s),
        "ratio_to_sum": step_s / (gen_s + train_s),
    }
