#!/bin/sh
# apps.sh - unmodified Debian binaries (ibverbs-utils, perftest) run on ursa
# as real server/client pairs of processes on this host, pointed at ursa only
# through the library path. Each check asserts the programs' own result
# lines (byte and iteration counts, perftest's result rows with non-zero
# figures, no error lines), not just exit codes.
# Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
pass=0; fail=0; skip=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
TO=${URSA_APP_TIMEOUT:-60}

# run NAME SERVER_CMD... -- (client adds 127.0.0.1); leaves $tmp/s and $tmp/c
# The TCP port perftest exchanges its QP numbers on is drawn below the
# kernel's ephemeral range (a port some client connection holds cannot be
# bound: that once failed a run), and drawn again if the server still
# could not bind it.
pair() {
	for attempt in 1 2 3; do
		port=$(( 20000 + $(od -An -N2 -tu2 /dev/urandom) % 12000 ))
		srv="$1 -p $port"; cli="$1 -p $port 127.0.0.1"
		env LD_LIBRARY_PATH="$LIB" ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0} \
			timeout "$TO" $srv >"$tmp/s" 2>&1 &
		spid=$!
		sleep 0.3
		env LD_LIBRARY_PATH="$LIB" ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0} \
			timeout "$TO" $cli >"$tmp/c" 2>&1
		crc=$?
		wait $spid; src=$?
		grep -qE "Unable to open file descriptor for socket connection|Couldn.t listen to port" "$tmp/s" || break
	done
}

ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() {
	echo "FAIL $1: $2"; fail=$((fail + 1))
	echo "---- server"; tail -5 "$tmp/s"; echo "---- client"; tail -5 "$tmp/c"
}

if ! command -v ibv_rc_pingpong >/dev/null; then
	echo "skip pingpong: ibverbs-utils not installed"; skip=$((skip + 1))
else
	# pingpongs: "<bytes> bytes in <t> seconds" where bytes = 2 x size x iters
	for spec in "ibv_rc_pingpong:4096" "ibv_uc_pingpong:4096" "ibv_ud_pingpong:1024" \
		    "ibv_srq_pingpong:4096" "ibv_rc_pingpong -e:4096" "ibv_rc_pingpong -N:4096" \
		    "ibv_rc_pingpong -c -s 65536:65536" "ibv_rc_pingpong -o:4096" \
		    "ibv_uc_pingpong -e -s 1:1"; do
		prog=${spec%:*}; size=${spec##*:}
		n=200
		case "$prog" in *-s*) ;; *) prog="$prog -s $size";; esac
		pair "$prog -g 0 -n $n"
		want=$((2 * size * n))
		if [ $crc = 0 ] && [ $src = 0 ] &&
		   grep -q "^$want bytes in" "$tmp/c" && grep -q "^$want bytes in" "$tmp/s" &&
		   grep -q "^$n iters in" "$tmp/c"; then
			ok "$prog"
		else
			bad "$prog" "rc client $crc server $src, want $want bytes"
		fi
	done
	# XRC is refused cleanly, with the errno of a device without XRC
	env LD_LIBRARY_PATH="$LIB" ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0} \
		timeout 10 ibv_xsrq_pingpong -g 0 >"$tmp/c" 2>&1
	grep -q "Couldn't Open the XRC Domain 95" "$tmp/c" && ok "ibv_xsrq_pingpong refused (EOPNOTSUPP)" ||
		bad ibv_xsrq_pingpong "$(head -2 "$tmp/c")"
fi

# perftest: a result row is "<#bytes> <#iterations> <numbers...>"; every
# figure after the first two must parse, and the last BW / typical latency
# must be non-zero.
check_row() {
	f=$1
	grep -qiE "error|failed|couldn't|unable|overrun" "$f" && return 1
	awk -v want="$2" '
		/^ *[0-9]+ +[0-9]+ +[0-9.]+/ { rows++; if ($1 == want || want == "") {
			nz = 0; for (i = 3; i <= NF; i++) if ($i + 0 > 0) nz++; if (nz >= 2) good++ } }
		END { exit !(rows > 0 && good > 0) }' "$f"
}

server_ok() {
	grep -qiE "error|failed|couldn't|unable|overrun" "$1" && return 1
	grep -q "remote address" "$1" || return 1
	# rows, where the server prints them, must be valid too
	if awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ {r++} END {exit !r}' "$1"; then
		check_row "$1" "$2"
	fi
}

if ! command -v ib_write_lat >/dev/null; then
	echo "skip perftest: not installed"; skip=$((skip + 1))
else
	while IFS='|' read -r cmd size; do
		[ -z "$cmd" ] && continue
		pair "$cmd -F"
		# READ and atomic latency servers print no result row
		if [ $crc = 0 ] && [ $src = 0 ] && check_row "$tmp/c" "$size" && server_ok "$tmp/s" "$size"; then
			ok "$cmd"
		else
			bad "$cmd" "rc client $crc server $src"
		fi
	done <<'LIST'
ib_write_lat -n 300|2
ib_write_bw -n 300|65536
ib_read_lat -n 300|2
ib_read_bw -n 300|65536
ib_send_lat -n 300|2
ib_send_lat -n 500 -e|2
ib_send_bw -n 300|65536
ib_atomic_lat -n 300|8
ib_atomic_bw -n 300|8
ib_atomic_lat -n 300 -A CMP_AND_SWAP|8
ib_write_bw -n 100 -s 1048576|1048576
ib_write_bw -n 100 -q 4|65536
ib_write_bw -n 50 -a|8388608
ib_write_lat -n 100 -a|8388608
ib_read_bw -n 100 -s 4194304|4194304
ib_send_bw -n 200 -c UD -s 1024|1024
ib_send_lat -n 200 -c UD -s 512|512
ib_write_bw -n 200 -c UC|65536
ib_send_bw -n 200 --report_gbits|65536
ib_write_bw -D 1|
LIST
	# the ibv_wr_* post path: perftest takes it for ConnectX-5 part ids
	export URSA_VENDOR_PART_ID=4119
	for cmd in "ib_write_lat -n 200" "ib_read_bw -n 200" "ib_send_bw -n 200" "ib_atomic_lat -n 200"; do
		pair "$cmd -F"
		if [ $crc = 0 ] && [ $src = 0 ] && check_row "$tmp/c" "" && server_ok "$tmp/s" ""; then
			ok "$cmd (ibv_wr_* API)"
		else
			bad "$cmd (ibv_wr_* API)" "rc client $crc server $src"
		fi
	done
	unset URSA_VENDOR_PART_ID
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
