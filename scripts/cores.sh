#!/bin/sh
# cores.sh DIR - the backtraces of every thread of each core file in DIR
# (CI's crash report: .ci/run). Prints nothing when there is none.
dir=${1:-/tmp/ursa-cores}
for c in "$dir"/core.*; do
	[ -e "$c" ] || continue
	exe=$(file -b "$c" 2>/dev/null | sed -n "s/.*execfn: '\([^']*\)'.*/\1/p")
	[ -n "$exe" ] || exe=$(command -v "$(basename "$c" | cut -d. -f2)")
	echo "== core $c ($exe)"
	if command -v gdb >/dev/null 2>&1 && [ -n "$exe" ]; then
		gdb -q -batch -ex 'thread apply all bt 30' \
			"$exe" "$c" 2>&1 | grep -v '^\[New LWP\|^warning: ' | head -300
	else
		echo "(no gdb or no executable: core kept)"
	fi
done
exit 0
