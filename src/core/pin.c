// SPDX-License-Identifier: MIT
/*
 * pin.c - the reference-counted pin map (see pin.h).
 */
#include "pin.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ursa_pinmap_init(struct ursa_pinmap *pm, const struct ursa_pin_ops *ops,
		      uint64_t limit)
{
	memset(pm, 0, sizeof(*pm));
	pthread_mutex_init(&pm->mu, NULL);
	pm->ops = ops;
	pm->limit = limit;
}

void ursa_pinmap_fini(struct ursa_pinmap *pm)
{
	free(pm->segs);
	pm->segs = NULL;
	pm->nsegs = pm->cap = 0;
	pthread_mutex_destroy(&pm->mu);
}

static int reserve(struct ursa_pinmap *pm, size_t extra)
{
	size_t want = pm->nsegs + extra;
	struct ursa_pin_seg *n;

	if (want <= pm->cap)
		return 0;
	want = want < 16 ? 16 : want * 2;
	n = realloc(pm->segs, want * sizeof(*n));
	if (!n)
		return -ENOMEM;
	pm->segs = n;
	pm->cap = want;
	return 0;
}

static void insert_at(struct ursa_pinmap *pm, size_t i,
		      const struct ursa_pin_seg *s)
{
	memmove(&pm->segs[i + 1], &pm->segs[i],
		(pm->nsegs - i) * sizeof(*pm->segs));
	pm->segs[i] = *s;
	pm->nsegs++;
}

/* Make x a segment boundary (caller reserved room for one more segment). */
static void split_at(struct ursa_pinmap *pm, uintptr_t x)
{
	for (size_t i = 0; i < pm->nsegs; i++) {
		struct ursa_pin_seg *s = &pm->segs[i];

		if (s->start < x && x < s->end) {
			struct ursa_pin_seg tail = { x, s->end, s->count, s->stale };

			s->end = x;
			insert_at(pm, i + 1, &tail);
			return;
		}
	}
}

static void merge(struct ursa_pinmap *pm)
{
	size_t o = 0;

	for (size_t i = 0; i < pm->nsegs; i++) {
		if (pm->segs[i].count == 0)
			continue;
		if (o && pm->segs[o - 1].end == pm->segs[i].start &&
		    pm->segs[o - 1].count == pm->segs[i].count &&
		    pm->segs[o - 1].stale == pm->segs[i].stale)
			pm->segs[o - 1].end = pm->segs[i].end;
		else
			pm->segs[o++] = pm->segs[i];
	}
	pm->nsegs = o;
}

int ursa_pin(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end,
	     uint64_t *newly)
{
	uint64_t add = 0;
	uintptr_t cur;
	size_t gaps = 0;
	int ret;

	if (start >= end)
		return -EINVAL;
	pthread_mutex_lock(&pm->mu);
	/* Pass 1: how many bytes are not pinned yet, and in how many gaps. */
	cur = start;
	for (size_t i = 0; i < pm->nsegs && cur < end; i++) {
		struct ursa_pin_seg *s = &pm->segs[i];

		if (s->end <= cur)
			continue;
		if (s->start >= end)
			break;
		if (s->start > cur) {
			add += s->start - cur;
			gaps++;
		}
		cur = s->end;
	}
	if (cur < end) {
		add += end - cur;
		gaps++;
	}
	if (newly)
		*newly = add;
	if (pm->pinned + add > pm->limit) {
		ret = -EDQUOT;
		goto out;
	}
	ret = reserve(pm, gaps + 2);
	if (ret)
		goto out;
	split_at(pm, start);
	split_at(pm, end);
	/* Pass 2: lock the gaps, bump the covered segments. */
	cur = start;
	for (size_t i = 0; cur < end; i++) {
		struct ursa_pin_seg *s = i < pm->nsegs ? &pm->segs[i] : NULL;
		uintptr_t gap_end;

		if (s && s->end <= cur)
			continue;
		gap_end = (s && s->start < end) ? s->start : end;
		if (gap_end > cur) {
			struct ursa_pin_seg g = { cur, gap_end, 1, false };

			ret = pm->ops->lock(cur, gap_end - cur);
			if (ret) {
				/* mlock can fail after locking part of the
				 * range: release that part too. */
				pm->ops->unlock(cur, gap_end - cur);
				/* Undo: unpin what this call pinned so far. */
				pthread_mutex_unlock(&pm->mu);
				if (cur > start)
					ursa_unpin(pm, start, cur);
				return ret;
			}
			insert_at(pm, i, &g);
			pm->pinned += gap_end - cur;
			cur = gap_end;
			continue;
		}
		/* (split_at made the segment end inside the range) */
		if (s->stale && !pm->ops->lock(s->start, s->end - s->start))
			s->stale = false;
		s->count++;
		cur = s->end;
	}
	merge(pm);
out:
	pthread_mutex_unlock(&pm->mu);
	return ret;
}

void ursa_unpin(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end)
{
	if (start >= end)
		return;
	pthread_mutex_lock(&pm->mu);
	if (reserve(pm, 2) == 0) {
		split_at(pm, start);
		split_at(pm, end);
	}
	for (size_t i = 0; i < pm->nsegs; i++) {
		struct ursa_pin_seg *s = &pm->segs[i];

		if (s->end <= start || s->start >= end || !s->count)
			continue;
		/* If reserve() failed the segment may stick out of the range;
		 * then we keep it pinned (a leak of a lock, never a lost one). */
		if (s->start < start || s->end > end)
			continue;
		if (--s->count == 0) {
			pm->ops->unlock(s->start, s->end - s->start);
			pm->pinned -= s->end - s->start;
		}
	}
	merge(pm);
	pthread_mutex_unlock(&pm->mu);
}

void ursa_pin_gone(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end)
{
	pthread_mutex_lock(&pm->mu);
	/* (without room to split, whole segments: locking pages that are
	 * still locked again changes nothing) */
	if (reserve(pm, 2) == 0) {
		split_at(pm, start);
		split_at(pm, end);
	}
	for (size_t i = 0; i < pm->nsegs; i++)
		if (pm->segs[i].count && pm->segs[i].start < end &&
		    pm->segs[i].end > start)
			pm->segs[i].stale = true;
	merge(pm);
	pthread_mutex_unlock(&pm->mu);
}

uint64_t ursa_pinned_bytes(struct ursa_pinmap *pm)
{
	uint64_t v;

	pthread_mutex_lock(&pm->mu);
	v = pm->pinned;
	pthread_mutex_unlock(&pm->mu);
	return v;
}

bool ursa_pinned_any(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end)
{
	bool any = false;

	pthread_mutex_lock(&pm->mu);
	for (size_t i = 0; i < pm->nsegs && !any; i++)
		any = pm->segs[i].count && pm->segs[i].start < end &&
		      pm->segs[i].end > start;
	pthread_mutex_unlock(&pm->mu);
	return any;
}

int ursa_pin_refresh(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end)
{
	return pm->ops->lock(start, end - start);
}
