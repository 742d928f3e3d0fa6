#!/usr/bin/env bash
# Wait until every local Kafka node reports "Kafka Server started" and accepts TCP; on failure print its log.
#   ops/kafka/wait.sh [--secure] [--nodes N] [--timeout SECONDS]
set -euo pipefail
NODES=1; TIMEOUT=${HILO_KAFKA_WAIT:-120}
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --secure) export HILO_KAFKA_SECURE=1; shift ;;
    *) echo "wait.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/env.sh"
for n in $(seq 1 "$NODES"); do
  dir=$KAFKA_HOME_DIR/node-$n; port=$((KAFKA_PORT + 2*n - 2))
  deadline=$(( $(date +%s) + TIMEOUT ))
  until grep -q "Kafka Server started" "$dir/server.log" 2>/dev/null && (exec 3<>/dev/tcp/$KAFKA_HOST/$port) 2>/dev/null; do
    if ! kill -0 "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
      echo "wait.sh: Kafka node $n did not start; last lines of $dir/server.log and stdout.log:" >&2
      tail -n 30 "$dir/server.log" "$dir/stdout.log" >&2 || true
      exit 1
    fi
    sleep 0.5  # polling a process we do not control; not used as synchronisation in tests
  done
  echo "wait.sh: Kafka node $n ready on $KAFKA_HOST:$port" >&2
done
