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
 * Blocks come in power-of-two sizes from 64 bytes to 2 MiB, from a bump
 * pointer or a free list per size.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kv_verbs.h"

#define KV_QUARANTINE 0.05

static unsigned size_class(uint64_t n)
{
	unsigned c = 6;

	while ((1ull << c) < n)
		c++;
	return c;
}

int kv_table_init(struct kv_table *t, uint64_t nbuckets, uint64_t heap_len)
{
	uint64_t boff = 4096, hoff;

	memset(t, 0, sizeof(*t));
	if (!nbuckets || (nbuckets & (nbuckets - 1)))
		return -EINVAL;
	hoff = boff + nbuckets * sizeof(struct kv_bucket);
	hoff = (hoff + 4095) & ~4095ull;
	t->len = hoff + heap_len;
	t->base = mmap(NULL, t->len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (t->base == MAP_FAILED) {
		t->base = NULL;
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
	return 0;
}

void kv_table_free(struct kv_table *t)
{
	if (t->base)
		munmap(t->base, t->len);
	for (unsigned c = 0; c < KV_CLASSES; c++)
		free(t->fl[c].v);
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
	uint64_t need = sizeof(struct kv_block) + klen + (uint64_t)vlen;
	unsigned c = size_class(need);
	struct kv_freelist *f;
	uint64_t off;

	if (c >= KV_CLASSES)
		return -ENOSPC;
	f = &t->fl[c];
	/* a block freed long enough ago, else fresh space, else any */
	if (f->n && kv_now() - f->v[f->head].t > KV_QUARANTINE)
		goto reuse;
	if (t->bump + (1ull << c) <= t->heap_len) {
		off = t->bump;
		t->bump += 1ull << c;
		return (int64_t)off;
	}
	if (!f->n)
		return -ENOSPC;
reuse:
	off = f->v[f->head].off;
	f->head = (f->head + 1) % f->cap;
	f->n--;
	return (int64_t)off;
}

void kv_table_release(struct kv_table *t, uint64_t off, uint32_t klen,
		      uint32_t vlen)
{
	struct kv_freelist *f = &t->fl[size_class(sizeof(struct kv_block) + klen +
						  (uint64_t)vlen)];
	struct kv_block *blk = (struct kv_block *)(t->heap + off);

	/* Invalid from now on: a client holding this location in its cache
	 * falls back to the bucket (the slot has already moved on). */
	__atomic_store_n(&blk->ver, 0, __ATOMIC_RELAXED);

	if (f->n == f->cap) {
		/* grow the ring, keeping its order */
		size_t cap = f->cap ? f->cap * 2 : 64;
		void *v = malloc(cap * sizeof(*f->v));

		if (!v)
			return;	/* the block is lost, the table stays sound */
		for (size_t i = 0; i < f->n; i++)
			memcpy((char *)v + i * sizeof(*f->v),
			       &f->v[(f->head + i) % f->cap], sizeof(*f->v));
		free(f->v);
		f->v = v;
		f->cap = cap;
		f->head = 0;
	}
	f->v[(f->head + f->n) % f->cap].off = off;
	f->v[(f->head + f->n) % f->cap].t = kv_now();
	f->n++;
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
