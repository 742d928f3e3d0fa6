#!/usr/bin/env bash
# Start a vLLM OpenAI server (CPU build, own venv) on a base model directory, with runtime LoRA updating, and wait.
#   ops/vllm/start.sh MODEL_DIR [--max-lora-rank R] [--dtype float32] [--no-lora-updating] [--no-wait]
# Serves on $HILO_VLLM_HOST:$HILO_VLLM_PORT (default 127.0.0.1:8011). --no-lora-updating starts it without runtime
# LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING unset): a server a site must refuse, for tests. --no-wait returns once
# the server is started (ops/vllm/wait.sh waits for it): several servers boot side by side.
# Idempotent: a server already running from this run dir is left alone. Log: $HILO_CACHE/vllm-run/server.log
# The hilo-sync plugin (ops/vllm/plugin/) is installed into the venv first: it makes in-place adapter loads
# read the adapter once (see docs/operations.md, "Serving with vLLM").
# HILO_VLLM_SPIN_S=S in the environment: the plugin bounds vLLM's 1-s spin after each queue message to S seconds
# (0 on a CPU host whose cores the server shares; same section).
set -euo pipefail
source "$(dirname "$0")/env.sh"
MODEL=${1:?usage: start.sh MODEL_DIR [--max-lora-rank R] [--dtype DTYPE]}; shift
RANK=64; DTYPE=float32; UPDATING=True; WAIT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --max-lora-rank) RANK=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --no-lora-updating) UPDATING=False; shift ;;
    --no-wait) WAIT=0; shift ;;
    *) echo "start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
"$VLLM_SCRIPTS/install.sh"
"$HILO_VLLM_VENV/bin/python" -m pip install -q --no-deps --no-build-isolation "$VLLM_SCRIPTS/plugin" >/dev/null 2>&1 \
  || "$HILO_VLLM_VENV/bin/python" -m pip install -q --no-deps "$VLLM_SCRIPTS/plugin" \
  || { echo "start.sh: installing the hilo-sync vLLM plugin ($VLLM_SCRIPTS/plugin) failed" >&2; exit 1; }
mkdir -p "$VLLM_RUN_DIR"
if [ -f "$VLLM_RUN_DIR/pid" ] && kill -0 "$(cat "$VLLM_RUN_DIR/pid")" 2>/dev/null; then
  echo "start.sh: vLLM already running (pid $(cat "$VLLM_RUN_DIR/pid"))" >&2
  [ $WAIT = 1 ] && exec "$VLLM_SCRIPTS/wait.sh"
  exit 0
fi
: > "$VLLM_RUN_DIR/server.log"
# setsid: the server (and the engine process it spawns) is its own process group, which stop.sh signals.
VLLM_TARGET_DEVICE=${VLLM_TARGET_DEVICE:-cpu} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_ALLOW_RUNTIME_LORA_UPDATING=$UPDATING \
  OMP_NUM_THREADS=${HILO_VLLM_THREADS:-1} setsid nohup "$HILO_VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" --host "$VLLM_HOST" --port "$VLLM_PORT" --enable-lora --max-lora-rank "$RANK" --max-loras 2 \
  --max-model-len 32 --enforce-eager --gpu-memory-utilization 0.1 --dtype "$DTYPE" --seed 0 \
  > "$VLLM_RUN_DIR/server.log" 2>&1 < /dev/null &
echo $! > "$VLLM_RUN_DIR/pid"
echo "start.sh: vLLM starting on $VLLM_HOST:$VLLM_PORT (pid $!, model $MODEL)" >&2
[ $WAIT = 1 ] && exec "$VLLM_SCRIPTS/wait.sh"
exit 0
