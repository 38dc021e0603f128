// SPDX-License-Identifier: MIT
/*
 * req.c - the requester and completer: runs a QP's send queue in order.
 *
 * For each WQE at the head of the send queue: local operations (bind,
 * local invalidate) run here; everything else has its local SGEs checked
 * (lkey, PD, bounds, local write for READ and atomic results), is turned
 * into a transport-neutral request and handed to the target's responder.
 * The answer decides what happens to the WQE (IBTA 9.7.5.2, 9.9.3):
 *   ACK          -> success completion (if signaled)
 *   RNR NAK      -> retry after the responder's RNR timer, rnr_retry times
 *                   (7 = forever), then IBV_WC_RNR_RETRY_EXC_ERR
 *   no answer    -> retry after the local ACK timeout, retry_cnt times,
 *                   then IBV_WC_RETRY_EXC_ERR (RC only; UC/UD never know)
 *   NAK          -> REM_ACCESS_ERR / REM_INV_REQ_ERR / REM_OP_ERR
 * An error completion moves an RC QP to ERR, a UC/UD QP to SQE, and every
 * WQE behind it is flushed with IBV_WC_WR_FLUSH_ERR.
 *
 * Execution is in order and one WQE at a time, so fences (IBV_SEND_FENCE)
 * and the ordering of READ/atomic results against later WQEs hold by
 * construction.
 */
#include "engine.h"
#include "../transport/shm.h"
#include "../transport/udp.h"
#include "../util/fault.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#define BATCH 32

/* Build an iovec list covering [skip, skip + len) of an sg list. */
static int sg_iov(const struct ursa_sg *sg, uint32_t n, uint64_t skip,
		  uint64_t len, struct iovec *iov, int max)
{
	int k = 0;

	for (uint32_t i = 0; i < n && len; i++) {
		uint64_t l = sg[i].len;

		if (skip >= l) {
			skip -= l;
			continue;
		}
		if (k == max)
			return -EINVAL;
		iov[k].iov_base = (void *)(sg[i].va + skip);
		iov[k].iov_len = (size_t)MIN(l - skip, len);
		len -= iov[k].iov_len;
		skip = 0;
		k++;
	}
	return len ? -EINVAL : k;
}

static int cma(pid_t peer, bool write, const struct iovec *l, int nl,
	       const struct iovec *r, int nr, uint64_t len)
{
	ssize_t n = write ? process_vm_writev(peer, l, (unsigned long)nl, r,
					      (unsigned long)nr, 0) :
			    process_vm_readv(peer, l, (unsigned long)nl, r,
					     (unsigned long)nr, 0);

	return n >= 0 && (uint64_t)n == len ? 0 : -EIO;
}

/* A copy between two lists of this process's memory, under a fault guard
 * (util/fault.h): the responder's side is an MR the application may have
 * unmapped, and a peer must not be able to crash it through that. */
static int guarded_copy(const struct ursa_sg *d, uint32_t nd,
			const struct ursa_sg *src, uint32_t nsrc, uint64_t len)
{
	struct ursa_fault g;

	ursa_fault_push(&g);
	if (sigsetjmp(g.env, 0))
		return -EFAULT;
	if (nd == 1 && nsrc == 1 && len <= d[0].len && len <= src[0].len)
		/* one piece each (a RoCEv2 packet's payload into its MR):
		 * what ursa_sg_copy would do, without the walk */
		ursa_copy_ordered((uint8_t *)(uintptr_t)d[0].va,
				  (const uint8_t *)(uintptr_t)src[0].va, len);
	else
		ursa_sg_copy(d, nd, src, nsrc, len);
	ursa_fault_pop(&g);
	return 0;
}

static int local_copy(const struct ursa_sg *dst, uint32_t ndst,
		      const struct ursa_sg *src, uint32_t nsrc, uint64_t skip,
		      uint64_t len)
{
	struct ursa_sg d[URSA_MAX_SGE + 1];
	uint32_t k = 0;

	/* drop the skipped prefix of dst */
	for (uint32_t i = 0; i < ndst && k < ARRAY_SIZE(d); i++) {
		if (skip >= dst[i].len) {
			skip -= dst[i].len;
			continue;
		}
		d[k].va = dst[i].va + skip;
		d[k].len = dst[i].len - skip;
		skip = 0;
		k++;
	}
	return guarded_copy(d, k, src, nsrc, len);
}

int ursa_xfer(const struct ursa_sg *dst, uint32_t ndst, bool dst_remote,
	      const struct ursa_sg *src, uint32_t nsrc, bool src_remote,
	      pid_t peer, uint64_t skip, uint64_t len)
{
	struct iovec di[URSA_MAX_SGE + 2], si[URSA_MAX_SGE + 2];
	int nd, ns, ret;

	if (!len)
		return 0;
	if (!dst_remote && !src_remote)
		return local_copy(dst, ndst, src, nsrc, skip, len);
	if (dst_remote && src_remote)
		return -EINVAL;
	if (src_remote) {
		/* Pull from the peer straight into our memory; the final
		 * byte is fetched separately and stored last (release), as
		 * ursa_sg_copy does for local copies. */
		uint8_t last;
		struct iovec li = { &last, 1 }, ri;
		struct iovec dl;

		nd = sg_iov(dst, ndst, skip, len, di, ARRAY_SIZE(di));
		ns = sg_iov(src, nsrc, 0, len, si, ARRAY_SIZE(si));
		if (nd < 0 || ns < 0)
			return -EINVAL;
		dl = di[nd - 1];
		ri = si[ns - 1];
		ri.iov_base = (char *)ri.iov_base + ri.iov_len - 1;
		ri.iov_len = 1;
		/* shorten both lists by the final byte */
		if (--di[nd - 1].iov_len == 0)
			nd--;
		if (--si[ns - 1].iov_len == 0)
			ns--;
		if (len > 1) {
			ret = cma(peer, false, di, nd, si, ns, len - 1);
			if (ret)
				return ret;
		}
		ret = cma(peer, false, &li, 1, &ri, 1, 1);
		if (ret)
			return ret;
		__atomic_store_n((uint8_t *)dl.iov_base + dl.iov_len - 1, last,
				 __ATOMIC_RELEASE);
		return 0;
	}
	/* Push our memory into the peer's (READ responses). */
	nd = sg_iov(dst, ndst, skip, len, di, ARRAY_SIZE(di));
	ns = sg_iov(src, nsrc, 0, len, si, ARRAY_SIZE(si));
	if (nd < 0 || ns < 0)
		return -EINVAL;
	return cma(peer, true, si, ns, di, nd, len);
}

static enum ibv_wc_opcode wc_opcode(uint32_t op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
	case IBV_WR_BIND_MW: return IBV_WC_BIND_MW;
	case IBV_WR_LOCAL_INV: return IBV_WC_LOCAL_INV;
	default: return IBV_WC_SEND;
	}
}

static uint64_t wqe_len(const struct ursa_send_wqe *w)
{
	uint64_t n = 0;

	if (w->flags & IBV_SEND_INLINE)
		return w->inline_len;
	for (uint32_t i = 0; i < w->num_sge; i++)
		n += w->sge[i].length;
	return n;
}

/* A send completion (IBTA 11.4.2.1); a CQ overrun moves the QP to ERR. */
static void push_wc(struct ursa_qp *qp, uint64_t wr_id, uint32_t opcode,
		    uint64_t len, enum ibv_wc_status st, uint32_t why)
{
	struct ibv_wc wc = { 0 };

	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = wc_opcode(opcode);
	wc.qp_num = qp->ex.qp_base.qp_num;
	wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : why;
	if (opcode == IBV_WR_RDMA_READ)
		wc.byte_len = (uint32_t)len;
	else if (opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		 opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
		wc.byte_len = 8;
	if (ursa_cq_push(qp->scq, &wc, true) == -ENOSPC) {
		ursa_qp_to_error(qp, false);
		ursa_async_event(qp->ctx, IBV_EVENT_QP_FATAL,
				 &qp->ex.qp_base);
	}
}

/* Retire the head WQE: free its slot first, then post its completion, so
 * an application that reposts as soon as it sees the completion always
 * finds the slot free (rc_pingpong runs with a one-entry send queue). */
static void complete(struct ursa_qp *qp, const struct ursa_send_wqe *w,
		     enum ibv_wc_status st, uint32_t why)
{
	bool signaled = st != IBV_WC_SUCCESS || (w->flags & IBV_SEND_SIGNALED) ||
			qp->sq_sig_all;
	/* Read before the slot is freed: a poster may refill it at once. */
	uint64_t wr_id = w->wr_id, len = wqe_len(w);
	uint32_t opcode = w->opcode;

	if (w->via_udp)
		ursa_rc_abort(qp, w);	/* whatever state the message left */
	ursa_ring_consume(&qp->sq, 1);
	if (signaled)
		push_wc(qp, wr_id, opcode, len, st, why);
}

/* Outcome of one attempt at a WQE. */
struct attempt {
	int done;		/* 1: complete with status; 0: retry at time */
	enum ibv_wc_status st;
	uint32_t why;		/* enum ursa_why, into wc.vendor_err */
	uint64_t retry_at;
};

static void local_op(struct ursa_qp *qp, struct ursa_send_wqe *w,
		     struct attempt *a)
{
	a->done = 1;
	if (w->opcode == IBV_WR_BIND_MW) {
		a->st = ursa_mw_bind(qp, w->mw, w->mw_new_rkey, &w->bind);
		a->why = URSA_WHY_BIND;
	} else { /* LOCAL_INV */
		a->st = ursa_invalidate(qp->pd, qp->ex.qp_base.qp_num, w->imm) ?
				IBV_WC_LOC_QP_OP_ERR : IBV_WC_SUCCESS;
		a->why = URSA_WHY_LOCAL_INV;
	}
}

/* Map local SGEs; need is IBV_ACCESS_LOCAL_WRITE when data lands there.
 * The requester runs under ctx->qp_lock, so the QP's cached MR serves
 * (ursa_mem_local_cached): no key table lookup and no reference for the
 * common single-MR queue. */
static int map_local(struct ursa_qp *qp, struct ursa_send_wqe *w,
		     unsigned int need, struct ursa_sg *sg,
		     struct ursa_mem_ref *refs, uint32_t *nsg)
{
	uint32_t n = 0;

	if (w->flags & IBV_SEND_INLINE) {
		sg[0].va = (uintptr_t)w->inline_data;
		sg[0].len = w->inline_len;
		refs[0].k = NULL;
		*nsg = 1;
		return 0;
	}
	for (uint32_t i = 0; i < w->num_sge; i++) {
		int e;

		refs[i].k = NULL;
		if (!w->sge[i].length)
			continue;
		e = ursa_mem_local_cached(qp, &qp->lcache, &w->sge[i], need,
					  &refs[i]);
		if (e) {
			ursa_dbg("qp %u wr_id %llu: local SGE %u refused: %s",
				 qp->ex.qp_base.qp_num,
				 (unsigned long long)w->wr_id, i,
				 ursa_why_str((uint32_t)-e));
			for (uint32_t j = 0; j < i; j++)
				ursa_mem_put(&refs[j]);
			return e;
		}
		sg[n].va = refs[i].va;
		sg[n].len = w->sge[i].length;
		n++;
	}
	*nsg = n;
	return 0;
}

static void put_local(const struct ursa_send_wqe *w, struct ursa_mem_ref *refs)
{
	for (uint32_t i = 0; i < (w->flags & IBV_SEND_INLINE ? 0 : w->num_sge); i++)
		ursa_mem_put(&refs[i]);
}

/* The length checks a WQE must pass before it leaves (LOC_LEN_ERR):
 * message size, UD's one MTU, an atomic's 8 bytes. */
static bool local_ok(const struct ursa_qp *qp, const struct ursa_send_wqe *w,
		     uint64_t len, struct attempt *a)
{
	bool ud = qp->ex.qp_base.qp_type == IBV_QPT_UD;
	bool at = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

	if (len > URSA_MAX_MSG_SZ) {
		a->st = IBV_WC_LOC_LEN_ERR;
		a->why = URSA_WHY_MSG_LEN;
		return false;
	}
	if (ud && len > (uint64_t)ursa_mtu_bytes(ursa_device_get()->active_mtu)) {
		a->st = IBV_WC_LOC_LEN_ERR;
		a->why = URSA_WHY_UD_MTU;
		return false;
	}
	if (at && w->num_sge && len != 8) {
		a->st = IBV_WC_LOC_LEN_ERR;
		a->why = URSA_WHY_ATOMIC_LEN;
		return false;
	}
	return true;
}

/* The transport-neutral request of WQE w, its local SGEs translated
 * (sg, nsg), addressed by av. */
static void build_req(const struct ursa_qp *qp, const struct ursa_send_wqe *w,
		      const struct ibv_ah_attr *av, const struct ursa_sg *sg,
		      uint32_t nsg, uint64_t len, struct ursa_req *r)
{
	struct ursa_device *dev = ursa_device_get();
	bool rd = w->opcode == IBV_WR_RDMA_READ;
	bool at = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

	r->opcode = w->opcode;
	r->frag = URSA_FRAG_ONLY;
	r->msg_len = at ? 8 : len;
	r->type = qp->ex.qp_base.qp_type;
	r->src_qpn = qp->ex.qp_base.qp_num;
	r->remote_addr = w->remote_addr;
	r->rkey = w->rkey;
	r->len = at ? 8 : len;
	r->compare_add = w->compare_add;
	r->swap = w->swap;
	r->imm = w->imm;
	r->has_imm = w->opcode == IBV_WR_SEND_WITH_IMM ||
		     w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	r->invalidate = w->opcode == IBV_WR_SEND_WITH_INV;
	r->solicited = w->flags & IBV_SEND_SOLICITED;
	if (rd) {
		r->dst = sg;
		r->ndst = nsg;
	} else if (!at) {
		r->src = sg;
		r->nsrc = nsg;
	}
	if (av->grh.sgid_index < dev->ngids)
		r->sgid = dev->gids[av->grh.sgid_index].gid;
	r->dgid = av->grh.dgid;
	r->traffic_class = av->grh.traffic_class;
	r->hop_limit = av->grh.hop_limit;
	r->flow_label = av->grh.flow_label;
	if (r->type == IBV_QPT_UD) {
		/* IBTA 10.2.5: a WR Q_Key with the high bit set means "use
		 * the QP's own Q_Key". */
		r->qkey = (w->remote_qkey & 0x80000000u) ? qp->attr.qkey :
							    w->remote_qkey;
	}
}

/* An atomic's original value into the local SGE (host byte order, as the
 * verbs API defines it). */
static void atomic_result(struct ursa_qp *qp, const struct ursa_send_wqe *w,
			  uint64_t orig, struct attempt *a)
{
	struct ursa_mem_ref ref;

	if (!ursa_mem_local_cached(qp, &qp->lcache, &w->sge[0],
				   IBV_ACCESS_LOCAL_WRITE, &ref)) {
		memcpy((void *)ref.va, &orig, 8);
		ursa_mem_put(&ref);
	} else {
		a->st = IBV_WC_LOC_PROT_ERR;
		a->why = URSA_WHY_KEY;
	}
}

/* answer's ACK: success, an atomic's result, the counters. */
static void acked(struct ursa_qp *qp, const struct ursa_send_wqe *w,
		  const struct ursa_req *r, const struct ursa_resp *resp,
		  uint32_t nsg, uint64_t len, struct attempt *a)
{
	bool rd = w->opcode == IBV_WR_RDMA_READ;
	bool at = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

	a->st = IBV_WC_SUCCESS;
	if (at && nsg)
		atomic_result(qp, w, resp->atomic_orig, a);
	if (!rd && !at)
		atomic_fetch_add(&qp->cnt.tx_bytes, len);
	if (w->opcode == IBV_WR_SEND || r->has_imm || r->invalidate)
		atomic_fetch_add(&qp->cnt.sends, 1);
}

/* The responder's answer, whichever transport carried it, as the WQE's
 * completion or its retry (IBTA 9.7.5.2.8 RNR, 9.7.6.1.3 ACK timeout):
 * the table of docs/design.md "Requester and responder". */
static void answer(struct ursa_qp *qp, struct ursa_send_wqe *w,
		   const struct ursa_req *r, const struct ursa_resp *resp,
		   uint32_t nsg, uint64_t len, uint64_t *now,
		   struct attempt *a)
{
	switch (resp->ack) {
	case URSA_ACK:
		acked(qp, w, r, resp, nsg, len, a);
		return;
	case URSA_NAK_RNR:
		if (!ursa_rnr_retry_take(qp, w)) {
			a->st = IBV_WC_RNR_RETRY_EXC_ERR;
			a->why = URSA_WHY_REMOTE | resp->why;
			return;
		}
		a->done = 0;
		a->retry_at = ursa_need_now(now) + ursa_rnr_timer_ns(resp->rnr_timer);
		return;
	case URSA_NAK_INV_REQ:
		a->st = IBV_WC_REM_INV_REQ_ERR;
		a->why = URSA_WHY_REMOTE | resp->why;
		break;
	case URSA_NAK_ACCESS:
		a->st = IBV_WC_REM_ACCESS_ERR;
		a->why = URSA_WHY_REMOTE | resp->why;
		break;
	case URSA_NAK_OP_ERR:
		a->st = IBV_WC_REM_OP_ERR;
		a->why = URSA_WHY_REMOTE | resp->why;
		break;
	case URSA_DROPPED:
		if (qp->ex.qp_base.qp_type != IBV_QPT_RC) {
			/* UC and UD: the requester never learns. */
			a->st = IBV_WC_SUCCESS;
			return;
		}
		if (resp->final || !ursa_retry_take(qp, w)) {
			a->st = IBV_WC_RETRY_EXC_ERR;
			a->why = URSA_WHY_REMOTE | resp->why;
			break;
		}
		a->done = 0;
		a->retry_at = ursa_ack_timeout_ns(qp->attr.timeout);
		a->retry_at = a->retry_at == UINT64_MAX ? UINT64_MAX :
							  ursa_need_now(now) + a->retry_at;
		return;
	}
	ursa_dbg("qp %u wr_id %llu: %s (%s)", qp->ex.qp_base.qp_num,
		 (unsigned long long)w->wr_id, ibv_wc_status_str(a->st),
		 ursa_why_str(a->why));
}

/* WQE w to a QP elsewhere (or in this process, through the same rules):
 * checked, translated, routed to a transport, and its answer taken. */
static void remote_op(struct ursa_qp *qp, struct ursa_send_wqe *w,
		      uint64_t *now, struct attempt *a)
{
	bool ud = qp->ex.qp_base.qp_type == IBV_QPT_UD;
	bool rd = w->opcode == IBV_WR_RDMA_READ;
	bool at = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	struct ursa_mem_ref refs[URSA_MAX_SGE];
	struct ursa_sg sg[URSA_MAX_SGE];
	const struct ibv_ah_attr *av = ud ? &w->av : &qp->attr.ah_attr;
	struct ursa_req r = { 0 };
	struct ursa_resp resp;
	enum ursa_route route;
	struct ursa_qp *t;
	uint32_t nsg = 0;
	uint64_t len = wqe_len(w), until = UINT64_MAX;
	int e;

	a->done = 1;
	if (!local_ok(qp, w, len, a))
		return;
	e = map_local(qp, w, (rd || at) ? IBV_ACCESS_LOCAL_WRITE : 0, sg, refs,
		      &nsg);
	if (e) {
		a->st = IBV_WC_LOC_PROT_ERR;
		a->why = (uint32_t)-e;
		return;
	}
	build_req(qp, w, av, sg, nsg, len, &r);
	route = ursa_loop_route(qp, &av->grh.dgid,
				ud ? w->remote_qpn : qp->attr.dest_qp_num, !ud, &t);
	if (route == URSA_ROUTE_LOOP) {
		/* Same process: the responder runs right here. */
		ursa_resp_execute(t, &r, &resp, NULL);
		ursa_loop_put(t);
		if (resp.ack == URSA_ACK && !at)
			atomic_fetch_add(&qp->cnt.loop_bytes, len);
	} else if (route == URSA_ROUTE_SHM) {
		/* Another process on this host. */
		if (!ursa_shm_direct(qp, w, &r, &resp) &&
		    !ursa_shm_step(qp, w, &r, ursa_need_now(now), &resp, &until))
			goto wait;
	} else {
		/* Another host: RoCEv2 over UDP. */
		w->via_udp = true;
		if (!ursa_rc_step(qp, w, &r, ursa_need_now(now), &resp, &until))
			goto wait;
	}
	put_local(w, refs);
	answer(qp, w, &r, &resp, nsg, len, now, a);
	return;
wait:
	/* in flight: the transport's next step decides */
	put_local(w, refs);
	a->done = 0;
	a->retry_at = until;
}

/*
 * Pipelining on the RoCEv2 engine (rc_qp.c): the WQEs behind the head may
 * go out before its ACK. visit: run the one being sent (more packets) and
 * each that may start, until one may not. !visit: only tell whether one
 * may start.
 */
static bool pipe_walk(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline,
		      bool visit)
{
	uint32_t n = ursa_ring_ready(&qp->sq);
	uint32_t head = atomic_load_explicit(&qp->sq.head, memory_order_relaxed);

	/* (the pipe holds the first WQEs of the queue: start behind it) */
	for (uint32_t k = MAX(1u, ursa_rc_piped(qp)); k < n; k++) {
		struct ursa_send_wqe *w = ursa_ring_slot(&qp->sq, head + k);
		int in = ursa_rc_inflight(qp, w);
		struct attempt a = { 0 };

		if (in == 1)
			continue;	/* sent whole: waits for its ACK */
		if (!in && (w->refused || !ursa_rc_can_start(qp, w)))
			return false;
		if (!visit) {
			if (in)
				continue;
			return true;
		}
		if (!w->started) {
			w->started = true;
			ursa_retry_start(qp, w);
		}
		remote_op(qp, w, now, &a);
		/* Refused before it left (a local error): it completes as
		 * the head, in order; until then it holds the rest back. */
		if (a.done) {
			w->refused = true;
			return false;
		}
		w->not_before_ns = a.retry_at;
		if (a.retry_at < *deadline)
			*deadline = a.retry_at;
	}
	return false;
}

/* A started WQE waits for a timer or, on the same-host transport, for an
 * answer or the channel. */
static bool wqe_due(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now)
{
	if (w->via_udp && w->inflight)
		return ursa_rc_ready(qp, w, now) ||
		       pipe_walk(qp, NULL, NULL, false);
	if (w->inflight || w->shm.connecting)
		return ursa_shm_ready(qp, w, now);
	return w->not_before_ns <= now;
}

bool ursa_req_pending(struct ursa_qp *qp, uint64_t now, uint64_t *deadline)
{
	int st = qp_state(qp);
	struct ursa_send_wqe *w;
	uint64_t d;

	if (!ursa_ring_ready(&qp->sq))
		return false;
	if (st == IBV_QPS_ERR || st == IBV_QPS_SQE)
		return true;
	if (st != IBV_QPS_RTS)
		return false;
	w = ursa_ring_peek(&qp->sq);
	if (!w->started || wqe_due(qp, w, now))
		return true;
	d = w->inflight ? w->deadline_ns : w->not_before_ns;
	if (d < *deadline)
		*deadline = d;
	return false;
}

/* ursa_req_direct's first step: ask for the target's cache line. */
static void direct_prefetch(struct ursa_qp *qp, const struct ibv_send_wr *wr,
			    bool rd, bool at)
{
	/* The target's line, asked for now, arrives while the checks
	 * run instead of after them: about the time of one cache-line
	 * transfer off each same-host WRITE (docs/performance.md). (Before
	 * the WR is checked: a wrong guess is a wasted prefetch. The union
	 * is read only for the opcodes that fill it.) */
	if ((rd || at || wr->opcode == IBV_WR_RDMA_WRITE) &&
	    (at ? wr->wr.atomic.rkey : wr->wr.rdma.rkey) ==
	    atomic_load_explicit(&qp->dhint_rkey, memory_order_relaxed)) {
		/* (remote_addr: the first field of both union members) */
		const void *t = (const void *)(uintptr_t)(wr->wr.rdma.remote_addr +
			atomic_load_explicit(&qp->dhint_delta, memory_order_relaxed));

		if (rd)
			__builtin_prefetch(t, 0, 3);
		else
			ursa_prefetch_write(t);
	}
}

/* ursa_req_direct: whether the WR is one the shortcut takes, judged
 * without a lock; *len, its message length. */
static bool direct_fits(struct ursa_qp *qp, const struct ibv_send_wr *wr,
			bool rd, bool at, bool inl, uint64_t *len)
{
	uint64_t n = 0;
	uint32_t ns;

	if (qp->ex_api || !qp->chans || wr->num_sge < 0 ||
	    (uint32_t)wr->num_sge > qp->cap.max_send_sge)
		return false;
	ns = (uint32_t)wr->num_sge;
	if (qp->ex.qp_base.qp_type == IBV_QPT_UC ?
	    wr->opcode != IBV_WR_RDMA_WRITE :
	    qp->ex.qp_base.qp_type != IBV_QPT_RC ||
	    (!rd && !at && wr->opcode != IBV_WR_RDMA_WRITE))
		return false;
	if (inl && (rd || at))
		return false;
	if (at && (ns != 1 || wr->sg_list[0].length != 8))
		return false;
	for (uint32_t i = 0; i < ns; i++)
		n += wr->sg_list[i].length;
	if (!n || n > URSA_MAX_MSG_SZ ||
	    (inl && n > qp->cap.max_inline_data))
		return false;
	*len = n;
	return true;
}

/* ursa_req_direct, under ctx->qp_lock: the WR's local SGEs as addresses
 * (sg[], *nsg). Returns 0 or the lkey check's error; either way *nref
 * says how many of refs[] to put. */
static int direct_sges(struct ursa_qp *qp, const struct ibv_send_wr *wr,
		       bool local_write, bool inl, struct ursa_mem_ref *refs,
		       struct ursa_sg *sg, uint32_t *nsg, uint32_t *nref)
{
	uint32_t i, n = 0, ns = (uint32_t)wr->num_sge;
	int ret = 0;

	for (i = 0; i < ns; i++) {
		refs[i].k = NULL;
		if (!wr->sg_list[i].length)
			continue;
		if (inl) {
			/* (inline data needs no lkey: it is ours to read) */
			sg[n].va = wr->sg_list[i].addr;
		} else {
			ret = ursa_mem_local_cached(qp, &qp->lcache,
					&wr->sg_list[i],
					local_write ? IBV_ACCESS_LOCAL_WRITE : 0,
					&refs[i]);
			if (ret)
				break;	/* (refs[i] holds nothing) */
			sg[n].va = refs[i].va;
		}
		sg[n++].len = wr->sg_list[i].length;
	}
	*nsg = n;
	*nref = i;
	return ret;
}

/* ursa_req_direct: the one-sided operation the direct path carries out. */
static void direct_dop(const struct ibv_send_wr *wr, bool at,
		       const struct ursa_sg *sg, uint32_t nsg, uint64_t len,
		       struct ursa_dop *op)
{
	op->opcode = wr->opcode;
	op->len = len;
	op->sg = sg;
	op->nsg = nsg;
	if (at) {
		op->remote_addr = wr->wr.atomic.remote_addr;
		op->rkey = wr->wr.atomic.rkey;
		op->compare_add = wr->wr.atomic.compare_add;
		op->swap = wr->wr.atomic.swap;
	} else {
		op->remote_addr = wr->wr.rdma.remote_addr;
		op->rkey = wr->wr.rdma.rkey;
	}
}

/*
 * ibv_post_send's shortcut for what same-host latency hangs on: one RDMA
 * WRITE, READ or atomic on a connected QP whose send queue is empty and
 * whose target, in another process, the direct path (shm.c direct_xfer)
 * can reach. The WR is carried out and completed here, without a WQE in
 * the ring, the engine's bookkeeping or the transport-neutral request of
 * remote_op: the data reaches the target about 100 ns sooner. Holding
 * ctx->qp_lock with the send queue empty, nothing else runs this QP's
 * requester, so the order of execution and completions is the queue's.
 * Returns true when done; false when nothing happened and the WR takes the
 * ordinary way (which also names any error: the shortcut only succeeds).
 * sq_lock is not needed: the shortcut touches no ring slot, and a WR that
 * another thread is still placing in the ring (not yet published, so the
 * queue looks empty) was not posted before this one, its post not having
 * returned.
 */
bool ursa_req_direct(struct ursa_qp *qp, const struct ibv_send_wr *wr)
{
	bool rd = wr->opcode == IBV_WR_RDMA_READ;
	bool at = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	bool inl = wr->send_flags & IBV_SEND_INLINE;
	struct ursa_mem_ref refs[URSA_MAX_SGE];
	struct ursa_sg sg[URSA_MAX_SGE];
	struct ursa_dop op;
	uint32_t nsg, nref = 0;
	uint64_t len, orig;
	bool ok = false;

	direct_prefetch(qp, wr, rd, at);
	if (!direct_fits(qp, wr, rd, at, inl, &len))
		return false;
	if (!ursa_mutex_trylock(&qp->ctx->qp_lock))
		return false;
	if (qp_state(qp) != IBV_QPS_RTS || ursa_ring_ready(&qp->sq))
		goto unlock;
	if (direct_sges(qp, wr, rd || at, inl, refs, sg, &nsg, &nref))
		goto put;
	direct_dop(wr, at, sg, nsg, len, &op);
	if (!ursa_shm_direct_op(qp, &op, &orig))
		goto put;
	ok = true;
	if (at)
		/* host byte order, as the verbs API defines it */
		memcpy((void *)refs[0].va, &orig, 8);
	else if (!rd)
		ursa_cnt_add(&qp->cnt.tx_bytes, len);	/* (under qp_lock) */
	if ((wr->send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all)
		push_wc(qp, wr->wr_id, wr->opcode, len, IBV_WC_SUCCESS, 0);
put:
	for (uint32_t i = 0; i < nref; i++)
		ursa_mem_put(&refs[i]);
unlock:
	ursa_mutex_unlock(&qp->ctx->qp_lock);
	return ok;
}

int ursa_req_process_lazy(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline)
{
	int done = 0;

	while (done < BATCH && ursa_ring_ready(&qp->sq)) {
		struct ursa_send_wqe *w = ursa_ring_peek(&qp->sq);
		int st = qp_state(qp);
		struct attempt a = { 0 };

		if (st == IBV_QPS_ERR || st == IBV_QPS_SQE) {
			complete(qp, w, IBV_WC_WR_FLUSH_ERR, URSA_WHY_FLUSH);
			done++;
			continue;
		}
		if (st != IBV_QPS_RTS)
			break;	/* SQD: hold new work until resumed */
		if (!w->started) {
			w->started = true;
			ursa_retry_start(qp, w);
		} else if (!wqe_due(qp, w, ursa_need_now(now))) {
			uint64_t d = w->inflight ? w->deadline_ns : w->not_before_ns;

			if (d < *deadline)
				*deadline = d;
			break;
		}
		if (w->opcode == IBV_WR_BIND_MW || w->opcode == IBV_WR_LOCAL_INV)
			local_op(qp, w, &a);
		else
			remote_op(qp, w, now, &a);
		if (!a.done) {
			w->not_before_ns = a.retry_at;
			if (a.retry_at < *deadline)
				*deadline = a.retry_at;
			if (w->via_udp) {
				ursa_udp_tx_hold(true);
				pipe_walk(qp, now, deadline, true);
				ursa_udp_tx_hold(false);
			}
			break;
		}
		complete(qp, w, a.st, a.why);
		done++;
		if (a.st != IBV_WC_SUCCESS) {
			atomic_fetch_add(&qp->cnt.errors, 1);
			ursa_qp_to_error(qp, qp->ex.qp_base.qp_type != IBV_QPT_RC);
		}
	}
	return done;
}
