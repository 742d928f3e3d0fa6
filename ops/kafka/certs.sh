#!/usr/bin/env bash
# Security material for a local secured broker (start.sh --secure): a CA, the brokers' certificate, SCRAM
# passwords for three principals, and one client properties file per principal (hilo --kafka-config FILE).
#   ops/kafka/certs.sh DIR [HOST]
# Writes (never overwrites; mode 0600 for secrets):
#   DIR/ca.pem                    the CA sites and trainers trust (ssl.ca.location)
#   DIR/ca.key                    the CA's key (only this script needs it)
#   DIR/broker.p12, truststore.p12, store.password   the brokers' keystore/truststore (PKCS12)
#   DIR/users/NAME.password       SCRAM password of admin, trainer, site
#   DIR/clients/NAME.properties   security.protocol=SASL_SSL, the CA, SCRAM-SHA-512, the user and its password file
set -euo pipefail
DIR=${1:?usage: certs.sh DIR [HOST]}
HOST=${2:-127.0.0.1}
umask 077
mkdir -p "$DIR/users" "$DIR/clients"
DIR=$(cd "$DIR" && pwd)  # the client files name absolute paths
cd "$DIR"
secret() { openssl rand -hex 24; }
[ -f store.password ] || secret > store.password
if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 -subj "/CN=hilo-sync local CA" 2>/dev/null
fi
if [ ! -f broker.p12 ]; then
  # One certificate for every local node: its SAN names the host they all listen on. clientAuth too: brokers
  # authenticate to the controllers with it (mutual TLS on the controller listener).
  openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=hilo-broker" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost%s\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$([ "$HOST" = 127.0.0.1 ] || { [[ $HOST =~ ^[0-9.]+$ ]] && echo ",IP:$HOST" || echo ",DNS:$HOST"; })" > broker.ext
  openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.pem -days 3650 -extfile broker.ext 2>/dev/null
  openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker -out broker.p12 \
    -passout "file:store.password"
  rm -f broker.csr broker.ext ca.srl broker.key
fi
if [ ! -f truststore.p12 ]; then
  keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 -storetype PKCS12 \
    -storepass "$(cat store.password)" >/dev/null 2>&1
fi
for user in admin trainer site; do
  [ -f "users/$user.password" ] || secret > "users/$user.password"
  [ -f "clients/$user.properties" ] || cat > "clients/$user.properties" <<PROPS
# hilo --kafka-config for principal User:$user on the local secured broker
security.protocol=SASL_SSL
ssl.ca.location=$DIR/ca.pem
sasl.mechanism=SCRAM-SHA-512
sasl.username=$user
sasl.password.file=$DIR/users/$user.password
PROPS
done
chmod 644 ca.pem
