#!/bin/sh
# cm.sh - connection management and rsockets, next to TCP on the same path
# in the same run: cmtime's connection setup (100 connections at once)
# beside a loop of TCP connect/close (bench/netpeer), and rstream over
# rsockets beside rstream over TCP sockets (its own -T s: the same program,
# the same sizes). On one host, and between two namespace hosts when run
# as root. Reports; asserts nothing.
#   bench/cm.sh [BUILD]
BUILD=${1:-build}
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
NP="$(cd "$BUILD/bench" && pwd)/netpeer"
RUN="$URSA run --"
tmp=$(mktemp -d)
for p in cmtime rstream; do
	command -v $p >/dev/null || { echo "$p missing (scripts/deps.sh bench)"; exit 1; }
done

# side SERVER-PREFIX CLIENT-PREFIX ADDR WHERE
side() {
	sp=$1; cp=$2; addr=$3; where=$4
	# cmtime: the connect step's total for 100 connections in flight at
	# once (REQ/REP/RTU), and its mean per connection
	$sp timeout 60 $RUN cmtime -p 7980 >/dev/null 2>&1 &
	spid=$!
	sleep 1
	$cp timeout 60 $RUN cmtime -p 7980 -s $addr -c 100 >"$tmp/c" 2>&1
	kill $spid 2>/dev/null; wait $spid 2>/dev/null
	awk -v w="$where" '/^connect  / { printf "%s: rdma_cm connect, 100 at once: %.1f ms in all, %.0f connections/s\n", w, $3, 100000 / $3 }
		/^disconnect / { printf "%s: rdma_cm disconnect, 100: %.1f ms in all\n", w, $3 }' "$tmp/c"
	$sp "$NP" tcp-accept-server 7981 &
	spid=$!
	sleep 0.3
	$cp "$NP" tcp-connect-client $addr 7981 2000 |
		awk -v w="$where" '{ printf "%s: TCP connect, one after another: median %s us, p99 %s us, %s connections/s\n", w, $2, $3, $5 }'
	kill $spid 2>/dev/null; wait $spid 2>/dev/null

	# rstream: 64 B ping-pong latency and a 1 MB stream, rsockets and TCP
	for o in "-S 64 -C 1 -I 20000" "-S 1000000 -C 200"; do
		for t in "" "-T s"; do
			$sp timeout 60 $RUN rstream -p 7982 $o $t >/dev/null 2>&1 &
			spid=$!
			sleep 1
			$cp timeout 60 $RUN rstream -p 7982 -s $addr $o $t 2>&1 | awk -v w="$where" -v o="$o" -v t="${t:+TCP}" \
				'/^custom/ { printf "%s: rstream %s over %s: %s Gb/s, %s us/xfer\n", w, o, t ? t : "rsockets", $7, $8 }'
			wait $spid 2>/dev/null
		done
	done
}

side "" "" 127.0.0.1 "one host"
if [ "$(id -u)" = 0 ]; then
	. "$(dirname "$0")/../tests/scripts/netns.inc"
	trap 'netns_down; rm -rf "$tmp"' EXIT
	if netns_up; then
		side "ip netns exec $H2" "ip netns exec $H1" $IP2 "two hosts"
	fi
fi
rm -rf "$tmp"
