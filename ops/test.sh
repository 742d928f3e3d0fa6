#!/usr/bin/env bash
# The test suite: installs the project, starts the local Kafka broker (ops/kafka/) and a vLLM CPU server on the
# tiny base model (ops/vllm/), runs pytest, stops what it started. The fault and security tests start their own
# 3-node and secured (SASL_SSL, ACLs) brokers with the same scripts, on separate ports, and wipe them after.
#   ops/test.sh                 # everything, Kafka integration tests included
#   ops/test.sh -k determinism  # extra arguments go to pytest
#   HILO_TEST_WORKERS=0 ops/test.sh  # one process (default: 3 pytest-xdist workers)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ops/setup.sh
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
# Lint first (pyproject.toml [tool.ruff]): a style or undefined-name error fails in seconds, before any service starts.
"$HILO_VENV/bin/ruff" check "$ROOT"
# Nothing in the package needs a Python newer than requires-python's lowest (the tests run on the venv's own Python).
lowest=$("$HILO_VENV/bin/python" -c 'import re, tomllib; print(re.search(r"3\.\d+", tomllib.load(open("pyproject.toml", "rb"))["project"]["requires-python"])[0])')
"$HILO_VENV/bin/vermin" -q --no-tips --violations --eval-annotations -t="$lowest-" schemas replica log replay producer consumer ops
# A venv for the lowest and the highest Python the package claims (cached): tests/ops/test_install.py installs the wheel there.
ops/pythons.sh >/dev/null
# toxiproxy (Go, cached in $HILO_CACHE/bin): the delayed link of `hilo bench trainer --rtt-ms` and its test.
ops/wan/toxiproxy.sh install >/dev/null
# Every Kafka JVM of the suite (the main broker, those the tests start, their tools, MirrorMaker) compiles with C1
# only: it starts and settles on less of the CPU the tests share (a broker's start and first 20 s: 2.8 CPU-s against
# 4.8). Benchmarks run outside the suite keep the full JIT.
export HILO_KAFKA_JVM_OPTS=${HILO_KAFKA_JVM_OPTS:--XX:TieredStopAtLevel=1}
started=0
served=()  # PORT:DIR of each vLLM server this script started (stopped on exit)
stop_served() { for s in "${served[@]}"; do HILO_VLLM_PORT=${s%%:*} HILO_VLLM_DIR=${s#*:} ops/vllm/stop.sh || true; done; }
trap '[ $started = 1 ] && ops/kafka/stop.sh; stop_served; true' EXIT
if ! ops/kafka/wait.sh --timeout 1 >/dev/null 2>&1; then
  ops/kafka/start.sh
  started=1
fi
# vLLM (its own cached venv): servers of the tiny Qwen3 base the tests train adapters for.
source ops/vllm/env.sh
HILO_VLLM_BASE=${HILO_VLLM_BASE:-$HILO_CACHE/vllm-base/tiny-qwen3-s0-h256-l4}
[ -f "$HILO_VLLM_BASE/config.json" ] || "$HILO_VENV/bin/python" -m hilo.ops.tiny_trainer "$HILO_VLLM_BASE" >/dev/null
serve() {  # serve PORT DIR [start.sh flags]: start a server of the base on PORT (its pid and log in DIR), unless one
  local port=$1 dir=$2; shift 2  # answers; the servers boot side by side (one core each), waited for below
  HILO_VLLM_PORT=$port HILO_VLLM_DIR=$dir ops/vllm/wait.sh --timeout 1 >/dev/null 2>&1 && return 0
  served+=("$port:$dir")
  HILO_VLLM_PORT=$port HILO_VLLM_DIR=$dir ops/vllm/start.sh "$HILO_VLLM_BASE" --max-lora-rank 16 --no-wait "$@"
}
# fp32 on $VLLM_PORT (8011): the "vllm" test group's. fp32 on 8013: the "vllm-b" group's, so that two chains of
# vLLM tests run side by side (each group's tests share its server's two LoRA slots). bf16 on 8015, as GPU sites
# serve it: the audit's bf16 tests. (8012 is the refused-server test's own.)
# vLLM spins 1 s on its shared-memory queue after every message (about a CPU-second a request, on cores the tests
# share); the plugin (ops/vllm/plugin/) bounds that spin for the servers started here.
export HILO_VLLM_SPIN_S=${HILO_VLLM_SPIN_S:-0}
B_PORT=${HILO_VLLM_B_PORT:-8013} BF16_PORT=${HILO_VLLM_BF16_PORT:-8015}
serve "$VLLM_PORT" "$VLLM_RUN_DIR"
serve "$B_PORT" "$HILO_CACHE/vllm-run-b"
serve "$BF16_PORT" "$HILO_CACHE/vllm-run-bf16" --dtype bfloat16
for s in "${served[@]}"; do HILO_VLLM_PORT=${s%%:*} HILO_VLLM_DIR=${s#*:} ops/vllm/wait.sh --timeout 600; done
export HILO_VLLM_B=http://$VLLM_HOST:$B_PORT HILO_VLLM_BF16=http://$VLLM_HOST:$BF16_PORT
export HILO_KAFKA=kafka://${HILO_KAFKA_HOST:-127.0.0.1}:${HILO_KAFKA_PORT:-9092}
export HILO_VLLM=http://$VLLM_HOST:$VLLM_PORT HILO_VLLM_BASE HILO_VLLM_VENV
# Parallel workers (HILO_TEST_WORKERS, default 3; 0: one process) with --dist loadgroup: the tests of one xdist_group
# (a module's fixed-port brokers; every test of the vLLM server) run on one worker, one after another. The groups are
# read from the test modules' marks by tests/xdist_groups.py (xdist 3.8's own grouping does nothing under pytest 9).
par=()
[ "${HILO_TEST_WORKERS:-3}" != 0 ] && par=(-n "${HILO_TEST_WORKERS:-3}" --dist loadgroup)
"$HILO_VENV/bin/python" -m pytest -p no:cacheprovider "${par[@]}" "$@"
