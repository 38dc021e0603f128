// SPDX-License-Identifier: MIT
/*
 * gsi.c - QP1, the General Services Interface, as far as the
 * Communication Manager needs it: CM MADs in and out on RoCEv2.
 *
 * There is no QP1 object. A packet for QP 1 that passes the ICRC check
 * (udp.c) comes here; a UD SEND carrying a CM MAD (Q_Key 0x80010000, the
 * MAD header of class 0x07 version 2) is handed to the process that owns
 * its destination: the owner of the service ID for a REQ or SIDR_REQ, the
 * owner of the comm ID otherwise (proto/cm.c cm_route). Owners are ursa's
 * librdmacm, which binds an abstract datagram socket named for each
 * service ID and comm ID it holds (cm_route_addr), so the kernel both
 * makes those names unique in the network namespace and delivers to the
 * right process: any ursa process of the host may be the one whose
 * RoCEv2 socket took the packet (the reuseport group, udp.c). A message
 * nobody owns is answered as the kernel's CM answers it (cm_orphan_reply:
 * REJ, SIDR_REP "unsupported", DREP) or dropped, and counted.
 *
 * ursa_cm_send is the other way: one MAD from QP1 to a peer's QP1, as a UD
 * SEND_ONLY with DETH source QP 1 and Q_Key 0x80010000, from a socket of
 * its own. The CM (librdmacm) retransmits; nothing here does.
 */
#include "udp.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../include/ursa/ursa.h"
#include "../proto/cm.h"
#include "../proto/roce.h"
#include "../util/util.h"

static struct {
	pthread_mutex_t lock;
	int fd4, fd6, unx;	/* send sockets; the datagram socket to owners */
	uint16_t port4, port6;	/* their UDP source ports (ICRC) */
	uint32_t psn;
} G = { PTHREAD_MUTEX_INITIALIZER, -1, -1, -1, 0, 0, 0 };

static bool gid_v4(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(g->raw, pfx, 12);
}

/* A send socket of the family, bound to an ephemeral port (the kernel's CM
 * ignores a MAD's source port and answers to 4791). Under G.lock. */
static int send_sock(bool v4, uint16_t *port)
{
	int *fd = v4 ? &G.fd4 : &G.fd6;
	struct sockaddr_storage ss = { 0 };
	socklen_t sl = v4 ? sizeof(struct sockaddr_in)
			  : sizeof(struct sockaddr_in6);
	int pmtu = IP_PMTUDISC_DO;

	if (*fd >= 0) {
		*port = v4 ? G.port4 : G.port6;
		return *fd;
	}
	ss.ss_family = v4 ? AF_INET : AF_INET6;
	*fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (*fd < 0)
		return -1;
	/* DF and unconnected: IP ID 0, which the ICRC covers (udp.c) */
	if (v4)
		setsockopt(*fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
	if (bind(*fd, (struct sockaddr *)&ss, sl) ||
	    getsockname(*fd, (struct sockaddr *)&ss, &sl)) {
		close(*fd);
		*fd = -1;
		return -1;
	}
	*port = ntohs(v4 ? ((struct sockaddr_in *)&ss)->sin_port
			 : ((struct sockaddr_in6 *)&ss)->sin6_port);
	if (v4)
		G.port4 = *port;
	else
		G.port6 = *port;
	return *fd;
}

static int send_mad(const union ibv_gid *sgid, const union ibv_gid *dgid,
		    uint8_t tclass, const uint8_t *mad)
{
	struct roce_pkt p = { .opcode = ROCE_UD | OP_SEND_ONLY,
			      .pkey = ROCE_DEFAULT_PKEY, .dqpn = 1,
			      .qkey = CM_QP1_QKEY, .sqpn = 1 };
	uint8_t pkt[ROCE_BTH_LEN + 8 + CM_MAD_LEN + ROCE_ICRC_LEN];
	struct sockaddr_storage to = { 0 };
	socklen_t tl;
	bool v4 = gid_v4(dgid);
	uint16_t sport;
	int fd, len, tos = tclass;
	ssize_t n;

	if (gid_v4(sgid) != v4)
		return -EAFNOSUPPORT;
	pthread_mutex_lock(&G.lock);
	fd = send_sock(v4, &sport);
	p.psn = G.psn++ & 0xffffff;
	if (fd < 0) {
		pthread_mutex_unlock(&G.lock);
		return -errno;
	}
	len = roce_build(pkt, sizeof(pkt), &p, mad, CM_MAD_LEN);
	if (len < 0) {
		pthread_mutex_unlock(&G.lock);
		return len;
	}
	ursa_udp_seal(pkt, (size_t)len, sgid, dgid, sport);
	if (v4) {
		struct sockaddr_in *a = (struct sockaddr_in *)&to;

		a->sin_family = AF_INET;
		a->sin_port = htons(ursa_udp_port());
		memcpy(&a->sin_addr, dgid->raw + 12, 4);
		tl = sizeof(*a);
		setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&to;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons(ursa_udp_port());
		memcpy(&a->sin6_addr, dgid->raw, 16);
		tl = sizeof(*a);
		setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos));
	}
	n = sendto(fd, pkt, (size_t)len, MSG_DONTWAIT, (struct sockaddr *)&to, tl);
	pthread_mutex_unlock(&G.lock);
	if (n != len)
		return n < 0 ? -errno : -EIO;
	atomic_fetch_add(&ursa_udp_cnt.cm_tx, 1);
	return 0;
}

URSA_EXPORT int ursa_cm_send(const union ibv_gid *sgid, const union ibv_gid *dgid,
			uint8_t tclass, const void *mad)
{
	if (!sgid || !dgid || !mad)
		return -EINVAL;
	if (!ursa_udp_port())
		return -ENETDOWN;	/* no context open: no RoCEv2 port */
	return send_mad(sgid, dgid, tclass, mad);
}

/* How long a forward waits for an owner whose queue is full. A datagram
 * socket holds net.unix.max_dgram_qlen (10) messages: cmtime's hundred
 * REQs at once overflowed the listener's, and each one dropped waited
 * for the REQ's retransmission (4.6 s). The owner's CM thread drains its
 * queue in microseconds once it runs; an owner that does not (stopped)
 * costs each MAD to it this much, after which it counts as lost. */
#define DELIVER_WAIT_MS 5

/* Hand a MAD to the owner of its route: 1, or 0 when the owner is behind
 * (as if lost: the CM retransmits; nobody answers for it), or -1 when
 * nobody owns it. */
static int deliver(const struct cm_msg *m, const struct cm_fwd *f)
{
	struct sockaddr_un sa;
	socklen_t sl;
	uint64_t key;
	bool by_sid;
	ssize_t n = -1;
	int e = ENOTSOCK, fd;

	cm_route(m, &key, &by_sid);
	sl = cm_route_addr(&sa, key, by_sid);
	pthread_mutex_lock(&G.lock);
	if (G.unx < 0) {
		struct timeval tv = { .tv_usec = DELIVER_WAIT_MS * 1000 };

		G.unx = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (G.unx >= 0)
			setsockopt(G.unx, SOL_SOCKET, SO_SNDTIMEO, &tv,
				   sizeof(tv));
	}
	fd = G.unx;
	pthread_mutex_unlock(&G.lock);
	/* blocking only while the owner's queue is full, then for
	 * DELIVER_WAIT_MS at most (SO_SNDTIMEO); not under G.lock, which the
	 * owner's CM thread may need to answer (ursa_cm_send) before it
	 * reads again: this process may be the owner */
	if (fd >= 0) {
		n = sendto(fd, f, sizeof(*f), 0, (struct sockaddr *)&sa, sl);
		e = errno;
	}
	if (n == (ssize_t)sizeof(*f))
		return 1;
	return e == EAGAIN || e == ENOBUFS ? 0 : -1;
}

void ursa_gsi_rx(const struct roce_pkt *p, const union ibv_gid *src,
		 uint16_t sport, const union ibv_gid *dst)
{
	struct cm_msg m, r;
	struct cm_fwd f = { .magic = CM_FWD_MAGIC, .sport = sport, .hop = 64 };
	uint8_t mad[CM_MAD_LEN];
	int d;

	/* IBTA 13.4.6.4 / rxe: QP1 takes UD SENDs with the GSI Q_Key only */
	if (p->opcode != (ROCE_UD | OP_SEND_ONLY) || p->qkey != CM_QP1_QKEY ||
	    cm_parse(p->payload, p->paylen, &m)) {
		atomic_fetch_add(&ursa_udp_cnt.cm_drop, 1);
		return;
	}
	memcpy(f.src, src->raw, 16);
	memcpy(f.dst, dst->raw, 16);
	memcpy(f.mad, p->payload, CM_MAD_LEN);
	d = deliver(&m, &f);
	if (d >= 0) {
		atomic_fetch_add(d ? &ursa_udp_cnt.cm_rx : &ursa_udp_cnt.cm_drop, 1);
		return;
	}
	if (!cm_orphan_reply(&m, &r) || cm_build(mad, &r) ||
	    send_mad(dst, src, 0, mad)) {
		atomic_fetch_add(&ursa_udp_cnt.cm_drop, 1);
		return;
	}
	atomic_fetch_add(&ursa_udp_cnt.cm_orphan, 1);
}
