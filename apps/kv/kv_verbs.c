// SPDX-License-Identifier: MIT
/*
 * kv_verbs.c - the few verbs steps the ursa-kv server and client both take:
 * open the device and find the GID of the address the TCP connection
 * uses, create an RC queue pair, and bring it up towards the peer's.
 */
#include <errno.h>
#include <string.h>

#include "kv_verbs.h"

int kv_ep_open(struct kv_ep *e, const struct sockaddr_storage *local)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_port_attr pa;
	uint8_t want[16] = { [10] = 0xff, [11] = 0xff };

	memset(e, 0, sizeof(*e));
	if (!l || !l[0] || !(e->ctx = ibv_open_device(l[0]))) {
		if (l)
			ibv_free_device_list(l);
		return -ENODEV;
	}
	ibv_free_device_list(l);
	if (local->ss_family == AF_INET)
		memcpy(want + 12, &((const struct sockaddr_in *)local)->sin_addr, 4);
	else
		memcpy(want, &((const struct sockaddr_in6 *)local)->sin6_addr, 16);
	if (ibv_query_port(e->ctx, 1, &pa))
		return -EIO;
	e->mtu = pa.active_mtu;
	e->gid_index = -1;
	for (int i = 0; i < pa.gid_tbl_len && e->gid_index < 0; i++) {
		union ibv_gid g;

		if (!ibv_query_gid(e->ctx, 1, i, &g) && !memcmp(g.raw, want, 16)) {
			e->gid_index = i;
			e->gid = g;
		}
	}
	if (e->gid_index < 0)
		return -EADDRNOTAVAIL;
	e->pd = ibv_alloc_pd(e->ctx);
	return e->pd ? 0 : -ENOMEM;
}

void kv_ep_close(struct kv_ep *e)
{
	if (e->pd)
		ibv_dealloc_pd(e->pd);
	if (e->ctx)
		ibv_close_device(e->ctx);
	memset(e, 0, sizeof(*e));
}

struct ibv_qp *kv_qp_create(struct kv_ep *e, struct ibv_cq *cq, uint32_t depth)
{
	struct ibv_qp_init_attr ia = { 0 };

	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = depth;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 2;
	return ibv_create_qp(e->pd, &ia);
}

int kv_qp_connect(struct kv_ep *e, struct ibv_qp *qp, uint32_t qpn,
		  const uint8_t gid[16])
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = e->mtu;
	a.dest_qp_num = qpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
	a.ah_attr.grh.sgid_index = (uint8_t)e->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;		/* 67 ms */
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		return -errno;
	return 0;
}
