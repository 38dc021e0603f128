#!/bin/sh
# gen.sh - generate a provider stand-in's C source and version script from
# its committed symbol list (see scripts/provider-syms for the format).
#
#   usage: gen.sh <lib>.syms out.c out.map
#
# ursa's device is driven by ursa's libibverbs, not by an mlx5, mlx4, EFA
# or MANA provider. Programs linked against those providers' direct-verbs
# libraries (perftest, UCX, libfabric, pyverbs) still need them to load,
# with every symbol at the version node they were linked against, and then
# ask them only whether the device is theirs. So every entry point answers
# as the real library does for a device it does not drive: a pointer is
# NULL with errno EOPNOTSUPP, an int is EOPNOTSUPP (rdma-core's direct
# verbs return a positive errno), a ssize_t is -1 with errno EOPNOTSUPP, a
# bool is false, a void does nothing.
#
# Version nodes chain in version order, as rdma-core's do (MLX5_1.1
# inherits MLX5_1.0, ...). A name with two versions (mlx5dv_init_obj) gets
# one function per version, bound to each by .symver.
set -e
syms=$1; outc=$2; outmap=$3
lib=$(basename "$syms" .syms)
awk -v lib="$lib" '
BEGIN {
	printf "/* Generated from src/providers/%s.syms by src/providers/gen.sh. */\n", lib
	print "#include <errno.h>"
	print "#include <stdbool.h>"
	print "#include <stddef.h>"
	print "#include <sys/types.h>"
	print ""
	print "#define EXPORT __attribute__((visibility(\"default\")))"
	type["ptr"] = "void *"; type["int"] = "int "; type["bool"] = "bool "
	type["ssize"] = "ssize_t "; type["void"] = "void "
	body["ptr"] = "errno = EOPNOTSUPP; return NULL;"
	body["int"] = "errno = EOPNOTSUPP; return EOPNOTSUPP;"
	body["bool"] = "return false;"
	body["ssize"] = "errno = EOPNOTSUPP; return -1;"
	body["void"] = ""
}
/^#/ || NF == 0 { next }
{
	if (!($2 in type)) { print "gen.sh: bad kind: " $0 > "/dev/stderr"; exit 1 }
	split($1, p, "@"); name = p[1]
	n[name]++; sym[NR] = $1; kind[NR] = $2
}
END {
	for (i = 1; i in sym; i++) {
		split(sym[i], p, "@"); name = p[1]
		fn = name
		if (n[name] > 1) {
			ver = sym[i]; sub(/^[^@]*@@?/, "", ver)
			fn = "ursa_" name "_" ver; gsub(/\./, "_", fn)
			printf "__asm__(\".symver %s, %s\");\n", fn, sym[i]
		}
		printf "EXPORT %s%s(void);\n", type[kind[i]], fn
		printf "EXPORT %s%s(void)\n{\n\t%s\n}\n\n", type[kind[i]], fn, body[kind[i]]
	}
}' "$syms" >"$outc"
# The version script: one node a version, in version order, each
# inheriting the one before.
sed -e '/^#/d' -e '/^$/d' -e 's/ .*//' "$syms" |
	awk -F'@@?' '{ print $2, $1 }' | sort -V -k1,1 -k2 |
	awk -v lib="$lib" '
	BEGIN { printf "/* Generated from src/providers/%s.syms. */\n", lib }
	function close_node() {
		if (cur == "") return
		if (prev == "") print "\tlocal: *;"
		printf "}%s;\n", prev == "" ? "" : " " prev
		prev = cur
	}
	$1 != cur { close_node(); cur = $1; printf "%s {\n\tglobal:\n", cur }
	{ printf "\t\t%s;\n", $2 }
	END { close_node() }' >"$outmap"
