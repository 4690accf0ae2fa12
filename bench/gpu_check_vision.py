"""Image prompts through `grpokit fit` on one CUDA GPU (issue 36): each tiny random vision-language family
(Qwen2.5-VL, Idefics3; grpokit.testing.vision_models, built here from SmolLM2's tokenizer in .gpu/smollm2,
copied by `python bench/gpu_check_fit.py --prepare`) trains 2 steps of the `shapes` environment at
max_async_level 0 with the builtin engine's image path, in float32 and in bfloat16; what comes back is
every step's token_mult_prob_error (engine vs trainer on the same weights), the loss and the step time.
The CPU twin is tests/vision/test_fit_images.py (float32: 1.0000001).

    python bench/gpu_check_vision.py --out $OUT                      # GPU machine (bench/gpu_session.sh vision)
    python bench/gpu_check_vision.py --accelerator cpu --dtypes float32   # here: a smoke test
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / ".gpu" / "smollm2"
LIMIT = {"float32": 1e-3, "bfloat16": 0.05}  # token_mult_prob_error - 1: fp32 agrees closely, bf16 rounds


def run(family: str, dtype: str, accelerator: str, folder: Path, out: Path) -> dict:
    """One 2-step fit; its metrics and whether it passed."""
    from grpokit.testing import build_tiny_idefics3, build_tiny_qwen2_5_vl

    builder = {"qwen2_5_vl": build_tiny_qwen2_5_vl, "idefics3": build_tiny_idefics3}[family]
    tokenizer = str(TOKENIZER) if TOKENIZER.is_dir() else "smollm2-135m"
    model = str(builder(folder / family, tokenizer_name=tokenizer))
    env = [{"id": "shapes", "args": {"num_tasks": 32, "question": "mixed"}}]
    engine = {"class_path": "BuiltinEngine", "init_args": {"fast": "off", "dtype": dtype}}
    argv = [
        *(sys.executable, "-m", "grpokit", "fit", "--output_dir", str(folder), "--run_name", f"{family}-{dtype}"),
        *("--model.model", model, "--model.dtype", dtype, "--model.lora", "{rank: 4, alpha: 8}"),
        *("--data.env", json.dumps(env), "--data.eval", "null", "--data.max_async_level", "0"),
        *("--data.batch_size", "16", "--data.rollouts_per_example", "4", "--data.seq_len", "512"),
        *("--data.sampling", "{max_tokens: 8}", "--data.filters", "[]", "--inference", json.dumps(engine)),
        *("--trainer.max_steps", "2", "--trainer.accelerator", accelerator, "--trainer.enable_progress_bar", "false"),
    ]
    start = time.perf_counter()
    with open(out / f"{family}-{dtype}.log", "w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    metrics = folder / f"{family}-{dtype}" / "metrics.csv"
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("loss")] if metrics.exists() else []
    errors = [float(r["token_mult_prob_error"]) for r in rows]
    ok = code == 0 and len(rows) == 2 and all(abs(e - 1) < LIMIT[dtype] for e in errors)
    return {
        "family": family,
        "dtype": dtype,
        "exit_code": code,
        "ok": ok,
        "wall_s": round(time.perf_counter() - start, 1),
        "token_mult_prob_error": errors,
        "loss": [float(r["loss"]) for r in rows],
        "step_time": [float(r["step_time"]) for r in rows if r.get("step_time")],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu_check_vision_out"))
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--families", default="qwen2_5_vl,idefics3")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            run(family, dtype, args.accelerator, Path(tmp), args.out)
            for family in args.families.split(",")
            for dtype in args.dtypes.split(",")
        ]
    summary = {"runs": results, "ok": all(r["ok"] for r in results)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
