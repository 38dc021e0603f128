// SPDX-License-Identifier: MIT
/*
 * udp.c - RoCEv2 over UDP between hosts (design in udp.h and
 * docs/design.md). IPv4 GIDs only for now.
 *
 * Requester: each WQE of a QP's send queue is a message, cut into path-MTU
 * packets with consecutive PSNs and sent in a window (window_max);
 * WRITEs and SENDs, or READs and atomics, follow each other without
 * waiting for their answers (see pipe_class). The responder's
 * cumulative ACKs move the window, a PSN-sequence NAK or the ACK timeout
 * sends again from the first unacknowledged packet (go-back-N).
 *
 * Responder: packets are checked (length, opcode, ICRC, destination QP,
 * source address for connected QPs, PSN) and then executed by the same
 * responder as the other transports (resp.c), one packet at a time, under
 * the QP's lock. Whatever is refused is dropped and counted.
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

/* Packets in flight per QP, at most: URSA_UDP_WINDOW_BYTES of payload, and half
 * what the receive socket's buffer holds (the kernel counts about twice
 * the payload against it), as 256 to 2048 packets of the path MTU
 * (window_max): a path with jumbo frames keeps as many bytes on the way
 * as one with 1024-byte packets. The sockets ask for 4-8 MiB of buffer;
 * net.core.rmem_max (often 208 KiB) may cap it, and the peer's is taken
 * to be like ours. */
#define PIPE(u, i) (&(u)->pipe_ring[((u)->pipe_head + (i)) % URSA_UDP_PIPE])
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

/* Addresses are GIDs: IPv4 as ::ffff:a.b.c.d, IPv6 as is. */
typedef union ibv_gid addr_t;

static bool is_v4(const addr_t *g)
{
	static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(g->raw, pfx, 12);
}

/* sockaddr for a GID and port (only the returned length is written: it is
 * built for every packet sent) */
static socklen_t to_sockaddr(const addr_t *g, uint16_t port,
			     struct sockaddr_storage *ss)
{
	if (is_v4(g)) {
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

/*
 * The ICRC's register after the masked IP and UDP headers (roce_icrc_pfx)
 * for one pair of addresses, ports and length, kept for the next packet:
 * a stream's packets share it, and building the headers and their CRC was
 * a fifth of the work a 1 KiB packet costs us on either side, besides the
 * payload's CRC (icrc_pfx).
 */
struct pfx_cache {
	addr_t src, dst;
	size_t len;
	uint16_t sport, dport;
	bool ok;
	uint32_t reg;
};

struct ursa_uqp {
	pthread_mutex_t lock;
	struct ursa_qp *qp;
	int txfd, txfd6;
	uint16_t sport;
	int rxfd;		/* connected to the peer's address and port */
	uint16_t rx_port;	/* the peer's source port it is connected to */
	uint32_t next_psn;	/* requester: PSN of the next new message */
	uint32_t psn_hi;	/* requester: past the highest PSN sent so far
				 * (psn_sent; next_psn goes back at
				 * pipe_collapse, this does not) */
	uint64_t srtt, rttvar;	/* round-trip estimate, ns (0: none yet) */
	unsigned backoff;	/* early retransmissions with no progress */
	struct pfx_cache pfx;	/* of our data packets (send_data_pkt) */
	struct pfx_cache rpfx;	/* of our READ responses (on_read_req) */
	/* Window in packets: halved by every go-back, grown as acknowledged
	 * (window_grow). Go-back-N resends everything in flight, so a full
	 * 256-packet window under 5 % loss resent about 12 packets per
	 * packet delivered; a window that shrinks with loss keeps that down
	 * while a clean path runs at the full window. */
	uint32_t cwnd, ssthresh, cwnd_acc; /* (window_grow) */
	/* requester: the message in flight (the head WQE) */
	struct {
		bool active, done, is_read;
		struct ursa_send_wqe *wqe;
		uint32_t op;	/* ibv_wr_opcode */
		uint32_t first, npkts, mtu;
		uint32_t sent, acked;	/* packets */
		uint8_t nak;	/* AETH syndrome of a NAK/RNR, 0 = none */
		uint32_t nak_psn;
		uint64_t orig, len;
		uint64_t deadline;	/* ACK timeout: counts against retry_cnt */
		uint64_t rto;		/* early go-back-N, free of charge */
		bool resend_read;
		bool progress;	/* acknowledged something since last look */
		uint32_t rerequested;	/* READ: re-asked from this packet */
		uint32_t hiwat;	/* packets ever sent (beyond: first sends) */
		struct ursa_sg dst[URSA_MAX_SGE];
		uint32_t ndst;
		/* What the message's MIDDLE packets share (send_mid) */
		bool mid_ok;
		uint64_t mid_tag;	/* (struct txrun) */
		uint8_t mid_op;
		uint32_t mid_reg;	/* ICRC register after the BTH's 8th byte */
		int mid_fd;
		socklen_t mid_tolen;
		struct sockaddr_storage mid_to;
	} m;
	/* requester: messages sent whole before m and waiting for their ACK,
	 * oldest first (pipelining: ursa_udp_can_start) */
	struct upipe {
		struct ursa_send_wqe *wqe;
		uint32_t op, first, npkts, mtu, acked;
		uint64_t len;
		bool done, is_read, is_atomic;
		uint64_t orig;		/* an atomic's answer */
		uint32_t ndst;		/* READ: where the responses go */
		struct ursa_sg dst[URSA_MAX_SGE];
	} pipe_ring[URSA_UDP_PIPE];	/* PIPE(u, i): the i-th oldest */
	uint32_t pipe_head, pipe_n;
	uint32_t pipe_out;	/* their packets not yet acknowledged */
	uint8_t pipe_nak;	/* a NAK's syndrome for the oldest one ... */
	uint32_t pipe_nak_psn;	/* ... and its PSN */
	bool pipe_gap;		/* responses missing before others */
	/* A READ taken back (pipe_collapse): no READ joins the pipe until it
	 * is complete. Each READ asked for again is answered whole again, so
	 * restarting the ones behind it at every loss multiplied the
	 * responses until the useful ones drowned (RETRY_EXC_ERR under 5 %
	 * loss). */
	const struct ursa_send_wqe *pipe_cool;
	bool timing;		/* one packet's round trip being timed */
	uint32_t t_psn;
	uint64_t t_sent;
	/* responder */
	uint32_t epsn, msn;
	bool nak_sent, uc_broken;
	struct ursa_rstate rs;
	uint64_t soff;		/* SEND in progress: bytes so far */
	uint64_t wva, wlen, woff;	/* WRITE in progress */
	uint32_t wrkey;
	struct { uint32_t psn; uint64_t orig; bool valid; } ares[URSA_UDP_ARES];
	unsigned ares_next;
	/* READ requests executed lately: a duplicate READ is executed again
	 * only if it starts inside one of them, at the same rkey and the
	 * matching address (IBTA 9.7.5.1.3; rxe keeps such resources too),
	 * never on the word of a packet behind the expected PSN alone */
	struct { uint32_t psn, npkts, rkey; uint64_t va; bool valid; }
		rres[URSA_UDP_RRES];
	unsigned rres_next;
	/* Delayed ACK (ack_later): a positive ACK held back to leave with
	 * this QP's next packets to the peer, or at ack_due. */
	bool ack_owed;		/* written under lock; read as a hint */
	uint32_t ack_psn;
	uint64_t ack_due;
	addr_t ack_me, ack_peer;
	unsigned ack_skip;	/* ACKs to send at once before holding again */
	unsigned ack_backoff;	/* held ACKs in a row that went alone */
	bool ack_now;		/* owed, but not held: due at this pass's end */
	/* A request that would complete a receive while our own signaled
	 * message waits for its ACK, held until that ACK (hold_request) */
	uint8_t *stash;		/* URSA_UDP_MAX_PKT bytes, once used */
	size_t stash_len;	/* 0: none */
	uint64_t stash_due;
	addr_t stash_me, stash_peer;
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

	if (is_v4(src)) {
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

/* (see struct pfx_cache) */
static uint32_t icrc_pfx(struct pfx_cache *c, const addr_t *src,
			 const addr_t *dst, uint16_t sport, uint16_t dport,
			 size_t ib_len)
{
	if (!c->ok || c->len != ib_len || c->sport != sport ||
	    c->dport != dport || memcmp(c->src.raw, src->raw, 16) ||
	    memcmp(c->dst.raw, dst->raw, 16)) {
		uint8_t ip[40], udp[8];
		size_t hl = ip_udp(ip, udp, src, dst, sport, dport, ib_len, 0);

		*c = (struct pfx_cache){ .src = *src, .dst = *dst,
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
	uint16_t sport, pad;
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
		    const addr_t *src, uint16_t sport, const addr_t *dst)
{
	struct fwd_hdr h = { FWD_MAGIC, sport, 0, *src, *dst };
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
		      unsigned seg, struct ursa_qp **run_qp);

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
				  h.sport, &h.dst, true, 0, NULL);
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

/* Receive runs sent with GSO as one buffer (UDP_GRO), when the kernel
 * kept them together; poll_sock cuts them apart. */
static void gro_on(int fd)
{
	int one = 1;

	if (gso_on() && ursa_cfg()->gro)
		setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one));
}

static void rx_connect(struct ursa_uqp *u, const addr_t *peer, uint16_t sport)
{
	struct sockaddr_storage ss;
	socklen_t sl = to_sockaddr(peer, sport, &ss);
	bool v6 = !is_v4(peer);
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

void ursa_udp_qp_forget(struct ursa_qp *qp)
{
	struct ursa_uqp *u = qp->udp;
	int *fds[3];

	if (!u)
		return;
	fds[0] = &u->rxfd;
	fds[1] = &u->txfd;
	fds[2] = &u->txfd6;
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

static void rx_bury(struct ursa_uqp *u)
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

int ursa_udp_start(struct ursa_ctx *ctx)
{
	static struct ursa_watch w = { URSA_W_UDP, (void *)1, NULL };
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &w };
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
	if (ctx->eng) {
		/* The side set holds the receive sockets; without one (it
		 * could not be made), the engine watches them itself. */
		if (U.fwd_ep < 0 && U.fd >= 0)
			epoll_ctl(ctx->eng->epfd, EPOLL_CTL_ADD, U.fd, &ev);
		if (U.fwd_ep < 0 && U.fd6 >= 0)
			epoll_ctl(ctx->eng->epfd, EPOLL_CTL_ADD, U.fd6, &ev);
		if (U.fwd_ep >= 0 &&
		    !epoll_ctl(ctx->eng->epfd, EPOLL_CTL_ADD, U.fwd_ep, &ev))
			ctx->eng->udp_watched = true;
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
 * (a 64 B SEND ping-pong between namespaces: 24-31 µs one way with the
 * engine watching, 15-18 µs without). The engine then leaves the side set
 * out of its epoll set (engine.c decides when and for how long). Without
 * a side set nothing changes.
 */
void ursa_udp_engine_watch(struct ursa_engine *e, bool on)
{
	static struct ursa_watch w = { URSA_W_UDP, (void *)1, NULL };
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &w };

	pthread_mutex_lock(&U.lock);
	if (U.fwd_ep >= 0 && !e->udp_gone && e->udp_watched != on &&
	    !epoll_ctl(e->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, U.fwd_ep, &ev))
		e->udp_watched = on;
	pthread_mutex_unlock(&U.lock);
}

static void socks_close(void);

void ursa_udp_ctx_gone(struct ursa_ctx *ctx)
{
	/* The last context: leave the port's reuseport group. A socket
	 * nobody polls would swallow every flow the kernel hashes to it
	 * (a forked KV client's flow once landed on the socket of its
	 * parent, which had closed its device, and ran out of retries).
	 * U.rx first: a pass of the stopping engine may be reading. */
	pthread_mutex_lock(&U.rx);
	pthread_mutex_lock(&U.lock);
	if (ctx->eng && ctx->eng->epfd >= 0) {
		if (U.fd >= 0)
			epoll_ctl(ctx->eng->epfd, EPOLL_CTL_DEL, U.fd, NULL);
		if (U.fd6 >= 0)
			epoll_ctl(ctx->eng->epfd, EPOLL_CTL_DEL, U.fd6, NULL);
		if (U.fwd_ep >= 0)
			epoll_ctl(ctx->eng->epfd, EPOLL_CTL_DEL, U.fwd_ep, NULL);
		/* (the engine, still running, must not add it again) */
		ctx->eng->udp_watched = false;
		ctx->eng->udp_gone = true;
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

static void udp_flush(void)
{
	struct txbatch *b = txb;
	struct mmsghdr *mm;
	int m = 0, done = 0;

	if (txc_pkts) {
		atomic_fetch_add(&ursa_udp_cnt.tx_pkts, txc_pkts);
		atomic_fetch_add(&ursa_udp_cnt.tx_bytes, txc_bytes);
		txc_pkts = txc_bytes = 0;
	}
	if (!b)
		return;
	mm = b->mm;
	for (; m < b->nruns; m++) {
		struct txrun *r = &b->run[m];
		struct msghdr *h = &mm[m].msg_hdr;

		memset(&mm[m], 0, sizeof(mm[m]));
		h->msg_name = &r->to;
		h->msg_namelen = r->tolen;
		/* A run's packets lie back to back: one piece for the
		 * kernel to copy. Given as one piece per packet, the copy
		 * into the socket had taken twice the time (a raw UDP GSO
		 * stream of 62 x 1040 bytes: 3.5 against 6.9 GB/s). */
		b->riov[m] = (struct iovec){ b->pkt[r->first].iov_base, r->bytes };
		h->msg_iov = &b->riov[m];
		h->msg_iovlen = 1;
		if (r->n > 1) {
			struct cmsghdr *cm;
			uint16_t gs = (uint16_t)r->seg;

			if (r->to.ss_family == AF_INET) {
				const uint32_t *d = id_basis(r->seg - 4);
				uint32_t dk[URSA_GSO_SEGS];

				id_deltas(d, r->n, dk);
				for (int k = 1; k < r->n; k++) {
					uint8_t *p = b->pkt[r->first + k].iov_base;
					size_t l = b->pkt[r->first + k].iov_len;

					roce_icrc_put(p + l - 4, roce_icrc_get(p + l - 4) ^
						      (l == r->seg ? dk[k] :
								     id_delta(l - 4, (unsigned)k)));
				}
			}
			atomic_fetch_add(&ursa_udp_cnt.tx_gso, 1);
			h->msg_control = r->ctl;
			h->msg_controllen = sizeof(r->ctl);
			cm = CMSG_FIRSTHDR(h);
			cm->cmsg_level = SOL_UDP;
			cm->cmsg_type = UDP_SEGMENT;
			cm->cmsg_len = CMSG_LEN(sizeof(gs));
			memcpy(CMSG_DATA(cm), &gs, sizeof(gs));
		}
	}
	while (done < m) {
		int r = sendmmsg(b->fd, mm + done, (unsigned)(m - done), 0);

		if (r <= 0) {
			ursa_dbg("udp send: %s", strerror(errno));
			if (mm[done].msg_hdr.msg_controllen &&
			    (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT ||
			     errno == EOPNOTSUPP)) {
				/* no UDP GSO here: send singly from now on (the
				 * lost run is retransmitted; receivers accept
				 * its fixed-up ICRCs) */
				atomic_store_explicit(&gso_state, -1,
						      memory_order_relaxed);
				ursa_info("RoCEv2: UDP segmentation offload refused (%s): sending packet by packet",
					  strerror(errno));
			}
			break;
		}
		done += r;
	}
	batch_clear(b);
}

/*
 * Whether to send the batch before it is full: its last run cannot grow
 * (closed, or at the segment or byte limit of one GSO send) and the room
 * left is less than that run, so the next one would be cut short. Every
 * cut-off run is one more datagram through the whole stack, as costly as
 * a full one: with 1040-byte packets a batch of 64 went as runs of 62
 * and 2, and sending at 62 took 8 % off a 1 MiB WRITE stream's time.
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
static uint8_t *tx_slot(void)
{
	struct txbatch *b = txb_get();

	if (!b)
		return NULL;
	if (b->n == URSA_UDP_TXB || run_ends_batch(b) ||
	    b->used > sizeof(b->buf) - URSA_UDP_MAX_PKT)
		udp_flush();
	return b->buf + b->used;
}

static bool in_next_slot(const uint8_t *ib)
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
		udp_flush();
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
static void tx_one(struct ursa_uqp *u, const addr_t *src, const addr_t *dst,
		   uint8_t *ib, size_t len, uint8_t ttl, bool have_icrc)
{
	uint8_t ip[40], udp[8];
	struct sockaddr_storage to;
	socklen_t tolen = to_sockaddr(dst, U.port, &to);
	int fd = is_v4(dst) ? u->txfd : u->txfd6;
	bool dup = false;
	size_t hl;

	if (fd < 0 || is_v4(src) != is_v4(dst))
		return;
	ursa_cnt_add(&u->qp->cnt.pkts_tx, 1);	/* (under u->lock) */
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
			return;
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
			return;
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
			return;
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
}

static void ack_emit(struct ursa_uqp *u, bool along);

/* A held ACK leaves now: the QP is going away or changing state, and the
 * peer, whose request a real NIC would have acknowledged long ago, must
 * not wait for it (ibv_rc_pingpong's client destroys its QP as soon as it
 * has the last answer; the server's last SEND would end in retries).
 * !wait: only if the QP's lock is free (at exit). */
static void ack_flush(struct ursa_uqp *u, bool wait)
{
	if (!wait && (!__atomic_load_n(&u->ack_owed, __ATOMIC_RELAXED) ||
		      pthread_mutex_trylock(&u->lock)))
		return;
	if (wait)
		pthread_mutex_lock(&u->lock);
	if (u->ack_owed)
		ack_emit(u, true);
	pthread_mutex_unlock(&u->lock);
	udp_flush();
}

void ursa_udp_ack_exit(struct ursa_qp *qp)
{
	/* (at exit: never wait for a lock another thread may keep) */
	if (qp->udp)
		ack_flush(qp->udp, false);
}

/*
 * tx_one, with the QP's held-back ACK (ack_later) in the same batch. After
 * the requests a step sends (ursa_udp_step emits it at its end): the peer,
 * polling for that ACK, then finds our whole request already there when
 * the ACK lets its poll return (perftest's WRITE latency test, which then
 * spins on memory, otherwise leaves the request to its engine, which on a
 * host whose cores spin may not run for milliseconds), and the request is
 * not delayed by the ACK's trip. The peer holds a request that would
 * complete a receive until the ACK is in (hold_request), so its send
 * completion still comes first. Before a response (NAK, READ response,
 * atomic ACK): PSN order. Called with u->lock held.
 */
static void tx(struct ursa_uqp *u, const addr_t *src, const addr_t *dst,
	       uint8_t *ib, size_t len, uint8_t ttl, bool have_icrc)
{
	uint8_t moved[URSA_UDP_MAX_PKT];

	if (u->ack_owed && (roce_opcode_flags(ib[0]) & P_RESP)) {
		/* (the ACK takes the slot a packet was built in) */
		if (in_next_slot(ib) && len <= sizeof(moved)) {
			memcpy(moved, ib, len);
			ib = moved;
		}
		ack_emit(u, true);
	}
	tx_one(u, src, dst, ib, len, ttl, have_icrc);
}

/* --- per-QP state ------------------------------------------------------------ */

static bool can_receive(int st)
{
	return st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
	       st == IBV_QPS_SQE;
}

int ursa_uqp_init(struct ursa_qp *qp)
{
	struct ursa_uqp *u = calloc(1, sizeof(*u));
	struct sockaddr_in sa = { .sin_family = AF_INET };
	uint32_t qpn = qp->ex.qp_base.qp_num;
	int one = 1, pmtu = IP_PMTUDISC_DO;

	if (!u)
		return -ENOMEM;
	pthread_mutex_init(&u->lock, NULL);
	u->qp = qp;
	u->cwnd = URSA_UDP_WINDOW;
	u->ssthresh = URSA_UDP_WINDOW_MAX;
	u->rxfd = -1;
	/* rxe's choice of source port: 0xC000 + a hash of the QPN */
	u->sport = (uint16_t)(0xc000 | (((qpn * 0x61c88647u) >> 18) & 0x3fff));
	u->txfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u->txfd >= 0) {
		setsockopt(u->txfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(u->txfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		/* DF set and unconnected: Linux sends IP ID 0, which the
		 * ICRC covers */
		setsockopt(u->txfd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
		sa.sin_port = htons(u->sport);
		if (bind(u->txfd, (struct sockaddr *)&sa, sizeof(sa))) {
			close(u->txfd);
			u->txfd = -1;
		}
	}
	u->txfd6 = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u->txfd6 >= 0) {
		struct sockaddr_in6 s6 = { .sin6_family = AF_INET6,
					   .sin6_port = htons(u->sport) };

		setsockopt(u->txfd6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		setsockopt(u->txfd6, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(u->txfd6, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		if (bind(u->txfd6, (struct sockaddr *)&s6, sizeof(s6))) {
			close(u->txfd6);
			u->txfd6 = -1;
		}
	}
	qp->udp = u;
	return 0;
}

void ursa_uqp_fini(struct ursa_qp *qp)
{
	struct ursa_uqp *u = qp->udp;

	if (!u)
		return;
	ack_flush(u, true);
	free(u->stash);
	ursa_rstate_drop(&u->rs);
	rx_bury(u);
	if (u->txfd >= 0)
		close(u->txfd);
	if (u->txfd6 >= 0)
		close(u->txfd6);
	pthread_mutex_destroy(&u->lock);
	free(u);
	qp->udp = NULL;
}

/*
 * Pipelining. A QP's messages go out one after another without waiting
 * for each other's answers, as on a NIC: the message being sent is u->m;
 * the ones sent whole before it wait in the pipe (PIPE(u, 0) the oldest)
 * and complete in order. WRITEs and SENDs join a pipe of their kind and
 * complete when the cumulative ACK covers their last PSN (IBTA
 * 9.7.5.1.1); READs and atomics join one of theirs (at most max_rd_atomic
 * of them, each READ asked for whole) and complete when all their
 * responses are in (a READ's land in its own buffers, an atomic's one
 * ATOMIC ACKNOWLEDGE brings its original value), never by an ACK. A
 * READ or atomic behind WRITEs and a WRITE behind READs or atomics wait
 * until all before them are answered, so fences need nothing new. Losses
 * stay simple: whatever takes a message of the pipe back (a NAK for one
 * of its PSNs, a response missing while later ones come, the timers)
 * first completes those that the NAK acknowledged, then makes the oldest
 * unanswered message the one in flight again (pipe_collapse) and drops
 * the state of the others; they go out again after it, with the same
 * PSNs, as go-back-N wants. Without this a QP moved one message per
 * round trip: 9 000 64-byte WRITEs a second between namespaces.
 */
static bool is_atomic_op(uint32_t op)
{
	return op == IBV_WR_ATOMIC_CMP_AND_SWP ||
	       op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

static int pipe_class(uint32_t op)
{
	if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
	    op == IBV_WR_SEND_WITH_INV)
		return 1;
	return op == IBV_WR_RDMA_READ || is_atomic_op(op) ? 2 : 0;
}

/* The pipe entry holding PSN psn, or -1. */
static int pipe_holds(const struct ursa_uqp *u, uint32_t psn)
{
	for (uint32_t i = 0; i < u->pipe_n; i++)
		if (((psn - PIPE(u, i)->first) & 0xffffff) < PIPE(u, i)->npkts)
			return (int)i;
	return -1;
}

static void pipe_drop(struct ursa_uqp *u)
{
	for (uint32_t i = 0; i < u->pipe_n; i++)
		PIPE(u, i)->wqe->piped = false;
	u->pipe_n = u->pipe_out = u->pipe_nak = 0;
	u->pipe_gap = false;
}

static void pipe_pop(struct ursa_uqp *u)
{
	const struct upipe *e = PIPE(u, 0);

	if (!e->done)
		u->pipe_out -= MIN(u->pipe_out, e->npkts - e->acked);
	if (u->pipe_nak && ((u->pipe_nak_psn - e->first) & 0xffffff) < e->npkts)
		u->pipe_nak = 0;
	e->wqe->piped = false;
	u->pipe_n--;
	u->pipe_head = (u->pipe_head + 1) % URSA_UDP_PIPE;
	if (!u->pipe_n) {
		u->pipe_out = u->pipe_nak = 0;
		u->pipe_gap = false;
	}
}

void ursa_uqp_modified(struct ursa_qp *qp, int mask)
{
	struct ursa_uqp *u = qp->udp;

	if (!u)
		return;
	if (mask & IBV_QP_STATE)
		ack_flush(u, true);
	pthread_mutex_lock(&u->lock);
	if (mask & IBV_QP_RQ_PSN) {
		u->epsn = qp->attr.rq_psn;
		u->nak_sent = false;
		memset(u->rres, 0, sizeof(u->rres));
	}
	if (mask & IBV_QP_SQ_PSN)
		u->next_psn = u->psn_hi = qp->attr.sq_psn;
	if (mask & IBV_QP_STATE) {
		u->m.active = false;
		pipe_drop(u);
		u->pipe_cool = NULL;
		ursa_rstate_drop(&u->rs);
		if (!can_receive(qp->attr.qp_state))
			__atomic_store_n(&u->stash_len, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&u->lock);
}

void ursa_udp_abort(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_uqp *u = qp->udp;

	if (!u)
		return;
	pthread_mutex_lock(&u->lock);
	if (u->pipe_cool == w)
		u->pipe_cool = NULL;
	/* WQEs complete in order: one sent whole leaves the front of the
	 * pipe, the one being sent drops its state */
	if (u->pipe_n && PIPE(u, 0)->wqe == w) {
		pipe_pop(u);
	} else if (u->m.wqe == w) {
		u->m.active = false;
		pipe_drop(u);	/* (flushed behind it) */
	}
	pthread_mutex_unlock(&u->lock);
}

static uint32_t mtu_of(struct ursa_qp *qp)
{
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD)
		return (uint32_t)ursa_mtu_bytes(ursa_device_get()->active_mtu);
	return (uint32_t)ursa_mtu_bytes(qp->attr.path_mtu ? qp->attr.path_mtu :
							    IBV_MTU_1024);
}

static uint32_t window_max(struct ursa_qp *qp)
{
	int rb = __atomic_load_n(&U.rcvbuf, __ATOMIC_RELAXED);
	uint32_t bytes = MIN(URSA_UDP_WINDOW_BYTES, (uint32_t)MAX(rb, 0) / 2);

	return MIN(URSA_UDP_WINDOW_MAX,
		   MAX(URSA_UDP_WINDOW, bytes / mtu_of(qp)));
}

/* n more packets acknowledged. Up to a threshold the window grows by each
 * packet acknowledged; beyond it, by one packet per window acknowledged, as
 * TCP's does (RFC 5681). The threshold starts at the maximum and a loss sets
 * it to half the window then, but never below URSA_UDP_WINDOW packets: a
 * lossy path's window comes back at once to URSA_UDP_WINDOW (a cumulative ACK
 * may cover hundreds of packets: a pipelined message's end, an ACK after a
 * NAK), where go-back-N under 5 % loss still moves the most data, and only
 * slowly beyond it, where each loss would cost a larger window resent. */
static void window_grow(struct ursa_qp *qp, struct ursa_uqp *u, uint32_t n)
{
	uint32_t max = window_max(qp);

	if (u->cwnd < u->ssthresh) {
		u->cwnd = MIN(MIN(u->cwnd + n, u->ssthresh), max);
		return;
	}
	u->cwnd_acc += n;
	while (u->cwnd_acc >= u->cwnd && u->cwnd < max) {
		u->cwnd_acc -= u->cwnd;
		u->cwnd++;
	}
	u->cwnd = MIN(u->cwnd, max);
}

static uint8_t transport_bits(struct ursa_qp *qp)
{
	switch (qp->ex.qp_base.qp_type) {
	case IBV_QPT_UC: return ROCE_UC;
	case IBV_QPT_UD: return ROCE_UD;
	default: return ROCE_RC;
	}
}

/* Control packet (ACK, NAK, ATOMIC ACK) from a responder QP. */
static void send_ack(struct ursa_qp *qp, struct ursa_uqp *u, const addr_t *to,
		     const addr_t *from, uint8_t opcode, uint8_t syn, uint32_t psn,
		     uint64_t orig)
{
	uint8_t buf[64];
	struct roce_pkt p = { 0 };
	int n;

	p.opcode = (uint8_t)(ROCE_RC | opcode);
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = psn & 0xffffff;
	p.syndrome = syn;
	p.msn = u->msn & 0xffffff;
	p.orig = orig;
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		tx(u, from, to, buf, (size_t)n, qp->attr.ah_attr.grh.hop_limit,
		   false);
	if ((syn & AETH_TYPE_MASK) == AETH_NAK)
		atomic_fetch_add(&ursa_udp_cnt.naks_sent, 1);
}

/*
 * Delayed ACK. A responder that acknowledges at once pays a system call
 * per message on its critical path, and the requester, woken by the lone
 * ACK, returns to spinning on its memory (perftest's latency tests) so
 * that the answer it then gets must wake its engine thread. Held back, the
 * ACK leaves in the same sendmmsg as the QP's next packets to the peer
 * (after the requests of a step, see tx), usually the application's
 * answer, which the peer, still polling for the ACK, then takes in the
 * same pass: in a ping-pong neither side's engine is needed. IBTA
 * 9.7.5.1.1 allows coalescing: an ACK covers every PSN up to its own.
 * Only the ACK of a message's last packet is held (on_request).
 *
 * An ACK waits at most URSA_ACK_DELAY_US (default 50 us, 0: never; far
 * below the 1 ms floor of the peer's RTO). When one had to go alone, the
 * next ones go at once (at the pass's end), 1, 3, 7 ... 1023 of them: a
 * peer that only sends (a bandwidth test) is not slowed. NAKs, READ
 * responses and atomic ACKs are never held (they go after the held ACK,
 * in PSN order).
 */

static uint64_t ack_delay_ns(void)
{
	return (uint64_t)ursa_cfg()->ack_delay_us * 1000;
}

static void ack_later(struct ursa_qp *qp, struct ursa_uqp *u,
		      const addr_t *peer, const addr_t *me, uint32_t psn)
{
	if (!ack_delay_ns() || u->ack_skip) {
		if (u->ack_skip)
			u->ack_skip--;
		if (qp->ctx != ursa_pass_ctx) {
			send_ack(qp, u, peer, me, OP_ACK,
				 AETH_ACK | AETH_CREDIT_INVALID, psn, 0);
			return;
		}
		/* At once, but after the rest of what this pass receives
		 * (its ursa_udp_acks): one ACK then covers every message of
		 * a stream that came in together, where each had its own
		 * system call, which on a veth path carries it all the way
		 * to the peer's socket (a pipelined 64-byte WRITE stream was
		 * bound by that). */
		u->ack_now = true;
		u->ack_due = 0;
	} else if (!u->ack_owed) {
		u->ack_due = ursa_now_ns() + ack_delay_ns();
	}
	u->ack_psn = psn;
	u->ack_peer = *peer;
	u->ack_me = *me;
	__atomic_store_n(&u->ack_owed, true, __ATOMIC_RELAXED);
	atomic_store_explicit(&qp->udp_held, true, memory_order_relaxed);
	if (!u->ack_now)
		atomic_fetch_add(&ursa_udp_cnt.acks_held, 1);
}

/* Send the held ACK (u->lock held); along: with another packet. */
static void ack_emit(struct ursa_uqp *u, bool along)
{
	__atomic_store_n(&u->ack_owed, false, __ATOMIC_RELAXED);
	if (u->ack_now) {
		u->ack_now = false;	/* (not held: the backoff stays) */
	} else if (along) {
		u->ack_backoff = 0;
	} else {
		if (u->ack_backoff < 10)
			u->ack_backoff++;
		u->ack_skip = (1u << u->ack_backoff) - 1;
		atomic_fetch_add(&ursa_udp_cnt.acks_alone, 1);
	}
	send_ack(u->qp, u, &u->ack_peer, &u->ack_me, OP_ACK,
		 AETH_ACK | AETH_CREDIT_INVALID, u->ack_psn, 0);
}

static void run_held(struct ursa_qp *qp, struct ursa_uqp *u);

/* Is what waits until due due now? If not, *deadline comes down to it. An
 * application's pass rings the sleeping engine only if it would sleep
 * well past the due time: an engine that naps while the application polls
 * wakes soon anyway. */
static bool held_due(uint64_t due, uint64_t now, uint64_t *deadline,
		     bool engine)
{
	uint64_t d = engine ? due : due + URSA_UDP_ACK_WAKE_SLACK_NS;

	if (now >= due)
		return true;
	if (d < *deadline)
		*deadline = d;
	return false;
}

int ursa_udp_acks(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline,
		  bool engine)
{
	struct ursa_uqp *u = qp->udp;
	int sent = 0;

	if (!u || (!__atomic_load_n(&u->ack_owed, __ATOMIC_RELAXED) &&
		   !__atomic_load_n(&u->stash_len, __ATOMIC_RELAXED)))
		return 0;
	pthread_mutex_lock(&u->lock);
	if (u->stash_len &&
	    held_due(u->stash_due, ursa_need_now(now), deadline, engine)) {
		run_held(qp, u);
		sent++;
	}
	if (u->ack_owed &&
	    held_due(u->ack_due, ursa_need_now(now), deadline, engine)) {
		ack_emit(u, false);
		sent++;
	}
	pthread_mutex_unlock(&u->lock);
	udp_flush();
	return sent;
}

static uint8_t nak_syndrome(enum ursa_ack a, uint8_t rnr)
{
	switch (a) {
	case URSA_NAK_RNR: return (uint8_t)(AETH_RNR | (rnr & 0x1f));
	case URSA_NAK_ACCESS: return AETH_NAK_ACCESS;
	case URSA_NAK_OP_ERR: return AETH_NAK_OP;
	default: return AETH_NAK_INV;
	}
}

/* --- requester ---------------------------------------------------------------- */

static uint8_t req_opcode(uint32_t op, bool first, bool last, bool imm_inv)
{
	uint8_t o;

	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		if (first && last)
			o = op == IBV_WR_RDMA_WRITE ? OP_WRITE_ONLY : OP_WRITE_ONLY_IMM;
		else if (first)
			o = OP_WRITE_FIRST;
		else if (last)
			o = op == IBV_WR_RDMA_WRITE ? OP_WRITE_LAST : OP_WRITE_LAST_IMM;
		else
			o = OP_WRITE_MIDDLE;
		return o;
	default: /* SEND family */
		if (first && last)
			o = op == IBV_WR_SEND_WITH_IMM ? OP_SEND_ONLY_IMM :
			    op == IBV_WR_SEND_WITH_INV ? OP_SEND_ONLY_INV : OP_SEND_ONLY;
		else if (first)
			o = OP_SEND_FIRST;
		else if (last)
			o = op == IBV_WR_SEND_WITH_IMM ? OP_SEND_LAST_IMM :
			    op == IBV_WR_SEND_WITH_INV ? OP_SEND_LAST_INV : OP_SEND_LAST;
		else
			o = OP_SEND_MIDDLE;
		(void)imm_inv;
		return o;
	}
}

/* Whether packet k of the message asks for an ACK: the last, every
 * URSA_UDP_ACKREQ_EVERY-th, and the one that fills the window (a window smaller
 * than URSA_UDP_ACKREQ_EVERY after losses must still be acknowledged). Each ACK
 * costs the responder a send, which on a veth path carries it through
 * the whole stack: fewer ACKs, more bandwidth. */
static bool ack_wanted(const struct ursa_qp *qp, const struct ursa_uqp *u,
		       uint32_t k, bool last)
{
	return qp->ex.qp_base.qp_type == IBV_QPT_RC &&
	       (last ||
		k % URSA_UDP_ACKREQ_EVERY == URSA_UDP_ACKREQ_EVERY - 1 ||
		k + 1 == u->m.acked + u->cwnd);
}

/* Send packet k of the message. */
static void send_data_pkt(struct ursa_qp *qp, struct ursa_uqp *u,
			  const struct ursa_req *r, const struct ursa_send_wqe *w,
			  uint32_t k, const addr_t *src, const addr_t *dst)
{
	/* built where the batch will send it from: one copy, from the MR
	 * (none: not sent, see struct txbatch) */
	uint8_t *buf = tx_slot();
	struct roce_pkt p = { 0 };
	uint64_t off = (uint64_t)k * u->m.mtu;
	uint32_t len = (uint32_t)MIN((uint64_t)u->m.mtu, r->msg_len - off);
	bool first = k == 0, last = k + 1 == u->m.npkts;
	bool ud = qp->ex.qp_base.qp_type == IBV_QPT_UD;
	struct ursa_sg part[URSA_MAX_SGE];
	uint8_t *pay, ttl;
	int n;

	if (!buf)
		return;
	if (r->msg_len == 0)
		len = 0;
	p.opcode = (uint8_t)(transport_bits(qp) | req_opcode(r->opcode, first, last, false));
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = ud ? w->remote_qpn : qp->attr.dest_qp_num;
	p.psn = psn_add(u->m.first, k);
	p.se = last && r->solicited;
	p.ackreq = ack_wanted(qp, u, k, last);
	if (!first && !last) {
		/* a MIDDLE packet (RC, UC): the BTH, then a whole MTU of
		 * payload (a multiple of 4: no pad); most of a stream */
		roce_bth_put(buf, p.opcode, false, false, 0, p.pkey, p.dqpn,
			     p.ackreq, p.psn);
		pay = buf + ROCE_BTH_LEN;
		n = (int)(ROCE_BTH_LEN + len + ROCE_ICRC_LEN);
	} else {
		p.va = r->remote_addr;
		p.rkey = r->rkey;
		p.dmalen = (uint32_t)r->msg_len;
		p.imm = r->imm;
		p.qkey = r->qkey;
		p.sqpn = qp->ex.qp_base.qp_num;
		/* the headers and the pad, then the payload and the ICRC
		 * together */
		pay = buf + roce_hdr_len(p.opcode);
		n = roce_build(buf, URSA_UDP_MAX_PKT, &p, pay, len);
		if (n <= 0)
			return;
	}
	ttl = r->hop_limit ? r->hop_limit : 64;
	if (is_v4(src) == is_v4(dst)) {	/* (else tx_one sends nothing) */
		uint32_t pfx = icrc_pfx(&u->pfx, src, dst, u->sport, U.port,
					(size_t)n);
		struct iovec v[URSA_MAX_SGE];
		uint32_t np = len ? ursa_sg_slice(r->src, r->nsrc, off, len, part) : 0;

		for (uint32_t i = 0; i < np; i++)
			v[i] = (struct iovec){ (void *)(uintptr_t)part[i].va,
					       part[i].len };
		roce_icrc_put(buf + n - 4,
			      roce_icrc_fill_from(pfx, buf, (size_t)n - 4,
						  (size_t)(pay - buf), v, np));
	}
	tx(u, src, dst, buf, (size_t)n, ttl, true);
}

/* Time one first-sent packet at a time; a retransmission cancels the
 * measurement, since its answer could be for either copy (Karn). */
static void rtt_start(struct ursa_uqp *u, uint32_t idx, uint64_t now)
{
	if (u->timing)
		return;
	u->timing = true;
	u->t_psn = psn_add(u->m.first, idx);
	u->t_sent = now;
}

/* PSNs up to last are acknowledged: take the sample if it is one of them,
 * and progress ends the backoff. */
static void rtt_acked_psn(struct ursa_uqp *u, uint32_t last, uint64_t now)
{
	uint64_t r, d;

	u->backoff = 0;
	if (!u->timing || ((last - u->t_psn) & 0xffffff) >= 0x800000)
		return;
	u->timing = false;
	r = now - u->t_sent;
	if (!u->srtt) {
		u->srtt = r;
		u->rttvar = r / 2;
		return;
	}
	d = r > u->srtt ? r - u->srtt : u->srtt - r;
	u->rttvar = (3 * u->rttvar + d) / 4;
	u->srtt = (7 * u->srtt + r) / 8;
}

/* The first acked packets of the message in flight are acknowledged. */
static void rtt_acked(struct ursa_uqp *u, uint32_t acked, uint64_t now)
{
	if (acked)
		rtt_acked_psn(u, psn_add(u->m.first, acked - 1), now);
	else
		u->backoff = 0;
}

/* Packets up to (not including) end have been sent: answers for them
 * may come (psn_in_flight). */
static inline void psn_sent(struct ursa_uqp *u, uint32_t end)
{
	if (((end - u->psn_hi) & 0xffffff) - 1 < 0x7fffff)
		u->psn_hi = end;
}

static void send_read_req(struct ursa_qp *qp, struct ursa_uqp *u,
			  const struct ursa_req *r, const addr_t *src,
			  const addr_t *dst)
{
	uint8_t buf[64];
	struct roce_pkt p = { 0 };
	uint64_t off = (uint64_t)u->m.acked * u->m.mtu;
	int n;

	p.opcode = ROCE_RC | OP_READ_REQ;
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	/* a retried READ asks for what is still missing, at its PSN */
	p.psn = psn_add(u->m.first, u->m.acked);
	p.ackreq = true;
	p.va = r->remote_addr + off;
	p.rkey = r->rkey;
	/* At most a window's worth per request: a long burst of responses
	 * that loses one packet would otherwise be resent whole. The next
	 * request continues at the next PSN, as a retried READ does. */
	if (u->m.acked == u->m.sent) {	/* a new piece */
		u->m.sent = MIN(u->m.npkts, u->m.acked + u->cwnd);
		rtt_start(u, u->m.acked, ursa_now_ns());
	} else {
		u->timing = false;	/* asked again */
	}
	/* A re-request stays inside its piece: a duplicate READ must be a
	 * subset of the original (IBTA 9.7.5.1.3). */
	p.dmalen = (uint32_t)MIN(r->msg_len - MIN(off, r->msg_len),
				 (uint64_t)(u->m.sent - u->m.acked) * u->m.mtu);
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		tx(u, src, dst, buf, (size_t)n, r->hop_limit ? r->hop_limit : 64,
		   false);
}

static void send_atomic(struct ursa_qp *qp, struct ursa_uqp *u,
			const struct ursa_req *r, const addr_t *src,
			const addr_t *dst)
{
	uint8_t buf[96];
	struct roce_pkt p = { 0 };
	int n;

	p.opcode = (uint8_t)(ROCE_RC | (r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ?
					OP_CMP_SWAP : OP_FETCH_ADD));
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = u->m.first;
	p.ackreq = true;
	p.va = r->remote_addr;
	p.rkey = r->rkey;
	if (r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
		p.swap_add = r->swap;
		p.compare = r->compare_add;
	} else {
		p.swap_add = r->compare_add;
	}
	psn_sent(u, psn_add(u->m.first, 1));
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		tx(u, src, dst, buf, (size_t)n, r->hop_limit ? r->hop_limit : 64,
		   false);
}

static uint64_t timeout_ns(struct ursa_qp *qp)
{
	return ursa_ack_timeout_ns(qp->attr.timeout);
}

static uint64_t after(uint64_t now, uint64_t d)
{
	return d == UINT64_MAX ? UINT64_MAX : now + d;
}

/*
 * Early retransmission: packets outstanding with no news for the RTO are
 * sent again from the first unacknowledged one. A lost last packet, ACK or
 * NAK then costs about a round trip instead of a whole ACK timeout;
 * duplicates are harmless to the responder (IBTA 9.7.5.1.3). Only the ACK
 * timeout counts against retry_cnt.
 *
 * The RTO follows the measured round trip as TCP's does (RFC 6298):
 * srtt + 4 * rttvar, never below URSA_RTO_US (default 1 ms) nor above
 * the ACK timeout, doubled for each early retransmission that brought no
 * progress. A fixed RTO shorter than the round trip of a loaded host (a
 * peer process waiting for a core) resends windows that were never lost,
 * which loads the host further: congestion collapse.
 */
static uint64_t rto_ns(struct ursa_qp *qp)
{
	struct ursa_uqp *u = qp->udp;
	uint64_t floor = (uint64_t)ursa_cfg()->rto_us * 1000, r;

	r = u->srtt ? MAX(floor, u->srtt + 4 * u->rttvar) : floor;
	r <<= MIN(u->backoff, 8u);
	return MIN(timeout_ns(qp), r);
}

/* Send again from the first unacknowledged packet (a READ asks again
 * inside its piece, an atomic is resent whole), and back the RTO off. */
static void go_back(struct ursa_qp *qp, struct ursa_uqp *u, bool atomic,
		    uint64_t now)
{
	atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
	u->timing = false;
	u->backoff++;
	u->cwnd = MAX(URSA_UDP_WINDOW_MIN, u->cwnd / 2);
	u->ssthresh = MAX(URSA_UDP_WINDOW, u->cwnd);
	u->cwnd_acc = 0;
	if (u->m.is_read)
		u->m.resend_read = true;
	else
		u->m.sent = u->m.acked;
	if (atomic)
		u->m.sent = 0;
	u->m.rto = after(now, rto_ns(qp));
}

/* Packets of m that may go out now (the window counts the pipe's too). */
static bool window_open(const struct ursa_uqp *u)
{
	return !u->m.is_read && u->m.sent < u->m.npkts &&
	       u->pipe_out + (u->m.sent - u->m.acked) < u->cwnd;
}

/* PSNs up to last are acknowledged (cumulative): the pipe's messages they
 * cover are done. */
static void pipe_ack(struct ursa_qp *qp, struct ursa_uqp *u, uint32_t last,
		     uint64_t now)
{
	bool moved = false;

	for (uint32_t i = 0; i < u->pipe_n; i++) {
		struct upipe *e = PIPE(u, i);
		uint32_t idx = (last - e->first) & 0xffffff, n;

		if (e->done)
			continue;
		if (idx >= 0x800000 || e->is_read || e->is_atomic)
			break;	/* (before this message; READ, atomic: their
				 * responses) */
		n = MIN(idx + 1, e->npkts);
		if (n > e->acked) {
			u->pipe_out -= MIN(u->pipe_out, n - e->acked);
			window_grow(qp, u, n - e->acked);
			e->acked = n;
			moved = true;
		}
		if (e->acked < e->npkts)
			break;
		e->done = true;
	}
	if (moved) {
		rtt_acked_psn(u, last, now);
		u->m.deadline = after(now, timeout_ns(qp));
		u->m.rto = after(now, rto_ns(qp));
	}
}

/* The oldest message of the pipe becomes the one in flight again (see
 * pipe_class); the others' state goes: they start again behind it. */
static void pipe_collapse(struct ursa_uqp *u)
{
	struct upipe e = *PIPE(u, 0);
	uint64_t deadline = u->m.deadline, rto = u->m.rto;

	memset(&u->m, 0, sizeof(u->m));
	u->m.active = true;
	u->m.wqe = e.wqe;
	u->m.op = e.op;
	u->m.mtu = e.mtu;
	u->m.len = e.len;
	u->m.npkts = e.npkts;
	u->m.first = e.first;
	u->m.sent = u->m.acked = e.acked;
	u->m.hiwat = e.npkts;
	u->m.deadline = deadline;
	u->m.rto = rto;
	u->m.is_read = e.is_read;	/* (asks again from acked) */
	u->m.ndst = e.ndst;
	memcpy(u->m.dst, e.dst, e.ndst * sizeof(e.dst[0]));
	if (u->pipe_nak && ((u->pipe_nak_psn - e.first) & 0xffffff) < e.npkts) {
		u->m.nak = u->pipe_nak;
		u->m.nak_psn = u->pipe_nak_psn;
	}
	u->next_psn = psn_add(e.first, e.npkts);
	pipe_drop(u);
	u->timing = false;
	if (e.is_read || e.is_atomic)
		u->pipe_cool = e.wqe;
}

static bool can_start(struct ursa_qp *qp, const struct ursa_uqp *u,
		      const struct ursa_send_wqe *w)
{
	int c = pipe_class(u->m.op);

	return qp->ex.qp_base.qp_type == IBV_QPT_RC && u->m.active &&
	       !u->m.done && !u->m.nak && !u->pipe_nak && !u->pipe_gap &&
	       c && c == pipe_class(w->opcode) && !u->m.resend_read &&
	       (c != 2 || (u->pipe_n + 2 <= qp->attr.max_rd_atomic &&
			   !u->pipe_cool)) &&
	       u->m.sent == u->m.npkts && u->pipe_n < URSA_UDP_PIPE &&
	       u->pipe_out + (u->m.npkts - u->m.acked) < u->cwnd &&
	       u->m.mtu == mtu_of(qp);
}

bool ursa_udp_can_start(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_uqp *u = qp->udp;
	bool ok;

	if (!u)
		return false;
	pthread_mutex_lock(&u->lock);
	ok = can_start(qp, u, w);
	pthread_mutex_unlock(&u->lock);
	return ok;
}

uint32_t ursa_udp_piped(struct ursa_qp *qp)
{
	struct ursa_uqp *u = qp->udp;

	return u ? __atomic_load_n(&u->pipe_n, __ATOMIC_RELAXED) : 0;
}

int ursa_udp_inflight(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_uqp *u = qp->udp;
	int in = 0;

	if (!u)
		return 0;
	pthread_mutex_lock(&u->lock);
	if (u->m.active && u->m.wqe == w)
		in = 2;
	else if (w->piped)
		in = 1;
	pthread_mutex_unlock(&u->lock);
	return in;
}

bool ursa_udp_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now)
{
	struct ursa_uqp *u = qp->udp;

	if (u && u->pipe_n && PIPE(u, 0)->wqe == w)
		return PIPE(u, 0)->done || u->pipe_nak || u->pipe_gap ||
		       now >= u->m.deadline ||
		       now >= u->m.rto || (!u->m.nak && window_open(u));
	if (!u || !u->m.active || u->m.wqe != w)
		return true;
	return u->m.done || u->m.nak || now >= u->m.deadline ||
	       now >= u->m.rto ||
	       (u->m.is_read && u->m.acked == u->m.sent &&
		u->m.acked < u->m.npkts) ||
	       u->m.resend_read || window_open(u);
}

/*
 * A MIDDLE packet (RC, UC) by the short way, most of a stream: what the
 * message's MIDDLE packets share is worked out at the first (u->m.mid_*:
 * opcode, socket, destination, and the ICRC's register up to the BTH's
 * AckReq byte, since only that byte and the PSN differ), and each packet
 * then costs its BTH, four bytes of CRC, the payload's copy with its CRC
 * and its place in the batch. Not taken while faults are injected or a
 * capture is written (tx_one does those), nor where the SGEs do not fill
 * the packet. Returns whether the packet was sent (or, with no batch,
 * lost as send_data_pkt would lose it); false: send it the long way.
 */
static atomic_uint_fast64_t mid_tags;	/* the last u->m.mid_tag given */

static bool send_mid(struct ursa_qp *qp, struct ursa_uqp *u,
		     const struct ursa_req *r, uint32_t k, const addr_t *src,
		     const addr_t *dst)
{
	uint32_t mtu = u->m.mtu, np, got = 0;
	size_t n = ROCE_BTH_LEN + mtu + ROCE_ICRC_LEN;
	struct ursa_sg part[URSA_MAX_SGE];
	uint8_t *buf, *at;
	uint32_t reg;

	if (U.loss | U.dup | U.reorder | U.corrupt || U.pcap || U.held_len)
		return false;
	np = ursa_sg_slice(r->src, r->nsrc, (uint64_t)k * mtu, mtu, part);
	for (uint32_t i = 0; i < np; i++)
		got += (uint32_t)part[i].len;
	if (got != mtu)
		return false;
	if (!u->m.mid_ok) {
		uint8_t bth[ROCE_BTH_LEN];
		uint32_t dqpn = qp->attr.dest_qp_num;

		if (is_v4(src) != is_v4(dst) ||
		    (u->m.mid_fd = is_v4(dst) ? u->txfd : u->txfd6) < 0)
			return false;
		u->m.mid_op = (uint8_t)(transport_bits(qp) |
					req_opcode(r->opcode, false, false, false));
		u->m.mid_tolen = to_sockaddr(dst, U.port, &u->m.mid_to);
		roce_bth_put(bth, u->m.mid_op, false, false, 0,
			     ROCE_DEFAULT_PKEY, dqpn, false, 0);
		bth[4] = 0xff;	/* masked in the ICRC: FECN, BECN, reserved */
		u->m.mid_reg = roce_crc32_raw(icrc_pfx(&u->pfx, src, dst,
						       u->sport, U.port, n),
					      bth, 8);
		u->m.mid_tag = atomic_fetch_add_explicit(&mid_tags, 1,
							 memory_order_relaxed) + 1;
		u->m.mid_ok = true;
	}
	buf = tx_slot();
	if (buf) {
		roce_bth_put(buf, u->m.mid_op, false, false, 0,
			     ROCE_DEFAULT_PKEY, qp->attr.dest_qp_num,
			     ack_wanted(qp, u, k, false), psn_add(u->m.first, k));
		reg = roce_crc32_4(u->m.mid_reg, buf + 8);
		at = buf + ROCE_BTH_LEN;
		for (uint32_t i = 0; i < np; i++) {
			reg = roce_crc32_copy(reg, at,
					      (const void *)(uintptr_t)part[i].va,
					      part[i].len);
			at += part[i].len;
		}
		roce_icrc_put(at, ~reg);
		batch_add(u->m.mid_fd, buf, n, &u->m.mid_to, u->m.mid_tolen,
			  u->m.mid_tag);
		ursa_cnt_add(&qp->cnt.pkts_tx, 1);	/* (under u->lock) */
		txc_pkts++;
		txc_bytes += n;
	}
	return true;
}

static void send_more(struct ursa_qp *qp, struct ursa_uqp *u,
		      const struct ursa_req *r, struct ursa_send_wqe *w,
		      const addr_t *src, const addr_t *dst, uint64_t now)
{
	while (window_open(u)) {
		uint32_t k = u->m.sent;

		if (k >= u->m.hiwat) {
			rtt_start(u, k, now);
			u->m.hiwat = k + 1;
		}
		if (k == 0 || k + 1 >= u->m.npkts || u->m.is_read ||
		    !send_mid(qp, u, r, k, src, dst))
			send_data_pkt(qp, u, r, w, k, src, dst);
		u->m.sent++;
		psn_sent(u, psn_add(u->m.first, u->m.sent));
	}
}

int ursa_udp_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		  const struct ursa_req *r, uint64_t now,
		  struct ursa_resp *resp, uint64_t *until)
{
	struct ursa_uqp *u = qp->udp;
	bool rc = qp->ex.qp_base.qp_type == IBV_QPT_RC;
	bool atomic = is_atomic_op(r->opcode);
	const addr_t *src = &r->sgid, *dst = &r->dgid;
	unsigned long batch0;
	int ret = 0;

	atomic_store_explicit(&U.live, true, memory_order_relaxed);

	memset(resp, 0, sizeof(*resp));
	if (!u || is_v4(src) != is_v4(dst) ||
	    (is_v4(dst) ? (U.fd < 0 && U.fwd < 0) || u->txfd < 0 :
			  (U.fd6 < 0 && U.fwd < 0) || u->txfd6 < 0)) {
		/* no way out: an unanswered request */
		resp->ack = URSA_DROPPED;
		resp->why = URSA_WHY_UNREACHABLE;
		resp->final = true;
		return 1;
	}
	pthread_mutex_lock(&u->lock);
	batch0 = tx_added;
	*until = UINT64_MAX;
	if (u->pipe_n && PIPE(u, 0)->wqe == w) {
		/* the oldest message in flight: done, or taken back */
		if (PIPE(u, 0)->done) {
			resp->ack = URSA_ACK;
			resp->atomic_orig = PIPE(u, 0)->orig;
			pipe_pop(u);
			ret = 1;
			goto out;
		}
		if (!u->pipe_nak && !u->pipe_gap && now < u->m.deadline &&
		    now < u->m.rto) {
			*until = MIN(u->m.deadline, u->m.rto);
			goto out;
		}
		pipe_collapse(u);
		/* on as the message in flight: the NAK, the timers */
	} else if (u->m.active && (u->m.wqe != w || u->pipe_n)) {
		if (u->m.wqe == w || w->piped || !can_start(qp, u, w)) {
			/* behind older messages: more packets of m at most
			 * (their NAK or timeout is the oldest one's step) */
			if (u->m.wqe == w && !u->m.nak)
				send_more(qp, u, r, w, src, dst, now);
			*until = MIN(u->m.deadline, u->m.rto);
			goto out;
		}
		struct upipe *e = PIPE(u, u->pipe_n++);

		u->m.wqe->piped = true;
		*e = (struct upipe){
			.wqe = u->m.wqe, .op = u->m.op, .first = u->m.first,
			.npkts = u->m.npkts, .mtu = u->m.mtu,
			.acked = u->m.acked, .len = u->m.len,
			.is_read = u->m.is_read, .ndst = u->m.ndst,
			.is_atomic = is_atomic_op(u->m.op),
		};
		memcpy(e->dst, u->m.dst, u->m.ndst * sizeof(e->dst[0]));
		u->pipe_out += u->m.npkts - u->m.acked;
		u->m.active = false;
	}
	if (!u->m.active) {
		memset(&u->m, 0, sizeof(u->m));
		u->m.active = true;
		u->m.wqe = w;
		u->m.op = r->opcode;
		u->m.mtu = mtu_of(qp);
		u->m.len = r->msg_len;
		u->m.is_read = r->opcode == IBV_WR_RDMA_READ;
		u->m.npkts = atomic ? 1 : (uint32_t)MAX(1, (r->msg_len + u->m.mtu - 1) / u->m.mtu);
		u->m.first = u->next_psn;
		u->next_psn = psn_add(u->next_psn, u->m.npkts);
		/* A READ's responses may come for all its PSNs as soon as it
		 * is asked for (a re-request asks for the rest); a SEND's or
		 * WRITE's answers only for packets sent (send_more). */
		if (u->m.is_read)
			psn_sent(u, u->next_psn);
		if (u->m.is_read) {
			u->m.ndst = MIN(r->ndst, (uint32_t)URSA_MAX_SGE);
			memcpy(u->m.dst, r->dst, u->m.ndst * sizeof(*r->dst));
		}
		u->m.deadline = after(now, timeout_ns(qp));
		u->m.rto = after(now, rto_ns(qp));
		if (u->m.is_read || atomic) {
			if (u->m.is_read) {
				send_read_req(qp, u, r, src, dst);
			} else {
				rtt_start(u, 0, now);
				send_atomic(qp, u, r, src, dst);
				u->m.sent = u->m.npkts;
			}
		}
	}
	if (u->m.progress) {
		/* IBTA 9.7.6.1.3: the retry count restarts with progress */
		u->m.progress = false;
		ursa_retry_progress(qp, w);
	}
	if (u->m.done) {
		resp->ack = URSA_ACK;
		resp->atomic_orig = u->m.orig;
		u->m.active = false;
		ret = 1;
		goto out;
	}
	if (u->m.nak) {
		uint8_t syn = u->m.nak;
		uint32_t idx = (u->m.nak_psn - u->m.first) & 0xffffff;

		u->m.nak = 0;
		atomic_fetch_add(&ursa_udp_cnt.naks_rcvd, 1);
		atomic_fetch_add((syn & AETH_TYPE_MASK) == AETH_RNR ? &qp->cnt.rnr_rcvd :
				 syn == AETH_NAK_PSN ? &qp->cnt.naks_seq :
				 syn == AETH_NAK_ACCESS ? &qp->cnt.naks_access :
				 syn == AETH_NAK_OP ? &qp->cnt.naks_op :
						      &qp->cnt.naks_inv, 1);
		if ((syn & AETH_TYPE_MASK) == AETH_RNR) {
			/* resend from the refused packet after the timer */
			u->timing = false;
			if (idx < u->m.npkts && !u->m.is_read)
				u->m.sent = u->m.acked = idx;
			u->m.resend_read = u->m.is_read;
			if (atomic)
				u->m.sent = 0;
			resp->ack = URSA_NAK_RNR;
			resp->rnr_timer = syn & 0x1f;
			resp->why = URSA_WHY_NO_RECV;
			atomic_fetch_add(&ursa_udp_cnt.rnr_naks, 1);
			ret = 1;
			goto out;
		}
		if (syn == AETH_NAK_PSN) {
			/* go back to the PSN the responder expects. For a
			 * READ that PSN tells which requests arrived, not which
			 * responses did: ask again from the first missing
			 * response (taken for received, the packets between
			 * were never written: a 256 KiB READ came back with
			 * 101 KiB of zeros under injected loss). */
			u->timing = false;
			if (u->m.is_read) {
				u->m.sent = u->m.acked;
			} else if (idx < u->m.npkts && idx >= u->m.acked) {
				u->m.acked = idx;
				u->m.sent = idx;
			}
			atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
		} else {
			resp->ack = syn == AETH_NAK_ACCESS ? URSA_NAK_ACCESS :
				    syn == AETH_NAK_OP ? URSA_NAK_OP_ERR :
							 URSA_NAK_INV_REQ;
			resp->why = URSA_WHY_OPCODE;
			if (syn == AETH_NAK_ACCESS)
				resp->why = URSA_WHY_ACCESS;
			u->m.active = false;
			ret = 1;
			goto out;
		}
	}
	if (now >= u->m.deadline) {
		/* IBTA 9.7.6.1.3: local ACK timeout */
		if (!ursa_retry_take(qp, w)) {
			ursa_dbg("qp %u: retries exhausted at PSN %u (packet %u of %u, %u sent)",
				 qp->ex.qp_base.qp_num,
				 psn_add(u->m.first, u->m.acked), u->m.acked,
				 u->m.npkts, u->m.sent);
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_NOT_READY;
			resp->final = true;
			u->m.active = false;
			ret = 1;
			goto out;
		}
		go_back(qp, u, atomic, now);
		u->m.deadline = after(now, timeout_ns(qp));
	} else if (now >= u->m.rto && rc) {
		go_back(qp, u, atomic, now);	/* early (see rto_ns) */
	}
	if (u->m.is_read && !u->m.resend_read && u->m.acked == u->m.sent &&
	    u->m.acked < u->m.npkts)
		u->m.resend_read = true;	/* the next piece */
	if (u->m.resend_read) {
		u->m.resend_read = false;
		send_read_req(qp, u, r, src, dst);
	} else if (atomic && u->m.sent == 0) {
		send_atomic(qp, u, r, src, dst);
		u->m.sent = 1;
	}
	if (!atomic)
		send_more(qp, u, r, w, src, dst, now);
	if (!rc && u->m.sent >= u->m.npkts) {
		/* UC and UD: sent is done (nobody acknowledges) */
		resp->ack = URSA_ACK;
		u->m.active = false;
		ret = 1;
		goto out;
	}
	*until = MIN(u->m.deadline, u->m.rto);
out:
	if (u->ack_owed && tx_added != batch0)
		ack_emit(u, true);	/* after what we sent (tx) */
	w->inflight = ret == 0;
	/* The engine and ursa_req_pending read the wait's end here: left
	 * stale (0), every pass took it for an expired timer, the engine
	 * never slept and posters rang its doorbell at every poll. */
	w->deadline_ns = *until;
	pthread_mutex_unlock(&u->lock);
	if (!tx_hold)
		udp_flush();
	return ret;
}

void ursa_udp_tx_hold(bool on)
{
	if (on)
		tx_hold++;
	else if (tx_hold && !--tx_hold)
		udp_flush();
}

/* --- receive ------------------------------------------------------------------ */

/* Place READ response packet idx of a READ of len bytes (npkts packets of
 * mtu) into dst: bounded by what was asked for, into our own buffers.
 * False (and counted) when its length does not fit. */
static bool read_place(const struct ursa_sg *dst, uint32_t ndst, uint64_t len,
		       uint32_t npkts, uint32_t mtu, uint32_t idx,
		       const struct roce_pkt *p)
{
	uint64_t off = (uint64_t)idx * mtu;

	if (off + p->paylen > len || (idx + 1 < npkts && p->paylen != mtu)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_short, 1);
		return false;
	}
	if (p->paylen) {
		struct ursa_sg s = { (uintptr_t)p->payload, p->paylen };

		ursa_xfer(dst, ndst, false, &s, 1, false, 0, off, p->paylen);
	}
	return true;
}

/* A READ response or an ATOMIC ACKNOWLEDGE for a READ or atomic of the
 * pipe (see pipe_class). */
static void pipe_resp(struct ursa_qp *qp, struct ursa_uqp *u,
		      struct upipe *e, const struct roce_pkt *p)
{
	uint32_t idx = (p->psn - e->first) & 0xffffff;
	bool atomic_ack = (p->opcode & 0x1f) == OP_ATOMIC_ACK;
	uint64_t now;

	if (e->done || idx != e->acked || atomic_ack != e->is_atomic ||
	    (!e->is_read && !e->is_atomic)) {
		if (e->is_read && !atomic_ack && !e->done && idx > e->acked &&
		    !u->pipe_gap) {
			u->pipe_gap = true;	/* ask again (pipe_collapse) */
			atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
		}
		atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
		return;
	}
	if (e->is_atomic)
		e->orig = p->orig;
	else if (!read_place(e->dst, e->ndst, e->len, e->npkts, e->mtu, idx, p))
		return;
	now = ursa_now_ns();
	e->acked++;
	u->pipe_out -= MIN(u->pipe_out, 1u);
	window_grow(qp, u, 1);
	rtt_acked_psn(u, p->psn, now);
	u->m.deadline = after(now, timeout_ns(qp));
	u->m.rto = after(now, rto_ns(qp));
	if (e->acked == e->npkts)
		e->done = true;
}

/* A response for our requester QP (RC): move the message forward. */
/*
 * Does an answer's PSN name a packet this requester sent and has not seen
 * acknowledged: from the oldest message waiting (the pipe's, else the one
 * in flight) up to the highest PSN ever sent? Any other is stale or forged
 * (IBTA 9.7.5.2.x: a PSN outside the outstanding requests is not an
 * answer to one), and a forged one must not change the QP: a NAK there
 * would end a healthy QP in error, an RNR NAK stall it, an ACK complete
 * messages never delivered.
 */
static bool psn_in_flight(const struct ursa_uqp *u, uint32_t psn)
{
	uint32_t oldest = u->pipe_n ? PIPE(u, 0)->first : u->m.first;

	return ((psn - oldest) & 0xffffff) < ((u->psn_hi - oldest) & 0xffffff);
}

static void on_response(struct ursa_qp *qp, struct ursa_uqp *u,
			const struct roce_pkt *p)
{
	uint32_t idx, n;
	uint32_t f = roce_opcode_flags(p->opcode);
	bool acks, past;

	if (!u->m.active) {
		atomic_fetch_add(&ursa_udp_cnt.dup, 1);
		return;
	}
	/* Any answer, even a stale one, shows the responder is still
	 * sending: hold the early retransmission back until the answers
	 * stop. Otherwise a requester slower than its RTO at draining its
	 * socket asks again and again, each request adds a window of
	 * duplicates, and no answer to the newest request gets through
	 * (congestion collapse). Only progress moves the ACK timeout. */
	u->m.rto = after(ursa_now_ns(), rto_ns(qp));
	if (!psn_in_flight(u, p->psn)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_stale, 1);
		return;
	}
	if (u->pipe_n && !(f & P_READ) && (p->opcode & 0x1f) != OP_ATOMIC_ACK) {
		bool nak = (p->syndrome & AETH_TYPE_MASK) != AETH_ACK;
		int i;

		/* (a NAK acknowledges the PSNs before its own) */
		pipe_ack(qp, u, nak ? psn_add(p->psn, 0xffffff) : p->psn,
			 ursa_now_ns());
		i = pipe_holds(u, p->psn);
		if (i >= 0) {
			if (nak && !PIPE(u, i)->done) {
				u->pipe_nak = p->syndrome;
				u->pipe_nak_psn = p->psn;
			}
			return;
		}
	}
	idx = (p->psn - u->m.first) & 0xffffff;
	if (u->pipe_n && ((f & P_READ) || (p->opcode & 0x1f) == OP_ATOMIC_ACK)) {
		int i = pipe_holds(u, p->psn);
		const struct upipe *prev = i > 0 ? PIPE(u, i - 1) :
					   i < 0 && idx < u->m.npkts ?
					   PIPE(u, u->pipe_n - 1) : NULL;

		if (prev && !prev->done) {
			/* a later READ's or atomic's responses while an
			 * earlier one's are missing: those were lost (the
			 * responder answers in PSN order) */
			if (!u->pipe_gap) {
				u->pipe_gap = true;
				atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
			}
			atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
			return;
		}
		if (i >= 0) {
			pipe_resp(qp, u, PIPE(u, i), p);
			return;
		}
	}
	if (f & P_READ) {
		if (!u->m.is_read || idx != u->m.acked || idx >= u->m.npkts) {
			/* A gap in the responses: ask again from the first
			 * missing packet, once per gap (as rxe's completer
			 * does), rather than wait for the ACK timeout. */
			atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
			if (u->m.is_read && idx > u->m.acked && idx < u->m.npkts &&
			    u->m.rerequested != u->m.acked + 1) {
				u->m.rerequested = u->m.acked + 1;
				u->m.resend_read = true;
				u->timing = false;
				atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
			}
			return;
		}
		if (!read_place(u->m.dst, u->m.ndst, u->m.len, u->m.npkts,
				u->m.mtu, idx, p))
			return;
		window_grow(qp, u, 1);
		u->m.acked = idx + 1;
		u->m.progress = true;
		rtt_acked(u, u->m.acked, ursa_now_ns());
		u->m.deadline = after(ursa_now_ns(), timeout_ns(qp));
		u->m.rto = after(ursa_now_ns(), rto_ns(qp));
		if (u->m.acked == u->m.npkts)
			u->m.done = true;
		return;
	}
	/* An answer past the message's last PSN (not before its first)
	 * acknowledges all of it: after pipe_collapse the responder may
	 * already hold the messages that go out again behind this one, and
	 * answers their copies from where it is. A NAK out there concerns
	 * one of those, which will be sent again. */
	acks = !u->m.is_read && !is_atomic_op(u->m.op);
	past = acks && idx >= u->m.npkts && idx < 0x800000;
	if ((p->syndrome & AETH_TYPE_MASK) != AETH_ACK && !past) {
		u->m.nak = p->syndrome;
		u->m.nak_psn = p->psn;
		return;
	}
	if ((p->opcode & 0x1f) == OP_ATOMIC_ACK) {
		if (idx == 0 && u->m.npkts == 1 && !u->m.is_read) {
			u->m.orig = p->orig;
			u->m.done = true;
			rtt_acked(u, 1, ursa_now_ns());
		}
		return;
	}
	/* cumulative ACK of SEND/WRITE packets */
	n = past ? u->m.npkts : idx + 1;
	if (acks && (idx < u->m.npkts || past) && n > u->m.acked) {
		window_grow(qp, u, n - u->m.acked);
		u->m.acked = n;
		u->m.progress = true;
		rtt_acked(u, u->m.acked, ursa_now_ns());
		u->m.deadline = after(ursa_now_ns(), timeout_ns(qp));
		u->m.rto = after(ursa_now_ns(), rto_ns(qp));
		if (u->m.acked == u->m.npkts)
			u->m.done = true;
	}
}

static void on_read_req(struct ursa_qp *qp, struct ursa_uqp *u,
			const struct roce_pkt *p, struct ursa_req *r,
			const addr_t *me, const addr_t *peer)
{
	uint32_t mtu = mtu_of(qp);
	uint32_t n = (uint32_t)MAX(1, ((uint64_t)p->dmalen + mtu - 1) / mtu);

	for (uint32_t k = 0; k < n; k++) {
		uint32_t len = (uint32_t)MIN((uint64_t)mtu, p->dmalen - (uint64_t)k * mtu);
		/* read straight into the packet, built where the batch
		 * sends it from */
		uint8_t *buf = tx_slot(), *data;
		struct ursa_resp resp;
		struct roce_pkt o = { 0 };
		struct ursa_sg d;
		int b;

		if (!buf)
			return;	/* (the requester asks again) */
		if (!p->dmalen)
			len = 0;
		o.opcode = (uint8_t)(ROCE_RC | (n == 1 ? OP_READ_RESP_ONLY :
					       k == 0 ? OP_READ_RESP_FIRST :
					       k + 1 == n ? OP_READ_RESP_LAST :
							    OP_READ_RESP_MIDDLE));
		data = buf + roce_hdr_len(o.opcode);
		d = (struct ursa_sg){ (uintptr_t)data, len };
		r->opcode = IBV_WR_RDMA_READ;
		r->rkey = p->rkey;
		r->frag = URSA_FRAG_ONLY;
		r->remote_addr = p->va + (uint64_t)k * mtu;
		r->len = len;
		r->msg_len = len;
		r->dst = &d;
		r->ndst = 1;
		/* each packet re-checks the rkey (the MR may go meanwhile) */
		ursa_resp_execute(qp, r, &resp, NULL);
		if (resp.ack != URSA_ACK) {
			if (resp.ack != URSA_DROPPED)
				send_ack(qp, u, peer, me, OP_ACK,
					 nak_syndrome(resp.ack, resp.rnr_timer),
					 p->psn, 0);
			return;
		}
		o.pkey = ROCE_DEFAULT_PKEY;
		o.dqpn = qp->attr.dest_qp_num;
		o.psn = psn_add(p->psn, k);
		o.syndrome = AETH_ACK | AETH_CREDIT_INVALID;
		o.msn = u->msn;
		b = roce_build(buf, URSA_UDP_MAX_PKT, &o, data, len);
		if (b <= 0)
			continue;
		if (is_v4(me) == is_v4(peer)) {	/* (else tx sends nothing) */
			/* the headers' part of the ICRC from the cache, as
			 * for our requests (send_data_pkt) */
			uint32_t pfx = icrc_pfx(&u->rpfx, me, peer, u->sport,
						U.port, (size_t)b);

			roce_icrc_put(buf + b - 4,
				      roce_icrc_fill_from(pfx, buf, (size_t)b - 4,
							  (size_t)b - 4, NULL, 0));
		}
		tx(u, me, peer, buf, (size_t)b, qp->attr.ah_attr.grh.hop_limit,
		   true);
	}
}

/* Does a READ request start inside one executed lately, at its rkey and
 * at the address its PSN stands for? With end, whether it also ends inside
 * it (a subset: nothing to remember anew). */
static bool read_remembered(const struct ursa_uqp *u, const struct roce_pkt *p,
			    uint32_t mtu, uint32_t end, bool *inside)
{
	for (unsigned i = 0; i < URSA_UDP_RRES; i++) {
		uint32_t k = (p->psn - u->rres[i].psn) & 0xffffff;

		if (u->rres[i].valid && k < u->rres[i].npkts &&
		    p->rkey == u->rres[i].rkey &&
		    p->va == u->rres[i].va + (uint64_t)k * mtu) {
			if (inside)
				*inside = ((end - u->rres[i].psn) & 0xffffff) <=
					  u->rres[i].npkts;
			return true;
		}
	}
	return false;
}

/* A request for our responder QP. Called with u->lock held. */
static void on_request(struct ursa_qp *qp, struct ursa_uqp *u,
		       const struct roce_pkt *p, const addr_t *me,
		       const addr_t *peer)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	uint32_t f = roce_opcode_flags(p->opcode);
	uint8_t op = p->opcode & 0x1f;
	struct ursa_req r = { 0 };
	struct ursa_resp resp;
	struct ursa_sg s = { (uintptr_t)p->payload, p->paylen };
	bool rc = t == IBV_QPT_RC;

	if (rc) {
		int32_t d = psn_cmp(p->psn, u->epsn);

		if (d > 0) {
			/* a gap: one NAK per gap (IBTA 9.7.5.1.1) */
			atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
			atomic_fetch_add(&qp->cnt.drops, 1);
			if (!u->nak_sent) {
				u->nak_sent = true;
				send_ack(qp, u, peer, me, OP_ACK, AETH_NAK_PSN, u->epsn, 0);
			}
			return;
		}
		if (d < 0) {
			/* duplicate (IBTA 9.7.5.1.3) */
			atomic_fetch_add(&ursa_udp_cnt.dup, 1);
			if (f & P_ATOMIC) {
				for (unsigned i = 0; i < URSA_UDP_ARES; i++)
					if (u->ares[i].valid && u->ares[i].psn == p->psn)
						send_ack(qp, u, peer, me, OP_ATOMIC_ACK,
							 AETH_ACK | AETH_CREDIT_INVALID,
							 p->psn, u->ares[i].orig);
				return;
			}
			if (f & P_READ) {
				if (read_remembered(u, p, mtu_of(qp), 0, NULL))
					goto execute;	/* re-executed */
				atomic_fetch_add(&ursa_udp_cnt.drop_stale, 1);
				return;
			}
			if (p->ackreq)
				send_ack(qp, u, peer, me, OP_ACK,
					 AETH_ACK | AETH_CREDIT_INVALID,
					 psn_add(u->epsn, 0xffffff), 0);
			return;
		}
		u->nak_sent = false;
	} else if (t == IBV_QPT_UC) {
		/* UC: a FIRST/ONLY starts over; after a gap the rest of the
		 * message is dropped (IBTA 9.8.3) */
		if (f & P_FIRST) {
			u->uc_broken = false;
		} else if (p->psn != u->epsn || u->uc_broken) {
			u->uc_broken = true;
			ursa_rstate_drop(&u->rs);
			atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
			u->epsn = psn_add(p->psn, 1);
			return;
		}
	}
execute:
	r.type = t;
	r.src_qpn = t == IBV_QPT_UD ? p->sqpn : qp->attr.dest_qp_num;
	r.qkey = p->qkey;
	r.sgid = *peer;
	r.dgid = *me;
	r.hop_limit = 64;
	r.solicited = p->se;
	r.src = &s;
	r.nsrc = 1;
	r.frag = ((f & P_FIRST) ? URSA_FRAG_FIRST : 0) | ((f & P_LAST) ? URSA_FRAG_LAST : 0);
	if (f & P_READ) {
		uint32_t mtu = mtu_of(qp);
		uint32_t end = psn_add(p->psn, (uint32_t)MAX(1, ((uint64_t)p->dmalen + mtu - 1) / mtu));

		bool inside = false;

		on_read_req(qp, u, p, &r, me, peer);
		/* remembered unless a re-request of part of one remembered */
		if (!read_remembered(u, p, mtu, end, &inside) || !inside) {
			unsigned k = u->rres_next++ % URSA_UDP_RRES;

			u->rres[k].psn = p->psn;
			u->rres[k].npkts = (end - p->psn) & 0xffffff;
			u->rres[k].rkey = p->rkey;
			u->rres[k].va = p->va;
			u->rres[k].valid = true;
		}
		if (psn_cmp(p->psn, u->epsn) >= 0)
			u->msn++;
		/* A duplicate that reaches past epsn: a requester that took a
		 * READ back asks again from inside it, for the rest, and the
		 * rest may include PSNs it had not asked for before (pieces,
		 * udp.c pipe_collapse). They were answered just now: expect
		 * what follows them, or the next request looks like a gap
		 * that no resend fills. */
		if (psn_cmp(end, u->epsn) > 0) {
			u->epsn = end;
			u->nak_sent = false;
		}
		return;
	}
	if (f & P_ATOMIC) {
		r.opcode = op == OP_CMP_SWAP ? IBV_WR_ATOMIC_CMP_AND_SWP :
					       IBV_WR_ATOMIC_FETCH_AND_ADD;
		r.frag = URSA_FRAG_ONLY;
		r.remote_addr = p->va;
		r.rkey = p->rkey;
		r.len = r.msg_len = 8;
		r.compare_add = op == OP_CMP_SWAP ? p->compare : p->swap_add;
		r.swap = p->swap_add;
		r.nsrc = 0;
		ursa_resp_execute(qp, &r, &resp, NULL);
		if (resp.ack == URSA_ACK) {
			unsigned a = u->ares_next % URSA_UDP_ARES;

			u->ares[a].psn = p->psn;
			u->ares[a].orig = resp.atomic_orig;
			u->ares[a].valid = true;
			u->ares_next++;
			u->epsn = psn_add(p->psn, 1);
			u->msn++;
			send_ack(qp, u, peer, me, OP_ATOMIC_ACK,
				 AETH_ACK | AETH_CREDIT_INVALID, p->psn,
				 resp.atomic_orig);
		} else if (resp.ack != URSA_DROPPED) {
			send_ack(qp, u, peer, me, OP_ACK,
				 nak_syndrome(resp.ack, resp.rnr_timer), p->psn, 0);
		}
		return;
	}
	if (f & P_WRITE) {
		if (f & P_FIRST) {
			u->wva = p->va;
			u->wrkey = p->rkey;
			u->wlen = p->dmalen;
			u->woff = 0;
		}
		if (u->woff + p->paylen > u->wlen) {
			/* more data than the RETH announced */
			resp.ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
			resp.rnr_timer = 0;
			goto answer;
		}
		r.opcode = (op == OP_WRITE_LAST_IMM || op == OP_WRITE_ONLY_IMM) ?
			   IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
		r.has_imm = r.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		r.imm = p->imm;
		r.remote_addr = u->wva + u->woff;
		r.rkey = u->wrkey;
		r.len = p->paylen;
		r.offset = u->woff;
		r.msg_len = u->wlen;
		ursa_resp_execute(qp, &r, &resp, NULL);
		if (resp.ack == URSA_ACK)
			u->woff += p->paylen;
	} else {
		/* SEND family; UD messages are single packets */
		if (f & P_FIRST)
			u->soff = 0;
		r.opcode = (op == OP_SEND_LAST_IMM || op == OP_SEND_ONLY_IMM) ?
			   IBV_WR_SEND_WITH_IMM :
			   (op == OP_SEND_LAST_INV || op == OP_SEND_ONLY_INV) ?
			   IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
		r.has_imm = r.opcode == IBV_WR_SEND_WITH_IMM;
		r.invalidate = r.opcode == IBV_WR_SEND_WITH_INV;
		r.imm = p->imm;
		r.len = p->paylen;
		r.offset = u->soff;
		r.msg_len = (f & P_FIRST) && (f & P_LAST) ? p->paylen : 0;
		ursa_resp_execute(qp, &r, &resp, &u->rs);
		if (resp.ack == URSA_ACK)
			u->soff += p->paylen;
	}
answer:
	if (!rc) {
		if (resp.ack == URSA_ACK)
			u->epsn = psn_add(p->psn, 1);
		return;
	}
	if (resp.ack == URSA_ACK) {
		u->epsn = psn_add(p->psn, 1);
		if (f & P_LAST)
			u->msn++;
		/* (an ACK inside a message moves the requester's window:
		 * at once; nothing of ours could carry it anyway) */
		if (p->ackreq && (f & P_LAST))
			ack_later(qp, u, peer, me, p->psn);
		else if (p->ackreq)
			send_ack(qp, u, peer, me, OP_ACK,
				 AETH_ACK | AETH_CREDIT_INVALID, p->psn, 0);
	} else if (resp.ack != URSA_DROPPED) {
		send_ack(qp, u, peer, me, OP_ACK,
			 nak_syndrome(resp.ack, resp.rnr_timer), p->psn, 0);
	}
}

/*
 * Completion order (docs/design.md "Delayed ACK"): the peer sends its held
 * ACK of our message after its own next request, so a request of the peer
 * that completes a receive here may arrive just before the ACK that completes
 * our send. While our message is signaled, fully sent and not yet
 * acknowledged, such a request is held (copied aside, not executed) until
 * that ACK has completed our message (on_packet), for at most
 * URSA_UDP_HOLD_NS, and never past a later request of the QP: the application
 * sees its send completion first, as with a NIC that acknowledges at once.
 * Only on the context's own pass (on_packet completes the send there). Called
 * with u->lock held.
 */

static bool hold_request(struct ursa_qp *qp, struct ursa_uqp *u,
			 const struct roce_pkt *p, uint32_t f,
			 const uint8_t *buf, size_t len, const addr_t *me,
			 const addr_t *peer)
{
	const struct ursa_send_wqe *w = u->m.wqe;

	if (qp->ex.qp_base.qp_type != IBV_QPT_RC || qp->ctx != ursa_pass_ctx ||
	    !(f & P_LAST) || !((f & P_SEND) || ((f & P_WRITE) && (f & H_IMM))) ||
	    p->psn != u->epsn || !u->m.active || u->m.done || u->m.nak ||
	    u->m.is_read || is_atomic_op(u->m.op) || u->m.sent < u->m.npkts ||
	    !w || !((w->flags & IBV_SEND_SIGNALED) || qp->sq_sig_all) ||
	    len > URSA_UDP_MAX_PKT)
		return false;
	if (!u->stash && !(u->stash = malloc(URSA_UDP_MAX_PKT)))
		return false;
	memcpy(u->stash, buf, len);
	u->stash_due = ursa_now_ns() + URSA_UDP_HOLD_NS;
	u->stash_me = *me;
	u->stash_peer = *peer;
	__atomic_store_n(&u->stash_len, len, __ATOMIC_RELAXED);
	atomic_store_explicit(&qp->udp_held, true, memory_order_relaxed);
	atomic_fetch_add(&ursa_udp_cnt.reqs_held, 1);
	return true;
}

/* Execute the held request, if the QP can still receive (u->lock held). */
static void run_held(struct ursa_qp *qp, struct ursa_uqp *u)
{
	size_t len = u->stash_len;
	struct roce_pkt p;

	__atomic_store_n(&u->stash_len, 0, __ATOMIC_RELAXED);
	if (len && !roce_parse(u->stash, len, &p) && can_receive(qp_state(qp)))
		on_request(qp, u, &p, &u->stash_me, &u->stash_peer);
}

/* seg: the packet's place in a coalesced run (UDP_GRO), 0 if alone: the
 * IPv4 ID it most likely left with (udp_flush), tried first. run_qp (NULL:
 * none): the QP the packets of one received datagram were for so far,
 * with the reference its lookup took, which the caller drops after the
 * datagram; a coalesced run's packets are for one QP (the sender sends
 * them from its socket), so the lookup is made once per run. */
static void on_packet(uint8_t *buf, size_t len, const addr_t *src,
		      uint16_t sport, const addr_t *dst, bool forwarded,
		      unsigned seg, struct ursa_qp **run_qp)
{
	struct roce_pkt p;
	struct ursa_qp *qp;
	struct ursa_uqp *u;
	uint32_t f;
	enum ibv_qp_type t;
	bool decided = false;

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
		static struct pfx_cache rx_pfx;
		uint32_t c0 = roce_icrc_fill_from(icrc_pfx(&rx_pfx, src, dst,
							   sport, U.port, len),
						  buf, len - 4, len - 4, NULL, 0);
		uint32_t got = roce_icrc_get(buf + len - 4);

		/* IPv4: ID 0, a segment of a GSO run (udp_flush), or
		 * whatever ID another sender chose */
		if (c0 != got) {
			if (!is_v4(src) ||
			    !icrc_match_v4(len - 4, c0, got, seg)) {
				atomic_fetch_add(&ursa_udp_cnt.drop_icrc, 1);
				return;
			}
			atomic_fetch_add(&ursa_udp_cnt.rx_ipid, 1);
		}
	}
	if (roce_parse(buf, len, &p)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_opcode, 1);
		return;
	}
	if (run_qp && *run_qp && (*run_qp)->ex.qp_base.qp_num == p.dqpn) {
		qp = *run_qp;
	} else {
		if (p.dqpn == 1) {	/* QP1: the CM's MADs */
			ursa_gsi_rx(&p, src, sport, dst);
			return;
		}
		qp = ursa_loop_get(dst, p.dqpn);
		if (!qp) {
			/* another process's QP? (never forward twice) */
			if (!forwarded &&
			    forward(buf, len, p.dqpn, src, sport, dst))
				return;
			atomic_fetch_add(&ursa_udp_cnt.drop_qpn, 1);
			return;
		}
		if (run_qp) {
			if (*run_qp)
				ursa_loop_put(*run_qp);
			*run_qp = qp;	/* (its reference, dropped by the caller) */
		}
	}
	u = qp->udp;
	t = qp->ex.qp_base.qp_type;
	ursa_cnt_add(&qp->cnt.pkts_rx, 1);
	f = roce_opcode_flags(p.opcode);
	if (!u || (p.opcode & 0xe0) != (t == IBV_QPT_RC ? ROCE_RC :
					t == IBV_QPT_UC ? ROCE_UC : ROCE_UD)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_opcode, 1);
		goto out;
	}
	/* Connected QPs accept packets only from their peer's address. */
	if (t != IBV_QPT_UD &&
	    memcmp(qp->attr.ah_attr.grh.dgid.raw, src->raw, 16)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_src, 1);
		atomic_fetch_add(&qp->cnt.drops, 1);
		goto out;
	}
	pthread_mutex_lock(&u->lock);
	if (t != IBV_QPT_UD && (u->rxfd < 0 || u->rx_port != sport))
		rx_connect(u, src, sport);
	if (f & P_RESP) {
		int st = qp_state(qp);

		if (st == IBV_QPS_RTS || st == IBV_QPS_SQD) {
			on_response(qp, u, &p);
			/* Our own pass runs the requester (now, if the
			 * message is decided, see below); another context's
			 * engine must be told. */
			if (qp->ctx->eng && qp->ctx != ursa_pass_ctx)
				ursa_engine_kick(qp->ctx->eng);
			else if (qp->ctx == ursa_pass_ctx)
				decided = u->m.done || u->m.nak ||
					  (u->pipe_n && (PIPE(u, 0)->done ||
							 u->pipe_nak ||
							 u->pipe_gap));
		} else {
			atomic_fetch_add(&ursa_udp_cnt.drop_state, 1);
		}
	} else if (!can_receive(qp_state(qp))) {
		atomic_fetch_add(&ursa_udp_cnt.drop_state, 1);
		atomic_fetch_add(&qp->cnt.drops, 1);
	} else {
		if (u->stash_len)
			run_held(qp, u);	/* in PSN order */
		if (!hold_request(qp, u, &p, f, buf, len, dst, src))
			on_request(qp, u, &p, dst, src);
	}
	pthread_mutex_unlock(&u->lock);
	if (!tx_hold)
		udp_flush();
	/* Complete the WQE before the packets behind this one are taken:
	 * an ACK arrives before the peer's next SEND it caused, and
	 * programs rely on seeing the send completion first (perftest's
	 * event mode polls the send CQ once after an event on a channel
	 * both CQs share). This thread holds the context's lock (its pass). */
	if (decided) {
		uint64_t d = UINT64_MAX, now = 0;

		ursa_req_process_lazy(qp, &now, &d);
		/* our send is complete: now the request it held back */
		pthread_mutex_lock(&u->lock);
		if (u->stash_len && !u->m.active)
			run_held(qp, u);
		pthread_mutex_unlock(&u->lock);
		if (!tx_hold)
			udp_flush();
	}
out:
	if (!run_qp)
		ursa_loop_put(qp);
}

/* For the responder fuzz target: hand one datagram to the receive path, as
 * if it had arrived from src:sport for dst. */
void ursa_udp_inject(uint8_t *buf, size_t len, const union ibv_gid *src,
		     uint16_t sport, const union ibv_gid *dst)
{
	pthread_mutex_lock(&U.rx);
	on_packet(buf, len, src, sport, dst, true, 0, NULL);
	pthread_mutex_unlock(&U.rx);
	udp_flush();
}

uint32_t ursa_udp_epsn(struct ursa_qp *qp)
{
	return qp->udp ? qp->udp->epsn : 0;
}

uint32_t ursa_udp_unanswered_psn(struct ursa_qp *qp)
{
	struct ursa_uqp *u = qp->udp;
	uint32_t psn;

	if (!u)
		return 0;
	pthread_mutex_lock(&u->lock);
	psn = u->pipe_n ? psn_add(PIPE(u, 0)->first, PIPE(u, 0)->acked) :
			  psn_add(u->m.first, u->m.acked);
	pthread_mutex_unlock(&u->lock);
	return psn;
}

uint16_t ursa_udp_port(void)
{
	return U.port;
}

/* Receive a batch from one socket; returns datagrams handled. */
static int poll_sock(int fd, bool v6)
{
	enum { BATCH = 32 };
	struct ursa_qp *run_qp = NULL;	/* see on_packet */
	static uint8_t bufs[BATCH][URSA_UDP_GRO_BUF];
	static struct sockaddr_storage from[BATCH];
	static char cbuf[BATCH][CMSG_SPACE(sizeof(struct in6_pktinfo)) +
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
			addr_t src = { .raw = { 0 } }, dst = { .raw = { 0 } };
			bool have_dst = false;
			uint16_t sport;
			size_t seg = 0;

			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mm[i].msg_hdr); c;
			     c = CMSG_NXTHDR(&mm[i].msg_hdr, c)) {
				if (!v6 && c->cmsg_level == IPPROTO_IP &&
				    c->cmsg_type == IP_PKTINFO) {
					struct in_pktinfo pi;

					memcpy(&pi, CMSG_DATA(c), sizeof(pi));
					dst.raw[10] = dst.raw[11] = 0xff;
					memcpy(dst.raw + 12, &pi.ipi_addr, 4);
					have_dst = true;
				} else if (v6 && c->cmsg_level == IPPROTO_IPV6 &&
					   c->cmsg_type == IPV6_PKTINFO) {
					struct in6_pktinfo pi;

					memcpy(&pi, CMSG_DATA(c), sizeof(pi));
					memcpy(dst.raw, &pi.ipi6_addr, 16);
					have_dst = true;
				} else if (c->cmsg_level == SOL_UDP &&
					   c->cmsg_type == UDP_GRO) {
					int g;

					memcpy(&g, CMSG_DATA(c), sizeof(g));
					seg = g > 0 ? (size_t)g : 0;
				}
			}
			if (v6) {
				struct sockaddr_in6 *a = (struct sockaddr_in6 *)&from[i];

				memcpy(src.raw, &a->sin6_addr, 16);
				sport = ntohs(a->sin6_port);
			} else {
				struct sockaddr_in *a = (struct sockaddr_in *)&from[i];

				src.raw[10] = src.raw[11] = 0xff;
				memcpy(src.raw + 12, &a->sin_addr, 4);
				sport = ntohs(a->sin_port);
			}
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
					  (unsigned)(off / seg), &run_qp);
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
	ursa_hooks.uqp_init = ursa_uqp_init;
	ursa_hooks.uqp_modified = ursa_uqp_modified;
	ursa_hooks.uqp_fini = ursa_uqp_fini;
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
