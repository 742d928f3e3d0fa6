#!/usr/bin/env bash
# (Re)shape the links of an existing ops/wan setup without touching namespaces (the broker stays up).
#   ops/wan/shape.sh --sites N [--rate 100mbit] [--rtt-ms 40] [--shared]
# Separate links: each site's bridge port is rate-limited toward its site. --shared: only the broker's
# uplink (hilo-up0) is, so every site's traffic shares it. --rate 0: unshaped. Delay needs sch_netem
# (half the RTT on each side); without it links are rate-limited only, and a warning says so.
set -euo pipefail
source "$(dirname "$0")/env.sh"
SITES=2; RATE=100mbit; RTT_MS=40; SHARED=0; QUIET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sites) SITES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --rtt-ms) RTT_MS=$2; shift 2 ;;
    --shared) SHARED=1; shift ;;
    --quiet) QUIET=1; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "shape.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
half="$(awk "BEGIN{print $RTT_MS/2}")ms"
NETEM=0
ip link add "$WAN_PREFIX-probe0" type veth peer name "$WAN_PREFIX-probe1"
tc qdisc add dev "$WAN_PREFIX-probe0" root netem delay 1ms 2>/dev/null && NETEM=1
ip link del "$WAN_PREFIX-probe0"
[ "$NETEM" = 1 ] || [ "$RTT_MS" = 0 ] || [ "$QUIET" = 1 ] || echo "shape.sh: warning: this kernel has no sch_netem; links are rate-limited only, no ${RTT_MS} ms RTT" >&2
# tbf bucket: 10 ms of traffic at the link rate (at least 64 KiB, a GSO segment); queue up to 500 ms.
burst=$(awk -v r="$RATE" 'BEGIN{ n=r+0; u=tolower(r); if (u ~ /gbit/) n*=1e9; else if (u ~ /mbit/) n*=1e6; else if (u ~ /kbit/) n*=1e3;
  b=int(n/8/100); if (b < 65536) b=65536; print b }')
shape() {  # shape NETNS DEV WITH_RATE; NETNS "-" is the root namespace
  local ns=$1 dev=$2 with_rate=$3 cmd=(tc)
  [ "$ns" != "-" ] && cmd=(ip netns exec "$ns" tc)
  "${cmd[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  local parent=root
  if [ "$NETEM" = 1 ] && [ "$RTT_MS" != 0 ]; then
    "${cmd[@]}" qdisc add dev "$dev" root handle 1: netem delay "$half" limit 100000
    parent="parent 1:"
  fi
  if [ "$with_rate" = 1 ] && [ "$RATE" != 0 ]; then
    "${cmd[@]}" qdisc add dev "$dev" $parent handle 2: tbf rate "$RATE" burst "$burst" latency 500ms
  fi
}
for i in $(seq 1 "$SITES"); do
  shape "$(site_ns "$i")" eth0 0                                  # site -> broker: half the RTT
  shape "$WAN_SW" "s${i}a" $((1 - SHARED))                       # broker -> site i: its own link
done
shape - "$WAN_UP" "$SHARED"                                      # broker -> all sites: the shared uplink
[ "$QUIET" = 1 ] || echo "shape.sh: $SITES site(s), rate $RATE, $([ $SHARED = 1 ] && echo shared uplink || echo separate links)" >&2
