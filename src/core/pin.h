/* SPDX-License-Identifier: MIT */
/*
 * pin.h - reference-counted pinning of page ranges.
 *
 * mlock() does not count: two MRs over the same page share one lock, and one
 * munlock() would unpin the page under the other MR. The pin map keeps a
 * sorted list of disjoint page ranges, each with the number of MRs that cover
 * it, and calls lock() only for pages going from 0 to 1 and unlock() for pages
 * going from 1 to 0. It also accounts pinned bytes against RLIMIT_MEMLOCK the
 * way the kernel's ib_umem does: the limit applies unless the process has
 * CAP_IPC_LOCK.
 *
 * The lock and unlock operations are function pointers so that unit tests can
 * run the map without touching real memory.
 */
#ifndef URSA_PIN_H
#define URSA_PIN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ursa_pin_seg {
	uintptr_t start, end; /* [start, end), page aligned */
	uint32_t count;
	bool stale;	      /* unmapped since locked: lock what is there now
			       * at the next pin (ursa_pin_gone) */
};

struct ursa_pin_ops {
	int (*lock)(uintptr_t start, size_t len);   /* 0 or -errno */
	void (*unlock)(uintptr_t start, size_t len);
};

struct ursa_pinmap {
	pthread_mutex_t mu;
	struct ursa_pin_seg *segs;
	size_t nsegs, cap;
	uint64_t pinned;	/* bytes with count >= 1 */
	uint64_t limit;		/* bytes; UINT64_MAX for none */
	const struct ursa_pin_ops *ops;
};

void ursa_pinmap_init(struct ursa_pinmap *pm, const struct ursa_pin_ops *ops,
		      uint64_t limit);
void ursa_pinmap_fini(struct ursa_pinmap *pm);
/* Pin [start, end): returns 0, -EDQUOT when the limit would be exceeded
 * (*newly set to the bytes that would have been added), or lock()'s error. */
int ursa_pin(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end,
	     uint64_t *newly);
void ursa_unpin(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end);
/* Lock [start, end), which the caller already pins, once more, whatever is
 * mapped there now (the registration cache, rcache.h): 0 or lock()'s
 * error. Counts and accounting do not change. */
int ursa_pin_refresh(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end);
/* [start, end) was unmapped (core/uffd.h): the kernel dropped its locks
 * with the pages. The counts stay (the MRs over it still unpin it), but
 * the next pin of a page there locks whatever is mapped there then, as a
 * first pin does. */
void ursa_pin_gone(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end);
uint64_t ursa_pinned_bytes(struct ursa_pinmap *pm);
/* Does any MR pin a page of [start, end)? */
bool ursa_pinned_any(struct ursa_pinmap *pm, uintptr_t start, uintptr_t end);

#endif
