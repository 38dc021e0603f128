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
#include <signal.h>
#include <stdlib.h>
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

/*
 * Delivery to owners. A datagram socket holds net.unix.max_dgram_qlen
 * (10) messages: cmtime's hundred REQs at once overflow a listener's, and
 * a MAD dropped there waits for the peer's retransmission (seconds). The
 * receive path must not block either (it is the engine's), so a MAD whose
 * owner's queue is full waits here, in a bounded queue that a thread of
 * its own hands over with blocking sends: the kernel wakes it as soon as
 * the owner reads. A MAD waits for its owner at most URSA_GSI_PEND_WAIT_MS (an
 * owner that reads nothing, stopped, costs that once for everything
 * queued to it); then it counts as lost, as on a wire, and the CM
 * retransmits. Later MADs for an owner with MADs waiting queue behind
 * them, so that an owner reads its peer's messages in their order.
 */

struct pend {
	struct cm_fwd f;
	struct sockaddr_un sa;
	socklen_t sl;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	/* a ring of URSA_GSI_PEND_MAX, allocated when first used */
	struct pend *q;
	unsigned head, n;
	bool running;		/* the thread exists (in this process) */
} P = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, false };

static void orphan(const struct cm_fwd *f);

/* The process-wide socket that sends to owners (never blocks) */
static int unx_sock(void)
{
	pthread_mutex_lock(&G.lock);
	if (G.unx < 0)
		G.unx = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	pthread_mutex_unlock(&G.lock);
	return G.unx;
}

static bool pend_has(const struct sockaddr_un *sa, socklen_t sl)
{
	for (unsigned i = 0; i < P.n; i++) {
		const struct pend *q = &P.q[(P.head + i) % URSA_GSI_PEND_MAX];

		if (q->sl == sl && !memcmp(&q->sa, sa, sl))
			return true;
	}
	return false;
}

/* Drop the queue's head and every later MAD for the same owner */
static void pend_drop_owner(void)
{
	struct pend head = P.q[P.head];
	unsigned keep = 0;

	for (unsigned i = 0; i < P.n; i++) {
		struct pend *q = &P.q[(P.head + i) % URSA_GSI_PEND_MAX];

		if (q->sl == head.sl && !memcmp(&q->sa, &head.sa, head.sl)) {
			atomic_fetch_add(&ursa_udp_cnt.cm_drop, 1);
			continue;
		}
		if (keep != i)
			P.q[(P.head + keep) % URSA_GSI_PEND_MAX] = *q;
		keep++;
	}
	P.n = keep;
}

static void *pend_thread(void *arg)
{
	struct timeval tv = { .tv_sec = URSA_GSI_PEND_WAIT_MS / 1000,
			      .tv_usec = URSA_GSI_PEND_WAIT_MS % 1000 * 1000 };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	(void)arg;
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	pthread_mutex_lock(&P.lock);
	for (;;) {
		struct pend q;
		ssize_t n;
		int e;

		while (!P.n)
			pthread_cond_wait(&P.cv, &P.lock);
		q = P.q[P.head];
		pthread_mutex_unlock(&P.lock);
		n = fd < 0 ? -1 : sendto(fd, &q.f, sizeof(q.f), 0,
					 (struct sockaddr *)&q.sa, q.sl);
		e = n < 0 ? errno : 0;
		pthread_mutex_lock(&P.lock);
		if (n == (ssize_t)sizeof(q.f)) {
			atomic_fetch_add(&ursa_udp_cnt.cm_rx, 1);
		} else if (e == EAGAIN || e == ENOBUFS || fd < 0) {
			pend_drop_owner();	/* the owner reads nothing */
			continue;
		} else {
			/* the owner is gone: answered as if never owned */
			pthread_mutex_unlock(&P.lock);
			orphan(&q.f);
			pthread_mutex_lock(&P.lock);
		}
		P.head = (P.head + 1) % URSA_GSI_PEND_MAX;
		P.n--;
	}
	return NULL;
}

/* Queue a MAD for the thread; under P.lock. 0, or -1 when full. */
static int pend_add(const struct cm_fwd *f, const struct sockaddr_un *sa,
		    socklen_t sl)
{
	struct pend *q;

	if (!P.q && !(P.q = malloc(URSA_GSI_PEND_MAX * sizeof(*P.q))))
		return -1;
	if (P.n == URSA_GSI_PEND_MAX)
		return -1;
	if (!P.running) {
		sigset_t all, old;
		pthread_t t;
		int r;

		/* the thread takes no signals: they stay the application's */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		r = pthread_create(&t, NULL, pend_thread, NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (r)
			return -1;
		pthread_detach(t);
		P.running = true;
	}
	q = &P.q[(P.head + P.n) % URSA_GSI_PEND_MAX];
	q->f = *f;
	q->sa = *sa;
	q->sl = sl;
	P.n++;
	pthread_cond_signal(&P.cv);
	return 0;
}

/* Hand a MAD to the owner of its route: 1 when handed over, 2 when queued
 * for it (counted when handed over), 0 when lost (as on a wire: the CM
 * retransmits; nobody answers for it), -1 when nobody owns it. */
static int deliver(const struct cm_msg *m, const struct cm_fwd *f)
{
	struct sockaddr_un sa;
	socklen_t sl;
	uint64_t key;
	bool by_sid;
	ssize_t n;
	int fd = unx_sock(), r;

	cm_route(m, &key, &by_sid);
	sl = cm_route_addr(&sa, key, by_sid);
	if (fd < 0)
		return 0;
	pthread_mutex_lock(&P.lock);
	if (P.n && pend_has(&sa, sl)) {
		r = pend_add(f, &sa, sl) ? 0 : 2;
		pthread_mutex_unlock(&P.lock);
		return r;
	}
	n = sendto(fd, f, sizeof(*f), MSG_DONTWAIT, (struct sockaddr *)&sa, sl);
	if (n == (ssize_t)sizeof(*f))
		r = 1;
	else if (n < 0 && (errno == EAGAIN || errno == ENOBUFS))
		r = pend_add(f, &sa, sl) ? 0 : 2;
	else
		r = -1;
	pthread_mutex_unlock(&P.lock);
	return r;
}

/* fork(): the child has no forwarding thread and none of the parent's
 * queued MADs (the parent delivers them) */
void ursa_gsi_atfork_child(void)
{
	pthread_mutex_init(&G.lock, NULL);
	pthread_mutex_init(&P.lock, NULL);
	pthread_cond_init(&P.cv, NULL);
	P.head = P.n = 0;
	P.running = false;
}

/* A MAD nobody owns: answered as the kernel's CM answers it, or dropped */
static void orphan(const struct cm_fwd *f)
{
	struct cm_msg m, r;
	union ibv_gid src, dst;
	uint8_t mad[CM_MAD_LEN];

	memcpy(src.raw, f->src, 16);
	memcpy(dst.raw, f->dst, 16);
	if (cm_parse(f->mad, CM_MAD_LEN, &m) || !cm_orphan_reply(&m, &r) ||
	    cm_build(mad, &r) || send_mad(&dst, &src, 0, mad)) {
		atomic_fetch_add(&ursa_udp_cnt.cm_drop, 1);
		return;
	}
	atomic_fetch_add(&ursa_udp_cnt.cm_orphan, 1);
}

void ursa_gsi_rx(const struct roce_pkt *p, const union ibv_gid *src,
		 uint16_t sport, const union ibv_gid *dst)
{
	struct cm_msg m;
	struct cm_fwd f = { .magic = CM_FWD_MAGIC, .sport = sport, .hop = 64 };
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
	if (d == 1)
		atomic_fetch_add(&ursa_udp_cnt.cm_rx, 1);
	else if (d == 0)
		atomic_fetch_add(&ursa_udp_cnt.cm_drop, 1);
	else if (d < 0)
		orphan(&f);
}
