/* SPDX-License-Identifier: MIT */
/*
 * common.h - fixtures for the functional tests. Everything here uses only
 * the verbs API of the system's <infiniband/verbs.h>; the tests link with
 * -libverbs and find ursa's library through the library path.
 */
#ifndef URSA_TEST_COMMON_H
#define URSA_TEST_COMMON_H

#include <infiniband/verbs.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../harness.h"

static inline long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

struct fx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

static inline struct ibv_context *open_dev(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c;

	if (!l || !l[0])
		return NULL;
	c = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	return c;
}

static inline int fx_open(struct fx *f, int cqe)
{
	f->ctx = open_dev();
	if (!f->ctx)
		return -1;
	f->pd = ibv_alloc_pd(f->ctx);
	f->cq = ibv_create_cq(f->ctx, cqe, NULL, NULL, 0);
	return (f->pd && f->cq) ? 0 : -1;
}

static inline void fx_close(struct fx *f)
{
	if (f->cq)
		ibv_destroy_cq(f->cq);
	if (f->pd)
		ibv_dealloc_pd(f->pd);
	if (f->ctx)
		ibv_close_device(f->ctx);
}

static inline struct ibv_qp *make_qp(struct fx *f, enum ibv_qp_type t,
				     struct ibv_cq *scq, struct ibv_cq *rcq,
				     struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq ? scq : f->cq,
		.recv_cq = rcq ? rcq : f->cq,
		.srq = srq,
		.cap = { .max_send_wr = 64, .max_recv_wr = srq ? 0 : 64,
			 .max_send_sge = 32, .max_recv_sge = srq ? 0 : 32,
			 .max_inline_data = 64 },
		.qp_type = t,
	};

	return ibv_create_qp(f->pd, &ia);
}

#define ALL_REMOTE (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static inline int to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0,
				 .port_num = 1, .qp_access_flags = access,
				 .qkey = 0x11111111 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;

	mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	return ibv_modify_qp(qp, &a, mask);
}

static inline void fill_av(struct ibv_context *ctx, struct ibv_ah_attr *av)
{
	memset(av, 0, sizeof(*av));
	av->is_global = 1;
	av->port_num = 1;
	av->grh.sgid_index = 0;
	av->grh.hop_limit = 64;
	ibv_query_gid(ctx, 1, 0, &av->grh.dgid);
}

/* Bring qp to RTS talking to remote_qpn; rnr_retry/retry/timeout set the
 * error paths some tests exercise. */
static inline int to_rts_ex(struct ibv_qp *qp, uint32_t remote_qpn,
			    int access, int rnr_retry, int timeout,
			    int retry_cnt, int min_rnr_timer)
{
	struct ibv_qp_attr a;
	int ret = to_init(qp, access);

	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	if (qp->qp_type == IBV_QPT_UD) {
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	} else {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = remote_qpn;
		a.rq_psn = 0;
		a.max_dest_rd_atomic = 16;
		a.min_rnr_timer = (uint8_t)min_rnr_timer;
		fill_av(qp->context, &a.ah_attr);
		ret = ibv_modify_qp(qp, &a,
			IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			(qp->qp_type == IBV_QPT_RC ?
			 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0));
	}
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = (uint8_t)timeout;
	a.retry_cnt = (uint8_t)retry_cnt;
	a.rnr_retry = (uint8_t)rnr_retry;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
		(qp->qp_type == IBV_QPT_RC ?
		 IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		 IBV_QP_MAX_QP_RD_ATOMIC : 0));
}

static inline int to_rts(struct ibv_qp *qp, uint32_t remote_qpn, int access)
{
	return to_rts_ex(qp, remote_qpn, access, 7, 14, 7, 1);
}

static inline int connect_pair(struct ibv_qp *a, struct ibv_qp *b, int access)
{
	int r = to_rts(a, b->qp_num, access);

	return r ? r : to_rts(b, a->qp_num, access);
}

/* Poll one completion, waiting up to ms milliseconds. Returns 1, 0 on
 * timeout, or the negative poll result. */
static inline int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	long long end = now_ms() + ms;

	do {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n;
		usleep(50);
	} while (now_ms() < end);
	return 0;
}

/* Expect no completion for ms milliseconds. */
static inline int cq_stays_empty(struct ibv_cq *cq, int ms)
{
	struct ibv_wc wc;

	return wait_wc(cq, &wc, ms) == 0;
}

static inline int post_send1(struct ibv_qp *qp, enum ibv_wr_opcode op,
			     void *buf, uint32_t len, uint32_t lkey,
			     uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge s = { (uintptr_t)buf, len, lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static inline int post_recv1(struct ibv_qp *qp, void *buf, uint32_t len,
			     uint32_t lkey, uint64_t wr_id)
{
	struct ibv_sge s = { (uintptr_t)buf, len, lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

#endif
