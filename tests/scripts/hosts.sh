#!/bin/sh
# hosts.sh - RoCEv2 between two hosts made of network namespaces joined by
# veth pairs through a router namespace (created here, removed on exit).
# Needs root (CI runs as root); skips otherwise.
# Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
XFER="$(cd "$BUILD/tests" && pwd)/xfer"
MIB=${URSA_HOSTS_MIB:-256}
pass=0; fail=0; skip=0
tmp=$(mktemp -d)
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add ursa_probe_$$ 2>/dev/null; then
	skp hosts "needs root and network namespaces"
	echo "$pass passed, $fail failed, $skip skipped"; exit 0
fi
ip netns del ursa_probe_$$
. "$(dirname "$0")/netns.inc"
trap 'netns_down; rm -rf "$tmp"' EXIT
netns_up || { bad netns "could not build the namespaces"; echo "$pass passed, $fail failed, $skip skipped"; exit 1; }
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
RUN="env LD_LIBRARY_PATH=$LIB ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0}"

# pair NAME TIMEOUT SERVER_ARGS -- CLIENT_ARGS : server in h1, client in h2
pair() {
	to=$1; shift
	ip netns exec $H1 $RUN ${SRV_ENV:-} timeout "$to" "$@" >"$tmp/s" 2>&1 &
	spid=$!
	sleep 0.5
	ip netns exec $H2 $RUN ${CLI_ENV:-} timeout "$to" "$@" $IP1 >"$tmp/c" 2>&1
	crc=$?
	wait $spid; src=$?
}

# 1. unmodified programs between the hosts
for cmd in "ibv_rc_pingpong -g 0 -c -n 300" "ibv_uc_pingpong -g 0 -n 300" \
	   "ibv_ud_pingpong -g 0 -s 512 -n 300"; do
	command -v ${cmd%% *} >/dev/null || { skp "$cmd" "not installed"; continue; }
	pair 60 $cmd
	if [ $crc = 0 ] && [ $src = 0 ] && grep -q "300 iters in" "$tmp/c"; then ok "$cmd"
	else bad "$cmd" "client $crc server $src: $(tail -2 "$tmp/c" | tr '\n' ' ')"; fi
done
for cmd in "ib_write_bw -F -n 300" "ib_read_bw -F -n 300" "ib_send_bw -F -n 300" \
	   "ib_write_lat -F -n 300" "ib_read_lat -F -n 300" "ib_atomic_lat -F -n 300" \
	   "ib_send_lat -F -n 300 -c UD" "ib_write_bw -F -n 300 -c UC" \
	   "ib_write_bw -F -n 100 -c UC -s 1048576"; do
	command -v ${cmd%% *} >/dev/null || { skp "$cmd" "perftest not installed"; continue; }
	pair 60 $cmd
	if [ $crc = 0 ] && [ $src = 0 ] &&
	   awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ {for (i = 3; i <= NF; i++) if ($i + 0 > 0) g++} END {exit !g}' "$tmp/c"; then
		ok "$cmd"
	else bad "$cmd" "client $crc server $src"; fi
done

# 2. large transfers, exactly once and byte exact, under injected faults
xfer_pair() {
	name=$1; shift
	ip netns exec $H1 $RUN ${SRV_ENV:-} timeout 600 "$XFER" server 7100 >"$tmp/s" 2>&1 &
	spid=$!
	ip netns exec $H2 $RUN ${CLI_ENV:-} timeout 600 "$XFER" client ${XHOST:-$IP1} 7100 "$@" >"$tmp/c" 2>&1
	crc=$?
	wait $spid
	cat "$tmp/c" | sed 's/^/    /'
	if [ $crc = 0 ] && [ "$(grep -c '^ok ' "$tmp/c")" -ge 4 ]; then ok "$name"
	else bad "$name" "exit $crc"; fi
}
F="loss=5,dup=1,reorder=1,corrupt=1,delay=1,delay_us=300"
SRV_ENV="URSA_FAULT=$F,seed=11" CLI_ENV="URSA_FAULT=$F,seed=12" \
	xfer_pair "RC $MIB MiB WRITE/READ/SEND and atomics under 5% loss, 1% dup, reorder, corruption, delay" "$MIB"

# 1b. pipelined SENDs into a receiver that posts one receive at a time,
# 5 ms after each completion: RNR NAKs in the stream, every SEND once, in
# order
SRV_ENV="XFER_RECV_AHEAD=1 XFER_RECV_DELAY_US=5000" CLI_ENV= \
	xfer_pair "RC $((MIB / 8)) MiB into late receives (RNR NAKs)" "$((MIB / 8))"
if sed -n 's/^counters: //p' "$tmp/c" | grep -q 'NAKs sent [0-9]* received [1-9]'; then
	ok "  RNR NAKs were received"
else
	bad "  RNR NAKs were received" "$(grep '^counters' "$tmp/c")"
fi

# 1c. a refused WRITE in the middle of a pipelined run: those before it
# succeed, it fails with REM_ACCESS_ERR, those after it are flushed, in
# order (the NAK reaches a message sent behind others); then the same with
# fetch-and-adds
refused_middle() { # PORT FLAG WHAT
	ip netns exec $H1 $RUN timeout 60 "$XFER" server $1 >"$tmp/s" 2>&1 &
	spid=$!
	ip netns exec $H2 $RUN timeout 60 "$XFER" client $IP1 $1 1 $2 >"$tmp/c" 2>&1
	crc=$?
	wait $spid
	sed 's/^/    /' "$tmp/c"
	if [ $crc = 0 ] && grep -q "^ok ${3}s before" "$tmp/c"; then
		ok "a refused $3 among pipelined ones: completions in order"
	else
		bad "a refused $3 among pipelined ones" "exit $crc"
	fi
}
refused_middle 7250 --bad-middle WRITE
refused_middle 7251 --bad-middle-atomic atomic

# 1d. a WRITE into registered memory the server unmapped (and mapped anew):
# refused by the watched MR; with the server's URSA_UFFD=0, into the hole,
# by the responder's fault guard; the server lives (design.md, "Memory
# unmapped under an MR")
unmapped_write() { # PORT FLAG SERVER_ENV
	ip netns exec $H1 $RUN $3 timeout 60 "$XFER" server $1 >"$tmp/s" 2>&1 &
	spid=$!
	ip netns exec $H2 $RUN timeout 60 "$XFER" client $IP1 $1 1 $2 >"$tmp/c" 2>&1
	crc=$?
	wait $spid
	src=$?
	sed 's/^/    /' "$tmp/c"
	if [ $crc = 0 ] && [ $src = 0 ] && grep -q "^ok WRITE into" "$tmp/c"; then
		ok "WRITE into unmapped registered memory ($2${3:+, $3}): refused, server alive"
	else
		bad "WRITE into unmapped registered memory ($2${3:+, $3})" "client $crc, server $src"
	fi
}
unmapped_write 7252 --unmapped ""
unmapped_write 7253 --hole URSA_UFFD=0

# 2a. over IPv6: RoCEv2 GIDs that are IPv6 addresses
XHOST=$IP61 SRV_ENV= CLI_ENV= xfer_pair "RC $((MIB / 8)) MiB over IPv6" "$((MIB / 8))"

# 2b. segmentation offload: by default runs of packets leave as one GSO
# send and arrive whole (UDP_GRO). A receiver without GRO gets them cut
# apart, segment k with IPv4 ID k: their fixed-up ICRCs must be accepted
# (no ICRC drop, packets seen with an ID). And without GSO at all.
gso_check() { # name, then what the client's counters must show (awk)
	if grep -q '^counters' "$tmp/c" && sed -n 's/^counters: //p' "$tmp/c" | awk "$2 {ok = 1} END {exit !ok}"
	then ok "$1"; else bad "$1" "$(grep '^counters' "$tmp/c")"; fi
}
# (fields, +0 drops a trailing comma: $15 ICRC drops, $36 runs sent, $39 runs received whole, $45 IDs)
XHOST= SRV_ENV= CLI_ENV= xfer_pair "RC $((MIB / 8)) MiB, GSO and GRO" "$((MIB / 8))"
gso_check "  GSO runs sent and received whole, no ICRC drop" '$15+0 == 0 && $36+0 > 0 && $39+0 > 0'
SRV_ENV= CLI_ENV=URSA_GRO=0 xfer_pair "RC $((MIB / 8)) MiB, receiver without GRO" "$((MIB / 8))"
gso_check "  cut-apart segments accepted by their IPv4 ID, no ICRC drop" '$15+0 == 0 && $39+0 == 0 && $45+0 > 0'
SRV_ENV=URSA_GSO=0 CLI_ENV=URSA_GSO=0 xfer_pair "RC $((MIB / 8)) MiB, URSA_GSO=0" "$((MIB / 8))"
gso_check "  no GSO runs, no ID but 0" '$15+0 == 0 && $36+0 == 0 && $39+0 == 0 && $45+0 == 0'

# 2c. the delayed ACK: it leaves with the next packet of a ping-pong,
# backs off when it goes alone, and leaves when a process exits without
# destroying its QP (held 500 us there, so that nothing else sends it)
ip netns exec $H1 $RUN URSA_ACK_DELAY_US=500 timeout 120 "$XFER" server 7200 >"$tmp/s" 2>&1 &
spid=$!
ip netns exec $H2 $RUN timeout 120 "$XFER" client $IP1 7200 1 --acks >"$tmp/c" 2>&1
crc=$?
wait $spid
sed 's/^/    /' "$tmp/c"
if [ $crc = 0 ] && [ "$(grep -c '^ok ' "$tmp/c")" = 4 ]; then ok "delayed ACKs: along, backed off, in completion order, sent at exit"
else bad "delayed ACKs" "exit $crc"; fi

# 2b. two processes on each host at once: they share the RoCEv2 port
ip netns exec $H1 $RUN timeout 300 "$XFER" server 7300 >"$tmp/s1" 2>&1 &
s1=$!
ip netns exec $H1 $RUN timeout 300 "$XFER" server 7301 >"$tmp/s2" 2>&1 &
s2=$!
ip netns exec $H2 $RUN timeout 300 "$XFER" client $IP1 7300 32 >"$tmp/c1" 2>&1 &
c1=$!
ip netns exec $H2 $RUN timeout 300 "$XFER" client $IP1 7301 32 >"$tmp/c2" 2>&1
r2=$?
wait $c1; r1=$?
wait $s1 $s2
sed 's/^/    1: /' "$tmp/c1"; sed 's/^/    2: /' "$tmp/c2"
if [ $r1 = 0 ] && [ $r2 = 0 ] && [ "$(grep -c '^ok ' "$tmp/c1")" -ge 4 ] &&
   [ "$(grep -c '^ok ' "$tmp/c2")" -ge 4 ]; then
	ok "two processes per host at once"
else
	bad "two processes per host at once" "exit $r1 / $r2"
fi
# Each QP's flow reaches its owner directly once the QP has heard from its
# peer (a connected receive socket beats the reuseport group): of the
# packets the two clients received, at most 1% were forwarded between them
# (it was about half when every flow went through the group).
fw=$(cat "$tmp/c1" "$tmp/c2" | sed -n 's/.* rx \([0-9]*\) packets.*forwarded \([0-9]*\).*/\1 \2/p' |
	awk '{rx += $1; fw += $2} END {if (rx) printf "%d %d", fw, rx}')
if [ -n "$fw" ] && [ "${fw% *}" -le $((${fw#* } / 100)) ]; then
	ok "flows reach their owner directly: ${fw% *} of ${fw#* } packets forwarded"
else
	bad "flows reach their owner directly" "forwarded/received: ${fw:-no counters}"
fi

# 3. loss made outside ursa, on the router (iptables statistic match)
if ip netns exec $R iptables -A FORWARD -p udp --dport 4791 -m statistic \
	--mode random --probability 0.05 -j DROP 2>/dev/null; then
	SRV_ENV= CLI_ENV= xfer_pair "RC $MIB MiB under 5% loss on the router" "$MIB"
	ip netns exec $R iptables -F FORWARD
else
	skp "router loss" "iptables not available"
fi

# 3b. the same on a path that is a wire (issue 23): segmentation before
# every veth end (a NIC sends MTU-sized frames; a veth otherwise passes
# 64 KB GSO datagrams whole, and one drop then loses 40 packets at once)
# and GRO at the receivers; 1% and 5% random loss on the router; QPs with
# retry_cnt 3 and timeout 14 must complete every WRITE, READ, SEND and
# atomic byte-exact, with no RETRY_EXC_ERR
offloads() { # on|off
	m=$1
	for e in "$H1 v1h" "$H2 v2h" "$R v1r" "$R v2r"; do
		set -- $e
		ip netns exec $1 ethtool -K $2 tx-udp-segmentation $m tso $m gso $m \
			>/dev/null 2>&1 || return 1
	done
}
# 3c. ECN: the router marks 2% of the ECN-capable RoCEv2 packets toward
# h1 Congestion Experienced, as a marking queue would (this kernel may
# have no RED qdisc; iptables' TOS target sets the mark), and drops
# none. The client's WRITEs and SENDs arrive marked, the server answers
# with CNPs, the client halves its window on them; everything arrives
# byte-exact. With URSA_ECN=0 packets leave not ECN-capable: the router
# must not mark them (RFC 3168) and no CNP flows.
ecn_marks() { # packets the marking rule took
	ip netns exec $R iptables -t mangle -L FORWARD -v -n -x 2>/dev/null |
		awk '/TOS/ {print $1; exit}'
}
ecn_check() {
	if ! ip netns exec $R iptables -t mangle -A FORWARD -p udp --dport 4791 \
		-d $IP1 -m ecn --ecn-ip-ect 2 -m statistic --mode random \
		--probability 0.02 -j TOS --set-tos 0x03/0x03 2>/dev/null; then
		skp "ECN" "iptables cannot mark packets (ecn match, TOS target)"
		return
	fi
	SRV_ENV="XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" CLI_ENV="XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" \
		xfer_pair "RC 16 MiB through a router that marks ECN" 16
	marked=$(ecn_marks)
	cnps=$(sed -n 's/.*CNPs received \([0-9]*\) window cuts \([0-9]*\).*/\1 \2/p' "$tmp/c")
	if [ "${marked:-0}" -gt 0 ] && [ "${cnps%% *}" -gt 0 ] 2>/dev/null &&
	   [ "${cnps##* }" -gt 0 ]; then
		ok "  the router marked $marked packets; the client got ${cnps% *} CNPs and cut its window ${cnps#* } times"
	else
		bad "  marks answered with CNPs" "router marked ${marked:-?}, client's CNPs and cuts: ${cnps:-?}"
	fi
	ip netns exec $R iptables -t mangle -Z FORWARD
	SRV_ENV="URSA_ECN=0" CLI_ENV="URSA_ECN=0" \
		xfer_pair "RC 4 MiB with URSA_ECN=0 through the same router" 4
	marked=$(ecn_marks)
	cnps=$(sed -n 's/.*CNPs received \([0-9]*\) window cuts.*/\1/p' "$tmp/c")
	if [ "${marked:-1}" = 0 ] && [ "${cnps:-1}" = 0 ]; then
		ok "  URSA_ECN=0: packets not ECN-capable, none marked, no CNP"
	else
		bad "  URSA_ECN=0" "router marked ${marked:-?}, client's CNPs ${cnps:-?}"
	fi
	ip netns exec $R iptables -t mangle -F FORWARD
}
# Selective repeat (engine/rc_sr.c) under loss: the client's counters
# show SACKs received and packets resent alone (want 1), or none at all
# (want 0: the responder goes back as IBTA's go-back-N does).
sr_check() { # LOSS WANT
	sr=$(sed -n 's/.*SACKs received \([0-9]*\), resent alone \([0-9]*\).*/\1 \2/p' "$tmp/c")
	lc=$(sed -n 's/.*losses cutting the window \([0-9]*\) keeping it \([0-9]*\).*/\1 \2/p' "$tmp/c")
	if [ "$2" = 1 ] && [ "${sr%% *}" -gt 0 ] 2>/dev/null && [ "${sr##* }" -gt 0 ]; then
		ok "  selective repeat: ${sr%% *} SACKs, ${sr##* } packets resent alone"
		# random loss with no queue on the path: taken as the path's
		# own, the window kept (rc_sr.c loss_response)
		if [ "${lc##* }" -gt 0 ] 2>/dev/null; then
			ok "  losses with no queue kept the window ${lc##* } times (cut it ${lc%% *})"
		else
			bad "  random loss keeps the window" "cut, kept: ${lc:-?}"
		fi
	elif [ "$2" = 0 ] && [ "$sr" = "0 0" ]; then
		ok "  no SACK from a responder that does not hold packets"
	else
		bad "  selective repeat under $1 loss" "SACKs, resent: ${sr:-?} (want $2)"
	fi
}
# Wide packets between ursa peers (proto/roce.h ROCE_BTH4_WIDE_SHIFT): on
# these 1500-byte links 1 MiB WRITEs and READs move in packets of 1408
# payload bytes where the path MTU (1024) would cut them; not with a
# responder that does not set the SR bit (URSA_SR=0, as rxe or a NIC),
# nor with URSA_WIDE=0. The requester's URSA_STATS line
# gives the RoCEv2 bytes and packets it sent (WRITE) or received (READ):
# less the BTH and ICRC of each, the payload per packet.
# per_packet OP: the payload bytes a data packet carried on the client
per_packet() {
	sed -n 's/.* RoCEv2: tx \([0-9]*\) pkts \([0-9]*\) B, rx \([0-9]*\) pkts \([0-9]*\) B,.*/\1 \2 \3 \4/p' "$tmp/c" |
		awk -v op=$1 'NR == 1 { n = op == "read" ? $3 : $1; b = op == "read" ? $4 : $2
			if (n > 0) printf "%d", b / n - 16 }'
}
wide_check() { # WHAT OP SERVER_ENV WIDE(1|0)
	SRV_ENV="$3" CLI_ENV="URSA_STATS=1" pair 60 ib_$2_bw -F -s 1048576 -n 100
	per=$(per_packet $2)
	if [ $crc != 0 ] || [ $src != 0 ] || [ "${per:-0}" -le 0 ]; then
		bad "$1" "client $crc server $src: $(grep -m1 'RoCEv2: tx' "$tmp/c")"
	elif { [ "$4" = 1 ] && [ "$per" -gt 1100 ]; } ||
	     { [ "$4" = 0 ] && [ "$per" -le 1040 ]; }; then
		ok "$1: $per payload bytes a packet"
	else
		bad "$1" "$per payload bytes a packet"
	fi
}
if command -v ethtool >/dev/null && offloads off; then
	ip netns exec $H1 ethtool -K v1h gro on >/dev/null 2>&1
	ip netns exec $H2 ethtool -K v2h gro on >/dev/null 2>&1
	if command -v ib_write_bw >/dev/null; then
		wide_check "1 MiB WRITEs between ursa peers in wide packets" write "" 1
		wide_check "  to a responder without the SR bit: the path MTU" write URSA_SR=0 0
		wide_check "  with URSA_WIDE=0 on the responder: the path MTU" write URSA_WIDE=0 0
		wide_check "1 MiB READs between ursa peers in wide packets" read "" 1
		wide_check "  from a responder without the SR bit: the path MTU" read URSA_SR=0 0
		# the router's link to the responder narrower (1200) than both
		# hosts' links: the router's ICMP tells the sender's kernel,
		# which refuses the GSO runs of wide packets; they go again
		# packet by packet, fragmented, and messages started after
		# are cut to fit (1088 bytes). Before, the QP resent them
		# until it failed. A second run, on a path the kernel knows
		# from the start, cuts nearly every message to fit.
		ip -n $R link set v1r mtu 1200
		CLI_ENV="URSA_STATS=1" pair 60 ib_write_bw -F -s 1048576 -n 100
		runs=$(sed -n 's/.*over the path MTU: runs \([0-9]*\).*/\1/p' "$tmp/c" | head -1)
		if [ $crc = 0 ] && [ $src = 0 ] && [ "${runs:-0}" -gt 0 ]; then
			ok "1 MiB WRITEs through a narrower router link: $runs runs over its MTU sent fragmented"
		else
			bad "1 MiB WRITEs through a narrower router link" "client $crc server $src, runs ${runs:-?}: $(grep -m1 'RoCEv2: tx' "$tmp/c" | cut -c1-160)"
		fi
		CLI_ENV="URSA_STATS=1" pair 60 ib_write_bw -F -s 1048576 -n 100
		per=$(per_packet write)
		if [ $crc = 0 ] && [ $src = 0 ] &&
		   [ "${per:-0}" -gt 1040 ] && [ "${per:-0}" -le 1110 ]; then
			ok "  again, the path MTU known: $per payload bytes a packet"
		else
			bad "  again, the path MTU known" "client $crc server $src, $per bytes a packet"
		fi
		ip -n $R link set v1r mtu 1500
		ip -n $H2 route flush cache	# (the learned MTU)
	else
		skp "wide packets" "perftest not installed"
	fi
	for p in 0.01 0.05; do
		ip netns exec $R iptables -A FORWARD -p udp --dport 4791 -m statistic \
			--mode random --probability $p -j DROP 2>/dev/null || break
		SRV_ENV="XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" CLI_ENV="XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" \
			xfer_pair "RC 16 MiB, segmented path, $p loss on the router, retry_cnt 3 timeout 14" 16
		sr_check "$p" 1
		ip netns exec $R iptables -F FORWARD
	done
	# a responder that does not hold packets (URSA_SR=0, as rxe or a
	# NIC): plain NAKs, the requester goes back, nothing is lost
	ip netns exec $R iptables -A FORWARD -p udp --dport 4791 -m statistic \
		--mode random --probability 0.05 -j DROP 2>/dev/null &&
	SRV_ENV="URSA_SR=0 XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" CLI_ENV="XFER_RETRY_CNT=3 XFER_QP_TIMEOUT=14" \
		xfer_pair "RC 4 MiB, 0.05 loss, a responder with URSA_SR=0 (go-back-N)" 4 &&
	sr_check 0.05 0
	ip netns exec $R iptables -F FORWARD
	ecn_check
	offloads on
else
	skp "segmented path" "ethtool cannot turn the veths' offloads off"
fi

# 4. a cut link ends in RETRY_EXC_ERR within the bound of timeout 10
#    (4.2 ms) and retry_cnt 3: about 17 ms, allow scheduling slack
ip netns exec $H1 $RUN timeout 60 "$XFER" server 7200 >"$tmp/s" 2>&1 &
spid=$!
ip netns exec $H2 $RUN timeout 60 "$XFER" client $IP1 7200 1 --cut-check >"$tmp/c" 2>&1 &
cpid=$!
for i in $(seq 1 100); do grep -q "before cut" "$tmp/c" && break; sleep 0.1; done
ip -n $R link set v1r down
wait $cpid; crc=$?
kill $spid 2>/dev/null; wait $spid 2>/dev/null
ip -n $R link set v1r up
secs=$(sed -n 's/.*in \([0-9.]*\) s$/\1/p' "$tmp/c")
if [ $crc = 0 ] && grep -q "after cut: transport retry counter exceeded" "$tmp/c" &&
   awk -v s="$secs" 'BEGIN {exit !(s != "" && s >= 0.015 && s < 1.0)}'; then
	ok "cut link: RETRY_EXC_ERR after $secs s"
else
	bad "cut link" "$(cat "$tmp/c" | tr '\n' ' ')"
fi

# 5. the capture decodes as InfiniBand with no malformed frame
if command -v tshark >/dev/null; then
	CLI_ENV="URSA_PCAP=$tmp/cap.pcap" SRV_ENV= xfer_pair "traffic for the capture" 2
	n=$(tshark -r "$tmp/cap.pcap" -d udp.port==4791,infiniband --disable-protocol rpcordma \
		-Y infiniband 2>/dev/null | wc -l)
	m=$(tshark -r "$tmp/cap.pcap" -d udp.port==4791,infiniband --disable-protocol rpcordma \
		-Y _ws.malformed 2>/dev/null | wc -l)
	ops=$(tshark -r "$tmp/cap.pcap" -d udp.port==4791,infiniband --disable-protocol rpcordma \
		-T fields -e infiniband.bth.opcode 2>/dev/null | sort -u | tr '\n' ' ')
	if [ "$n" -gt 1000 ] && [ "$m" = 0 ]; then
		ok "tshark: $n InfiniBand frames, 0 malformed, opcodes: $ops"
	else
		bad tshark "$n frames, $m malformed"
	fi
else
	skp tshark "not installed"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
