// SPDX-License-Identifier: MIT
/*
 * mem.c (verbs) - protection domains, memory regions, memory windows.
 */
#include "verbs.h"

#include <stdlib.h>
#include <string.h>

#define EXPORT URSA_EXPORT

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct ursa_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return ret_null(-ENOMEM);
	pd->ibv.context = c;
	pd->ibv.handle = (uint32_t)atomic_fetch_add(&to_uctx(c)->dev->pd_handles, 1);
	return &pd->ibv;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *p)
{
	struct ursa_pd *pd = to_upd(p);

	/* IBTA 10.6.1: a PD still used by MRs, MWs, QPs, SRQs or AHs
	 * cannot be deallocated. */
	if (atomic_load(&pd->refs))
		return ret_errno(-EBUSY);
	free(pd);
	return 0;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length,
			  uint64_t iova, unsigned int access)
{
	struct ursa_mr *mr;
	int ret;

	if (!pd)
		return ret_null(-EINVAL);
	ret = ursa_mr_reg(to_upd(pd), addr, length, iova, access, &mr);
	if (ret)
		return ret_null(ret);
	return &mr->ibv;
}

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				 int access)
{
	return reg(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
				      size_t length, uint64_t iova, int access)
{
	return reg(pd, addr, length, iova, (unsigned int)access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				       size_t length, uint64_t iova,
				       unsigned int access)
{
	return reg(pd, addr, length, iova, access);
}

EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
					size_t length, uint64_t iova, int fd,
					int access)
{
	(void)pd; (void)offset; (void)length; (void)iova; (void)fd;
	(void)access;
	return ret_null(-EOPNOTSUPP);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	return ret_errno(ursa_mr_dereg(to_umr(mr)));
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
			void *addr, size_t length, int access)
{
	int ret;

	if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	ret = ursa_mr_rereg(to_umr(mr), flags, pd ? to_upd(pd) : NULL, addr,
			    length, (unsigned int)access);
	if (ret == -EINVAL) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (ret) {
		errno = -ret;
		return IBV_REREG_MR_ERR_CMD;
	}
	return 0;
}

struct ibv_mw *uv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ursa_mw *mw;
	int ret = ursa_mw_alloc(to_upd(pd), type, &mw);

	if (ret)
		return ret_null(ret);
	return &mw->ibv;
}

int uv_dealloc_mw(struct ibv_mw *mw)
{
	return ret_errno(ursa_mw_dealloc(to_umw(mw)));
}

/*
 * ibv_bind_mw (type 1): a bind is a work request on the QP; like the
 * rdma-core providers, the new rkey (the old one with its key byte bumped)
 * is computed and stored in mw->rkey at post time, and the engine installs
 * it when the WQE executes, in order with the QP's other work.
 */
int uv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct ursa_qp *q = to_uqp(qp);
	struct ursa_send_wqe *w;
	uint32_t new_rkey;
	int ret;

	if (mw->type != IBV_MW_TYPE_1)
		return ret_errno(-EINVAL);
	if (b->bind_info.mr && b->bind_info.length &&
	    !(b->bind_info.mr->pd == mw->pd))
		return ret_errno(-EPERM);
	pthread_mutex_lock(&q->sq_lock);
	if (qp_state(q) != IBV_QPS_RTS) {
		ret = -EINVAL;
		goto out;
	}
	if (!ursa_ring_space(&q->sq)) {
		ret = -ENOMEM;
		goto out;
	}
	w = ursa_ring_prod_slot(&q->sq, 0);
	memset(w, 0, offsetof(struct ursa_send_wqe, sge));
	new_rkey = ibv_inc_rkey(mw->rkey);
	w->wr_id = b->wr_id;
	w->opcode = IBV_WR_BIND_MW;
	w->flags = b->send_flags;
	w->mw = to_umw(mw);
	w->mw_new_rkey = new_rkey;
	w->bind = b->bind_info;
	/* ursa_wqe_check's op-type test covers BIND_MW on RC and UC only. */
	ret = ursa_wqe_check(q, w);
	if (ret)
		goto out;
	/* The application reads the new key right away; the key table
	 * switches to it when the WQE executes. */
	mw->rkey = new_rkey;
	ursa_sq_publish(q, 1);
out:
	pthread_mutex_unlock(&q->sq_lock);
	return ret_errno(ret);
}
