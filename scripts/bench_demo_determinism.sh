#!/usr/bin/env bash
# What data.deterministic costs on the README demo: the demo run with the deterministic weight schedule
# (the default) and with `--data.deterministic false` (the newest weights as soon as published), one after
# the other, ROUNDS times, on this machine. Optionally a third variant from another install of grpokit
# (OLD_SITE=/path/to/site-packages, e.g. the code before a change, installed with pip --target).
# Prints each run's wall time and its mean reward over the first and last 5 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-outputs/bench_determinism}
mkdir -p "$OUT"
run() {  # name, PYTHONPATH, extra args
  local name=$1 path=$2; shift 2
  local start end
  start=$(date +%s.%N)
  PYTHONSAFEPATH=1 PYTHONPATH=$path python3 -m grpokit fit --config recipes/reverse_text.yaml --output_dir "$OUT" --run_name "$name" \
    --trainer.enable_progress_bar false "$@" > "$OUT/$name.log" 2>&1
  end=$(date +%s.%N)
  python3 - "$OUT/$name" "$name" "$start" "$end" <<'PY'
import csv, sys
run, name, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
rows = [r for r in csv.DictReader(open(f"{run}/metrics.csv")) if r.get("loss")]
rewards = [float(r["reward"]) for r in rows]
print(f"{name:>16}: {end - start:6.1f} s, {len(rows)} steps, reward first 5 {sum(rewards[:5]) / 5:.3f}, "
      f"last 5 {sum(rewards[-5:]) / 5:.3f}", flush=True)
PY
}
for r in $(seq "$ROUNDS"); do
  run "deterministic_$r" "" --data.deterministic true
  run "newest_$r" "" --data.deterministic false
  if [ -n "${OLD_SITE:-}" ]; then run "before_$r" "$OLD_SITE"; fi
done
