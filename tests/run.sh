#!/bin/sh
# run.sh - run every test binary under a timeout and add up the results.
# Ends with the line "N passed, N failed, N skipped"; exits 1 on any failure.
BUILD=${BUILD:-build}
export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pass=0; fail=0; skip=0; failed_bins=""
log=$(mktemp); trap 'rm -f "$log"' EXIT
for t in "$BUILD"/tests/unit_* "$BUILD"/tests/fuzz_* "$BUILD"/tests/func_* tests/scripts/*.sh; do
	[ -e "$t" ] || continue
	case "$t" in
	*.sh) cmd="sh $t";;
	*/fuzz_pkt) cmd="$t tests/fuzz/corpus/pkt";;
	*/fuzz_resp) cmd="$t tests/fuzz/corpus/resp";;
	*/fuzz_chan) cmd="$t tests/fuzz/corpus/chan";;
	*) cmd="$t";;
	esac
	echo "== $t"
	t0=$(date +%s)
	# Output goes to a file, not a pipe: a stray process holding the
	# pipe open could otherwise stall the runner.
	BUILD="$BUILD" timeout -k 10 900 $cmd >"$log" 2>&1 </dev/null; rc=$?
	cat "$log"
	echo "   ($t: $(($(date +%s) - t0)) s)"
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
	if [ -z "$line" ]; then
		echo "FAIL $t: no result line (exit $rc)"
		fail=$((fail + 1)); failed_bins="$failed_bins $t"; continue
	fi
	p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
	f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
	s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
	pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
	if [ "$f" -ne 0 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; }; then
		[ "$f" -eq 0 ] && fail=$((fail + 1))
		failed_bins="$failed_bins $t"
	fi
done
[ -n "$failed_bins" ] && echo "Tests failed in:$failed_bins"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
