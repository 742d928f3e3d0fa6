#!/usr/bin/env bash
# `hilo bench rl` on one machine: installs the project, writes the student base (pretrained on the digit task, about
# 2 minutes the first time, then cached), starts a vLLM CPU server on it on its own port (so a server the tests use is
# left alone), runs the benchmark and stops the server it started. Extra arguments go to `hilo bench rl`
# (--seeds N, --steps K, --staleness 0,2, --out DIR, --json).
#   ops/bench-rl.sh            ops/bench-rl.sh --seeds 3 --staleness 0,2
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
source ops/vllm/env.sh
export HILO_VLLM_PORT=${HILO_BENCH_VLLM_PORT:-8012} HILO_VLLM_DIR=$HILO_CACHE/vllm-run-bench-rl
BASE=$("$HILO_VENV/bin/python" -m hilo.ops.rl_bases student)
trap 'ops/vllm/stop.sh || true' EXIT
ops/vllm/start.sh "$BASE" --max-lora-rank 16
"$HILO_VENV/bin/hilo" bench rl --vllm "http://$VLLM_HOST:$HILO_VLLM_PORT" --base student "$@"
