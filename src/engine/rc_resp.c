// SPDX-License-Identifier: MIT
/*
 * rc_resp.c - the responder of the RoCEv2 engine (rc.h): a request packet is
 * checked against the expected PSN (duplicates acknowledged, not applied;
 * a duplicate READ executed again; an atomic answered from its saved
 * result, IBTA 9.7.5.1.3), then executed by the responder every transport
 * shares (resp.c), and answered: ACK, NAK, READ responses, atomic ACK.
 */
#include "rc.h"

#include <stdlib.h>

static uint8_t nak_syndrome(enum ursa_ack a, uint8_t rnr)
{
	switch (a) {
	case URSA_NAK_RNR: return (uint8_t)(AETH_RNR | (rnr & 0x1f));
	case URSA_NAK_ACCESS: return AETH_NAK_ACCESS;
	case URSA_NAK_OP_ERR: return AETH_NAK_OP;
	default: return AETH_NAK_INV;
	}
}

static void on_read_req(struct ursa_qp *qp, struct ursa_rc *u,
			const struct roce_pkt *p, struct ursa_req *r,
			const addr_t *me, const addr_t *peer)
{
	uint32_t mtu = rc_read_mtu(qp, p);
	uint32_t n = (uint32_t)MAX(1, ((uint64_t)p->dmalen + mtu - 1) / mtu);
	/* a requester that repeats selectively may ask for the responses it
	 * lost alone (rc_sr.c); it learns what we take (rc_qp.c) */
	bool sr = p->sr && ursa_cfg()->sr;
	uint8_t wide = rc_wide_code(u);

	for (uint32_t k = 0; k < n; k++) {
		uint32_t len = (uint32_t)MIN((uint64_t)mtu, p->dmalen - (uint64_t)k * mtu);
		/* read straight into the packet, built where the batch
		 * sends it from */
		uint8_t *buf = ursa_udp_slot(), *data;
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
				rc_send_ack(qp, u, peer, me, OP_ACK,
					    nak_syndrome(resp.ack, resp.rnr_timer),
					    p->psn, 0);
			return;
		}
		o.pkey = ROCE_DEFAULT_PKEY;
		o.dqpn = qp->attr.dest_qp_num;
		o.psn = psn_add(p->psn, k);
		o.sr = sr;
		o.wide = wide;
		o.syndrome = AETH_ACK | AETH_CREDIT_INVALID;
		o.msn = u->msn;
		b = roce_build(buf, URSA_UDP_MAX_PKT, &o, data, len);
		if (b <= 0)
			continue;
		if (ursa_gid_v4(me) == ursa_gid_v4(peer)) {	/* (else rc_tx sends nothing) */
			/* the headers' part of the ICRC from the cache, as
			 * for our requests (send_data_pkt) */
			uint32_t pfx = ursa_udp_icrc_pfx(&u->rpfx, me, peer,
							 u->ep.sport, (size_t)b);

			roce_icrc_put(buf + b - 4,
				      roce_icrc_fill_from(pfx, buf, (size_t)b - 4,
							  (size_t)b - 4, NULL, 0));
		}
		rc_tx(u, me, peer, buf, (size_t)b, qp->attr.ah_attr.grh.hop_limit,
		      true);
	}
}

/* Does a READ request start inside one executed lately, at its rkey and
 * at the address its PSN stands for? With end, whether it also ends inside
 * it (a subset: nothing to remember anew). */
static bool read_remembered(const struct ursa_rc *u, const struct roce_pkt *p,
			    uint32_t mtu, uint32_t end, bool *inside)
{
	for (unsigned i = 0; i < URSA_UDP_RRES; i++) {
		uint32_t k = (p->psn - u->rres[i].psn) & 0xffffff;

		if (u->rres[i].valid && k < u->rres[i].npkts &&
		    p->rkey == u->rres[i].rkey && mtu == u->rres[i].mtu &&
		    p->va == u->rres[i].va + (uint64_t)k * mtu) {
			if (inside)
				*inside = ((end - u->rres[i].psn) & 0xffffff) <=
					  u->rres[i].npkts;
			return true;
		}
	}
	return false;
}

/* An RC request behind the expected PSN: a duplicate (IBTA 9.7.5.1.3),
 * answered from what the responder remembers: an atomic's saved result,
 * a READ executed again (returns true), a SEND's or WRITE's ACK. */
static bool rc_duplicate(struct ursa_qp *qp, struct ursa_rc *u,
			 const struct roce_pkt *p, uint32_t f,
			 const addr_t *me, const addr_t *peer)
{
	atomic_fetch_add(&ursa_udp_cnt.dup, 1);
	if (f & P_ATOMIC) {
		for (unsigned i = 0; i < URSA_UDP_ARES; i++)
			if (u->ares[i].valid && u->ares[i].psn == p->psn)
				rc_send_ack(qp, u, peer, me, OP_ATOMIC_ACK,
					    AETH_ACK | AETH_CREDIT_INVALID,
					    p->psn, u->ares[i].orig);
		return false;
	}
	if (f & P_READ) {
		if (read_remembered(u, p, rc_read_mtu(qp, p), 0, NULL))
			return true;	/* re-executed */
		atomic_fetch_add(&ursa_udp_cnt.drop_stale, 1);
		return false;
	}
	if (p->ackreq)
		rc_send_ack(qp, u, peer, me, OP_ACK,
			    AETH_ACK | AETH_CREDIT_INVALID,
			    psn_add(u->epsn, 0xffffff), 0);
	return false;
}

/* The request's PSN against the expected one (IBTA 9.7.5.1): RC answers
 * a gap with one NAK and a duplicate from what it remembers (an atomic's
 * result, a READ executed again, an ACK); UC drops the rest of a message
 * after a gap (IBTA 9.8.3). Returns whether to execute the packet. */
static bool psn_check(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct roce_pkt *p, uint32_t f, const addr_t *me,
		      const addr_t *peer)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;

	if (t == IBV_QPT_RC) {
		int32_t d = psn_cmp(p->psn, u->epsn);

		if (d > 0) {
			/* held for its turn (selective repeat, rc_sr.c) */
			if (rc_sr_hold(qp, u, p, f,
				       (p->psn - u->epsn) & 0xffffff, me, peer))
				return false;
			/* a gap: one NAK per gap (IBTA 9.7.5.1.1) */
			atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
			atomic_fetch_add(&qp->cnt.drops, 1);
			if (!u->nak_sent) {
				u->nak_sent = true;
				rc_send_ack(qp, u, peer, me, OP_ACK, AETH_NAK_PSN, u->epsn, 0);
			}
			return false;
		}
		if (d < 0)
			return rc_duplicate(qp, u, p, f, me, peer);
		u->nak_sent = false;
		rc_sr_taken(u, p->psn);
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
			return false;
		}
	}
	return true;
}

/* A READ request: answered (on_read_req), remembered for duplicates. */
static void exec_read(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct roce_pkt *p, struct ursa_req *r,
		      const addr_t *me, const addr_t *peer)
{
	uint32_t mtu = rc_read_mtu(qp, p);
	uint32_t end = psn_add(p->psn, (uint32_t)MAX(1, ((uint64_t)p->dmalen +
							 mtu - 1) / mtu));
	bool inside = false;

	on_read_req(qp, u, p, r, me, peer);
	/* remembered unless a re-request of part of one remembered */
	if (!read_remembered(u, p, mtu, end, &inside) || !inside) {
		unsigned k = u->rres_next++ % URSA_UDP_RRES;

		u->rres[k].psn = p->psn;
		u->rres[k].npkts = (end - p->psn) & 0xffffff;
		u->rres[k].rkey = p->rkey;
		u->rres[k].va = p->va;
		u->rres[k].mtu = mtu;
		u->rres[k].valid = true;
	}
	if (psn_cmp(p->psn, u->epsn) >= 0)
		u->msn++;
	/* A duplicate that reaches past epsn: a requester that took a
	 * READ back asks again from inside it, for the rest, and the
	 * rest may include PSNs it had not asked for before (pieces,
	 * rc_comp.c rc_pipe_collapse). They were answered just now: expect
	 * what follows them, or the next request looks like a gap
	 * that no resend fills. */
	if (psn_cmp(end, u->epsn) > 0) {
		u->epsn = end;
		u->nak_sent = false;
	}
}

/* An atomic: executed, its result saved for a duplicate, answered. */
static void exec_atomic(struct ursa_qp *qp, struct ursa_rc *u,
			const struct roce_pkt *p, struct ursa_req *r,
			const addr_t *me, const addr_t *peer)
{
	uint8_t op = p->opcode & 0x1f;
	struct ursa_resp resp;

	r->opcode = op == OP_CMP_SWAP ? IBV_WR_ATOMIC_CMP_AND_SWP :
					IBV_WR_ATOMIC_FETCH_AND_ADD;
	r->frag = URSA_FRAG_ONLY;
	r->remote_addr = p->va;
	r->rkey = p->rkey;
	r->len = r->msg_len = 8;
	r->compare_add = op == OP_CMP_SWAP ? p->compare : p->swap_add;
	r->swap = p->swap_add;
	r->nsrc = 0;
	ursa_resp_execute(qp, r, &resp, NULL);
	if (resp.ack == URSA_ACK) {
		unsigned a = u->ares_next % URSA_UDP_ARES;

		u->ares[a].psn = p->psn;
		u->ares[a].orig = resp.atomic_orig;
		u->ares[a].valid = true;
		u->ares_next++;
		u->epsn = psn_add(p->psn, 1);
		u->msn++;
		rc_send_ack(qp, u, peer, me, OP_ATOMIC_ACK,
			    AETH_ACK | AETH_CREDIT_INVALID, p->psn,
			    resp.atomic_orig);
	} else if (resp.ack != URSA_DROPPED) {
		rc_send_ack(qp, u, peer, me, OP_ACK,
			    nak_syndrome(resp.ack, resp.rnr_timer), p->psn, 0);
	}
}

/* A WRITE packet: its part of the message the first packet's RETH
 * announced, into the MR. */
static void exec_write(struct ursa_qp *qp, struct ursa_rc *u,
		       const struct roce_pkt *p, uint32_t f,
		       struct ursa_req *r, struct ursa_resp *resp)
{
	uint8_t op = p->opcode & 0x1f;

	if (f & P_FIRST) {
		u->wva = p->va;
		u->wrkey = p->rkey;
		u->wlen = p->dmalen;
		u->woff = 0;
	}
	if (u->woff + p->paylen > u->wlen) {
		/* more data than the RETH announced */
		resp->ack = qp->ex.qp_base.qp_type == IBV_QPT_RC ?
			    URSA_NAK_INV_REQ : URSA_DROPPED;
		resp->rnr_timer = 0;
		return;
	}
	r->opcode = (op == OP_WRITE_LAST_IMM || op == OP_WRITE_ONLY_IMM) ?
		    IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	r->has_imm = r->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	r->imm = p->imm;
	r->remote_addr = u->wva + u->woff;
	r->rkey = u->wrkey;
	r->len = p->paylen;
	r->offset = u->woff;
	r->msg_len = u->wlen;
	ursa_resp_execute(qp, r, resp, NULL);
	if (resp->ack == URSA_ACK)
		u->woff += p->paylen;
}

/* A SEND packet (UD messages are single packets) into the receive WQE
 * the message took (u->rs). */
static void exec_send(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct roce_pkt *p, uint32_t f,
		      struct ursa_req *r, struct ursa_resp *resp)
{
	uint8_t op = p->opcode & 0x1f;

	if (f & P_FIRST)
		u->soff = 0;
	r->opcode = (op == OP_SEND_LAST_IMM || op == OP_SEND_ONLY_IMM) ?
		    IBV_WR_SEND_WITH_IMM :
		    (op == OP_SEND_LAST_INV || op == OP_SEND_ONLY_INV) ?
		    IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
	r->has_imm = r->opcode == IBV_WR_SEND_WITH_IMM;
	r->invalidate = r->opcode == IBV_WR_SEND_WITH_INV;
	r->imm = p->imm;
	r->len = p->paylen;
	r->offset = u->soff;
	r->msg_len = (f & P_FIRST) && (f & P_LAST) ? p->paylen : 0;
	ursa_resp_execute(qp, r, resp, &u->rs);
	if (resp->ack == URSA_ACK)
		u->soff += p->paylen;
}

/* A request packet for our responder QP, its ICRC, opcode and source
 * already checked (rc_recv.c); called with u->lock held. */
void rc_on_request(struct ursa_qp *qp, struct ursa_rc *u,
		   const struct roce_pkt *p, const addr_t *me,
		   const addr_t *peer)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	uint32_t f = roce_opcode_flags(p->opcode);
	struct ursa_req r = { 0 };
	struct ursa_resp resp;
	struct ursa_sg s = { (uintptr_t)p->payload, p->paylen };

	if (!psn_check(qp, u, p, f, me, peer))
		return;
	r.type = t;
	r.src_qpn = t == IBV_QPT_UD ? p->sqpn : qp->attr.dest_qp_num;
	r.qkey = p->qkey;
	r.sgid = *peer;
	r.dgid = *me;
	r.hop_limit = 64;
	r.solicited = p->se;
	r.src = &s;
	r.nsrc = 1;
	r.frag = ((f & P_FIRST) ? URSA_FRAG_FIRST : 0) |
		 ((f & P_LAST) ? URSA_FRAG_LAST : 0);
	if (f & P_READ) {
		exec_read(qp, u, p, &r, me, peer);
		return;
	}
	if (f & P_ATOMIC) {
		exec_atomic(qp, u, p, &r, me, peer);
		return;
	}
	if (f & P_WRITE)
		exec_write(qp, u, p, f, &r, &resp);
	else
		exec_send(qp, u, p, f, &r, &resp);
	if (t != IBV_QPT_RC) {
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
			rc_ack_later(qp, u, peer, me, p->psn);
		else if (p->ackreq)
			rc_send_ack(qp, u, peer, me, OP_ACK,
				    AETH_ACK | AETH_CREDIT_INVALID, p->psn, 0);
	} else if (resp.ack != URSA_DROPPED) {
		rc_send_ack(qp, u, peer, me, OP_ACK,
			    nak_syndrome(resp.ack, resp.rnr_timer), p->psn, 0);
	}
}

/*
 * Completion order (docs/design.md "Delayed ACK"): the peer sends its held
 * ACK of our message after its own next request, so a request of the peer
 * that completes a receive here may arrive just before the ACK that completes
 * our send. While our message is signaled, fully sent and not yet
 * acknowledged, such a request is held (copied aside, not executed) until
 * that ACK has completed our message (rc_recv.c rc_rx), for at most
 * URSA_UDP_HOLD_NS, and never past a later request of the QP: the application
 * sees its send completion first, as with a NIC that acknowledges at once.
 * Only on the context's own pass (rc_rx completes the send there). Called
 * with u->lock held.
 */

bool rc_hold_request(struct ursa_qp *qp, struct ursa_rc *u,
		     const struct roce_pkt *p, uint32_t f,
		     const uint8_t *buf, size_t len, const addr_t *me,
		     const addr_t *peer)
{
	const struct ursa_send_wqe *w = u->m.wqe;

	if (qp->ex.qp_base.qp_type != IBV_QPT_RC || qp->ctx != ursa_pass_ctx ||
	    !(f & P_LAST) || !((f & P_SEND) || ((f & P_WRITE) && (f & H_IMM))) ||
	    p->psn != u->epsn || !u->m.active || u->m.done || u->m.nak ||
	    u->m.is_read || rc_is_atomic_op(u->m.op) || u->m.sent < u->m.npkts ||
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
	atomic_store_explicit(&qp->rc_held, true, memory_order_relaxed);
	atomic_fetch_add(&ursa_udp_cnt.reqs_held, 1);
	return true;
}

/* Execute the held request, if the QP can still receive (u->lock held). */
void rc_run_held(struct ursa_qp *qp, struct ursa_rc *u)
{
	size_t len = u->stash_len;
	struct roce_pkt p;

	__atomic_store_n(&u->stash_len, 0, __ATOMIC_RELAXED);
	if (len && !roce_parse(u->stash, len, &p) && rc_can_receive(qp_state(qp))) {
		rc_on_request(qp, u, &p, &u->stash_me, &u->stash_peer);
		rc_sr_drain(qp, u);
	}
}
