#!/usr/bin/env bash
# The GPU checks still open, in one device call (each capped so the whole stays under 10 minutes);
# results land in $OUT (JSON + logs). What they settle: docs/benchmarks.md and the open issues.
#   here:  bash ../shared/tools/gpu-wheels.sh && python bench/gpu_check_fit.py --prepare
#   there: bash bench/gpu_session.sh            (device tool, carry [".whl", ".gpu"])
# 1. grpokit fit end to end on the GPU (bench/gpu_check_fit.py): never run before 2026-11-23.
# 2. bench train through Policy (the H100 rows in docs/benchmarks.md predate it): naive vs the
#    compiled variants, 8,192 tokens, Qwen3-0.6B shape.
# 3. bench step (max_async_level 1 overlap) through Policy.
# `bash bench/gpu_session.sh grpo` (a second device call) instead times bench train on a GRPO-shaped
# batch (groups of 8 sharing a 64-token prompt, 256 trained tokens each): what the LM head on the
# trained tokens only (logits_to_keep, 2026-11-23) saves on the GPU path. `bash bench/gpu_session.sh stream`
# (a third call) checks the fast path's stream with CUDA graphs across a weight update
# (bench/gpu_check_engine.py) and times whole-batch vs streaming generation (grpokit bench stream).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_session_out}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl
fi
export PYTHONPATH="$PWD/.site:$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt" 2>&1
run() {  # run NAME SECONDS COMMAND...: log to $OUT/NAME.log, record the exit code
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "{\"check\": \"$name\", \"exit\": $?, \"seconds\": $((SECONDS - start))}" >> "$OUT/checks.jsonl"
}
if [ "${1:-}" = stream ]; then  # issue 22: the fast path's stream on CUDA, and bench stream's GPU table
  run engine 240 python3 bench/gpu_check_engine.py --out "$OUT/engine.json"
  run stream 240 python3 -m grpokit.bench stream --model qwen3-0.6b --device cuda --dtype bfloat16 --steps 4 \
    --groups 16 --group-size 8 --max-tokens 256 --repeats 2 --json "$OUT/stream.json"
  cat "$OUT/checks.jsonl"
  exit 0
fi
if [ "${1:-}" = grpo ]; then
  run train_grpo 300 python3 -m grpokit.bench train --model qwen3-0.6b --tokens 8192 --seq-len 320 --lora-rank 16 \
    --group-size 8 --prompt-len 64 --variants naive,grpokit_compile_budget_0.2,grpokit_compile_no_ckpt --json "$OUT/train_grpo.json"
  cat "$OUT/checks.jsonl"
  exit 0
fi
run fit 200 python3 bench/gpu_check_fit.py --out "$OUT/fit"
run train 180 python3 -m grpokit.bench train --model qwen3-0.6b --tokens 8192 --seq-len 320 --lora-rank 16 \
  --variants naive,grpokit_compile_budget_0.2,grpokit_compile_no_ckpt --json "$OUT/train.json"
run step 160 python3 -m grpokit.bench step --model qwen3-0.6b --batch 256 --prompt-len 64 --new-tokens 256 \
  --lora-rank 16 --json "$OUT/step.json"
cat "$OUT/checks.jsonl"
