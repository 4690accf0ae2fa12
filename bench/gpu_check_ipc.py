"""GPU check of IPCBroadcast's CUDA path: trainer and engine processes, bit-identical weights per step.

    PYTHONPATH=. python bench/gpu_check_ipc.py [--size-mb 64 --steps 4] [--out result.json]

The trainer process publishes `steps` updates of `size-mb` of bf16 CUDA tensors (a LoRA-sized update
split into 64 tensors, plus noisy-norm tensors); the engine process (spawned) polls, maps each step's
tensors through their CUDA IPC handles (no copy through the host), hashes their bytes and writes the
hashes; the trainer compares them with its own. Also reported: publish time and publish -> engine
mapped time. Exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from grpokit.broadcast.ipc import IPCBroadcast
from grpokit.types import WeightUpdate


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def engine(run_dir: str, steps: int, out: str) -> None:
    torch.cuda.init()
    b = IPCBroadcast()
    b.setup(run_dir)
    (Path(run_dir) / "ready").touch()
    seen, result = -1, {}
    deadline = time.time() + 120
    while seen < steps - 1 and time.time() < deadline:
        update = b.poll(seen)
        if update is None:
            time.sleep(0.002)
            continue
        mapped = time.time()
        result[update.step] = {
            "mapped_at": mapped,
            "hashes": {k: digest(v) for k, v in update.wire_tensors().items()},
            "device": str(next(iter(update.tensors.values())).device),
        }
        seen = update.step
        del update
        torch.cuda.ipc_collect()
        (Path(run_dir) / f"ack_{seen}").touch()
    Path(out).write_text(json.dumps(result))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mb", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    run_dir = tempfile.mkdtemp()
    out = Path(run_dir) / "engine.json"
    ctx = mp.get_context("spawn")
    reader = ctx.Process(target=engine, args=(run_dir, args.steps, str(out)))
    reader.start()
    deadline = time.time() + 120
    while not (Path(run_dir) / "ready").exists() and time.time() < deadline:
        time.sleep(0.01)
    b = IPCBroadcast(keep_last=3)
    b.setup(run_dir)
    n = args.size_mb * 2**20 // 2 // 64
    sent, publish_s, published_at = {}, [], {}
    for step in range(args.steps):
        tensors = {f"layer.{i}.lora_A.weight": torch.randn(n, device="cuda", dtype=torch.bfloat16) for i in range(64)}
        norms = {"model.norm.weight": torch.randn(1024, device="cuda", dtype=torch.bfloat16)}
        update = WeightUpdate(step=step, tensors=tensors, lora_config={"r": 16}, norm_tensors=norms)
        t = time.time()
        b.publish(update)
        published_at[step] = time.time()
        publish_s.append(published_at[step] - t)
        sent[step] = {k: digest(v) for k, v in update.wire_tensors().items()}
        while not (Path(run_dir) / f"ack_{step}").exists() and time.time() < deadline:  # one step at a time
            time.sleep(0.002)
    reader.join(timeout=150)
    got = json.loads(out.read_text()) if out.exists() else {}
    ok = len(got) == args.steps and all(got[str(s)]["hashes"] == sent[s] for s in range(args.steps))
    report = {
        "steps": args.steps,
        "size_mb": args.size_mb,
        "bit_identical_all_steps": ok,
        "engine_device": next(iter(got.values()))["device"] if got else None,
        "publish_ms_mean": 1e3 * sum(publish_s) / len(publish_s),
        "publish_to_mapped_ms": [
            1e3 * (got[str(s)]["mapped_at"] - published_at[s]) for s in range(args.steps) if str(s) in got
        ],
    }
    b.close()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
