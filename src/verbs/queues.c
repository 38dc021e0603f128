// SPDX-License-Identifier: MIT
/*
 * queues.c (verbs) - completion channels, CQs, QPs, SRQs, AHs and the
 * data-path ops installed in context->ops.
 */
#include "verbs.h"

#include <stdlib.h>
#include <string.h>

#define EXPORT URSA_EXPORT

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct ursa_channel *ch = calloc(1, sizeof(*ch));
	int ret;

	if (!ch)
		return ret_null(-ENOMEM);
	ret = ursa_evq_init(&ch->q, false);
	if (ret) {
		free(ch);
		return ret_null(ret);
	}
	ch->ibv.context = c;
	ch->ibv.fd = ch->q.fd;
	return &ch->ibv;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *c)
{
	struct ursa_channel *ch = to_uch(c);

	if (c->refcnt)
		return ret_errno(-EBUSY);
	ursa_evq_fini(&ch->q, NULL);
	free(ch);
	return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *channel,
				    int comp_vector)
{
	struct ursa_cq *cq;
	int ret;

	if (comp_vector < 0 || comp_vector >= c->num_comp_vectors)
		return ret_null(-EINVAL);
	ret = ursa_cq_create(to_uctx(c), cqe, channel, cq_context, &cq);
	if (ret)
		return ret_null(ret);
	uv_cq_ex_init(cq);
	return ibv_cq_ex_to_cq(&cq->ex);
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	return ret_errno(ursa_cq_destroy(to_ucq(cq)));
}

EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	return ret_errno(ursa_cq_resize(to_ucq(cq), cqe));
}

int uv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = ursa_cq_poll(to_ucq(cq), n, wc);

	/* Nothing yet: do the engine's work on this thread rather than
	 * wait for it to be scheduled (two busy pollers on two cores would
	 * otherwise starve the engines). */
	if (got == 0 && n > 0 &&
	    ursa_engine_progress(to_uctx(cq->context),
				 !__atomic_load_n(&to_ucq(cq)->armed,
						  __ATOMIC_RELAXED)) > 0)
		got = ursa_cq_poll(to_ucq(cq), n, wc);
	return got;
}

int uv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	int ret = ursa_cq_arm(to_ucq(cq), solicited_only);

	if (!ret)
		ursa_engine_app_blocks(to_uctx(cq->context));
	return ret_errno(ret);
}

/* Counted before the channel's lock is let go: ursa_cq_destroy drops
 * the CQ's queued events, then waits for the ones counted here to be
 * acknowledged. */
static void cq_event_taken(void *item)
{
	atomic_fetch_add(&((struct ursa_cq *)item)->comp_events, 1);
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *c, struct ibv_cq **cq,
			    void **cq_context)
{
	struct ursa_cq *ucq;
	int ret = ursa_evq_pop(&to_uch(c)->q, (void **)&ucq, cq_event_taken);

	if (ret)
		return ret_minus1(ret);
	*cq = ibv_cq_ex_to_cq(&ucq->ex);
	*cq_context = ucq->ex.cq_context;
	return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

static struct ibv_qp *create_qp(struct ibv_context *c,
				struct ibv_qp_init_attr_ex *ia)
{
	struct ursa_qp *qp;
	int ret;

	if (ia->pd && ia->pd->context != c)
		return ret_null(-EINVAL);
	ret = ursa_qp_create(to_uctx(c), ia, &qp);
	if (ret)
		return ret_null(ret);
	uv_qp_ex_init(qp);
	return &qp->ex.qp_base;
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd,
				    struct ibv_qp_init_attr *ia)
{
	struct ibv_qp_init_attr_ex ex;
	struct ibv_qp *qp;

	if (!pd || !ia)
		return ret_null(-EINVAL);
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, ia, sizeof(*ia));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	qp = create_qp(pd->context, &ex);
	if (qp)
		ia->cap = ex.cap;
	return qp;
}

struct ibv_qp *uv_create_qp_ex(struct ibv_context *c,
			       struct ibv_qp_init_attr_ex *ia)
{
	return create_qp(c, ia);
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	ursa_stats_qp(to_uqp(qp));
	return ret_errno(ursa_qp_destroy(to_uqp(qp)));
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int mask)
{
	return ret_errno(ursa_qp_modify(to_uqp(qp), attr, mask));
}

EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			int mask, struct ibv_qp_init_attr *init)
{
	return ret_errno(ursa_qp_query(to_uqp(qp), attr, mask, init));
}

EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp,
				      enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp; (void)op; (void)flags;
	/* Data is placed in order and the last byte last. */
	return 1;
}

int uv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		 struct ibv_send_wr **bad)
{
	return ret_errno(ursa_post_send(to_uqp(qp), wr, bad));
}

int uv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		 struct ibv_recv_wr **bad)
{
	return ret_errno(ursa_post_recv(to_uqp(qp), wr, bad));
}

int uv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad)
{
	return ret_errno(ursa_srq_post_recv(to_usrq(srq), wr, bad));
}

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd,
				      struct ibv_srq_init_attr *ia)
{
	struct ursa_srq *srq;
	int ret;

	if (!pd || !ia)
		return ret_null(-EINVAL);
	ret = ursa_srq_create(to_upd(pd), ia, &srq);
	if (ret)
		return ret_null(ret);
	return &srq->ibv;
}

EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr,
			  int mask)
{
	return ret_errno(ursa_srq_modify(to_usrq(srq), attr, mask));
}

EXPORT int ibv_query_srq(struct ibv_srq *s, struct ibv_srq_attr *attr)
{
	struct ursa_srq *srq = to_usrq(s);

	pthread_mutex_lock(&srq->lock);
	attr->max_wr = srq->rq.ring.size;
	attr->max_sge = srq->rq.max_sge;
	attr->srq_limit = srq->limit;
	pthread_mutex_unlock(&srq->lock);
	return 0;
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	return ret_errno(ursa_srq_destroy(to_usrq(srq)));
}

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a)
{
	struct ursa_device *dev;
	struct ursa_ah *ah;

	if (!pd || !a)
		return ret_null(-EINVAL);
	dev = to_uctx(pd->context)->dev;
	/* RoCE: an address handle needs a GRH with a valid source GID. */
	if (a->port_num != 1 || !a->is_global ||
	    a->grh.sgid_index >= dev->ngids)
		return ret_null(-EINVAL);
	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return ret_null(-ENOMEM);
	ah->attr = *a;
	ah->pd = to_upd(pd);
	ah->ibv.context = pd->context;
	ah->ibv.pd = pd;
	ah->ibv.handle = (uint32_t)ursa_rand64();
	atomic_fetch_add(&ah->pd->refs, 1);
	return &ah->ibv;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *a)
{
	struct ursa_ah *ah = to_uah(a);

	atomic_fetch_sub(&ah->pd->refs, 1);
	free(ah);
	return 0;
}

/* Rebuild the sender's address from a UD receive completion and the GRH
 * at the start of its buffer (IBTA 10.2.4 / RoCEv2 annex A17.4.5.2). */
EXPORT int ibv_init_ah_from_wc(struct ibv_context *c, uint8_t port_num,
			       struct ibv_wc *wc, struct ibv_grh *grh,
			       struct ibv_ah_attr *ah)
{
	struct ursa_device *dev = to_uctx(c)->dev;
	const uint8_t *g = (const uint8_t *)grh;
	union ibv_gid sgid, dgid;

	if (port_num != 1 || !(wc->wc_flags & IBV_WC_GRH))
		return ret_errno(-EINVAL);
	memset(ah, 0, sizeof(*ah));
	memset(&sgid, 0, sizeof(sgid));
	memset(&dgid, 0, sizeof(dgid));
	if ((g[20] >> 4) == 4) { /* IPv4 header at offset 20 */
		sgid.raw[10] = sgid.raw[11] = 0xff;
		dgid.raw[10] = dgid.raw[11] = 0xff;
		memcpy(sgid.raw + 12, g + 32, 4);
		memcpy(dgid.raw + 12, g + 36, 4);
		ah->grh.traffic_class = g[21];
		ah->grh.hop_limit = 0xff;
	} else {
		memcpy(sgid.raw, grh->sgid.raw, 16);
		memcpy(dgid.raw, grh->dgid.raw, 16);
		ah->grh.flow_label = be32toh(grh->version_tclass_flow) & 0xfffff;
		ah->grh.traffic_class =
			(be32toh(grh->version_tclass_flow) >> 20) & 0xff;
		ah->grh.hop_limit = 0xff;
	}
	ah->is_global = 1;
	ah->grh.dgid = sgid; /* reply to the sender */
	ah->grh.sgid_index = 0;
	for (int i = 0; i < dev->ngids; i++)
		if (!memcmp(dev->gids[i].gid.raw, dgid.raw, 16))
			ah->grh.sgid_index = (uint8_t)i;
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	ah->port_num = port_num;
	return 0;
}

EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd,
					    struct ibv_wc *wc,
					    struct ibv_grh *grh,
					    uint8_t port_num)
{
	struct ibv_ah_attr a;
	int ret = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &a);

	if (ret)
		return ret_null(-ret);
	return ibv_create_ah(pd, &a);
}

EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			    uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return ret_errno(-EOPNOTSUPP);
}

EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			    uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return ret_errno(-EOPNOTSUPP);
}
