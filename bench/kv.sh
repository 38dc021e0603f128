#!/bin/sh
# kv.sh - the ursa-kv case study's table (apps/kv): GET by TCP, by
# SEND/RECV and by one-sided READ, next to Redis (redis-server and
# redis-benchmark from Debian, when installed) in the same run, on one
# host; then the three ursa paths between two network namespaces (root).
# Reports; asserts nothing.
#   bench/kv.sh [BUILD] [SECONDS] [OUT.md]
BUILD=${1:-build}
SECS=${2:-3}
OUT=${3:-}
KV="$(cd "$BUILD/bin" && pwd)/ursa-kv"
LIB="$(cd "$BUILD/lib" && pwd)"
E="env LD_LIBRARY_PATH=$LIB"
PORT=7450; RPORT=7451
tmp=$(mktemp -d)
pids=
cleanup() { for p in $pids; do kill $p 2>/dev/null; done; [ -n "${H1:-}" ] && netns_down; rm -rf "$tmp"; }
trap cleanup EXIT

wait_for() { for i in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }

$E "$KV" server --port $PORT >"$tmp/srv" 2>&1 & pids="$pids $!"
wait_for "$tmp/srv" serving || { echo "ursa-kv server did not start: $(cat "$tmp/srv")"; exit 1; }
redis=
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
	redis-server --port $RPORT --save '' --appendonly no >"$tmp/redis" 2>&1 & rpid=$!
	pids="$pids $rpid"
	wait_for "$tmp/redis" "Ready to accept" && redis="--redis-port $RPORT --redis-pid $rpid"
else
	echo "(redis-server or redis-benchmark not installed: no Redis row; apt-get install redis-server redis-tools)"
fi
echo "== one host (loopback for TCP and Redis; ursa same-host transport for verbs)"
$E "$KV" bench 127.0.0.1:$PORT --seconds "$SECS" $redis ${OUT:+--out "$tmp/one.md"}

if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
	. "$(dirname "$0")/../tests/scripts/netns.inc"
	if netns_up; then
		ip netns exec $H1 $E "$KV" server --port $PORT >"$tmp/srv2" 2>&1 & pids="$pids $!"
		wait_for "$tmp/srv2" serving &&
		{ echo "== two hosts (network namespaces through a router; RoCEv2 for verbs)"
		  ip netns exec $H2 $E "$KV" bench $IP1:$PORT --seconds "$SECS" ${OUT:+--out "$tmp/two.md"}; }
	fi
fi
if [ -n "$OUT" ]; then
	{ echo "### One host"; echo; cat "$tmp/one.md"; echo
	  if [ -f "$tmp/two.md" ]; then echo "### Two hosts (namespaces)"; echo; cat "$tmp/two.md"; fi
	} >"$OUT"
	echo "tables written to $OUT"
fi
