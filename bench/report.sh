#!/bin/sh
# report.sh - the benchmark report: ursa next to the physical limits and
# its peers, measured in one run on one machine.
#
#   bench/report.sh [--quick] [BUILD]        (make bench, make bench-quick)
#
# Measures: ursa same-host latency and bandwidth (bench/samehost, against
# memcpy and a cache-line ping-pong), perftest binaries on ursa (latency
# and bandwidth versus size, message rate with 1, 2 and 8 QPs, CPU time
# per GiB moved), registration cost (bench/regcost, against mlock), the
# loopback limits (UDP ping-pong, TCP stream), UCX's ucx_perftest over
# shared memory and TCP when installed, RoCEv2 between two network
# namespaces (bench/hosts.sh, root; bench/wire.sh on a segmented path
# with loss, against iperf3 and sockperf), MPI over ursa against Open MPI's and
# UCX's shared memory and UCX tcp (bench/mpi.sh), and the key-value store
# (bench/kv.sh). Writes CSV files, SVG plots (gnuplot, when installed) and
# report.md into bench/out (URSA_BENCH_OUT). Asserts no speed: --quick
# (about a minute) is CI's smoke run and checks only that every part ran.
QUICK=
BUILD=build
for a in "$@"; do
	case "$a" in
	--quick) QUICK=1;;
	*) BUILD=$a;;
	esac
done
OUT=${URSA_BENCH_OUT:-bench/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LIB="$(cd "$BUILD/lib" && pwd)"
BB="$(cd "$BUILD/bench" && pwd)"
E="env LD_LIBRARY_PATH=$LIB"
NP="$BB/netpeer"
R="$OUT/report.md"
step=0
STEPS=10
missing=""
say() { step=$((step + 1)); echo "[$step/$STEPS] $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }
: >"$OUT/notes.txt"
note() { echo "$*" >>"$OUT/notes.txt"; echo "    note: $*" >&2; }

if [ -n "$QUICK" ]; then N_LAT=200; N_BW=100; SECS=0.3; else N_LAT=5000; N_BW=1000; SECS=3; fi

# --- 1. the machine -----------------------------------------------------------
say "machine"
{
	echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) online"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
	echo "kernel: $(uname -r); $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-}")"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ); mode: $([ -n "$QUICK" ] && echo quick || echo full)"
} >"$OUT/machine.txt"

# --- 2. same host: ursa against memcpy and the cache-line ping-pong -----------
say "same host: latency and bandwidth against memcpy and a cache-line ping-pong"
$E "$BB/samehost" ${QUICK:+--quick} --csv "$OUT/samehost.csv" >"$OUT/samehost.txt" 2>&1 ||
	note "samehost failed: $(tail -1 "$OUT/samehost.txt")"

# --- 3. perftest binaries on ursa, one host ------------------------------------
say "perftest on ursa: latency and bandwidth versus size, message rate, CPU per GiB"
pt() { # server and client of a perftest command on 127.0.0.1; client output
	$E timeout 120 "$@" -F >/dev/null 2>&1 &
	sleep 0.4
	$E timeout 120 "$@" -F 127.0.0.1 2>/dev/null
	wait
}
rows() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/'; }
# perftest and ucx_perftest print "MB/s" meaning 2^20 bytes a second (their
# message rates times the size say so); every bandwidth here is in 10^6
# bytes a second, as bench/samehost's and the TCP figures are.
MIB=1.048576
echo "op,bytes,typical_us,p99_us" >"$OUT/perftest_lat.csv"
echo "op,bytes,qps,avg_MBps,Mpps" >"$OUT/perftest_bw.csv"
if have ib_write_lat && have ib_write_bw; then
	if [ -n "$QUICK" ]; then SIZES="-s 8"; else SIZES="-a"; fi
	for op in write send read; do
		pt ib_${op}_lat $SIZES -n $N_LAT | rows |
			awk -v op=$op '{print op "," $1 "," $5 "," $8}' >>"$OUT/perftest_lat.csv"
	done
	pt ib_atomic_lat -n $N_LAT | rows | awk '{print "atomic," $1 "," $5 "," $8}' >>"$OUT/perftest_lat.csv"
	for op in write read send; do
		pt ib_${op}_bw $SIZES -n $N_BW | rows |
			awk -v op=$op -v m=$MIB '{print op "," $1 ",1," $4 * m "," $5}' >>"$OUT/perftest_bw.csv"
	done
	for q in 1 2 8; do
		pt ib_write_bw -s 64 -q $q -n $((N_BW * 10)) | rows |
			awk -v q=$q -v m=$MIB '{print "write_rate," $1 "," q "," $4 * m "," $5}' >>"$OUT/perftest_bw.csv"
	done
	# CPU time of both processes per GiB written (1 MiB WRITEs)
	n=$((N_BW / 2 + 50))
	$E timeout 120 "$NP" cputime ib_write_bw -F -s 1048576 -n $n >/dev/null 2>"$OUT/cpu_srv" &
	sleep 0.4
	$E timeout 120 "$NP" cputime ib_write_bw -F -s 1048576 -n $n 127.0.0.1 >/dev/null 2>"$OUT/cpu_cli"
	wait
	awk -v n=$n '/^cpu_s/ {s += $2} END {if (s) printf "cpu_s_per_GiB,%.3f\n", s / (n / 1024)}' \
		"$OUT/cpu_srv" "$OUT/cpu_cli" >"$OUT/cpu.csv"
else
	note "perftest not installed: no perftest rows (apt-get install perftest)"
fi

# --- 4. registration cost ------------------------------------------------------
say "registration cost against mlock"
$E "$BB/regcost" ${QUICK:+--quick} --csv "$OUT/regcost.csv" >"$OUT/regcost.txt" 2>&1 ||
	note "regcost failed: $(tail -1 "$OUT/regcost.txt")"

# --- 5. loopback limits: UDP ping-pong, TCP stream -----------------------------
say "loopback limits: UDP ping-pong versus size, TCP stream"
echo "bytes,oneway_us,p99_us" >"$OUT/udp_lat.csv"
"$NP" udp-server 9300 & u=$!
sleep 0.2
for sz in 8 64 512 4096 32768 65000; do
	"$NP" udp-client 127.0.0.1 9300 $((N_LAT * 2)) $sz | awk -v s=$sz '{print s "," $2 "," $3}' >>"$OUT/udp_lat.csv"
done
kill $u 2>/dev/null; wait $u 2>/dev/null
"$NP" tcp-server 9301 & sleep 0.2
"$NP" tcp-client 127.0.0.1 9301 $([ -n "$QUICK" ] && echo 256 || echo 4096) | awk '{print "tcp_loopback_MBps," $2}' >"$OUT/tcp.csv"
wait

# --- 6. UCX (ucx_perftest) over shared memory and TCP --------------------------
say "UCX ucx_perftest: shared memory and TCP"
echo "transport,test,bytes,p50_us,MBps" >"$OUT/ucx.csv"
if have ucx_perftest; then
	port=13337
	ucx() { # NAME TEST SIZE ITERS (UCX_TLS set by the caller)
		port=$((port + 1))
		timeout 60 ucx_perftest -p $port >/dev/null 2>&1 &
		sleep 0.4
		timeout 60 ucx_perftest 127.0.0.1 -p $port -t $2 -s $3 -n $4 2>/dev/null |
			awk -v t=$1 -v x=$2 -v s=$3 -v m=$MIB '/^Final:/ {print t "," x "," s "," $3 "," $7 * m}' >>"$OUT/ucx.csv"
		wait
	}
	if [ -n "$QUICK" ]; then LSZ="8"; BSZ="1048576"
	else LSZ="8 64 512 4096 32768 262144 1048576"; BSZ="$LSZ 16777216"; fi
	for tls in shm tcp; do
		if [ $tls = shm ]; then export UCX_TLS=posix,self; else export UCX_TLS=tcp; fi
		for sz in $LSZ; do
			ucx $tls tag_lat $sz $N_LAT
		done
		for sz in $BSZ; do
			ucx $tls tag_bw $sz $N_BW
		done
	done
	unset UCX_TLS
else
	note "ucx_perftest not installed: no UCX rows (apt-get install ucx-utils)"
fi

# --- 7. between hosts (network namespaces) ----------------------------------
say "RoCEv2 between two network namespaces"
if [ -n "$QUICK" ]; then
	echo "(not in the quick run)" >"$OUT/hosts.txt"
	rm -f "$OUT/hosts.csv"	# an earlier full run's figures are not this run's
elif [ "$(id -u)" = 0 ]; then
	sh "$(dirname "$0")/hosts.sh" "$BUILD" "$OUT/hosts.csv" >"$OUT/hosts.txt" 2>&1 || note "hosts.sh failed"
	sh "$(dirname "$0")/wire.sh" "$BUILD" "$OUT/wire.csv" >"$OUT/wire.txt" 2>&1 || note "wire.sh failed: $(tail -1 "$OUT/wire.txt")"
else
	echo "(needs root for network namespaces)" >"$OUT/hosts.txt"
fi

# --- 8. MPI: Open MPI over ursa against its own and UCX's shared memory, UCX tcp
say "MPI (Open MPI): ursa against vader and UCX shm on one host, UCX tcp between namespaces"
sh "$(dirname "$0")/mpi.sh" ${QUICK:+--quick} "$BUILD" "$OUT/mpi.csv" >"$OUT/mpi.txt" 2>&1 || note "mpi.sh failed"

# --- 9. the key-value store -------------------------------------------------------
say "key-value store: TCP, SEND/RECV, one-sided READ, Redis"
sh "$(dirname "$0")/kv.sh" "$BUILD" $SECS "$OUT/kv.md" >"$OUT/kv.txt" 2>&1 || note "kv.sh failed"

# --- 10. plots and the report -------------------------------------------------
say "plots and report"
if have gnuplot; then
	awk -F, '$1 == "bw" && $2 == "write" && $4 == 1 {print $3, $5, $7}' "$OUT/samehost.csv" >"$OUT/p_bw_write.dat"
	awk -F, '$1 == "bw" && $2 == "read" && $4 == 1 {print $3, $5}' "$OUT/samehost.csv" >"$OUT/p_bw_read.dat"
	awk -F, '$1 == "shm" && $2 == "tag_bw" {print $3, $5 / 1000}' "$OUT/ucx.csv" >"$OUT/p_bw_ucx_shm.dat"
	awk -F, '$1 == "tcp" && $2 == "tag_bw" {print $3, $5 / 1000}' "$OUT/ucx.csv" >"$OUT/p_bw_ucx_tcp.dat"
	awk -F, '$1 == "write" {print $2, $4 / 1000}' "$OUT/perftest_bw.csv" >"$OUT/p_bw_pt.dat"
	awk -F, '$1 == "write" {print $2, $3}' "$OUT/perftest_lat.csv" >"$OUT/p_lat_write.dat"
	awk -F, '$1 == "send" {print $2, $3}' "$OUT/perftest_lat.csv" >"$OUT/p_lat_send.dat"
	awk -F, '$1 == "read" {print $2, $3}' "$OUT/perftest_lat.csv" >"$OUT/p_lat_read.dat"
	awk -F, 'NR > 1 {print $1, $2}' "$OUT/udp_lat.csv" >"$OUT/p_lat_udp.dat"
	if [ -s "$OUT/hosts.csv" ]; then
		awk -F, '$1 == "lat" && $2 == "write" {print $3, $4}' "$OUT/hosts.csv" >"$OUT/p_lat_hosts.dat"
		awk -F, '$1 == "bw" && $2 == "write" {print $3, $4 / 1000}' "$OUT/hosts.csv" >"$OUT/p_bw_hosts.dat"
	fi
	awk -F, '$1 == "shm" && $2 == "tag_lat" {print $3, $4}' "$OUT/ucx.csv" >"$OUT/p_lat_ucx_shm.dat"
	awk -F, '$1 == "tcp" && $2 == "tag_lat" {print $3, $4}' "$OUT/ucx.csv" >"$OUT/p_lat_ucx_tcp.dat"
	for k in 4k 4k_cached thp thp_cached odp mlock; do
		awk -F, -v k=$k '$2 == k {print $1, $3}' "$OUT/regcost.csv" >"$OUT/p_reg_$k.dat"
	done
	plot() { # FILE TITLE YLABEL then "data|title" pairs
		f=$1; t=$2; y=$3; shift 3
		cmd=""
		for s in "$@"; do
			d=${s%%|*}; n=${s#*|}
			[ -s "$OUT/$d" ] || continue
			cmd="$cmd${cmd:+, }'$OUT/$d' using 1:2 with linespoints title '$n'"
		done
		[ -n "$cmd" ] || return 0
		gnuplot <<-EOG 2>>"$OUT/notes.txt"
		set terminal svg size 800,480 dynamic font "sans,12"
		set output '$OUT/$f'
		set title '$t'
		set logscale x 2
		set logscale y
		set format x '%.0s%cB'
		set xlabel 'message size'
		set ylabel '$y'
		set key left top
		set grid
		plot $cmd
		EOG
	}
	plot latency.svg "Latency versus size, one host (lower is better)" "microseconds" \
		"p_lat_write.dat|ursa WRITE one way (ib_write_lat)" \
		"p_lat_send.dat|ursa SEND one way (ib_send_lat)" \
		"p_lat_read.dat|ursa READ round trip (ib_read_lat)" \
		"p_lat_ucx_shm.dat|UCX tag, shared memory" \
		"p_lat_ucx_tcp.dat|UCX tag, TCP" \
		"p_lat_udp.dat|UDP ping-pong one way (loopback)" \
		"p_lat_hosts.dat|ursa WRITE one way, between namespaces (RoCEv2)"
	# memcpy of each size, as a third column of the write file
	if [ -s "$OUT/p_bw_write.dat" ]; then
		awk '{print $1, $3}' "$OUT/p_bw_write.dat" >"$OUT/p_bw_memcpy.dat"
		plot bandwidth.svg "Bandwidth versus size, one host (higher is better)" "GB/s" \
			"p_bw_memcpy.dat|memcpy (the limit)" \
			"p_bw_write.dat|ursa WRITE, 1 QP (bench/samehost)" \
			"p_bw_read.dat|ursa READ, 1 QP (bench/samehost)" \
			"p_bw_pt.dat|ursa WRITE (ib_write_bw)" \
			"p_bw_ucx_shm.dat|UCX tag, shared memory" \
			"p_bw_ucx_tcp.dat|UCX tag, TCP" \
			"p_bw_hosts.dat|ursa WRITE between namespaces (RoCEv2)"
	fi
	plot registration.svg "Registration + deregistration versus size (lower is better)" "microseconds" \
		"p_reg_4k.dat|ibv_reg_mr, 4 KiB pages" \
		"p_reg_4k_cached.dat|ibv_reg_mr again (registration cache)" \
		"p_reg_thp.dat|ibv_reg_mr, transparent huge pages" \
		"p_reg_odp.dat|ibv_reg_mr, on demand (no pinning)" \
		"p_reg_mlock.dat|mlock + munlock (the floor of pinning)"
	rm -f "$OUT"/p_*.dat "$OUT"/cpu_srv "$OUT"/cpu_cli
else
	note "gnuplot not installed: no plots (apt-get install gnuplot-nox)"
fi

# --- the summary: key figures and their ratios to the limits and peers ---------
get() { # FILE AWK-CONDITION FIELD: the first matching value, or empty
	[ -s "$1" ] && awk -F, "$2 {print \$$3; exit}" "$1"
}
row() { # NAME URSA UNIT REF REF-NAME
	if [ -n "$2" ] && [ -n "$4" ]; then
		awk -v n="$1" -v a="$2" -v u="$3" -v b="$4" -v r="$5" \
			'BEGIN {printf "| %s | %s %s | %s %s (%s) | %.2fx |\n", n, a, u, b, u, r, (b > 0 ? a / b : 0)}'
	else
		u="not measured"; [ -n "$2" ] && u="$2 $3"
		r="not measured"; [ -n "$4" ] && r="$4 $3"
		echo "| $1 | $u | $r ($5) | |"
	fi
}
S="$OUT/samehost.csv"; H="$OUT/hosts.csv"; U="$OUT/ucx.csv"
{
	echo "| figure | ursa | limit or peer | ursa / it |"
	echo "|---|---|---|---|"
	row "8 B WRITE one way, one host" "$(get "$S" '$1=="lat"&&$2=="write"' 5)" µs \
		"$(get "$S" '$1=="lat"&&$2=="write"' 7)" "cache-line ping-pong"
	row "8 B WRITE one way, one host" "$(get "$S" '$1=="limit2"&&$2=="write"' 5)" µs \
		"$(get "$S" '$1=="limit2"&&$2=="write"' 7)" "two-line ping-pong (the WRITE's pattern, no ursa)"
	row "8 B WRITE one way, one host" "$(get "$S" '$1=="floor"&&$2=="cma_write"' 5)" µs \
		"$(get "$S" '$1=="floor"&&$2=="cma_write"' 7)" "one 8 B process_vm_writev (floor)"
	row "8 B SEND one way, one host" "$(get "$S" '$1=="lat"&&$2=="send"' 5)" µs \
		"$(get "$U" '$1=="shm"&&$2=="tag_lat"&&$3==8' 4)" "UCX shared memory"
	row "8 B READ round trip, one host" "$(get "$S" '$1=="lat"&&$2=="read"' 5)" µs \
		"$(get "$S" '$1=="lat"&&$2=="read"' 7)" "2 x cache-line ping-pong"
	for sz in 1048576 16777216; do
		row "WRITE $((sz >> 20)) MiB, 1 QP, one host" \
			"$(get "$S" "\$1==\"bw\"&&\$2==\"write\"&&\$3==$sz&&\$4==1" 5)" GB/s \
			"$(get "$S" "\$1==\"bw\"&&\$2==\"write\"&&\$3==$sz&&\$4==1" 7)" "memcpy"
		row "WRITE $((sz >> 20)) MiB, 1 QP, one host" \
			"$(get "$S" "\$1==\"bw\"&&\$2==\"write\"&&\$3==$sz&&\$4==1" 5)" GB/s \
			"$(get "$U" "\$1==\"shm\"&&\$2==\"tag_bw\"&&\$3==$sz" 5 | awk '{if ($1 != "") print $1 / 1000}')" \
			"UCX shared memory"
	done
	row "1 MiB ib_write_bw, one host" "$(get "$OUT/perftest_bw.csv" '$1=="write"&&$2==1048576' 4)" MB/s \
		"$(get "$OUT/tcp.csv" 1 2)" "TCP stream, loopback"
	row "registration, 4 KiB" "$(get "$OUT/regcost.csv" '$1==4096&&$2=="4k"' 3)" µs \
		"$(get "$OUT/regcost.csv" '$1==4096&&$2=="mlock"' 3)" "mlock + munlock"
	row "registration, 64 MiB" "$(get "$OUT/regcost.csv" '$1==67108864&&$2=="4k"' 3)" µs \
		"$(get "$OUT/regcost.csv" '$1==67108864&&$2=="mlock"' 3)" "mlock + munlock"
	row "registration again (cached), 64 MiB" "$(get "$OUT/regcost.csv" '$1==67108864&&$2=="4k_cached"' 3)" µs \
		"$(get "$OUT/regcost.csv" '$1==67108864&&$2=="4k"' 3)" "first registration"
	row "64 B WRITE one way, between namespaces" "$(get "$H" '$1=="lat_pair"&&$2=="write"' 4)" µs \
		"$(get "$H" '$2=="udp_oneway_us"' 4)" "UDP ping-pong"
	row "1 MiB WRITE, between namespaces (median of 3)" "$(get "$H" '$1=="bw_med"&&$2=="write"' 4)" MB/s \
		"$(get "$H" '$2=="tcp_MBps"' 4)" "TCP stream"
	row "1 MiB WRITE, between namespaces, MTU 9000" "$(get "$H" '$1=="bw_mtu9000"&&$2=="write"' 4)" MB/s \
		"$(get "$H" '$2=="tcp_MBps_mtu9000"' 4)" "TCP stream, MTU 9000"
	M="$OUT/mpi.csv"
	row "MPI 8 B one way, one host" "$(get "$M" '$1=="one_host"&&$2=="ursa"&&$3=="lat"' 5)" µs \
		"$(get "$M" '$1=="one_host"&&$2=="vader"&&$3=="lat"' 5)" "Open MPI ob1 + vader"
	row "MPI 1 MiB bandwidth, one host" "$(get "$M" '$1=="one_host"&&$2=="ursa"&&$3=="bw"' 5)" MB/s \
		"$(get "$M" '$1=="one_host"&&$2=="vader"&&$3=="bw"' 5)" "Open MPI ob1 + vader"
	row "MPI 1 MiB bandwidth, one host" "$(get "$M" '$1=="one_host"&&$2=="ursa"&&$3=="bw"' 5)" MB/s \
		"$(get "$M" '$1=="one_host"&&$2=="ucx_shm"&&$3=="bw"' 5)" "Open MPI over UCX shm"
	row "MPI 8 B one way, between namespaces" "$(get "$M" '$1=="two_hosts"&&$2=="ursa"&&$3=="lat"' 5)" µs \
		"$(get "$M" '$1=="two_hosts"&&$2=="ucx_tcp"&&$3=="lat"' 5)" "Open MPI over UCX tcp"
	row "MPI 1 MiB bandwidth, between namespaces" "$(get "$M" '$1=="two_hosts"&&$2=="ursa"&&$3=="bw"' 5)" MB/s \
		"$(get "$M" '$1=="two_hosts"&&$2=="ucx_tcp"&&$3=="bw"' 5)" "Open MPI over UCX tcp"
	if [ -s "$OUT/kv.md" ]; then
		kvr=$(awk -F'|' '/^\| read /{gsub(/ /, "", $3); print $3; exit}' "$OUT/kv.md")
		kvt=$(awk -F'|' '/^\| tcp /{gsub(/ /, "", $3); print $3; exit}' "$OUT/kv.md")
		kvx=$(awk -F'|' '/^\| redis /{gsub(/ /, "", $3); print $3; exit}' "$OUT/kv.md")
		row "KV GET p50 by READ, one host" "$kvr" µs "$kvt" "KV GET by TCP"
		row "KV GET p50 by READ, one host" "$kvr" µs "$kvx" "Redis GET"
	fi
} >"$OUT/summary.md"
echo >&2
cat "$OUT/summary.md" >&2

# the report: every table, as measured; the reading is for a person to add
csvtable() { # FILE: a CSV as a Markdown table
	awk -F, 'NR == 1 {h = "|"; s = "|"; for (i = 1; i <= NF; i++) {h = h " " $i " |"; s = s "---|"}
		print h; print s; next}
		{r = "|"; for (i = 1; i <= NF; i++) r = r " " $i " |"; print r}' "$1"
}
{
	echo "# ursa benchmark report"
	echo
	sed 's/^/    /' "$OUT/machine.txt"
	echo
	echo "## Summary"
	echo
	cat "$OUT/summary.md"
	echo
	echo "## Same host: ursa between two processes (bench/samehost)"
	echo
	echo '```'; cat "$OUT/samehost.txt"; echo '```'
	echo
	echo "## perftest on ursa, one host"
	echo
	csvtable "$OUT/perftest_lat.csv"; echo
	csvtable "$OUT/perftest_bw.csv"; echo
	[ -s "$OUT/cpu.csv" ] && { echo "CPU time of both processes per GiB written with 1 MiB WRITEs: $(cut -d, -f2 "$OUT/cpu.csv") s"; echo; }
	echo "## Limits on the loopback"
	echo
	csvtable "$OUT/udp_lat.csv"; echo
	echo "TCP stream over loopback: $(cut -d, -f2 "$OUT/tcp.csv") MB/s"
	echo
	echo "## UCX (ucx_perftest; latency is its 50th percentile, one way for tag_lat)"
	echo
	csvtable "$OUT/ucx.csv"; echo
	echo "## Memory registration (bench/regcost)"
	echo
	echo '```'; cat "$OUT/regcost.txt"; echo '```'
	echo
	echo "## Between two hosts (network namespaces)"
	echo
	echo '```'; cat "$OUT/hosts.txt"; echo '```'
	echo
	[ -s "$OUT/hosts.csv" ] && { csvtable "$OUT/hosts.csv"; echo; }
	if [ -s "$OUT/wire.txt" ]; then
		echo "### On a segmented path, with loss, next to iperf3 and sockperf (bench/wire.sh)"
		echo
		echo '```'; cat "$OUT/wire.txt"; echo '```'
		echo
	fi
	echo "## MPI (bench/mpi.sh: tests/mpi/mpi_check.c lat and bw, 2 ranks of Open MPI)"
	echo
	echo '```'; cat "$OUT/mpi.txt"; echo '```'
	echo
	echo "## Key-value store (bench/kv.sh)"
	echo
	if [ -s "$OUT/kv.md" ]; then cat "$OUT/kv.md"; else echo '```'; cat "$OUT/kv.txt"; echo '```'; fi
	echo
	for f in latency bandwidth registration; do
		[ -s "$OUT/$f.svg" ] && echo "![$f]($f.svg)"
	done
	echo
	[ -s "$OUT/notes.txt" ] && { echo "## Notes"; echo; sed 's/^/- /' "$OUT/notes.txt"; }
} >"$R"

# what a smoke run checks: every part produced its figures (not their values)
bad=0
for f in samehost.csv regcost.csv udp_lat.csv; do
	[ "$(wc -l <"$OUT/$f")" -ge 2 ] || { echo "missing figures: $f" >&2; bad=1; }
done
grep -q "^tcp_loopback_MBps,[0-9]" "$OUT/tcp.csv" || { echo "missing figures: tcp.csv" >&2; bad=1; }
if have mpirun.openmpi && have mpicc.openmpi && [ "$(wc -l <"$OUT/mpi.csv")" -lt 7 ]; then
	echo "missing figures: mpi.csv" >&2; bad=1
fi
if have ib_write_lat && [ "$(wc -l <"$OUT/perftest_lat.csv")" -lt 2 ]; then
	echo "missing figures: perftest_lat.csv" >&2; bad=1
fi
echo "report: $R (CSV and plots in $OUT)"
exit $bad
