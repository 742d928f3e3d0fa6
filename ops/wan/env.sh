# Shared names and addresses for the ops/wan scripts (sourced). Everything lives in 10.77.0.0/24 on
# interfaces these scripts create; nothing is routed anywhere else.
WAN_PREFIX=${HILO_WAN_PREFIX:-hilo}
WAN_NET=10.77.0
WAN_BROKER_IP=$WAN_NET.1            # root namespace end of the uplink: the broker (and trainer) side
WAN_SW=$WAN_PREFIX-sw               # namespace holding the bridge all links meet at
WAN_UP=$WAN_PREFIX-up0              # root-namespace uplink interface (shaped in shared-uplink mode)
site_ns() { echo "$WAN_PREFIX-site-$1"; }
site_ip() { echo "$WAN_NET.$((10 + $1))"; }
