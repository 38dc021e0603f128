#!/bin/sh
# providers.sh - the provider stand-ins (libmlx5, libmlx4, libefa,
# libmana .so.1) match rdma-core 44's real libraries symbol for symbol and
# version for version, refuse every call, and let every installed Debian
# binary and library that links them, or libibverbs, resolve all its
# symbols against ursa's set. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$BUILD/lib"
SYS=/usr/lib/x86_64-linux-gnu
pass=0; fail=0; skip=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# Exported functions as name@VER / name@@VER, and the version nodes with
# their parents, as readelf prints them.
syms_of() {
	readelf --dyn-syms -W "$1" | awk '$4 == "FUNC" && $7 != "UND" && $8 ~ /@/ { print $8 }' | sort
}
nodes_of() {
	readelf -V -W "$1" | sed -n '/Version definition/,/Version needs/p' |
		sed -n -e 's/.*Flags: none.*Name: \(.*\)/node \1/p' -e 's/.*Parent 1: \(.*\)/parent \1/p'
}

cc -O2 -Wall -Werror -o "$tmp/refuse" tests/tools/refuse.c -ldl || { bad refuse_build "cc failed"; }
# A sanitizer build's stand-ins need the ASan runtime loaded first in the
# uninstrumented refuse tool.
asan=$(ldd "$LIB/libmlx5.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
for p in mlx5 mlx4 efa mana; do
	list=src/providers/$p.syms
	so="$LIB/lib$p.so.1"
	# 1. the built stand-in exports exactly the list
	sed -e '/^#/d' -e 's/ .*//' "$list" | sort >"$tmp/want"
	syms_of "$so" >"$tmp/got"
	if diff "$tmp/want" "$tmp/got" >"$tmp/d"; then ok "$p: exports the list ($(wc -l <"$tmp/want") functions)"
	else bad "$p: exports the list" "$(head -5 "$tmp/d")"; fi
	# 2. every entry refuses at its own version
	if env ${asan:+LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0} "$tmp/refuse" "$so" "$list" >"$tmp/r"; then ok "$p: every call refuses ($(tail -1 "$tmp/r"))"
	else bad "$p: every call refuses" "$(head -5 "$tmp/r")"; fi
	# 3. the list is the system's library, when rdma-core's is installed
	if [ -e "$SYS/lib$p.so.1" ] && [ -e "/usr/include/infiniband/${p}dv.h" ]; then
		if scripts/provider-syms "$p" "$SYS" >"$tmp/sys" 2>"$tmp/e" &&
		   diff -u "$list" "$tmp/sys" >"$tmp/d"; then
			ok "$p: the list is rdma-core's $(readlink -f "$SYS/lib$p.so.1" | sed 's/.*\.so\.//')"
		else bad "$p: the list is the system's" "$(cat "$tmp/e"; head -8 "$tmp/d")"; fi
		nodes_of "$SYS/lib$p.so.1" >"$tmp/n1"; nodes_of "$so" >"$tmp/n2"
		if diff "$tmp/n1" "$tmp/n2" >"$tmp/d"; then ok "$p: version nodes and parents as the system's ($(grep -c node "$tmp/n1"))"
		else bad "$p: version nodes" "$(head -5 "$tmp/d")"; fi
	else
		skp "$p: compare with the system's library" "lib$p.so.1 or ${p}dv.h not installed"
	fi
done

# 4. every installed ELF file that links a provider library or libibverbs
#    (the providers' own plugins in libibverbs/ excepted: only rdma-core's
#    libibverbs loads those) resolves every symbol at its version against
#    ursa's libraries.
n=0; m=""
for f in $(find /usr/bin /usr/lib/x86_64-linux-gnu /usr/lib/python3/dist-packages -type f \
		\( -name '*.so*' -o -perm -u+x \) -not -path '*/libibverbs/*' 2>/dev/null); do
	readelf -d "$f" 2>/dev/null | grep -q -E 'NEEDED.*\[lib(ibverbs|mlx5|mlx4|efa|mana)\.so\.1\]' || continue
	case "$f" in */libibverbs.so.1*|*/libmlx5.so.1*|*/libmlx4.so.1*|*/libefa.so.1*|*/libmana.so.1*) continue;; esac
	n=$((n + 1))
	# (a plugin's other undefined symbols are its host program's)
	LD_LIBRARY_PATH="$LIB" ldd -r "$f" 2>&1 |
		grep -E 'not found|undefined symbol: (_?ibv_|_?mlx[45]dv_|efadv_|manadv_|verbs_)' >"$tmp/l"
	[ -s "$tmp/l" ] && m="$m $f: $(head -2 "$tmp/l" | tr '\n' ' ')"
done
if [ $n = 0 ]; then skp "installed users resolve" "no installed binary links them"
elif [ -z "$m" ]; then ok "all $n installed users of libibverbs and the providers resolve every symbol"
else bad "installed users resolve" "$m"; fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
