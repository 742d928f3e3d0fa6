#!/usr/bin/env bash
# MirrorMaker 2 (Apache Kafka's own, connect-mirror resolved by Maven like the broker) between two clusters.
#   ops/kafka/mirror.sh start --source HOST:PORT --target HOST:PORT [--run RUN]
#   ops/kafka/mirror.sh wait [--timeout S]        # until both flows' connectors have started
#   ops/kafka/mirror.sh stop
# Copies the trainer's topics source -> target (RUN.updates, RUN.checkpoints, RUN.prompts; every run's without
# --run) and the sites' rollouts back target -> source (RUN.rollouts). Settings, and why (docs/operations.md, "Sites in other
# regions"):
# - IdentityReplicationPolicy: topic names are kept (a site names its run the same on every cluster). The two flows
#   copy disjoint topics, so the topology has no cycle.
# - isolation.level=read_committed for the consumers that read either cluster: MirrorMaker's default is
#   read_uncommitted, which would copy a fenced trainer's aborted versions as ordinary records. Transaction markers
#   are never copied, so offsets differ between clusters: a site finds its place by version (SPEC.md, Positions).
# - No offset or group sync: a site's position is its own snapshot; groups are per cluster.
# One mirror per HILO_MIRROR_DIR (default $HILO_CACHE/kafka-mirror). Log: $HILO_MIRROR_DIR/mirror.log
set -euo pipefail
source "$(dirname "$0")/env.sh"
MIRROR_LIBS=$HILO_CACHE/kafka-mirror-$KAFKA_VERSION/libs
MIRROR_DIR=${HILO_MIRROR_DIR:-$HILO_CACHE/kafka-mirror}
action=${1:-}; shift || true
source_bs=""; target_bs=""; run=""; timeout=180
while [ $# -gt 0 ]; do
  case "$1" in
    --source) source_bs=$2; shift 2 ;;
    --target) target_bs=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    *) echo "mirror.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
running() { [ -f "$MIRROR_DIR/pid" ] && kill -0 "$(cat "$MIRROR_DIR/pid")" 2>/dev/null; }
case "$action" in
  start)
    [ -n "$source_bs" ] && [ -n "$target_bs" ] || { echo "mirror.sh: start needs --source HOST:PORT and --target HOST:PORT" >&2; exit 2; }
    if running; then echo "mirror.sh: already running (pid $(cat "$MIRROR_DIR/pid"))" >&2; exit 0; fi
    if [ ! -f "$MIRROR_LIBS/.complete" ]; then
      command -v mvn >/dev/null || { echo "mirror.sh: Maven (mvn) is required to resolve connect-mirror $KAFKA_VERSION" >&2; exit 1; }
      echo "mirror.sh: resolving org.apache.kafka:connect-mirror:$KAFKA_VERSION into $MIRROR_LIBS" >&2
      rm -rf "$MIRROR_LIBS"; mkdir -p "$MIRROR_LIBS"
      mvn -q -B -f "$KAFKA_SCRIPTS/mirror-pom.xml" dependency:copy-dependencies -DoutputDirectory="$MIRROR_LIBS" -DincludeScope=runtime
      touch "$MIRROR_LIBS/.complete"
    fi
    prefix=${run:+$(printf '%s' "$run" | sed 's/[.[\*^$()+?{|]/\\&/g')}
    prefix=${prefix:-.*}
    mkdir -p "$MIRROR_DIR"
    cat > "$MIRROR_DIR/mirror.properties" <<PROPS
clusters = source, target
source.bootstrap.servers = $source_bs
target.bootstrap.servers = $target_bs
source->target.enabled = true
source->target.topics = $prefix\\.(updates|checkpoints|prompts)
target->source.enabled = true
target->source.topics = $prefix\\.rollouts
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
source.consumer.isolation.level = read_committed
target.consumer.isolation.level = read_committed
sync.topic.acls.enabled = false
sync.group.offsets.enabled = false
refresh.topics.interval.seconds = 2
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
PROPS
    : > "$MIRROR_DIR/mirror.log"
    setsid nohup java ${HILO_MIRROR_HEAP:--Xms128m -Xmx512m} $KAFKA_JVM_OPTS -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$KAFKA_SCRIPTS/log4j2.properties" -Dhilo.kafka.log="$MIRROR_DIR/mirror.log" \
      -cp "$MIRROR_LIBS/*" org.apache.kafka.connect.mirror.MirrorMaker "$MIRROR_DIR/mirror.properties" \
      >"$MIRROR_DIR/stdout.log" 2>&1 < /dev/null &
    echo $! > "$MIRROR_DIR/pid"
    echo "mirror.sh: MirrorMaker 2 starting, $source_bs -> $target_bs (pid $!, log $MIRROR_DIR/mirror.log)" >&2
    exec "$0" wait --timeout "$timeout"
    ;;
  wait)
    for _ in $(seq 1 "$((timeout * 2))"); do
      running || { echo "mirror.sh: MirrorMaker 2 is not running (see $MIRROR_DIR/mirror.log, $MIRROR_DIR/stdout.log)" >&2; exit 1; }
      # both flows' source connectors have started (they pick up a run's topics within refresh.topics.interval)
      if [ "$(grep -c "Started MirrorSourceConnector" "$MIRROR_DIR/mirror.log" 2>/dev/null)" -ge 2 ]; then
        echo "mirror.sh: MirrorMaker 2 ready" >&2; exit 0
      fi
      sleep 0.5
    done
    echo "mirror.sh: MirrorMaker 2 not ready after ${timeout}s (see $MIRROR_DIR/mirror.log)" >&2; exit 1
    ;;
  stop)
    if ! running; then echo "mirror.sh: not running" >&2; rm -f "$MIRROR_DIR/pid"; exit 0; fi
    pid=$(cat "$MIRROR_DIR/pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$MIRROR_DIR/pid"
    echo "mirror.sh: stopped (pid $pid)" >&2
    ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
