#!/usr/bin/env bash
# FSDP2 on 2 GPUs (NCCL): the CPU integration test's checks (tests/integration/test_fsdp.py) with the
# trainer's ranks on cuda:0 and cuda:1: rank 0 publishes the gathered full weights every step, one full
# checkpoint file per step, and a single process resumed from it trains the next step to the same
# weights. Needs 2+ GPUs and grpokit's test dependencies (pytest, jsonargparse, lightning, peft).
#   bash bench/gpu_check_fsdp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$n" -lt 2 ]; then echo "needs 2 GPUs, found $n (NCCL refuses two ranks on one GPU)" >&2; exit 2; fi
GRPOKIT_TEST_ACCELERATOR=gpu python3 -m pytest -q -x tests/integration/test_fsdp.py "$@"
