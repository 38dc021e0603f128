#!/bin/sh
# deps.sh - make sure the Debian packages ursa needs are installed.
# As root: installs what is missing with apt-get. Otherwise: prints the
# exact apt-get line and fails.
#   usage: scripts/deps.sh build|test|bench
set -e
need="gcc make libc6-dev libibverbs-dev"
if [ "$1" = test ] || [ "$1" = bench ]; then
	need="$need ibverbs-utils perftest binutils iproute2 procps iptables tshark"
fi
if [ "$1" = bench ]; then
	# the peers and the plots of the benchmark report (each optional there)
	need="$need gnuplot-nox ucx-utils redis-server redis-tools"
fi
missing=""
for p in $need; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
	echo "ursa: installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
else
	echo "ursa: missing Debian packages:$missing" >&2
	echo "ursa: run: sudo apt-get install -y$missing" >&2
	exit 1
fi
