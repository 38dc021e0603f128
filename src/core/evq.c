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

int ursa_evq_pop(struct ursa_evq *q, void **item)
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
			pthread_mutex_unlock(&q->lock);
			return 0;
		}
		pthread_mutex_unlock(&q->lock);
		/* The count belonged to a dropped item: wait again. */
	}
}

int ursa_evq_drop(struct ursa_evq *q, void *item)
{
	uint32_t o = 0, dropped;

	pthread_mutex_lock(&q->lock);
	for (uint32_t i = 0; i < q->count; i++) {
		void *it = q->items[(q->head + i) % q->cap];

		if (it != item)
			q->items[(q->head + o++) % q->cap] = it;
	}
	dropped = q->count - o;
	q->count = o;
	pthread_mutex_unlock(&q->lock);
	return (int)dropped;
}

void ursa_async_event(struct ursa_ctx *ctx, enum ibv_event_type type,
		      void *obj)
{
	struct ibv_async_event *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return;
	ev->event_type = type;
	switch (type) {
	case IBV_EVENT_CQ_ERR:
		ev->element.cq = obj;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		ev->element.qp = obj;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		ev->element.srq = obj;
		break;
	default:
		ev->element.port_num = 1;
		break;
	}
	ursa_dbg("async event %d (enum ibv_event_type)", (int)type);
	if (ursa_evq_push(&ctx->async, ev))
		free(ev);
}
