#!/usr/bin/env bash
# Remove every namespace and interface ops/wan/setup.sh made. Safe to run any number of times.
#   ops/wan/teardown.sh
set -u
source "$(dirname "$0")/env.sh"
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$WAN_PREFIX-(site-[0-9]+|sw)$"); do
  ip netns del "$ns" 2>/dev/null
done
ip link del "$WAN_UP" 2>/dev/null
exit 0
