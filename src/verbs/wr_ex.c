// SPDX-License-Identifier: MIT
/*
 * wr_ex.c (verbs) - the extended APIs whose entry points are function
 * pointers inside application-visible structs: the ibv_wr_* work-request
 * builder of struct ibv_qp_ex, and the start/next/end poll of struct
 * ibv_cq_ex.
 *
 * The builder writes WQEs straight into the send ring between wr_start and
 * wr_complete (holding the QP's post lock, as rdma-core providers do); a
 * setter that fails records the error, and wr_complete then discards every
 * WQE of the batch and returns it. Nothing is visible to the engine until
 * wr_complete publishes the batch with one doorbell.
 */
#include "verbs.h"

#include <string.h>

/* --- ibv_qp_ex ---------------------------------------------------------- */

static struct ursa_send_wqe *cur_wqe(struct ursa_qp *qp)
{
	if (!qp->wr_pending)
		return NULL;
	return ursa_ring_prod_slot(&qp->sq, qp->wr_pending - 1);
}

static struct ursa_send_wqe *new_wqe(struct ibv_qp_ex *qx, uint32_t op)
{
	struct ursa_qp *qp = to_uqp_ex(qx);
	struct ursa_send_wqe *w;

	if (qp->wr_err)
		return NULL;
	if (qp->wr_pending >= ursa_ring_space(&qp->sq)) {
		qp->wr_err = -ENOMEM;
		return NULL;
	}
	w = ursa_ring_prod_slot(&qp->sq, qp->wr_pending++);
	memset(w, 0, offsetof(struct ursa_send_wqe, sge));
	w->wr_id = qx->wr_id;
	w->flags = qx->wr_flags;
	w->opcode = op;
	return w;
}

static void x_start(struct ibv_qp_ex *qx)
{
	struct ursa_qp *qp = to_uqp_ex(qx);
	int st;

	pthread_mutex_lock(&qp->sq_lock);
	qp->wr_pending = 0;
	st = qp_state(qp);
	qp->wr_err = (st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
		      st == IBV_QPS_SQE || st == IBV_QPS_ERR) ? 0 : -EINVAL;
}

static int x_complete(struct ibv_qp_ex *qx)
{
	struct ursa_qp *qp = to_uqp_ex(qx);
	int ret = qp->wr_err;

	for (uint32_t i = 0; !ret && i < qp->wr_pending; i++)
		ret = ursa_wqe_check(qp, ursa_ring_prod_slot(&qp->sq, i));
	if (!ret)
		ursa_sq_publish(qp, qp->wr_pending);
	qp->wr_pending = 0;
	qp->wr_err = 0;
	pthread_mutex_unlock(&qp->sq_lock);
	return ret_errno(ret);
}

static void x_abort(struct ibv_qp_ex *qx)
{
	struct ursa_qp *qp = to_uqp_ex(qx);

	qp->wr_pending = 0;
	qp->wr_err = 0;
	pthread_mutex_unlock(&qp->sq_lock);
}

static void x_send(struct ibv_qp_ex *qx)
{
	new_wqe(qx, IBV_WR_SEND);
}

static void x_send_imm(struct ibv_qp_ex *qx, __be32 imm)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_SEND_WITH_IMM);

	if (w)
		w->imm = imm;
}

static void x_send_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_SEND_WITH_INV);

	if (w)
		w->imm = rkey;
}

static void x_rdma(struct ibv_qp_ex *qx, uint32_t op, uint32_t rkey,
		   uint64_t addr, uint32_t imm)
{
	struct ursa_send_wqe *w = new_wqe(qx, op);

	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->imm = imm;
	}
}

static void x_write(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr)
{
	x_rdma(qx, IBV_WR_RDMA_WRITE, rkey, addr, 0);
}

static void x_write_imm(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr,
			__be32 imm)
{
	x_rdma(qx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, imm);
}

static void x_read(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr)
{
	x_rdma(qx, IBV_WR_RDMA_READ, rkey, addr, 0);
}

static void x_cas(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr,
		  uint64_t compare, uint64_t swap)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_ATOMIC_CMP_AND_SWP);

	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->compare_add = compare;
		w->swap = swap;
	}
}

static void x_faa(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr,
		  uint64_t add)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_ATOMIC_FETCH_AND_ADD);

	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->compare_add = add;
	}
}

static void x_bind_mw(struct ibv_qp_ex *qx, struct ibv_mw *mw, uint32_t rkey,
		      const struct ibv_mw_bind_info *info)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_BIND_MW);

	if (w) {
		w->mw = to_umw(mw);
		w->mw_new_rkey = rkey;
		w->bind = *info;
		if (mw->type != IBV_MW_TYPE_2)
			to_uqp_ex(qx)->wr_err = -EINVAL;
	}
}

static void x_local_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	struct ursa_send_wqe *w = new_wqe(qx, IBV_WR_LOCAL_INV);

	if (w)
		w->imm = rkey;
}

static void x_unsupported(struct ibv_qp_ex *qx)
{
	struct ursa_qp *qp = to_uqp_ex(qx);

	if (!qp->wr_err)
		qp->wr_err = -EOPNOTSUPP;
}

static void x_send_tso(struct ibv_qp_ex *qx, void *hdr, uint16_t hdr_sz,
		       uint16_t mss)
{
	(void)hdr; (void)hdr_sz; (void)mss;
	x_unsupported(qx);
}

static void x_atomic_write(struct ibv_qp_ex *qx, uint32_t rkey,
			   uint64_t addr, const void *data)
{
	(void)rkey; (void)addr; (void)data;
	x_unsupported(qx);
}

static void x_set_xrc_srqn(struct ibv_qp_ex *qx, uint32_t srqn)
{
	(void)srqn;
	x_unsupported(qx);
}

static void x_set_ud_addr(struct ibv_qp_ex *qx, struct ibv_ah *ah,
			  uint32_t qpn, uint32_t qkey)
{
	struct ursa_send_wqe *w = cur_wqe(to_uqp_ex(qx));

	if (!w || !ah) {
		to_uqp_ex(qx)->wr_err = -EINVAL;
		return;
	}
	w->av = to_uah(ah)->attr;
	w->remote_qpn = qpn;
	w->remote_qkey = qkey;
}

static void x_set_sge_list(struct ibv_qp_ex *qx, size_t n,
			   const struct ibv_sge *sg)
{
	struct ursa_qp *qp = to_uqp_ex(qx);
	struct ursa_send_wqe *w = cur_wqe(qp);

	if (!w || n > qp->cap.max_send_sge) {
		qp->wr_err = -EINVAL;
		return;
	}
	if (n)	/* an empty list may be NULL */
		memcpy(w->sge, sg, n * sizeof(*sg));
	w->num_sge = (uint32_t)n;
	w->flags &= ~IBV_SEND_INLINE;
}

static void x_set_sge(struct ibv_qp_ex *qx, uint32_t lkey, uint64_t addr,
		      uint32_t length)
{
	struct ibv_sge s = { .addr = addr, .length = length, .lkey = lkey };

	x_set_sge_list(qx, 1, &s);
}

static void x_set_inline_list(struct ibv_qp_ex *qx, size_t n,
			      const struct ibv_data_buf *b)
{
	struct ursa_qp *qp = to_uqp_ex(qx);
	struct ursa_send_wqe *w = cur_wqe(qp);
	size_t off = 0;

	if (!w) {
		qp->wr_err = -EINVAL;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (off + b[i].length > qp->cap.max_inline_data) {
			qp->wr_err = -EINVAL;
			return;
		}
		if (b[i].length) /* an empty buffer may be NULL */
			memcpy(w->inline_data + off, b[i].addr, b[i].length);
		off += b[i].length;
	}
	w->inline_len = (uint32_t)off;
	w->num_sge = 0;
	w->flags |= IBV_SEND_INLINE;
}

static void x_set_inline(struct ibv_qp_ex *qx, void *addr, size_t len)
{
	struct ibv_data_buf b = { .addr = addr, .length = len };

	x_set_inline_list(qx, 1, &b);
}

void uv_qp_ex_init(struct ursa_qp *qp)
{
	struct ibv_qp_ex *x = &qp->ex;

	x->comp_mask = 0;
	x->wr_start = x_start;
	x->wr_complete = x_complete;
	x->wr_abort = x_abort;
	x->wr_send = x_send;
	x->wr_send_imm = x_send_imm;
	x->wr_send_inv = x_send_inv;
	x->wr_rdma_write = x_write;
	x->wr_rdma_write_imm = x_write_imm;
	x->wr_rdma_read = x_read;
	x->wr_atomic_cmp_swp = x_cas;
	x->wr_atomic_fetch_add = x_faa;
	x->wr_bind_mw = x_bind_mw;
	x->wr_local_inv = x_local_inv;
	x->wr_send_tso = x_send_tso;
	x->wr_atomic_write = x_atomic_write;
	x->wr_set_ud_addr = x_set_ud_addr;
	x->wr_set_xrc_srqn = x_set_xrc_srqn;
	x->wr_set_inline_data = x_set_inline;
	x->wr_set_inline_data_list = x_set_inline_list;
	x->wr_set_sge = x_set_sge;
	x->wr_set_sge_list = x_set_sge_list;
}

URSA_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct ursa_qp *q = to_uqp(qp);

	/* As rdma-core: only QPs created with send_ops_flags have one. */
	return q->ex_api ? &q->ex : NULL;
}

/* --- ibv_cq_ex ---------------------------------------------------------- */

static const uint64_t cq_flags_ts = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
	IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
static const uint64_t cq_flags_ok = IBV_WC_EX_WITH_BYTE_LEN |
	IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
	IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS |
	cq_flags_ts;

static int next_one(struct ursa_cq *cq)
{
	if (ursa_cq_poll(cq, 1, &cq->cur) != 1)
		return ENOENT;
	cq->ex.wr_id = cq->cur.wr_id;
	cq->ex.status = cq->cur.status;
	return 0;
}

static int c_start(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr)
{
	if (attr && attr->comp_mask)
		return EINVAL;
	return next_one(to_ucq_ex(c));
}

static int c_next(struct ibv_cq_ex *c)
{
	return next_one(to_ucq_ex(c));
}

static void c_end(struct ibv_cq_ex *c)
{
	(void)c;
}

#define CUR(c) (to_ucq_ex(c)->cur)
static enum ibv_wc_opcode r_opcode(struct ibv_cq_ex *c) { return CUR(c).opcode; }
static uint32_t r_vendor_err(struct ibv_cq_ex *c) { return CUR(c).vendor_err; }
static uint32_t r_byte_len(struct ibv_cq_ex *c) { return CUR(c).byte_len; }
static __be32 r_imm(struct ibv_cq_ex *c) { return CUR(c).imm_data; }
static uint32_t r_qp_num(struct ibv_cq_ex *c) { return CUR(c).qp_num; }
static uint32_t r_src_qp(struct ibv_cq_ex *c) { return CUR(c).src_qp; }
static unsigned int r_wc_flags(struct ibv_cq_ex *c) { return CUR(c).wc_flags; }
static uint32_t r_slid(struct ibv_cq_ex *c) { return CUR(c).slid; }
static uint8_t r_sl(struct ibv_cq_ex *c) { return CUR(c).sl; }
static uint8_t r_dlid_path_bits(struct ibv_cq_ex *c) { return CUR(c).dlid_path_bits; }

/* The device clock is CLOCK_MONOTONIC in ns (hca_core_clock 1 GHz,
 * uv_query_rt_values); the wall clock of a completion is that instant
 * moved to CLOCK_REALTIME. */
static uint64_t r_ts(struct ibv_cq_ex *c)
{
	return to_ucq_ex(c)->cur_ts;
}

static uint64_t r_wallclock(struct ibv_cq_ex *c)
{
	struct timespec rt;
	uint64_t mono = ursa_now_ns();

	clock_gettime(CLOCK_REALTIME, &rt);
	return (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec -
	       (mono - to_ucq_ex(c)->cur_ts);
}

int uv_query_rt_values(struct ibv_context *c, struct ibv_values_ex *v)
{
	uint64_t ns = ursa_now_ns();

	(void)c;
	if (!v)
		return EINVAL;
	v->comp_mask &= IBV_VALUES_MASK_RAW_CLOCK;
	if (v->comp_mask) {
		v->raw_clock.tv_sec = (time_t)(ns / 1000000000ull);
		v->raw_clock.tv_nsec = (long)(ns % 1000000000ull);
	}
	return 0;
}

void uv_cq_ex_init(struct ursa_cq *cq)
{
	struct ibv_cq_ex *x = &cq->ex;

	x->start_poll = c_start;
	x->next_poll = c_next;
	x->end_poll = c_end;
	x->read_opcode = r_opcode;
	x->read_vendor_err = r_vendor_err;
	x->read_byte_len = r_byte_len;
	x->read_imm_data = r_imm;
	x->read_qp_num = r_qp_num;
	x->read_src_qp = r_src_qp;
	x->read_wc_flags = r_wc_flags;
	x->read_slid = r_slid;
	x->read_sl = r_sl;
	x->read_dlid_path_bits = r_dlid_path_bits;
	x->read_completion_ts = r_ts;
	x->read_completion_wallclock_ns = r_wallclock;
}

struct ibv_cq_ex *uv_create_cq_ex(struct ibv_context *c,
				  struct ibv_cq_init_attr_ex *a)
{
	struct ursa_cq *cq;
	int ret;

	if (a->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS)
		return ret_null(-EINVAL);
	if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && a->flags)
		return ret_null(-EOPNOTSUPP);
	if (a->wc_flags & ~cq_flags_ok)
		return ret_null(-EOPNOTSUPP);
	if (a->comp_vector >= (uint32_t)c->num_comp_vectors)
		return ret_null(-EINVAL);
	ret = ursa_cq_create(to_uctx(c), (int)MIN(a->cqe, (uint32_t)INT32_MAX),
			     a->channel, a->cq_context, &cq);
	if (ret)
		return ret_null(ret);
	cq->ex_api = true;
	cq->wc_flags_ex = a->wc_flags;
	if ((a->wc_flags & cq_flags_ts) &&
	    !(cq->ts = calloc(cq->size, sizeof(*cq->ts)))) {
		ursa_cq_destroy(cq);
		return ret_null(-ENOMEM);
	}
	uv_cq_ex_init(cq);
	return &cq->ex;
}
