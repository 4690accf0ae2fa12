"""The SFT -> export -> GRPO path on one CUDA GPU: `grpokit sft` with LoRA or QLoRA (an NF4 base, bf16 compute,
varlen attention on packed rows), its held-out eval, the merge into model/ at the end; `grpokit export`
of that run (adapter, and merged through the NF4 base); `grpokit fit --model.init_from` the SFT run.

Like bench/gpu_check_fit.py it uses SmolLM2-135M's shape and tokenizer with random weights (the GPU machine
has no model hub): what is checked is that each command runs on CUDA, that the SFT loss falls, that the
exported folders load with plain transformers/peft and give the same next-token logits as the run's merged
model, and how long each takes.

    python bench/gpu_check_fit.py --prepare               # here: config + tokenizer into .gpu/smollm2/
    python bench/gpu_check_sft.py --out $OUT              # GPU machine (bench/gpu_session.sh sft)
    python bench/gpu_check_sft.py --accelerator cpu --qlora off --steps 12   # CPU smoke test
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_fit import random_model  # noqa: E402


def grpokit(args: list[str], log: Path) -> tuple[int, float]:
    """Run `python -m grpokit ARGS` from the repository, output to `log`: (exit code, seconds)."""
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, "-m", "grpokit", *args], stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    return code.returncode, round(time.perf_counter() - start, 1)


def metric_column(run: Path, name: str) -> list[float]:
    path = run / "metrics.csv"
    if not path.exists():
        return []
    return [float(r[name]) for r in csv.DictReader(open(path)) if r.get(name)]


def next_token_logits(model_dir: Path, adapter: Path | None, device: str) -> list[float]:
    """The logits at the last position of a fixed prompt, from a folder as a user loads it (no grpokit)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).to(device)
    tok = AutoTokenizer.from_pretrained(adapter or model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "Reverse: hello world"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model(torch.tensor([ids], device=device)).logits[0, -1].float()
    return out.cpu().tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu_check_sft_out"))
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--qlora",
        choices=("auto", "on", "off"),
        default="auto",
        help="train on an NF4 base (needs bitsandbytes; auto: when it is installed, else LoRA on the bf16 base)",
    )
    args = p.parse_args()
    if args.qlora == "auto":
        args.qlora = "on" if importlib.util.find_spec("bitsandbytes") else "off"
    gpu = args.accelerator == "gpu"
    device = "cuda" if gpu else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"qlora": args.qlora == "on"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model"
        random_model(model)
        common = ["--model.model", str(model), "--output_dir", str(tmp), "--trainer.enable_progress_bar", "false"]
        common += ["--trainer.accelerator", args.accelerator]
        quant = ["--model.quantization", "nf4"] if args.qlora == "on" else []
        dtype = ["--model.dtype", "bfloat16"] if gpu else []
        sft_args = ["sft", "--config", str(REPO / "recipes" / "reverse_text_sft.yaml"), *common, *quant, *dtype]
        sft_args += ["--run_name", "sft", "--trainer.max_steps", str(args.steps), "--data.eval_interval", "10"]
        sft_args += ["--ckpt.interval", "10", "--model.lr", "1e-3"]
        modules = "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"  # the adapter to export
        sft_args += ["--model.lora", f"{{rank: 16, alpha: 32, target_modules: {modules}}}"]
        code, secs = grpokit(sft_args, args.out / "sft.log")
        run = tmp / "sft"
        loss = metric_column(run, "loss")
        summary["sft"] = {
            "exit_code": code,
            "wall_s": secs,
            "steps_logged": len(loss),
            "loss_first5": loss[:5],
            "loss_last5": loss[-5:],
            "eval_loss": metric_column(run, "eval_loss"),
            "eval_token_accuracy": metric_column(run, "eval_token_accuracy"),
            "merged_model": (run / "model" / "config.json").exists(),
        }
        exports = {}
        for name, extra in (("adapter", []), ("merged", ["--merge", "--dtype", "float32"])):
            code, secs = grpokit(
                ["export", str(run), "--out", str(tmp / name), *extra], args.out / f"export_{name}.log"
            )
            exports[name] = {"exit_code": code, "wall_s": secs}
        summary["export"] = exports
        try:  # the exports as a user loads them, against the run's own merged model/
            ref = next_token_logits(run / "model", None, device)
            merged = next_token_logits(tmp / "merged", None, device)
            adapter = next_token_logits(model, tmp / "adapter", device)
            diff = lambda a, b: max(abs(x - y) for x, y in zip(a, b))  # noqa: E731
            summary["logits_max_abs_diff"] = {
                "merged_vs_run_model": diff(merged, ref),
                "adapter_vs_run_model": diff(adapter, ref),
            }
            summary["logit_scale"] = max(abs(x) for x in ref)
        except Exception as e:  # reported, not raised: the rest of the check still tells something
            summary["load_error"] = repr(e)
        fit_args = ["fit", "--config", str(REPO / "recipes" / "reverse_text.yaml")]
        fit_args += (
            [
                "--config",
                str(REPO / "recipes" / "gpu.yaml"),
                "--model.compile",
                "false",
                "--model.activation_memory_budget",
                "null",
            ]
            if gpu
            else []
        )
        fit_args += [*common, "--run_name", "grpo", "--model.init_from", str(run), "--trainer.max_steps", "3"]
        fit_args += ["--data.eval", "null", "--data.filters", "[]", "--ckpt.interval", "3"]
        code, secs = grpokit(fit_args, args.out / "fit.log")
        summary["fit_from_sft"] = {
            "exit_code": code,
            "wall_s": secs,
            "loss": metric_column(tmp / "grpo", "loss"),
            "token_mult_prob_error": metric_column(tmp / "grpo", "token_mult_prob_error"),
        }
    s = summary
    falls = len(loss) >= 10 and sum(loss[-5:]) < sum(loss[:5])
    diffs = s.get("logits_max_abs_diff", {})
    close = bool(diffs) and max(diffs.values()) <= 0.05 * max(1.0, s["logit_scale"])
    s["ok"] = bool(
        s["sft"]["exit_code"] == 0
        and falls
        and s["sft"]["merged_model"]
        and all(e["exit_code"] == 0 for e in s["export"].values())
        and close
        and s["fit_from_sft"]["exit_code"] == 0
        and len(s["fit_from_sft"]["loss"]) == 3
    )
    (args.out / "summary.json").write_text(json.dumps(s, indent=1))
    print(json.dumps(s, indent=1))
    if not s["ok"]:
        for log in sorted(args.out.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-2500:]}", file=sys.stderr)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
