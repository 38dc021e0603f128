// SPDX-License-Identifier: MIT
/*
 * resp.c - the responder: checks and executes an incoming request on the
 * target QP (IBTA 9.7.5 "Responder side behavior").
 *
 * Order of checks, as a responder must make them before touching memory:
 * QP state and transport type, Q_Key (UD), opcode against the QP's
 * access flags, the rkey (through ursa_mem_remote: key, PD, bounds, rights),
 * alignment of atomics, then a receive WQE for SENDs and WRITE with
 * immediate, and that the message fits the WQE's buffers. Only when every
 * check passed is memory written. On RC the answer is an ACK or a NAK and
 * the error classes of IBTA 9.9.3.1 move the responder QP to ERR with the
 * affiliated async event; UC and UD drop silently (IBTA 9.8.3, 9.8.4).
 */
#include "engine.h"
#include "../util/fault.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

static uint16_t ip_csum(const uint8_t *h, int len)
{
	uint32_t s = 0;

	for (int i = 0; i < len; i += 2)
		s += (uint32_t)(h[i] << 8 | h[i + 1]);
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)~s;
}

static bool v4mapped(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(g->raw, pfx, 12);
}

/* The 40 bytes a UD receive buffer starts with: an IPv6 header, or for
 * IPv4 RoCEv2 20 undefined bytes then the IPv4 header (as RoCE NICs and rxe
 * place it). */
static void build_grh(uint8_t g[URSA_GRH_LEN], const struct ursa_req *r)
{
	uint32_t plen = 8 + 12 + 8 + (uint32_t)r->len + 4; /* UDP BTH DETH ICRC */

	memset(g, 0, URSA_GRH_LEN);
	if (v4mapped(&r->sgid) && v4mapped(&r->dgid)) {
		uint8_t *h = g + 20;
		uint16_t tot = (uint16_t)(20 + plen);

		h[0] = 0x45;
		h[1] = r->traffic_class;
		h[2] = (uint8_t)(tot >> 8);
		h[3] = (uint8_t)tot;
		h[6] = 0x40; /* DF */
		h[8] = r->hop_limit ? r->hop_limit : 64;
		h[9] = 17;
		memcpy(h + 12, r->sgid.raw + 12, 4);
		memcpy(h + 16, r->dgid.raw + 12, 4);
		uint16_t c = ip_csum(h, 20);

		h[10] = (uint8_t)(c >> 8);
		h[11] = (uint8_t)c;
	} else {
		uint32_t w = htonl(6u << 28 | (uint32_t)r->traffic_class << 20 |
				   (r->flow_label & 0xfffff));

		memcpy(g, &w, 4);
		g[4] = (uint8_t)(plen >> 8);
		g[5] = (uint8_t)plen;
		g[6] = 17;
		g[7] = r->hop_limit ? r->hop_limit : 64;
		memcpy(g + 8, r->sgid.raw, 16);
		memcpy(g + 24, r->dgid.raw, 16);
	}
}

static bool can_receive(int st)
{
	return st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
	       st == IBV_QPS_SQE;
}

/* Responder-detected error on RC: the QP goes to ERR with an affiliated
 * event (IBTA 11.6.3.2); the requester learns it from the NAK. */
static void resp_fatal(struct ursa_qp *tqp, enum ibv_event_type ev)
{
	ursa_qp_to_error(tqp, false);
	ursa_async_event(tqp->ctx, ev, &tqp->ex.qp_base);
}

static void recv_complete(struct ursa_qp *tqp, struct ursa_cq *cq,
			  struct ibv_wc *wc, bool solicited)
{
	if (ursa_cq_push(cq, wc, solicited) == -ENOSPC) {
		ursa_qp_to_error(tqp, false);
		ursa_async_event(tqp->ctx, IBV_EVENT_QP_FATAL,
				 &tqp->ex.qp_base);
	}
}

/* Pop a receive WQE from the SRQ or RQ; the caller holds the queue lock. */
static bool take_recv(struct ursa_qp *tqp, struct ursa_recv_wqe *out)
{
	struct ursa_rq *rq = tqp->srq ? &tqp->srq->rq : &tqp->rq;
	const struct ursa_recv_wqe *w;

	if (!ursa_ring_ready(&rq->ring))
		return false;
	/* The WQE's own SGEs, not all URSA_MAX_SGE of the slot (a copy of
	 * 528 bytes for every receive). (num_sge was checked at post.) */
	w = ursa_ring_peek(&rq->ring);
	out->wr_id = w->wr_id;
	out->num_sge = MIN(w->num_sge, (uint32_t)URSA_MAX_SGE);
	memcpy(out->sge, w->sge, out->num_sge * sizeof(out->sge[0]));
	ursa_ring_consume(&rq->ring, 1);
	if (tqp->srq && tqp->srq->limit &&
	    ursa_ring_ready(&rq->ring) < tqp->srq->limit) {
		/* IBTA 10.2.9.2: the limit event fires once, then disarms. */
		tqp->srq->limit = 0;
		ursa_async_event(tqp->ctx, IBV_EVENT_SRQ_LIMIT_REACHED,
				 &tqp->srq->ibv);
	}
	return true;
}

static pthread_mutex_t *recv_lock(struct ursa_qp *tqp)
{
	return tqp->srq ? &tqp->srq->lock : &tqp->rq_lock;
}

/* Validate a receive WQE's SGEs into sg[]; returns the buffer size or a
 * negative ursa_mem_err. whole: the message comes in one piece, so no
 * reference needs to outlive this call: the QP's receive-side MR cache
 * may serve, if this thread holds the QP's context lock (its pass), and
 * the receive queue is the QP's own (an SRQ may have another PD). */
static int64_t map_recv(struct ursa_qp *tqp, const struct ursa_recv_wqe *w,
			struct ursa_sg *sg, struct ursa_mem_ref *refs,
			uint32_t *nsg, bool whole)
{
	struct ursa_pd *pd = tqp->srq ? tqp->srq->pd : tqp->pd;
	bool cached = whole && !tqp->srq && ursa_pass_ctx == tqp->ctx;
	uint64_t total = 0;
	uint32_t n = MIN(w->num_sge, (uint32_t)URSA_MAX_SGE), k = 0;

	for (uint32_t i = 0; i < n; i++) {
		int e;

		refs[i].k = NULL;
		if (!w->sge[i].length)
			continue;
		e = cached ? ursa_mem_local_cached(tqp, &tqp->rcache,
						   &w->sge[i],
						   IBV_ACCESS_LOCAL_WRITE,
						   &refs[i]) :
			     ursa_mem_local(pd, &w->sge[i],
					    IBV_ACCESS_LOCAL_WRITE, &refs[i]);
		if (e) {
			for (uint32_t j = 0; j < i; j++)
				ursa_mem_put(&refs[j]);
			return e;
		}
		sg[k].va = refs[i].va;
		sg[k].len = w->sge[i].length;
		k++;
		total += w->sge[i].length;
	}
	*nsg = k;
	return (int64_t)total;
}

static void put_refs(struct ursa_mem_ref *refs, uint32_t n)
{
	for (uint32_t i = 0; i < MIN(n, (uint32_t)URSA_MAX_SGE); i++)
		ursa_mem_put(&refs[i]);
}

/* SEND, SEND with immediate or invalidate, and the receive half of WRITE
 * with immediate (data already placed; only the WQE is consumed). A SEND
 * may arrive in fragments: the first takes the receive WQE (or RNRs), the
 * last completes it; rs keeps the WQE in between, not its MRs: every
 * fragment looks its SGEs up again (as rxe does) and lets go before it
 * returns, so that a sender that vanishes mid-message cannot hold an MR
 * that ibv_dereg_mr then waits for (qperf's server hung so). */
/* The receive WQE completes in error; an RC QP goes to ERR with the
 * affiliated event, UC/UD drop the message. wc: its wr_id and status. */
static void recv_fail(struct ursa_qp *tqp, const struct ursa_req *r,
		      const struct ursa_resp *resp, struct ibv_wc *wc)
{
	atomic_fetch_add(&tqp->cnt.errors, 1);
	wc->vendor_err = resp->why;
	wc->qp_num = tqp->ex.qp_base.qp_num;
	wc->src_qp = r->src_qpn;
	wc->opcode = IBV_WC_RECV;
	recv_complete(tqp, tqp->rcq, wc, true);
	if (tqp->ex.qp_base.qp_type == IBV_QPT_RC)
		resp_fatal(tqp, wc->status == IBV_WC_LOC_LEN_ERR ||
				wc->status == IBV_WC_REM_INV_REQ_ERR ?
				IBV_EVENT_QP_REQ_ERR : IBV_EVENT_QP_ACCESS_ERR);
}

/* A message's first fragment takes a receive WQE, maps its SGEs (need
 * bytes must fit) and, on UD, writes the GRH. Returns 0 (st active), 1
 * when answered without a completion (RNR NAK, dropped), -1 when the WQE
 * fails (wc set for recv_fail). */
static int recv_start(struct ursa_qp *tqp, const struct ursa_req *r,
		      struct ursa_resp *resp, bool write_imm,
		      struct ursa_rstate *st, uint64_t need, struct ibv_wc *wc)
{
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;
	bool last = r->frag & URSA_FRAG_LAST;
	pthread_mutex_t *lk = recv_lock(tqp);
	int64_t room;

	ursa_rstate_drop(st);
	pthread_mutex_lock(lk);
	if (!take_recv(tqp, &st->w)) {
		pthread_mutex_unlock(lk);
		atomic_fetch_add(&tqp->cnt.rnr_naks, rc);
		resp->ack = rc ? URSA_NAK_RNR : URSA_DROPPED;
		resp->rnr_timer = tqp->attr.min_rnr_timer;
		resp->why = URSA_WHY_NO_RECV;
		return 1;
	}
	pthread_mutex_unlock(lk);
	st->nsg = 0;
	/* (put_refs reads the WQE's num_sge entries, no more) */
	for (uint32_t i = 0; i < st->w.num_sge; i++)
		st->refs[i].k = NULL;
	room = write_imm ? 0 : map_recv(tqp, &st->w, st->sg, st->refs,
					&st->nsg, last);
	wc->wr_id = st->w.wr_id;
	if (room < 0) {
		wc->status = IBV_WC_LOC_PROT_ERR;
		resp->ack = rc ? URSA_NAK_OP_ERR : URSA_DROPPED;
		resp->why = (uint32_t)-room;
		return -1;
	}
	if ((uint64_t)room < need) {
		put_refs(st->refs, st->w.num_sge);
		wc->status = IBV_WC_LOC_LEN_ERR;
		resp->ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
		resp->why = URSA_WHY_RECV_SHORT;
		return -1;
	}
	st->room = (uint64_t)room;
	st->active = true;
	if (tqp->ex.qp_base.qp_type == IBV_QPT_UD) {
		uint8_t g[URSA_GRH_LEN];
		struct ursa_sg gs = { (uintptr_t)g, URSA_GRH_LEN };

		build_grh(g, r);
		if (ursa_xfer(st->sg, st->nsg, false, &gs, 1, false, 0,
			      0, URSA_GRH_LEN)) {
			put_refs(st->refs, st->w.num_sge);
			st->active = false;
			wc->status = IBV_WC_LOC_ACCESS_ERR;
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_UNMAPPED;
			return -1;
		}
	}
	return 0;
}

/* A fragment's payload into the receive WQE's buffers, at its offset
 * behind the GRH (grh bytes). Returns 0, or -1 when the WQE fails (wc set
 * for recv_fail). */
static int recv_place(struct ursa_qp *tqp, const struct ursa_req *r,
		      struct ursa_resp *resp, struct ursa_rstate *st,
		      uint64_t grh, struct ibv_wc *wc)
{
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;
	int e;

	/* msg_len 0 on a fragment: the total is not known up front
	 * (RoCE SENDs do not carry it); the buffer bounds it. */
	if ((r->msg_len && r->offset + r->len > r->msg_len) ||
	    grh + r->offset + r->len > st->room) {
		wc->wr_id = st->w.wr_id;
		put_refs(st->refs, st->w.num_sge);
		st->active = false;
		wc->status = IBV_WC_LOC_LEN_ERR;
		resp->ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
		resp->why = URSA_WHY_RECV_SHORT;
		return -1;
	}
	e = ursa_xfer(st->sg, st->nsg, false, r->src, r->nsrc,
		      r->src_remote, r->peer, grh + r->offset, r->len);
	if (e) {
		wc->wr_id = st->w.wr_id;
		put_refs(st->refs, st->w.num_sge);
		st->active = false;
		wc->status = IBV_WC_LOC_ACCESS_ERR;
		resp->ack = rc ? URSA_NAK_OP_ERR : URSA_DROPPED;
		resp->why = e == -EFAULT ? URSA_WHY_UNMAPPED :
					   URSA_WHY_PEER_MEM;
		return -1;
	}
	return 0;
}

/* The message's last fragment is in: the receive completion (a SEND
 * with invalidate first invalidates). Returns 0, or -1 when the WQE
 * fails (wc set for recv_fail). */
static int recv_done(struct ursa_qp *tqp, const struct ursa_req *r,
		     struct ursa_resp *resp, bool write_imm,
		     struct ursa_rstate *st, uint64_t need, uint64_t grh,
		     struct ibv_wc *wc)
{
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;

	st->active = false;
	wc->wr_id = st->w.wr_id;
	wc->qp_num = tqp->ex.qp_base.qp_num;
	wc->src_qp = r->src_qpn;
	wc->opcode = write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
	wc->byte_len = (uint32_t)(write_imm ? r->msg_len :
				  (r->msg_len ? need : grh + r->offset + r->len));
	if (tqp->ex.qp_base.qp_type == IBV_QPT_UD) {
		/* As mlx5 reports a RoCE UD receive: a GRH, and in sl the
		 * packet's type (bit 3: it came in UDP, RoCEv2; bits 2-0:
		 * its network header, 2 IPv4, 1 IPv6). Software written for
		 * mlx5 (UCX's ud transports) reads sl to know where in the
		 * 40 bytes the addresses are (IBTA A17.4.5.1). */
		wc->wc_flags |= IBV_WC_GRH;
		wc->sl = v4mapped(&r->sgid) && v4mapped(&r->dgid) ?
				 URSA_SL_ROCE_V2_IPV4 : URSA_SL_ROCE_V2_IPV6;
	}
	if (r->invalidate &&
	    ursa_invalidate(tqp->pd, wc->qp_num, r->imm)) {
		wc->status = IBV_WC_REM_INV_REQ_ERR;
		resp->ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
		resp->why = URSA_WHY_INVALIDATE;
		return -1;
	}
	if (r->has_imm) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		wc->imm_data = r->imm;
	} else if (r->invalidate) {
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = r->imm;
	}
	atomic_fetch_add(&tqp->cnt.recvs, 1);
	atomic_fetch_add(&tqp->cnt.rx_bytes, r->msg_len);
	recv_complete(tqp, tqp->rcq, wc, r->solicited);
	resp->ack = URSA_ACK;
	return 0;
}

static void do_recv(struct ursa_qp *tqp, const struct ursa_req *r,
		    struct ursa_resp *resp, bool write_imm,
		    struct ursa_rstate *rs)
{
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;
	bool first = r->frag & URSA_FRAG_FIRST, last = r->frag & URSA_FRAG_LAST;
	struct ursa_rstate local, *st = rs ? rs : &local;
	struct ibv_wc wc = { 0 };
	uint64_t grh = tqp->ex.qp_base.qp_type == IBV_QPT_UD ? URSA_GRH_LEN : 0;
	uint64_t need = (write_imm ? 0 : r->msg_len) + grh;
	int64_t room;
	int e;

	local.active = false;
	if (!rs && !(first && last)) {
		resp->ack = URSA_DROPPED;
		resp->why = URSA_WHY_OPCODE;
		return;
	}
	if (first) {
		e = recv_start(tqp, r, resp, write_imm, st, need, &wc);
		if (e > 0)
			return;
		if (e < 0)
			goto fail;
	} else if (!st->active) {
		/* a middle or last fragment with no first: out of sequence */
		resp->ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
		resp->why = URSA_WHY_OPCODE;
		return;
	} else if (!write_imm) {
		room = map_recv(tqp, &st->w, st->sg, st->refs, &st->nsg, false);
		if (room < 0) {	/* deregistered since the first fragment */
			st->active = false;
			wc.wr_id = st->w.wr_id;
			wc.status = IBV_WC_LOC_PROT_ERR;
			resp->ack = rc ? URSA_NAK_OP_ERR : URSA_DROPPED;
			resp->why = (uint32_t)-room;
			goto fail;
		}
	}
	if (!write_imm && r->len && recv_place(tqp, r, resp, st, grh, &wc))
		goto fail;
	put_refs(st->refs, st->w.num_sge);
	if (!last) {
		resp->ack = URSA_ACK;
		return;
	}
	if (!recv_done(tqp, r, resp, write_imm, st, need, grh, &wc))
		return;
fail:
	recv_fail(tqp, r, resp, &wc);
}

static unsigned int need_for(uint32_t op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_ACCESS_REMOTE_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_ACCESS_REMOTE_READ;
	default:
		return IBV_ACCESS_REMOTE_ATOMIC;
	}
}

static void nak(struct ursa_qp *tqp, struct ursa_resp *resp, enum ursa_ack a,
		uint32_t why)
{
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;

	atomic_fetch_add(&tqp->cnt.errors, 1);
	resp->why = why;
	if (!rc) {
		resp->ack = URSA_DROPPED;
		return;
	}
	resp->ack = a;
	resp_fatal(tqp, a == URSA_NAK_ACCESS ? IBV_EVENT_QP_ACCESS_ERR :
					       IBV_EVENT_QP_REQ_ERR);
	ursa_dbg("qp %u: responder refused: %s", tqp->ex.qp_base.qp_num,
		 ursa_why_str(why));
}

/* An atomic on the MR's word at p, its old value into *orig; -EFAULT when
 * the memory is no longer mapped (util/fault.h). */
static int atomic_at(uint64_t *p, const struct ursa_req *r, uint64_t *orig)
{
	struct ursa_fault g;
	uint64_t expect = r->compare_add;

	ursa_fault_push(&g);
	if (sigsetjmp(g.env, 0))
		return -EFAULT;
	if (r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
		expect = __atomic_fetch_add(p, r->compare_add, __ATOMIC_SEQ_CST);
	else
		__atomic_compare_exchange_n(p, &expect, r->swap, false,
					    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	ursa_fault_pop(&g);
	*orig = expect;
	return 0;
}

/* The checks of an RDMA request before its memory is touched: responder
 * resources, the QP's access flags, an atomic's alignment, the rkey
 * (C9-88: a zero-length RDMA operation does not check it). Returns
 * whether it passed (ref: the target memory), else resp is the NAK. */
static bool rdma_ok(struct ursa_qp *tqp, const struct ursa_req *r,
		    uint64_t len, struct ursa_mem_ref *ref,
		    struct ursa_resp *resp)
{
	unsigned int need = need_for(r->opcode);
	bool atomic = r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		      r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	int e;

	/* IBTA 9.7.5.1.1: READ and atomics need responder resources */
	if (tqp->ex.qp_base.qp_type == IBV_QPT_RC &&
	    (r->opcode == IBV_WR_RDMA_READ || atomic) &&
	    !tqp->attr.max_dest_rd_atomic) {
		nak(tqp, resp, URSA_NAK_INV_REQ, URSA_WHY_RD_ATOMIC);
		return false;
	}
	if (!(tqp->attr.qp_access_flags & need)) {
		nak(tqp, resp, URSA_NAK_ACCESS,
		    URSA_WHY_QP_ACCESS);
		return false;
	}
	if (atomic && (r->remote_addr & 7)) {
		nak(tqp, resp, URSA_NAK_INV_REQ, URSA_WHY_ALIGN);
		return false;
	}
	if (len) {
		e = ursa_mem_remote(tqp->pd, tqp->ex.qp_base.qp_num, r->rkey,
				    r->remote_addr, len, need, ref);
		if (e) {
			nak(tqp, resp, URSA_NAK_ACCESS, (uint32_t)-e);
			return false;
		}
	}
	return true;
}

/* A WRITE with immediate's last fragment needs a receive WQE before its
 * data is placed, or the RNR retry would write twice (harmless) but also
 * complete a WRITE whose immediate never arrived. Returns whether one
 * waits, else resp is the RNR NAK (RC) or the drop. */
static bool imm_recv_ready(struct ursa_qp *tqp, struct ursa_resp *resp)
{
	pthread_mutex_t *lk = recv_lock(tqp);
	struct ursa_rq *rq = tqp->srq ? &tqp->srq->rq : &tqp->rq;
	bool have;

	pthread_mutex_lock(lk);
	have = ursa_ring_ready(&rq->ring) > 0;
	pthread_mutex_unlock(lk);
	if (have)
		return true;
	if (tqp->ex.qp_base.qp_type == IBV_QPT_RC) {
		atomic_fetch_add(&tqp->cnt.rnr_naks, 1);
		resp->ack = URSA_NAK_RNR;
		resp->rnr_timer = tqp->attr.min_rnr_timer;
	} else {
		resp->ack = URSA_DROPPED;
	}
	resp->why = URSA_WHY_NO_RECV;
	return false;
}

/* The data of a checked RDMA request moves (one copy) or the atomic
 * runs; returns 0, -EFAULT (the MR's memory is gone) or another error of
 * the requester's side. */
static int rdma_move(struct ursa_qp *tqp, const struct ursa_req *r,
		     uint64_t len, const struct ursa_mem_ref *ref,
		     struct ursa_resp *resp)
{
	int err = 0;

	switch (r->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		if (len) {
			struct ursa_sg d = { ref->va, len };

			err = ursa_xfer(&d, 1, false, r->src, r->nsrc,
					r->src_remote, r->peer, 0, len);
		}
		/* once per message: a RoCEv2 packet, or a slot's fragment,
		 * is a request of its own */
		if (r->offset + len >= r->msg_len)
			atomic_fetch_add(&tqp->cnt.writes, 1);
		atomic_fetch_add(&tqp->cnt.rx_bytes, len);
		break;
	case IBV_WR_RDMA_READ:
		if (len) {
			struct ursa_sg s = { ref->va, len };

			err = ursa_xfer(r->dst, r->ndst, r->dst_remote, &s, 1,
					false, r->peer, 0, len);
		}
		atomic_fetch_add(&tqp->cnt.reads, 1);
		break;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		err = atomic_at((uint64_t *)ref->va, r, &resp->atomic_orig);
		if (!err)
			atomic_fetch_add(&tqp->cnt.atomics, 1);
		break;
	}
	return err;
}

static void do_rdma(struct ursa_qp *tqp, const struct ursa_req *r,
		    struct ursa_resp *resp)
{
	bool atomic = r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		      r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	bool imm = r->opcode == IBV_WR_RDMA_WRITE_WITH_IMM &&
		   (r->frag & URSA_FRAG_LAST);
	uint64_t len = atomic ? 8 : r->len;
	struct ursa_mem_ref ref = { 0 };
	int err;

	if (!rdma_ok(tqp, r, len, &ref, resp))
		return;
	if (imm && !imm_recv_ready(tqp, resp)) {
		ursa_mem_put(&ref);
		return;
	}
	err = rdma_move(tqp, r, len, &ref, resp);
	ursa_mem_put(&ref);
	if (err == -EFAULT) {
		/* the MR's memory was unmapped behind its registration */
		nak(tqp, resp, URSA_NAK_ACCESS, URSA_WHY_UNMAPPED);
		return;
	}
	if (err) {
		/* The requester's side of the copy failed (it died, or the
		 * kernel refused cross-memory attach mid-way). */
		nak(tqp, resp, URSA_NAK_OP_ERR, URSA_WHY_PEER_MEM);
		return;
	}
	resp->ack = URSA_ACK;
	if (imm) {
		struct ursa_req ir = *r;

		ir.frag = URSA_FRAG_ONLY;
		ir.msg_len = r->offset + r->len;
		do_recv(tqp, &ir, resp, true, NULL);
	}
}

void ursa_resp_execute(struct ursa_qp *tqp, const struct ursa_req *r,
		       struct ursa_resp *resp, struct ursa_rstate *rs)
{
	enum ibv_qp_type t = tqp->ex.qp_base.qp_type;

	memset(resp, 0, sizeof(*resp));
	/* Packets for a QP that cannot receive, or of another transport,
	 * are dropped (IBTA 9.6.1.5.1, C9-44). */
	if (!can_receive(qp_state(tqp)) || t != r->type) {
		resp->ack = URSA_DROPPED;
		resp->why = URSA_WHY_NOT_READY;
		return;
	}
	/* A connected QP takes requests from its peer only, as a RoCE NIC
	 * drops packets whose source does not match the QP's address vector
	 * (rxe's check_addr). The transports vouch for src_qpn: the shm
	 * transport by the kernel's credentials of the QP's listener, the
	 * RoCEv2 path by the packet's source address. */
	if (t != IBV_QPT_UD &&
	    (r->src_qpn & 0xffffff) != (tqp->attr.dest_qp_num & 0xffffff)) {
		resp->ack = URSA_DROPPED;
		resp->why = URSA_WHY_NOT_PEER;
		atomic_fetch_add(&tqp->cnt.not_peer, 1);
		return;
	}
	if (t == IBV_QPT_UD) {
		uint32_t mtu = (uint32_t)ursa_mtu_bytes(
			ursa_device_get()->active_mtu);

		if (r->qkey != tqp->attr.qkey) {
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_QKEY;
			atomic_fetch_add(&tqp->cnt.errors, 1);
			return;
		}
		if (r->msg_len > mtu) {
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_UD_MTU;
			return;
		}
	}
	switch (r->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		do_recv(tqp, r, resp, false, rs);
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		if (t == IBV_QPT_UD ||
		    (t == IBV_QPT_UC && (r->opcode == IBV_WR_RDMA_READ ||
					 r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
					 r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD))) {
			nak(tqp, resp, URSA_NAK_INV_REQ,
			    URSA_WHY_UNSUPPORTED);
			return;
		}
		do_rdma(tqp, r, resp);
		break;
	default:
		nak(tqp, resp, URSA_NAK_INV_REQ, URSA_WHY_OPCODE);
	}
}
