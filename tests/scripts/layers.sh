#!/bin/sh
# layers.sh - the layering of src/ as docs/design.md ("Layers") draws it:
#   util <- proto <- core <- transport <- engine <- verbs;  rdmacm on verbs
# Each directory may include (by "../DIR/") only the layers below it, and
# core's objects call no function defined above core (it reaches the
# transports and the engine through core/hooks.h). Every transport sits
# below the engine: no file of src/transport includes an engine header,
# directly or through another, and no transport object calls a function
# the engine defines (the engine's up-calls are registered in struct
# ursa_udp_up, udp.h, and struct ursa_shm_up, shm.h).
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
	transport) echo "util proto core include";;
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

# calls_into "CALLERS" "DEFINERS": the calls of the caller objects to
# functions the definer objects define, as "caller.o->symbol ..."
calls_into() {
	defined=$(nm --defined-only $2 2>/dev/null |
		awk 'NF == 3 && $2 ~ /[TtDdBbRr]/ {print $3}' | sort -u)
	for o in $1; do
		for s in $(nm -u "$o" | awk '{print $2}'); do
			if echo "$defined" | grep -qx "$s"; then
				printf ' %s->%s' "$(basename "$o")" "$s"
			fi
		done
	done
}

# core calls nothing defined above it (the objects of the build)
obj="$BUILD/obj/src"
if [ -d "$obj/core" ] && command -v nm >/dev/null; then
	calls=$(calls_into "$obj/core/*.o" \
		"$obj/engine/*.o $obj/transport/*.o $obj/verbs/*.o")
	if [ -z "$calls" ]; then
		ok "core's objects call nothing above core"
	else
		bad "core calls up" "$calls"
	fi
else
	bad "core's objects" "no $obj/core (build first)"
fi

# the transports below the engine: headers (what the compiler reads, so an
# engine header reached through another counts) and calls
cc=${CC:-cc}
for f in src/transport/*.c; do
	deps=$($cc -MM -D_GNU_SOURCE "$f" 2>/dev/null)
	if [ -z "$deps" ]; then
		bad "$f's headers" "$cc -MM failed"
	elif echo "$deps" | tr ' ' '\n' | grep -q '/engine/'; then
		bad "$f includes an engine header" "$(echo "$deps" | tr ' ' '\n' | grep '/engine/' | tr '\n' ' ')"
	else
		ok "$f includes no engine header"
	fi
done
if [ -d "$obj/engine" ] && command -v nm >/dev/null; then
	calls=$(calls_into "$obj/transport/*.o" "$obj/engine/*.o")
	if [ -z "$calls" ]; then
		ok "the transports' objects call nothing the engine defines"
	else
		bad "a transport calls the engine" "$calls"
	fi
else
	bad "the transports' objects" "no $obj/engine (build first)"
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
