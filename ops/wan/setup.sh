#!/usr/bin/env bash
# Emulated WAN: N site namespaces joined to the broker's side through a bridge, each link shaped with tc.
#   ops/wan/setup.sh --sites 4 [--rate 100mbit] [--rtt-ms 40] [--shared]
#
#   root ns: hilo-up0 10.77.0.1 (broker, trainer) --veth-- [ns hilo-sw: bridge br0] --veth-- ns hilo-site-i: eth0 10.77.0.(10+i)
#
# Shaping is shape.sh's (separate links, or --shared: one shaped uplink for all sites). Runs teardown.sh
# first, so a setup after a crash starts clean; run teardown.sh when done (bench wan and the tests trap it).
# Only addresses in 10.77.0.0/24 on these interfaces are used. Needs root (ip, tc).
set -euo pipefail
source "$(dirname "$0")/env.sh"
SITES=2
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --sites) SITES=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) shift ;;
  esac
done
"$(dirname "$0")/teardown.sh"
ip netns add "$WAN_SW"
ip -n "$WAN_SW" link set lo up
ip -n "$WAN_SW" link add br0 type bridge
ip -n "$WAN_SW" link set br0 up
ip link add "$WAN_UP" type veth peer name up1 netns "$WAN_SW"
ip addr add "$WAN_BROKER_IP/24" dev "$WAN_UP"
ip link set "$WAN_UP" up
ip -n "$WAN_SW" link set up1 master br0 up
for i in $(seq 1 "$SITES"); do
  ns=$(site_ns "$i")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "s${i}a" netns "$WAN_SW" type veth peer name eth0 netns "$ns"
  ip -n "$WAN_SW" link set "s${i}a" master br0 up
  ip -n "$ns" addr add "$(site_ip "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
done
exec "$(dirname "$0")/shape.sh" "${args[@]}"
