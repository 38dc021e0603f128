#!/bin/sh
# rdmacm.sh - Debian 12's unmodified rdma_cm programs (rdmacm-utils
# with the rsockets ones, perftest -R, fio's rdma engine, qperf -cm1,
# libfabric's verbs msg and rxm endpoints, UCX's rdmacm connection
# manager) on ursa's librdmacm.so.1, as server/client process pairs
# started through `ursa run`, on one host and between two hosts made of
# network namespaces; and the bad flows: a connect to a port nobody
# listens on, a listener killed during the handshake, a server killed
# while connected. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
pass=0; fail=0; skip=0
tmp=$(mktemp -d)
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
have() { command -v "$1" >/dev/null 2>&1; }

asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
	RUN="env LD_LIBRARY_PATH=$LIB LD_PRELOAD=$asan:$LIB/libursa-preload.so ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"
else
	RUN="$URSA run --"
fi

# pair NAME SERVER-PREFIX CLIENT-PREFIX "SERVER ARGS" "CLIENT ARGS" [CHECK]
# Runs the server, waits for it to listen, runs the client; both must end
# with status 0 (and CHECK, a grep pattern, must be in the client's output).
pair() {
	name=$1; sp=$2; cp=$3; sargs=$4; cargs=$5; check=$6
	$sp timeout 60 $RUN $sargs >"$tmp/s" 2>&1 &
	spid=$!
	sleep 1
	$cp timeout 50 $RUN $cargs >"$tmp/c" 2>&1; crc=$?
	wait $spid; src=$?
	if [ $crc -eq 0 ] && [ $src -eq 0 ] &&
	   { [ -z "$check" ] || grep -q -- "$check" "$tmp/c"; }; then
		ok "$name"
	else
		bad "$name" "server $src, client $crc: $(tail -3 "$tmp/s" | tr '\n' '|') / $(tail -3 "$tmp/c" | tr '\n' '|')"
	fi
}

# The library loads where the real one would: every symbol the Debian
# binaries import, with its version (BIND_NOW).
if have rping; then
	if $RUN rping -h 2>&1 | grep -q 'rping -s'; then ok "rping loads ursa's librdmacm.so.1"
	else bad "rping loads ursa's librdmacm.so.1" "$($RUN rping -h 2>&1 | head -2)"; fi
	if LD_LIBRARY_PATH=$LIB ldd "$(command -v rping)" | grep -q "$LIB/librdmacm.so.1"; then
		ok "ursa run resolves librdmacm.so.1 to ursa's"
	else bad "ursa run resolves librdmacm.so.1 to ursa's" "$(LD_LIBRARY_PATH=$LIB ldd "$(command -v rping)" | grep rdmacm)"; fi
fi

# cases HOSTNAME SP CP: the programs between a server run with SP and a
# client run with CP that reaches it at HOSTNAME
cases() {
	where=$1; sp=$2; cp=$3; addr=$4
	if have rping; then
		pair "rping -C 100 -V ($where)" "$sp" "$cp" "rping -s -a 0.0.0.0 -C 100 -V" \
			"rping -c -a $addr -C 100 -V"
		pair "rping -C 20 -v -S 4096 ($where)" "$sp" "$cp" "rping -s -a 0.0.0.0 -C 20 -S 4096" \
			"rping -c -a $addr -C 20 -v -S 4096" "rdma-ping-19: "
		pair "ucmatose, 4 connections ($where)" "$sp" "$cp" "ucmatose -c 4" \
			"ucmatose -s $addr -c 4" "test complete"
		pair "udaddy (UD, SIDR) ($where)" "$sp" "$cp" "udaddy" "udaddy -s $addr" \
			"test complete"
		pair "rdma_server / rdma_client ($where)" "$sp" "$cp" "rdma_server" \
			"rdma_client -s $addr" "rdma_client: end 0"
	else
		skp "rdmacm-utils ($where)" "rping not installed (scripts/deps.sh test)"
	fi
	if have cmtime; then
		# 100 connections at once: with URSA_CM_RETRIES=0 a REQ the
		# listener's side lost would end in UNREACHABLE (cmtime still
		# exits 0, so its events are read)
		$sp timeout 60 $RUN cmtime -p 7989 >"$tmp/s" 2>&1 &
		spid=$!
		sleep 1
		$cp env URSA_CM_RETRIES=0 timeout 30 $RUN cmtime -s $addr -p 7989 -c 100 \
			>"$tmp/c" 2>&1; crc=$?
		kill $spid 2>/dev/null; wait $spid 2>/dev/null
		if [ $crc -eq 0 ] && grep -q '^connect  ' "$tmp/c" &&
		   ! grep -q 'event:\|error\|failed' "$tmp/c"; then
			ok "cmtime, 100 connections at once, no REQ resent ($where)"
		else bad "cmtime, 100 connections at once, no REQ resent ($where)" "client $crc: $(grep -v '^ursa' "$tmp/c" | tail -4 | tr '\n' '|')"; fi
	fi
	if have rstream; then
		# rsockets: every size rstream knows, blocking, async (rpoll)
		# and non-blocking; a verified stream; riomap/riowrite
		for o in "" "-T a" "-T n" "-S 100000 -C 50 -T v"; do
			pair "rstream ${o:-(every size)} ($where)" "$sp" "$cp" "rstream $o" \
				"rstream -s $addr $o" "Gb/sec"
		done
		# (every size only on one host: between hosts each 64-byte
		# round trip waits for the receiver's engine thread, which
		# riostream's memory-spinning threads leave no core to here)
		for o in "-S 100000 -C 50 -T v" "-S 4096 -C 1 -I 300 -T v"; do
			pair "riostream $o ($where)" "$sp" "$cp" "riostream $o" \
				"riostream -s $addr $o" "Gb/sec"
		done
		[ -z "$sp" ] && pair "riostream, every size ($where)" "" "" "riostream" \
			"riostream -s $addr" "1m_bw"
		# rcopy's server never exits: the copy must be whole when the
		# client is done
		head -c 3000000 /dev/urandom >"$tmp/src"
		rm -f "$tmp/dst"
		$sp timeout 60 $RUN rcopy >"$tmp/s" 2>&1 &
		spid=$!
		sleep 1
		$cp timeout 30 $RUN rcopy "$tmp/src" "$addr:$tmp/dst" >"$tmp/c" 2>&1; crc=$?
		kill $spid 2>/dev/null; wait $spid 2>/dev/null
		if [ $crc -eq 0 ] && cmp -s "$tmp/src" "$tmp/dst"; then
			ok "rcopy 3 MB, same bytes ($where)"
		else bad "rcopy 3 MB, same bytes ($where)" "client $crc: $(tail -2 "$tmp/c" | tr '\n' '|') / $(tail -2 "$tmp/s" | tr '\n' '|')"; fi
	else
		skp "rsockets ($where)" "rstream not installed (scripts/deps.sh test)"
	fi
	if have ib_write_bw; then
		for t in ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw ib_read_bw ib_send_bw; do
			pair "$t -R ($where)" "$sp" "$cp" "$t -R -F -n 200" "$t -R -F -n 200 $addr" "#bytes"
		done
	fi
	if have fio; then
		# fio's rdma engine: the reader is the server. Its SEND test
		# connects with rnr_retry 0 (fio's), so the receiver posts a
		# receive for every message first, as fio advises: a message
		# that found none would end the run on any RoCE device.
		for v in write read; do
			pair "fio --ioengine=rdma --verb=$v ($where)" "$sp" "$cp" \
				"fio --name=s --ioengine=rdma --port=7720 --rw=read --bs=64k --size=64m" \
				"fio --name=c --ioengine=rdma --hostname=$addr --port=7720 --rw=write --bs=64k --size=64m --iodepth=4 --verb=$v" \
				"WRITE: bw="
		done
		pair "fio --ioengine=rdma --verb=send ($where)" "$sp" "$cp" \
			"fio --name=s --ioengine=rdma --port=7720 --rw=read --bs=64k --size=4m --iodepth=64" \
			"fio --name=c --ioengine=rdma --hostname=$addr --port=7720 --rw=write --bs=64k --size=4m --iodepth=4 --verb=send" \
			"WRITE: bw="
	fi
	if have qperf; then
		# one qperf server for every test; -cm1 connects with rdma_cm
		$sp timeout 120 $RUN qperf >"$tmp/s" 2>&1 &
		spid=$!
		sleep 1
		for t in rc_lat rc_bw rc_rdma_write_bw rc_rdma_read_bw; do
			out=$($cp timeout 30 $RUN qperf -cm1 -t 1 $addr $t 2>&1); crc=$?
			if [ $crc -eq 0 ] && echo "$out" | grep -q 'latency\|bw'; then
				ok "qperf -cm1 $t ($where): $(echo "$out" | tail -1 | tr -s ' ')"
			else bad "qperf -cm1 $t ($where)" "rc $crc: $(echo "$out" | tr '\n' '|')"; fi
		done
		kill $spid 2>/dev/null; wait $spid 2>/dev/null
	fi
	if have fi_pingpong; then
		# libfabric's verbs provider connects its msg endpoints, and
		# ofi_rxm's, with rdma_cm
		pair "fi_pingpong -p verbs -e msg ($where)" "$sp" "$cp" \
			"fi_pingpong -p verbs -e msg -I 100" \
			"fi_pingpong -p verbs -e msg -I 100 $addr" "^1m "
		pair "fi_pingpong -p 'verbs;ofi_rxm' -e rdm ($where)" "$sp" "$cp" \
			"fi_pingpong -p verbs;ofi_rxm -e rdm -I 100" \
			"fi_pingpong -p verbs;ofi_rxm -e rdm -I 100 $addr" "^1m "
	fi
	if have io_demo; then
		# UCX's client/server API (ucp_listener, ucp_ep by sockaddr)
		# with rdma_cm as its only connection manager and rc_verbs for
		# the data; -q checks every byte
		ucx="env UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_NET_DEVICES=ursa0:1 UCX_TLS=rc_verbs,ud_verbs,self"
		$sp timeout 60 $RUN $ucx io_demo -p 7721 -q -d 1024:65536 >"$tmp/s" 2>&1 &
		spid=$!
		sleep 1
		$cp timeout 50 $RUN $ucx io_demo -p 7721 -q -i 2000 -o read,write -d 1024:65536 $addr \
			>"$tmp/c" 2>&1; crc=$?
		kill $spid 2>/dev/null; wait $spid 2>/dev/null
		# (each report line counts its own interval)
		ios=$(sed -n 's/.*\[DEMO\] total min:[0-9]* max:[0-9]* total:\([0-9]*\) .*/\1/p' "$tmp/c" |
		      awk '{ s += $1 } END { print s + 0 }')
		if [ $crc -eq 0 ] && [ "$ios" = 2000 ] &&
		   grep -q "Client exit with status 'OK'" "$tmp/c"; then
			ok "UCX io_demo over the rdmacm CM, 2000 checked reads and writes ($where)"
		else bad "UCX io_demo over the rdmacm CM ($where)" "client $crc: $(grep -i 'error\|fail\|total' "$tmp/c" | head -3 | tr '\n' '|')"; fi
	fi
}

cases "one host" "" "" 127.0.0.1

# ------------------------------------------------------------- bad flows
if have rping; then
	# nobody listens: REJ "invalid service ID" (8), as from the kernel
	out=$(timeout 20 $RUN rping -c -a 127.0.0.1 -p 7999 -C 1 2>&1); rc=$?
	if [ $rc -ne 0 ] && echo "$out" | grep -q 'RDMA_CM_EVENT_REJECTED.*error 8'; then
		ok "connect to a closed port: REJECTED, status 8"
	else bad "connect to a closed port: REJECTED, status 8" "rc $rc: $(echo "$out" | tr '\n' '|')"; fi
	# the server process dies (SIGKILL) while connected: the client ends,
	# with DISCONNECTED (ursa probes same-host peers every second) or a
	# completion error if its data path noticed first; never a hang
	timeout 30 $RUN rping -s -a 127.0.0.1 -p 7998 -C 1000 >"$tmp/s" 2>&1 &
	sleep 1
	timeout 30 $RUN rping -c -a 127.0.0.1 -p 7998 -C 1000000 >"$tmp/c" 2>&1 &
	cpid=$!
	sleep 1
	pkill -9 -f 'rping -s -a 127.0.0.1 -p 7998'
	wait $cpid; rc=$?
	if [ $rc -ne 124 ] && grep -q 'DISCONNECT EVENT\|completion failed status' "$tmp/c"; then
		ok "server killed while connected: the client ends ($(grep -o 'DISCONNECT EVENT\|completion failed status [0-9]*' "$tmp/c" | head -1))"
	else bad "server killed while connected: the client ends" "rc $rc: $(tail -3 "$tmp/c" | tr '\n' '|')"; fi
fi

# the listener stops (SIGSTOP) with the client's REQ on its way and is
# killed (SIGKILL) in the middle of the handshake: a retransmitted REQ
# finds nobody listening, and the client ends with REJECTED, in about the
# REQ's timeout, not a hang
if have rping; then
	timeout 30 $RUN rping -s -a 127.0.0.1 -p 7994 -C 10 >"$tmp/s" 2>&1 &
	sleep 0.5
	lpid=$(pgrep -f '^rping -s -a 127.0.0.1 -p 7994' | head -1)
	kill -STOP $lpid 2>/dev/null
	t0=$(date +%s)
	timeout 30 $RUN rping -c -a 127.0.0.1 -p 7994 -C 10 >"$tmp/c" 2>&1 &
	cpid=$!
	sleep 1
	kill -9 $lpid 2>/dev/null
	wait $cpid; rc=$?
	dt=$(($(date +%s) - t0))
	if [ -n "$lpid" ] && [ $rc -ne 124 ] && grep -q 'REJECTED' "$tmp/c" && [ $dt -lt 20 ]; then
		ok "listener killed mid-handshake: the client is REJECTED after ${dt} s"
	else bad "listener killed mid-handshake" "pid '$lpid' rc $rc after $dt s: $(tail -3 "$tmp/c" | tr '\n' '|')"; fi
fi

# ursa cm: a listener and both ends of one connection, seen from outside;
# each end names the other's comm ID and QPN
if have rping; then
	timeout 30 $RUN rping -s -a 127.0.0.1 -p 7995 -C 40000 >/dev/null 2>&1 &
	sleep 0.5
	timeout 30 $RUN rping -c -a 127.0.0.1 -p 7995 -C 40000 >/dev/null 2>&1 &
	cpid=$!
	sleep 1
	"$URSA" cm >"$tmp/cm" 2>&1
	kill $cpid 2>/dev/null; wait $cpid 2>/dev/null
	pkill -f 'rping -s -a 127.0.0.1 -p 7995' 2>/dev/null
	conns=$(grep -c '^  connection TCP:[0-9]* *established' "$tmp/cm")
	mirror=$(awk '$1 == "connection" && $3 == "established" {
		split($4, c, "/"); ids[c[1]] = c[2]; q[$5] = $7 }
		END { n = 0; for (a in ids) if (ids[ids[a]] == a) n++;
		      for (a in q) if (q[q[a]] == a) n++; print n }' "$tmp/cm")
	if grep -q '^  listener   TCP:7995 *listen' "$tmp/cm" && [ "$conns" -ge 2 ] &&
	   [ "$mirror" -ge 4 ] && grep -q 'MADs taken [1-9]' "$tmp/cm"; then
		ok "ursa cm shows the listener and both ends, comm IDs and QPNs mirrored"
	else bad "ursa cm" "$(tr '\n' '|' <"$tmp/cm")"; fi
fi

if have rstream; then
	out=$(timeout 20 $RUN rstream -s 127.0.0.1 -p 7997 -S 1000 -C 1 2>&1); rc=$?
	if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q 'rconnect\|rpoll'; then
		ok "rstream to a closed port: rconnect fails"
	else bad "rstream to a closed port: rconnect fails" "rc $rc: $(echo "$out" | tr '\n' '|')"; fi
	# an rstream server SIGKILLed mid-stream: the client ends, no hang
	timeout 30 $RUN rstream -p 7996 -S 100000 -C 10000000 >"$tmp/s" 2>&1 &
	sleep 1
	timeout 30 $RUN rstream -s 127.0.0.1 -p 7996 -S 100000 -C 10000000 >"$tmp/c" 2>&1 &
	cpid=$!
	sleep 1
	pkill -9 -f '^rstream -p 7996'
	wait $cpid; rc=$?
	if [ $rc -ne 124 ] && [ $rc -ne 0 ]; then
		ok "rstream server killed mid-stream: the client ends (status $rc)"
	else bad "rstream server killed mid-stream: the client ends" "rc $rc: $(tail -3 "$tmp/c" | tr '\n' '|')"; fi
fi

# ------------------------------------------------------------ two hosts
if [ "$(id -u)" != 0 ] || ! have ip || ! ip netns add ursa_probe_$$ 2>/dev/null; then
	skp "between hosts" "needs root and network namespaces"
else
	ip netns del ursa_probe_$$
	. "$(dirname "$0")/netns.inc"
	trap 'netns_down; rm -rf "$tmp"' EXIT
	if netns_up; then
		cases "two hosts" "ip netns exec $H2" "ip netns exec $H1" $IP2
		# the CM's MADs on the wire decode as CM in tshark
		if have tshark && have rping; then
			ip netns exec $H2 timeout 30 $RUN rping -s -a 0.0.0.0 -C 2 >/dev/null 2>&1 &
			spid=$!
			sleep 1
			ip netns exec $H1 env URSA_PCAP="$tmp/cm.pcap" timeout 20 $RUN \
				rping -c -a $IP2 -C 2 >/dev/null 2>&1
			wait $spid
			msgs=$(tshark -r "$tmp/cm.pcap" -d udp.port==4791,infiniband \
				--disable-protocol rpcordma -T fields -e infiniband.mad.attributeid 2>/dev/null | sort -u | grep . | tr '\n' ' ')
			case "$msgs" in
			# (the client may exit before the DREP comes back)
			*0x0010*0x0013*0x0014*0x0015*) ok "tshark decodes REQ REP RTU DREQ ($msgs)";;
			*) bad "tshark decodes the CM MADs" "attributes seen: '$msgs'";;
			esac
		fi
	else
		bad "between hosts" "could not build the namespaces"
	fi
fi
rm -rf "$tmp"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
