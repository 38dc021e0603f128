/* SPDX-License-Identifier: MIT */
/*
 * verbs.h (internal) - shared by the files of the ABI layer.
 *
 * src/verbs/ is the only place that knows libibverbs' return conventions:
 * constructors return NULL and set errno, most int verbs return the positive
 * errno value (and set errno too, as rdma-core does), ibv_query_gid and
 * ibv_get_cq_event return -1 and set errno, ibv_poll_cq returns a count or a
 * negative value. Core functions return 0 or -errno; the helpers below do
 * the translation.
 */
#ifndef URSA_VERBS_INTERNAL_H
#define URSA_VERBS_INTERNAL_H

#include <errno.h>

#include "../engine/engine.h"

/* The header turns these into macros over inline helpers; the library
 * defines the real exported functions. */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

static inline int ret_errno(int r)
{
	if (r < 0) {
		errno = -r;
		return -r;
	}
	return 0;
}

static inline void *ret_null(int r)
{
	errno = -r;
	return NULL;
}

static inline int ret_minus1(int r)
{
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return 0;
}

/* Exported but declared only in rdma-core's driver.h. */
int ibv_query_gid_type(struct ibv_context *c, uint8_t port,
		       unsigned int index, int *type);
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
			size_t size);
int ursa_sysfs_file(const char *rel, char *out, size_t len);
/* ursa.h-less export for libursa-preload.so (sysroot.c). */
int ursa_sysfs_export(const char *root);

/* Context ops installed by open_device, defined in the other files. */
int uv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int uv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int uv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		 struct ibv_send_wr **bad);
int uv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		 struct ibv_recv_wr **bad);
int uv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad);
struct ibv_mw *uv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int uv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b);
int uv_dealloc_mw(struct ibv_mw *mw);
struct ibv_cq_ex *uv_create_cq_ex(struct ibv_context *ctx,
				  struct ibv_cq_init_attr_ex *attr);
int uv_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *v);
struct ibv_qp *uv_create_qp_ex(struct ibv_context *ctx,
			       struct ibv_qp_init_attr_ex *attr);
void uv_qp_ex_init(struct ursa_qp *qp);
void ursa_stats_qp(struct ursa_qp *qp);
void ursa_stats_exit(void);
void uv_cq_ex_init(struct ursa_cq *cq);

#endif
