// SPDX-License-Identifier: MIT
/*
 * rc_recv.c - receive dispatch of the RoCEv2 engine (rc.h): a packet whose ICRC
 * the UDP transport has checked is parsed, its destination QP looked up
 * (QP1: the CM's MADs, transport/gsi.c), its opcode, source and the QP's
 * state checked, and handed to the completer or the responder. A packet
 * for a QPN this process does not have goes back to the transport, which
 * may forward it to the process that owns it.
 */
#include "rc.h"

#include <errno.h>

/* The up-call (struct ursa_udp_up): the transport's receive path holds
 * its receive lock. run_qp (NULL: none): the QP the packets of one
 * received datagram were for so far, with the reference its lookup took,
 * which the transport drops after the datagram; a coalesced run's packets
 * are for one QP (the sender sends them from its socket), so the lookup
 * is made once per run. */
/* A CNP for one of our QPs: its requester slows down (rc_comp.c). A
 * CNP's source is whichever port the peer's NIC sends from, so only the
 * QP's peer address is checked, not its port. */
static void on_cnp(struct ursa_qp *qp, const addr_t *src)
{
	struct ursa_rc *u = qp->rc;

	if (!u || qp->ex.qp_base.qp_type == IBV_QPT_UD ||
	    memcmp(qp->attr.ah_attr.grh.dgid.raw, src->raw, 16)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_src, 1);
		return;
	}
	pthread_mutex_lock(&u->lock);
	rc_comp_cnp(qp, u, ursa_now_ns());
	pthread_mutex_unlock(&u->lock);
}

/* A response (the QP's lock held): to the completer if the QP sends.
 * Returns whether this pass should run the requester at once (the
 * message is decided, or packets are wanted again); another context's
 * engine is told instead. */
static bool on_resp(struct ursa_qp *qp, struct ursa_rc *u,
		    const struct roce_pkt *p)
{
	int st = qp_state(qp);

	if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) {
		atomic_fetch_add(&ursa_udp_cnt.drop_state, 1);
		return false;
	}
	rc_on_response(qp, u, p);
	if (qp->ctx != ursa_pass_ctx) {
		if (qp->ctx->eng)
			ursa_engine_kick(qp->ctx->eng);
		return false;
	}
	return u->m.done || u->m.nak || u->sr.nwant ||
	       (u->pipe_n && (PIPE(u, 0)->done || u->pipe_nak ||
			      u->pipe_gap));
}

/* A packet for one of our QPs: its opcode, source and the QP's state
 * checked, then to the completer (a response) or the responder (a
 * request). */
static void dispatch(struct ursa_qp *qp, const struct roce_pkt *p,
		     uint8_t *buf, size_t len, const addr_t *src,
		     uint16_t sport, const addr_t *dst, unsigned flags)
{
	struct ursa_rc *u;
	uint32_t f;
	enum ibv_qp_type t;
	bool decided = false;

	u = qp->rc;
	t = qp->ex.qp_base.qp_type;
	ursa_cnt_add(&qp->cnt.pkts_rx, 1);
	f = roce_opcode_flags(p->opcode);
	if (!u || (p->opcode & 0xe0) != (t == IBV_QPT_RC ? ROCE_RC :
					t == IBV_QPT_UC ? ROCE_UC : ROCE_UD)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_opcode, 1);
		return;
	}
	/* Connected QPs accept packets only from their peer's address. */
	if (t != IBV_QPT_UD &&
	    memcmp(qp->attr.ah_attr.grh.dgid.raw, src->raw, 16)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_src, 1);
		atomic_fetch_add(&qp->cnt.drops, 1);
		return;
	}
	pthread_mutex_lock(&u->lock);
	if (t != IBV_QPT_UD && (u->ep.rxfd < 0 || u->ep.rx_port != sport))
		ursa_udp_ep_connect(&u->ep, src, sport);
	if (f & P_RESP) {
		rc_wide_learn(u, p->wide);	/* (an ursa responder's) */
		decided = on_resp(qp, u, p);
	} else if (!rc_can_receive(qp_state(qp))) {
		atomic_fetch_add(&ursa_udp_cnt.drop_state, 1);
		atomic_fetch_add(&qp->cnt.drops, 1);
	} else {
		if ((flags & URSA_UDP_RX_CE) && t != IBV_QPT_UD)
			rc_send_cnp(qp, u, src, dst);
		u->req_sr = p->sr && ursa_cfg()->sr;
		if (u->stash_len)
			rc_run_held(qp, u);	/* in PSN order */
		if (!rc_hold_request(qp, u, p, f, buf, len, dst, src)) {
			rc_on_request(qp, u, p, dst, src);
			rc_sr_drain(qp, u);
		}
	}
	pthread_mutex_unlock(&u->lock);
	ursa_udp_flush_soon();
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
			rc_run_held(qp, u);
		pthread_mutex_unlock(&u->lock);
		ursa_udp_flush_soon();
	}
}

static int rc_rx(uint8_t *buf, size_t len, const addr_t *src, uint16_t sport,
		 const addr_t *dst, unsigned flags, struct ursa_qp **run_qp,
		 uint32_t *dqpn)
{
	struct roce_pkt p;
	struct ursa_qp *qp;

	if (roce_parse(buf, len, &p)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_opcode, 1);
		return 0;
	}
	if (run_qp && *run_qp && (*run_qp)->ex.qp_base.qp_num == p.dqpn) {
		qp = *run_qp;
	} else {
		if (p.dqpn == 1) {	/* QP1: the CM's MADs */
			ursa_gsi_rx(&p, src, sport, dst);
			return 0;
		}
		qp = ursa_loop_get(dst, p.dqpn);
		if (!qp) {
			*dqpn = p.dqpn;
			return -ENOENT;
		}
		if (run_qp) {
			if (*run_qp)
				ursa_loop_put(*run_qp);
			*run_qp = qp;	/* (its reference, dropped by the caller) */
		}
	}
	if (roce_opcode_flags(p.opcode) & P_CNP)
		on_cnp(qp, src);
	else
		dispatch(qp, &p, buf, len, src, sport, dst, flags);
	if (!run_qp)
		ursa_loop_put(qp);
	return 0;
}

__attribute__((constructor)) static void rc_recv_hooks(void)
{
	ursa_udp_up.rx = rc_rx;
}
