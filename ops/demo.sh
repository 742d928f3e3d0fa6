#!/usr/bin/env bash
# The main job: `hilo demo` on the embedded file log (no broker). Extra arguments go to `hilo demo`.
#   ops/demo.sh            ops/demo.sh --json            ops/demo.sh --steps 100
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/ops/setup.sh"
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
exec "$HILO_VENV/bin/hilo" demo "$@"
