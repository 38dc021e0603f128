#!/bin/sh
# frameworks.sh - the RDMA frameworks of Debian 12, unmodified, on ursa:
# the device as they look for it outside libibverbs (/dev, /sys), UCX
# (ucx_info, ucx_perftest over rc_verbs and ud_verbs, UCP), Open MPI and
# MPICH (tests/mpi/mpi_check.c over UCX), libfabric (fi_info,
# fi_pingpong) and pyverbs (tests/py/rc_ops.py and rdma-core's own test
# suite), on one host and between two hosts made of network namespaces.
# Every program is started through `ursa run` as a user would (with a
# sanitizer build: the same variables by hand, the sanitizer's runtime
# first). A part whose Debian package is missing is skipped
# (scripts/deps.sh test installs them). Prints "N passed, N failed,
# N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
pass=0; fail=0; skip=0
tmp=$(mktemp -d)
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
have() { command -v "$1" >/dev/null 2>&1; }
PY=/usr/bin/python3

asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
	RUN="env LD_LIBRARY_PATH=$LIB LD_PRELOAD=$asan:$LIB/libursa-preload.so ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"
else
	RUN="$URSA run --"
fi
# Counters at each QP's end and at exit, on stderr (ursa stats).
export URSA_STATS=1
# Only ursa's device, no shared memory or TCP: what UCX carries, ursa does.
# (MPICH's own shared memory between ranks of a host: MPIR_CVAR_NOLOCAL.)
UCX_ENV="UCX_NET_DEVICES=ursa0:1 UCX_TLS=^shm,cma"

# Bytes ursa moved for the processes whose counters are in file $1: every
# same-host path of every QP, and what went out as RoCEv2.
ursa_bytes() {
	{ sed -n 's/.*bytes by path: loop \([0-9]*\) slots \([0-9]*\) cma \([0-9]*\) direct \([0-9]*\).*/\1 \2 \3 \4/p' "$1"
	  sed -n 's/.*RoCEv2: tx [0-9]* pkts \([0-9]*\) B.*/\1/p' "$1"; } |
		awk '{ for (i = 1; i <= NF; i++) s += $i } END { print s + 0 }'
}
# RoCEv2 packets the processes whose counters are in $1 sent.
roce_pkts() {
	sed -n 's/.*RoCEv2: tx \([0-9]*\) pkts.*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'
}

# ---------------------------------------------------------------- the view
if ! $RUN sh -c 'test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 &&
		 test -w /dev/infiniband/uverbs0' 2>"$tmp/e"; then
	bad "/dev/infiniband/uverbs0 is a read-write character device" "$(cat "$tmp/e")"
else
	ok "/dev/infiniband/uverbs0 is a read-write character device"
fi
out=$($RUN sh -c 'ls /sys/class/infiniband; cat /sys/class/infiniband/ursa0/ports/1/gid_attrs/types/0 \
	/sys/class/infiniband/ursa0/ports/1/gid_attrs/ndevs/0 /sys/class/infiniband_verbs/uverbs0/ibdev \
	/sys/class/infiniband/ursa0/ports/1/state; ls /sys/class/infiniband/ursa0/device/net' 2>&1)
ndev=$(echo "$out" | sed -n 3p)
gid0=$($RUN ibv_devinfo -v 2>/dev/null | sed -n 's/.*GID\[ *0\]:[[:space:]]*\([^,]*\).*/\1/p' | head -1)
sysgid=$($RUN cat /sys/class/infiniband/ursa0/ports/1/gids/0 2>/dev/null)
if [ "$(echo "$out" | sed -n 1p)" = ursa0 ] && [ "$(echo "$out" | sed -n 2p)" = "RoCE v2" ] &&
   [ -e "/sys/class/net/$ndev" ] && [ "$(echo "$out" | sed -n 4p)" = ursa0 ] &&
   [ "$(echo "$out" | sed -n 5p)" = "4: ACTIVE" ] && [ "$(echo "$out" | sed -n 6p)" = "$ndev" ] &&
   [ -n "$sysgid" ]; then
	ok "sysfs: ursa0, RoCE v2 GID 0 on $ndev, uverbs0, port ACTIVE, device/net"
else
	bad "sysfs tree" "$(echo "$out" | tr '\n' '|')"
fi
# the GID in sysfs is the one libibverbs reports
if [ -n "$gid0" ] && $PY -c 'import ipaddress as a, sys
sys.exit(a.ip_address(sys.argv[1]) != a.ip_address(sys.argv[2]))' "$gid0" "$sysgid" 2>/dev/null; then ok "sysfs gids/0 = ibv_devinfo's GID[0] ($gid0)"
else bad "sysfs gids/0 = ibv_devinfo's GID[0]" "'$sysgid' vs '$gid0'"; fi
# without the preload, nothing of it (this machine has no RDMA kernel stack)
if [ ! -e /sys/class/infiniband ] && [ ! -e /dev/infiniband ]; then
	LD_LIBRARY_PATH=$LIB sh -c 'test -e /sys/class/infiniband' &&
		bad "the view comes from the preload" "seen without it" ||
		ok "the view comes from the preload (absent without it)"
fi

# ---------------------------------------------------------------- pairs
# srv_cli SERVER CLIENT: the server command in the background, then the
# client command, retried while the server is not listening yet; sets crc,
# src and the logs $tmp/s, $tmp/c. Each command is word-split.
# The backtrace UCX prints when a program it runs in crashes (its own
# signal handler), from either side's output: a crash's only trace.
crash_bt() {
	grep -h -A14 'Caught signal' "$tmp/c" "$tmp/s" 2>/dev/null | sed 's/^/    /'
}

srv_cli() {
	# shellcheck disable=SC2086
	$1 >"$tmp/s" 2>&1 &
	spid=$!
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.5
		# shellcheck disable=SC2086
		$2 >"$tmp/c" 2>&1; crc=$?
		grep -q -i -E "connection refused|connect.*failed|Failed to connect" "$tmp/c" || break
	done
	wait $spid; src=$?
}

# ---------------------------------------------------------------- UCX
if have ucx_info && have ucx_perftest; then
	$RUN ucx_info -d >"$tmp/d" 2>&1
	if awk '/Transport: rc_verbs/ { t = 1 } /Transport: ud_verbs/ { u = 1 }
		/Device: ursa0:1/ { d++ } END { exit !(t && u && d >= 2) }' "$tmp/d"; then
		ok "ucx_info -d lists ursa0:1 with rc_verbs and ud_verbs"
	else
		bad "ucx_info -d" "$(grep -E 'Transport|Device' "$tmp/d" | tr '\n' ' ')"
	fi
	ucx_tests() { # WHERE SPREFIX CPREFIX ADDR
		where=$1 sp=$2 cp=$3 addr=$4
		for t in "rc_verbs put_lat" "rc_verbs put_bw -D zcopy -s 1048576 -n 200" \
			 "rc_verbs get -D zcopy -s 65536 -n 500" "rc_verbs am_lat" \
			 "rc_verbs am_bw -D bcopy -s 8192" "rc_verbs add_lat" "rc_verbs fadd" \
			 "rc_verbs cswap" "ud_verbs am_lat" "ud_verbs am_bw -D bcopy -s 900"; do
			tl=${t%% *} rest=${t#* }
			test=${rest%% *} opts=${rest#"$test"}
			cmd="timeout 60 ucx_perftest -d ursa0:1 -x $tl -t $test -n 2000 $opts"
			srv_cli "$sp $cmd" "$cp $cmd $addr"
			if [ $crc = 0 ] && [ $src = 0 ] && grep -q "^Final:" "$tmp/c"; then
				ok "$where: ucx_perftest -x $tl -t $test$opts"
			else
				bad "$where: ucx_perftest -x $tl -t $test$opts" \
				    "client $crc server $src: $(grep -E 'ERROR|Final' "$tmp/c" "$tmp/s" | head -3 | tr '\n' ' ')$(crash_bt)"
			fi
		done
		for t in tag_lat "tag_bw -s 1048576 -n 200" "ucp_put_bw -s 1048576 -n 200" \
			 "ucp_get -s 65536 -n 500"; do
			test=${t%% *} opts=${t#"$test"}
			cmd="timeout 60 ucx_perftest -t $test -n 2000 $opts"
			srv_cli "env $UCX_ENV $sp $cmd" "env $UCX_ENV UCX_LOG_LEVEL=info $cp $cmd $addr"
			lanes=$(sed -n 's/.*ep_cfg\[[0-9]*\]: //p' "$tmp/c" | sort -u | tr '\n' ' ')
			if [ $crc = 0 ] && [ $src = 0 ] && grep -q "^Final:" "$tmp/c" &&
			   echo "$lanes" | grep -q "ursa0:1" && ! echo "$lanes" | grep -q -E "posix|sysv|cma|tcp"; then
				ok "$where: UCP ucx_perftest -t $test$opts over ${lanes% }"
			else
				bad "$where: UCP ucx_perftest -t $test$opts" \
				    "client $crc server $src, lanes '$lanes': $(grep -E 'ERROR|Final' "$tmp/c" "$tmp/s" | head -3 | tr '\n' ' ')$(crash_bt)"
			fi
		done
	}
	ucx_tests "one host" "$RUN" "$RUN" 127.0.0.1
else
	skp UCX "ucx-utils not installed"
fi

# ---------------------------------------------------------------- MPI
MPI_OMPI="" MPI_MPICH=""
if have mpicc.openmpi && have mpirun.openmpi; then
	mpicc.openmpi -O2 -o "$tmp/mpi_ompi" "$SRC/tests/mpi/mpi_check.c" && MPI_OMPI="$tmp/mpi_ompi"
fi
if have mpicc.mpich && have mpiexec.mpich; then
	mpicc.mpich -O2 -o "$tmp/mpi_mpich" "$SRC/tests/mpi/mpi_check.c" && MPI_MPICH="$tmp/mpi_mpich"
fi
# The ping-pong phase alone moves 3 rounds x 2 x (1 B + 4 B + ... + 4 MiB).
MPI_MIN=33000000
mpi_result() { # NAME: judge $tmp/m (output and counters of all ranks)
	b=$(ursa_bytes "$tmp/m")
	n=$(grep -c "^ok " "$tmp/m")
	if [ "$rc" = 0 ] && [ "$n" = 3 ] && [ "$b" -ge $MPI_MIN ]; then
		ok "$1: 3 checks, ursa moved $b bytes"
	else
		bad "$1" "rc $rc, $n checks, ursa moved $b bytes: $(grep -E 'FAIL|rror' "$tmp/m" | head -3 | tr '\n' ' ')"
	fi
}
OMPI_ARGS="--allow-run-as-root --oversubscribe --mca pml ucx --mca osc ucx --mca btl self
	-x UCX_NET_DEVICES=ursa0:1 -x UCX_TLS=^shm,cma -x URSA_STATS=1"
if [ -n "$MPI_OMPI" ]; then
	for np in 2 4; do
		# shellcheck disable=SC2086
		$RUN timeout 120 mpirun.openmpi $OMPI_ARGS -np $np "$MPI_OMPI" >"$tmp/m" 2>&1; rc=$?
		mpi_result "Open MPI (pml ucx, osc ucx), $np ranks, one host"
	done
else
	skp "Open MPI" "openmpi-bin or libopenmpi-dev not installed"
fi
if [ -n "$MPI_MPICH" ]; then
	for np in 2 4; do
		# shellcheck disable=SC2086
		env $UCX_ENV MPIR_CVAR_NOLOCAL=1 $RUN timeout 120 mpiexec.mpich -np $np "$MPI_MPICH" \
			>"$tmp/m" 2>&1; rc=$?
		mpi_result "MPICH (ch4:ucx), $np ranks, one host"
	done
else
	skp MPICH "mpich or libmpich-dev not installed"
fi

# ---------------------------------------------------------------- libfabric
# fi_pp WHERE SPREFIX CPREFIX ADDR: fi_pingpong over verbs;ofi_rxd (RDM on
# UD, no rdma_cm). Both sides must measure every size and exit 0, the
# server within 10 s of the client. (In about one run of five the server
# used to wait in libfabric after its last line for the client's last
# ACKs, which the client's ibv_destroy_qp dropped from its send queue;
# posted UD sends now go out before the destroy: core/qp.c sq_drain.)
fi_pp() {
	$2 timeout 60 fi_pingpong -p "verbs;ofi_rxd" -e rdm -I 100 >"$tmp/s" 2>&1 &
	spid=$!
	sleep 0.5
	$3 timeout 60 fi_pingpong -p "verbs;ofi_rxd" -e rdm -I 100 $4 >"$tmp/c" 2>&1; crc=$?
	for _ in $(seq 20); do kill -0 $spid 2>/dev/null || break; sleep 0.5; done
	late=""
	if kill -0 $spid 2>/dev/null; then
		late=" (still running 10 s after the client: stopped)"
		pkill -f "fi_pingpong -p verbs;ofi_rxd -e rdm -I 100$" 2>/dev/null
	fi
	wait $spid; src=$?
	if [ $crc = 0 ] && [ $src = 0 ] && [ -z "$late" ] &&
	   grep -q "^1m " "$tmp/c" && grep -q "^1m " "$tmp/s"; then
		ok "$1: fi_pingpong -p 'verbs;ofi_rxd' -e rdm, 64 B .. 1 MiB both ways"
	else
		bad "$1: fi_pingpong verbs;ofi_rxd" "client $crc, server $src$late: $(tail -2 "$tmp/c" | tr '\n' ' ')/ server: $(tail -2 "$tmp/s" | tr '\n' ' ')"
	fi
}
if have fi_info && have fi_pingpong; then
	$RUN fi_info -p verbs >"$tmp/f" 2>&1
	if grep -q "domain: ursa0$" "$tmp/f" && grep -q "domain: ursa0-dgram" "$tmp/f" &&
	   grep -q "FI_EP_RDM" "$tmp/f"; then
		ok "fi_info -p verbs lists ursa0 (msg), ursa0-dgram (dgram, rdm)"
	else
		bad "fi_info -p verbs" "$(head -5 "$tmp/f" | tr '\n' ' ')"
	fi
	fi_pp "one host" "$RUN" "$RUN" 127.0.0.1
else
	skp libfabric "libfabric-bin not installed"
fi

# ---------------------------------------------------------------- pyverbs
# (Installed? Asked of the system's libibverbs: a sanitizer build's
# library would not load without its runtime.)
if [ -x $PY ] && env -u LD_LIBRARY_PATH -u LD_PRELOAD $PY -c 'import pyverbs.device' 2>/dev/null; then
	# every provider module imports (they link libmlx5.so.1, libefa.so.1)
	if $RUN $PY -c 'import pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv, pyverbs.device as d
print(d.get_device_list()[0].name.decode())' >"$tmp/p" 2>&1 && grep -q '^ursa0$' "$tmp/p"; then
		ok "pyverbs imports its mlx5 and efa provider modules, lists ursa0"
	else
		bad "pyverbs imports" "$(tail -2 "$tmp/p" | tr '\n' ' ')"
	fi
	srv_cli "$RUN timeout 60 $PY $SRC/tests/py/rc_ops.py server 7712" \
		"$RUN timeout 60 $PY $SRC/tests/py/rc_ops.py client 127.0.0.1 7712"
	if [ $crc = 0 ] && [ $src = 0 ] && [ "$(cat "$tmp/c" "$tmp/s" | grep -c '^ok ')" = 5 ]; then
		ok "one host: pyverbs RC SEND, WRITE and READ of 1 MiB between two processes, checked"
	else
		bad "one host: pyverbs rc_ops" "client $crc server $src: $(grep FAIL "$tmp/c" "$tmp/s" | head -2)"
	fi
	# rdma-core's own suite (the librdmacm tests belong to librdmacm)
	suite=/usr/share/doc/rdma-core/tests
	if [ -d $suite ]; then
		mkdir -p "$tmp/py" && cp -r $suite "$tmp/py/tests" && gunzip -f "$tmp/py/tests/"*.gz
		rm -f "$tmp/py/tests/test_rdmacm.py" "$tmp/py/tests/test_mlx5_rdmacm.py"
		for f in "$tmp/py/tests/"test_*.py; do
			m=$(basename "$f" .py)
			(cd "$tmp/py" && env -u URSA_STATS $RUN timeout 300 $PY tests/run_tests.py \
				--dev ursa0 -v "tests.$m") >"$tmp/py/$m.log" 2>&1
		done
		ran=$(grep -h '^Ran ' "$tmp/py/"*.log | awk '{ s += $2 } END { print s + 0 }')
		okc=$(grep -h -c -E '\.\.\. ok$' "$tmp/py/"*.log | awk '{ s += $1 } END { print s + 0 }')
		bads=$(grep -h -E '^(FAIL|ERROR): ' "$tmp/py/"*.log | head -5 | tr '\n' ' ')
		crashed=$(grep -L '^Ran ' "$tmp/py/"*.log | xargs -r -n1 basename | tr '\n' ' ')
		if [ -z "$bads" ] && [ -z "$crashed" ] && [ "$okc" -ge 90 ]; then
			ok "rdma-core's pyverbs suite: $ran tests, $okc passed, no failure or error (the rest skip: mlx5, EFA, DM, XRC, ...)"
		else
			bad "rdma-core's pyverbs suite" "$ran ran, $okc passed; failing: $bads; no result: $crashed"
		fi
	else
		skp "rdma-core's pyverbs suite" "$suite not installed"
	fi
else
	skp pyverbs "python3-pyverbs not installed"
fi

# ---------------------------------------------------------------- two hosts
if [ "$(id -u)" != 0 ] || ! have ip || ! ip netns add ursa_probe_$$ 2>/dev/null; then
	skp "two hosts" "needs root and network namespaces"
	rm -rf "$tmp"
	echo "$pass passed, $fail failed, $skip skipped"; [ $fail = 0 ]; exit
fi
ip netns del ursa_probe_$$
. "$(dirname "$0")/netns.inc"
trap 'netns_down; rm -rf "$tmp"' EXIT
# Each host resolves the names h1 and h2 and asks no name server (mpirun
# and hydra look names up; the machine's DNS is unreachable from inside,
# each lookup a timeout): ip netns exec mounts /etc/netns/<ns>/* on /etc.
for n in $H1 $H2; do
	mkdir -p /etc/netns/$n
	printf '127.0.0.1 localhost %s\n%s h1\n%s h2\n' "$(hostname)" $IP1 $IP2 >/etc/netns/$n/hosts
	echo "# no name server on the test hosts" >/etc/netns/$n/resolv.conf
done
trap 'netns_down; rm -rf "$tmp" /etc/netns/$H1 /etc/netns/$H2' EXIT
netns_up || { bad netns "could not build the namespaces"; echo "$pass passed, $fail failed, $skip skipped"; exit 1; }
IN1="ip netns exec $H1 $RUN"
IN2="ip netns exec $H2 $RUN"
# mpirun's and hydra's remote shell: "nsrsh h1|h2 COMMAND" runs COMMAND in
# that host (ip netns exec keeps the environment: ursa run's variables).
cat >"$tmp/nsrsh" <<EOF
#!/bin/sh
case \$1 in h1) ns=$H1;; h2) ns=$H2;; *) echo "nsrsh: no host \$1" >&2; exit 1;; esac
shift
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$tmp/nsrsh"

if have ucx_perftest; then
	ucx_tests "two hosts" "$IN1" "$IN2" $IP1
	pk=$(roce_pkts "$tmp/c")
	[ "$pk" -gt 0 ] && ok "two hosts: the UCX traffic went as RoCEv2 ($pk packets from the last client)" ||
		bad "two hosts: UCX over RoCEv2" "no RoCEv2 packet counted"
fi
# MPI with ranks on both hosts, placed round robin so that every
# ping-pong pair (rank ^ 1) crosses between them.
if [ -n "$MPI_OMPI" ]; then
	for np in 2 4; do
		# shellcheck disable=SC2086
		ip netns exec $H1 env PMIX_MCA_gds=hash $RUN timeout 120 mpirun.openmpi $OMPI_ARGS \
			--mca plm_rsh_agent "$tmp/nsrsh" --host h1:2,h2:2 --map-by node --bind-to none -np $np \
			"$MPI_OMPI" >"$tmp/m" 2>&1; rc=$?
		mpi_result "Open MPI (pml ucx, osc ucx), $np ranks on two hosts, $(roce_pkts "$tmp/m") RoCEv2 packets"
	done
fi
if [ -n "$MPI_MPICH" ]; then
	for np in 2 4; do
		# shellcheck disable=SC2086
		ip netns exec $H1 env $UCX_ENV MPIR_CVAR_NOLOCAL=1 $RUN timeout 120 mpiexec.mpich \
			-launcher rsh -launcher-exec "$tmp/nsrsh" -iface v1h -hosts h1,h2 -np $np \
			"$MPI_MPICH" >"$tmp/m" 2>&1; rc=$?
		mpi_result "MPICH (ch4:ucx), $np ranks on two hosts, $(roce_pkts "$tmp/m") RoCEv2 packets"
	done
fi
if [ -x $PY ] && env -u LD_LIBRARY_PATH -u LD_PRELOAD $PY -c 'import pyverbs.device' 2>/dev/null; then
	srv_cli "$IN1 timeout 60 $PY $SRC/tests/py/rc_ops.py server 7712" \
		"$IN2 timeout 60 $PY $SRC/tests/py/rc_ops.py client $IP1 7712"
	pk=$(roce_pkts "$tmp/c")
	if [ $crc = 0 ] && [ $src = 0 ] && [ "$(cat "$tmp/c" "$tmp/s" | grep -c '^ok ')" = 5 ] && [ "$pk" -gt 0 ]; then
		ok "two hosts: pyverbs RC SEND, WRITE and READ of 1 MiB, checked ($pk RoCEv2 packets)"
	else
		bad "two hosts: pyverbs rc_ops" "client $crc server $src, $pk packets: $(grep FAIL "$tmp/c" "$tmp/s" | head -2)"
	fi
fi
if have fi_pingpong; then
	fi_pp "two hosts" "$IN1" "$IN2" $IP1
fi

rm -rf "$tmp"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
