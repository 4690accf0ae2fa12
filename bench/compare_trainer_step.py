"""The demo's trainer step on its recorded batches, two grpokit checkouts side by side in one run.

Each side is a Python interpreter with its own grpokit installed (e.g. a venv holding the commit before a
change); the runs alternate A B, B A, A B, ... so drift on a shared machine hits both. A child builds the
reverse-text recipe's Policy (SmolLM2-135M, LoRA r16 on 7 projections, AIPO), then times
Policy.train_batch on each recorded batch (warm-up on the first), and prints one JSON line.

    python bench/compare_trainer_step.py --batches outputs/RUN/rollouts --python-a /tmp/venv_before/bin/python \
        --python-b python3 --rounds 3 --steps 10-19

The batch files are read by this script (safetensors tensors named `{i}.{field}`), so batches written by
either codec version load in both checkouts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TENSOR_FIELDS = (
    "input_ids_T",
    "position_ids_T",
    "loss_mask_T",
    "advantages_T",
    "inference_logprobs_T",
    "seq_lens_N",
    "is_truncated_N",
    "expert_mask_T",
)


def read_batch(path: Path):
    """A TrainingBatch from a rollouts/step_N.safetensors file of any grpokit codec version."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from grpokit.types import MicroBatch, TrainingBatch

    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    n = int(meta["num_micro_batches"])
    mbs = [MicroBatch(**{k: tensors[f"{i}.{k}"] for k in TENSOR_FIELDS}) for i in range(n)]
    return TrainingBatch(step=int(meta["step"]), micro_batches=mbs, temperature=float(meta["temperature"]))


def child(batches: Path, steps: list[int]) -> None:
    import torch

    try:
        from grpokit.trainer.lora import LoraSettings
        from grpokit.trainer.policy import Policy
    except ImportError:  # a checkout from before the package was regrouped by role (2026-11)
        from grpokit.lora import LoraSettings
        from grpokit.policy import Policy
    from grpokit.registry.losses.aipo import AIPO

    torch.set_num_threads(2)
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    loss = AIPO(token_mask_low=0.125, token_mask_high=8.0, geo_mask_low=0.1, geo_mask_high=10.0)
    policy = Policy(lora=LoraSettings(rank=16, alpha=32, target_modules=targets), loss=loss, lr=5e-4)
    policy.configure_model()
    opt = policy.make_optimizer()
    loaded = [read_batch(batches / f"step_{s}.safetensors") for s in steps]
    policy.train_batch(loaded[0], opt)  # warm-up
    times = []
    for batch in loaded:
        start = time.perf_counter()
        policy.train_batch(batch, opt)
        times.append(time.perf_counter() - start)
    import grpokit

    print(json.dumps({"grpokit": str(Path(grpokit.__file__).parent), "times": times}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=Path, required=True)
    p.add_argument("--python-a", required=True)
    p.add_argument("--python-b", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", default="10-19", help="first-last recorded step to time")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    first, last = (int(x) for x in args.steps.split("-"))
    steps = list(range(first, last + 1))
    if args.child:
        child(args.batches, steps)
        return 0
    results: dict[str, list[float]] = {"a": [], "b": []}
    rounds: dict[str, list[float]] = {"a": [], "b": []}  # each child's median
    where = {}
    for i in range(args.rounds):
        order = (("a", args.python_a), ("b", args.python_b))
        for side, python in order if i % 2 == 0 else order[::-1]:  # A B, B A, ...: neither side always first
            cmd = [python, __file__, "--child", "--batches", str(args.batches), "--python-a", "-", "--python-b", "-"]
            out = subprocess.run([*cmd, "--steps", args.steps], capture_output=True, text=True, check=True, cwd="/")
            line = json.loads(out.stdout.strip().splitlines()[-1])
            results[side] += line["times"]
            rounds[side].append(statistics.median(line["times"]))
            where[side] = line["grpokit"]
    summary = {
        side: {
            "grpokit": where[side],
            "median_s": statistics.median(t),
            "mean_s": statistics.mean(t),
            "n": len(t),
            "round_medians_s": rounds[side],
        }
        for side, t in results.items()
    }
    summary["b_over_a"] = summary["b"]["median_s"] / summary["a"]["median_s"]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
