#!/usr/bin/env bash
# Stop the vLLM server that start.sh started (its own process group only; nothing else is signalled).
#   ops/vllm/stop.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
pid=$(cat "$VLLM_RUN_DIR/pid" 2>/dev/null || echo "")
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  echo "stop.sh: vLLM not running" >&2; rm -f "$VLLM_RUN_DIR/pid"; exit 0
fi
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
kill -0 "$pid" 2>/dev/null && { echo "stop.sh: vLLM (pid $pid) ignored SIGTERM for 30s; SIGKILL" >&2; kill -KILL -- "-$pid" 2>/dev/null || true; }
rm -f "$VLLM_RUN_DIR/pid"
echo "stop.sh: vLLM stopped (pid $pid)" >&2
