#!/usr/bin/env bash
# Wait until the vLLM server started by start.sh answers GET /v1/models; on failure print its log's tail.
#   ops/vllm/wait.sh [--timeout SECONDS]   (default 300)
set -euo pipefail
source "$(dirname "$0")/env.sh"
TIMEOUT=300
[ "${1:-}" = "--timeout" ] && TIMEOUT=$2
deadline=$((SECONDS + TIMEOUT))
pid=$(cat "$VLLM_RUN_DIR/pid" 2>/dev/null || echo "")
while [ $SECONDS -lt $deadline ]; do
  if curl -sf "http://$VLLM_HOST:$VLLM_PORT/v1/models" >/dev/null 2>&1; then
    echo "wait.sh: vLLM ready on $VLLM_HOST:$VLLM_PORT" >&2; exit 0
  fi
  if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
    echo "wait.sh: vLLM (pid $pid) exited; last lines of $VLLM_RUN_DIR/server.log:" >&2
    tail -n 30 "$VLLM_RUN_DIR/server.log" >&2; exit 1
  fi
  sleep 1  # polling another process's startup
done
echo "wait.sh: vLLM not ready after ${TIMEOUT}s; last lines of $VLLM_RUN_DIR/server.log:" >&2
tail -n 30 "$VLLM_RUN_DIR/server.log" >&2 2>/dev/null; exit 1
