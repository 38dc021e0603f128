// SPDX-License-Identifier: MIT
/*
 * udp.c - the RoCEv2 transport: packets between hosts in UDP datagrams
 * (design in udp.h and docs/design.md). It moves packets and knows the
 * protocol only as far as moving them needs: the process's receive
 * sockets on the RoCEv2 port and each QP's sockets (struct ursa_udp_ep),
 * send batches (sendmmsg, UDP GSO runs with their IPv4 ID fix-ups),
 * receive batches (recvmmsg, GRO runs), the ICRC of what arrives,
 * forwarding to the process of the host that owns a QPN, injected faults
 * and the pcap capture. The protocol (PSNs, ACKs, retransmission, the
 * responder's checks) is the engine's: engine/rc.h. Packets go down
 * through the wire interface of udp.h and come up through ursa_udp_up.
 */
#include "udp.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../include/ursa/ursa.h"
#include "../proto/roce.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
/* (URSA_UDP_ARES, URSA_UDP_RRES, util/limits.h: atomic results saved and
 * READ requests remembered, for duplicates, as many as a peer may have
 * outstanding (max_dest_rd_atomic, IBTA 9.7.5.2.x), and more than a
 * window's pieces of the READs in flight) */

struct ursa_udp_counters ursa_udp_cnt;
struct ursa_udp_up ursa_udp_up;

/* Addresses are GIDs: IPv4 as ::ffff:a.b.c.d, IPv6 as is. */
typedef union ibv_gid addr_t;

/* sockaddr for a GID and port (only the returned length is written: it is
 * built for every packet sent) */
static socklen_t to_sockaddr(const addr_t *g, uint16_t port,
			     struct sockaddr_storage *ss)
{
	if (ursa_gid_v4(g)) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;

		memset(a, 0, sizeof(*a));
		a->sin_family = AF_INET;
		a->sin_port = htons(port);
		memcpy(&a->sin_addr, g->raw + 12, 4);
		return sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;

		memset(a, 0, sizeof(*a));
		a->sin6_family = AF_INET6;
		a->sin6_port = htons(port);
		memcpy(&a->sin6_addr, g->raw, 16);
		return sizeof(*a);
	}
}

/* --- the process's RoCEv2 socket, faults, capture ------------------------- */

static struct {
	pthread_mutex_t lock;	/* start/stop, capture file */
	pthread_mutex_t rx;	/* one receiver at a time */
	int fd, fd6;		/* IPv4 and IPv6 receive sockets */
	int fwd;		/* "@ursa/udp/<pid>": packets other processes
				 * of this host received for our QPs */
	int fwd_ep;		/* epoll set: fwd and its connections, the
				 * receive sockets (one epoll_wait tells a
				 * pass which of them to read) */
	atomic_bool live;	/* RoCEv2 traffic was sent or received */
	int rcvbuf;		/* what the kernel granted the receive socket */
	bool tried;		/* environment read */
	bool socks_tried;	/* sockets opened (again in a forked child) */
	int rebind_fd;		/* port not bound: a timer to try again */
	int users;		/* open contexts (under lock) */
	uint16_t port;
	FILE *pcap;
	/* fault injection (URSA_FAULT): per-mille probabilities */
	unsigned loss, dup, reorder, corrupt, delay;
	uint64_t delay_ns;
	uint64_t rng;
	pthread_mutex_t fault_lock;
	uint8_t held[URSA_UDP_MAX_PKT];	/* held back for reordering */
	size_t held_len;
	int held_fd;
	struct sockaddr_storage held_to;
	socklen_t held_tolen;
} U = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.rx = PTHREAD_MUTEX_INITIALIZER,
	.fault_lock = PTHREAD_MUTEX_INITIALIZER,
	.fd = -1, .fd6 = -1, .fwd = -1, .fwd_ep = -1, .held_fd = -1, .rebind_fd = -1,
	.port = ROCE_UDP_PORT,
};


static uint64_t rnd(void)
{
	/* xorshift64*: the fault decisions replay from URSA_FAULT's seed */
	U.rng ^= U.rng >> 12;
	U.rng ^= U.rng << 25;
	U.rng ^= U.rng >> 27;
	return U.rng * 0x2545f4914f6cdd1dull;
}

static unsigned pm(const char *spec, const char *key)
{
	const char *p = strstr(spec, key);

	if (!p)
		return 0;
	return (unsigned)(strtod(p + strlen(key), NULL) * 10.0); /* % -> per mille */
}

int ursa_udp_fault(const char *s)
{
	const char *seed = s ? strstr(s, "seed=") : NULL;
	const char *dus = s ? strstr(s, "delay_us=") : NULL;

	pthread_mutex_lock(&U.fault_lock);
	U.loss = s ? pm(s, "loss=") : 0;
	U.dup = s ? pm(s, "dup=") : 0;
	U.reorder = s ? pm(s, "reorder=") : 0;
	U.corrupt = s ? pm(s, "corrupt=") : 0;
	U.delay = s ? pm(s, "delay=") : 0;	/* "delay_us=" does not match */
	U.delay_ns = (dus ? strtoull(dus + 9, NULL, 0) : 1000) * 1000ull;
	U.rng = seed ? strtoull(seed + 5, NULL, 0) : 1;
	if (!U.rng)
		U.rng = 1;
	pthread_mutex_unlock(&U.fault_lock);
	ursa_info("fault injection: loss %u/1000, dup %u, reorder %u, corrupt %u, delay %u (%llu us), seed %s",
		  U.loss, U.dup, U.reorder, U.corrupt, U.delay,
		  (unsigned long long)(U.delay_ns / 1000), seed ? seed + 5 : "1");
	return 0;
}

static void pcap_open(const char *path)
{
	struct {
		uint32_t magic;
		uint16_t major, minor;
		int32_t zone;
		uint32_t sigfigs, snaplen, linktype;
	} h = { 0xa1b2c3d4, 2, 4, 0, 0, 65535, 101 /* raw IP */ };

	U.pcap = fopen(path, "we");
	if (!U.pcap) {
		ursa_err("URSA_PCAP=%s: %s", path, strerror(errno));
		return;
	}
	fwrite(&h, sizeof(h), 1, U.pcap);
	fflush(U.pcap);
}

static uint16_t csum16(const uint8_t *p, size_t n)
{
	uint32_t s = 0;

	for (size_t i = 0; i + 1 < n; i += 2)
		s += (uint32_t)(p[i] << 8 | p[i + 1]);
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)~s;
}

/*
 * The IP and UDP headers a datagram of ib_len bytes carries, as Linux sends
 * it from our sockets: IPv4 with ID 0 and DF (unconnected socket, PMTU
 * discovery on), or IPv6. Returns the IP header's length (20 or 40). The
 * fields Linux chooses that we cannot know (TTL, traffic class, flow
 * label, checksums) are the ones the ICRC masks.
 */
static size_t ip_udp(uint8_t ip[40], uint8_t udp[8], const addr_t *src,
		     const addr_t *dst, uint16_t sport, uint16_t dport,
		     size_t ib_len, uint8_t ttl)
{
	uint16_t ul = (uint16_t)(8 + ib_len);
	size_t hl;

	if (ursa_gid_v4(src)) {
		uint16_t tot = (uint16_t)(20 + 8 + ib_len);

		memset(ip, 0, 20);
		ip[0] = 0x45;
		ip[2] = (uint8_t)(tot >> 8);
		ip[3] = (uint8_t)tot;
		ip[6] = 0x40;
		ip[8] = ttl;
		ip[9] = 17;
		memcpy(ip + 12, src->raw + 12, 4);
		memcpy(ip + 16, dst->raw + 12, 4);
		hl = 20;
	} else {
		memset(ip, 0, 40);
		ip[0] = 0x60;
		ip[4] = (uint8_t)(ul >> 8);
		ip[5] = (uint8_t)ul;
		ip[6] = 17;
		ip[7] = ttl;
		memcpy(ip + 8, src->raw, 16);
		memcpy(ip + 24, dst->raw, 16);
		hl = 40;
	}
	udp[0] = (uint8_t)(sport >> 8);
	udp[1] = (uint8_t)sport;
	udp[2] = (uint8_t)(dport >> 8);
	udp[3] = (uint8_t)dport;
	udp[4] = (uint8_t)(ul >> 8);
	udp[5] = (uint8_t)ul;
	udp[6] = udp[7] = 0;
	return hl;
}

uint32_t ursa_udp_icrc_pfx(struct ursa_udp_pfx *c, const addr_t *src,
			   const addr_t *dst, uint16_t sport, size_t ib_len)
{
	uint16_t dport = U.port;

	if (!c->ok || c->len != ib_len || c->sport != sport ||
	    c->dport != dport || memcmp(c->src.raw, src->raw, 16) ||
	    memcmp(c->dst.raw, dst->raw, 16)) {
		uint8_t ip[40], udp[8];
		size_t hl = ip_udp(ip, udp, src, dst, sport, dport, ib_len, 0);

		*c = (struct ursa_udp_pfx){ .src = *src, .dst = *dst,
					 .len = ib_len, .sport = sport,
					 .dport = dport, .ok = true,
					 .reg = roce_icrc_pfx(ip, hl, udp) };
	}
	return c->reg;
}

static void capture(const addr_t *src, const addr_t *dst, uint16_t sport,
		    uint16_t dport, const uint8_t *ib, size_t len)
{
	uint8_t ip[40], udp[8];
	struct timeval tv;
	uint32_t rec[4];
	size_t hl;

	if (!U.pcap)
		return;
	hl = ip_udp(ip, udp, src, dst, sport, dport, len, 64);
	if (hl == 20) {
		uint16_t c = csum16(ip, 20);

		ip[10] = (uint8_t)(c >> 8);
		ip[11] = (uint8_t)c;
	}
	gettimeofday(&tv, NULL);
	rec[0] = (uint32_t)tv.tv_sec;
	rec[1] = (uint32_t)tv.tv_usec;
	rec[2] = rec[3] = (uint32_t)(hl + 8 + len);
	pthread_mutex_lock(&U.lock);
	fwrite(rec, sizeof(rec), 1, U.pcap);
	fwrite(ip, hl, 1, U.pcap);
	fwrite(udp, 8, 1, U.pcap);
	fwrite(ib, len, 1, U.pcap);
	fflush(U.pcap);
	pthread_mutex_unlock(&U.lock);
}

void ursa_udp_seal(uint8_t *ib, size_t len, const addr_t *src,
		   const addr_t *dst, uint16_t sport)
{
	uint8_t ip[40], udp[8];
	size_t hl = ip_udp(ip, udp, src, dst, sport, U.port, len, 64);

	roce_icrc_put(ib + len - 4, roce_icrc(ip, hl, udp, ib, len - 4));
	capture(src, dst, sport, U.port, ib, len);
}

/* --- forwarding between the processes of one host ------------------------
 *
 * The reuseport group hashes each flow to one process's socket, which need
 * not be the process that owns the destination QP. That process is found
 * through the QP's registry socket "@ursa/qp/<qpn>" (transport/shm.c): a
 * connect() to it is answered by the kernel, and SO_PEERCRED names the
 * listener's pid. The packet then goes, with the addresses it arrived
 * with, over a SOCK_SEQPACKET connection to that process's listener
 * "@ursa/udp/<pid>"; the owner checks it like any other packet.
 *
 * Why connections and not one datagram socket: an unconnected AF_UNIX
 * datagram socket queues at most net.unix.max_dgram_qlen (10) datagrams
 * from other sockets, so a burst of a window's packets for a busy owner
 * was mostly dropped, and the go-back-N that followed made it worse. A
 * connection is bounded by bytes (the sender's SO_SNDBUF) instead.
 * Incoming connections live in an epoll set of their own (U.fwd_ep),
 * which every engine watches as one descriptor.
 */
struct fwd_hdr {
	uint32_t magic;
	uint16_t sport, flags;	/* URSA_UDP_RX_* of the packet */
	addr_t src, dst;
};
#define FWD_MAGIC 0x55524657u /* "URFW" */
/*
 * The side sockets, in the epoll set U.fwd_ep: the forwarding listener,
 * its connections, and the QPs' connected receive sockets. An event's
 * data is the descriptor and its kind (never a pointer: a QP may be gone
 * by the time its event is read).
 */
enum { SIDE_FWD = 1, SIDE_RX4 = 2, SIDE_RX6 = 3, SIDE_TIMER = 4 };
#define SIDE(kind, fd) ((uint64_t)(kind) << 32 | (uint32_t)(fd))

static struct {
	pid_t pid;
	int fd;
} fwd_out[URSA_UDP_FWD_OUT];	/* guarded by U.rx (the receiving thread) */
static unsigned fwd_next;

/* "@ursa/udp/<pid>", or "@ursa/udp/<pid>.<k>" when a squatter holds the plain
 * name (URSA_UDP_FWD_NAMES tries; forwarders check the listener's pid). */

static void fwd_name(struct sockaddr_un *sa, socklen_t *len, pid_t pid,
		     int k)
{
	int n;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	n = k ? snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
			 "ursa/udp/%d.%d", (int)pid, k) :
		snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
			 "ursa/udp/%d", (int)pid);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The listener and the epoll set that holds it and what it accepts. */
static int fwd_open(void)
{
	struct sockaddr_un sa;
	socklen_t len;
	struct epoll_event ev = { .events = EPOLLIN };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return -1;
	for (int k = 0; k < URSA_UDP_FWD_NAMES; k++) {
		fwd_name(&sa, &len, getpid(), k);
		if (!bind(fd, (struct sockaddr *)&sa, len))
			break;
		if (errno != EADDRINUSE || k == URSA_UDP_FWD_NAMES - 1) {
			close(fd);
			return -1;
		}
		ursa_info("RoCEv2: another process holds the name of this process's forwarding socket");
	}
	U.fwd_ep = epoll_create1(EPOLL_CLOEXEC);
	ev.data.u64 = SIDE(SIDE_FWD, fd);
	if (U.fwd_ep < 0 || listen(fd, 64) ||
	    epoll_ctl(U.fwd_ep, EPOLL_CTL_ADD, fd, &ev)) {
		close(fd);
		if (U.fwd_ep >= 0)
			close(U.fwd_ep);
		U.fwd_ep = -1;
		return -1;
	}
	return fd;
}

/*
 * pid owning a QPN on this host, or 0. A look-up costs a socket and a
 * connect; packets for QPNs nobody owns must not buy one each (a flood to
 * random QPNs kept a core busy), so QPNs found unowned are remembered for a
 * while, and at most URSA_UDP_LOOKUP_BUDGET look-ups that find nothing are
 * made per URSA_UDP_LOOKUP_WINDOW_NS: past it, a QPN not in the cache is
 * dropped unasked until the window ends (a real flow's first packet may then
 * be lost, and is retransmitted).
 */

static pid_t qpn_owner(uint32_t qpn)
{
	static __thread struct { uint32_t qpn; pid_t pid; uint64_t until; } cache[64];
	static __thread uint64_t window_end;
	static __thread unsigned int misses;
	struct sockaddr_un sa;
	struct ucred cr;
	socklen_t len, cl = sizeof(cr);
	int fd, n;
	unsigned h = (qpn * 2654435761u) >> 26;
	uint64_t now;

	if (cache[h].qpn == qpn && cache[h].pid)
		return cache[h].pid;
	now = ursa_now_ns();
	if (cache[h].qpn == qpn && now < cache[h].until)
		return 0;	/* found unowned a moment ago */
	if (now >= window_end) {
		window_end = now + URSA_UDP_LOOKUP_WINDOW_NS;
		misses = 0;
	}
	if (misses >= URSA_UDP_LOOKUP_BUDGET) {
		atomic_fetch_add(&ursa_udp_cnt.drop_unknown, 1);
		return 0;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "ursa/qp/%06x",
		     qpn & 0xffffff);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
	if (connect(fd, (struct sockaddr *)&sa, len) ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) {
		close(fd);
		misses++;
		cache[h].qpn = qpn;
		cache[h].pid = 0;
		cache[h].until = now + URSA_UDP_UNOWNED_NS;
		return 0;
	}
	close(fd);
	cache[h].qpn = qpn;
	cache[h].pid = cr.pid;
	return cr.pid;
}

/* The connection to pid's listener, made on first use; -1 if none. */
static int fwd_conn(pid_t pid)
{
	struct sockaddr_un sa;
	struct ucred cr = { 0 };
	socklen_t len, cl = sizeof(cr);
	int fd, big = 4 << 20;
	unsigned i;

	for (i = 0; i < URSA_UDP_FWD_OUT; i++)
		if (fwd_out[i].fd > 0 && fwd_out[i].pid == pid)
			return fwd_out[i].fd;
	/* Blocking connect: answered at once by the kernel (or refused).
	 * The name is only a name: any process may have bound the name of
	 * a process that did not exist yet, to be handed its packets. Only
	 * the listener's credentials, from the kernel, say it is pid's. */
	for (int k = 0;; k++) {
		if (k == URSA_UDP_FWD_NAMES)
			return -1;
		fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		fwd_name(&sa, &len, pid, k);
		if (connect(fd, (struct sockaddr *)&sa, len)) {
			close(fd);
			return -1;
		}
		if (!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) &&
		    cr.pid == pid)
			break;
		atomic_fetch_add(&ursa_udp_cnt.drop_fwd_name, 1);
		close(fd);
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	i = fwd_next++ % URSA_UDP_FWD_OUT;
	if (fwd_out[i].fd > 0)
		close(fwd_out[i].fd);
	fwd_out[i].pid = pid;
	fwd_out[i].fd = fd;
	return fd;
}

static void fwd_forget(int fd)
{
	for (unsigned i = 0; i < URSA_UDP_FWD_OUT; i++)
		if (fwd_out[i].fd == fd) {
			close(fd);
			fwd_out[i].fd = 0;
		}
}

/* Hand a packet to the process owning dqpn. False: not another process's
 * QP; true: forwarded, or dropped and counted (the owner is behind). */
static bool forward(const uint8_t *buf, size_t len, uint32_t dqpn,
		    const addr_t *src, uint16_t sport, const addr_t *dst,
		    unsigned flags)
{
	struct fwd_hdr h = { FWD_MAGIC, sport, (uint16_t)flags, *src, *dst };
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)buf, len } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
	pid_t pid = qpn_owner(dqpn);
	int fd;

	if (!pid || pid == getpid() || U.fwd < 0)
		return false;
	for (int attempt = 0; attempt < 2; attempt++) {
		fd = fwd_conn(pid);
		if (fd < 0)
			return false;
		if (sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) ==
		    (ssize_t)(sizeof(h) + len)) {
			atomic_fetch_add(&ursa_udp_cnt.forwarded, 1);
			return true;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
			atomic_fetch_add(&ursa_udp_cnt.drop_fwd, 1);
			return true;
		}
		fwd_forget(fd);	/* the owner went away: try a new connection */
	}
	return false;
}

static void on_packet(uint8_t *buf, size_t len, const addr_t *src,
		      uint16_t sport, const addr_t *dst, bool forwarded,
		      unsigned seg, unsigned flags, struct ursa_qp **run_qp);

static int poll_sock(int fd, bool v6);
static void port_retry(void);

/* Receive from the side sockets (under U.rx). */
static int fwd_poll(void)
{
	static uint8_t buf[URSA_UDP_MAX_PKT + 64 + sizeof(struct fwd_hdr)];
	struct epoll_event ev[16];
	int n, total = 0;

	if (U.fwd_ep < 0)
		return 0;
	n = epoll_wait(U.fwd_ep, ev, 16, 0);
	for (int i = 0; i < n; i++) {
		int fd = (int)(uint32_t)ev[i].data.u64;
		unsigned kind = (unsigned)(ev[i].data.u64 >> 32);

		if (kind == SIDE_TIMER) {
			uint64_t ticks;

			if (read(fd, &ticks, sizeof(ticks)) < 0)
				(void)0;	/* (EAGAIN: another pass read it) */
			port_retry();
			continue;
		}
		if (kind == SIDE_RX4 || kind == SIDE_RX6) {
			total += poll_sock(fd, kind == SIDE_RX6);
			continue;
		}
		if (fd == U.fwd) {
			int c;

			while ((c = accept4(U.fwd, NULL, NULL,
					    SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
				struct epoll_event e = { .events = EPOLLIN,
							 .data.u64 = SIDE(SIDE_FWD, c) };

				if (epoll_ctl(U.fwd_ep, EPOLL_CTL_ADD, c, &e))
					close(c);
			}
			continue;
		}
		for (int k = 0; k < 64; k++) {
			ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
			struct fwd_hdr h;

			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
				/* the sender is gone */
				epoll_ctl(U.fwd_ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				break;
			}
			if (r < 0)
				break;
			if ((size_t)r < sizeof(h))
				continue;
			memcpy(&h, buf, sizeof(h));
			if (h.magic != FWD_MAGIC)
				continue;
			on_packet(buf + sizeof(h), (size_t)r - sizeof(h), &h.src,
				  h.sport, &h.dst, true, 0,
				  h.flags & URSA_UDP_RX_CE, NULL);
			total++;
		}
	}
	return total;
}

/*
 * A connected QP's own receive socket. The reuseport group hashes a flow
 * to any ursa process of the host, and a flow that lands on the wrong one
 * costs a forward, which waits for that process to be scheduled (an idle
 * process sleeps in epoll: tens of microseconds per packet). But a UDP
 * socket connected to the sender's address and port scores above every
 * unconnected socket of the group in the kernel's lookup (Linux 5.4 and
 * later), so once a QP has heard from its peer it gets a socket bound to
 * 4791 and connected to the peer's address and source port, and the rest
 * of the flow comes straight to the owner. Called under U.rx and the
 * QP's lock; if it fails, packets keep arriving through the group.
 */
static struct {
	int fd[256];
	int n;
} grave;			/* receive sockets of gone QPs; under U.lock */

static bool gso_on(void);

/*
 * ECN (RFC 3168): the QPs' packets leave ECN-capable (ECT(0)) and
 * receive sockets report the IP traffic class, so that a router that
 * marks instead of dropping (a RED queue with ecn) tells the responder,
 * which answers with a CNP (engine/rc_recv.c); the IP header's traffic
 * class is masked out of the ICRC (IBTA 7.8, annex A17), so marking it
 * leaves the ICRC good.
 * URSA_ECN=0 turns it off.
 */
static void ecn_opt(int fd, bool v6, int opt4, int opt6, int val)
{
	if (!ursa_cfg()->ecn || fd < 0)
		return;
	if (v6)
		setsockopt(fd, IPPROTO_IPV6, opt6, &val, sizeof(val));
	else
		setsockopt(fd, IPPROTO_IP, opt4, &val, sizeof(val));
}

/* sending: ECT(0); receiving: the traffic class in a control message */
#define ecn_send(fd, v6) ecn_opt(fd, v6, IP_TOS, IPV6_TCLASS, 0x02)
#define ecn_recv(fd, v6) ecn_opt(fd, v6, IP_RECVTOS, IPV6_RECVTCLASS, 1)

/* Receive runs sent with GSO as one buffer (UDP_GRO), when the kernel
 * kept them together; poll_sock cuts them apart. */
static void gro_on(int fd)
{
	int one = 1;

	if (gso_on() && ursa_cfg()->gro)
		setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one));
}

void ursa_udp_ep_connect(struct ursa_udp_ep *u, const addr_t *peer,
			 uint16_t sport)
{
	struct sockaddr_storage ss;
	socklen_t sl = to_sockaddr(peer, sport, &ss);
	bool v6 = !ursa_gid_v4(peer);
	struct epoll_event ev = { .events = EPOLLIN };
	int one = 1, big = 4 << 20, fd = u->rxfd;

	if (U.fwd_ep < 0)
		return;
	if (fd < 0) {
		struct sockaddr_storage any;
		socklen_t al;
		addr_t zero = { .raw = { 0 } };

		if (!v6) {
			zero.raw[10] = zero.raw[11] = 0xff;	/* 0.0.0.0 */
		}
		al = to_sockaddr(&zero, U.port, &any);
		fd = socket(v6 ? AF_INET6 : AF_INET,
			    SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return;
		if (v6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
		if (v6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
		else
			setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
		ecn_recv(fd, v6);
		gro_on(fd);
		ev.data.u64 = SIDE(v6 ? SIDE_RX6 : SIDE_RX4, fd);
		if (bind(fd, (struct sockaddr *)&any, al) ||
		    epoll_ctl(U.fwd_ep, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			return;
		}
		u->rxfd = fd;
	}
	/* (again, if the peer's source port changed) */
	if (!connect(fd, (struct sockaddr *)&ss, sl))
		u->rx_port = sport;
}

void ursa_udp_ep_forget(struct ursa_udp_ep *u)
{
	int *fds[3] = { &u->rxfd, &u->txfd, &u->txfd6 };

	for (unsigned i = 0; i < 3; i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

/* Close the buried sockets; under U.lock (grave.n is read as a hint
 * without it, so it is written atomically). */
static void grave_close(void)
{
	while (grave.n) {
		int n = grave.n - 1;

		close(grave.fd[n]);
		__atomic_store_n(&grave.n, n, __ATOMIC_RELAXED);
	}
}

static void rx_bury(struct ursa_udp_ep *u)
{
	if (u->rxfd < 0)
		return;
	pthread_mutex_lock(&U.lock);
	if (grave.n < (int)(sizeof(grave.fd) / sizeof(grave.fd[0]))) {
		grave.fd[grave.n] = u->rxfd;
		__atomic_store_n(&grave.n, grave.n + 1, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&U.lock);
	} else {
		/* many QPs gone since the last poll: close it ourselves,
		 * when no poll can be reading it */
		pthread_mutex_unlock(&U.lock);
		pthread_mutex_lock(&U.rx);
		close(u->rxfd);
		pthread_mutex_unlock(&U.rx);
	}
	u->rxfd = -1;
}

int ursa_udp_ep_open(struct ursa_udp_ep *ep, uint32_t qpn)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	int one = 1, pmtu = IP_PMTUDISC_DO;

	ep->rxfd = -1;
	/* rxe's choice of source port: 0xC000 + a hash of the QPN */
	ep->sport = (uint16_t)(0xc000 | (((qpn * 0x61c88647u) >> 18) & 0x3fff));
	ep->txfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (ep->txfd >= 0) {
		setsockopt(ep->txfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(ep->txfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		/* DF set and unconnected: Linux sends IP ID 0, which the
		 * ICRC covers (with IP_PMTUDISC_WANT it picks IDs even for
		 * DF packets, which rxe and NICs would drop); packets over
		 * the path MTU go otherwise (ursa_udp_flush) */
		setsockopt(ep->txfd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
		sa.sin_port = htons(ep->sport);
		if (bind(ep->txfd, (struct sockaddr *)&sa, sizeof(sa))) {
			close(ep->txfd);
			ep->txfd = -1;
		}
	}
	ep->txfd6 = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (ep->txfd6 >= 0) {
		struct sockaddr_in6 s6 = { .sin6_family = AF_INET6,
					   .sin6_port = htons(ep->sport) };

		setsockopt(ep->txfd6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		setsockopt(ep->txfd6, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(ep->txfd6, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		if (bind(ep->txfd6, (struct sockaddr *)&s6, sizeof(s6))) {
			close(ep->txfd6);
			ep->txfd6 = -1;
		}
	}
	ecn_send(ep->txfd, false);
	ecn_send(ep->txfd6, true);
	return 0;
}

void ursa_udp_ep_close(struct ursa_udp_ep *ep)
{
	rx_bury(ep);
	if (ep->txfd >= 0)
		close(ep->txfd);
	if (ep->txfd6 >= 0)
		close(ep->txfd6);
	ep->txfd = ep->txfd6 = -1;
}

/* The IPv6 receive socket (IPv6 only: IPv4 has its own). */
static int open6(void)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6,
				   .sin6_port = htons(U.port) };
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int one = 1, big = 8 << 20;

	if (fd < 0)
		return -1;
	setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
	ecn_recv(fd, true);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	gro_on(fd);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The uid owning a socket bound to UDP port, from /proc/net/udp (IPv4)
 * or else /proc/net/udp6; -1 if none is listed. */
static long port_holder(uint16_t port)
{
	static const char *const files[] = { "/proc/net/udp", "/proc/net/udp6" };
	long uid = -1;

	for (unsigned i = 0; i < 2 && uid < 0; i++) {
		FILE *f = fopen(files[i], "re");
		char line[512];

		while (f && uid < 0 && fgets(line, sizeof(line), f)) {
			unsigned int lport;
			unsigned long u;

			/* sl local rem st tx:rx tr:tm retrnsmt uid ...
			 * (addresses in hex, 8 or 32 digits) */
			if (sscanf(line, " %*d: %*x:%x %*x:%*x %*x %*x:%*x %*x:%*x %*x %lu",
				   &lport, &u) == 2 && lport == port)
				uid = (long)u;
		}
		if (f)
			fclose(f);
	}
	return uid;
}

URSA_EXPORT long ursa_roce_port_uid(void)
{
	uint16_t port = U.port;

	if (!port)	/* no context yet: the port one would take */
		port = (uint16_t)ursa_cfg()->udp_port;
	return port_holder(port);
}

int ursa_udp_fd(void)
{
	return U.fd;
}

/* Watch a receive socket in the side epoll set (if there is one). */
static void side_add(int fd, unsigned kind)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = SIDE(kind, fd) };

	if (fd >= 0 && U.fwd_ep >= 0 && epoll_ctl(U.fwd_ep, EPOLL_CTL_ADD, fd, &ev))
		ursa_dbg("RoCEv2: side epoll: %s", strerror(errno));
}

/* Join the port's reuseport group: U.fd (and U.fd6). Under U.lock. 0, or
 * -1 with errno (EADDRINUSE: another user's group, or another program). */
static int port_bind(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(U.port) };
	int one = 1, big = 8 << 20, e;
	socklen_t bl = sizeof(U.rcvbuf);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return -1;
	/* Every ursa process of the namespace joins the port's reuseport
	 * group; the kernel spreads flows over them and a packet for another
	 * process's QP is forwarded to it. */
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	ecn_recv(fd, false);
	if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &U.rcvbuf, &bl))
		U.rcvbuf = 0;
	gro_on(fd);
	U.fd = fd;
	U.fd6 = open6();
	return 0;
}

/* A process that could not bind the port asks again every URSA_UDP_REBIND_NS:
 * when the holders are gone, nobody forwards any more. Called from the
 * receive pass (under U.rx). */
static void port_retry(void)
{
	pthread_mutex_lock(&U.lock);
	if (U.fd < 0 && U.users > 0 && port_bind() == 0) {
		side_add(U.fd, SIDE_RX4);
		side_add(U.fd6, SIDE_RX6);
		if (U.rebind_fd >= 0) {
			epoll_ctl(U.fwd_ep, EPOLL_CTL_DEL, U.rebind_fd, NULL);
			close(U.rebind_fd);
			U.rebind_fd = -1;
		}
		ursa_info("RoCEv2: UDP port %u is free again: this process receives on it",
			  U.port);
	}
	pthread_mutex_unlock(&U.lock);
}

/* A timer in the side epoll set that wakes the engine every URSA_UDP_REBIND_NS
 * while the port is held by others (an idle engine sleeps otherwise). */
static void port_timer(void)
{
	struct itimerspec it = { { URSA_UDP_REBIND_NS / 1000000000ull, 0 },
				 { URSA_UDP_REBIND_NS / 1000000000ull, 0 } };
	int fd = U.fwd_ep >= 0 ? timerfd_create(CLOCK_MONOTONIC,
						TFD_CLOEXEC | TFD_NONBLOCK) : -1;

	if (fd < 0)
		return;
	if (timerfd_settime(fd, 0, &it, NULL)) {
		close(fd);
		return;
	}
	U.rebind_fd = fd;
	side_add(fd, SIDE_TIMER);
}

int ursa_udp_start(struct ursa_udp_watch *w)
{
	struct epoll_event ev = { .events = EPOLLIN,
				  .data.ptr = w ? w->tag : NULL };
	const char *s;

	pthread_mutex_lock(&U.lock);
	if (!U.tried) {
		U.tried = true;
		U.port = (uint16_t)ursa_cfg()->udp_port;
		s = ursa_cfg()->fault;
		if (*s)
			ursa_udp_fault(s);
		s = ursa_cfg()->pcap;
		if (*s)
			pcap_open(s);
	}
	if (!U.socks_tried) {
		U.socks_tried = true;
		if (port_bind() == 0) {
			U.fwd = fwd_open();
			side_add(U.fd, SIDE_RX4);
			side_add(U.fd6, SIDE_RX6);
		} else {
			int e = errno;
			long holder = port_holder(U.port);

			/* Reuseport groups are per user: the port belongs to
			 * the first user's processes (or to another program).
			 * Packets for this process's QPs then come through
			 * the forwarding of the ursa processes that hold it,
			 * until the port is free again (port_retry). */
			U.fwd = fwd_open();
			port_timer();
			if (holder >= 0 && (uid_t)holder != geteuid())
				ursa_info("RoCEv2: UDP port %u belongs to uid %ld: this process receives RoCEv2 through that user's ursa processes, which forward, until the port is free",
					  U.port, holder);
			else
				ursa_info("RoCEv2: cannot bind UDP port %u (%s): this process receives RoCEv2 through other ursa processes of the host, which forward, until the port is free",
					  U.port, strerror(e));
		}
	}
	U.users++;
	if (w) {
		/* The side set holds the receive sockets; without one (it
		 * could not be made), the engine watches them itself. */
		if (U.fwd_ep < 0 && U.fd >= 0)
			epoll_ctl(w->epfd, EPOLL_CTL_ADD, U.fd, &ev);
		if (U.fwd_ep < 0 && U.fd6 >= 0)
			epoll_ctl(w->epfd, EPOLL_CTL_ADD, U.fd6, &ev);
		if (U.fwd_ep >= 0 &&
		    !epoll_ctl(w->epfd, EPOLL_CTL_ADD, U.fwd_ep, &ev))
			w->watched = true;
	}
	pthread_mutex_unlock(&U.lock);
	return U.fd >= 0 ? 0 : -EADDRINUSE;
}

bool ursa_udp_live(void)
{
	return atomic_load_explicit(&U.live, memory_order_relaxed);
}

void ursa_udp_wake(void)
{
	atomic_store_explicit(&U.live, true, memory_order_relaxed);
}

/*
 * While an application thread polls (its passes read the RoCEv2 sockets
 * once there is traffic), an engine asleep on the same sockets is woken
 * by every packet only to find it taken; the wake-up costs the sender's
 * system call and, on a small machine, the CPU the polling threads need
 * (docs/design.md "Queues, rings and the engine"). The engine then
 * leaves the side set out of its epoll set (engine.c decides when and for
 * how long). Without a side set nothing changes.
 */
void ursa_udp_engine_watch(struct ursa_udp_watch *w, bool on)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w->tag };

	pthread_mutex_lock(&U.lock);
	if (U.fwd_ep >= 0 && !w->gone && w->watched != on &&
	    !epoll_ctl(w->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, U.fwd_ep, &ev))
		w->watched = on;
	pthread_mutex_unlock(&U.lock);
}

static void socks_close(void);

void ursa_udp_ctx_gone(struct ursa_udp_watch *w)
{
	/* The last context: leave the port's reuseport group. A socket
	 * nobody polls would swallow every flow the kernel hashes to it
	 * (a forked KV client's flow once landed on the socket of its
	 * parent, which had closed its device, and ran out of retries).
	 * U.rx first: a pass of the stopping engine may be reading. */
	pthread_mutex_lock(&U.rx);
	pthread_mutex_lock(&U.lock);
	if (w && w->epfd >= 0) {
		if (U.fd >= 0)
			epoll_ctl(w->epfd, EPOLL_CTL_DEL, U.fd, NULL);
		if (U.fd6 >= 0)
			epoll_ctl(w->epfd, EPOLL_CTL_DEL, U.fd6, NULL);
		if (U.fwd_ep >= 0)
			epoll_ctl(w->epfd, EPOLL_CTL_DEL, U.fwd_ep, NULL);
		/* (the engine, still running, must not add it again) */
		w->watched = false;
		w->gone = true;
	}
	if (U.users > 0 && --U.users == 0)
		socks_close();
	pthread_mutex_unlock(&U.lock);
	pthread_mutex_unlock(&U.rx);
}

/*
 * Packets leave in batches: one sendmmsg per engine step instead of one
 * sendto per packet. The batch belongs to the calling thread and is
 * flushed before the step returns (udp_flush).
 *
 * Runs of packets to one destination whose sizes are equal (the last may
 * be shorter: the MIDDLE packets of a message) go as one UDP GSO send
 * (UDP_SEGMENT): the kernel cuts the segments as late as it can, often in
 * the receiving host's socket or its NIC, and the per-packet cost of the
 * stack, which bounded RoCEv2 bandwidth at that of 1 KiB datagrams, is paid
 * once per run. Segment k of a run leaves with IPv4 ID k (the kernel numbers
 * them), so its ICRC is fixed up with the ID's delta (roce.h); receivers
 * accept IDs 0..URSA_GSO_SEGS-1 (on_packet). URSA_GSO=0 turns it off; a
 * kernel that refuses it turns it off too.
 */
/* A run: packets of one size to one destination (the last may be shorter),
 * one GSO send; closed by a shorter packet. */
struct txrun {
	int first, n;		/* its packets: first .. first + n - 1 */
	size_t bytes, seg;
	bool closed;
	uint64_t tag;		/* send_mid's message whose destination it has */
	socklen_t tolen;
	struct sockaddr_storage to;
	char ctl[CMSG_SPACE(sizeof(uint16_t))];
};
/*
 * A thread's batch is allocated when it first sends (about 290 KB), not
 * a thread-local: the static TLS of a library loaded at start-up is
 * carved out of every thread's stack, and glibc refused to create threads
 * with stacks of 256 KiB or less (EINVAL) in a program linked with ursa.
 * Freed when the thread exits (or, if no thread-specific key could be
 * made, never). Where it cannot be allocated, packets are not sent
 * (counted in tx_nomem): to the peer they are lost, and the reliability
 * rules recover them or end the QP.
 */
struct txbatch {
	int n, fd, nruns;
	size_t used;		/* bytes of buf taken */
	struct iovec pkt[URSA_UDP_TXB];	/* the packets, back to back */
	struct txrun run[URSA_UDP_TXB];
	struct iovec riov[URSA_UDP_TXB]; /* (udp_flush's, off its stack) */
	struct mmsghdr mm[URSA_UDP_TXB];	/* (the same) */
	int mrun[URSA_UDP_TXB];		/* (the same: each message's run) */
	bool mfrag[URSA_UDP_TXB];	/* (the same: over the path MTU) */
	struct pmtu_memo {		/* narrow paths (ursa_udp_flush) */
		struct sockaddr_storage to;
		socklen_t tolen;
		size_t seg;		/* the longest packet the path takes */
		uint64_t until;
	} pmtu[URSA_PMTU_MEMOS];
	unsigned pmtu_next;
	uint8_t buf[URSA_UDP_TXB * URSA_UDP_MAX_PKT];
};
static __thread struct txbatch *txb;
static __thread unsigned long tx_added;	/* packets ever added by this thread */
static pthread_key_t txb_key;
static pthread_once_t txb_once = PTHREAD_ONCE_INIT;
static bool txb_key_ok;

/* At the thread's exit; a destructor that runs after it in the same
 * thread and sends finds no batch, not a freed one. */
static void txb_free(void *b)
{
	free(b);
	txb = NULL;
}

static void txb_key_init(void)
{
	txb_key_ok = !pthread_key_create(&txb_key, txb_free);
}

static struct txbatch *txb_get(void)
{
	if (__builtin_expect(txb != NULL, 1))
		return txb;
	pthread_once(&txb_once, txb_key_init);
	txb = calloc(1, sizeof(*txb));
	if (txb && txb_key_ok && pthread_setspecific(txb_key, txb)) {
		free(txb);	/* (it would never be freed) */
		txb = NULL;
	}
	if (!txb && !atomic_fetch_add(&ursa_udp_cnt.tx_nomem, 1))
		ursa_err("RoCEv2: no memory for a send batch (%zu bytes): packets not sent",
			 sizeof(*txb));
	return txb;
}
static atomic_int gso_state;	/* 0 unknown, 1 on, -1 off */
/* This thread's packets and bytes not yet in ursa_udp_cnt: two locked adds
 * a batch instead of a packet. */
static __thread uint64_t txc_pkts, txc_bytes;
static __thread int tx_hold;	/* ursa_udp_tx_hold */

static bool gso_on(void)
{
	int st = atomic_load_explicit(&gso_state, memory_order_relaxed);

	if (!st) {
		st = ursa_cfg()->gso ? 1 : -1;
		atomic_store_explicit(&gso_state, st, memory_order_relaxed);
	}
	return st > 0;
}

/* ICRC deltas of the six low IPv4 ID bits, for the last lengths seen. */
static const uint32_t *id_basis(size_t ib_len)
{
	static __thread struct { size_t len; uint32_t d[6]; } c[4];
	static __thread unsigned next;
	int e;

	for (e = 0; e < 4; e++)
		if (c[e].len == ib_len)
			return c[e].d;
	e = (int)(next++ % 4);
	c[e].len = ib_len;
	for (int b = 0; b < 6; b++)
		c[e].d[b] = roce_icrc_v4_id_delta(ib_len, (uint16_t)(1u << b));
	return c[e].d;
}

static uint32_t basis_delta(const uint32_t *d, unsigned id)
{
	uint32_t x = 0;

	for (int b = 0; b < 6; b++)
		if (id & (1u << b))
			x ^= d[b];
	return x;
}

static uint32_t id_delta(size_t ib_len, unsigned id)
{
	return basis_delta(id_basis(ib_len), id);
}

/* The deltas of IDs 0..n-1 (n <= 64) from the basis, one xor each. */
static void id_deltas(const uint32_t *d, int n, uint32_t *dk)
{
	dk[0] = 0;
	for (int k = 1; k < n; k++)
		dk[k] = dk[k & (k - 1)] ^ d[__builtin_ctz((unsigned)k)];
}

/* Does a received ICRC match for some IPv4 ID? got is the packet's ICRC,
 * c0 the one computed with ID 0. The IDs an ursa GSO sender uses first
 * (its place in its run, then the others: an exact 32-bit check), from a
 * table of the deltas for the last length; then any ID, as rxe and NICs
 * choose them, solved from the ICRC (proto/roce.h: 16 bits of the check
 * remain). Solvers are kept for the last few lengths. Every caller holds
 * U.rx. */
static bool icrc_match_v4(size_t ib_len, uint32_t c0, uint32_t got,
			  unsigned likely)
{
	enum { SOLVERS = 8 };
	static struct { size_t len; uint32_t dk[URSA_GSO_SEGS]; } ids;
	static struct roce_id_solver sv[SOLVERS];
	static unsigned sv_next;
	uint32_t x = c0 ^ got;
	uint16_t id;
	unsigned i;

	if (ids.len != ib_len) {
		id_deltas(id_basis(ib_len), URSA_GSO_SEGS, ids.dk);
		ids.len = ib_len;
	}
	if (likely < URSA_GSO_SEGS && x == ids.dk[likely])
		return true;
	for (i = 1; i < URSA_GSO_SEGS; i++)
		if (x == ids.dk[i])
			return true;
	for (i = 0; i < SOLVERS && sv[i].ib_len != ib_len; i++)
		;
	if (i == SOLVERS) {
		i = sv_next++ % SOLVERS;
		roce_id_solver_init(&sv[i], ib_len);
	}
	return !roce_id_solve(&sv[i], x, &id);
}

/* Empty (the packets are sent or dropped): nothing in it, no room taken. */
static void batch_clear(struct txbatch *b)
{
	b->n = b->nruns = 0;
	b->used = 0;
}

/* Segment k of an IPv4 GSO run leaves with ID k: its ICRC is fixed up by
 * the ID's delta. The fix-up is an XOR: done twice, undone. */
static void run_ids(struct txbatch *b, const struct txrun *r)
{
	uint32_t dk[URSA_GSO_SEGS];

	if (r->to.ss_family != AF_INET)
		return;
	id_deltas(id_basis(r->seg - 4), r->n, dk);
	for (int k = 1; k < r->n; k++) {
		uint8_t *p = b->pkt[r->first + k].iov_base;
		size_t l = b->pkt[r->first + k].iov_len;

		roce_icrc_put(p + l - 4, roce_icrc_get(p + l - 4) ^
			      (l == r->seg ? dk[k] : id_delta(l - 4, (unsigned)k)));
	}
}

/*
 * Path MTU. Once the kernel has learned a path's MTU (an ICMP
 * "fragmentation needed"), it refuses a longer packet (EMSGSIZE: the
 * sockets set DF, IP_PMTUDISC_DO) or a GSO run of longer segments
 * (EINVAL). Such a run or packet goes again packet by packet, each with
 * ID 0 again (its fix-ups undone), with the socket switched to
 * IP_PMTUDISC_WANT for as long: the kernel fragments them (with IDs it
 * picks, which ursa's receivers solve for). The path's MTU is remembered
 * for a while (URSA_PMTU_HOLD_NS), so that its runs and packets that are
 * longer go so at once. The MTU is asked of a socket connected to the
 * destination, which also tells a narrow path from a kernel that takes
 * no GSO at all.
 */
static atomic_uint pmtu_gen;	/* (a count: orders nothing) */

/* The longest RoCEv2 packet (UDP payload) the kernel lets leave for to
 * unfragmented; 0 if it cannot tell. */
static size_t path_seg(const struct sockaddr_storage *to, socklen_t tolen)
{
	bool v4 = to->ss_family == AF_INET;
	int fd = socket(to->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), mtu = 0;
	socklen_t l = sizeof(mtu);
	size_t hdr = v4 ? 20 + 8 : 40 + 8;

	if (fd < 0)
		return 0;
	if (connect(fd, (const struct sockaddr *)to, tolen) ||
	    getsockopt(fd, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_MTU : IPV6_MTU,
		       &mtu, &l) || (size_t)mtu <= hdr)
		mtu = 0;
	close(fd);
	return mtu ? (size_t)mtu - hdr : 0;
}

/* Must run r go fragmented: a path remembered narrower? */
static bool run_narrow(struct txbatch *b, const struct txrun *r, uint64_t *now)
{
	for (unsigned i = 0; i < URSA_PMTU_MEMOS; i++) {
		struct pmtu_memo *p = &b->pmtu[i];

		if (!p->tolen || p->tolen != r->tolen ||
		    memcmp(&p->to, &r->to, r->tolen))
			continue;
		if (!*now)
			*now = ursa_now_ns();
		if (*now >= p->until) {
			p->tolen = 0;	/* (try GSO again) */
			return false;
		}
		return r->seg > p->seg;
	}
	return false;
}

/* A run was refused: true if for the path's MTU, remembered. */
static bool run_over_pmtu(struct txbatch *b, const struct txrun *r)
{
	size_t seg = path_seg(&r->to, r->tolen);
	struct pmtu_memo *p;

	if (!seg || r->seg <= seg)
		return false;
	p = &b->pmtu[b->pmtu_next++ % URSA_PMTU_MEMOS];
	memcpy(&p->to, &r->to, r->tolen);
	p->tolen = r->tolen;
	p->seg = seg;
	p->until = ursa_now_ns() + URSA_PMTU_HOLD_NS;
	atomic_fetch_add_explicit(&pmtu_gen, 1, memory_order_relaxed);
	return true;
}

unsigned ursa_udp_pmtu_gen(void)
{
	return atomic_load_explicit(&pmtu_gen, memory_order_relaxed);
}

size_t ursa_udp_path_seg(const addr_t *dst)
{
	struct sockaddr_storage to;
	socklen_t tolen = to_sockaddr(dst, U.port, &to);

	return path_seg(&to, tolen);
}

/* Let the kernel fragment what the batch's IPv4 socket sends (or not);
 * IPv6 sockets fragment over the path MTU by default. A packet another
 * thread sends on the QP's socket meanwhile may leave with an ID the
 * kernel picks: on a narrow path, to an ursa peer, which solves it. */
static void may_fragment(const struct txbatch *b, sa_family_t fam, bool on)
{
	int v = on ? IP_PMTUDISC_WANT : IP_PMTUDISC_DO;

	if (fam == AF_INET)
		setsockopt(b->fd, IPPROTO_IP, IP_MTU_DISCOVER, &v, sizeof(v));
}

/* r, whose ID fix-ups were made if GSO, packet by packet, fragmented */
static void run_singly(struct txbatch *b, const struct txrun *r, bool gso)
{
	if (gso)
		run_ids(b, r);
	may_fragment(b, r->to.ss_family, true);
	for (int k = 0; k < r->n; k++)
		if (sendto(b->fd, b->pkt[r->first + k].iov_base,
			   b->pkt[r->first + k].iov_len, 0,
			   (const struct sockaddr *)&r->to, r->tolen) < 0)
			ursa_dbg("udp send: %s", strerror(errno));
	may_fragment(b, r->to.ss_family, false);
	atomic_fetch_add(&ursa_udp_cnt.tx_pmtu, 1);
}

/* Message m of the batch: one piece of buf, to r's destination. */
static void msg_put(struct txbatch *b, int m, const struct txrun *r,
		    void *buf, size_t len)
{
	struct msghdr *h = &b->mm[m].msg_hdr;

	memset(&b->mm[m], 0, sizeof(b->mm[m]));
	h->msg_name = (void *)&r->to;
	h->msg_namelen = r->tolen;
	b->riov[m] = (struct iovec){ buf, len };
	h->msg_iov = &b->riov[m];
	h->msg_iovlen = 1;
}

void ursa_udp_flush(void)
{
	struct txbatch *b = txb;
	struct mmsghdr *mm;
	uint64_t now = 0;
	int m = 0, done = 0;

	if (txc_pkts) {
		atomic_fetch_add(&ursa_udp_cnt.tx_pkts, txc_pkts);
		atomic_fetch_add(&ursa_udp_cnt.tx_bytes, txc_bytes);
		txc_pkts = txc_bytes = 0;
	}
	if (!b)
		return;
	mm = b->mm;
	for (int i = 0; i < b->nruns; i++) {
		struct txrun *r = &b->run[i];
		struct msghdr *h;
		struct cmsghdr *cm;
		uint16_t gs = (uint16_t)r->seg;

		if (run_narrow(b, r, &now)) {
			/* (as many messages as packets: mm has room) */
			for (int k = 0; k < r->n; k++) {
				b->mrun[m] = i;
				b->mfrag[m] = true;
				msg_put(b, m++, r, b->pkt[r->first + k].iov_base,
					b->pkt[r->first + k].iov_len);
			}
			atomic_fetch_add(&ursa_udp_cnt.tx_pmtu, 1);
			continue;
		}
		/* A run's packets lie back to back: one piece for the
		 * kernel to copy. Given as one piece per packet, the copy
		 * into the socket had taken twice the time (docs/design.md
		 * "Wire"). */
		b->mrun[m] = i;
		b->mfrag[m] = false;
		msg_put(b, m, r, b->pkt[r->first].iov_base, r->bytes);
		h = &mm[m++].msg_hdr;
		if (r->n == 1)
			continue;
		run_ids(b, r);
		atomic_fetch_add(&ursa_udp_cnt.tx_gso, 1);
		h->msg_control = r->ctl;
		h->msg_controllen = sizeof(r->ctl);
		cm = CMSG_FIRSTHDR(h);
		cm->cmsg_level = SOL_UDP;
		cm->cmsg_type = UDP_SEGMENT;
		cm->cmsg_len = CMSG_LEN(sizeof(gs));
		memcpy(CMSG_DATA(cm), &gs, sizeof(gs));
	}
	while (done < m) {
		/* a stretch of messages that may be fragmented, or not */
		int end = done, r, e;
		bool gso = mm[done].msg_hdr.msg_controllen != 0;
		struct txrun *run = &b->run[b->mrun[done]];

		while (end < m && b->mfrag[end] == b->mfrag[done])
			end++;
		if (b->mfrag[done])
			may_fragment(b, run->to.ss_family, true);
		r = sendmmsg(b->fd, mm + done, (unsigned)(end - done), 0);
		e = errno;
		if (b->mfrag[done])
			may_fragment(b, run->to.ss_family, false);
		if (r > 0) {
			done += r;
			continue;
		}
		if (!b->mfrag[done] &&
		    ((gso && e == EINVAL) || e == EMSGSIZE) &&
		    run_over_pmtu(b, run)) {
			/* (a run is one message unless narrow) */
			run_singly(b, run, gso);
			done++;
			continue;
		}
		errno = e;
		ursa_dbg("udp send: %s", strerror(errno));
		if (gso && (errno == EIO || errno == EINVAL ||
			    errno == ENOPROTOOPT || errno == EOPNOTSUPP)) {
			/* no UDP GSO here: send singly from now on (the
			 * lost run is retransmitted; receivers accept its
			 * fixed-up ICRCs) */
			atomic_store_explicit(&gso_state, -1, memory_order_relaxed);
			ursa_info("RoCEv2: UDP segmentation offload refused (%s): sending packet by packet",
				  strerror(errno));
		}
		break;
	}
	batch_clear(b);
}

/*
 * Whether to send the batch before it is full: its last run cannot grow
 * (closed, or at the segment or byte limit of one GSO send) and the room
 * left is less than that run, so the next one would be cut short. Every
 * cut-off run is one more datagram through the whole stack, as costly as
 * a full one: with 1040-byte packets a batch of 64 went as runs of 62
 * and 2 (docs/design.md "Wire").
 */
static bool run_ends_batch(const struct txbatch *b)
{
	const struct txrun *r = b->nruns ? &b->run[b->nruns - 1] : NULL;

	return r && r->n > 1 && URSA_UDP_TXB - b->n < r->n &&
	       (r->closed || r->n == URSA_GSO_SEGS ||
		r->bytes + r->seg > URSA_GSO_MAX_BYTES);
}

/* Where the next packet of the batch goes: a packet built there (see
 * send_data_pkt) is not copied again by batch_add. */
uint8_t *ursa_udp_slot(void)
{
	struct txbatch *b = txb_get();

	if (!b)
		return NULL;
	if (b->n == URSA_UDP_TXB || run_ends_batch(b) ||
	    b->used > sizeof(b->buf) - URSA_UDP_MAX_PKT)
		ursa_udp_flush();
	return b->buf + b->used;
}

bool ursa_udp_in_slot(const uint8_t *ib)
{
	return txb && txb->n < URSA_UDP_TXB && ib == txb->buf + txb->used;
}

/* tag (0: none): send_mid's message, whose packets all go to one address:
 * a run with its tag is extended without comparing addresses. */
static void batch_add(int fd, const uint8_t *ib, size_t len,
		      const struct sockaddr_storage *to, socklen_t tolen,
		      uint64_t tag)
{
	struct txbatch *b = txb_get();
	struct txrun *r;
	int i;

	if (!b)
		return;
	/* (a packet built in the next slot was checked for room by
	 * tx_slot, and nothing was added since) */
	if (b->n && (b->fd != fd ||
		     (ib != b->buf + b->used &&
		      (b->n == URSA_UDP_TXB || run_ends_batch(b) ||
		       b->used > sizeof(b->buf) - len))))
		ursa_udp_flush();
	i = b->n++;
	tx_added++;
	b->fd = fd;
	if (ib != b->buf + b->used)	/* (built in a slot a flush moved) */
		memmove(b->buf + b->used, ib, len);
	b->pkt[i] = (struct iovec){ b->buf + b->used, len };
	b->used += len;
	r = b->nruns ? &b->run[b->nruns - 1] : NULL;
	if (r && gso_on() && !r->closed && len <= r->seg &&
	    r->n < URSA_GSO_SEGS && r->bytes + len <= URSA_GSO_MAX_BYTES &&
	    ((tag && r->tag == tag) ||
	     (tolen == r->tolen && !memcmp(to, &r->to, tolen)))) {
		r->n++;
		r->bytes += len;
		r->closed = len < r->seg;
		r->tag = tag;
		return;
	}
	r = &b->run[b->nruns++];
	r->first = i;
	r->n = 1;
	r->bytes = r->seg = len;
	r->closed = false;
	r->tag = tag;
	r->tolen = tolen;
	memcpy(&r->to, to, tolen);
}

/* Packets held back by the delay fault, sent by a later engine pass. */
static struct {
	uint64_t due;
	int fd;
	size_t len;
	socklen_t tolen;
	struct sockaddr_storage to;
	uint8_t buf[URSA_UDP_MAX_PKT];
} delayq[URSA_UDP_DELAYQ];
static unsigned delay_n;

static void delay_flush(uint64_t now, bool all)
{
	unsigned k = 0;

	pthread_mutex_lock(&U.fault_lock);
	for (unsigned i = 0; i < delay_n; i++) {
		if (all || delayq[i].due <= now)
			sendto(delayq[i].fd, delayq[i].buf, delayq[i].len, 0,
			       (struct sockaddr *)&delayq[i].to, delayq[i].tolen);
		else if (k != i)
			delayq[k++] = delayq[i];
		else
			k++;
	}
	delay_n = k;
	pthread_mutex_unlock(&U.fault_lock);
}

/* Send one transport packet (ib, len with the ICRC's room) from the QP's
 * socket; computes the ICRC unless the builder did (have_icrc: see
 * send_data_pkt); applies injected faults. */
bool ursa_udp_send(const struct ursa_udp_ep *u, const addr_t *src,
		   const addr_t *dst, uint8_t *ib, size_t len, uint8_t ttl,
		   bool have_icrc)
{
	uint8_t ip[40], udp[8];
	struct sockaddr_storage to;
	socklen_t tolen = to_sockaddr(dst, U.port, &to);
	int fd = ursa_gid_v4(dst) ? u->txfd : u->txfd6;
	bool dup = false;
	size_t hl;

	if (fd < 0 || ursa_gid_v4(src) != ursa_gid_v4(dst))
		return false;
	if (!have_icrc) {
		hl = ip_udp(ip, udp, src, dst, u->sport, U.port, len, ttl);
		roce_icrc_put(ib + len - 4, roce_icrc(ip, hl, udp, ib, len - 4));
	}
	capture(src, dst, u->sport, U.port, ib, len);
	txc_pkts++;	/* (added to the counters at the next udp_flush) */
	txc_bytes += len;
	if (U.loss | U.dup | U.reorder | U.corrupt) {
		pthread_mutex_lock(&U.fault_lock);
		if (rnd() % 1000 < U.loss) {
			atomic_fetch_add(&ursa_udp_cnt.fault_lost, 1);
			pthread_mutex_unlock(&U.fault_lock);
			return true;
		}
		if (rnd() % 1000 < U.corrupt) {
			/* flip one bit past the BTH: the ICRC must catch it */
			ib[12 + rnd() % (len - 12)] ^= (uint8_t)(1u << (rnd() % 8));
			atomic_fetch_add(&ursa_udp_cnt.fault_corrupt, 1);
		}
		dup = rnd() % 1000 < U.dup;
		if (U.delay && rnd() % 1000 < U.delay &&
		    delay_n < URSA_UDP_DELAYQ && len <= URSA_UDP_MAX_PKT) {
			/* sent by an engine pass after delay_us */
			delayq[delay_n].due = ursa_now_ns() + U.delay_ns;
			delayq[delay_n].fd = fd;
			delayq[delay_n].len = len;
			delayq[delay_n].to = to;
			delayq[delay_n].tolen = tolen;
			memcpy(delayq[delay_n].buf, ib, len);
			delay_n++;
			atomic_fetch_add(&ursa_udp_cnt.fault_delay, 1);
			pthread_mutex_unlock(&U.fault_lock);
			return true;
		}
		if (!U.held_len && rnd() % 1000 < U.reorder &&
		    len <= URSA_UDP_MAX_PKT) {
			/* hold this one back until after the next packet */
			memcpy(U.held, ib, len);
			U.held_len = len;
			U.held_fd = fd;
			U.held_to = to;
			U.held_tolen = tolen;
			atomic_fetch_add(&ursa_udp_cnt.fault_reorder, 1);
			pthread_mutex_unlock(&U.fault_lock);
			return true;
		}
		pthread_mutex_unlock(&U.fault_lock);
	}
	batch_add(fd, ib, len, &to, tolen, 0);
	if (dup) {
		atomic_fetch_add(&ursa_udp_cnt.fault_dup, 1);
		batch_add(fd, ib, len, &to, tolen, 0);
	}
	if (U.held_len) {
		pthread_mutex_lock(&U.fault_lock);
		if (U.held_len) {
			batch_add(U.held_fd, U.held, U.held_len, &U.held_to,
				  U.held_tolen, 0);
			U.held_len = 0;
		}
		pthread_mutex_unlock(&U.fault_lock);
	}
	return true;
}

bool ursa_udp_plain(void)
{
	return !(U.loss | U.dup | U.reorder | U.corrupt || U.pcap || U.held_len);
}

static atomic_uint_fast64_t dest_tags;	/* the last ursa_udp_dest.tag given */

int ursa_udp_dest_set(const struct ursa_udp_ep *ep, const addr_t *src,
		      const addr_t *dst, struct ursa_udp_dest *d)
{
	if (ursa_gid_v4(src) != ursa_gid_v4(dst) ||
	    (d->fd = ursa_gid_v4(dst) ? ep->txfd : ep->txfd6) < 0)
		return -EAFNOSUPPORT;
	d->tolen = to_sockaddr(dst, U.port, &d->to);
	d->tag = atomic_fetch_add_explicit(&dest_tags, 1,
					   memory_order_relaxed) + 1;
	return 0;
}

void ursa_udp_send_to(const struct ursa_udp_dest *d, uint8_t *ib, size_t len)
{
	batch_add(d->fd, ib, len, &d->to, d->tolen, d->tag);
	txc_pkts++;
	txc_bytes += len;
}

unsigned long ursa_udp_added(void)
{
	return tx_added;
}

void ursa_udp_flush_soon(void)
{
	if (!tx_hold)
		ursa_udp_flush();
}

int ursa_udp_rcvbuf(void)
{
	return __atomic_load_n(&U.rcvbuf, __ATOMIC_RELAXED);
}

bool ursa_udp_reachable(const struct ursa_udp_ep *ep, const addr_t *src,
			const addr_t *dst)
{
	atomic_store_explicit(&U.live, true, memory_order_relaxed);
	return ursa_gid_v4(src) == ursa_gid_v4(dst) &&
	       (ursa_gid_v4(dst) ? (U.fd >= 0 || U.fwd >= 0) && ep->txfd >= 0 :
			     (U.fd6 >= 0 || U.fwd >= 0) && ep->txfd6 >= 0);
}

void ursa_udp_tx_hold(bool on)
{
	if (on)
		tx_hold++;
	else if (tx_hold && !--tx_hold)
		ursa_udp_flush();
}

/* A received packet: counted, captured, its ICRC checked, and handed up to
 * the engine. seg: the packet's place in a coalesced run (UDP_GRO), 0 if
 * alone: the IPv4 ID it most likely left with (ursa_udp_flush), tried
 * first. run_qp: the engine's (engine/rc_recv.c), NULL for none. */
static void on_packet(uint8_t *buf, size_t len, const addr_t *src,
		      uint16_t sport, const addr_t *dst, bool forwarded,
		      unsigned seg, unsigned flags, struct ursa_qp **run_qp)
{
	uint32_t dqpn = 0;

	/* (every caller holds U.rx: a load and a store) */
	ursa_cnt_add(&ursa_udp_cnt.rx_pkts, 1);
	ursa_cnt_add(&ursa_udp_cnt.rx_bytes, len);
	capture(src, dst, sport, U.port, buf, len);
	if (len < ROCE_BTH_LEN + ROCE_ICRC_LEN) {
		atomic_fetch_add(&ursa_udp_cnt.drop_short, 1);
		return;
	}
	/* The ICRC first: a damaged packet tells nothing trustworthy. (The
	 * cache is ours: every caller holds U.rx.) */
	{
		static struct ursa_udp_pfx rx_pfx;
		uint32_t c0 = roce_icrc_fill_from(ursa_udp_icrc_pfx(&rx_pfx, src, dst,
								     sport, len),
						  buf, len - 4, len - 4, NULL, 0);
		uint32_t got = roce_icrc_get(buf + len - 4);

		/* IPv4: ID 0, a segment of a GSO run (ursa_udp_flush), or
		 * whatever ID another sender chose */
		if (c0 != got) {
			if (!ursa_gid_v4(src) ||
			    !icrc_match_v4(len - 4, c0, got, seg)) {
				atomic_fetch_add(&ursa_udp_cnt.drop_icrc, 1);
				return;
			}
			atomic_fetch_add(&ursa_udp_cnt.rx_ipid, 1);
		}
	}
	/* the engine's (engine/rc_recv.c); a QPN not ours may be another
	 * process's (never forward twice) */
	if (ursa_udp_up.rx(buf, len, src, sport, dst, flags, run_qp,
			   &dqpn) != -ENOENT)
		return;
	if (!forwarded && forward(buf, len, dqpn, src, sport, dst, flags))
		return;
	atomic_fetch_add(&ursa_udp_cnt.drop_qpn, 1);
}

/* For the responder fuzz target: hand one datagram to the receive path, as
 * if it had arrived from src:sport for dst. */
void ursa_udp_inject(uint8_t *buf, size_t len, const union ibv_gid *src,
		     uint16_t sport, const union ibv_gid *dst)
{
	pthread_mutex_lock(&U.rx);
	on_packet(buf, len, src, sport, dst, true, 0, 0, NULL);
	pthread_mutex_unlock(&U.rx);
	ursa_udp_flush();
}

uint16_t ursa_udp_port(void)
{
	return U.port;
}

static bool is_tos(const struct cmsghdr *c)
{
	return (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) ||
	       (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS);
}

/* URSA_UDP_RX_CE if the traffic class says Congestion Experienced (IPv4
 * gives one byte, IPv6 an int) */
static unsigned ecn_ce(const struct cmsghdr *c)
{
	int tc = 0;

	if (c->cmsg_level == IPPROTO_IP && c->cmsg_len >= CMSG_LEN(1))
		tc = *CMSG_DATA(c);
	else if (c->cmsg_len >= CMSG_LEN(sizeof(int)))
		memcpy(&tc, CMSG_DATA(c), sizeof(tc));
	return (tc & 3) == 3 ? URSA_UDP_RX_CE : 0;
}

/* What a received datagram's control messages tell: the address it was
 * sent to (*dst; false if missing), its ECN mark (*flags), the segment
 * size of a coalesced run (*seg, 0 if alone). */
static bool rx_meta(struct msghdr *h, bool v6, addr_t *dst, unsigned *flags,
		    size_t *seg)
{
	bool have_dst = false;

	memset(dst, 0, sizeof(*dst));
	for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
		if (!v6 && c->cmsg_level == IPPROTO_IP &&
		    c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			dst->raw[10] = dst->raw[11] = 0xff;
			memcpy(dst->raw + 12, &pi.ipi_addr, 4);
			have_dst = true;
		} else if (v6 && c->cmsg_level == IPPROTO_IPV6 &&
			   c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo pi;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			memcpy(dst->raw, &pi.ipi6_addr, 16);
			have_dst = true;
		} else if (is_tos(c)) {
			*flags |= ecn_ce(c);
		} else if (c->cmsg_level == SOL_UDP &&
			   c->cmsg_type == UDP_GRO) {
			int g;

			memcpy(&g, CMSG_DATA(c), sizeof(g));
			*seg = g > 0 ? (size_t)g : 0;
		}
	}
	return have_dst;
}

/* The sender's GID (*src) and port of a received datagram. */
static uint16_t from_addr(const struct sockaddr_storage *ss, bool v6,
			  addr_t *src)
{
	memset(src, 0, sizeof(*src));
	if (v6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;

		memcpy(src->raw, &a->sin6_addr, 16);
		return ntohs(a->sin6_port);
	} else {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;

		src->raw[10] = src->raw[11] = 0xff;
		memcpy(src->raw + 12, &a->sin_addr, 4);
		return ntohs(a->sin_port);
	}
}

/* Receive a batch from one socket; returns datagrams handled. */
static int poll_sock(int fd, bool v6)
{
	enum { BATCH = 32 };
	struct ursa_qp *run_qp = NULL;	/* see on_packet */
	static uint8_t bufs[BATCH][URSA_UDP_GRO_BUF];
	static struct sockaddr_storage from[BATCH];
	static char cbuf[BATCH][CMSG_SPACE(sizeof(struct in6_pktinfo)) +
				CMSG_SPACE(sizeof(int)) +
				CMSG_SPACE(sizeof(int))];
	struct mmsghdr mm[BATCH];
	struct iovec iov[BATCH];
	int n, total = 0;

	for (;;) {
		for (int i = 0; i < BATCH; i++) {
			iov[i].iov_base = bufs[i];
			iov[i].iov_len = sizeof(bufs[i]);
			memset(&mm[i].msg_hdr, 0, sizeof(mm[i].msg_hdr));
			mm[i].msg_hdr.msg_iov = &iov[i];
			mm[i].msg_hdr.msg_iovlen = 1;
			mm[i].msg_hdr.msg_name = &from[i];
			mm[i].msg_hdr.msg_namelen = sizeof(from[i]);
			mm[i].msg_hdr.msg_control = cbuf[i];
			mm[i].msg_hdr.msg_controllen = sizeof(cbuf[i]);
		}
		n = recvmmsg(fd, mm, BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			break;
		/* What the batch's packets answer (READ responses, ACKs)
		 * leaves together after it, in order, in one sendmmsg: one
		 * per request made 64-byte READs cost a system call each
		 * on both sides. */
		ursa_udp_tx_hold(true);
		for (int i = 0; i < n; i++) {
			addr_t src, dst;
			unsigned flags = 0;
			uint16_t sport;
			size_t seg = 0;
			bool have_dst = rx_meta(&mm[i].msg_hdr, v6, &dst,
						&flags, &seg);

			sport = from_addr(&from[i], v6, &src);
			if ((mm[i].msg_hdr.msg_flags & MSG_TRUNC) || !have_dst) {
				atomic_fetch_add(&ursa_udp_cnt.drop_short, 1);
				continue;
			}
			/* A coalesced run: segments of seg bytes, the last
			 * possibly shorter, each a packet of its own. */
			if (!seg || seg >= mm[i].msg_len)
				seg = mm[i].msg_len;
			else
				atomic_fetch_add(&ursa_udp_cnt.rx_gro, 1);
			for (size_t off = 0; off < mm[i].msg_len; off += seg)
				on_packet(bufs[i] + off, MIN(seg, mm[i].msg_len - off),
					  &src, sport, &dst, false,
					  (unsigned)(off / seg), flags, &run_qp);
			if (run_qp) {
				ursa_loop_put(run_qp);
				run_qp = NULL;
			}
		}
		ursa_udp_tx_hold(false);
		total += n;
		if (n < BATCH)
			break;
	}
	return total;
}

int ursa_udp_poll(void)
{
	int total = 0;

	if (delay_n)
		delay_flush(ursa_now_ns(), false);
	/* A pass skips the receive sockets until this process has RoCEv2
	 * traffic: same-host work should not pay system calls for them (the
	 * engine's passes of a same-host SEND ping-pong made 500 000 empty
	 * epoll_wait calls a second). The engine watches them in its epoll
	 * set, asleep or every EVENT_POLL_NS while busy, and a first packet
	 * marks the process live there (ursa_udp_wake). */
	if (!atomic_load_explicit(&U.live, memory_order_relaxed))
		return 0;
	if ((U.fd < 0 && U.fwd_ep < 0) || pthread_mutex_trylock(&U.rx))
		return 0;
	/* Receive sockets of gone QPs close here, under U.rx, so that no
	 * poll is reading one when it closes. */
	if (__atomic_load_n(&grave.n, __ATOMIC_RELAXED)) {
		/* (a hint read outside the lock; U.lock orders the rest) */
		pthread_mutex_lock(&U.lock);
		grave_close();
		pthread_mutex_unlock(&U.lock);
	}
	if (U.fwd_ep < 0) {
		total += poll_sock(U.fd, false);
		if (U.fd6 >= 0)
			total += poll_sock(U.fd6, true);
	}
	/* the receive sockets, when they are in the side epoll set, and
	 * packets other processes of this host forwarded to us */
	total += fwd_poll();
	pthread_mutex_unlock(&U.rx);
	if (total)
		atomic_store_explicit(&U.live, true, memory_order_relaxed);
	return total;
}

/*
 * fork(): the child must not share the parent's receive sockets, its
 * forwarding listener (named for the parent's pid) or the epoll set that
 * holds the parent's descriptors: an event there would name a descriptor
 * that means something else in the child. It closes them, and opens its
 * own with its first context. The QPs it inherited are the parent's
 * (transport/loop.c): their sockets are closed too.
 */
__attribute__((constructor)) static void udp_hooks(void)
{
	ursa_hooks.udp_atfork_child = ursa_udp_atfork_child;
}

void ursa_udp_atfork_child(void)
{
	pthread_mutex_init(&U.lock, NULL);
	pthread_mutex_init(&U.rx, NULL);
	pthread_mutex_init(&U.fault_lock, NULL);
	socks_close();
	ursa_gsi_atfork_child();
	U.users = 0;
	U.held_len = 0;
	if (txb)		/* the parent's packets */
		batch_clear(txb);
	delay_n = 0;
}

/* Close the receive side (the next context opens it again): the RoCEv2
 * sockets, the forwarding listener, its connections and epoll set. */
static void socks_close(void)
{
	int *fds[] = { &U.fd, &U.fd6, &U.fwd, &U.fwd_ep, &U.rebind_fd };

	for (unsigned i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
	for (unsigned i = 0; i < URSA_UDP_FWD_OUT; i++) {
		if (fwd_out[i].fd > 0)
			close(fwd_out[i].fd);
		fwd_out[i].fd = 0;
	}
	grave_close();
	U.socks_tried = false;
}

