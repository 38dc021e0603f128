#!/bin/sh
# wire.sh - RoCEv2 between two namespaces on a path that is a wire: every
# veth end segments in software (a NIC sends frames of one MTU; a veth
# otherwise passes 64 KB GSO datagrams whole) and the receivers run GRO.
# Next to independent peers on the same path, in the same run: iperf3
# (TCP stream) and sockperf (UDP ping-pong). Clean, then with 1% and 5%
# random loss on the router (every packet, both ways: TCP loses as much),
# then two flows, ursa's WRITEs and a TCP stream, through one 200 Mbit/s
# bottleneck (and, as the control, two TCP streams through the same
# queue: what a fair share looks like on this path), and the CPU time
# each side spends per GiB. Needs root,
# ethtool, iperf3 and sockperf. Reports; asserts nothing.
#   bench/wire.sh [BUILD] [CSV]
# CSV rows: what,loss,ursa,peer (MB/s: 10^6 bytes | us one way | s/GiB).
BUILD=${1:-build}
CSV=${2:-}
LIB="$(cd "$BUILD/lib" && pwd)"
E="env LD_LIBRARY_PATH=$LIB"
for p in ethtool iperf3 sockperf ib_write_bw; do
	command -v $p >/dev/null || { echo "wire.sh: $p not installed"; exit 1; }
done
tmp=$(mktemp -d)
. "$(dirname "$0")/../tests/scripts/netns.inc"
trap 'netns_down; rm -rf "$tmp"' EXIT
netns_up || { echo "cannot create namespaces (root needed)"; exit 1; }
for e in "$H1 v1h" "$H2 v2h" "$R v1r" "$R v2r"; do
	set -- $e
	ip netns exec $1 ethtool -K $2 tx-udp-segmentation off tso off gso off \
		>/dev/null 2>&1 || { echo "wire.sh: ethtool -K failed"; exit 1; }
done
ip netns exec $H1 ethtool -K v1h gro on >/dev/null 2>&1
ip netns exec $H2 ethtool -K v2h gro on >/dev/null 2>&1
[ -n "$CSV" ] && echo "what,loss,ursa,peer" >"$CSV"
MIB=1.048576	# perftest's MB/sec is 2^20 bytes a second
SECS=4
FAIR=30	# seconds the two flows share the queue (in 10 s two TCP
	# streams ended anywhere between 0.07x and 14x each other's share:
	# who filled the queue first kept it; in 30 s they converge)

loss() { # PROBABILITY (0: none) on every forwarded packet
	ip netns exec $R iptables -F FORWARD
	[ "$1" = 0 ] || ip netns exec $R iptables -A FORWARD -m statistic \
		--mode random --probability $1 -j DROP
}
tcp_mbps() { # iperf3 h2 -> h1 for SECS; MB/s the receiver got
	ip netns exec $H1 iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
	sleep 0.3
	ip netns exec $H2 iperf3 -c $IP1 -p 5201 -t ${1:-$SECS} -f m 2>/dev/null |
		awk '/receiver/ {for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i / 8} END {printf "%.1f", v}'
	wait
}
perf() { # perftest h2 -> h1; the client's result row
	ip netns exec $H1 $E timeout 300 "$@" -F >/dev/null 2>&1 &
	sleep 0.5
	ip netns exec $H2 $E timeout 300 "$@" -F $IP1 2>/dev/null |
		awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/' | tail -1
	wait
}
ursa_mbps() { # ib_OP_bw 1 MiB, N messages
	perf ib_$1_bw -s 1048576 -n $2 | awk -v m=$MIB '{printf "%.1f", $4 * m}'
}
row() { # WHAT LOSS URSA PEER UNIT
	awk -v w="$1" -v l="$2" -v a="$3" -v b="$4" -v u="$5" 'BEGIN {
		printf "  %-26s %5s %10.1f %10.1f %-5s %6.2fx\n", w, l, a, b, u, (b > 0 ? a / b : 0) }'
	[ -n "$CSV" ] && echo "$1,$2,$3,$4" >>"$CSV"
}

echo "ursa RoCEv2 on a segmented path (two namespaces behind a router, veth MTU 1500,"
echo "segmentation in software before every link, GRO at the receivers)"
echo
echo "bandwidth, 1 MiB messages    loss       ursa       peer       ursa / peer"
for l in 0 0.01 0.05; do
	loss $l
	n=$([ $l = 0 ] && echo 1000 || echo 200)
	t=$(tcp_mbps)
	for op in write read send; do
		row "$op (peer: iperf3)" $l "$(ursa_mbps $op $n)" "$t" MB/s
	done
done
loss 0

echo
echo "latency, one way, 64 B       loss       ursa       peer"
ip netns exec $H1 sockperf server -i $IP1 -p 11111 >/dev/null 2>&1 & sp=$!
sleep 0.3
s=$(ip netns exec $H2 sockperf ping-pong -i $IP1 -p 11111 -m 64 -t 3 2>/dev/null |
	awk '/percentile 50.000/ {print $NF}')
kill $sp 2>/dev/null; wait $sp 2>/dev/null
w=$(perf ib_write_lat -s 64 -n 5000 | awk '{print $5}')
row "write median (sockperf p50)" 0 "${w:-0}" "${s:-0}" us
# (sockperf's ping-pong stalls on a lost datagram: no peer under loss)
loss 0.01
w=$(perf ib_write_lat -s 64 -n 5000 | awk '{print $5}')
echo "  write median, 1% loss: ${w:-?} us (no peer: sockperf stalls on a lost datagram)"
[ -n "$CSV" ] && echo "write_lat_us,0.01,${w:-0}," >>"$CSV"
loss 0
echo
echo "two flows through one 200 Mbit/s (25 MB/s) queue, at once, $FAIR s"
ip netns exec $R tc qdisc add dev v1r root tbf rate 200mbit burst 64kb latency 20ms
ip netns exec $H1 iperf3 -s -1 -p 5202 >/dev/null 2>&1 &
ip netns exec $H1 $E timeout 300 ib_write_bw -F -s 65536 -D $FAIR >/dev/null 2>&1 &
sleep 0.5
ip netns exec $H2 iperf3 -c $IP1 -p 5202 -t $FAIR -f m >"$tmp/iperf" 2>&1 &
ip netns exec $H2 $E timeout 300 ib_write_bw -F -s 65536 -D $FAIR $IP1 >"$tmp/ib" 2>&1
wait
tb=$(awk '/receiver/ {for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i / 8} END {printf "%.1f", v}' "$tmp/iperf")
ub=$(awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ {v = $4} END {printf "%.1f", v * 1.048576}' "$tmp/ib")
echo "  ursa WRITE 64 KiB $ub MB/s, iperf3 $tb MB/s: ursa has $(awk -v a="$ub" -v b="$tb" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')x TCP's share"
[ -n "$CSV" ] && echo "share,0,$ub,$tb" >>"$CSV"
# the control: two TCP streams through the same queue
ip netns exec $H1 iperf3 -s -1 -p 5204 >/dev/null 2>&1 &
ip netns exec $H1 iperf3 -s -1 -p 5205 >/dev/null 2>&1 &
sleep 0.3
ip netns exec $H2 iperf3 -c $IP1 -p 5204 -t $FAIR -f m >"$tmp/tcp1" 2>&1 &
ip netns exec $H2 iperf3 -c $IP1 -p 5205 -t $FAIR -f m >"$tmp/tcp2" 2>&1
wait
t1=$(awk '/receiver/ {for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i / 8} END {printf "%.1f", v}' "$tmp/tcp1")
t2=$(awk '/receiver/ {for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i / 8} END {printf "%.1f", v}' "$tmp/tcp2")
ip netns exec $R tc qdisc del dev v1r root
echo "  control: two iperf3 streams $t1 and $t2 MB/s: $(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')x"
[ -n "$CSV" ] && echo "share_tcp_tcp,0,$t1,$t2" >>"$CSV"

echo
echo "CPU seconds per GiB moved (user + system, both sides), 1 MiB, clean"
ip netns exec $H1 /usr/bin/time -f "%U %S" -o "$tmp/us" $E ib_write_bw -F -s 1048576 -n 2000 >/dev/null 2>&1 &
sleep 0.5
ip netns exec $H2 /usr/bin/time -f "%U %S" -o "$tmp/uc" $E ib_write_bw -F -s 1048576 -n 2000 $IP1 >/dev/null 2>&1
wait
ip netns exec $H1 /usr/bin/time -f "%U %S" -o "$tmp/ts" iperf3 -s -1 -p 5203 >/dev/null 2>&1 &
sleep 0.3
ip netns exec $H2 /usr/bin/time -f "%U %S" -o "$tmp/tc" iperf3 -c $IP1 -p 5203 -n 2000M >/dev/null 2>&1
wait
uc=$(cat "$tmp/us" "$tmp/uc" | awk '{s += $1 + $2} END {printf "%.2f", s / (2000 / 1024)}')
tc=$(cat "$tmp/ts" "$tmp/tc" | awk '{s += $1 + $2} END {printf "%.2f", s / (2000 / 1024)}')
row "write 1 MiB (iperf3)" 0 "$uc" "$tc" s/GiB
