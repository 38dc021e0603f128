#!/bin/sh
# mpi.sh - MPI over ursa next to what an MPI user would run instead, in
# the same run: 8 B latency (one way) and 1 MiB bandwidth between two
# ranks of Open MPI (tests/mpi/mpi_check.c lat / bw). Reports; asserts
# nothing.
#   bench/mpi.sh [--quick] [BUILD] [CSV]
# One host: ursa (pml ucx over ursa0:1, no UCX shared memory) against
# Open MPI's own shared memory (pml ob1, btl vader) and UCX's (pml ucx,
# UCX_TLS=shm). Between two network-namespace hosts (root; not in the
# quick run): ursa's RoCEv2 against UCX over TCP. Each figure is the
# median of three runs (one in the quick run), the stacks taking turns.
# With ethtool, the hosts' veth ends segment and checksum in software
# (tso, gso, tx-udp-segmentation off), as a wire delivers packets of at
# most one MTU; without it the path carries 64 KB datagrams and says so.
# CSV rows: where,stack,test,bytes,value (us one way | MB/s, 10^6 bytes).
QUICK=
BUILD=build
CSV=
for a in "$@"; do
	case "$a" in
	--quick) QUICK=1;;
	*.csv) CSV=$a;;
	*) BUILD=$a;;
	esac
done
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CSV=${CSV:-$tmp/mpi.csv}
echo "where,stack,test,bytes,value" >"$CSV"
if ! command -v mpicc.openmpi >/dev/null || ! command -v mpirun.openmpi >/dev/null; then
	echo "Open MPI not installed (apt-get install openmpi-bin libopenmpi-dev)"; exit 0
fi
mpicc.openmpi -O2 -o "$tmp/mpi" "$SRC/tests/mpi/mpi_check.c" || exit 1
if [ -n "$QUICK" ]; then RUNS=1; LAT_N=2000; BW_N=200; else RUNS=3; LAT_N=20000; BW_N=2000; fi
med() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'; }

BASE="--allow-run-as-root --oversubscribe -np 2"
# stack name -> the prefix and mpirun arguments that select it
args() {
	case $1 in
	ursa) echo "$URSA run -- | --mca pml ucx --mca osc ucx --mca btl self -x UCX_NET_DEVICES=ursa0:1 -x UCX_TLS=^shm,cma";;
	vader) echo " | --mca pml ob1 --mca btl self,vader";;
	ucx_shm) echo " | --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self -x UCX_TLS=shm,self";;
	ucx_tcp) echo " | --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self -x UCX_TLS=tcp,self";;
	esac
}
# one WHERE STACK TEST SIZE ITERS [PREFIX_CMD] [MPIRUN_EXTRA]: the figure
one() {
	a=$(args $2); pre=${a%%|*}; opt=${a#*|}
	# shellcheck disable=SC2086
	$6 env PMIX_MCA_gds=hash $pre timeout 120 mpirun.openmpi $BASE $opt $7 \
		"$tmp/mpi" $3 $4 $5 2>"$tmp/err" | awk -v t=$3 '$1 == t {print $3}'
}
measure() { # WHERE "STACKS" [PREFIX_CMD] [MPIRUN_EXTRA]
	for t in "lat 8 $LAT_N" "bw 1048576 $BW_N"; do
		set -- "$1" "$2" "$3" "$4" $t
		for s in $2; do eval "v_$s=''"; done
		for _ in $(seq $RUNS); do
			for s in $2; do
				v=$(one "$1" $s $5 $6 $7 "$3" "$4")
				[ -z "$v" ] && echo "    $1 $s $5: no figure: $(tail -n 2 "$tmp/err" | tr '\n' ' ')" >&2
				eval "v_$s=\"\$v_$s $v\""
			done
		done
		for s in $2; do
			m=$(eval "med \$v_$s")
			[ -n "$m" ] && echo "$1,$s,$5,$6,$m" >>"$CSV"
			printf '%-9s %-8s %-3s %8s B: %s (runs:%s)\n' "$1" $s $5 $6 "${m:-none}" "$(eval "echo \$v_$s")"
		done
	done
}

echo "one host, 2 ranks of Open MPI $(mpirun.openmpi --version 2>/dev/null | head -1 | awk '{print $NF}')"
measure one_host "ursa vader ucx_shm"

if [ -z "$QUICK" ] && [ "$(id -u)" = 0 ]; then
	. "$SRC/tests/scripts/netns.inc"
	trap 'netns_down; rm -rf "$tmp" /etc/netns/$H1 /etc/netns/$H2' EXIT
	# Names resolve from files alone (no name server to wait for).
	for n in $H1 $H2; do
		mkdir -p /etc/netns/$n
		printf '127.0.0.1 localhost %s\n%s h1\n%s h2\n' "$(hostname)" $IP1 $IP2 >/etc/netns/$n/hosts
		echo "# no name server on the bench hosts" >/etc/netns/$n/resolv.conf
	done
	netns_up || { echo "cannot create namespaces"; exit 1; }
	path="veth with offloads (64 KB datagrams cross unsegmented: not a wire)"
	if command -v ethtool >/dev/null; then
		for e in "$H1 v1h" "$H2 v2h" "$R v1r" "$R v2r"; do
			set -- $e
			ip netns exec $1 ethtool -K $2 tso off gso off tx-udp-segmentation off >/dev/null 2>&1
		done
		path="veth, segmentation in software before the link (packets of one MTU, GRO at the receiver)"
	fi
	cat >"$tmp/nsrsh" <<EOF
#!/bin/sh
case \$1 in h1) ns=$H1;; h2) ns=$H2;; *) exit 1;; esac
shift
exec ip netns exec \$ns sh -c "\$*"
EOF
	chmod +x "$tmp/nsrsh"
	echo "two hosts (network namespaces through a router; $path), 1 rank each"
	# --bind-to none: each namespace host believes it has both cores and
	# would bind its rank to core 0, both ranks then spinning on one core
	# (a 4 ms scheduler tick per message).
	measure two_hosts "ursa ucx_tcp" "ip netns exec $H1" \
		"--mca plm_rsh_agent $tmp/nsrsh --host h1:1,h2:1 --map-by node --bind-to none"
elif [ -z "$QUICK" ]; then
	echo "two hosts: needs root for network namespaces"
fi
