// SPDX-License-Identifier: MIT
/*
 * misc.c (verbs) - the rest of libibverbs' public ABI: kernel-structure
 * marshalling helpers (used by librdmacm), object import across processes,
 * ECE, L2 resolution. ursa has no kernel objects to import or marshal from;
 * these entry points exist so every consumer of libibverbs loads, and they
 * answer with the errno a device without the feature gives.
 */
#include "verbs.h"

#include <string.h>

#define EXPORT URSA_EXPORT

/* marshall.h prototypes (not installed by libibverbs-dev). */
EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst,
				       const void *src);
EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
				       const void *src);
EXPORT void ibv_copy_path_rec_from_kern(void *dst, const void *src);
EXPORT void ibv_copy_path_rec_to_kern(void *dst, const void *src);

/* Field-by-field layouts of the kernel ABI structs (rdma/ib_user_verbs.h,
 * rdma/ib_user_sa.h); ursa never receives them, but librdmacm may call the
 * helpers on zeroed data, so they copy faithfully. */
struct kern_global_route {
	uint8_t dgid[16];
	uint32_t flow_label;
	uint8_t sgid_index, hop_limit, traffic_class, reserved;
};
struct kern_ah_attr {
	struct kern_global_route grh;
	uint16_t dlid;
	uint8_t sl, src_path_bits, static_rate, is_global, port_num, reserved;
};

EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
				       const void *src)
{
	const struct kern_ah_attr *s = src;

	memcpy(dst->grh.dgid.raw, s->grh.dgid, 16);
	dst->grh.flow_label = s->grh.flow_label;
	dst->grh.sgid_index = s->grh.sgid_index;
	dst->grh.hop_limit = s->grh.hop_limit;
	dst->grh.traffic_class = s->grh.traffic_class;
	dst->dlid = s->dlid;
	dst->sl = s->sl;
	dst->src_path_bits = s->src_path_bits;
	dst->static_rate = s->static_rate;
	dst->is_global = s->is_global;
	dst->port_num = s->port_num;
}

EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst,
				       const void *src)
{
	/* struct ib_uverbs_qp_attr: 16 u32 fields, two ah attrs, then
	 * u8 fields; only consumers of the kernel CM use it. */
	const uint8_t *p = src;
	uint32_t u[16];

	memcpy(u, p, sizeof(u));
	memset(dst, 0, sizeof(*dst));
	dst->qp_state = u[1];
	dst->cur_qp_state = u[2];
	dst->path_mtu = u[3];
	dst->path_mig_state = u[4];
	dst->qkey = u[5];
	dst->rq_psn = u[6];
	dst->sq_psn = u[7];
	dst->dest_qp_num = u[8];
	dst->qp_access_flags = u[9];
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, p + 64);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, p + 64 + 32);
}

EXPORT void ibv_copy_path_rec_from_kern(void *dst, const void *src)
{
	memcpy(dst, src, 64);
}

EXPORT void ibv_copy_path_rec_to_kern(void *dst, const void *src)
{
	memcpy(dst, src, 64);
}

EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *c,
				       struct ibv_ah_attr *attr,
				       uint8_t eth_mac[ETHERNET_LL_SIZE],
				       uint16_t *vid)
{
	(void)c; (void)attr;
	/* Packets go through the host's IP stack, which resolves L2. */
	memset(eth_mac, 0, ETHERNET_LL_SIZE);
	if (vid)
		*vid = 0xffff;
	return 0;
}

EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	return ret_null(-EOPNOTSUPP);
}

EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *c, uint32_t h)
{
	(void)c; (void)h;
	return ret_null(-EOPNOTSUPP);
}

EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t h)
{
	(void)pd; (void)h;
	return ret_null(-EOPNOTSUPP);
}

EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *c, uint32_t h)
{
	(void)c; (void)h;
	return ret_null(-EOPNOTSUPP);
}

EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return ret_errno(-EOPNOTSUPP);
}

EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return ret_errno(-EOPNOTSUPP);
}
