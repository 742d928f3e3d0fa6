#!/usr/bin/env bash
# `hilo rl` on one machine: installs the project, writes the base model (--base tiny, the default, or student), starts
# a vLLM CPU server on it (its own cached venv; ops/vllm/) unless one answers already, runs the RL job on the embedded
# log, and stops the server it started. Extra arguments go to `hilo rl` (--base, --sites N, --staleness S, --steps K,
# --log kafka://..., --json).
#   ops/rl.sh            ops/rl.sh --base student --steps 40 --batch-prompts 8 --samples 8 --lr 0.001
# `ops/rl.sh bench [ARGS]` runs `hilo bench rl ARGS` instead, on the student base, with a vLLM server of its own on
# port $HILO_BENCH_VLLM_PORT (default 8012: a server the tests use is left alone).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
source ops/vllm/env.sh
command=(rl)
NAME=tiny; prev=
if [ "${1:-}" = bench ]; then
  shift
  command=(bench rl --base student)
  NAME=student
  export HILO_VLLM_PORT=${HILO_BENCH_VLLM_PORT:-8012} HILO_VLLM_DIR=$HILO_CACHE/vllm-run-bench-rl
  VLLM_PORT=$HILO_VLLM_PORT
fi
for a in "$@"; do [ "$prev" = --base ] && NAME=$a; prev=$a; done
BASE=$("$HILO_VENV/bin/python" -m hilo.ops.rl_bases "$NAME")   # written once (the student: ~2 min of pretraining)
started=0
trap '[ $started = 1 ] && ops/vllm/stop.sh; true' EXIT
if ! ops/vllm/wait.sh --timeout 1 >/dev/null 2>&1; then
  ops/vllm/start.sh "$BASE" --max-lora-rank 16
  started=1
fi
"$HILO_VENV/bin/hilo" "${command[@]}" --vllm "http://$VLLM_HOST:$VLLM_PORT" "$@"
