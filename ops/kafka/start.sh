#!/usr/bin/env bash
# Start a local Apache Kafka (KRaft, combined broker+controller) and wait until it serves.
#   ops/kafka/start.sh            # one node on 127.0.0.1:9092 (controller on :9093)
#   ops/kafka/start.sh --nodes 3  # three nodes on :9092, :9094, :9096 (controllers :9093, :9095, :9097)
#   ops/kafka/start.sh --secure [--nodes 3]
#       SASL_SSL on :9192 (:9194, :9196), data in $HILO_CACHE/kafka-secure: a CA and broker certificate made by
#       certs.sh, SCRAM-SHA-512 users admin (super user), trainer and site created when the storage is formatted,
#       ACLs enforced (nothing allowed without one; grant a run's with `hilo acls grant`). Client files for
#       --kafka-config: $HILO_CACHE/kafka-secure/security/clients/{admin,trainer,site}.properties.
#       Controllers talk mutual TLS (the broker certificate is their principal).
#   HILO_KAFKA_ADVERTISED_PORT=A ops/kafka/start.sh   # (one plaintext node) clients reached through a proxy on :A
#       The node also listens on PORT+2 (listener CLIENT) and tells its clients to reach it at $HILO_KAFKA_HOST:A, where
#       a proxy forwarding to PORT+2 listens (ops/wan/toxiproxy.sh: a delayed link): a client bootstrapping from :A
#       then makes every connection through the proxy. The node's own traffic (to itself: transaction markers) stays
#       on PORT, as a broker's does on a real WAN.
# Idempotent: a node that is already running is left alone. Logs: $HILO_CACHE/kafka-run/node-N/server.log
set -euo pipefail
NODES=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --secure) export HILO_KAFKA_SECURE=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/env.sh"
ADVERTISED_PORT=${HILO_KAFKA_ADVERTISED_PORT:-}
if [ -n "$ADVERTISED_PORT" ] && { [ "$NODES" != 1 ] || [ "${HILO_KAFKA_SECURE:-0}" = 1 ]; }; then
  echo "start.sh: HILO_KAFKA_ADVERTISED_PORT is for one plaintext node" >&2; exit 2
fi
"$KAFKA_SCRIPTS/fetch.sh"
CP="$KAFKA_LIBS/*"
voters=""
for n in $(seq 1 "$NODES"); do voters="$voters${voters:+,}$n@$KAFKA_HOST:$((KAFKA_PORT + 2*n - 1))"; done
mkdir -p "$KAFKA_HOME_DIR"
cluster_file=$KAFKA_HOME_DIR/cluster-$NODES.id
[ -f "$cluster_file" ] || java $KAFKA_JVM_OPTS -cp "$CP" kafka.tools.StorageTool random-uuid > "$cluster_file"
rf=$(( NODES < 3 ? NODES : 3 ))
SEC=$KAFKA_HOME_DIR/security
if [ "${HILO_KAFKA_SECURE:-0}" = 1 ]; then
  "$KAFKA_SCRIPTS/certs.sh" "$SEC" "$KAFKA_HOST"
  store_pw=$(cat "$SEC/store.password")
fi
for n in $(seq 1 "$NODES"); do
  dir=$KAFKA_HOME_DIR/node-$n; port=$((KAFKA_PORT + 2*n - 2)); cport=$((port + 1))
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "start.sh: node $n already running (pid $(cat "$dir/pid"))" >&2; continue
  fi
  umask 077  # server.properties holds the keystore and admin passwords when secured
  if [ "${HILO_KAFKA_SECURE:-0}" = 1 ]; then
    cat > "$dir/server.properties" <<PROPS
listeners=SASL_SSL://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport
advertised.listeners=SASL_SSL://$KAFKA_HOST:$port
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(cat "$SEC/users/admin.password")";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PKCS12
ssl.keystore.location=$SEC/broker.p12
ssl.keystore.password=$store_pw
ssl.key.password=$store_pw
ssl.truststore.type=PKCS12
ssl.truststore.location=$SEC/truststore.p12
ssl.truststore.password=$store_pw
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:CN=hilo-broker
PROPS
  elif [ -n "$ADVERTISED_PORT" ]; then
    cat > "$dir/server.properties" <<PROPS
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport,CLIENT://$KAFKA_HOST:$((port + 2))
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port,CLIENT://$KAFKA_HOST:$ADVERTISED_PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT
PROPS
  else
    cat > "$dir/server.properties" <<PROPS
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$cport
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
PROPS
  fi
  cat >> "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
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
# retention is enforced within a second of expiry (default: every 5 min), so a test can watch records expire
log.retention.check.interval.ms=1000
PROPS
  scram=()  # SCRAM users live in the cluster metadata: bootstrapped when the storage is formatted (KIP-900)
  if [ "${HILO_KAFKA_SECURE:-0}" = 1 ]; then
    for user in admin trainer site; do
      scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$(cat "$SEC/users/$user.password")]"
              --add-scram "SCRAM-SHA-256=[name=$user,password=$(cat "$SEC/users/$user.password")]")
    done
  fi
  if [ ! -f "$dir/data/meta.properties" ]; then
    java $KAFKA_JVM_OPTS -cp "$CP" -Dlog4j2.configurationFile="$KAFKA_SCRIPTS/log4j2.properties" -Dhilo.kafka.log="$dir/format.log" \
      kafka.tools.StorageTool format -t "$(cat "$cluster_file")" -c "$dir/server.properties" "${scram[@]}" >"$dir/format.out" 2>&1 \
      || { echo "start.sh: formatting node $n failed:" >&2; tail -n 20 "$dir/format.out" >&2; exit 1; }
  fi
  : > "$dir/server.log"
  # setsid: the broker outlives this script and the shell that ran it.
  setsid nohup java $KAFKA_HEAP $KAFKA_JVM_OPTS -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_SCRIPTS/log4j2.properties" -Dhilo.kafka.log="$dir/server.log" \
    -cp "$CP" kafka.Kafka "$dir/server.properties" >"$dir/stdout.log" 2>&1 < /dev/null &
  echo $! > "$dir/pid"
  echo "start.sh: node $n starting on $KAFKA_HOST:$port (pid $!)" >&2
done
exec "$KAFKA_SCRIPTS/wait.sh" --nodes "$NODES"
