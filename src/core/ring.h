/* SPDX-License-Identifier: MIT */
/*
 * ring.h - single-producer single-consumer rings in user memory.
 *
 * Work queues are rings of fixed-size entries: the application's thread is
 * the producer (under the queue's post lock when the application posts from
 * several threads), an engine is the consumer. Indices are free-running
 * 32-bit counters masked on use, so full and empty differ (tail - head ==
 * size vs 0) without a spare slot. Producer and consumer indices live on
 * separate cache lines (128 bytes apart, for adjacent-line prefetch) so the
 * two sides do not bounce one line. The same layout works in a shared
 * mapping between processes; a consumer that reads indices written by an
 * untrusted peer must bound tail - head by size before use.
 */
#ifndef URSA_RING_H
#define URSA_RING_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct ursa_ring {
	_Alignas(128) atomic_uint tail; /* written by the producer */
	_Alignas(128) atomic_uint head; /* written by the consumer */
	_Alignas(128) uint32_t size;	/* power of two */
	uint32_t mask;
	uint32_t esize;
	uint8_t *buf;
};

static inline int ursa_ring_init(struct ursa_ring *r, uint32_t entries,
				 uint32_t esize)
{
	uint32_t n = 1;

	while (n < entries)
		n <<= 1;
	r->buf = calloc(n, esize);
	if (!r->buf)
		return -ENOMEM;
	atomic_init(&r->tail, 0);
	atomic_init(&r->head, 0);
	r->size = n;
	r->mask = n - 1;
	r->esize = esize;
	return 0;
}

static inline void ursa_ring_fini(struct ursa_ring *r)
{
	free(r->buf);
	r->buf = NULL;
}

static inline void *ursa_ring_slot(struct ursa_ring *r, uint32_t idx)
{
	return r->buf + (size_t)(idx & r->mask) * r->esize;
}

/* Producer: entries free for writing, counting from the current tail. */
static inline uint32_t ursa_ring_space(struct ursa_ring *r)
{
	/* Acquire: the consumer finished reading the slots it released. */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);

	return r->size - (tail - head);
}

/* Producer: the n-th free slot after the tail (n < space). */
static inline void *ursa_ring_prod_slot(struct ursa_ring *r, uint32_t n)
{
	return ursa_ring_slot(r, atomic_load_explicit(&r->tail,
						      memory_order_relaxed) + n);
}

/* Producer: publish n written slots. */
static inline void ursa_ring_produce(struct ursa_ring *r, uint32_t n)
{
	/* Release: slot contents are visible before the new tail. */
	atomic_fetch_add_explicit(&r->tail, n, memory_order_release);
}

/* Consumer: entries ready to read, bounded by the ring size so that a
 * corrupt tail can never make the consumer walk past the buffer. */
static inline uint32_t ursa_ring_ready(struct ursa_ring *r)
{
	/* Acquire: pairs with ursa_ring_produce's release. */
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
	uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
	uint32_t n = tail - head;

	return n > r->size ? 0 : n;
}

static inline void *ursa_ring_peek(struct ursa_ring *r)
{
	return ursa_ring_slot(r, atomic_load_explicit(&r->head,
						      memory_order_relaxed));
}

static inline void ursa_ring_consume(struct ursa_ring *r, uint32_t n)
{
	/* Release: our reads of the slots finish before the producer may
	 * overwrite them. */
	atomic_fetch_add_explicit(&r->head, n, memory_order_release);
}

#endif
