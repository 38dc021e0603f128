#!/bin/sh
# dropin.sh - the library loads as libibverbs.so.1 under unmodified Debian
# binaries, with rdma-core 44's symbol versions and no loader warning, and
# the ursa command works. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$BUILD/lib"
pass=0; fail=0; skip=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# A sanitizer build of the library needs its runtime loaded first when an
# uninstrumented binary (ibv_devinfo) uses it.
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
run() {
	if [ -n "$asan" ]; then
		LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0 LD_LIBRARY_PATH="$LIB" "$@"
	else
		LD_LIBRARY_PATH="$LIB" "$@"
	fi
}

# 1. version nodes of the real library are all defined
if command -v readelf >/dev/null; then
	nodes=$(readelf -V "$LIB/libibverbs.so.1" | sed -n 's/.*Name: \(IBVERBS_[0-9A-Z_.]*\).*/\1/p' | sort -u | tr '\n' ' ')
	want="IBVERBS_1.0 IBVERBS_1.1 IBVERBS_1.10 IBVERBS_1.11 IBVERBS_1.12 IBVERBS_1.13 IBVERBS_1.14 IBVERBS_1.5 IBVERBS_1.6 IBVERBS_1.7 IBVERBS_1.8 IBVERBS_1.9 IBVERBS_PRIVATE_34"
	missing=""
	for n in $want; do echo " $nodes " | grep -q " $n " || missing="$missing $n"; done
	[ -z "$missing" ] && ok version_nodes || bad version_nodes "missing$missing"
	soname=$(readelf -d "$LIB/libibverbs.so.1" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
	[ "$soname" = libibverbs.so.1 ] && ok soname || bad soname "got '$soname'"
else
	skp version_nodes "readelf missing"
fi

# 2. every symbol the Debian binaries import is exported
if command -v nm >/dev/null; then
	m=""
	for s in ibv_get_device_list ibv_open_device ibv_query_gid_type _ibv_query_gid_ex \
		 ibv_reg_mr_iova2 ibv_qp_to_qp_ex ibv_read_sysfs_file ibv_copy_ah_attr_from_kern \
		 ibv_query_ece ibv_set_ece ibv_get_device_index ibv_get_pkey_index; do
		nm -D --defined-only "$LIB/libibverbs.so.1" | grep -q " $s@" || m="$m $s"
	done
	[ -z "$m" ] && ok exports || bad exports "missing$m"
	leaked=$(nm -D --defined-only "$LIB/libibverbs.so.1" | awk '{print $3}' | grep -v -E '^(ibv_|_ibv_|mbps_to_ibv_rate|mult_to_ibv_rate|ursa_|IBVERBS|URSA)' | head -3)
	[ -z "$leaked" ] && ok no_internal_exports || bad no_internal_exports "$leaked"
fi

# 3. unmodified ibverbs-utils binaries
if command -v ibv_devinfo >/dev/null; then
	run ibv_devices >"$tmp/o" 2>"$tmp/e"; rc=$?
	if [ $rc = 0 ] && grep -q ursa0 "$tmp/o" && [ ! -s "$tmp/e" ]; then ok ibv_devices
	else bad ibv_devices "rc=$rc $(cat "$tmp/e")"; fi
	run ibv_devinfo -v >"$tmp/o" 2>"$tmp/e"; rc=$?
	if [ $rc = 0 ] && grep -q "fw_ver:.*ursa" "$tmp/o" && grep -q "PORT_ACTIVE" "$tmp/o" &&
	   grep -q "RoCE v2" "$tmp/o" && grep -q "link_layer:.*Ethernet" "$tmp/o" && [ ! -s "$tmp/e" ]; then
		ok ibv_devinfo_v
	else bad ibv_devinfo_v "rc=$rc $(head -c 300 "$tmp/e")"; fi
	URSA_DEVICE_NAME=other9 run ibv_devinfo -d other9 >"$tmp/o" 2>&1 &&
		grep -q "hca_id:.*other9" "$tmp/o" && ok devinfo_renamed || bad devinfo_renamed "$(head -3 "$tmp/o")"
else
	skp ibv_devices "ibverbs-utils not installed"
fi

# 4. the ursa command
out=$("$BUILD/bin/ursa" run -- "$BUILD/bin/ursa" demo 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "B's memory now equals A's" &&
   echo "$out" | grep -q "why: remote: range outside the registered region" &&
   echo "$out" | grep -q "after deregistration and ursa_rcache_flush: 0 bytes pinned"; then
	ok ursa_demo
else
	bad ursa_demo "rc=$rc"; echo "$out" | tail -5
fi
out=$(LD_LIBRARY_PATH="$LIB" "$BUILD/bin/ursa" mr 64K 2>&1)
echo "$out" | grep -q "translation table: 16 entries" && ok ursa_mr || bad ursa_mr "$out"
LD_LIBRARY_PATH="$LIB" "$BUILD/bin/ursa" bogus >/dev/null 2>&1; rc=$?
[ $rc = 2 ] && ok ursa_usage_exit2 || bad ursa_usage_exit2 "rc=$rc"

# 5. make install puts the library set in a prefix of its own, and the
#    installed ursa command finds it
if make -s install PREFIX="$tmp/prefix" BUILD="$BUILD" >/dev/null 2>&1 &&
   [ -e "$tmp/prefix/lib/ursa/libibverbs.so.1" ] && [ -e "$tmp/prefix/lib/ursa/libmlx5.so.1" ] &&
   [ -e "$tmp/prefix/lib/ursa/libefa.so.1" ] &&
   { [ -n "$asan" ] || "$tmp/prefix/bin/ursa" run -- ibv_devices 2>&1 | grep -q ursa0; }; then
	ok make_install
else
	bad make_install "installed set incomplete or not found by ursa run"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
