#!/bin/sh
# layers.sh - the layering of src/ as docs/design.md ("Layers") draws it:
#   util <- proto <- core <- transport, engine <- verbs;  rdmacm on verbs
# Each directory may include (by "../DIR/") only the layers below it, and
# core's objects call no function defined above core (it reaches the
# transports and the engine through core/hooks.h). One cycle is still
# allowed and named here: engine and transport include and call each other
# (issue 22: the RC engine in role files, transports under an ops table).
# Also: every URSA_* variable is read in src/util/config.c alone.
# Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

allowed() { # the layers DIR may include
	case $1 in
	util|preload|providers) echo "";;
	proto) echo "util";;
	core) echo "util proto";;
	transport) echo "util proto core engine include";;
	engine) echo "util proto core transport include";;
	verbs) echo "util proto core engine transport include";;
	rdmacm) echo "util proto include";;
	*) echo "?";;
	esac
}

for dir in src/*/; do
	d=$(basename "$dir")
	ok_layers=$(allowed "$d")
	if [ "$ok_layers" = "?" ]; then
		bad "layer $d" "not in the layer list of tests/scripts/layers.sh"
		continue
	fi
	wrong=""
	for f in "$dir"*.c "$dir"*.h; do
		[ -e "$f" ] || continue
		for inc in $(sed -n 's|^#include "\.\./\(\.\./\)\{0,1\}\([a-z_]*\)/.*|\2|p' "$f"); do
			case " $ok_layers " in
			*" $inc "*) ;;
			*) wrong="$wrong $(basename "$f")->$inc";;
			esac
		done
	done
	if [ -z "$wrong" ]; then
		ok "src/$d includes only: ${ok_layers:-nothing above it}"
	else
		bad "src/$d includes a layer above it" "$wrong"
	fi
done

# core calls nothing defined above it (the objects of the build)
obj="$BUILD/obj/src"
if [ -d "$obj/core" ] && command -v nm >/dev/null; then
	above=$(nm --defined-only "$obj"/engine/*.o "$obj"/transport/*.o "$obj"/verbs/*.o 2>/dev/null |
		awk 'NF == 3 && $2 ~ /[TtDdBbRr]/ {print $3}' | sort -u)
	calls=""
	for o in "$obj"/core/*.o; do
		for s in $(nm -u "$o" | awk '{print $2}'); do
			if echo "$above" | grep -qx "$s"; then
				calls="$calls $(basename "$o")->$s"
			fi
		done
	done
	if [ -z "$calls" ]; then
		ok "core's objects call nothing above core"
	else
		bad "core calls up" "$calls"
	fi
else
	bad "core's objects" "no $obj/core (build first)"
fi

# URSA_* read in one place
reads=$(grep -rln 'getenv("URSA_' src --include=*.c | grep -v -e '^src/util/config.c$' -e '^src/preload/')
if [ -z "$reads" ]; then
	ok "URSA_* variables are read in src/util/config.c only"
else
	bad "URSA_* read outside src/util/config.c" "$(echo $reads)"
fi
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
