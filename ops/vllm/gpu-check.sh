#!/usr/bin/env bash
# The vLLM serving tests on a GPU machine: CUDA vLLM from PyPI in its own venv, the same tests as on CPU.
#   ops/vllm/gpu-check.sh [pytest args]     # needs an NVIDIA GPU, python3, network access to PyPI
# Installs `vllm==$HILO_VLLM_GPU_VERSION` (default 0.32.0, the version the plugin is written for) and the
# hilo-sync plugin, starts a server on the tiny base with --dtype float32, runs tests/consumer/test_vllm.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export HILO_CACHE=${HILO_CACHE:-$HOME/.cache/hilo-sync}
export HILO_VLLM_VENV=${HILO_VLLM_VENV:-$HILO_CACHE/vllm-gpu-venv}
VERSION=${HILO_VLLM_GPU_VERSION:-0.32.0}
if [ ! -f "$HILO_VLLM_VENV/.hilo-vllm-gpu-$VERSION" ]; then
  python3 -m venv "$HILO_VLLM_VENV"
  "$HILO_VLLM_VENV/bin/python" -m pip install -q --upgrade pip
  "$HILO_VLLM_VENV/bin/python" -m pip install -q "vllm==$VERSION"
  touch "$HILO_VLLM_VENV/.hilo-vllm-gpu-$VERSION" "$HILO_VLLM_VENV/.hilo-vllm-${HILO_VLLM_CPU_VERSION:-0.32.0}"  # install.sh: done
fi
ops/setup.sh
source ops/vllm/env.sh
HILO_VENV=${HILO_VENV:-$HILO_CACHE/venv}
export HILO_VLLM_BASE=$HILO_CACHE/vllm-base/tiny-qwen3-s0-h256-l4
[ -f "$HILO_VLLM_BASE/config.json" ] || "$HILO_VENV/bin/python" -m hilo.ops.tiny_trainer "$HILO_VLLM_BASE" >/dev/null
# start.sh defaults VLLM_TARGET_DEVICE to cpu; the CPU-only variables it sets are ignored on a GPU.
VLLM_TARGET_DEVICE=cuda ops/vllm/start.sh "$HILO_VLLM_BASE" --max-lora-rank 16
trap 'ops/vllm/stop.sh' EXIT
export HILO_VLLM=http://$VLLM_HOST:$VLLM_PORT
"$HILO_VENV/bin/python" -m pytest -p no:cacheprovider tests/consumer/test_vllm.py "$@"
