#!/usr/bin/env bash
# Start a local Apache Kafka (KRaft, combined broker+controller) and wait until it serves.
#   ops/kafka/start.sh            # one node on 127.0.0.1:9092 (controller on :9093)
#   ops/kafka/start.sh --nodes 3  # three nodes on :9092, :9094, :9096 (controllers :9093, :9095, :9097)
# Idempotent: a node that is already running is left alone. Logs: $HILO_CACHE/kafka-run/node-N/server.log
set -euo pipefail
source "$(dirname "$0")/env.sh"
NODES=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
"$KAFKA_SCRIPTS/fetch.sh"
CP="$KAFKA_LIBS/*"
voters=""
for n in $(seq 1 "$NODES"); do voters="$voters${voters:+,}$n@$KAFKA_HOST:$((KAFKA_PORT + 2*n - 1))"; done
mkdir -p "$KAFKA_HOME_DIR"
cluster_file=$KAFKA_HOME_DIR/cluster-$NODES.id
[ -f "$cluster_file" ] || java -cp "$CP" kafka.tools.StorageTool random-uuid > "$cluster_file"
rf=$(( NODES < 3 ? NODES : 3 ))
for n in $(seq 1 "$NODES"); do
  dir=$KAFKA_HOME_DIR/node-$n; port=$((KAFKA_PORT + 2*n - 2)); cport=$((port + 1))
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "start.sh: node $n already running (pid $(cat "$dir/pid"))" >&2; continue
  fi
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=1
PROPS
  if [ ! -f "$dir/data/meta.properties" ]; then
    java -cp "$CP" -Dlog4j2.configurationFile="$KAFKA_SCRIPTS/log4j2.properties" -Dhilo.kafka.log="$dir/format.log" \
      kafka.tools.StorageTool format -t "$(cat "$cluster_file")" -c "$dir/server.properties" >"$dir/format.out" 2>&1 \
      || { echo "start.sh: formatting node $n failed:" >&2; tail -n 20 "$dir/format.out" >&2; exit 1; }
  fi
  : > "$dir/server.log"
  # setsid: the broker outlives this script and the shell that ran it.
  setsid nohup java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_SCRIPTS/log4j2.properties" -Dhilo.kafka.log="$dir/server.log" \
    -cp "$CP" kafka.Kafka "$dir/server.properties" >"$dir/stdout.log" 2>&1 < /dev/null &
  echo $! > "$dir/pid"
  echo "start.sh: node $n starting on $KAFKA_HOST:$port (pid $!)" >&2
done
exec "$KAFKA_SCRIPTS/wait.sh" --nodes "$NODES"
