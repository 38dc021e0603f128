#!/bin/sh
# forge.sh - forged RoCEv2 packets from a third host do not break a
# connection (ReDMArk, USENIX Security'21). Two namespace hosts run an RC
# transfer that checks every byte (tests/hosts/xfer.c: WRITE, READ, SEND,
# atomics) while the router namespace, having seen one packet of each
# flow, forges packets with the peers' source addresses and correct ICRCs
# (tests/tools/roce_forge.c) at random PSNs outside the flows' windows
# (none within 2^21 of the PSN it saw; the whole transfer moves fewer
# packets): WRITEs and READs with random keys (duplicates, behind the
# expected PSN, or out of sequence), NAKs (remote access), RNR NAKs with
# the longest timer, ACKs, and a flood of SENDs to random QPNs. The
# transfer must finish intact, and the victims must have counted the
# forged packets. (A forged packet inside a window is the spec's
# exposure, as on a NIC: docs/design.md, "What an attacker must guess".)
# Needs root. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
XFER="$(cd "$BUILD/tests" && pwd)/xfer"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
pass=0; fail=0; skip=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
if [ "$(id -u)" != 0 ] || ! ip netns add ursa_probe_$$ 2>/dev/null; then
	echo "skip forge: needs root and network namespaces"
	echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
ip netns del ursa_probe_$$
tmp=$(mktemp -d)
. "$(dirname "$0")/netns.inc"
floods=""
trap '[ -n "$floods" ] && kill $floods 2>/dev/null; netns_down; rm -rf "$tmp"' EXIT
netns_up || { bad netns "could not build the namespaces"; echo "$pass passed, $fail failed, $skip skipped"; exit 1; }
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
RUN="env LD_LIBRARY_PATH=$LIB URSA_STATS=1 ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0}"
cc -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$SRC/include" -o "$tmp/forge" \
	"$SRC/tests/tools/roce_forge.c" "$SRC/src/proto/roce.c" ||
	{ bad roce_forge "does not build"; echo "$pass passed, $fail failed, $skip skipped"; exit 1; }

MIB=${FORGE_MIB:-64}
# what the attacker learns: one packet of each direction, listening on
# both of the router's links before the flows start (a transfer can be
# over before a second listener, started later, would hear anything)
ip netns exec $R "$tmp/forge" sniff v1r 10 >"$tmp/flows1" 2>&1 &
sn1=$!
ip netns exec $R "$tmp/forge" sniff v2r 10 >"$tmp/flows2" 2>&1 &
sn2=$!
sleep 0.2
ip netns exec $H1 $RUN timeout 300 "$XFER" server 7100 >"$tmp/s" 2>&1 &
spid=$!
ip netns exec $H2 $RUN timeout 300 "$XFER" client $IP1 7100 $MIB >"$tmp/c" 2>&1 &
cpid=$!
wait $sn1 $sn2
cat "$tmp/flows1" "$tmp/flows2" >"$tmp/flows"
q1=$(awk -v a=$IP2 -v b=$IP1 '$1 == a && $2 == b {print $3}' "$tmp/flows")	# h1's QP
q2=$(awk -v a=$IP1 -v b=$IP2 '$1 == a && $2 == b {print $3}' "$tmp/flows")	# h2's QP
p1=$(awk -v a=$IP2 -v b=$IP1 '$1 == a && $2 == b {print $4}' "$tmp/flows")	# a PSN of each
p2=$(awk -v a=$IP1 -v b=$IP2 '$1 == a && $2 == b {print $4}' "$tmp/flows")
if [ -z "$q1" ] || [ -z "$q2" ]; then
	bad "the attacker sees both flows" "$(cat "$tmp/flows")"
else
	ok "the attacker saw both flows (QP $q1 on h1, QP $q2 on h2)"
	# as h2 towards h1's QP (a responder and a requester: xfer's server
	# READs too), and as h1 towards h2's QP, in rounds until the client ends
	(
		while kill -0 $cpid 2>/dev/null; do
			ip netns exec $R "$tmp/forge" flood $IP2 $IP1 0 2000
			for k in write read nak rnr ack; do
				ip netns exec $R "$tmp/forge" $k $IP2 $IP1 $q1 500 $p1
				ip netns exec $R "$tmp/forge" $k $IP1 $IP2 $q2 500 $p2
			done
		done
	) >"$tmp/f" 2>&1 &
	floods=$!
fi
t0=$(date +%s)
wait $cpid; crc=$?
t1=$(date +%s)
[ -n "$floods" ] && { kill $floods 2>/dev/null; wait $floods 2>/dev/null; }
wait $spid; src=$?
sed 's/^/    /' "$tmp/c"
rounds=$(grep -c "^flood: 2000 of 2000 sent" "$tmp/f" 2>/dev/null)
if [ $crc = 0 ] && [ "$(grep -c '^ok ' "$tmp/c")" -ge 4 ] && [ "${rounds:-0}" -ge 1 ]; then
	ok "RC $MIB MiB WRITE/READ/SEND and atomics, every byte checked, through $rounds rounds of forged packets ($((t1 - t0)) s)"
else
	bad "the transfer under forged packets" "client $crc server $src, $rounds rounds: $(grep FAIL "$tmp/c" | head -2)"
fi
# what the victims counted (ursa stats at exit)
counted() { sed -n "s/.*RoCEv2: .*dropped: .*[^a-z] $1 \([0-9]*\).*/\1/p" "$tmp/s" "$tmp/c" | awk '{s += $1} END {print s + 0}'; }
st=$(counted stale); ps=$(counted PSN); sd=$(counted source)
qn=$(sed -n 's/.* ICRC [0-9]* QPN \([0-9]*\).*/\1/p' "$tmp/s" "$tmp/c" | awk '{s += $1} END {print s + 0}')
if [ "$st" -gt 0 ] && [ "$qn" -gt 0 ]; then
	ok "the victims dropped and counted them (stale answers and READs $st, out-of-sequence $ps, unknown QPN $qn, wrong source $sd)"
else
	bad "forged packets counted" "stale $st PSN $ps QPN $qn source $sd"
fi

# A sender that is not ursa: valid UD SENDs from the router, each with a
# random IPv4 ID in its ICRC, as rxe gives them (NICs count). The ID is
# not visible to a UDP socket; the receiver solves for it (proto/roce.h):
# every message must arrive, once and intact.
if cc -O2 -Wall -Wextra -Werror -I"$SRC/include" -o "$tmp/sink" \
	"$SRC/tests/tools/ud_sink.c" -L"$LIB" -Wl,-rpath-link,"$LIB" -libverbs; then
	ip netns exec $H1 $RUN timeout 30 "$tmp/sink" 500 20 >"$tmp/sink.out" 2>&1 &
	kpid=$!
	for _ in $(seq 50); do grep -q '^qpn' "$tmp/sink.out" && break; sleep 0.1; done
	q=$(sed -n 's/^qpn 0x//p' "$tmp/sink.out")
	ip netns exec $R "$tmp/forge" ud 10.77.1.1 $IP1 "${q:-0}" 500 >"$tmp/ud" 2>&1
	wait $kpid; krc=$?
	if [ $krc = 0 ] && grep -q '^received 500 of 500 (0 bad)' "$tmp/sink.out"; then
		ok "500 UD SENDs with random IPv4 IDs, as rxe sends them, all received"
	else bad "UD SENDs with random IPv4 IDs" "sink $krc: $(tr '\n' ' ' <"$tmp/sink.out") / $(cat "$tmp/ud")"; fi
else
	bad ud_sink "does not build"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
