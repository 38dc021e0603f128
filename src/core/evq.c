// SPDX-License-Identifier: MIT
/*
 * evq.c - event queues behind a real file descriptor.
 *
 * Completion channels and the context's async event fd must be descriptors
 * an application can poll()/epoll() and make non-blocking. Each queue is an
 * eventfd in semaphore mode that counts queued items plus a locked FIFO of
 * the items themselves: a reader first takes one count from the eventfd (this
 * is where it blocks), then pops the FIFO. Destroying a CQ drops its queued
 * events; the reader then finds the FIFO empty and waits again, so a stale
 * count never hands out a dangling pointer.
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int ursa_evq_init(struct ursa_evq *q, bool nonblock)
{
	memset(q, 0, sizeof(*q));
	q->fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC |
			       (nonblock ? EFD_NONBLOCK : 0));
	if (q->fd < 0)
		return -errno;
	pthread_mutex_init(&q->lock, NULL);
	return 0;
}

void ursa_evq_fini(struct ursa_evq *q, void (*free_item)(void *))
{
	for (uint32_t i = 0; free_item && i < q->count; i++)
		free_item(q->items[(q->head + i) % q->cap]);
	q->count = 0;
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	free(q->items);
	q->items = NULL;
	pthread_mutex_destroy(&q->lock);
}

int ursa_evq_push(struct ursa_evq *q, void *item)
{
	uint64_t one = 1;

	pthread_mutex_lock(&q->lock);
	if (q->count == q->cap) {
		uint32_t nc = q->cap ? q->cap * 2 : 16;
		void **n = malloc(nc * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&q->lock);
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < q->count; i++)
			n[i] = q->items[(q->head + i) % q->cap];
		free(q->items);
		q->items = n;
		q->cap = nc;
		q->head = 0;
	}
	q->items[(q->head + q->count) % q->cap] = item;
	q->count++;
	pthread_mutex_unlock(&q->lock);
	if (write(q->fd, &one, sizeof(one)) != sizeof(one))
		return -errno;
	return 0;
}

int ursa_evq_pop(struct ursa_evq *q, void **item, void (*taken)(void *))
{
	for (;;) {
		uint64_t v;
		ssize_t n = read(q->fd, &v, sizeof(v));

		/* EINTR goes back to the caller, as from libibverbs' one
		 * read(): programs stop a blocking ibv_get_cq_event with a
		 * signal (qperf's test timer) */
		if (n < 0)
			return -errno;
		pthread_mutex_lock(&q->lock);
		if (q->count) {
			*item = q->items[q->head];
			q->head = (q->head + 1) % q->cap;
			q->count--;
			if (taken)
				taken(*item);
			pthread_mutex_unlock(&q->lock);
			return 0;
		}
		pthread_mutex_unlock(&q->lock);
		/* The count belonged to a dropped item: wait again. */
	}
}

/* Drops the queued items match() accepts; returns how many. */
static int drop_where(struct ursa_evq *q, bool (*match)(void *, const void *),
		      const void *arg, void (*free_item)(void *))
{
	uint32_t o = 0, dropped;

	pthread_mutex_lock(&q->lock);
	for (uint32_t i = 0; i < q->count; i++) {
		void *it = q->items[(q->head + i) % q->cap];

		if (!match(it, arg))
			q->items[(q->head + o++) % q->cap] = it;
		else if (free_item)
			free_item(it);
	}
	dropped = q->count - o;
	q->count = o;
	pthread_mutex_unlock(&q->lock);
	return (int)dropped;
}

static bool same(void *it, const void *item)
{
	return it == item;
}

int ursa_evq_drop(struct ursa_evq *q, void *item)
{
	return drop_where(q, same, item, NULL);
}

/* --- the context's async events ----------------------------------------
 *
 * As in the kernel and libibverbs: destroying a QP, CQ or SRQ drops its
 * events not yet read (the kernel's uverbs removes them from the file's
 * list), and waits until every one read has been acknowledged (libibverbs'
 * destroy verbs wait for events_completed to reach the count the kernel
 * reported). So an application's async thread never holds an event whose
 * object is gone: UCX reads a QP's LAST_WQE_REACHED on its async thread
 * while its main thread destroys the QP and then tears down the table the
 * handler looks the QP up in; an event handed out late crashed it there.
 */

enum async_kind { ASYNC_PORT, ASYNC_QP, ASYNC_CQ, ASYNC_SRQ };

static enum async_kind async_kind(enum ibv_event_type type)
{
	switch (type) {
	case IBV_EVENT_CQ_ERR:
		return ASYNC_CQ;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return ASYNC_QP;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return ASYNC_SRQ;
	default:
		return ASYNC_PORT;
	}
}

static struct ursa_cq *cq_of(struct ibv_cq *cq)
{
	return container_of((struct ibv_cq_ex *)cq, struct ursa_cq, ex);
}

void ursa_async_event(struct ursa_ctx *ctx, enum ibv_event_type type,
		      void *obj)
{
	struct ibv_async_event *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return;
	ev->event_type = type;
	switch (async_kind(type)) {
	case ASYNC_CQ:
		ev->element.cq = obj;
		break;
	case ASYNC_QP:
		ev->element.qp = obj;
		break;
	case ASYNC_SRQ:
		ev->element.srq = obj;
		break;
	case ASYNC_PORT:
		ev->element.port_num = 1;
		break;
	}
	ursa_dbg("async event %d (enum ibv_event_type)", (int)type);
	if (ursa_evq_push(&ctx->async, ev))
		free(ev);
}

/* (under the queue's lock: ursa_evq_pop) */
static void async_taken(void *item)
{
	struct ibv_async_event *ev = item;

	switch (async_kind(ev->event_type)) {
	case ASYNC_QP:
		atomic_fetch_add(&container_of(ev->element.qp, struct ursa_qp,
					       ex.qp_base)->async_events, 1);
		break;
	case ASYNC_CQ:
		atomic_fetch_add(&cq_of(ev->element.cq)->async_events, 1);
		break;
	case ASYNC_SRQ:
		atomic_fetch_add(&container_of(ev->element.srq, struct ursa_srq,
					       ibv)->async_events, 1);
		break;
	case ASYNC_PORT:
		break;
	}
}

int ursa_async_pop(struct ursa_ctx *ctx, struct ibv_async_event **ev)
{
	return ursa_evq_pop(&ctx->async, (void **)ev, async_taken);
}

/* The object's acknowledged count, its mutex and condition variable: the
 * fields of the libibverbs structure that its destroy verb waits on. */
static void acked(pthread_mutex_t *mu, pthread_cond_t *cv, uint32_t *n)
{
	pthread_mutex_lock(mu);
	(*n)++;
	pthread_cond_broadcast(cv);
	pthread_mutex_unlock(mu);
}

void ursa_async_acked(const struct ibv_async_event *ev)
{
	switch (async_kind(ev->event_type)) {
	case ASYNC_QP:
		acked(&ev->element.qp->mutex, &ev->element.qp->cond,
		      &ev->element.qp->events_completed);
		break;
	case ASYNC_CQ:
		acked(&ev->element.cq->mutex, &ev->element.cq->cond,
		      &ev->element.cq->async_events_completed);
		break;
	case ASYNC_SRQ:
		acked(&ev->element.srq->mutex, &ev->element.srq->cond,
		      &ev->element.srq->events_completed);
		break;
	case ASYNC_PORT:
		break;
	}
}

static bool names(void *item, const void *obj)
{
	const struct ibv_async_event *ev = item;

	switch (async_kind(ev->event_type)) {
	case ASYNC_QP:
		return ev->element.qp == obj;
	case ASYNC_CQ:
		return ev->element.cq == obj;
	case ASYNC_SRQ:
		return ev->element.srq == obj;
	case ASYNC_PORT:
		break;
	}
	return false;
}

static void forget(struct ursa_ctx *ctx, const void *obj,
		   const atomic_uint *read, pthread_mutex_t *mu,
		   pthread_cond_t *cv, const uint32_t *completed)
{
	drop_where(&ctx->async, names, obj, free);
	pthread_mutex_lock(mu);
	while (*completed != atomic_load(read))
		pthread_cond_wait(cv, mu);
	pthread_mutex_unlock(mu);
}

void ursa_async_forget_qp(struct ursa_qp *qp)
{
	struct ibv_qp *q = &qp->ex.qp_base;

	forget(qp->ctx, q, &qp->async_events, &q->mutex, &q->cond,
	       &q->events_completed);
}

void ursa_async_forget_cq(struct ursa_cq *cq)
{
	struct ibv_cq *c = ibv_cq_ex_to_cq(&cq->ex);

	forget(to_uctx(cq->ex.context), c, &cq->async_events, &c->mutex,
	       &c->cond, &c->async_events_completed);
}

void ursa_async_forget_srq(struct ursa_srq *srq)
{
	forget(to_uctx(srq->ibv.context), &srq->ibv, &srq->async_events,
	       &srq->ibv.mutex, &srq->ibv.cond, &srq->ibv.events_completed);
}
