#!/bin/sh
# kv.sh - the ursa-kv case study (apps/kv) against real server and client
# processes: the correctness checks of `ursa-kv check` on one host (with a
# client killed mid-PUT), a server restart that clients ride through, and
# the same checks between two hosts made of network namespaces (root only).
# Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
KV="$(cd "$BUILD/bin" && pwd)/ursa-kv"
LIB="$(cd "$BUILD/lib" && pwd)"
pass=0; fail=0; skip=0
tmp=$(mktemp -d)
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
PORT=$((7500 + $$ % 1000))
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
RUN="env LD_LIBRARY_PATH=$LIB ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0}"
spid=
cleanup() {
	[ -n "$spid" ] && kill $spid 2>/dev/null
	[ -n "${H1:-}" ] && netns_down
	rm -rf "$tmp"
}
trap cleanup EXIT

start_server() { # [netns] : server on $PORT, waits until it listens
	if [ -n "${1:-}" ]; then
		ip netns exec "$1" $RUN "$KV" server --port $PORT --heap 64 >"$tmp/srv" 2>&1 &
	else
		$RUN "$KV" server --port $PORT --heap 64 >"$tmp/srv" 2>&1 &
	fi
	spid=$!
	for i in $(seq 1 100); do grep -q serving "$tmp/srv" && return 0; sleep 0.05; done
	return 1
}

# count the ok/FAIL lines of a check run
tally() { # FILE NAME-PREFIX
	while IFS= read -r l; do
		case "$l" in
		"ok   "*) ok "$2${l#ok   }";;
		"FAIL "*) bad "$2${l#FAIL }" "";;
		"     "*) echo "$l";;	# a check's detail
		esac
	done <"$1"
}

# 1. one host: basic, bad requests, stress with a client killed mid-PUT
if start_server; then
	$RUN timeout 300 "$KV" check 127.0.0.1:$PORT --workers 4 --seconds 3 --kill >"$tmp/c" 2>&1
	rc=$?
	tally "$tmp/c" ""
	[ $rc = 0 ] || bad "check exit status" "$rc: $(tail -3 "$tmp/c" | tr '\n' ' ')"
	kill -0 $spid 2>/dev/null && ok "server alive after the checks" || bad "server" "died: $(cat "$tmp/srv")"
else
	bad "server start" "$(cat "$tmp/srv")"
fi

# 2. server restart: a connected client reconnects and carries on
mkfifo "$tmp/in"
$RUN timeout 60 "$KV" check 127.0.0.1:$PORT --restart-probe <"$tmp/in" >"$tmp/p" 2>&1 &
ppid=$!
exec 3>"$tmp/in"
for i in $(seq 1 100); do grep -q ready "$tmp/p" && break; sleep 0.05; done
kill $spid; wait $spid 2>/dev/null
if start_server; then
	echo go >&3
else
	bad "server restart" "$(cat "$tmp/srv")"
fi
exec 3>&-
wait $ppid
tally "$tmp/p" ""
kill $spid 2>/dev/null; wait $spid 2>/dev/null; spid=

# 3. between two hosts (network namespaces, RoCEv2 on the wire)
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add ursa_kvprobe_$$ 2>/dev/null; then
	ip netns del ursa_kvprobe_$$
	. "$(dirname "$0")/netns.inc"
	if netns_up && start_server $H1; then
		ip netns exec $H2 $RUN timeout 300 "$KV" check $IP1:$PORT --workers 2 --seconds 2 \
			>"$tmp/h" 2>&1
		rc=$?
		tally "$tmp/h" "two hosts: "
		[ $rc = 0 ] || { bad "two hosts: check exit status" "$rc"; tail -5 "$tmp/srv" | sed 's/^/     server: /'; }
	else
		bad "two hosts" "namespaces or server: $(cat "$tmp/srv")"
	fi
else
	skp "two hosts" "needs root and network namespaces"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
