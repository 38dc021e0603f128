// SPDX-License-Identifier: MIT
/*
 * qp.c - queue pairs and shared receive queues: creation, the state machine,
 * posting work requests, flushing.
 *
 * Posting writes a WQE into the send or receive ring in user memory and
 * rings the engine's doorbell only when the engine sleeps (engine.c).
 * post_send validates what libibverbs providers validate at post time
 * (state, opcode for the QP type, SGE count, inline size, UD address) and
 * returns an errno; everything that needs a memory key or the peer is
 * checked when the engine executes the WQE and reported as a completion.
 */
#include "core.h"
#include "pub.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t pow2(uint32_t n)
{
	uint32_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

static const uint64_t ops_rc = IBV_QP_EX_WITH_RDMA_WRITE |
	IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
	IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
	IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
	IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
	IBV_QP_EX_WITH_SEND_WITH_INV;
static const uint64_t ops_uc = IBV_QP_EX_WITH_RDMA_WRITE |
	IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
	IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_LOCAL_INV |
	IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;
static const uint64_t ops_ud = IBV_QP_EX_WITH_SEND |
	IBV_QP_EX_WITH_SEND_WITH_IMM;

static uint64_t ops_for(enum ibv_qp_type t)
{
	return t == IBV_QPT_RC ? ops_rc : t == IBV_QPT_UC ? ops_uc : ops_ud;
}

static uint64_t op_bit(uint32_t op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return IBV_QP_EX_WITH_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	case IBV_WR_SEND: return IBV_QP_EX_WITH_SEND;
	case IBV_WR_SEND_WITH_IMM: return IBV_QP_EX_WITH_SEND_WITH_IMM;
	case IBV_WR_RDMA_READ: return IBV_QP_EX_WITH_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	case IBV_WR_LOCAL_INV: return IBV_QP_EX_WITH_LOCAL_INV;
	case IBV_WR_BIND_MW: return IBV_QP_EX_WITH_BIND_MW;
	case IBV_WR_SEND_WITH_INV: return IBV_QP_EX_WITH_SEND_WITH_INV;
	}
	return 0;
}

/* ibv_create_qp_ex's attributes, checked as providers check them:
 * EOPNOTSUPP for what ursa does not implement, EINVAL for what is wrong. */
static int qp_attr_check(const struct ibv_qp_init_attr_ex *ia)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD |
			       IBV_QP_INIT_ATTR_CREATE_FLAGS |
			       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	const struct ibv_qp_cap *c = &ia->cap;

	if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC &&
	    ia->qp_type != IBV_QPT_UD)
		return -EOPNOTSUPP;
	if (!(ia->comp_mask & IBV_QP_INIT_ATTR_PD) || !ia->pd)
		return -EINVAL;
	if (ia->comp_mask & ~known)
		return -EOPNOTSUPP;
	/* The mask bit is fine (rxe takes it); no creation flag is
	 * implemented (scatter FCS, loopback blocking, ...). */
	if ((ia->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ia->create_flags)
		return -EOPNOTSUPP;
	if (!ia->send_cq || !ia->recv_cq)
		return -EINVAL;
	if (c->max_send_wr > URSA_MAX_QP_WR || c->max_send_sge > URSA_MAX_SGE ||
	    c->max_inline_data > URSA_MAX_INLINE ||
	    (!ia->srq && (c->max_recv_wr > URSA_MAX_QP_WR ||
			  c->max_recv_sge > URSA_MAX_SGE)))
		return -EINVAL;
	if ((ia->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (ia->send_ops_flags & ~ops_for(ia->qp_type)))
		return -EOPNOTSUPP;
	return 0;
}

/* A new QP's fields from its attributes; the granted capabilities are
 * written back as the verbs API requires (perftest and rc_pingpong read
 * them). */
static void qp_fill(struct ursa_qp *qp, struct ursa_ctx *ctx,
		    struct ibv_qp_init_attr_ex *ia)
{
	struct ibv_qp_cap *c = &ia->cap;

	pthread_mutex_init(&qp->state_lock, NULL);
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	pthread_mutex_init(&qp->ex.qp_base.mutex, NULL);
	pthread_cond_init(&qp->ex.qp_base.cond, NULL);
	qp->ctx = ctx;
	qp->pd = to_upd(ia->pd);
	qp->scq = to_ucq(ia->send_cq);
	qp->rcq = to_ucq(ia->recv_cq);
	qp->srq = ia->srq ? to_usrq(ia->srq) : NULL;
	qp->sq_sig_all = ia->sq_sig_all;
	c->max_send_wr = ia->cap.max_send_wr ? qp->sq.size : 0;
	if (!ia->srq)
		c->max_recv_wr = ia->cap.max_recv_wr ? qp->rq.ring.size : 0;
	else
		c->max_recv_wr = c->max_recv_sge = 0;
	c->max_inline_data = URSA_MAX_INLINE;
	qp->cap = *c;
	qp->rq.max_sge = c->max_recv_sge;
	if (ia->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		qp->ex_api = true;
		qp->send_ops_flags = ia->send_ops_flags;
	}
	atomic_init(&qp->state, IBV_QPS_RESET);
	qp->listen_fd = -1;
	qp->ex.qp_base.context = &ctx->vctx.context;
	qp->ex.qp_base.qp_context = ia->qp_context;
	qp->ex.qp_base.pd = ia->pd;
	qp->ex.qp_base.send_cq = ia->send_cq;
	qp->ex.qp_base.recv_cq = ia->recv_cq;
	qp->ex.qp_base.srq = ia->srq;
	qp->ex.qp_base.qp_type = ia->qp_type;
	qp->ex.qp_base.state = IBV_QPS_RESET;
}

int ursa_qp_create(struct ursa_ctx *ctx, struct ibv_qp_init_attr_ex *ia,
		   struct ursa_qp **out)
{
	struct ibv_qp_cap *c = &ia->cap;
	struct ursa_qp *qp;
	int ret;

	ret = qp_attr_check(ia);
	if (ret)
		return ret;
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return -ENOMEM;
	ret = ursa_ring_init(&qp->sq, MAX(c->max_send_wr, 1u),
			     sizeof(struct ursa_send_wqe));
	if (ret)
		goto err;
	if (!ia->srq) {
		ret = ursa_ring_init(&qp->rq.ring, MAX(c->max_recv_wr, 1u),
				     sizeof(struct ursa_recv_wqe));
		if (ret)
			goto err_sq;
	}
	qp_fill(qp, ctx, ia);
	ret = ursa_hooks.qp_add(qp);
	if (ret)
		goto err_rq;
	ret = ursa_hooks.rc_qp_init(qp);
	if (ret) {
		ursa_hooks.qp_del(qp);
		goto err_rq;
	}
	qp->ex.qp_base.handle = qp->ex.qp_base.qp_num;
	atomic_fetch_add(&qp->pd->refs, 1);
	atomic_fetch_add(&qp->scq->refs, 1);
	atomic_fetch_add(&qp->rcq->refs, 1);
	if (qp->srq)
		atomic_fetch_add(&qp->srq->refs, 1);
	ursa_mutex_lock(&ctx->qp_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	qp->in_ctx_list = true;
	ursa_mutex_unlock(&ctx->qp_lock);
	atomic_fetch_add(&ctx->nobjs, 1);
	*out = qp;
	return 0;
err_rq:
	if (!ia->srq)
		ursa_ring_fini(&qp->rq.ring);
err_sq:
	ursa_ring_fini(&qp->sq);
err:
	free(qp);
	return ret;
}

void ursa_qp_lcache_drop(struct ursa_ctx *ctx, struct ursa_mr *mr)
{
	ursa_mutex_lock(&ctx->qp_lock);
	for (struct ursa_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (qp->lcache == mr)
			qp->lcache = NULL;
		if (qp->rcache == mr)
			qp->rcache = NULL;
	}
	ursa_mutex_unlock(&ctx->qp_lock);
}

/* A QP that is reset or destroyed leaves nothing in its CQs, as mlx5 does
 * (mlx5_cq_clean): completions polled afterwards belong to the QP's new
 * life, or to other QPs. */
static void qp_clean_cqs(struct ursa_qp *qp)
{
	uint32_t qpn = qp->ex.qp_base.qp_num;

	ursa_cq_clean(qp->scq, qpn, qp->srq && qp->rcq == qp->scq);
	if (qp->rcq != qp->scq)
		ursa_cq_clean(qp->rcq, qpn, qp->srq != NULL);
}

/*
 * A NIC puts a UD or UC message on the wire within microseconds of its
 * post; nothing answers it, so an application may destroy the QP right
 * after posting (libfabric's rxd sends its last ACKs and closes). Here a
 * send to another process of this host waits in the SQ until that
 * process's engine takes it, and destroying the QP would lose it: the
 * peer then waited for an ACK that never came (fi_pingpong's server, one
 * run in five). The messages posted before the destroy go out first,
 * for at most URSA_DRAIN_MS (a peer that takes nothing does not hold the
 * destroy up).
 */
static void sq_drain(struct ursa_qp *qp)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	uint64_t until;

	if ((t != IBV_QPT_UD && t != IBV_QPT_UC) || !ursa_ring_ready(&qp->sq) ||
	    qp_state(qp) != IBV_QPS_RTS || !qp->ctx->eng)
		return;
	until = ursa_now_ns() + URSA_DRAIN_MS * 1000000ull;
	while (ursa_ring_ready(&qp->sq) && qp_state(qp) == IBV_QPS_RTS &&
	       ursa_now_ns() < until) {
		if (ursa_hooks.progress_qp(qp) < 0)
			ursa_hooks.kick(qp->ctx->eng);
		usleep(50);
	}
}

int ursa_qp_destroy(struct ursa_qp *qp)
{
	struct ursa_ctx *ctx = qp->ctx;

	sq_drain(qp);
	/* No responder can find the QP after this, and none still runs. */
	ursa_hooks.qp_del(qp);
	ursa_mutex_lock(&ctx->qp_lock);
	for (struct ursa_qp **pp = &ctx->qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	/* Peers with channels to this QP see them close. */
	ursa_hooks.chans_close(qp);
	ursa_hooks.unlisten(qp);
	ursa_mutex_unlock(&ctx->qp_lock);
	/* Only now: a pass (engine or application, under qp_lock) walks
	 * ctx->qps and reads qp->rc (held ACKs, send steps). */
	ursa_hooks.rc_qp_fini(qp);
	/* (nothing raises an event for it now) */
	ursa_async_forget_qp(qp);
	ursa_pub_qp_free(qp);
	qp_clean_cqs(qp);
	atomic_fetch_sub(&qp->pd->refs, 1);
	atomic_fetch_sub(&qp->scq->refs, 1);
	atomic_fetch_sub(&qp->rcq->refs, 1);
	if (qp->srq)
		atomic_fetch_sub(&qp->srq->refs, 1);
	else
		ursa_ring_fini(&qp->rq.ring);
	ursa_ring_fini(&qp->sq);
	pthread_mutex_destroy(&qp->state_lock);
	pthread_mutex_destroy(&qp->sq_lock);
	pthread_mutex_destroy(&qp->rq_lock);
	atomic_fetch_sub(&ctx->nobjs, 1);
	free(qp);
	return 0;
}

static void flush_rq_locked(struct ursa_qp *qp)
{
	while (ursa_ring_ready(&qp->rq.ring)) {
		struct ursa_recv_wqe *w = ursa_ring_peek(&qp->rq.ring);
		struct ibv_wc wc = { 0 };

		wc.wr_id = w->wr_id;
		wc.status = IBV_WC_WR_FLUSH_ERR;
		wc.opcode = IBV_WC_RECV;
		wc.qp_num = qp->ex.qp_base.qp_num;
		ursa_ring_consume(&qp->rq.ring, 1);
		ursa_cq_push(qp->rcq, &wc, true);
	}
}

static void set_state(struct ursa_qp *qp, int st)
{
	/* Release: attributes written before the state are visible to an
	 * engine that acquires the new state. */
	atomic_store_explicit(&qp->state, st, memory_order_release);
	qp->ex.qp_base.state = st;
	ursa_pub_qp_update(qp);
}

void ursa_qp_to_error(struct ursa_qp *qp, bool sq_error_only)
{
	int st, next;

	pthread_mutex_lock(&qp->state_lock);
	st = qp_state(qp);
	next = (sq_error_only && st != IBV_QPS_ERR) ? IBV_QPS_SQE : IBV_QPS_ERR;
	if (st != IBV_QPS_RESET && st != next)
		set_state(qp, next);
	pthread_mutex_unlock(&qp->state_lock);
	if (st == IBV_QPS_RESET || st == next)
		return;
	if (next == IBV_QPS_ERR) {
		if (!qp->srq) {
			pthread_mutex_lock(&qp->rq_lock);
			flush_rq_locked(qp);
			pthread_mutex_unlock(&qp->rq_lock);
		} else {
			/* IBTA 11.6.3.3: the QP's last WQE has been consumed
			 * from the SRQ. */
			ursa_async_event(qp->ctx, IBV_EVENT_QP_LAST_WQE_REACHED,
					 &qp->ex.qp_base);
		}
	}
	if (qp->ctx->eng)
		ursa_hooks.kick(qp->ctx->eng); /* flush the send queue */
}

static bool av_ok(const struct ibv_ah_attr *av)
{
	struct ursa_device *dev = ursa_device_get();

	/* RoCE addresses by GID: the GRH is mandatory (as for rxe, whose
	 * kernel path refuses an AV without one on an Ethernet port). */
	return av->port_num == 1 && av->is_global &&
	       av->grh.sgid_index < dev->ngids;
}

static int check_values(struct ursa_qp *qp, const struct ibv_qp_attr *a,
			int mask)
{
	struct ursa_device *dev = ursa_device_get();

	if ((mask & IBV_QP_PORT) && a->port_num != 1)
		return -EINVAL;
	if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
		return -EINVAL;
	if ((mask & IBV_QP_PATH_MTU) &&
	    (a->path_mtu < IBV_MTU_256 || a->path_mtu > dev->max_mtu))
		return -EINVAL;
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) &&
	    a->max_rd_atomic > URSA_MAX_RD_ATOM)
		return -EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) &&
	    a->max_dest_rd_atomic > URSA_MAX_RD_ATOM)
		return -EINVAL;
	if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
		return -EINVAL;
	if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
		return -EINVAL;
	if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
		return -EINVAL;
	if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
		return -EINVAL;
	/* Any flag an MR may carry, as rxe takes them (mlx5 ignores all but
	 * the remote ones, which are the only ones a QP acts on):
	 * pyverbs' ODP tests set ON_DEMAND here. */
	if ((mask & IBV_QP_ACCESS_FLAGS) &&
	    (a->qp_access_flags & ~URSA_ACCESS_SUPPORTED))
		return -EINVAL;
	if ((mask & IBV_QP_AV) && !av_ok(&a->ah_attr))
		return -EINVAL;
	if ((mask & IBV_QP_ALT_PATH) && !av_ok(&a->alt_ah_attr))
		return -EINVAL;
	if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff)
		return -EINVAL;
	if ((mask & IBV_QP_CUR_STATE) && (int)a->cur_qp_state != qp_state(qp))
		return -EINVAL;
	return 0;
}

/* Copy into the QP's attributes those the mask names (already checked). */
static void apply_attrs(struct ibv_qp_attr *q, const struct ibv_qp_attr *a,
			int mask)
{
	if (mask & IBV_QP_PKEY_INDEX) q->pkey_index = a->pkey_index;
	if (mask & IBV_QP_PORT) q->port_num = a->port_num;
	if (mask & IBV_QP_QKEY) q->qkey = a->qkey;
	if (mask & IBV_QP_ACCESS_FLAGS) q->qp_access_flags = a->qp_access_flags;
	if (mask & IBV_QP_AV) q->ah_attr = a->ah_attr;
	if (mask & IBV_QP_ALT_PATH) {
		q->alt_ah_attr = a->alt_ah_attr;
		q->alt_pkey_index = a->alt_pkey_index;
		q->alt_port_num = a->alt_port_num;
		q->alt_timeout = a->alt_timeout;
	}
	if (mask & IBV_QP_PATH_MTU) q->path_mtu = a->path_mtu;
	if (mask & IBV_QP_DEST_QPN) q->dest_qp_num = a->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN) q->rq_psn = a->rq_psn & 0xffffff;
	if (mask & IBV_QP_SQ_PSN) q->sq_psn = a->sq_psn & 0xffffff;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		q->max_dest_rd_atomic = a->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->max_rd_atomic = a->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER) q->min_rnr_timer = a->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT) q->timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = a->rnr_retry;
	if (mask & IBV_QP_PATH_MIG_STATE) q->path_mig_state = a->path_mig_state;
	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
		q->en_sqd_async_notify = a->en_sqd_async_notify;
}

/*
 * The move to RESET, entered with ctx->qp_lock and the state lock held
 * and leaving both released. IBTA 10.3.1: RESET empties both work queues
 * without completions. The engine must not be inside this QP.
 */
static void modify_to_reset(struct ursa_qp *qp, int mask)
{
	pthread_mutex_lock(&qp->rq_lock);
	atomic_store(&qp->sq.head, atomic_load(&qp->sq.tail));
	/* Sequence state of channels restarts with the QP. */
	ursa_hooks.chans_close(qp);
	if (!qp->srq)
		atomic_store(&qp->rq.ring.head,
			     atomic_load(&qp->rq.ring.tail));
	set_state(qp, IBV_QPS_RESET);
	pthread_mutex_unlock(&qp->rq_lock);
	qp_clean_cqs(qp);
	memset(&qp->attr, 0, sizeof(qp->attr));
	ursa_pub_qp_update(qp);
	pthread_mutex_unlock(&qp->state_lock);
	ursa_mutex_unlock(&qp->ctx->qp_lock);
	ursa_hooks.rc_qp_modified(qp, mask);
}

int ursa_qp_modify(struct ursa_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct ursa_ctx *ctx = qp->ctx;
	int cur, next, ret;
	/* RESET and SQD need the engine out of the QP: its lock comes
	 * first (the lock order of docs/design.md; taken inside the state
	 * lock, it could deadlock with an engine pass that moves the QP to
	 * an error state). */
	bool eng = (mask & IBV_QP_STATE) && (a->qp_state == IBV_QPS_RESET ||
					     a->qp_state == IBV_QPS_SQD);

	if (eng)
		ursa_mutex_lock(&ctx->qp_lock);
	pthread_mutex_lock(&qp->state_lock);
	cur = qp_state(qp);
	next = (mask & IBV_QP_STATE) ? (int)a->qp_state : cur;
	ret = ursa_qp_transition_ok(qp->ex.qp_base.qp_type, cur, next, mask);
	if (!ret)
		ret = check_values(qp, a, mask);
	if (ret) {
		pthread_mutex_unlock(&qp->state_lock);
		if (eng)
			ursa_mutex_unlock(&ctx->qp_lock);
		return ret;
	}
	apply_attrs(&qp->attr, a, mask);

	if (next == IBV_QPS_RESET && cur != IBV_QPS_RESET) {
		modify_to_reset(qp, mask);
		return 0;
	}
	if (next == IBV_QPS_ERR) {
		pthread_mutex_unlock(&qp->state_lock);
		if (eng)
			ursa_mutex_unlock(&ctx->qp_lock);
		ursa_qp_to_error(qp, false);
		ursa_hooks.rc_qp_modified(qp, mask);
		return 0;
	}
	if (next == IBV_QPS_SQD && cur != IBV_QPS_SQD) {
		/* Under the engine's lock no WQE is mid-execution, so the
		 * send queue is drained the moment the state changes. */
		set_state(qp, next);
		pthread_mutex_unlock(&qp->state_lock);
		ursa_mutex_unlock(&ctx->qp_lock);
		if ((mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && a->en_sqd_async_notify)
			ursa_async_event(ctx, IBV_EVENT_SQ_DRAINED,
					 &qp->ex.qp_base);
		return 0;
	}
	set_state(qp, next);
	pthread_mutex_unlock(&qp->state_lock);
	if (eng)
		ursa_mutex_unlock(&ctx->qp_lock);
	ursa_hooks.rc_qp_modified(qp, mask);
	if (next == IBV_QPS_RTS && ctx->eng)
		ursa_hooks.kick(ctx->eng);
	return 0;
}

int ursa_qp_query(struct ursa_qp *qp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init)
{
	(void)mask; /* everything is cheap to report */
	pthread_mutex_lock(&qp->state_lock);
	*attr = qp->attr;
	attr->qp_state = qp_state(qp);
	attr->cur_qp_state = attr->qp_state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	pthread_mutex_unlock(&qp->state_lock);
	memset(init, 0, sizeof(*init));
	init->qp_context = qp->ex.qp_base.qp_context;
	init->send_cq = qp->ex.qp_base.send_cq;
	init->recv_cq = qp->ex.qp_base.recv_cq;
	init->srq = qp->ex.qp_base.srq;
	init->cap = qp->cap;
	init->qp_type = qp->ex.qp_base.qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}

int ursa_wqe_check(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;

	if (!(op_bit(w->opcode) & ops_for(t)))
		return -EINVAL;
	if (qp->ex_api && !(op_bit(w->opcode) & qp->send_ops_flags))
		return -EINVAL;
	if (w->num_sge > qp->cap.max_send_sge)
		return -EINVAL;
	if (w->flags & IBV_SEND_INLINE) {
		if (w->inline_len > qp->cap.max_inline_data)
			return -EINVAL;
		if (w->opcode == IBV_WR_RDMA_READ ||
		    w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		    w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			return -EINVAL;
	}
	if (t == IBV_QPT_UD && !w->av.is_global)
		return -EINVAL;
	if (w->opcode == IBV_WR_BIND_MW && !w->mw)
		return -EINVAL;
	return 0;
}

void ursa_sq_publish(struct ursa_qp *qp, uint32_t n)
{
	if (!n)
		return;
	ursa_ring_produce(&qp->sq, n);
	/* Start the work right here when the engine is not busy with
	 * another pass (kernel bypass: no system call, no context switch);
	 * wake the engine only if something is left that nobody started. */
	if (ursa_hooks.progress_qp(qp) >= 0) {
		uint32_t ready = ursa_ring_ready(&qp->sq);
		struct ursa_send_wqe *w;

		if (!ready)
			return;
		/* the newest started: all are in flight (RoCEv2 runs
		 * several at once), their answers ring our doorbell */
		w = ursa_ring_slot(&qp->sq,
				   atomic_load_explicit(&qp->sq.head,
							memory_order_relaxed) +
				   ready - 1);
		if (w->started)
			return;
		/* the oldest is a RoCEv2 message in flight: the pass that
		 * takes its answer (or its timer) runs the queue behind it,
		 * as this pass just did (a full pipe of READs rang the
		 * engine at every post: 140 000 doorbells a second). (The
		 * ring's slots are ours to write, under sq_lock: the
		 * oldest's fields are those a pass left.) */
		w = ursa_ring_peek(&qp->sq);
		if (__atomic_load_n(&w->started, __ATOMIC_RELAXED) &&
		    __atomic_load_n(&w->via_udp, __ATOMIC_RELAXED))
			return;
	}
	ursa_hooks.kick(qp->ctx->eng);
}

static bool can_post_send(int st)
{
	/* IBTA 10.8.2: posting to the send queue needs RTS or later; in
	 * SQD the WQE waits, in SQE and ERR it is flushed. */
	return st == IBV_QPS_RTS || st == IBV_QPS_SQD || st == IBV_QPS_SQE ||
	       st == IBV_QPS_ERR;
}

/* IBV_SEND_INLINE: the data itself goes into the WQE, now. */
static int copy_inline(struct ursa_qp *qp, const struct ibv_send_wr *wr,
		       struct ursa_send_wqe *w)
{
	uint64_t n = 0;

	for (int i = 0; i < wr->num_sge; i++) {
		if (n + wr->sg_list[i].length > qp->cap.max_inline_data)
			return -EINVAL;
		/* An empty entry may carry a NULL address (UCX). */
		if (!wr->sg_list[i].length)
			continue;
		memcpy(w->inline_data + n,
		       (void *)(uintptr_t)wr->sg_list[i].addr,
		       wr->sg_list[i].length);
		n += wr->sg_list[i].length;
	}
	w->inline_len = (uint32_t)n;
	return 0;
}

static int fill_wqe(struct ursa_qp *qp, struct ibv_send_wr *wr,
		    struct ursa_send_wqe *w)
{
	memset(w, 0, offsetof(struct ursa_send_wqe, sge));
	if (wr->num_sge < 0)
		return -EINVAL;
	w->wr_id = wr->wr_id;
	w->opcode = wr->opcode;
	w->flags = wr->send_flags;
	w->num_sge = (uint32_t)wr->num_sge;
	w->imm = wr->imm_data;
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		w->remote_addr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		w->remote_addr = wr->wr.atomic.remote_addr;
		w->rkey = wr->wr.atomic.rkey;
		w->compare_add = wr->wr.atomic.compare_add;
		w->swap = wr->wr.atomic.swap;
		break;
	case IBV_WR_BIND_MW:
		w->mw = wr->bind_mw.mw ? to_umw(wr->bind_mw.mw) : NULL;
		w->mw_new_rkey = wr->bind_mw.rkey;
		w->bind = wr->bind_mw.bind_info;
		if (w->mw && w->mw->ibv.type != IBV_MW_TYPE_2)
			return -EINVAL; /* type 1 binds go through ibv_bind_mw */
		break;
	default:
		break;
	}
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return -EINVAL;
		w->av = to_uah(wr->wr.ud.ah)->attr;
		w->remote_qpn = wr->wr.ud.remote_qpn;
		w->remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (w->num_sge > qp->cap.max_send_sge)
		return -EINVAL;
	if (wr->send_flags & IBV_SEND_INLINE) {
		if (copy_inline(qp, wr, w))
			return -EINVAL;
	} else if (w->num_sge) {
		memcpy(w->sge, wr->sg_list, w->num_sge * sizeof(*w->sge));
	}
	return ursa_wqe_check(qp, w);
}

/* The ring: every WR the shortcut did not take. (Out of line: the
 * shortcut's caller then saves no registers for it.) */
static __attribute__((noinline)) int
post_send_ring(struct ursa_qp *qp, struct ibv_send_wr *wr,
	       struct ibv_send_wr **bad)
{
	bool list = wr && wr->next;
	uint32_t n = 0;
	int ret = 0;

	ursa_hooks.prefetch_next(qp);
	pthread_mutex_lock(&qp->sq_lock);
	if (!can_post_send(qp_state(qp))) {
		ret = -EINVAL;
		*bad = wr;
		goto out;
	}
	for (; wr; wr = wr->next) {
		/* (a list's WRs, while nothing of it waits in the ring: order) */
		if (list && !n && ursa_hooks.post_direct(qp, wr))
			continue;
		if (n >= ursa_ring_space(&qp->sq)) {
			ret = -ENOMEM;
			break;
		}
		ret = fill_wqe(qp, wr, ursa_ring_prod_slot(&qp->sq, n));
		if (ret)
			break;
		n++;
	}
	if (ret)
		*bad = wr;
	ursa_sq_publish(qp, n);
out:
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

int ursa_post_send(struct ursa_qp *qp, struct ibv_send_wr *wr,
		   struct ibv_send_wr **bad)
{
	/* One WR: the shortcut needs no sq_lock (ursa_req_direct) */
	if (wr && !wr->next && ursa_hooks.post_direct(qp, wr))
		return 0;
	return post_send_ring(qp, wr, bad);
}

static int post_rq(struct ursa_rq *rq, uint32_t max_sge,
		   struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	for (; wr; wr = wr->next) {
		struct ursa_recv_wqe *w;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge) {
			*bad = wr;
			return -EINVAL;
		}
		if (!ursa_ring_space(&rq->ring)) {
			*bad = wr;
			return -ENOMEM;
		}
		w = ursa_ring_prod_slot(&rq->ring, 0);
		w->wr_id = wr->wr_id;
		w->num_sge = (uint32_t)wr->num_sge;
		if (w->num_sge)	/* a receive with no SGE: sg_list may be NULL */
			memcpy(w->sge, wr->sg_list, w->num_sge * sizeof(*w->sge));
		ursa_ring_produce(&rq->ring, 1);
	}
	return 0;
}

int ursa_post_recv(struct ursa_qp *qp, struct ibv_recv_wr *wr,
		   struct ibv_recv_wr **bad)
{
	int st = qp_state(qp), ret;

	if (qp->srq || st == IBV_QPS_RESET) {
		*bad = wr;
		return -EINVAL;
	}
	pthread_mutex_lock(&qp->rq_lock);
	ret = post_rq(&qp->rq, qp->rq.max_sge, wr, bad);
	/* IBTA 10.8.3: receives posted in ERR complete at once, flushed. */
	if (qp_state(qp) == IBV_QPS_ERR)
		flush_rq_locked(qp);
	pthread_mutex_unlock(&qp->rq_lock);
	return ret;
}

int ursa_srq_post_recv(struct ursa_srq *srq, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad)
{
	int ret;

	pthread_mutex_lock(&srq->lock);
	ret = post_rq(&srq->rq, srq->rq.max_sge, wr, bad);
	pthread_mutex_unlock(&srq->lock);
	return ret;
}

int ursa_srq_create(struct ursa_pd *pd, struct ibv_srq_init_attr *ia,
		    struct ursa_srq **out)
{
	struct ibv_srq_attr *a = &ia->attr;
	struct ursa_srq *srq;
	int ret;

	if (!a->max_wr || a->max_wr > URSA_MAX_SRQ_WR ||
	    a->max_sge > URSA_MAX_SGE || a->srq_limit > a->max_wr)
		return -EINVAL;
	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return -ENOMEM;
	ret = ursa_ring_init(&srq->rq.ring, a->max_wr,
			     sizeof(struct ursa_recv_wqe));
	if (ret) {
		free(srq);
		return ret;
	}
	srq->rq.max_sge = a->max_sge;
	srq->limit = a->srq_limit;
	srq->pd = pd;
	srq->type = IBV_SRQT_BASIC;
	pthread_mutex_init(&srq->lock, NULL);
	pthread_mutex_init(&srq->ibv.mutex, NULL);
	pthread_cond_init(&srq->ibv.cond, NULL);
	srq->ibv.context = pd->ibv.context;
	srq->ibv.srq_context = ia->srq_context;
	srq->ibv.pd = &pd->ibv;
	srq->ibv.handle = (uint32_t)ursa_rand64();
	a->max_wr = srq->rq.ring.size;
	atomic_fetch_add(&pd->refs, 1);
	*out = srq;
	return 0;
}

int ursa_srq_destroy(struct ursa_srq *srq)
{
	if (atomic_load(&srq->refs))
		return -EBUSY;
	ursa_async_forget_srq(srq);
	atomic_fetch_sub(&srq->pd->refs, 1);
	ursa_ring_fini(&srq->rq.ring);
	pthread_mutex_destroy(&srq->lock);
	free(srq);
	return 0;
}

int ursa_srq_modify(struct ursa_srq *srq, struct ibv_srq_attr *a, int mask)
{
	int ret = 0;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return -EINVAL;
	pthread_mutex_lock(&srq->lock);
	if (mask & IBV_SRQ_MAX_WR) {
		struct ursa_ring n;
		uint32_t cnt = ursa_ring_ready(&srq->rq.ring);

		if (!a->max_wr || a->max_wr > URSA_MAX_SRQ_WR ||
		    pow2(a->max_wr) < cnt) {
			ret = -EINVAL;
			goto out;
		}
		ret = ursa_ring_init(&n, a->max_wr, sizeof(struct ursa_recv_wqe));
		if (ret)
			goto out;
		for (uint32_t i = 0; i < cnt; i++) {
			memcpy(ursa_ring_slot(&n, i), ursa_ring_peek(&srq->rq.ring),
			       sizeof(struct ursa_recv_wqe));
			ursa_ring_consume(&srq->rq.ring, 1);
		}
		atomic_store(&n.tail, cnt);
		ursa_ring_fini(&srq->rq.ring);
		srq->rq.ring.buf = n.buf;
		srq->rq.ring.size = n.size;
		srq->rq.ring.mask = n.mask;
		atomic_store(&srq->rq.ring.head, 0);
		atomic_store(&srq->rq.ring.tail, cnt);
		a->max_wr = n.size;
	}
	if (mask & IBV_SRQ_LIMIT) {
		if (a->srq_limit > srq->rq.ring.size) {
			ret = -EINVAL;
			goto out;
		}
		srq->limit = a->srq_limit;
	}
out:
	pthread_mutex_unlock(&srq->lock);
	return ret;
}
