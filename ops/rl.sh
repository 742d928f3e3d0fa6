#!/usr/bin/env bash
# `hilo rl` on one machine: installs the project, writes the base model (--base tiny, the default, or student), starts
# a vLLM CPU server on it (its own cached venv; ops/vllm/) unless one answers already, runs the RL job on the embedded
# log, and stops the server it started. Extra arguments go to `hilo rl` (--base, --sites N, --staleness S, --steps K,
# --log kafka://..., --json).
#   ops/rl.sh            ops/rl.sh --base student --steps 40 --batch-prompts 8 --samples 8 --lr 0.001
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
source ops/vllm/env.sh
NAME=tiny; prev=
for a in "$@"; do [ "$prev" = --base ] && NAME=$a; prev=$a; done
BASE=$("$HILO_VENV/bin/python" -m hilo.ops.rl_bases "$NAME")   # written once (the student: ~2 min of pretraining)
started=0
trap '[ $started = 1 ] && ops/vllm/stop.sh; true' EXIT
if ! ops/vllm/wait.sh --timeout 1 >/dev/null 2>&1; then
  ops/vllm/start.sh "$BASE" --max-lora-rank 16
  started=1
fi
"$HILO_VENV/bin/hilo" rl --vllm "http://$VLLM_HOST:$VLLM_PORT" "$@"
