// SPDX-License-Identifier: MIT
/*
 * kv_table.c - the ursa-kv server's table: one region (header, buckets,
 * heap of value blocks) that clients read with RDMA READ while the server
 * changes it.
 *
 * The server is the only writer. A PUT writes the value into a fresh block
 * (out of place), then the block's header (version, lengths, checksum),
 * then switches the key's slot to it: new version, fields, and last the
 * slot's check word. A one-sided reader that reads a slot halfway through
 * sees a check word that does not match; one that follows a slot to a
 * block that has since been freed and reused sees a version or checksum
 * that does not match. Either way it reads again (client.c). Freed blocks
 * wait KV_QUARANTINE seconds before reuse so that this stays rare.
 *
 * A block's version is 0 while it is not what a slot points to: before
 * its slot switches to it and after the slot moves on. So a client may
 * cache key -> block and read the block alone (one READ instead of two):
 * a version that is not 0 and a matching checksum and key mean the block
 * is the key's current value, or one being installed right now.
 *
 * Blocks come from a buddy allocator: power-of-two sizes from 64 bytes
 * to 2 MiB, split on demand and merged with their buddy when freed, so a
 * heap that once held many small values can hold large ones again. The
 * free lists are linked through the free blocks themselves (whose version
 * word stays 0, so a reader never takes one for a value).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kv_verbs.h"

#define KV_QUARANTINE 0.05
#define UNIT(off) ((off) >> KV_MIN_CLASS)

static unsigned size_class(uint64_t n)
{
	unsigned c = KV_MIN_CLASS;

	while ((1ull << c) < n)
		c++;
	return c;
}

/* A free block's links (over the header of the value it no longer is). */
struct kv_free {
	uint64_t ver;		/* 0 */
	uint64_t next, prev;	/* offset + 1; 0: none */
};

static struct kv_free *fb(struct kv_table *t, uint64_t off)
{
	return (struct kv_free *)(t->heap + off);
}

static void push(struct kv_table *t, uint64_t off, unsigned c)
{
	struct kv_free *f = fb(t, off);

	f->ver = 0;
	f->prev = 0;
	f->next = t->head[c];
	if (t->head[c])
		fb(t, t->head[c] - 1)->prev = off + 1;
	t->head[c] = off + 1;
	t->free_cls[UNIT(off)] = (uint8_t)c;
}

static void unlink_free(struct kv_table *t, uint64_t off, unsigned c)
{
	struct kv_free *f = fb(t, off);

	if (f->prev)
		fb(t, f->prev - 1)->next = f->next;
	else
		t->head[c] = f->next;
	if (f->next)
		fb(t, f->next - 1)->prev = f->prev;
	t->free_cls[UNIT(off)] = 0;
}

/* Give a block back, merged with its buddy as far as they are free. */
static void merge_free(struct kv_table *t, uint64_t off, unsigned c)
{
	while (c < KV_MAX_CLASS) {
		uint64_t buddy = off ^ (1ull << c);

		if (buddy >= t->heap_len || t->free_cls[UNIT(buddy)] != c)
			break;
		unlink_free(t, buddy, c);
		off &= ~(1ull << c);
		c++;
	}
	push(t, off, c);
}

/* Quarantined blocks freed before `before` become free. */
static void drain(struct kv_table *t, double before)
{
	struct kv_quarantine *q = &t->q;

	while (q->n && q->v[q->head].t < before) {
		merge_free(t, q->v[q->head].off, q->v[q->head].cls);
		q->head = (q->head + 1) % q->cap;
		q->n--;
	}
}

/*
 * The table lives in memory that clients on this host can map (ursa's
 * ursa_mem_alloc, looked up at run time so that the server also runs on
 * other libibverbs): their one-sided GETs are then plain loads, no system
 * call per READ. Elsewhere, private anonymous memory.
 */
static void *table_alloc(size_t len)
{
	int (*alloc)(size_t, void **) = (int (*)(size_t, void **))
		dlsym(RTLD_DEFAULT, "ursa_mem_alloc");
	void *p;

	if (alloc && !alloc(len, &p))
		return p;
	return mmap(NULL, len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

static void table_free(void *p, size_t len)
{
	int (*fr)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "ursa_mem_free");

	if (!fr || fr(p))
		munmap(p, len);
}

int kv_table_init(struct kv_table *t, uint64_t nbuckets, uint64_t heap_len)
{
	uint64_t boff = 4096, hoff;

	memset(t, 0, sizeof(*t));
	if (!nbuckets || (nbuckets & (nbuckets - 1)))
		return -EINVAL;
	hoff = boff + nbuckets * sizeof(struct kv_bucket);
	hoff = (hoff + 4095) & ~4095ull;
	heap_len &= ~((1ull << KV_MAX_CLASS) - 1);
	if (!heap_len)
		return -EINVAL;
	t->free_cls = calloc(UNIT(heap_len), 1);
	if (!t->free_cls)
		return -ENOMEM;
	t->len = hoff + heap_len;
	t->base = table_alloc(t->len);
	if (t->base == MAP_FAILED) {
		t->base = NULL;
		free(t->free_cls);
		t->free_cls = NULL;
		return -ENOMEM;
	}
	t->hdr = (struct kv_table_hdr *)t->base;
	t->hdr->magic = KV_MAGIC;
	t->hdr->nbuckets = nbuckets;
	t->hdr->buckets_off = boff;
	t->hdr->heap_off = hoff;
	t->hdr->heap_len = heap_len;
	t->b = (struct kv_bucket *)(t->base + boff);
	t->heap = t->base + hoff;
	t->heap_len = heap_len;
	for (uint64_t off = 0; off < heap_len; off += 1ull << KV_MAX_CLASS)
		push(t, off, KV_MAX_CLASS);
	return 0;
}

void kv_table_free(struct kv_table *t)
{
	if (t->base)
		table_free(t->base, t->len);
	free(t->free_cls);
	free(t->q.v);
	memset(t, 0, sizeof(*t));
}

static struct kv_bucket *bucket_of(struct kv_table *t, uint64_t h)
{
	return &t->b[h & (t->hdr->nbuckets - 1)];
}

static const struct kv_block *block_at(struct kv_table *t, uint64_t off)
{
	return (const struct kv_block *)(t->heap + off);
}

struct kv_slot *kv_table_find(struct kv_table *t, const void *key, uint32_t klen)
{
	uint64_t h = kv_hash(key, klen);
	struct kv_bucket *b = bucket_of(t, h);

	for (int i = 0; i < KV_SLOTS; i++) {
		struct kv_slot *s = &b->s[i];

		if (s->khash == h && s->klen == klen &&
		    !memcmp(block_at(t, s->off) + 1, key, klen))
			return s;
	}
	return NULL;
}

uint8_t *kv_table_val(struct kv_table *t, uint64_t off, uint32_t klen)
{
	return t->heap + off + sizeof(struct kv_block) + klen;
}

int64_t kv_table_alloc(struct kv_table *t, uint32_t klen, uint32_t vlen)
{
	unsigned c = size_class(sizeof(struct kv_block) + klen + (uint64_t)vlen), k;

	if (c > KV_MAX_CLASS)
		return -ENOSPC;
	drain(t, kv_now() - KV_QUARANTINE);
	for (int pass = 0; pass < 2; pass++) {
		for (k = c; k <= KV_MAX_CLASS && !t->head[k]; k++)
			;
		if (k <= KV_MAX_CLASS) {
			uint64_t off = t->head[k] - 1;

			unlink_free(t, off, k);
			while (k > c) {	/* split; the upper half stays free */
				k--;
				push(t, off + (1ull << k), k);
			}
			return (int64_t)off;
		}
		/* Full: take the quarantined blocks now. A one-sided reader
		 * still on one of them sees its checksum fail and reads again. */
		drain(t, 1e300);
	}
	return -ENOSPC;
}

void kv_table_release(struct kv_table *t, uint64_t off, uint32_t klen,
		      uint32_t vlen)
{
	struct kv_quarantine *q = &t->q;
	unsigned c = size_class(sizeof(struct kv_block) + klen + (uint64_t)vlen);
	size_t i;

	/* Invalid from now on: a client holding this location in its cache
	 * falls back to the bucket (the slot has already moved on). */
	__atomic_store_n(&((struct kv_block *)(t->heap + off))->ver, 0, __ATOMIC_RELAXED);
	if (q->n == q->cap) {
		/* grow the ring, keeping its order */
		size_t cap = q->cap ? q->cap * 2 : 256;
		void *v = malloc(cap * sizeof(*q->v));

		if (!v) {
			merge_free(t, off, c);	/* no quarantine, still sound */
			return;
		}
		for (i = 0; i < q->n; i++)
			memcpy((char *)v + i * sizeof(*q->v), &q->v[(q->head + i) % q->cap],
			       sizeof(*q->v));
		free(q->v);
		q->v = v;
		q->cap = cap;
		q->head = 0;
	}
	i = (q->head + q->n) % q->cap;
	q->v[i].off = off;
	q->v[i].cls = (uint8_t)c;
	q->v[i].t = kv_now();
	q->n++;
}

/* Switch a slot to new contents. The check word goes last, after a
 * release fence that orders the fields before it for readers on this host
 * (cross-memory reads and the engine read memory as the CPU sees it). */
static void slot_set(struct kv_slot *s, uint64_t khash, uint64_t off,
		     uint32_t klen, uint32_t vlen)
{
	s->check = 0;
	__atomic_thread_fence(__ATOMIC_RELEASE);	/* invalid before changed */
	s->ver += 2;
	s->khash = khash;
	s->off = off;
	s->klen = klen;
	s->vlen = vlen;
	__atomic_thread_fence(__ATOMIC_RELEASE);	/* fields before check */
	__atomic_store_n(&s->check, kv_slot_check(s), __ATOMIC_RELAXED);
}

int kv_table_install(struct kv_table *t, const void *key, uint32_t klen,
		     uint64_t off, uint32_t vlen)
{
	uint64_t h = kv_hash(key, klen);
	struct kv_slot *s = kv_table_find(t, key, klen);
	struct kv_block *blk = (struct kv_block *)(t->heap + off);
	uint64_t old_off = 0;
	uint32_t old_klen = 0, old_vlen = 0;
	bool had = s != NULL;

	if (!s) {
		struct kv_bucket *b = bucket_of(t, h);

		for (int i = 0; i < KV_SLOTS && !s; i++)
			if (!b->s[i].khash)
				s = &b->s[i];
		if (!s) {
			kv_table_release(t, off, klen, vlen);
			return KV_ENOSPC;
		}
	} else {
		old_off = s->off;
		old_klen = s->klen;
		old_vlen = s->vlen;
	}
	/* The block is complete before any slot points at it, but carries
	 * its version only once the slot does: a client that reads it
	 * through a cached location must not see a value the slot does not
	 * hold yet (a later GET through the slot would go back in time). */
	blk->ver = 0;
	blk->klen = klen;
	blk->vlen = vlen;
	memcpy(blk + 1, key, klen);
	blk->sum = kv_sum(s->ver + 2, key, klen, kv_table_val(t, off, klen), vlen);
	__atomic_thread_fence(__ATOMIC_RELEASE);	/* block before slot */
	slot_set(s, h, off, klen, vlen);
	__atomic_thread_fence(__ATOMIC_RELEASE);	/* slot before version */
	__atomic_store_n(&blk->ver, s->ver, __ATOMIC_RELAXED);
	if (had)
		kv_table_release(t, old_off, old_klen, old_vlen);
	else
		t->nkeys++;
	return KV_OK;
}

int kv_table_del(struct kv_table *t, const void *key, uint32_t klen)
{
	struct kv_slot *s = kv_table_find(t, key, klen);
	uint64_t off;
	uint32_t vlen;

	if (!s)
		return KV_NOTFOUND;
	off = s->off;
	vlen = s->vlen;
	slot_set(s, 0, 0, 0, 0);
	kv_table_release(t, off, klen, vlen);
	t->nkeys--;
	return KV_OK;
}
