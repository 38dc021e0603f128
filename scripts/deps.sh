#!/bin/sh
# deps.sh - make sure the Debian packages ursa needs are installed.
# As root: installs what is missing with apt-get. Otherwise: prints the
# exact apt-get line and fails.
#   usage: scripts/deps.sh build|test|bench|interop
# bench adds the peers and plotting tool of the benchmark report; they are
# optional there (a missing one is noted in the report), so failing to
# install them only warns.
set -e
need="gcc make libc6-dev libibverbs-dev librdmacm-dev"
if [ "$1" = test ] || [ "$1" = bench ] || [ "$1" = interop ]; then
	need="$need ibverbs-utils perftest rdmacm-utils binutils iproute2 procps iptables tshark"
	# the frameworks that tests/scripts/frameworks.sh runs on ursa
	need="$need ucx-utils libucx0 openmpi-bin libopenmpi-dev mpich libmpich-dev"
	need="$need libfabric-bin python3-pyverbs fio qperf ethtool"
fi
# the kernel's Soft-RoCE in a guest (tests/interop/rxe.sh; the kernel and
# busybox packages themselves are fetched there with apt-get download)
[ "$1" = interop ] && need="$need qemu-system-x86 kmod cpio ibverbs-providers"
optional=""
[ "$1" = bench ] && optional="gnuplot-nox redis-server redis-tools iperf3 sockperf"

missing_of() {
	m=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" ||
			m="$m $p"
	done
	echo "$m"
}
# shellcheck disable=SC2086
missing=$(missing_of $need)
# shellcheck disable=SC2086
missing_opt=$(missing_of $optional)
[ -z "$missing$missing_opt" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	[ -n "$missing_opt" ] && echo "ursa: optional (benchmark peers):$missing_opt" >&2
	[ -z "$missing" ] && exit 0
	echo "ursa: missing Debian packages:$missing" >&2
	echo "ursa: run: sudo apt-get install -y$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ -n "$missing" ]; then
	echo "ursa: installing:$missing"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ -n "$missing_opt" ]; then
	echo "ursa: installing (optional):$missing_opt"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing_opt >/dev/null ||
		echo "ursa: could not install$missing_opt; the benchmark report will note what is missing" >&2
fi
