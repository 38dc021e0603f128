#!/bin/sh
# rxe.sh - ursa against the Linux kernel's own RoCEv2: Debian 12's kernel
# with rdma_rxe in a qemu guest (TCG: /dev/kvm here cannot boot stock
# kernels), on a tap device inside a network namespace this script makes,
# and ursa in that namespace. Every program is Debian's, unmodified: in the
# guest with rdma-core's libibverbs and its rxe provider, on the host under
# `ursa run`. Each case runs twice, rxe as server and as client.
#
# Needs root, qemu-system-x86, busybox-static, kmod, cpio (scripts/deps.sh
# interop installs them) and the network to fetch the kernel package once
# (apt-get download; kept in build/interop). `make interop` runs it.
# Prints "N passed, N failed, N skipped".
set -u
BUILD=${BUILD:-build}
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$SRC/$BUILD/interop"
URSA="$SRC/$BUILD/bin/ursa"
NS=ursa_vm_$$
HOSTIP=10.77.9.1 GUESTIP=10.77.9.2
pass=0; fail=0; skip=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" = 0 ]; exit $?; }

for t in qemu-system-x86_64 depmod cpio ip; do
	command -v $t >/dev/null || { skp interop "$t missing (scripts/deps.sh interop)"; finish; }
done
[ "$(id -u)" = 0 ] || { skp interop "needs root (network namespace, tap)"; finish; }
mkdir -p "$WORK"

# --- the guest's kernel and busybox, from Debian's packages (once) -------
if [ ! -f "$WORK/k/.done" ]; then
	( cd "$WORK" && rm -rf k bb ./*.deb &&
	  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}') &&
	  apt-get download -q "$kpkg" busybox-static >/dev/null 2>&1 &&
	  mkdir -p k bb && dpkg-deb -x linux-image-*.deb k && dpkg-deb -x busybox-static_*.deb bb &&
	  depmod -b k "$(ls k/lib/modules)" && touch k/.done ) ||
		{ bad "guest kernel" "could not fetch or unpack linux-image-amd64 / busybox-static"; finish; }
fi
KVER=$(ls "$WORK/k/lib/modules")

# --- the guest's root: busybox, modules, rdma-core's tools and libraries --
root="$WORK/root"
rm -rf "$root" "$WORK"/host.*
mkdir -p "$root/bin" "$root/etc/libibverbs.d" "$root/lib/modules/$KVER"
cp "$WORK/bb/bin/busybox" "$root/bin/"
# what rdma_rxe, rdma_ucm and virtio-net need, and the index depmod made
( cd "$WORK/k/lib/modules/$KVER" &&
  for m in virtio_pci virtio_net rdma_rxe rdma_ucm crc32_generic; do
	grep "/$m.ko:" modules.dep | tr ' ' '\n' | sed 's/:$//'
  done | sort -u | while read -r f; do
	[ -n "$f" ] && mkdir -p "$root/lib/modules/$KVER/$(dirname "$f")" &&
		cp "$f" "$root/lib/modules/$KVER/$f"
  done
  cp modules.dep modules.alias modules.symbols "$root/lib/modules/$KVER/" 2>/dev/null )
progs="ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong ib_write_bw ib_read_bw ib_send_bw
       ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat rping rdma"
libdir=/usr/lib/x86_64-linux-gnu
copy_with_libs() {
	for f in "$@"; do
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
		ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' |
		while read -r l; do
			[ -e "$root$l" ] || { mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"; }
		done
	done
}
for p in $progs; do
	f=$(command -v $p) || { skp interop "$p not installed on the host (scripts/deps.sh interop)"; finish; }
	copy_with_libs "$f"
done
[ -f "$libdir/libibverbs/librxe-rdmav34.so" ] ||
	{ skp interop "rdma-core's rxe provider missing (ibverbs-providers)"; finish; }
copy_with_libs "$libdir/libibverbs/librxe-rdmav34.so"
# dlopen()ed by glibc when a thread exits (rping)
cp -L "$libdir/libgcc_s.so.1" "$root$libdir/" 2>/dev/null ||
	cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root$libdir/"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"

# The cases: "NAME|GUEST-ROLE|PROGRAM AND ARGS" (the peer's address and the
# GID index are added per side). The guest runs its side of every case in
# order; the host does the same; servers wait, clients try until their
# server is up, so the two keep step. Ports differ between cases.
cat >"$WORK/cases" <<'EOF'
rc_pingpong|server|ibv_rc_pingpong -p 18700 -n 100 -s 4096
rc_pingpong|client|ibv_rc_pingpong -p 18701 -n 100 -s 4096
ud_pingpong|server|ibv_ud_pingpong -p 18702 -n 100 -s 512
ud_pingpong|client|ibv_ud_pingpong -p 18703 -n 100 -s 512
ib_send_lat|server|ib_send_lat -F -n 100 -p 18704
ib_send_lat|client|ib_send_lat -F -n 100 -p 18705
ib_write_lat|server|ib_write_lat -F -n 100 -p 18706
ib_write_lat|client|ib_write_lat -F -n 100 -p 18707
ib_read_lat|server|ib_read_lat -F -n 100 -p 18708
ib_read_lat|client|ib_read_lat -F -n 100 -p 18709
ib_atomic_lat|server|ib_atomic_lat -F -n 100 -p 18710
ib_atomic_lat|client|ib_atomic_lat -F -n 100 -p 18711
ib_write_bw|server|ib_write_bw -F -n 200 -p 18712
ib_write_bw|client|ib_write_bw -F -n 200 -p 18713
ib_read_bw|server|ib_read_bw -F -n 200 -p 18714
ib_read_bw|client|ib_read_bw -F -n 200 -p 18715
ib_send_bw|server|ib_send_bw -F -n 200 -p 18716
ib_send_bw|client|ib_send_bw -F -n 200 -p 18717
rping|server|rping -p 18718 -C 20 -V
rping|client|rping -p 18719 -C 20 -V
ib_write_lat_cm|server|ib_write_lat -R -F -n 100 -p 18720
ib_write_lat_cm|client|ib_write_lat -R -F -n 100 -p 18721
ib_send_bw_cm|server|ib_send_bw -R -F -n 200 -p 18722
ib_send_bw_cm|client|ib_send_bw -R -F -n 200 -p 18723
EOF
# URSA_INTEROP_CASES: an egrep pattern choosing some (debugging)
if [ -n "${URSA_INTEROP_CASES:-}" ]; then
	grep -E "$URSA_INTEROP_CASES" "$WORK/cases" >"$WORK/cases.sel"
	mv "$WORK/cases.sel" "$WORK/cases"
fi
cp "$WORK/cases" "$root/cases"
# args SIDE ROLE CMD PEER GID: a program's command line for one side;
# NOPEER: what a client says when its server is not up yet (it tries again)
cat >"$root/args.sh" <<'EOF'
NOPEER="Couldn't connect\\|Unable to init the socket\\|REJECTED\\|Unable to perform rdma_client"
args() {
	side=$1 role=$2 cmd=$3 peer=$4 gid=$5
	case "$cmd" in
	rping*) [ $role = server ] && echo "$cmd -s -a 0.0.0.0" || echo "$cmd -c -a $peer";;
	ibv_*) [ $role = server ] && echo "$cmd -g $gid" || echo "$cmd -g $gid $peer";;
	*) [ $role = server ] && echo "$cmd -x $gid" || echo "$cmd -x $gid $peer";;
	esac
}
EOF
cp "$root/args.sh" "$WORK/args.sh"
cat >"$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/usr/sbin:/sbin
mkdir -p /proc /sys /dev /tmp /run
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
for m in virtio_pci virtio_net crc32_generic rdma_rxe rdma_ucm; do modprobe \$m; done
ip link set lo up; ip link set eth0 up; ip addr add $GUESTIP/24 dev eth0
rdma link add rxe0 type rxe netdev eth0
# the RoCE v2 GID of our address
g=""
for i in 0 1 2 3 4 5 6 7; do
	[ "\$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/\$i 2>/dev/null)" = "RoCE v2" ] &&
	grep -q ffff:0a4d:0902 /sys/class/infiniband/rxe0/ports/1/gids/\$i && { g=\$i; break; }
done
echo "URSA-GUEST-READY gid=\$g \$(ibv_devinfo | grep -c PORT_ACTIVE) active port"
. /args.sh
n=0
while IFS='|' read -r name role cmd; do
	n=\$((n + 1))
	a=\$(args guest \$role "\$cmd" $HOSTIP \$g)
	if [ \$role = server ]; then
		timeout 120 \$a >/tmp/out 2>&1; rc=\$?
	else
		t=0
		while :; do
			timeout 120 \$a >/tmp/out 2>&1; rc=\$?
			[ \$rc = 0 ] || ! grep -q "\$NOPEER" /tmp/out && break
			t=\$((t + 1)); [ \$t -ge 60 ] && break; sleep 1
		done
	fi
	echo "URSA-GUEST-CASE \$n \$name \$role rc=\$rc \$(tail -n 2 /tmp/out | tr '\n' ' ')"
done </cases
echo URSA-GUEST-DONE
poweroff -f
EOF
chmod +x "$root/init"
( cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 ) >"$WORK/initrd.gz" ||
	{ bad "guest root" "cpio failed"; finish; }

# --- the host: a namespace with the tap, the guest on it ------------------
cleanup() {
	[ -n "${qpid:-}" ] && kill $qpid 2>/dev/null
	ip netns del $NS 2>/dev/null
}
trap cleanup EXIT
ip netns add $NS && ip -n $NS link set lo up &&
	ip -n $NS tuntap add dev tap0 mode tap && ip -n $NS addr add $HOSTIP/24 dev tap0 &&
	ip -n $NS link set tap0 up || { bad netns "could not make the namespace and tap"; finish; }
ip netns exec $NS qemu-system-x86_64 -machine accel=tcg -m 512 -smp 1 -nographic -no-reboot \
	-kernel "$WORK/k/boot/vmlinuz-$KVER" -initrd "$WORK/initrd.gz" \
	-append "console=ttyS0 quiet panic=-1" \
	-netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
	-device virtio-net-pci,netdev=n0 >"$WORK/console.log" 2>&1 &
qpid=$!
t0=$(date +%s)
until grep -q URSA-GUEST-READY "$WORK/console.log" 2>/dev/null; do
	if ! kill -0 $qpid 2>/dev/null || [ $(($(date +%s) - t0)) -gt 300 ]; then
		bad "guest boot" "no READY within 300 s: $(tail -5 "$WORK/console.log" | tr '\n' '|')"; finish
	fi
	sleep 1
done
ready=$(grep URSA-GUEST-READY "$WORK/console.log" | tr -d '\r')
ggid=${ready#*gid=}; ggid=${ggid%% *}
[ -n "$ggid" ] && ok "rxe guest up in $(($(date +%s) - t0)) s (rdma_rxe on virtio-net, RoCE v2 GID $ggid)" ||
	{ bad "rxe in the guest" "$ready"; finish; }

# the host side of every case, in order, under ursa run
. "$WORK/args.sh"
n=0
while IFS='|' read -r name grole cmd; do
	n=$((n + 1))
	hrole=server; [ $grole = server ] && hrole=client
	a=$(args host $hrole "$cmd" $GUESTIP 0)
	if [ $hrole = server ]; then
		ip netns exec $NS timeout 120 "$URSA" run -- $a >"$WORK/host.$n" 2>&1 </dev/null; hrc=$?
	else
		t=0
		while :; do
			ip netns exec $NS timeout 120 "$URSA" run -- $a >"$WORK/try" 2>&1 </dev/null; hrc=$?
			cat "$WORK/try" >>"$WORK/host.$n.all"
			cp "$WORK/try" "$WORK/host.$n"
			[ $hrc = 0 ] || ! grep -q "$NOPEER" "$WORK/try" && break
			t=$((t + 1)); [ $t -ge 60 ] && break; sleep 1
		done
	fi
	# the guest's word on the same case
	for _ in $(seq 150); do
		grep -q "URSA-GUEST-CASE $n " "$WORK/console.log" && break
		sleep 1
	done
	g=$(grep "URSA-GUEST-CASE $n " "$WORK/console.log" | tr -d '\r')
	what="$name, rxe $grole"
	if [ $hrc = 0 ] && echo "$g" | grep -q " rc=0 "; then
		ok "$what ($(grep -E '^ *[0-9]+ +[0-9]+ |iters in' "$WORK/host.$n" | tail -n 1 | tr -s ' \t' ' ' | cut -c1-70))"
	else
		bad "$what" "ursa rc $hrc: $(tail -n 2 "$WORK/host.$n" | tr '\n' ' ') / rxe: ${g:-no word}"
	fi
done <"$WORK/cases"
finish
