// SPDX-License-Identifier: MIT
/*
 * rcache.c - the registration cache (design in rcache.h): a list of parked
 * pinned ranges, most recently parked first, evicted from the tail.
 */
#include "rcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pin.h"
#include "../util/util.h"


void ursa_rcache_init(struct ursa_rcache *rc, struct ursa_pinmap *pins)
{
	memset(rc, 0, sizeof(*rc));
	pthread_mutex_init(&rc->mu, NULL);
	rc->pins = pins;
	rc->max_n = (uint32_t)ursa_cfg()->rcache_entries;
	rc->max_bytes = (uint64_t)ursa_cfg()->rcache_mb << 20;
	/* Parked pins must leave room under the limit for live MRs. */
	if (pins->limit != UINT64_MAX)
		rc->max_bytes = MIN(rc->max_bytes, pins->limit / 2);
	if (!ursa_cfg()->rcache)
		rc->max_n = 0;
}

static void unlink_ent(struct ursa_rcache *rc, struct ursa_rcache_ent *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		rc->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		rc->tail = e->prev;
	rc->n--;
	rc->bytes -= e->end - e->start;
}

static void release(struct ursa_rcache *rc, struct ursa_rcache_ent *e)
{
	ursa_unpin(rc->pins, e->start, e->end);
	ursa_mtt_free(&e->mtt);
	free(e);
}

int ursa_rcache_take(struct ursa_rcache *rc, uintptr_t start, uintptr_t end,
		     struct ursa_mtt *mtt)
{
	struct ursa_rcache_ent *e;
	int ret;

	pthread_mutex_lock(&rc->mu);
	for (e = rc->head; e; e = e->next)
		if (e->start == start && e->end == end)
			break;
	if (e)
		unlink_ent(rc, e);
	else
		rc->misses++;
	pthread_mutex_unlock(&rc->mu);
	if (!e)
		return -ENOENT;
	/*
	 * The range may have been unmapped and mapped again since it was
	 * parked (free and malloc, munmap and mmap, brk): mlock again so that
	 * what is mapped there now is what is locked. Pages that are still
	 * the locked ones are only walked. If nothing is mapped there any
	 * more, the entry is dead: release it (munlock of the gone pages is
	 * harmless) and let the caller register afresh.
	 */
	ret = ursa_pin_refresh(rc->pins, start, end);
	if (ret)
		release(rc, e);
	else
		*mtt = e->mtt;
	pthread_mutex_lock(&rc->mu);
	if (ret) {
		rc->stale++;
		rc->misses++;
	} else {
		rc->hits++;
	}
	pthread_mutex_unlock(&rc->mu);
	if (ret)
		return -ENOENT;
	free(e);
	return 0;
}

void ursa_rcache_park(struct ursa_rcache *rc, uintptr_t start, uintptr_t end,
		      struct ursa_mtt *mtt)
{
	struct ursa_rcache_ent *e = NULL, *victims = NULL;

	if (rc->max_n && end - start <= rc->max_bytes)
		e = calloc(1, sizeof(*e));
	if (!e) {
		ursa_unpin(rc->pins, start, end);
		ursa_mtt_free(mtt);
		return;
	}
	e->start = start;
	e->end = end;
	e->mtt = *mtt;
	memset(mtt, 0, sizeof(*mtt));
	pthread_mutex_lock(&rc->mu);
	e->next = rc->head;
	if (rc->head)
		rc->head->prev = e;
	rc->head = e;
	if (!rc->tail)
		rc->tail = e;
	rc->n++;
	rc->bytes += end - start;
	while (rc->n > rc->max_n || rc->bytes > rc->max_bytes) {
		struct ursa_rcache_ent *v = rc->tail;

		unlink_ent(rc, v);
		v->next = victims;
		victims = v;
		rc->evictions++;
	}
	pthread_mutex_unlock(&rc->mu);
	/* (munlock outside the lock: it walks every page) */
	while (victims) {
		struct ursa_rcache_ent *v = victims;

		victims = v->next;
		release(rc, v);
	}
}

uint64_t ursa_rcache_drain(struct ursa_rcache *rc)
{
	struct ursa_rcache_ent *all;
	uint64_t bytes;

	pthread_mutex_lock(&rc->mu);
	all = rc->head;
	bytes = rc->bytes;
	rc->evictions += rc->n;
	rc->head = rc->tail = NULL;
	rc->n = 0;
	rc->bytes = 0;
	pthread_mutex_unlock(&rc->mu);
	while (all) {
		struct ursa_rcache_ent *v = all;

		all = v->next;
		release(rc, v);
	}
	return bytes;
}
