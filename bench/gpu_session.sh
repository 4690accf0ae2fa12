#!/usr/bin/env bash
# The GPU checks still open, most needed first, in as few device calls as the 15 minutes of device time
# a task gets allow (docs/benchmarks.md records what each settled).
#   here:  python bench/gpu_wheels.py && python bench/gpu_check_fit.py --prepare
#   there: bash bench/gpu_session.sh [CHECK...]      (device tool, carry [".whl", ".gpu"])
# Checks (the default order is the `checks=` line below, the ones still open first): each capped; one
# that its cap no longer fits in GPU_SESSION_SECONDS, default 540, is skipped and named in checks.jsonl,
# so a second call can run the rest. docs/benchmarks.md records what each settled and when.
#   vision         issue 36: grpokit fit on image prompts (tiny Qwen2.5-VL and Idefics3, fp32 and bf16, the
#                  builtin engine's image path): every step's token_mult_prob_error (bench/gpu_check_vision.py;
#                  passed on an H200, 2026-11-29, after two fixes)
#   train          bench train through Policy: naive vs the compiled variants, 8,192 tokens, 0.6B shape
#   grpo           bench train on a GRPO-shaped batch (groups of 8 sharing a 64-token prompt): what the
#                  LM head on the trained tokens only (logits_to_keep) saves; first, with `train` next, so the
#                  two run side by side in one call (10-13% slower in two tasks' separate calls)
#   stream         issue 22: whole-batch vs streaming generation on the Qwen3-0.6B shape, each also
#                  overlapped with Policy's training steps: step time against max(generation, training)
#                  (ran on an H200 at 64 slots; now at the 128 rows it asks for)
#   fit_stream     grpokit fit with data.streaming on (passed on an H200; its timeline.jsonl comes back)
#   fit_sync       grpokit fit at max_async_level 0: every step's token_mult_prob_error is engine vs
#                  trainer on the same weights, the adapter's push included (passed on an H200)
#   fit            grpokit fit end to end on the GPU (bench/gpu_check_fit.py; passed on an H200)
#   fit_repro      two runs of that fit with --trainer.deterministic true: are the losses, the logprob
#                  errors and the last published weights bit-identical (issue 33; yes on an H200)?
#   fit_repro_plain  the same two runs without --trainer.deterministic (only data.deterministic; yes too)
#   step           bench step (whole-batch, max_async_level 1 overlap) through Policy (ran on an H200)
#   engine_stream  the fast path's stream with CUDA graphs across a weight update, every token's
#                  logprob against its own step's weights (bench/gpu_check_engine.py --checks stream)
#   engine         all of bench/gpu_check_engine.py (fp32 and bf16 fast path vs plain, and the stream)
#   sft            grpokit sft (bf16; QLoRA on an NF4 base where bitsandbytes is installed) and its held-out
#                  eval, grpokit export of the run (adapter, and merged) loaded by plain transformers/peft,
#                  then grpokit fit --model.init_from the SFT run (bench/gpu_check_sft.py; passed on an H200)
# `bash bench/gpu_session.sh grpo` runs that one check. What comes back ($OUT, at most 8 files):
# checks.jsonl (name, exit code, seconds, or why skipped), results.json (every check's JSON result),
# gpu.txt (device and versions), logs.tgz (everything, the logs included).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_session_out}
WORK=$(mktemp -d)
BUDGET=${GPU_SESSION_SECONDS:-540}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
# The wheels of bench/gpu_wheels.py whose distribution the image lacks (what it has is never shadowed),
# then grpokit itself: pyproject maps registry/, envs/ and recipes/ into grpokit, so it must be installed.
missing=$(python3 -c '
import importlib.metadata as md, pathlib
for w in sorted(pathlib.Path(".whl").glob("*.whl")):
    try:
        md.version(w.name.split("-")[0])
    except md.PackageNotFoundError:
        print(w)')
echo "installed from .whl: ${missing:-nothing}" | tr '\n' ' ' >> "$OUT/gpu.txt"
[ -z "$missing" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$PWD/.site" $missing \
  >> "$OUT/gpu.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$PWD/.site" . \
  >> "$OUT/gpu.txt" 2>&1 || echo "gpu_session: could not install grpokit into .site" >> "$OUT/gpu.txt"
# PYTHONSAFEPATH: `python -m`/`-c` must not put the checkout (whose grpokit/ lacks registry/) before .site.
export PYTHONPATH="$PWD/.site:$PWD" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
echo >> "$OUT/gpu.txt"
# preflight: what every check imports; a missing wheel stops here, in seconds, not in each check
if ! python3 -c "import torch, transformers, verifiers.v1, grpokit.main, grpokit.envs.reverse_text
from grpokit.cli.discovery import discover
discover()
print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt" 2>&1; then
  echo "gpu_session: the preflight import failed (gpu.txt has why): add the wheel to bench/gpu_wheels.py" \
    | tee -a "$OUT/gpu.txt" >&2
  exit 3
fi

run() {  # run NAME CAP COMMAND...: log to $WORK/NAME.log under min(CAP, time left); record the exit code
  local name=$1 cap=$2 left=$((BUDGET - SECONDS)); shift 2
  if [ "$left" -lt "$cap" ]; then
    echo "{\"check\": \"$name\", \"skipped\": \"needs ${cap} s, ${left} s left\"}" | tee -a "$OUT/checks.jsonl"
    return
  fi
  local start=$SECONDS
  timeout "$cap" "$@" > "$WORK/$name.log" 2>&1
  echo "{\"check\": \"$name\", \"exit\": $?, \"seconds\": $((SECONDS - start))}" | tee -a "$OUT/checks.jsonl"
}

check() {  # check NAME: one check of the list above
  case $1 in
    engine_stream) run engine_stream 150 python3 bench/gpu_check_engine.py --checks stream --out "$WORK/engine_stream.json" ;;
    sft) run sft 200 python3 bench/gpu_check_sft.py --out "$WORK/sft" ;;
    engine) run engine 240 python3 bench/gpu_check_engine.py --out "$WORK/engine.json" ;;
    stream) run stream 330 python3 -m grpokit.bench stream --model qwen3-0.6b --device cuda --dtype bfloat16 \
      --steps 5 --groups 16 --group-size 8 --prompt-len 64 --max-tokens 512 --repeats 2 --train \
      --json "$WORK/stream.json" ;;
    fit) run fit 200 python3 bench/gpu_check_fit.py --out "$WORK/fit" ;;
    fit_repro) run fit_repro 330 python3 bench/gpu_check_fit.py --repeats 2 --out "$WORK/fit_repro" \
      --extra --trainer.deterministic true ;;
    fit_repro_plain) run fit_repro_plain 330 python3 bench/gpu_check_fit.py --repeats 2 \
      --out "$WORK/fit_repro_plain" ;;
    fit_stream) run fit_stream 200 python3 bench/gpu_check_fit.py --out "$WORK/fit_stream" \
      --extra --data.streaming '{max_inflight: 8, on_update: continue}' ;;
    fit_sync) run fit_sync 200 python3 bench/gpu_check_fit.py --sync --out "$WORK/fit_sync" ;;
    vision) run vision 200 python3 bench/gpu_check_vision.py --out "$WORK/vision" ;;
    step) run step 160 python3 -m grpokit.bench step --model qwen3-0.6b --batch 256 --prompt-len 64 \
      --new-tokens 256 --lora-rank 16 --json "$WORK/step.json" ;;
    train) run train 180 python3 -m grpokit.bench train --model qwen3-0.6b --tokens 8192 --seq-len 320 \
      --lora-rank 16 --variants naive,grpokit_compile_budget_0.2,grpokit_compile_no_ckpt --json "$WORK/train.json" ;;
    grpo) run train_grpo 300 python3 -m grpokit.bench train --model qwen3-0.6b --tokens 8192 --seq-len 320 \
      --lora-rank 16 --group-size 8 --prompt-len 64 \
      --variants naive,grpokit_compile_budget_0.2,grpokit_compile_no_ckpt --json "$WORK/train_grpo.json" ;;
    *) echo "gpu_session: unknown check '$1' (see the list at the top of $0)" >&2; exit 2 ;;
  esac
}

checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(grpo train fit_repro sft fit_stream engine_stream stream fit_sync vision fit step)
for c in "${checks[@]}"; do check "$c"; done
python3 - "$WORK" "$OUT/results.json" <<'EOF'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
results = {}
for f in sorted(work.glob("*.json")) + sorted(work.glob("*/summary.json")):
    name = f.stem if f.parent == work else f.parent.name
    try:
        results[name] = json.loads(f.read_text())
    except ValueError as e:
        results[name] = {"unreadable": str(e)}
pathlib.Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
print(json.dumps(results)[-6000:])
EOF
cp "$OUT/checks.jsonl" "$OUT/gpu.txt" "$WORK/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$WORK" .
cat "$OUT/checks.jsonl"
