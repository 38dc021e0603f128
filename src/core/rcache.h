/* SPDX-License-Identifier: MIT */
/*
 * rcache.h - the registration cache behind ibv_reg_mr and ibv_dereg_mr.
 *
 * What a registration costs is pinning the pages (mlock walks and locks
 * every page) and building the translation table; deregistration unlocks
 * them again. Programs that register per message (MPI libraries without
 * their own cache, perftest-like loops, a key-value server that registers
 * each value) pay that every time. So deregistration parks the pinned range
 * and its table here instead of undoing them, and a registration of the
 * same page range takes them back: the cost of a hit is a lookup, one
 * mlock of pages that are already locked (the kernel only walks them) and
 * the keys.
 *
 * Why it lives inside ibv_reg_mr: unmodified programs get it, and it
 * cannot go stale the way a NIC's cache can. A NIC's table holds physical
 * pages, so a cache must learn of every munmap, mremap or madvise
 * (UCX hooks them) or a new MR would reach the old pages. ursa reaches
 * memory by its address, through the process's current mappings, every
 * time: a parked table holds addresses, and a hit only has to make its pins
 * true again for whatever is mapped there now (the mlock on the hit does
 * that, and fails if the range is no longer mapped: then the entry is
 * dropped and the registration starts afresh). Same-host sharing is looked
 * up again at every registration (shmap.h), never cached. Nothing has to
 * be interposed, which matters because glibc's free() calls munmap
 * internally where no interposer sees it.
 *
 * What a parked range costs the program: its pages stay locked (counted in
 * ursa_pinned_total) until the entry is taken back, evicted (least recently
 * parked first, beyond URSA_RCACHE_ENTRIES entries or URSA_RCACHE_MB
 * mebibytes, at most half of RLIMIT_MEMLOCK), flushed (ursa_rcache_flush,
 * the last ibv_close_device, a registration that would exceed
 * RLIMIT_MEMLOCK) or the process exits; while locked, MADV_DONTNEED on them
 * fails with EINVAL, as on a registered buffer. URSA_RCACHE=0 turns it off.
 */
#ifndef URSA_RCACHE_H
#define URSA_RCACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "mtt.h"

struct ursa_pinmap;

struct ursa_rcache_ent {
	uintptr_t start, end;	/* the pinned pages, [start, end) */
	struct ursa_mtt mtt;
	struct ursa_rcache_ent *prev, *next;
};

struct ursa_rcache {
	pthread_mutex_t mu;
	struct ursa_pinmap *pins;
	struct ursa_rcache_ent *head, *tail;	/* most recently parked first */
	uint32_t n, max_n;
	uint64_t bytes, max_bytes;
	/* counters, under mu */
	uint64_t hits, misses, evictions, stale;
};

void ursa_rcache_init(struct ursa_rcache *rc, struct ursa_pinmap *pins);
/* A registration of [start, end): on a hit, 0 with the parked table in
 * *mtt and the entry's pin handed over to the caller; -ENOENT on a miss. */
int ursa_rcache_take(struct ursa_rcache *rc, uintptr_t start, uintptr_t end,
		     struct ursa_mtt *mtt);
/* A deregistration of the pinned [start, end) with table *mtt: parks both,
 * or unpins and frees them when the cache is off or they do not fit. */
void ursa_rcache_park(struct ursa_rcache *rc, uintptr_t start, uintptr_t end,
		      struct ursa_mtt *mtt);
/* Unpin and free every parked entry; returns the bytes released. */
uint64_t ursa_rcache_drain(struct ursa_rcache *rc);

#endif
