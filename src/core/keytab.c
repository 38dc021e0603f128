// SPDX-License-Identifier: MIT
/*
 * keytab.c - random, unique, quarantined keys (see keytab.h for the design).
 */
#include "keytab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"

#define IDX(key) ((key) >> 8)

static uint32_t hash_idx(uint32_t idx)
{
	/* The index is already random; mixing guards against clustering
	 * when a caller installs chosen keys (tests). */
	idx ^= idx >> 16;
	idx *= 0x45d9f3bu;
	idx ^= idx >> 16;
	return idx;
}

int ursa_keytab_init(struct ursa_keytab *kt, uint32_t cap)
{
	uint32_t c = 64;

	while (c < cap)
		c <<= 1;
	memset(kt, 0, sizeof(*kt));
	kt->slots = calloc(c, sizeof(*kt->slots));
	if (!kt->slots)
		return -ENOMEM;
	kt->cap = c;
	pthread_rwlock_init(&kt->lock, NULL);
	return 0;
}

void ursa_keytab_fini(struct ursa_keytab *kt)
{
	free(kt->slots);
	kt->slots = NULL;
	pthread_rwlock_destroy(&kt->lock);
}

/* Returns the slot holding idx (live or tombstone), or NULL. */
static struct ursa_kt_slot *find(struct ursa_keytab *kt, uint32_t idx)
{
	uint32_t mask = kt->cap - 1;

	for (uint32_t i = hash_idx(idx) & mask, n = 0; n < kt->cap;
	     i = (i + 1) & mask, n++) {
		struct ursa_kt_slot *s = &kt->slots[i];

		if (s->state == 0)
			return NULL;
		if (IDX(s->key) == idx)
			return s;
	}
	return NULL;
}

static int quarantined(struct ursa_keytab *kt, const struct ursa_kt_slot *s)
{
	return s->state == 2 && kt->frees - s->free_seq < URSA_KEY_QUARANTINE;
}

static void place(struct ursa_kt_slot *slots, uint32_t cap,
		  const struct ursa_kt_slot *src)
{
	uint32_t mask = cap - 1;

	for (uint32_t i = hash_idx(IDX(src->key)) & mask;; i = (i + 1) & mask) {
		if (slots[i].state == 0) {
			slots[i] = *src;
			return;
		}
	}
}

/* Rebuild at a size that keeps load under one half; drops tombstones that
 * left quarantine. Caller holds the write lock. */
static int rehash(struct ursa_keytab *kt)
{
	uint32_t keep = kt->live, cap = kt->cap;
	struct ursa_kt_slot *n;

	for (uint32_t i = 0; i < kt->cap; i++)
		if (quarantined(kt, &kt->slots[i]))
			keep++;
	while (keep * 2 >= cap)
		cap <<= 1;
	n = calloc(cap, sizeof(*n));
	if (!n)
		return -ENOMEM;
	kt->tombs = 0;
	for (uint32_t i = 0; i < kt->cap; i++) {
		struct ursa_kt_slot *s = &kt->slots[i];

		if (s->state == 1) {
			place(n, cap, s);
		} else if (quarantined(kt, s)) {
			place(n, cap, s);
			kt->tombs++;
		}
	}
	free(kt->slots);
	kt->slots = n;
	kt->cap = cap;
	return 0;
}

int ursa_keytab_add(struct ursa_keytab *kt, struct ursa_keyed *obj,
		    uint8_t kind, uint32_t *key)
{
	int ret = 0;

	pthread_rwlock_wrlock(&kt->lock);
	if ((kt->live + kt->tombs + 1) * 10 > kt->cap * 7) {
		ret = rehash(kt);
		if (ret)
			goto out;
	}
	for (int tries = 0;; tries++) {
		uint32_t k = (uint32_t)ursa_rand64();
		struct ursa_kt_slot *s;

		if (tries > 1000) {
			ret = -ENOSPC;
			goto out;
		}
		/* Index 0 is never used: a zeroed key must never match. */
		if (IDX(k) == 0)
			continue;
		s = find(kt, IDX(k));
		if (s && (s->state == 1 || quarantined(kt, s)))
			continue;
		if (s) { /* expired tombstone of the same index: reuse slot */
			kt->tombs--;
		} else {
			uint32_t mask = kt->cap - 1, i = hash_idx(IDX(k)) & mask;

			while (kt->slots[i].state == 1 ||
			       quarantined(kt, &kt->slots[i]))
				i = (i + 1) & mask;
			s = &kt->slots[i];
			if (s->state == 2)
				kt->tombs--;
		}
		s->key = k;
		s->state = 1;
		s->kind = kind;
		s->obj = obj;
		s->free_seq = 0;
		kt->live++;
		*key = k;
		break;
	}
out:
	pthread_rwlock_unlock(&kt->lock);
	return ret;
}

int ursa_keytab_del(struct ursa_keytab *kt, uint32_t key)
{
	struct ursa_kt_slot *s;
	int ret = -ENOENT;

	pthread_rwlock_wrlock(&kt->lock);
	s = find(kt, IDX(key));
	if (s && s->state == 1) {
		s->state = 2;
		s->obj = NULL;
		s->free_seq = kt->frees++;
		kt->live--;
		kt->tombs++;
		ret = 0;
	}
	pthread_rwlock_unlock(&kt->lock);
	return ret;
}

int ursa_keytab_rekey(struct ursa_keytab *kt, uint32_t old_key,
		      uint32_t new_key)
{
	struct ursa_kt_slot *s;
	int ret = -ENOENT;

	if (IDX(old_key) != IDX(new_key))
		return -EINVAL;
	pthread_rwlock_wrlock(&kt->lock);
	s = find(kt, IDX(old_key));
	if (s && s->state == 1) {
		s->key = new_key;
		ret = 0;
	}
	pthread_rwlock_unlock(&kt->lock);
	return ret;
}

struct ursa_keyed *ursa_keytab_get(struct ursa_keytab *kt, uint32_t key,
				   uint8_t kind_mask, uint8_t *kind)
{
	struct ursa_keyed *o = NULL;
	struct ursa_kt_slot *s;

	pthread_rwlock_rdlock(&kt->lock);
	s = find(kt, IDX(key));
	if (s && s->state == 1 && s->key == key && (s->kind & kind_mask)) {
		o = s->obj;
		/* Relaxed is enough: the rwlock orders this increment before
		 * the deregistering thread's removal of the key. */
		atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
		if (kind)
			*kind = s->kind;
	}
	pthread_rwlock_unlock(&kt->lock);
	return o;
}

void ursa_keytab_each(struct ursa_keytab *kt, uint8_t kind_mask,
		      void (*fn)(struct ursa_keyed *obj, void *arg), void *arg)
{
	pthread_rwlock_rdlock(&kt->lock);
	for (uint32_t i = 0; i < kt->cap; i++)
		if (kt->slots[i].state == 1 && (kt->slots[i].kind & kind_mask))
			fn(kt->slots[i].obj, arg);
	pthread_rwlock_unlock(&kt->lock);
}
