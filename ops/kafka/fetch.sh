#!/usr/bin/env bash
# Resolve the pinned Apache Kafka broker jars from Maven Central into $HILO_CACHE (once).
#   ops/kafka/fetch.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ -f "$KAFKA_LIBS/.complete" ]; then exit 0; fi
command -v mvn >/dev/null || { echo "fetch.sh: Maven (mvn) is required to resolve Kafka $KAFKA_VERSION" >&2; exit 1; }
echo "fetch.sh: resolving org.apache.kafka:kafka_2.13:$KAFKA_VERSION into $KAFKA_LIBS" >&2
rm -rf "$KAFKA_LIBS"; mkdir -p "$KAFKA_LIBS"
mvn -q -B -f "$KAFKA_SCRIPTS/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime
touch "$KAFKA_LIBS/.complete"
