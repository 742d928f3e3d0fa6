#!/usr/bin/env bash
# A delayed TCP link without sch_netem: Shopify's toxiproxy in front of one local service, with a `latency` toxic of
# half the round trip on each direction (upstream and downstream), so every request and its reply take RTT longer.
# shape.sh adds delay with tc netem, which this kernel may lack ("qdisc kind is unknown"); this needs no root.
#   ops/wan/toxiproxy.sh install         # once: `go install` toxiproxy's server into $HILO_CACHE/bin (needs Go)
#   ops/wan/toxiproxy.sh check           # exit 0 if it is installed or Go is there to install it
#   ops/wan/toxiproxy.sh start --listen 127.0.0.1:19895 --upstream 127.0.0.1:19894 --rtt-ms 150 [--api-port 8474]
#   ops/wan/toxiproxy.sh rtt --rtt-ms 50 # the running proxy's delay, changed (open connections included)
#   ops/wan/toxiproxy.sh stop
# State (pid, API port, log) in $HILO_TOXIPROXY_DIR (default $HILO_CACHE/toxiproxy-run); one proxy per state dir.
# start stops a proxy this dir still records first. Go: `go` on PATH or /usr/local/go/bin/go; modules from GOPROXY.
set -euo pipefail
TOXIPROXY_VERSION=v2.5.0
HILO_CACHE=${HILO_CACHE:-$HOME/.cache/hilo-sync}
BIN=$HILO_CACHE/bin/toxiproxy-server-$TOXIPROXY_VERSION
DIR=${HILO_TOXIPROXY_DIR:-$HILO_CACHE/toxiproxy-run}
PROXY=hilo  # the proxy's name in toxiproxy's API
cmd=${1:-}; [ $# -gt 0 ] && shift
LISTEN=""; UPSTREAM=""; RTT_MS=""; API_PORT=8474
while [ $# -gt 0 ]; do
  case "$1" in
    --listen) LISTEN=$2; shift 2 ;;
    --upstream) UPSTREAM=$2; shift 2 ;;
    --rtt-ms) RTT_MS=$2; shift 2 ;;
    --api-port) API_PORT=$2; shift 2 ;;
    *) echo "toxiproxy.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

GO=$(command -v go || echo /usr/local/go/bin/go)

install() {
  [ -x "$BIN" ] && return 0
  local go=$GO
  [ -x "$go" ] || { echo "toxiproxy.sh: no Go toolchain (go on PATH or /usr/local/go/bin/go) to install toxiproxy" >&2; exit 1; }
  local tmp; tmp=$(mktemp -d)
  echo "toxiproxy.sh: installing toxiproxy $TOXIPROXY_VERSION (go install, a minute or two the first time)" >&2
  GOBIN=$tmp "$go" install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2 \
    || { rm -rf "$tmp"; echo "toxiproxy.sh: go install failed" >&2; exit 1; }
  mkdir -p "$(dirname "$BIN")"
  mv "$tmp/server" "$BIN"; rm -rf "$tmp"
}

api() {  # api METHOD PATH [JSON]: one call to the running server's API; fails on an HTTP error
  curl -sS --fail-with-body -X "$1" "http://127.0.0.1:$(cat "$DIR/api")$2" ${3:+-H 'Content-Type: application/json' -d "$3"} >/dev/null
}

toxics() {  # toxics create|update: the two latency toxics, upstream RTT/2 and downstream the rest
  local up=$((RTT_MS / 2)) down=$((RTT_MS - RTT_MS / 2))
  local stream latency
  for stream in upstream downstream; do
    latency=$([ $stream = upstream ] && echo $up || echo $down)
    if [ "$1" = create ]; then
      api POST "/proxies/$PROXY/toxics" "{\"name\":\"$stream\",\"type\":\"latency\",\"stream\":\"$stream\",\"attributes\":{\"latency\":$latency}}"
    else
      api POST "/proxies/$PROXY/toxics/$stream" "{\"attributes\":{\"latency\":$latency}}"
    fi
  done
}

stop() {
  [ -f "$DIR/pid" ] || return 0
  local pid; pid=$(cat "$DIR/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "toxiproxy.sh: stopped pid $pid" >&2
  fi
  rm -f "$DIR/pid" "$DIR/api"
}

case "$cmd" in
  install) install ;;
  check)
    [ -x "$BIN" ] || [ -x "$GO" ] || { echo "toxiproxy.sh: not installed, and no Go to install it" >&2; exit 1; } ;;
  start)
    [ -n "$LISTEN" ] && [ -n "$UPSTREAM" ] && [ -n "$RTT_MS" ] || { echo "toxiproxy.sh start: needs --listen, --upstream and --rtt-ms" >&2; exit 2; }
    install
    stop
    mkdir -p "$DIR"
    echo "$API_PORT" > "$DIR/api"
    # setsid: the proxy outlives this script, as a broker from ops/kafka/start.sh does; info: no line per request
    LOG_LEVEL=info setsid nohup "$BIN" -host 127.0.0.1 -port "$API_PORT" >"$DIR/server.log" 2>&1 < /dev/null &
    echo $! > "$DIR/pid"
    for _ in $(seq 1 100); do
      api GET /version 2>/dev/null && break
      kill -0 "$(cat "$DIR/pid")" 2>/dev/null || { echo "toxiproxy.sh: the server exited:" >&2; tail -n 20 "$DIR/server.log" >&2; exit 1; }
      sleep 0.1  # polling a server we just started until its API answers
    done
    api POST /proxies "{\"name\":\"$PROXY\",\"listen\":\"$LISTEN\",\"upstream\":\"$UPSTREAM\",\"enabled\":true}"
    toxics create
    echo "toxiproxy.sh: $LISTEN -> $UPSTREAM, ${RTT_MS} ms RTT (pid $(cat "$DIR/pid"), API :$API_PORT)" >&2 ;;
  rtt)
    [ -n "$RTT_MS" ] && [ -f "$DIR/api" ] || { echo "toxiproxy.sh rtt: needs --rtt-ms and a running proxy" >&2; exit 2; }
    toxics update
    echo "toxiproxy.sh: ${RTT_MS} ms RTT" >&2 ;;
  stop) stop ;;
  -h|--help|"") sed -n '2,11p' "$0" ;;
  *) echo "toxiproxy.sh: unknown command $cmd" >&2; exit 2 ;;
esac
