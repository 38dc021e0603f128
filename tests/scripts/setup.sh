#!/bin/sh
# setup.sh - `ursa setup` makes ursa the device of programs started with
# nothing from ursa in their environment (env -i, as sshd or a service
# starts them), keeps what /etc/ld.so.preload held, is idempotent, and
# `ursa setup --undo` restores the files byte for byte. The real command
# runs as root, in a private mount namespace whose /etc and /usr/local are
# overlays: what it writes is real to the programs inside and never
# reaches the host. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
pass=0; fail=0; skip=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
result() { # count the ok/FAIL lines of file $1, print them
	cat "$1"
	pass=$((pass + $(grep -c '^ok ' "$1"))); fail=$((fail + $(grep -c '^FAIL ' "$1")))
}

# Without root it refuses and says what to do instead.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$URSA" setup 2>&1); rc=$?
	if [ $rc = 1 ] && echo "$out" | grep -q "needs root" && echo "$out" | grep -q "ursa run"; then
		echo "ok   ursa setup as a user: refused (exit 1), points to ursa run"; pass=$((pass + 1))
	else
		echo "FAIL ursa setup as a user: exit $rc: $out"; fail=$((fail + 1))
	fi
fi
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null ||
	! grep -qw overlay /proc/filesystems; then
	echo "skip ursa setup: needs root, mount namespaces and overlayfs"
	echo "$pass passed, $fail failed, 1 skipped"; exit 0
fi

before=$(cat /etc/ld.so.preload 2>/dev/null; echo "[$?]")
mkdir -p "$tmp/eu" "$tmp/ew" "$tmp/uu" "$tmp/uw"
# A sanitizer build's libraries: the programs must not fail on the leaks
# the runtime would report in them at exit.
CLEAN="env -i PATH=/usr/bin:/bin ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"
cat >"$tmp/inner.sh" <<EOF
# (A sanitizer build of ursa itself, once a preload list exists, is not
# the first in its own library list.)
export ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0
ok() { echo "ok   \$1"; }
bad() { echo "FAIL \$1: \$2"; }
mount --make-rprivate / &&
mount -t overlay overlay -o lowerdir=/etc,upperdir=$tmp/eu,workdir=$tmp/ew /etc &&
mount -t overlay overlay -o lowerdir=/usr/local,upperdir=$tmp/uu,workdir=$tmp/uw /usr/local ||
	{ bad overlays "could not mount"; exit 0; }
# An administrator's preload that must survive (a real library: the loader
# complains about a missing one in every process).
admin=\$(ls /lib/x86_64-linux-gnu/libdl.so.2 /usr/lib/*/libdl.so.2 2>/dev/null | head -1)
printf '%s\n' "\$admin" >/etc/ld.so.preload
cp /etc/ld.so.preload $tmp/preload.orig
ls /etc/ld.so.conf.d >$tmp/conf.orig

out=\$("$URSA" setup 2>&1); rc=\$?
[ \$rc = 0 ] && ok "ursa setup: exit 0" || bad "ursa setup" "exit \$rc: \$out"
l=\$($CLEAN ibv_devices 2>&1)
echo "\$l" | grep -q ursa0 && ok "env -i ibv_devices lists ursa0" || bad "env -i ibv_devices" "\$l"
# A verbs program pair started with an empty environment, data checked by
# ibv_rc_pingpong (-c validates the buffer).
$CLEAN timeout 30 ibv_rc_pingpong -g 0 -c -n 200 >$tmp/s 2>&1 &
sleep 0.5
$CLEAN timeout 30 ibv_rc_pingpong -g 0 -c -n 200 localhost >$tmp/c 2>&1; crc=\$?
wait \$!; src=\$?
[ \$crc = 0 ] && [ \$src = 0 ] && grep -q "200 iters" $tmp/c &&
	ok "env -i ibv_rc_pingpong -c -n 200 between two processes" ||
	bad "env -i ibv_rc_pingpong" "client \$crc server \$src: \$(tail -n 2 $tmp/c $tmp/s)"
t=\$($CLEAN sh -c 'cat /sys/class/infiniband/ursa0/ports/1/gid_attrs/types/0; test -c /dev/infiniband/uverbs0 && echo node')
echo "\$t" | grep -q "RoCE v2" && echo "\$t" | grep -q node &&
	ok "env -i: sysfs gid_attrs and /dev/infiniband/uverbs0 visible" || bad "env -i sysfs view" "\$t"
if command -v ucx_info >/dev/null; then
	u=\$($CLEAN ucx_info -d 2>&1 | grep -c "Device: ursa0:1")
	[ "\$u" -gt 0 ] && ok "env -i ucx_info -d lists ursa0:1" || bad "env -i ucx_info -d" "no ursa0:1"
fi
grep -qx "\$admin" /etc/ld.so.preload && ok "the administrator's preload line is kept" ||
	bad "admin preload kept" "\$(cat /etc/ld.so.preload)"
"$URSA" setup >/dev/null 2>&1
n=\$(grep -c ursa-setup/libursa-preload.so /etc/ld.so.preload)
[ "\$n" = 1 ] && ok "ursa setup twice: one preload line" || bad "setup twice" "\$n lines"
# The copies are root's, not the build tree's.
o=\$(stat -c '%U %a' /usr/local/lib/ursa-setup/libursa-preload.so)
[ "\$o" = "root 755" ] && ok "the preloaded library is a root-owned copy (\$o)" || bad "copy owner" "\$o"

out=\$("$URSA" setup --undo 2>&1); rc=\$?
[ \$rc = 0 ] && ok "ursa setup --undo: exit 0" || bad "ursa setup --undo" "exit \$rc: \$out"
cmp -s /etc/ld.so.preload $tmp/preload.orig && ok "undo: /etc/ld.so.preload as before, byte for byte" ||
	bad "undo preload" "\$(cat /etc/ld.so.preload)"
ls /etc/ld.so.conf.d | cmp -s - $tmp/conf.orig && [ ! -e /usr/local/lib/ursa-setup ] &&
	! ldconfig -p | grep -q ursa-setup &&
	ok "undo: ld.so.conf.d, the copies and the loader cache as before" || bad "undo files" "left over"
l=\$($CLEAN ibv_devices 2>&1)
echo "\$l" | grep -q ursa0 && bad "undo: env -i ibv_devices" "still lists ursa0" ||
	ok "undo: env -i ibv_devices no longer finds ursa0"
# Without a preload list of its own, undo removes the one setup created.
rm /etc/ld.so.preload
"$URSA" setup >/dev/null 2>&1 && "$URSA" setup --undo >/dev/null 2>&1
[ ! -e /etc/ld.so.preload ] && ok "undo removes the /etc/ld.so.preload setup created" ||
	bad "undo created list" "\$(cat /etc/ld.so.preload)"
out=\$("$URSA" setup --undo 2>&1); rc=\$?
[ \$rc = 0 ] && echo "\$out" | grep -q "nothing to undo" && ok "undo again: nothing to undo" ||
	bad "undo again" "exit \$rc: \$out"
EOF
unshare -m sh "$tmp/inner.sh" >"$tmp/out" 2>&1
result "$tmp/out"
after=$(cat /etc/ld.so.preload 2>/dev/null; echo "[$?]")
if [ "$before" = "$after" ] && [ ! -e /etc/ld.so.conf.d/00-ursa.conf ] && [ ! -e /usr/local/lib/ursa-setup ]; then
	echo "ok   the host's /etc and /usr/local were never touched"; pass=$((pass + 1))
else
	echo "FAIL the host's files changed"; fail=$((fail + 1))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
