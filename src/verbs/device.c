// SPDX-License-Identifier: MIT
/*
 * device.c (verbs) - device list, contexts, device/port/GID queries, async
 * events, and the sysfs look-alikes that tools read through libibverbs.
 *
 * ibv_open_device returns the context embedded in a struct verbs_context,
 * as rdma-core 44 lays it out, so the inline verbs of <infiniband/verbs.h>
 * find the extended ops (query_port, query_device_ex, create_qp_ex,
 * create_cq_ex) through verbs_get_ctx_op(), and the data-path ops through
 * context->ops.
 */
#include "verbs.h"
#include "../transport/udp.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT URSA_EXPORT

static int uv_query_port(struct ibv_context *ctx, uint8_t port,
			 struct ibv_port_attr *attr, size_t len)
{
	struct ibv_port_attr a;

	if (port != 1)
		return ret_errno(-EINVAL);
	ursa_port_attr(to_uctx(ctx)->dev, &a);
	memcpy(attr, &a, MIN(len, sizeof(a)));
	return 0;
}

static int uv_query_device_ex(struct ibv_context *ctx,
			      const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t len)
{
	struct ibv_device_attr_ex a;
	const uint32_t odp = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
			     IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
			     IBV_ODP_SUPPORT_ATOMIC;

	if ((input && input->comp_mask) || len < sizeof(attr->orig_attr))
		return ret_errno(-EINVAL);
	memset(&a, 0, sizeof(a));
	ursa_device_attr(to_uctx(ctx)->dev, &a.orig_attr);
	a.odp_caps.general_caps = IBV_ODP_SUPPORT;
	a.odp_caps.per_transport_caps.rc_odp_caps = odp;
	a.odp_caps.per_transport_caps.uc_odp_caps = odp & ~(IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC);
	a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
	a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
	a.phys_port_cnt_ex = 1;
	/* completion timestamps: CLOCK_MONOTONIC ns, a 1 GHz clock (kHz) */
	a.completion_timestamp_mask = UINT64_MAX;
	a.hca_core_clock = 1000000;
	memcpy(attr, &a, MIN(len, sizeof(a)));
	return 0;
}

EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	struct ursa_device *dev = ursa_device_get();
	struct ibv_device **l;

	if (!dev) {
		errno = ENOMEM;
		return NULL;
	}
	l = calloc(2, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	l[0] = &dev->ibdev;
	if (num)
		*num = 1;
	return l;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return container_of(device, struct ursa_device, ibdev)->node_guid;
}

EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return device == &ursa_device_get()->ibdev ? 0 : -1;
}

/* A program that exits without destroying its QPs must not leave a peer
 * retrying for the ACK of its last message, which a real NIC would have
 * sent long ago: held-back ACKs (engine/rc_ack.c) leave at exit. */
static void acks_at_exit(void)
{
	struct ursa_device *dev = ursa_device_get();

	if (pthread_mutex_trylock(&dev->ctx_lock))
		return;
	for (struct ursa_ctx *c = dev->ctxs; c; c = c->next_ctx) {
		if (!ursa_mutex_trylock(&c->qp_lock))
			continue;
		for (struct ursa_qp *qp = c->qps; qp; qp = qp->next)
			ursa_rc_ack_exit(qp);
		ursa_mutex_unlock(&c->qp_lock);
	}
	pthread_mutex_unlock(&dev->ctx_lock);
}

static void exit_hooks(void)
{
	atexit(acks_at_exit);
	if (ursa_cfg()->stats)
		atexit(ursa_stats_exit);
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
	struct ursa_device *dev = ursa_device_get();
	struct ursa_ctx *ctx;
	struct ibv_context *c;
	int ret;

	if (!dev || device != &dev->ibdev)
		return ret_null(-ENODEV);
	pthread_once(&exit_once, exit_hooks);
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return ret_null(-ENOMEM);
	ctx->dev = dev;
	atomic_init(&ctx->qp_lock.v, 0);
	ret = ursa_evq_init(&ctx->async, false);
	if (ret) {
		free(ctx);
		return ret_null(ret);
	}
	c = &ctx->vctx.context;
	c->device = device;
	c->cmd_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	c->async_fd = ctx->async.fd;
	c->num_comp_vectors = 1;
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->mutex, NULL);
	c->ops.poll_cq = uv_poll_cq;
	c->ops.req_notify_cq = uv_req_notify_cq;
	c->ops.post_send = uv_post_send;
	c->ops.post_recv = uv_post_recv;
	c->ops.post_srq_recv = uv_post_srq_recv;
	c->ops.alloc_mw = uv_alloc_mw;
	c->ops.bind_mw = uv_bind_mw;
	c->ops.dealloc_mw = uv_dealloc_mw;
	ctx->vctx.sz = sizeof(struct verbs_context);
	ctx->vctx.query_port = uv_query_port;
	ctx->vctx.query_device_ex = uv_query_device_ex;
	ctx->vctx.create_cq_ex = uv_create_cq_ex;
	ctx->vctx.query_rt_values = uv_query_rt_values;
	ctx->vctx.create_qp_ex = uv_create_qp_ex;
	ret = ursa_engine_start(ctx);
	if (ret) {
		ursa_evq_fini(&ctx->async, free);
		if (c->cmd_fd >= 0)
			close(c->cmd_fd);
		free(ctx);
		return ret_null(ret);
	}
	/* RoCEv2 to other hosts; without it this process still reaches
	 * every QP on its own host */
	ursa_udp_start(ctx->eng ? &ctx->eng->udp : NULL);
	pthread_mutex_lock(&dev->ctx_lock);
	ctx->next_ctx = dev->ctxs;
	dev->ctxs = ctx;
	pthread_mutex_unlock(&dev->ctx_lock);
	return c;
}

EXPORT int ibv_close_device(struct ibv_context *c)
{
	struct ursa_ctx *ctx = to_uctx(c);
	bool last;

	if (atomic_load(&ctx->nobjs))
		ursa_info("ibv_close_device: %d CQs/QPs still open",
			  atomic_load(&ctx->nobjs));
	pthread_mutex_lock(&ctx->dev->ctx_lock);
	for (struct ursa_ctx **pp = &ctx->dev->ctxs; *pp; pp = &(*pp)->next_ctx)
		if (*pp == ctx) {
			*pp = ctx->next_ctx;
			break;
		}
	last = !ctx->dev->ctxs;
	pthread_mutex_unlock(&ctx->dev->ctx_lock);
	/* The last context gone: parked registrations (rcache.h) unlock
	 * their pages (MRs a program never deregistered keep theirs). */
	if (last)
		ursa_rcache_drain(&ctx->dev->rcache);
	ursa_udp_ctx_gone(ctx->eng ? &ctx->eng->udp : NULL);
	ursa_engine_stop(ctx);
	ursa_evq_fini(&ctx->async, free);
	if (c->cmd_fd >= 0)
		close(c->cmd_fd);
	free(ctx);
	return 0;
}

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	ursa_device_attr(to_uctx(c)->dev, a);
	return 0;
}

/* The exported (pre-1.x inline) entry point: the 48-byte compat layout,
 * everything before port_cap_flags2. */
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port,
			  struct _compat_ibv_port_attr *attr)
{
	return uv_query_port(c, port, (struct ibv_port_attr *)attr,
			     offsetof(struct ibv_port_attr, port_cap_flags2));
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index,
			 union ibv_gid *gid)
{
	struct ursa_device *dev = to_uctx(c)->dev;

	if (port != 1 || index < 0 || index >= URSA_MAX_GIDS)
		return ret_minus1(-EINVAL);
	/* An empty entry is the zero GID, as libibverbs reports it. */
	if (index >= dev->ngids)
		memset(gid, 0, sizeof(*gid));
	else
		*gid = dev->gids[index].gid;
	return 0;
}

static void fill_gid_entry(struct ursa_device *dev, int i,
			   struct ibv_gid_entry *e)
{
	memset(e, 0, sizeof(*e));
	e->gid = dev->gids[i].gid;
	e->gid_index = (uint32_t)i;
	e->port_num = 1;
	e->gid_type = IBV_GID_TYPE_ROCE_V2;
	e->ndev_ifindex = (uint32_t)dev->gids[i].ifindex;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port,
			     uint32_t index, struct ibv_gid_entry *entry,
			     uint32_t flags, size_t entry_size)
{
	struct ursa_device *dev = to_uctx(c)->dev;
	struct ibv_gid_entry e;

	if (flags || port != 1 || entry_size < sizeof(e))
		return ret_errno(-EINVAL);
	if (index >= URSA_MAX_GIDS)
		return ret_errno(-EINVAL);
	if (index >= (uint32_t)dev->ngids)
		return ret_errno(-ENODATA);
	fill_gid_entry(dev, (int)index, &e);
	memcpy(entry, &e, sizeof(e));
	return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c,
				    struct ibv_gid_entry *entries,
				    size_t max_entries, uint32_t flags,
				    size_t entry_size)
{
	struct ursa_device *dev = to_uctx(c)->dev;
	size_t n = 0;

	if (flags || entry_size < sizeof(struct ibv_gid_entry))
		return -EINVAL;
	for (int i = 0; i < dev->ngids; i++) {
		struct ibv_gid_entry e;

		if (n == max_entries)
			return -EINVAL;
		fill_gid_entry(dev, i, &e);
		memcpy((char *)entries + n * entry_size, &e, sizeof(e));
		n++;
	}
	return (ssize_t)n;
}

/* IBVERBS_PRIVATE_34, used by ibv_devinfo -v: 1 = RoCE v2. */
EXPORT int ibv_query_gid_type(struct ibv_context *c, uint8_t port,
			      unsigned int index, int *type)
{
	struct ursa_device *dev = to_uctx(c)->dev;

	if (port != 1 || index >= (unsigned int)dev->ngids)
		return ret_minus1(-EINVAL);
	*type = 1;
	return 0;
}

EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index,
			  __be16 *pkey)
{
	(void)c;
	if (port != 1 || index != 0)
		return ret_minus1(-EINVAL);
	*pkey = htobe16(0xffff);
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *c, uint8_t port,
			      __be16 pkey)
{
	(void)c;
	if (port != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff)
		return ret_minus1(-ENOENT);
	return 0;
}

EXPORT int ibv_get_async_event(struct ibv_context *c,
			       struct ibv_async_event *event)
{
	struct ibv_async_event *ev;
	int ret = ursa_async_pop(to_uctx(c), &ev);

	if (ret)
		return ret_minus1(ret);
	*event = *ev;
	free(ev);
	return 0;
}

/* The destroy verbs wait for it (core/evq.c). */
EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	if (event)
		ursa_async_acked(event);
}

EXPORT int ibv_fork_init(void)
{
	/* MRs are pinned with mlock, which fork does not disturb; nothing
	 * to set up (see docs/design.md on fork). */
	return 0;
}

EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}
