#!/bin/sh
# isolation.sh - users of one host stay apart. Two real users are created
# (and removed after): a victim runs a checked ibv_rc_pingpong pair while
# an attacker, knowing no key, goes at the victim's QP sockets with
# tests/tools/shm_attack.c: hellos forging the source QPN, hellos from a
# QPN of its own (which must get neither the MR table nor a control page
# it can write or resize), channel memfds it could truncate, and hundreds
# of held connections. The victim must finish with its data checked, keep
# its descriptors, start new QPs meanwhile, and count what it refused; and
# the two users must still reach each other on purpose. Between two
# network-namespace hosts, the victim user's RoCEv2 QP works through root's
# processes that hold UDP 4791, while the attacker squats the forwarding
# socket names of the next pids. Needs root.
# Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
LIB="$(cd "$BUILD/lib" && pwd)"
URSA="$(cd "$BUILD/bin" && pwd)/ursa"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
pass=0; fail=0; skip=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
done_() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" = 0 ]; exit $?; }
if [ "$(id -u)" != 0 ] || ! command -v useradd >/dev/null || ! command -v setpriv >/dev/null; then
	echo "skip isolation: needs root, useradd and setpriv"; skip=1; done_
fi
tmp=$(mktemp -d); chmod 755 "$tmp"
V=ursav$$; A=ursaa$$
cleanup() {
	pkill -u $V 2>/dev/null; pkill -u $A 2>/dev/null; sleep 0.2
	pkill -9 -u $V 2>/dev/null; pkill -9 -u $A 2>/dev/null
	userdel $V 2>/dev/null; userdel $A 2>/dev/null
	rm -rf "$tmp" /tmp/ursa-"$vu" /tmp/ursa-"$au"
}
trap cleanup EXIT
useradd -M -N -d /nonexistent -s /usr/sbin/nologin $V &&
	useradd -M -N -d /nonexistent -s /usr/sbin/nologin $A || { bad useradd "failed"; done_; }
vu=$(id -u $V); au=$(id -u $A)
# as USER CMD...: a process of that user, with nothing of root's
# environment that would point it at root's files
as() {
	u=$1; shift
	setpriv --reuid="$(id -u "$u")" --regid="$(id -g "$u")" --clear-groups \
		env -u XDG_RUNTIME_DIR HOME=/tmp "$@"
}
if ! as $V test -r "$LIB/libibverbs.so.1"; then
	echo "skip isolation: $LIB is not readable by other users"; skip=1; done_
fi
asan=$(ldd "$LIB/libibverbs.so.1" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
	RUN="env LD_LIBRARY_PATH=$LIB LD_PRELOAD=$asan:$LIB/libursa-preload.so ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"
else
	RUN="$URSA run --"
fi
cc -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$SRC/include" -o "$tmp/atk" \
	"$SRC/tests/tools/shm_attack.c" || { bad "shm_attack" "does not build"; done_; }

# The victim: a long checked ping-pong between two of its processes.
N=300000
as $V env URSA_STATS=1 $RUN timeout 120 ibv_rc_pingpong -g 0 -c -p 18661 -n $N >"$tmp/vs" 2>&1 &
vs=$!
sleep 0.5
as $V env URSA_STATS=1 $RUN timeout 120 ibv_rc_pingpong -g 0 -c -p 18661 -n $N 127.0.0.1 >"$tmp/vc" 2>&1 &
vc=$!
# its QPNs, as any user sees them (the listening sockets' names)
qpns=""
for _ in $(seq 50); do
	qpns=$(as $A "$tmp/atk" list | tr '\n' ' ')
	[ "$(echo $qpns | wc -w)" -ge 2 ] && break
	sleep 0.1
done
set -- $qpns
if [ $# -lt 2 ]; then
	bad "the victim's QPs" "not listed: '$qpns'"
else
	q1=$1; q2=$2
	out=$(as $A "$tmp/atk" forge $q1 $q2; as $A "$tmp/atk" forge $q2 $q1)
	[ "$(echo "$out" | grep -c '^ok ')" = 2 ] && ok "another user's hellos forging the peer's QPN are refused" ||
		bad "forged hellos" "$out"
	out=$(as $A "$tmp/atk" own $q1; as $A "$tmp/atk" own $q2)
	[ "$(echo "$out" | grep -c '^ok ')" = 2 ] &&
		ok "another user's hello from its own QPN gets no MR table and a control page it cannot write or resize" ||
		bad "hello from an owned QPN" "$out"
	out=$(as $A "$tmp/atk" unsealed $q1; as $A "$tmp/atk" unsealed $q2)
	[ "$(echo "$out" | grep -c '^ok ')" = 2 ] && ok "a channel memfd not sealed against truncation is refused" ||
		bad "unsealed channel" "$out"
fi
wait $vc; rc=$?
wait $vs; rs=$?
if [ $rc = 0 ] && [ $rs = 0 ] && grep -q "$N iters" "$tmp/vc" && grep -q "$N iters" "$tmp/vs"; then
	ok "the victim's checked ping-pong ($N iterations) finished"
else
	bad "the victim's ping-pong" "client $rc server $rs: $(tail -n 3 "$tmp/vc" "$tmp/vs" | tr '\n' ' ')"
fi
refused=$(sed -n 's/.*refused: channels \([0-9]*\),.*/\1/p' "$tmp/vs" "$tmp/vc" | awk '{s += $1} END {print s + 0}')
[ "$refused" -ge 4 ] && ok "the victim counted $refused refused channels (ursa stats)" ||
	bad "refusals counted" "$refused"

# Descriptor exhaustion: a victim server whose QP waits for its client;
# the attacker holds 400 connections to it past the hello deadline; then
# the client comes and the pair runs.
as $A "$tmp/atk" list >"$tmp/before"
as $V $RUN timeout 60 ibv_rc_pingpong -g 0 -c -p 18662 -n 20000 >"$tmp/v2s" 2>&1 &
v2=$!
q3=""
for _ in $(seq 50); do
	q3=$(as $A "$tmp/atk" list | grep -vxFf "$tmp/before" | head -1)
	[ -n "$q3" ] && break
	sleep 0.1
done
vpid=$(pgrep -u $V -f "ibv_rc_pingpong.*-p 18662" | head -1)
fd0=$(ls /proc/$vpid/fd 2>/dev/null | wc -l)
as $A "$tmp/atk" hold "$q3" 400 >"$tmp/hold" 2>&1 &
hp=$!
sleep 3	# past the hello deadline
fd1=$(ls /proc/$vpid/fd 2>/dev/null | wc -l)
if [ -n "$q3" ] && kill -0 "$vpid" 2>/dev/null && [ "$fd0" -gt 0 ] && [ "$fd1" -le $((fd0 + 20)) ]; then
	ok "400 connections held to a waiting QP cost the victim $((fd1 - fd0)) descriptors ($(cat "$tmp/hold"))"
else
	bad "held connections" "qp '$q3' pid '$vpid' fds $fd0 -> $fd1 ($(cat "$tmp/hold"))"
fi
as $V $RUN timeout 60 ibv_rc_pingpong -g 0 -c -p 18662 -n 20000 127.0.0.1 >"$tmp/v2c" 2>&1; r2=$?
wait $v2; r2s=$?
[ $r2 = 0 ] && [ $r2s = 0 ] && grep -q "20000 iters" "$tmp/v2c" &&
	ok "then its client comes and the pair runs, checked" ||
	bad "the pair after the held connections" "client $r2 server $r2s: $(tail -n 2 "$tmp/v2c")"
kill $hp 2>/dev/null
# Two users on purpose: a server of one, a client of the other, data checked
# (through the ring: cross-memory attach is not allowed between them).
as $V $RUN timeout 60 ibv_rc_pingpong -g 0 -c -p 18663 -n 5000 >"$tmp/xs" 2>&1 &
xs=$!
sleep 0.5
as $A $RUN timeout 60 ibv_rc_pingpong -g 0 -c -p 18663 -n 5000 127.0.0.1 >"$tmp/xc" 2>&1; xrc=$?
wait $xs; xrs=$?
[ $xrc = 0 ] && [ $xrs = 0 ] && grep -q "5000 iters" "$tmp/xc" &&
	ok "two users' QPs reach each other on purpose (checked ping-pong)" ||
	bad "cross-user pair" "client $xrc server $xrs: $(tail -n 2 "$tmp/xc" "$tmp/xs" | tr '\n' ' ')"

# rdma_cm: the connection sockets' names show every comm ID to every user
# (/proc/net/unix), so another user forges DREQs and REJs for all of them
# (tests/tools/cm_forge.c); the victim's rping connection must live on.
# The same forgeries from the victim's own user end a connection: they
# would work, if the CM took them from anyone.
if command -v rping >/dev/null &&
   cc -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$SRC/include" -o "$tmp/cmf" \
	"$SRC/tests/tools/cm_forge.c" "$SRC/src/proto/cm.c"; then
	ips="127.0.0.1 $(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v : | tr '\n' ' ')"
	cm_victim() {	# PORT FORGER: a victim pair, a forger; the pings done
		as $V $RUN timeout 60 rping -s -a 127.0.0.1 -p $1 -C 10000 >"$tmp/rs" 2>&1 &
		sleep 0.5
		before=$(grep -c '@ursa/cm/c/' /proc/net/unix)
		as $V $RUN timeout 60 rping -c -a 127.0.0.1 -p $1 -C 10000 -v >"$tmp/rc" 2>&1 &
		rcp=$!
		for _ in $(seq 50); do
			[ "$(grep -c '@ursa/cm/c/' /proc/net/unix)" -ge $((before + 2)) ] && break
			sleep 0.1
		done
		as $2 "$tmp/cmf" $ips >"$tmp/forge" 2>&1
		wait $rcp
		pings=$(grep -c 'ping data' "$tmp/rc")
		pkill -u $V -f "rping -s -a 127.0.0.1 -p $1" 2>/dev/null
	}
	cm_victim 18664 $A
	if [ "$pings" = 10000 ] && grep -q '[1-9][0-9]* forged' "$tmp/forge"; then
		ok "another user's forged DREQs and REJs do not end an rdma_cm connection ($(cat "$tmp/forge"))"
	else bad "forged CM messages from another user" "$pings of 10000 pings: $(tail -2 "$tmp/rc" | tr '\n' '|') forge: $(cat "$tmp/forge")"; fi
	cm_victim 18665 $V
	if [ "$pings" -lt 10000 ]; then
		ok "the same forgeries from the victim's own user end it (after $pings pings)"
	else bad "forged CM messages from the victim's user" "the connection lived: $(cat "$tmp/forge")"; fi
fi

# RoCEv2 with two users on one host: the port's reuseport group belongs to
# the first user's processes (the kernel keeps groups per user); the
# other user's processes send from their own sockets and receive through
# the first user's forwarding, whose endpoints are checked by credentials.
if ip netns add ursa_probe_$$ 2>/dev/null; then
	ip netns del ursa_probe_$$
	. "$SRC/tests/scripts/netns.inc"
	trap 'netns_down; cleanup' EXIT
	if netns_up; then
		# root's ursa process on h1 holds 4791 (a server waiting for a
		# client that comes last)
		ip netns exec $H1 $RUN timeout 60 ibv_rc_pingpong -g 0 -p 18670 -n 100 >"$tmp/hold1" 2>&1 &
		holder=$!
		sleep 0.5
		# the attacker holds the forwarding names of the next pids
		next=$(($(cat /proc/sys/kernel/ns_last_pid) + 1))
		ip netns exec $H1 setpriv --reuid=$au --regid="$(id -g $A)" --clear-groups \
			"$tmp/atk" squat $next 400 >"$tmp/squat" 2>&1 &
		sq=$!
		sleep 0.3
		ip netns exec $H2 $RUN timeout 60 ibv_rc_pingpong -g 0 -c -p 18671 -n 3000 >"$tmp/rs" 2>&1 &
		rsp=$!
		sleep 0.5
		ip netns exec $H1 setpriv --reuid=$vu --regid="$(id -g $V)" --clear-groups \
			env -u XDG_RUNTIME_DIR HOME=/tmp URSA_STATS=1 URSA_LOG=1 $RUN timeout 60 \
			ibv_rc_pingpong -g 0 -c -p 18671 -n 3000 $IP2 >"$tmp/rc" 2>&1; rrc=$?
		wait $rsp; rrs=$?
		vpid=$(sed -n 's/^ursa stats: pid \([0-9]*\) RoCEv2.*/\1/p' "$tmp/rc" | head -1)
		kill $sq 2>/dev/null
		if [ $rrc = 0 ] && [ $rrs = 0 ] && grep -q "3000 iters" "$tmp/rc" &&
		   [ "${vpid:-0}" -ge $next ] && [ "$vpid" -lt $((next + 400)) ]; then
			ok "a second user's RoCEv2 QP works through the first user's forwarding, while a third user squats its forwarding name ($(cat "$tmp/squat"); pid $vpid)"
		else
			bad "second user over RoCEv2" "client $rrc server $rrs, pid '$vpid' (squatted from $next): $(tail -n 3 "$tmp/rc" | tr '\n' ' ')"
		fi
		# a server of the victim user that waits meanwhile; when root's
		# holder is gone, it takes the port itself (nobody forwards now)
		ip netns exec $H1 setpriv --reuid=$vu --regid="$(id -g $V)" --clear-groups \
			env -u XDG_RUNTIME_DIR HOME=/tmp URSA_LOG=1 $RUN timeout 60 \
			ibv_rc_pingpong -g 0 -c -p 18672 -n 2000 >"$tmp/ls" 2>&1 &
		late=$!
		sleep 0.5
		ip netns exec $H1 $RUN timeout 20 ibv_rc_pingpong -g 0 -p 18670 -n 100 127.0.0.1 >/dev/null 2>&1
		wait $holder
		sleep 2
		ip netns exec $H2 $RUN timeout 30 ibv_rc_pingpong -g 0 -c -p 18672 -n 2000 $IP1 >"$tmp/lc" 2>&1; lrc=$?
		wait $late; lrs=$?
		if [ $lrc = 0 ] && [ $lrs = 0 ] && grep -q "free again" "$tmp/ls"; then
			ok "when the port's holders are gone, the second user's waiting QP takes the port and is reached"
		else
			bad "port taken over" "client $lrc server $lrs: $(tail -n 3 "$tmp/ls" | tr '\n' ' ')"
		fi
	else
		bad netns "could not build the namespaces"
	fi
fi
done_
