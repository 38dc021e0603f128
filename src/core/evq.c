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

/* What an event names, and the counts its destroy waits on: the object,
 * ursa's count of its events read, and the libibverbs structure's mutex,
 * condition variable and acknowledged count. False for a port's event. */
struct async_obj {
	const void *obj;
	atomic_uint *read;
	pthread_mutex_t *mu;
	pthread_cond_t *cv;
	uint32_t *completed;
};

static bool async_obj(const struct ibv_async_event *ev, struct async_obj *o)
{
	switch (async_kind(ev->event_type)) {
	case ASYNC_QP: {
		struct ibv_qp *q = ev->element.qp;

		*o = (struct async_obj){ q, &container_of(q, struct ursa_qp,
			ex.qp_base)->async_events, &q->mutex, &q->cond,
			&q->events_completed };
		return true;
	}
	case ASYNC_CQ: {
		struct ibv_cq *c = ev->element.cq;

		*o = (struct async_obj){ c, &cq_of(c)->async_events, &c->mutex,
			&c->cond, &c->async_events_completed };
		return true;
	}
	case ASYNC_SRQ: {
		struct ibv_srq *r = ev->element.srq;

		*o = (struct async_obj){ r, &container_of(r, struct ursa_srq,
			ibv)->async_events, &r->mutex, &r->cond,
			&r->events_completed };
		return true;
	}
	case ASYNC_PORT:
		break;
	}
	return false;
}

/* (under the queue's lock: ursa_evq_pop) */
static void async_taken(void *item)
{
	struct async_obj o;

	if (async_obj(item, &o))
		atomic_fetch_add(o.read, 1);
}

int ursa_async_pop(struct ursa_ctx *ctx, struct ibv_async_event **ev)
{
	return ursa_evq_pop(&ctx->async, (void **)ev, async_taken);
}

void ursa_async_acked(const struct ibv_async_event *ev)
{
	struct async_obj o;

	if (!async_obj(ev, &o))
		return;
	pthread_mutex_lock(o.mu);
	(*o.completed)++;
	pthread_cond_broadcast(o.cv);
	pthread_mutex_unlock(o.mu);
}

static bool names(void *item, const void *obj)
{
	struct async_obj o;

	return async_obj(item, &o) && o.obj == obj;
}

/* ev: any event of the object (its kind and element) */
static void forget(struct ursa_ctx *ctx, const struct ibv_async_event *ev)
{
	struct async_obj o;

	if (!async_obj(ev, &o))
		return;
	drop_where(&ctx->async, names, o.obj, free);
	pthread_mutex_lock(o.mu);
	while (*o.completed != atomic_load(o.read))
		pthread_cond_wait(o.cv, o.mu);
	pthread_mutex_unlock(o.mu);
}

void ursa_async_forget_qp(struct ursa_qp *qp)
{
	struct ibv_async_event ev = { .element.qp = &qp->ex.qp_base,
				      .event_type = IBV_EVENT_QP_FATAL };

	forget(qp->ctx, &ev);
}

void ursa_async_forget_cq(struct ursa_cq *cq)
{
	struct ibv_async_event ev = { .element.cq = ibv_cq_ex_to_cq(&cq->ex),
				      .event_type = IBV_EVENT_CQ_ERR };

	forget(to_uctx(cq->ex.context), &ev);
}

void ursa_async_forget_srq(struct ursa_srq *srq)
{
	struct ibv_async_event ev = { .element.srq = &srq->ibv,
				      .event_type = IBV_EVENT_SRQ_ERR };

	forget(to_uctx(srq->ibv.context), &ev);
}
