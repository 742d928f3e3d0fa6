#!/usr/bin/env bash
# Stop every local Kafka node started by start.sh (SIGTERM, then SIGKILL after 30 s).
#   ops/kafka/stop.sh [--secure] [--wipe]   # --secure: the secured broker; --wipe also deletes the data (topics) of every node
# --wipe SIGKILLs at once: a clean shutdown only saves data that is deleted next (a cluster whose quorum went first,
# or a node still SIGSTOPped, waited out the 30 s).
set -uo pipefail
wipe=0
for arg in "$@"; do
  case "$arg" in
    --secure) export HILO_KAFKA_SECURE=1 ;;
    --wipe) wipe=1 ;;
    *) echo "stop.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/env.sh"
# SIGTERM every node first, then wait for all: stopped one by one, the last nodes of a cluster wait out their
# shutdown timeout with no controller quorum left.
pids=()
for pidf in "$KAFKA_HOME_DIR"/node-*/pid; do
  [ -f "$pidf" ] || continue
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    if [ $wipe = 1 ]; then kill -9 "$pid"; else kill "$pid"; fi
    pids+=("$pid")
  fi
  rm -f "$pidf"
done
for pid in "${pids[@]}"; do
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  echo "stop.sh: stopped pid $pid" >&2
done
if [ $wipe = 1 ]; then rm -rf "$KAFKA_HOME_DIR"; echo "stop.sh: wiped $KAFKA_HOME_DIR" >&2; fi
exit 0
