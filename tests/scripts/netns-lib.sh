#!/bin/sh
# netns-lib.sh - two hosts joined through a router, made of network
# namespaces (sourced by the cross-host tests):
#   h1 (10.77.1.2) --veth-- r (10.77.1.1 | 10.77.2.1) --veth-- h2 (10.77.2.2)
# Names carry a per-run suffix so parallel runs do not collide.
S=${URSA_NS_SUFFIX:-$$}
H1=ursa_h1_$S; H2=ursa_h2_$S; R=ursa_r_$S
IP1=10.77.1.2; IP2=10.77.2.2

netns_up() {
	ip netns add $H1 && ip netns add $H2 && ip netns add $R || return 1
	ip link add v1h netns $H1 type veth peer name v1r netns $R || return 1
	ip link add v2h netns $H2 type veth peer name v2r netns $R || return 1
	ip -n $H1 addr add $IP1/24 dev v1h; ip -n $H1 link set v1h up; ip -n $H1 link set lo up
	ip -n $H2 addr add $IP2/24 dev v2h; ip -n $H2 link set v2h up; ip -n $H2 link set lo up
	ip -n $R addr add 10.77.1.1/24 dev v1r; ip -n $R link set v1r up
	ip -n $R addr add 10.77.2.1/24 dev v2r; ip -n $R link set v2r up
	ip -n $R link set lo up
	ip -n $H1 route add default via 10.77.1.1
	ip -n $H2 route add default via 10.77.2.1
	ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
}

netns_down() {
	ip netns del $H1 2>/dev/null; ip netns del $H2 2>/dev/null; ip netns del $R 2>/dev/null
	true
}
