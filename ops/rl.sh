#!/usr/bin/env bash
# `hilo rl` on one machine: installs the project, builds the tiny base model, starts a vLLM CPU server on it (its own
# cached venv; ops/vllm/), runs the RL job on the embedded log, and stops the server it started. Extra arguments go
# to `hilo rl` (--sites N, --staleness S, --steps K, --log kafka://..., --json).
#   ops/rl.sh            ops/rl.sh --sites 3 --staleness 0
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
source ops/vllm/env.sh
BASE=${HILO_VLLM_BASE:-$HILO_CACHE/vllm-base/tiny-qwen3-s0-h256-l4}
[ -f "$BASE/config.json" ] || "$HILO_VENV/bin/python" -m hilo.ops.tiny_trainer "$BASE" >/dev/null
started=0
trap '[ $started = 1 ] && ops/vllm/stop.sh; true' EXIT
if ! ops/vllm/wait.sh --timeout 1 >/dev/null 2>&1; then
  ops/vllm/start.sh "$BASE" --max-lora-rank 16
  started=1
fi
"$HILO_VENV/bin/hilo" rl --vllm "http://$VLLM_HOST:$VLLM_PORT" "$@"
