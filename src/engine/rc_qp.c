// SPDX-License-Identifier: MIT
/*
 * rc_qp.c - per-QP protocol state of the RoCEv2 engine (rc.h): created and
 * dropped with the QP, reset by modify_qp (PSNs, state), the pipe of
 * messages sent whole and waiting for their answers, and the window.
 */
#include "rc.h"

#include <stdlib.h>

#include "../core/hooks.h"

bool rc_can_receive(int st)
{
	return st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
	       st == IBV_QPS_SQE;
}

int ursa_rc_qp_init(struct ursa_qp *qp)
{
	struct ursa_rc *u = calloc(1, sizeof(*u));

	if (!u)
		return -ENOMEM;
	pthread_mutex_init(&u->lock, NULL);
	u->qp = qp;
	u->cwnd = URSA_UDP_WINDOW_INIT;
	u->ssthresh = URSA_UDP_WINDOW_MAX;
	ursa_udp_ep_open(&u->ep, qp->ex.qp_base.qp_num);
	qp->rc = u;
	return 0;
}

void ursa_rc_qp_fini(struct ursa_qp *qp)
{
	struct ursa_rc *u = qp->rc;

	if (!u)
		return;
	rc_ack_flush(u, true);
	free(u->stash);
	rc_sr_free_held(u);
	ursa_rstate_drop(&u->rs);
	ursa_udp_ep_close(&u->ep);
	pthread_mutex_destroy(&u->lock);
	free(u);
	qp->rc = NULL;
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
 * unanswered message the one in flight again (rc_pipe_collapse) and drops
 * the state of the others; they go out again after it, with the same
 * PSNs, as go-back-N wants. Without this a QP moved one message per
 * round trip: 9 000 64-byte WRITEs a second between namespaces.
 */
bool rc_is_atomic_op(uint32_t op)
{
	return op == IBV_WR_ATOMIC_CMP_AND_SWP ||
	       op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

int rc_pipe_class(uint32_t op)
{
	if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
	    op == IBV_WR_SEND_WITH_INV)
		return 1;
	return op == IBV_WR_RDMA_READ || rc_is_atomic_op(op) ? 2 : 0;
}

/* The pipe entry holding PSN psn, or -1. */
int rc_pipe_holds(const struct ursa_rc *u, uint32_t psn)
{
	for (uint32_t i = 0; i < u->pipe_n; i++)
		if (((psn - PIPE(u, i)->first) & 0xffffff) < PIPE(u, i)->npkts)
			return (int)i;
	return -1;
}

void rc_pipe_drop(struct ursa_rc *u)
{
	for (uint32_t i = 0; i < u->pipe_n; i++)
		PIPE(u, i)->wqe->piped = false;
	u->pipe_n = u->pipe_out = u->pipe_nak = 0;
	u->pipe_gap = false;
}

void rc_pipe_pop(struct ursa_rc *u)
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

void ursa_rc_qp_modified(struct ursa_qp *qp, int mask)
{
	struct ursa_rc *u = qp->rc;

	if (!u)
		return;
	if (mask & IBV_QP_STATE)
		rc_ack_flush(u, true);
	pthread_mutex_lock(&u->lock);
	if (mask & IBV_QP_RQ_PSN) {
		u->epsn = qp->attr.rq_psn;
		u->nak_sent = false;
		memset(u->rres, 0, sizeof(u->rres));
		rc_sr_free_held(u);
	}
	if (mask & IBV_QP_SQ_PSN)
		u->next_psn = u->psn_hi = qp->attr.sq_psn;
	if (mask & IBV_QP_STATE) {
		u->m.active = false;
		rc_pipe_drop(u);
		u->pipe_cool = NULL;
		rc_sr_forget(u);
		u->sr.on = false;
		u->peer_wide = u->path_wide = 0;
		u->wide_all = u->path_all = false;
		u->req_sr = false;
		ursa_rstate_drop(&u->rs);
		if (!rc_can_receive(qp->attr.qp_state)) {
			__atomic_store_n(&u->stash_len, 0, __ATOMIC_RELAXED);
			rc_sr_free_held(u);
		}
	}
	pthread_mutex_unlock(&u->lock);
}

void ursa_rc_abort(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_rc *u = qp->rc;

	if (!u)
		return;
	pthread_mutex_lock(&u->lock);
	if (u->pipe_cool == w)
		u->pipe_cool = NULL;
	/* WQEs complete in order: one sent whole leaves the front of the
	 * pipe, the one being sent drops its state */
	if (u->pipe_n && PIPE(u, 0)->wqe == w) {
		rc_pipe_pop(u);
	} else if (u->m.wqe == w) {
		u->m.active = false;
		rc_pipe_drop(u);	/* (flushed behind it) */
	}
	pthread_mutex_unlock(&u->lock);
}

uint32_t rc_mtu_of(struct ursa_qp *qp)
{
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD)
		return (uint32_t)ursa_mtu_bytes(ursa_device_get()->active_mtu);
	return (uint32_t)ursa_mtu_bytes(qp->attr.path_mtu ? qp->attr.path_mtu :
							    IBV_MTU_1024);
}

/* The size of ursa's wide packets to this QP's peer (proto/roce.h
 * ROCE_BTH4_WIDE_SHIFT): as large as both ends' links carry, once the
 * responder has said what it takes, and only where the application chose
 * the port's active MTU (one that asked for less keeps it). 0: none. */
static uint32_t wide_of(struct ursa_qp *qp, const struct ursa_rc *u,
			uint32_t m)
{
	const struct ursa_device *d = ursa_device_get();
	uint32_t w = MIN(d->wide, u->peer_wide);

	if (!w || w <= m || qp->ex.qp_base.qp_type != IBV_QPT_RC ||
	    !ursa_cfg()->wide || m != (uint32_t)ursa_mtu_bytes(d->active_mtu))
		return 0;
	return w;
}

/*
 * The packet size of a message starting at psn: the path MTU, or wide
 * packets (a READ says the size in its requests, rc_read_code, and the
 * responder cuts its responses so; atomics are one packet). A message
 * keeps its size when it is sent again from its start with the same PSNs
 * (the messages a go-back drops from the pipe start again,
 * rc_pipe_collapse): cut otherwise, the responder, which places a
 * message's packets at the offsets of the ones before, would put the
 * bytes of the second cut where the first cut's belong, and a READ asked
 * again would match no READ it remembers. So the size depends on the PSN
 * alone: messages from past every PSN used when the size was learned
 * (rc_wide_learn) are wide, those before are not, until a message starts
 * with nothing older left to send again (wide_all, rc_req.c msg_start).
 */
uint32_t rc_msg_mtu(struct ursa_qp *qp, const struct ursa_rc *u, uint32_t op,
		    uint32_t psn)
{
	uint32_t m = rc_mtu_of(qp), w = wide_of(qp, u, m);

	if (!w || rc_is_atomic_op(op) ||
	    (!u->wide_all && psn_cmp(psn, u->wide_psn) < 0))
		return m;
	if (u->path_wide && (u->path_all || psn_cmp(psn, u->path_psn) >= 0))
		return MAX(m, MIN(w, u->path_wide));
	return w;
}

/* The PSN past every one a message was cut for: after a go-back next_psn
 * is behind psn_hi, and the messages between go again. */
static uint32_t psn_past_cut(const struct ursa_rc *u)
{
	return psn_cmp(u->next_psn, u->psn_hi) > 0 ? u->next_psn : u->psn_hi;
}

/*
 * A path narrower than our wide packets (the kernel learned its MTU from
 * an ICMP "fragmentation needed" and refused a GSO run, transport/udp.c):
 * those packets still arrive, fragmented, but new messages are cut to
 * fit, from past every PSN used so far (the rule of rc_msg_mtu), at a
 * wide size that fits or the path MTU. Looked at when the transport says
 * some path was found narrow; once a connection.
 */
void rc_path_learn(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *dst)
{
	unsigned gen = ursa_udp_pmtu_gen();
	size_t seg;
	uint32_t w, fit;

	if (gen == u->pmtu_gen || u->path_wide)
		return;
	u->pmtu_gen = gen;
	w = wide_of(qp, u, rc_mtu_of(qp));
	seg = ursa_udp_path_seg(dst);
	if (!w || seg <= ROCE_WIDE_HDRS || seg >= w + ROCE_WIDE_HDRS)
		return;
	fit = roce_wide_bytes(roce_wide_code((uint32_t)seg - ROCE_WIDE_HDRS));
	u->path_wide = fit ? fit : rc_mtu_of(qp);
	u->path_psn = psn_past_cut(u);
}

/* An answer from an ursa responder says what it takes: once per
 * connection. Wide from past every PSN a message was cut for. */
void rc_wide_learn(struct ursa_rc *u, uint8_t code)
{
	if (u->peer_wide || !code)
		return;
	u->peer_wide = roce_wide_bytes(code);
	u->wide_psn = psn_past_cut(u);
}

/* The size code a READ request of a message cut at mtu carries. */
uint8_t rc_read_code(struct ursa_qp *qp, uint32_t mtu)
{
	return mtu > rc_mtu_of(qp) ? roce_wide_code(mtu) : 0;
}

/* The packet size of the responses to a READ request: its code's, or the
 * path MTU. The code is the requester's: it chose it below what our
 * answers said we take, and it places the responses by it. */
uint32_t rc_read_mtu(struct ursa_qp *qp, const struct roce_pkt *p)
{
	return p->wide ? roce_wide_bytes(p->wide) : rc_mtu_of(qp);
}

/* What the answers of a responder say it takes (0: its path MTU). */
uint8_t rc_wide_code(const struct ursa_rc *u)
{
	return u->req_sr && ursa_cfg()->wide ?
	       roce_wide_code(ursa_device_get()->wide) : 0;
}

static uint32_t window_max(struct ursa_qp *qp, const struct ursa_rc *u)
{
	int rb = ursa_udp_rcvbuf();
	uint32_t bytes = MIN(URSA_UDP_WINDOW_BYTES, (uint32_t)MAX(rb, 0) / 2);
	uint32_t m = rc_mtu_of(qp), w = wide_of(qp, u, m);

	return MIN(URSA_UDP_WINDOW_MAX,
		   MAX(URSA_UDP_WINDOW, bytes / (w ? w : m)));
}

/* n more packets acknowledged. Up to a threshold the window grows by each
 * packet acknowledged; beyond it, by one packet per window acknowledged, as
 * TCP's does (RFC 5681). The threshold starts at the maximum and a loss sets
 * it to half the window then, but never below URSA_UDP_WINDOW packets: a
 * lossy path's window comes back at once to URSA_UDP_WINDOW (a cumulative ACK
 * may cover hundreds of packets: a pipelined message's end, an ACK after a
 * NAK), where go-back-N under 5 % loss still moves the most data, and only
 * slowly beyond it, where each loss would cost a larger window resent. */
void rc_window_grow(struct ursa_qp *qp, struct ursa_rc *u, uint32_t n)
{
	uint32_t max = window_max(qp, u);

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

/* Congestion (a loss with a queue, ECN marks): the window halves, never
 * below URSA_UDP_WINDOW_MIN, and grows back from there by one packet per
 * window acknowledged (the threshold set there), as TCP's does. */
void rc_window_cut(struct ursa_rc *u)
{
	u->cwnd = MAX(URSA_UDP_WINDOW_MIN, u->cwnd / 2);
	u->ssthresh = u->cwnd;
	u->cwnd_acc = 0;
}

uint8_t rc_transport_bits(struct ursa_qp *qp)
{
	switch (qp->ex.qp_base.qp_type) {
	case IBV_QPT_UC: return ROCE_UC;
	case IBV_QPT_UD: return ROCE_UD;
	default: return ROCE_RC;
	}
}

void ursa_rc_qp_forget(struct ursa_qp *qp)
{
	if (qp->rc)
		ursa_udp_ep_forget(&qp->rc->ep);
}

uint32_t ursa_rc_epsn(struct ursa_qp *qp)
{
	return qp->rc ? qp->rc->epsn : 0;
}

uint32_t ursa_rc_unanswered_psn(struct ursa_qp *qp)
{
	struct ursa_rc *u = qp->rc;
	uint32_t psn;

	if (!u)
		return 0;
	pthread_mutex_lock(&u->lock);
	psn = u->pipe_n ? psn_add(PIPE(u, 0)->first, PIPE(u, 0)->acked) :
			  psn_add(u->m.first, u->m.acked);
	pthread_mutex_unlock(&u->lock);
	return psn;
}

__attribute__((constructor)) static void rc_qp_hooks(void)
{
	ursa_hooks.rc_qp_init = ursa_rc_qp_init;
	ursa_hooks.rc_qp_modified = ursa_rc_qp_modified;
	ursa_hooks.rc_qp_fini = ursa_rc_qp_fini;
	ursa_hooks.rc_qp_forget = ursa_rc_qp_forget;
}
