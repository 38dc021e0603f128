/* SPDX-License-Identifier: MIT */
/*
 * mtt.h - memory translation tables.
 *
 * A NIC translates an (MR, iova) pair to memory through a table built at
 * registration, one entry per page of the size that backs the range. ursa
 * builds the same table from the kernel's view of the process: a hugetlbfs
 * mapping gives 2 MiB (or 1 GiB) entries, an anonymous mapping backed by
 * transparent huge pages gives 2 MiB entries where a whole aligned 2 MiB
 * block is huge, everything else gives 4 KiB entries. The data path resolves
 * every access through the table (ursa_mtt_lookup), so huge pages cut both
 * the table's size and the work per translation.
 */
#ifndef URSA_MTT_H
#define URSA_MTT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ursa_mtt_entry {
	uintptr_t va;	 /* start of the page */
	uint32_t shift;	 /* log2 of the page size */
};

struct ursa_mtt {
	struct ursa_mtt_entry *e;
	uint32_t n;
	uint32_t huge;	 /* entries larger than the base page */
};

/* One mapping of the process as the kernel reports it (smaps). */
struct ursa_vma {
	uintptr_t start, end;
	uint32_t kernel_page_shift; /* 12, or 21/30 for hugetlbfs */
	uint64_t anon_huge_bytes;   /* AnonHugePages */
};

/*
 * Classifier for transparent huge pages: returns 1 if the 2 MiB block at va
 * is one huge page, 0 if not, -1 if it cannot tell.
 */
typedef int (*ursa_thp_probe_fn)(uintptr_t va);

/* Build the table for [start, end) (page aligned) from the VMA list. */
int ursa_mtt_build(struct ursa_mtt *m, uintptr_t start, uintptr_t end,
		   const struct ursa_vma *vmas, size_t nvmas,
		   ursa_thp_probe_fn probe);
/* Same, reading the VMA list from /proc/self/smaps. */
int ursa_mtt_build_self(struct ursa_mtt *m, uintptr_t start, uintptr_t end);
void ursa_mtt_free(struct ursa_mtt *m);
/* Can only 4 KiB pages back [start, end), whatever is mapped there now (no
 * whole 2 MiB block, no file or hugetlb mapping)? Then its table is known
 * without reading smaps. */
bool ursa_mtt_small_only(uintptr_t start, uintptr_t end);
/* The binary search behind ursa_mtt_lookup. */
long ursa_mtt_search(const struct ursa_mtt *m, uintptr_t va);

/* Index of the entry holding va, or -1. Inline, for every post's SGEs. */
static inline long ursa_mtt_lookup(const struct ursa_mtt *m, uintptr_t va)
{
	/* Pages of one size throughout (the common case): the index is
	 * the distance from the first entry; checked like any hit. */
	if (m->n && va >= m->e[0].va) {
		uintptr_t g = (va - m->e[0].va) >> m->e[0].shift;

		if (g < m->n && va >= m->e[g].va &&
		    va - m->e[g].va < (1ul << m->e[g].shift))
			return (long)g;
	}
	return ursa_mtt_search(m, va);
}

#endif
