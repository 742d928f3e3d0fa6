#!/usr/bin/env bash
# The test suite: installs the project, starts the local Kafka broker (ops/kafka/), runs pytest, stops Kafka.
#   ops/test.sh                 # everything, Kafka integration tests included
#   ops/test.sh -k determinism  # extra arguments go to pytest
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
started=0
if ! ops/kafka/wait.sh --timeout 1 >/dev/null 2>&1; then
  ops/kafka/start.sh
  started=1
fi
trap '[ $started = 1 ] && ops/kafka/stop.sh' EXIT
export HILO_KAFKA=kafka://${HILO_KAFKA_HOST:-127.0.0.1}:${HILO_KAFKA_PORT:-9092}
"$HILO_VENV/bin/python" -m pytest -p no:cacheprovider "$@"
