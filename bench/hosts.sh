#!/bin/sh
# hosts.sh - RoCEv2 between two namespaces (behind a router namespace),
# next to the limits of the same path measured in the same run: a raw UDP
# ping-pong and a TCP stream. Needs root. Reports; asserts nothing.
#   bench/hosts.sh [BUILD] [CSV]
# With CSV, also latency of WRITE, SEND, READ and atomics and bandwidth of
# WRITE, READ and SEND from 64 B to 1 MiB (perftest), one row per figure:
#   kind,op,bytes,value (typical us | MB/s),extra (p99 us | Mpps)
BUILD=${1:-build}
CSV=${2:-}
LIB="$(cd "$BUILD/lib" && pwd)"
NP="$(cd "$BUILD/bench" && pwd)/netpeer"
tmp=$(mktemp -d)
. "$(dirname "$0")/../tests/scripts/netns.inc"
trap 'netns_down; rm -rf "$tmp"' EXIT
netns_up || { echo "cannot create namespaces (root needed)"; exit 1; }
E="env LD_LIBRARY_PATH=$LIB"

ip netns exec $H1 "$NP" udp-server 9100 & u=$!
sleep 0.2
udp=$(ip netns exec $H2 "$NP" udp-client $IP1 9100 20000 64)
kill $u

mtu() { # the MTU of the four veth ends; ursa's port follows it (path MTU
	# 1024 at 1500, 4096 at 9000, as rxe does)
	ip -n $H1 link set v1h mtu $1; ip -n $R link set v1r mtu $1
	ip -n $H2 link set v2h mtu $1; ip -n $R link set v2r mtu $1
}
med3() { echo "$@" | tr ' ' '\n' | sort -n | sed -n 2p; }

# perftest's "MB/sec" is 2^20 bytes a second (its message rate times the
# size says so); the TCP figure is 10^6 bytes a second, and so is every
# bandwidth this script prints or writes: perftest's are converted.
MIB=1.048576
perf() { # perftest between the hosts; prints the client's result row
	ip netns exec $H1 $E timeout 120 "$@" -F >/dev/null 2>&1 &
	sleep 0.5
	ip netns exec $H2 $E timeout 120 "$@" -F $IP1 2>/dev/null | awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/' | tail -1
	wait
}
tcp_bw() {
	ip netns exec $H1 "$NP" tcp-server 9101 & sleep 0.2
	ip netns exec $H2 "$NP" tcp-client $IP1 9101 1024 | awk '{print $2}'
	wait
}
# Bandwidth: three runs of each, TCP and WRITE in turn (this VM's speed
# drifts within seconds), the medians compared; at the default MTU, then
# with jumbo frames, as RoCE networks are usually set up.
bw_pair() {
	t=""; w=""
	for i in 1 2 3; do
		t="$t $(tcp_bw)"
		w="$w $(perf ib_write_bw -s 1048576 -n 400 | awk -v m=$MIB '{printf "%.1f", $4 * m}')"
	done
	echo "$(med3 $t) $(med3 $w)"
}
wl=$(perf ib_write_lat -s 64 -n 5000)
sl=$(perf ib_send_lat -s 64 -n 5000)
set -- $(bw_pair); t_bw=$1; w_bw=$2
mtu 9000
set -- $(bw_pair); t_bw9=$1; w_bw9=$2
mtu 1500

u_med=$(echo "$udp" | awk '{print $2}')
w_med=$(echo "$wl" | awk '{print $5}')
s_med=$(echo "$sl" | awk '{print $5}')
echo "ursa RoCEv2 between two namespaces behind a router namespace (veth, MTU 1500)"
echo
echo "latency, one way (us)      median     limit: raw UDP one way   ratio (target <= 1.3)"
awk -v a="$w_med" -v b="$u_med" 'BEGIN {printf "  64 B RC WRITE          %8.2f     %8.2f                  %5.2fx\n", a, b, a / b}'
awk -v a="$s_med" -v b="$u_med" 'BEGIN {printf "  64 B RC SEND           %8.2f     %8.2f                  %5.2fx\n", a, b, a / b}'
echo
echo "bandwidth (MB/s, median of 3)         peer: TCP stream        ratio (target >= 1)"
awk -v a="$w_bw" -v b="$t_bw" 'BEGIN {printf "  1 MiB RC WRITE        %8.1f     %8.1f                  %5.2fx\n", a, b, a / b}'
awk -v a="$w_bw9" -v b="$t_bw9" 'BEGIN {printf "  ... at MTU 9000       %8.1f     %8.1f                  %5.2fx\n", a, b, a / b}'
if [ -n "$CSV" ]; then
	echo "kind,op,bytes,value,extra" >"$CSV"
	echo "limit,udp_oneway_us,64,$u_med," >>"$CSV"
	echo "limit,tcp_MBps,0,$t_bw," >>"$CSV"
	echo "limit,tcp_MBps_mtu9000,0,$t_bw9," >>"$CSV"
	echo "bw_med,write,1048576,$w_bw," >>"$CSV"
	# (the latency pair above, 5000 round trips, next to the UDP one;
	# the "lat" rows below are a sweep of 1000 each)
	echo "lat_pair,write,64,$w_med," >>"$CSV"
	echo "lat_pair,send,64,$s_med," >>"$CSV"
	echo "bw_mtu9000,write,1048576,$w_bw9," >>"$CSV"
	for op in write send read; do
		for sz in 8 64 1024 16384 262144; do
			perf ib_${op}_lat -s $sz -n 1000 | awk -v op=$op '{print "lat," op "," $1 "," $5 "," $8}' >>"$CSV"
		done
	done
	perf ib_atomic_lat -n 1000 | awk '{print "lat,atomic," $1 "," $5 "," $8}' >>"$CSV"
	# (enough messages that the start, the first round trips and the
	# window's growth, does not make the figure: 200 64-byte WRITEs
	# measured a third of the rate of 20 000, and 200 1 MiB WRITEs about
	# half the 1.5-2.0 GB/s of the bandwidth pair above)
	for op in write read send; do
		for sz in 64 1024 16384 262144 1048576; do
			n=$((sz <= 1024 ? 20000 : sz <= 16384 ? 5000 : sz <= 262144 ? 2000 : 1000))
			perf ib_${op}_bw -s $sz -n $n | awk -v op=$op -v m=$MIB '{print "bw," op "," $1 "," $4 * m "," $5}' >>"$CSV"
		done
	done
fi
