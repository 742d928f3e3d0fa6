# Shared settings for the ops/kafka scripts (sourced, not run).
# Everything heavy lives outside the repo, under HILO_CACHE (default ~/.cache/hilo-sync).
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$(dirname "${BASH_SOURCE[0]}")/pom.xml")
HILO_CACHE=${HILO_CACHE:-$HOME/.cache/hilo-sync}
KAFKA_LIBS=$HILO_CACHE/kafka-$KAFKA_VERSION/libs
# --secure (HILO_KAFKA_SECURE=1): a SASL_SSL broker with ACLs, kept apart from the plaintext one (own dir and ports)
if [ "${HILO_KAFKA_SECURE:-0}" = 1 ]; then
  KAFKA_HOME_DIR=${HILO_KAFKA_DIR:-$HILO_CACHE/kafka-secure}
  KAFKA_PORT=${HILO_KAFKA_PORT:-9192}
else
  KAFKA_HOME_DIR=${HILO_KAFKA_DIR:-$HILO_CACHE/kafka-run}   # data, logs, pid files
  KAFKA_PORT=${HILO_KAFKA_PORT:-9092}                        # node N listens on PORT+2*(N-1)
fi
KAFKA_HOST=${HILO_KAFKA_HOST:-127.0.0.1}
KAFKA_HEAP=${HILO_KAFKA_HEAP:--Xms256m -Xmx768m}
# more JVM options for every Kafka JVM these scripts start (brokers, their tools, MirrorMaker); ops/test.sh sets
# -XX:TieredStopAtLevel=1 (C1 only: a broker's start and first 20 s took 2.8 CPU-s against 4.8 s)
KAFKA_JVM_OPTS=${HILO_KAFKA_JVM_OPTS:-}
KAFKA_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
