// SPDX-License-Identifier: MIT
/*
 * cq.c - completion queues.
 *
 * A CQ is a ring of struct ibv_wc in user memory. Producers are engines (the
 * requester's for send completions, whichever engine executed an incoming
 * request for receive completions), the consumer is the application's poll.
 * Both sides take the CQ's mutex, which costs no system call when it is not
 * contended: polling stays in user space.
 *
 * Notification (IBTA 11.4.2.2): ibv_req_notify_cq arms the CQ once; the
 * next completion (or, when armed solicited-only, the next solicited or
 * error completion) disarms it and queues one event on the completion
 * channel, whose descriptor becomes readable. A completion that does not fit
 * is lost, the CQ enters the overflow state and an IBV_EVENT_CQ_ERR async
 * event is raised (IBTA 11.6.3.1 "CQ overrun").
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ursa_cq_create(struct ursa_ctx *ctx, int cqe, struct ibv_comp_channel *ch,
		   void *cq_context, struct ursa_cq **out)
{
	struct ursa_cq *cq;
	uint32_t n = 1;

	if (cqe < 1 || cqe > URSA_MAX_CQE)
		return -EINVAL;
	/* One spare entry, rounded to a power of two, as mlx5 sizes CQs:
	 * applications such as perftest size CQs exactly and rely on it. */
	while (n < (uint32_t)cqe + 1)
		n <<= 1;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return -ENOMEM;
	cq->wc = calloc(n, sizeof(*cq->wc));
	if (!cq->wc) {
		free(cq);
		return -ENOMEM;
	}
	cq->size = n;
	pthread_mutex_init(&cq->lock, NULL);
	pthread_mutex_init(&cq->ex.mutex, NULL);
	pthread_cond_init(&cq->ex.cond, NULL);
	cq->ex.context = &ctx->vctx.context;
	cq->ex.channel = ch;
	cq->ex.cq_context = cq_context;
	cq->ex.cqe = (int)n - 1;
	cq->ex.handle = (uint32_t)ursa_rand64();
	if (ch)
		ch->refcnt++;
	atomic_fetch_add(&ctx->nobjs, 1);
	*out = cq;
	return 0;
}

int ursa_cq_destroy(struct ursa_cq *cq)
{
	struct ursa_ctx *ctx = to_uctx(cq->ex.context);
	struct ibv_comp_channel *ch = cq->ex.channel;

	if (atomic_load(&cq->refs))
		return -EBUSY;
	ursa_async_forget_cq(cq);
	if (ch) {
		ursa_evq_drop(&to_uch(ch)->q, cq);
		/* As libibverbs does: wait until every event the application
		 * received has been acknowledged (ibv_ack_cq_events). */
		pthread_mutex_lock(&cq->ex.mutex);
		while (cq->ex.comp_events_completed !=
		       atomic_load(&cq->comp_events))
			pthread_cond_wait(&cq->ex.cond, &cq->ex.mutex);
		pthread_mutex_unlock(&cq->ex.mutex);
		ch->refcnt--;
	}
	atomic_fetch_sub(&ctx->nobjs, 1);
	pthread_mutex_destroy(&cq->lock);
	free(cq->wc);
	free(cq->ts);
	free(cq);
	return 0;
}

int ursa_cq_resize(struct ursa_cq *cq, int cqe)
{
	struct ibv_wc *n;
	uint64_t *nts;
	uint32_t sz = 1;

	if (cqe < 1 || cqe > URSA_MAX_CQE)
		return -EINVAL;
	while (sz < (uint32_t)cqe + 1)
		sz <<= 1;
	pthread_mutex_lock(&cq->lock);
	if (sz < cq->count) {
		pthread_mutex_unlock(&cq->lock);
		return -EINVAL;
	}
	n = calloc(sz, sizeof(*n));
	nts = cq->ts ? calloc(sz, sizeof(*nts)) : NULL;
	if (!n || (cq->ts && !nts)) {
		pthread_mutex_unlock(&cq->lock);
		free(n);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < cq->count; i++) {
		n[i] = cq->wc[(cq->head + i) & (cq->size - 1)];
		if (nts)
			nts[i] = cq->ts[(cq->head + i) & (cq->size - 1)];
	}
	free(cq->wc);
	free(cq->ts);
	cq->wc = n;
	cq->ts = nts;
	cq->size = sz;
	cq->head = 0;
	cq->ex.cqe = (int)sz - 1;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

int ursa_cq_push(struct ursa_cq *cq, const struct ibv_wc *wc, bool solicited)
{
	bool fire = false, overflow = false, cq_lost = false;

	pthread_mutex_lock(&cq->lock);
	if (cq->overflow || cq->count == cq->size) {
		overflow = !cq->overflow;
		cq->overflow = true;
		cq_lost = true;
	} else {
		cq->wc[(cq->head + cq->count) & (cq->size - 1)] = *wc;
		if (cq->ts)
			cq->ts[(cq->head + cq->count) & (cq->size - 1)] =
				ursa_now_ns();
		cq->count++;
		if (cq->armed == 1 ||
		    (cq->armed == 2 && (solicited || wc->status)))
			fire = true;
		if (fire)
			cq->armed = 0;
	}
	pthread_mutex_unlock(&cq->lock);
	if (overflow) {
		ursa_err("CQ %p overrun: completion of wr_id %llu lost (raise the CQ size)",
			 (void *)cq, (unsigned long long)wc->wr_id);
		ursa_async_event(to_uctx(cq->ex.context), IBV_EVENT_CQ_ERR,
				 ibv_cq_ex_to_cq(&cq->ex));
		return -ENOSPC;
	}
	if (!fire && cq_lost)
		return -ENOSPC;
	if (fire && cq->ex.channel)
		ursa_evq_push(&to_uch(cq->ex.channel)->q, cq);
	return 0;
}

int ursa_cq_poll(struct ursa_cq *cq, int n, struct ibv_wc *wc)
{
	int got = 0;

	if (n < 0)
		return -EINVAL;
	pthread_mutex_lock(&cq->lock);
	while (got < n && cq->count) {
		if (cq->ts)
			cq->cur_ts = cq->ts[cq->head];	/* the last one's */
		wc[got++] = cq->wc[cq->head];
		cq->head = (cq->head + 1) & (cq->size - 1);
		cq->count--;
	}
	pthread_mutex_unlock(&cq->lock);
	return got;
}

/* Remove the completions of QP qpn, keeping the others in order (keep_recv:
 * not its receive completions, which came from an SRQ the QP shares). */
void ursa_cq_clean(struct ursa_cq *cq, uint32_t qpn, bool keep_recv)
{
	uint32_t kept = 0, mask;

	pthread_mutex_lock(&cq->lock);
	mask = cq->size - 1;
	for (uint32_t i = 0; i < cq->count; i++) {
		const struct ibv_wc *w = &cq->wc[(cq->head + i) & mask];

		if (w->qp_num == qpn && !(keep_recv && (w->opcode & IBV_WC_RECV)))
			continue;
		if (cq->ts)
			cq->ts[(cq->head + kept) & mask] = cq->ts[(cq->head + i) & mask];
		cq->wc[(cq->head + kept++) & mask] = *w;
	}
	cq->count = kept;
	pthread_mutex_unlock(&cq->lock);
}

int ursa_cq_arm(struct ursa_cq *cq, int solicited_only)
{
	pthread_mutex_lock(&cq->lock);
	/* Solicited-only never weakens an "any completion" arm. */
	if (cq->armed != 1)
		cq->armed = solicited_only ? 2 : 1;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}
