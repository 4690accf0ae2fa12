"""`grpokit fit` end to end on one CUDA GPU: the co-located engine (fast path), the trainer (bf16,
varlen attention, chunked logprobs, compiled layers: recipes/gpu.yaml), the weight push, checkpoints.

The GPU machine has no model hub and carries at most 64 MiB, so the model is SmolLM2-135M's shape and
tokenizer (a few MB, copied here by --prepare) with random weights: the reward need not rise; what is
checked is that every step trains, publishes and checkpoints on the GPU, that engine and trainer
logprobs agree (token_mult_prob_error), and how long the steps take.

    python bench/gpu_check_fit.py --prepare          # here: copy config + tokenizer into .gpu/smollm2/
    # GPU machine (carry .gpu and .whl; bench/gpu_session.sh installs .whl, see bench/gpu_wheels.py):
    python bench/gpu_check_fit.py --out $OUT          # builds the random model, runs fit, checks, writes JSON
    python bench/gpu_check_fit.py --sync --out $OUT   # max_async_level 0: every step's logprobs checked
    python bench/gpu_check_fit.py --accelerator cpu --steps 2 --extra --data.batch_size 8   # CPU smoke test
    python bench/gpu_check_fit.py --repeats 2 --out $OUT --extra --trainer.deterministic true
        # two runs of one recipe and seed: are their losses, logprob errors and last weights bit-identical?
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / ".gpu" / "smollm2"  # git-ignored
KEEP = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def prepare() -> None:
    """Copy SmolLM2-135M's config and tokenizer (not its weights) from grpokit's model cache into .gpu/."""
    sys.path.insert(0, str(REPO))
    from grpokit.common.models import resolve_model

    source = Path(resolve_model("smollm2-135m"))
    FILES.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (source / name).exists():
            shutil.copy2(source / name, FILES / name)
    print(f"copied {sorted(p.name for p in FILES.iterdir())} to {FILES}; carry .gpu to the GPU machine")


def random_model(folder: Path) -> None:
    """SmolLM2-135M's architecture with random weights (seed 0) and its real tokenizer, saved to `folder`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(FILES)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(FILES).save_pretrained(folder)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--out", type=Path, default=Path("gpu_check_fit_out"))
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--sync",
        action="store_true",
        help="max_async_level 0: every step samples with the trainer's weights, so every step's "
        "token_mult_prob_error (not only step 0's) measures engine vs trainer, the adapter push included",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run fit this many times (same recipe, same seed) and report whether the runs are bit-identical",
    )
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more grpokit fit arguments")
    args = p.parse_args()
    if args.prepare:
        prepare()
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.repeats == 1:
        summary = run_fit(args, args.out)
        ok = summary["ok"]
    else:
        runs = [run_fit(args, args.out / f"run_{i}") for i in range(args.repeats)]
        same = lambda key: all(r[key] == runs[0][key] for r in runs)  # noqa: E731
        keys = ("loss", "token_mult_prob_error", "last_weights_sha256")
        summary = {
            "runs": runs,
            "identical": {key: same(key) for key in keys},
            "bit_identical": all(same(key) for key in keys),
        }
        ok = all(r["ok"] for r in runs)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if ok else 1


def weights_digest(folder: Path) -> str:
    """sha256 over a published step's files (adapter or full weights), in name order: bit-identical or not."""
    digest = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        digest.update(f.read_bytes())
    return digest.hexdigest()


def run_fit(args: argparse.Namespace, out: Path) -> dict:
    """One `grpokit fit` on a fresh random model (seed 0); its summary, with `ok` and the log under `out`."""
    gpu = args.accelerator == "gpu"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        random_model(model)
        argv = [
            sys.executable,
            "-m",
            "grpokit",
            "fit",
            "--config",
            str(REPO / "recipes" / "reverse_text.yaml"),
            *(["--config", str(REPO / "recipes" / "gpu.yaml")] if gpu else []),
            "--model.model",
            str(model),
            "--output_dir",
            tmp,
            "--run_name",
            "gpu",
            "--trainer.max_steps",
            str(args.steps),
            "--trainer.accelerator",
            args.accelerator,
            "--trainer.enable_progress_bar",
            "false",
            "--data.eval",
            "null",
            "--ckpt.interval",
            str(max(args.steps // 2, 1)),
            "--data.filters",
            "[]",  # random weights rarely say EOS: the Overlong filter would mask every completion
            *(["--data.max_async_level", "0"] if args.sync else []),
            *args.extra,
        ]
        start = time.perf_counter()
        with open(out / "fit.log", "w") as log:
            env = {**os.environ, "GRPOKIT_LOG_LEVEL": "DEBUG"}  # each decode graph's capture and its seconds
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env).returncode
        wall = time.perf_counter() - start
        run = Path(tmp) / "gpu"
        for name in ("timeline.jsonl", "metrics.csv"):  # per-group spans and weight loads: why a step waited
            if (run / name).exists():
                shutil.copy2(run / name, out / name)
        rows = [r for r in csv.DictReader(open(run / "metrics.csv"))] if (run / "metrics.csv").exists() else []
        steps = [r for r in rows if r.get("loss")]
        column = lambda name: [float(r[name]) for r in steps if r.get(name)]  # noqa: E731
        summary = {
            "exit_code": code,
            "wall_s": round(wall, 1),
            "steps_logged": len(steps),
            "published": sorted(int(d.name.split("_")[1]) for d in (run / "broadcasts").glob("step_*"))
            if (run / "broadcasts").exists()
            else [],
            "last_weights_sha256": weights_digest(run / "broadcasts" / f"step_{args.steps}")
            if (run / "broadcasts" / f"step_{args.steps}").exists()
            else None,
            "checkpoints": sorted(c.name for c in (run / "checkpoints").glob("*.ckpt"))
            if (run / "checkpoints").exists()
            else [],
            "token_mult_prob_error": column("token_mult_prob_error"),
            "step_time": column("step_time"),
            "train_time": column("train_time"),
            "gen_time": column("gen_time"),
            "loss": column("loss"),
        }
    errors = summary["token_mult_prob_error"]
    ok = (
        code == 0
        and len(steps) == args.steps
        and summary["published"][-1:] == [args.steps]
        and bool(errors)
        and max(errors if args.sync else errors[:1]) < 1.05
    )
    # with max_async_level 1 step 0 is the only step sampled with exactly the trainer's weights (later
    # batches come from one step older weights), so it alone measures engine-vs-trainer numerics; --sync
    # makes every step such a step
    summary["ok"] = ok
    if not ok:
        print((out / "fit.log").read_text()[-4000:], file=sys.stderr)
    return summary


if __name__ == "__main__":
    sys.exit(main())
