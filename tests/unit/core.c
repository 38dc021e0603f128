// SPDX-License-Identifier: MIT
/*
 * core.c (unit) - the pure modules: key table, pin map, translation
 * tables, the QP state table, rings and the table published to same-host
 * requesters.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../harness.h"
#include "../../src/core/core.h"
#include "../../src/core/pub.h"
#include "../../src/core/vma.h"

static int test_keys_unique_random(void)
{
	struct ursa_keytab kt;
	struct ursa_keyed objs[2000];
	uint32_t keys[2000];
	int seq_idx = 0, same_low = 0;

	REQUIRE(ursa_keytab_init(&kt, 16) == 0);
	for (int i = 0; i < 2000; i++) {
		atomic_init(&objs[i].refs, 0);
		REQUIRE(ursa_keytab_add(&kt, &objs[i], URSA_KEY_MR_LKEY, &keys[i]) == 0);
		EXPECT_NE(keys[i] >> 8, 0);
	}
	for (int i = 0; i < 2000; i++)
		for (int j = i + 1; j < 2000; j++)
			if (keys[i] == keys[j] || (keys[i] >> 8) == (keys[j] >> 8))
				harness_fail(__FILE__, __LINE__, "unique", "key %d == key %d", i, j);
	/* Not predictable: consecutive keys are neither sequential in the
	 * index nor sharing the key byte more than chance allows. */
	for (int i = 1; i < 2000; i++) {
		seq_idx += (keys[i] >> 8) == (keys[i - 1] >> 8) + 1;
		same_low += (keys[i] & 0xff) == (keys[i - 1] & 0xff);
	}
	EXPECT_TRUE(seq_idx < 3);
	EXPECT_TRUE(same_low < 30); /* expected ~8 */
	for (int i = 0; i < 2000; i++) {
		uint8_t kind;
		struct ursa_keyed *o = ursa_keytab_get(&kt, keys[i], URSA_KEY_MR_LKEY, &kind);

		EXPECT_TRUE(o == &objs[i]);
		if (o)
			ursa_keyed_put(o);
		/* wrong kind, wrong key byte */
		EXPECT_TRUE(ursa_keytab_get(&kt, keys[i], URSA_KEY_MW, NULL) == NULL);
		EXPECT_TRUE(ursa_keytab_get(&kt, keys[i] ^ 1, URSA_KEY_MR_LKEY, NULL) == NULL);
	}
	ursa_keytab_fini(&kt);
	return TEST_RESULT();
}

static int test_keys_revoked_and_quarantined(void)
{
	struct ursa_keytab kt;
	struct ursa_keyed a, b;
	uint32_t ka, kb, first;

	atomic_init(&a.refs, 0);
	atomic_init(&b.refs, 0);
	REQUIRE(ursa_keytab_init(&kt, 64) == 0);
	REQUIRE(ursa_keytab_add(&kt, &a, URSA_KEY_MR_RKEY, &ka) == 0);
	first = ka;
	EXPECT_EQ(ursa_keytab_del(&kt, ka), 0);
	EXPECT_TRUE(ursa_keytab_get(&kt, ka, URSA_KEY_MR_RKEY, NULL) == NULL);
	EXPECT_EQ(ursa_keytab_del(&kt, ka), -ENOENT);
	/* Churn through many registrations: the freed index must not come
	 * back while it is quarantined. */
	for (unsigned i = 0; i < URSA_KEY_QUARANTINE - 10; i++) {
		REQUIRE(ursa_keytab_add(&kt, &b, URSA_KEY_MR_RKEY, &kb) == 0);
		EXPECT_NE(kb >> 8, first >> 8);
		REQUIRE(ursa_keytab_del(&kt, kb) == 0);
	}
	EXPECT_TRUE(kt.cap < 65536); /* tombstones are bounded */
	ursa_keytab_fini(&kt);
	return TEST_RESULT();
}

static int test_keys_rekey(void)
{
	struct ursa_keytab kt;
	struct ursa_keyed a;
	uint32_t k, nk;
	struct ursa_keyed *o;

	atomic_init(&a.refs, 0);
	REQUIRE(ursa_keytab_init(&kt, 64) == 0);
	REQUIRE(ursa_keytab_add(&kt, &a, URSA_KEY_MW, &k) == 0);
	nk = (k & ~0xffu) | ((k + 1) & 0xff);
	EXPECT_EQ(ursa_keytab_rekey(&kt, k, nk), 0);
	EXPECT_TRUE(ursa_keytab_get(&kt, k, URSA_KEY_MW, NULL) == NULL);
	o = ursa_keytab_get(&kt, nk, URSA_KEY_MW, NULL);
	EXPECT_TRUE(o == &a);
	EXPECT_EQ(atomic_load(&a.refs), 1);
	if (o)
		ursa_keyed_put(o);
	EXPECT_EQ(atomic_load(&a.refs), 0);
	/* the index part may not change */
	EXPECT_EQ(ursa_keytab_rekey(&kt, nk, nk ^ 0x100), -EINVAL);
	ursa_keytab_fini(&kt);
	return TEST_RESULT();
}

/* Pin map with a fake locker that records every page's lock count. */
#define NPAGES 64
static int locked[NPAGES];
static int lock_fail_at = -1;

static int fake_lock(uintptr_t s, size_t len)
{
	for (uintptr_t p = s / 4096; p < (s + len) / 4096; p++) {
		if ((int)p == lock_fail_at)
			return -EAGAIN;
		locked[p]++;
	}
	return 0;
}

/* Like munlock, unlocking an unlocked page does nothing. */
static void fake_unlock(uintptr_t s, size_t len)
{
	for (uintptr_t p = s / 4096; p < (s + len) / 4096; p++)
		if (locked[p] > 0)
			locked[p]--;
}

static const struct ursa_pin_ops fake_ops = { fake_lock, fake_unlock };
#define PG(n) ((uintptr_t)(n) * 4096)

static int test_pin_refcounts_overlaps(void)
{
	struct ursa_pinmap pm;
	uint64_t newly;

	memset(locked, 0, sizeof(locked));
	ursa_pinmap_init(&pm, &fake_ops, UINT64_MAX);
	EXPECT_EQ(ursa_pin(&pm, PG(2), PG(6), &newly), 0);
	EXPECT_EQ(newly, PG(4));
	EXPECT_EQ(ursa_pin(&pm, PG(4), PG(10), &newly), 0);
	EXPECT_EQ(newly, PG(4));	/* only 6..10 is new */
	EXPECT_EQ(ursa_pinned_bytes(&pm), PG(8));
	for (int p = 0; p < NPAGES; p++)
		EXPECT_EQ(locked[p], (p >= 2 && p < 10) ? 1 : 0);
	/* Unpinning the first MR keeps the shared pages 4..6 locked. */
	ursa_unpin(&pm, PG(2), PG(6));
	for (int p = 0; p < NPAGES; p++)
		EXPECT_EQ(locked[p], (p >= 4 && p < 10) ? 1 : 0);
	EXPECT_EQ(ursa_pinned_bytes(&pm), PG(6));
	ursa_unpin(&pm, PG(4), PG(10));
	for (int p = 0; p < NPAGES; p++)
		EXPECT_EQ(locked[p], 0);
	EXPECT_EQ(ursa_pinned_bytes(&pm), 0);
	EXPECT_EQ(pm.nsegs, 0);
	ursa_pinmap_fini(&pm);
	return TEST_RESULT();
}

/* Pages unmapped under a pin: the next pin there locks the new pages,
 * once; the counts and the unpins are unchanged. */
static int test_pin_gone_relocks(void)
{
	struct ursa_pinmap pm;
	uint64_t newly;

	memset(locked, 0, sizeof(locked));
	ursa_pinmap_init(&pm, &fake_ops, UINT64_MAX);
	EXPECT_EQ(ursa_pin(&pm, PG(0), PG(8), &newly), 0);
	/* pages 2..4 unmapped (the kernel drops their locks) and mapped anew */
	locked[2] = locked[3] = 0;
	ursa_pin_gone(&pm, PG(2), PG(4));
	/* a new MR over 3..6: page 3 and the rest of the stale segment's
	 * overlap are locked again, 4..6 (never gone) are not */
	EXPECT_EQ(ursa_pin(&pm, PG(3), PG(6), &newly), 0);
	EXPECT_EQ(newly, 0);
	EXPECT_EQ(locked[3], 1);
	EXPECT_EQ(locked[2], 0);
	EXPECT_EQ(locked[4], 1);
	EXPECT_EQ(locked[5], 1);
	/* once is enough */
	EXPECT_EQ(ursa_pin(&pm, PG(3), PG(4), &newly), 0);
	EXPECT_EQ(locked[3], 1);
	/* page 2 is still stale: the next pin of it locks it */
	EXPECT_EQ(ursa_pin(&pm, PG(2), PG(3), &newly), 0);
	EXPECT_EQ(locked[2], 1);
	ursa_unpin(&pm, PG(2), PG(3));
	ursa_unpin(&pm, PG(3), PG(4));
	ursa_unpin(&pm, PG(3), PG(6));
	ursa_unpin(&pm, PG(0), PG(8));
	EXPECT_EQ(ursa_pinned_bytes(&pm), 0);
	for (int i = 0; i < 8; i++)
		EXPECT_EQ(locked[i], 0);
	ursa_pinmap_fini(&pm);
	return TEST_RESULT();
}

static int test_pin_limit_and_failure(void)
{
	struct ursa_pinmap pm;
	uint64_t newly;

	memset(locked, 0, sizeof(locked));
	ursa_pinmap_init(&pm, &fake_ops, PG(8));
	EXPECT_EQ(ursa_pin(&pm, PG(0), PG(6), &newly), 0);
	/* Overlapping pages do not count twice against the limit. */
	EXPECT_EQ(ursa_pin(&pm, PG(0), PG(8), &newly), 0);
	EXPECT_EQ(ursa_pin(&pm, PG(8), PG(9), &newly), -EDQUOT);
	EXPECT_EQ(newly, PG(1));
	EXPECT_EQ(locked[8], 0);
	/* A lock failure midway undoes what the call locked. */
	ursa_unpin(&pm, PG(0), PG(8));
	ursa_unpin(&pm, PG(0), PG(6));
	pm.limit = UINT64_MAX;
	EXPECT_EQ(ursa_pin(&pm, PG(10), PG(12), &newly), 0);
	lock_fail_at = 14;
	EXPECT_EQ(ursa_pin(&pm, PG(8), PG(16), &newly), -EAGAIN);
	lock_fail_at = -1;
	for (int p = 0; p < NPAGES; p++)
		EXPECT_EQ(locked[p], (p >= 10 && p < 12) ? 1 : 0);
	EXPECT_EQ(ursa_pinned_bytes(&pm), PG(2));
	ursa_unpin(&pm, PG(10), PG(12));
	ursa_pinmap_fini(&pm);
	return TEST_RESULT();
}

/* Like mlock and munlock: a page is locked or not, however often. */
static int lock_calls;

static int mlock_like(uintptr_t s, size_t len)
{
	lock_calls++;
	for (uintptr_t p = s / 4096; p < (s + len) / 4096; p++) {
		if ((int)p == lock_fail_at)
			return -ENOMEM;
		locked[p] = 1;
	}
	return 0;
}

static void munlock_like(uintptr_t s, size_t len)
{
	for (uintptr_t p = s / 4096; p < (s + len) / 4096; p++)
		locked[p] = 0;
}

static const struct ursa_pin_ops mlock_like_ops = { mlock_like, munlock_like };

/* The registration cache over the fake pin map: a hit hands back the
 * table and the pin (and locks the pages once more, for whatever is
 * mapped there now); other ranges miss; a range that cannot be locked
 * again is stale; bounds evict the oldest; draining unpins everything. */
static int test_rcache(void)
{
	struct ursa_pinmap pm;
	struct ursa_rcache rc;
	struct ursa_mtt m;
	uint64_t newly;

	memset(locked, 0, sizeof(locked));
	ursa_pinmap_init(&pm, &mlock_like_ops, UINT64_MAX);
	ursa_rcache_init(&rc, &pm);
	rc.max_n = 2;
	rc.max_bytes = PG(16);
	EXPECT_EQ(ursa_pin(&pm, PG(0), PG(4), &newly), 0);
	EXPECT_EQ(ursa_mtt_build(&m, PG(0), PG(4), NULL, 0, NULL), 0);
	ursa_rcache_park(&rc, PG(0), PG(4), &m);
	EXPECT_TRUE(m.e == NULL);		/* the cache owns it now */
	EXPECT_EQ(ursa_pinned_bytes(&pm), PG(4));	/* still pinned */
	EXPECT_EQ(ursa_rcache_take(&rc, PG(0), PG(3), &m), -ENOENT);
	lock_calls = 0;
	EXPECT_EQ(ursa_rcache_take(&rc, PG(0), PG(4), &m), 0);
	EXPECT_EQ(m.n, 4);
	EXPECT_EQ(lock_calls, 1);		/* locked once more */
	EXPECT_EQ(locked[3], 1);
	EXPECT_EQ(rc.hits, 1);
	EXPECT_EQ(rc.misses, 1);
	EXPECT_EQ(rc.n, 0);
	/* stale: the pages cannot be locked again */
	ursa_rcache_park(&rc, PG(0), PG(4), &m);
	lock_fail_at = 2;
	EXPECT_EQ(ursa_rcache_take(&rc, PG(0), PG(4), &m), -ENOENT);
	lock_fail_at = -1;
	EXPECT_EQ(rc.stale, 1);
	EXPECT_EQ(ursa_pinned_bytes(&pm), 0);	/* released */
	/* three parked, room for two: the oldest goes */
	for (int i = 0; i < 3; i++) {
		EXPECT_EQ(ursa_pin(&pm, PG(10 * i), PG(10 * i + 2), &newly), 0);
		EXPECT_EQ(ursa_mtt_build(&m, PG(10 * i), PG(10 * i + 2), NULL, 0, NULL), 0);
		ursa_rcache_park(&rc, PG(10 * i), PG(10 * i + 2), &m);
	}
	EXPECT_EQ(rc.n, 2);
	EXPECT_EQ(rc.evictions, 1);
	EXPECT_EQ(locked[0], 0);
	EXPECT_EQ(locked[10], 1);
	/* too large for the cache: released at once */
	EXPECT_EQ(ursa_pin(&pm, PG(40), PG(60), &newly), 0);
	EXPECT_EQ(ursa_mtt_build(&m, PG(40), PG(60), NULL, 0, NULL), 0);
	ursa_rcache_park(&rc, PG(40), PG(60), &m);
	EXPECT_EQ(locked[40], 0);
	EXPECT_EQ(ursa_rcache_drain(&rc), PG(4));
	EXPECT_EQ(ursa_pinned_bytes(&pm), 0);
	for (int p = 0; p < NPAGES; p++)
		EXPECT_EQ(locked[p], 0);
	/* off: nothing is parked */
	rc.max_n = 0;
	EXPECT_EQ(ursa_pin(&pm, PG(0), PG(1), &newly), 0);
	EXPECT_EQ(ursa_mtt_build(&m, PG(0), PG(1), NULL, 0, NULL), 0);
	ursa_rcache_park(&rc, PG(0), PG(1), &m);
	EXPECT_EQ(ursa_pinned_bytes(&pm), 0);
	ursa_pinmap_fini(&pm);
	return TEST_RESULT();
}

static int probe_all_huge(uintptr_t va) { (void)va; return 1; }
static int probe_unknown(uintptr_t va) { (void)va; return -1; }

/* The entries cover [start, end) without a gap: the post path's local
 * check (core.h) relies on it instead of walking the table. */
static bool mtt_covers(const struct ursa_mtt *m, uintptr_t start, uintptr_t end)
{
	if (!m->n || m->e[0].va > start)
		return false;
	for (uint32_t i = 0; i + 1 < m->n; i++)
		if (m->e[i + 1].va != m->e[i].va + (1ul << m->e[i].shift))
			return false;
	return m->e[m->n - 1].va + (1ul << m->e[m->n - 1].shift) >= end;
}

static int test_mtt_page_sizes(void)
{
	struct ursa_mtt m;
	const uintptr_t M2 = 2ul << 20;
	struct ursa_vma small = { 0x100000, 0x100000 + 16 * 4096, 12, 0 };
	struct ursa_vma thp = { 4 * M2, 8 * M2, 12, 4 * M2 };
	struct ursa_vma hugetlb = { 16 * M2, 20 * M2, 21, 0 };

	EXPECT_EQ(ursa_mtt_build(&m, small.start, small.end, &small, 1, NULL), 0);
	EXPECT_EQ(m.n, 16);
	EXPECT_EQ(m.huge, 0);
	EXPECT_EQ(ursa_mtt_lookup(&m, small.start + 5 * 4096 + 7), 5);
	EXPECT_EQ(ursa_mtt_lookup(&m, small.end), -1);
	EXPECT_TRUE(mtt_covers(&m, small.start, small.end));
	ursa_mtt_free(&m);

	/* THP: 4 aligned 2 MiB blocks give 4 entries instead of 2048. */
	EXPECT_EQ(ursa_mtt_build(&m, thp.start, thp.end, &thp, 1, probe_all_huge), 0);
	EXPECT_EQ(m.n, 4);
	EXPECT_EQ(m.huge, 4);
	EXPECT_EQ(ursa_mtt_lookup(&m, thp.start + M2 + 5), 1);
	ursa_mtt_free(&m);
	/* Without page flags, smaps says all of it is huge: still exact. */
	EXPECT_EQ(ursa_mtt_build(&m, thp.start, thp.end, &thp, 1, probe_unknown), 0);
	EXPECT_EQ(m.n, 4);
	ursa_mtt_free(&m);
	/* Partly huge and no page flags: conservative 4 KiB entries. */
	thp.anon_huge_bytes = M2;
	EXPECT_EQ(ursa_mtt_build(&m, thp.start, thp.end, &thp, 1, probe_unknown), 0);
	EXPECT_EQ(m.n, 4 * 512);
	EXPECT_EQ(m.huge, 0);
	EXPECT_TRUE(mtt_covers(&m, thp.start, thp.end));
	ursa_mtt_free(&m);
	/* Two mappings, 4 KiB pages then huge ones: still no gap. */
	{
		struct ursa_vma two[2] = {
			{ 4 * M2 - 16 * 4096, 4 * M2, 12, 0 },
			{ 4 * M2, 8 * M2, 12, 4 * M2 },
		};

		EXPECT_EQ(ursa_mtt_build(&m, two[0].start, two[1].end, two, 2,
					 probe_all_huge), 0);
		EXPECT_EQ(m.n, 16 + 4);
		EXPECT_TRUE(mtt_covers(&m, two[0].start, two[1].end));
		ursa_mtt_free(&m);
	}

	/* hugetlbfs: a range starting mid-page still gets whole entries. */
	EXPECT_EQ(ursa_mtt_build(&m, hugetlb.start + 4096, hugetlb.start + 3 * M2,
				 &hugetlb, 1, NULL), 0);
	EXPECT_EQ(m.n, 3);
	EXPECT_EQ(m.e[0].va, hugetlb.start);
	EXPECT_EQ(m.e[0].shift, 21);
	EXPECT_TRUE(mtt_covers(&m, hugetlb.start + 4096, hugetlb.start + 3 * M2));
	ursa_mtt_free(&m);
	return TEST_RESULT();
}

/* Both ways of asking for a mapping give the same answer (without
 * PROCMAP_QUERY in the kernel, both read the text), and it is the right
 * one: a read-write run of pages between two inaccessible ones, a hole,
 * the next mapping above the hole, a file, the heap. */
static bool vma_same(uintptr_t a, bool next, struct ursa_vma_info *v)
{
	struct ursa_vma_info t;
	int r1 = ursa_vma_query(a, next, false, v);
	int r2 = ursa_vma_query(a, next, true, &t);

	if (r1 != r2) {
		fprintf(stderr, "    %#lx: ioctl %d, text %d\n", (unsigned long)a, r1, r2);
		return false;
	}
	if (r1)
		return r1 == -ENOENT && (v->start = 0, true);
	if (v->start != t.start || v->end != t.end || strcmp(v->perms, t.perms) ||
	    v->ino != t.ino || strcmp(v->name, t.name)) {
		fprintf(stderr, "    %#lx: ioctl %lx-%lx %s %llu '%s', text %lx-%lx %s %llu '%s'\n",
			(unsigned long)a, (unsigned long)v->start, (unsigned long)v->end,
			v->perms, (unsigned long long)v->ino, v->name,
			(unsigned long)t.start, (unsigned long)t.end, t.perms,
			(unsigned long long)t.ino, t.name);
		return false;
	}
	return true;
}

static int test_vma_query(void)
{
	uint8_t *p = mmap(NULL, 5 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	uintptr_t b = (uintptr_t)p;
	struct ursa_vma_info v;
	char *heap = sbrk(4096);	/* (kept: malloc may own the break) */

	REQUIRE(p != MAP_FAILED && heap != (void *)-1);
	REQUIRE(mprotect(p + 4096, 3 * 4096, PROT_READ | PROT_WRITE) == 0);
	EXPECT_TRUE(vma_same(b + 2 * 4096 + 5, false, &v));
	EXPECT_EQ(v.start, b + 4096);
	EXPECT_EQ(v.end, b + 4 * 4096);
	EXPECT_TRUE(!strcmp(v.perms, "rw-p") && !v.ino && !v.name[0]);
	EXPECT_TRUE(vma_same(b, false, &v));
	EXPECT_TRUE(v.start == b && !strcmp(v.perms, "---p"));
	REQUIRE(munmap(p, 4096) == 0);
	EXPECT_TRUE(vma_same(b, false, &v));
	EXPECT_EQ(v.start, 0);	/* -ENOENT: nothing there */
	EXPECT_TRUE(vma_same(b, true, &v));
	EXPECT_TRUE(v.start == b + 4096 && !strcmp(v.perms, "rw-p"));
	/* this function's code: a file, executable */
	EXPECT_TRUE(vma_same((uintptr_t)test_vma_query, false, &v));
	EXPECT_TRUE(v.name[0] == '/' && v.ino && v.perms[2] == 'x');
	/* the brk heap (sbrk: under ASan, malloc does not use it) */
	EXPECT_TRUE(vma_same((uintptr_t)heap, false, &v));
	EXPECT_TRUE(!strcmp(v.name, "[heap]") && !v.ino);
	munmap(p + 4096, 4 * 4096);
	return TEST_RESULT();
}

static int test_mtt_self_real_memory(void)
{
	struct ursa_mtt m;
	size_t len = 8 * 4096;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	REQUIRE(p != MAP_FAILED);
	madvise(p, len, MADV_NOHUGEPAGE);
	memset(p, 1, len);
	EXPECT_EQ(ursa_mtt_build_self(&m, (uintptr_t)p, (uintptr_t)p + len), 0);
	EXPECT_EQ(m.n, 8);
	EXPECT_EQ(m.e[0].va, (uintptr_t)p);
	ursa_mtt_free(&m);
	munmap(p, len);
	return TEST_RESULT();
}

static int test_qp_state_table(void)
{
	const int rc_init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS;
	const int rc_rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	const int rc_rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			   IBV_QP_MAX_QP_RD_ATOMIC;

	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, rc_init), 0);
	/* missing a required attribute */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, rc_init & ~IBV_QP_PORT), -EINVAL);
	/* an attribute the transition does not allow */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, rc_init | IBV_QP_SQ_PSN), -EINVAL);
	/* UD needs a Q_Key, not access flags */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, rc_init), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
					IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, rc_rtr), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, rc_rtr), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, rc_rts), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	/* skipping states */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTS, rc_rts), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTS, rc_rts), -EINVAL);
	/* SQD and SQE */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, IBV_QP_STATE), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE), 0);
	/* any state to RESET or ERR, with nothing else */
	for (int s = IBV_QPS_RESET; s <= IBV_QPS_ERR; s++) {
		EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, s, IBV_QPS_ERR, IBV_QP_STATE), 0);
		EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, s, IBV_QPS_RESET, IBV_QP_STATE), 0);
		EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, s, IBV_QPS_ERR, IBV_QP_STATE | IBV_QP_QKEY), -EINVAL);
	}
	/* no IBV_QP_STATE, unknown type, bad state numbers */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, rc_init & ~IBV_QP_STATE), -EINVAL);
	/* no IBV_QP_STATE: a cur -> cur change, INIT -> INIT the access flags */
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT,
					IBV_QP_ACCESS_FLAGS), 0);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT,
					IBV_QP_AV), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_XRC_SEND, IBV_QPS_RESET, IBV_QPS_INIT, rc_init), -EINVAL);
	EXPECT_EQ(ursa_qp_transition_ok(IBV_QPT_RC, 99, IBV_QPS_INIT, rc_init), -EINVAL);
	return TEST_RESULT();
}

static int test_ring_wraparound(void)
{
	struct ursa_ring r;
	uint32_t next = 0, expect = 0;

	REQUIRE(ursa_ring_init(&r, 5, sizeof(uint32_t)) == 0);
	EXPECT_EQ(r.size, 8);
	/* Start near the 32-bit wrap so the free-running indices overflow. */
	atomic_store(&r.head, UINT32_MAX - 3);
	atomic_store(&r.tail, UINT32_MAX - 3);
	for (int round = 0; round < 100; round++) {
		uint32_t sp = ursa_ring_space(&r), k = (uint32_t)round % 7 + 1;

		EXPECT_EQ(sp, 8);
		for (uint32_t i = 0; i < k; i++)
			*(uint32_t *)ursa_ring_prod_slot(&r, i) = next++;
		ursa_ring_produce(&r, k);
		EXPECT_EQ(ursa_ring_ready(&r), k);
		for (uint32_t i = 0; i < k; i++) {
			EXPECT_EQ(*(uint32_t *)ursa_ring_peek(&r), expect++);
			ursa_ring_consume(&r, 1);
		}
	}
	/* A corrupt tail (an untrusted peer) never reads as ready work. */
	atomic_store(&r.tail, atomic_load(&r.head) + 1000);
	EXPECT_EQ(ursa_ring_ready(&r), 0);
	ursa_ring_fini(&r);
	return TEST_RESULT();
}

/* An MR as registration leaves it, enough for the published table. */
static void fake_mr(struct ursa_mr *mr, struct ursa_pd *pd, uint32_t rkey,
		    unsigned int access, uint64_t iova, uint64_t len)
{
	memset(mr, 0, sizeof(*mr));
	mr->pd = pd;
	mr->ibv.rkey = rkey;
	mr->access = access;
	mr->iova = iova;
	mr->length = len;
	mr->addr = 0x7f0000000000ull + iova;
}

static uint32_t pub_hash(uint32_t rkey)
{
	return (rkey * 0x9e3779b1u) >> 20;	/* as pub.c places entries */
}

/* ursa_pub_find without the position and seq */
static bool find(const struct ursa_pubmem *m, uint32_t rkey,
		 struct ursa_pub_mr *e)
{
	uint32_t where;
	unsigned int seq;

	return ursa_pub_find(m, rkey, e, &where, &seq);
}

static int test_pub_table(void)
{
	struct ursa_pd pd = { 0 }, pd2 = { 0 };
	struct ursa_mr mr, ro, nr, crowd[URSA_PUB_PROBE + 1];
	struct ursa_qp qp;
	struct ursa_pub_mr e;
	const struct ursa_pubmem *m;
	uint32_t base = 0x123456u, n = 0;
	int fd, slot, bad;
	uint64_t w;
	uint32_t where;
	unsigned int seq;

	pd.ibv.handle = 7;
	pd2.ibv.handle = 8;
	fd = ursa_pub_fd();
	REQUIRE(fd >= 0);
	m = ursa_pub_map(fd);	/* a requester's read-only view */
	REQUIRE(m != NULL);
	fake_mr(&mr, &pd, 0xabcdef01u, IBV_ACCESS_LOCAL_WRITE |
		IBV_ACCESS_REMOTE_WRITE, 0x1000, 0x3000);
	ursa_pub_mr_add(&mr);
	EXPECT_TRUE(mr.pub_idx != 0);
	EXPECT_TRUE(ursa_pub_find(m, 0xabcdef01u, &e, &where, &seq));
	EXPECT_TRUE(!(seq & 1) && ursa_pub_same(m, where, seq));
	EXPECT_EQ(e.pd, 7);
	EXPECT_EQ(e.iova, 0x1000);
	EXPECT_EQ(e.length, 0x3000);
	EXPECT_EQ(e.addr, 0x7f0000001000ull);
	EXPECT_TRUE(e.access & IBV_ACCESS_REMOTE_WRITE);
	/* a neighbouring key and key 0 are not found */
	EXPECT_TRUE(!find(m, 0xabcdef02u, &e));
	EXPECT_TRUE(!find(m, 0, &e));
	/* MRs without remote rights are not published at all */
	fake_mr(&nr, &pd, 0x11111111u, IBV_ACCESS_LOCAL_WRITE, 0, 4096);
	ursa_pub_mr_add(&nr);
	EXPECT_EQ(nr.pub_idx, 0);
	EXPECT_TRUE(!find(m, 0x11111111u, &e));
	/* removal: gone for requesters (and a copy taken before is seen
	 * stale), and idempotent */
	EXPECT_TRUE(ursa_pub_mr_del(&mr));
	EXPECT_TRUE(!ursa_pub_same(m, where, seq));
	EXPECT_TRUE(!find(m, 0xabcdef01u, &e));
	EXPECT_TRUE(!ursa_pub_mr_del(&mr));
	/* a crowded neighbourhood: the key that finds no slot among its
	 * probes is not published (its accesses go through the target) */
	for (uint32_t k = base; n < URSA_PUB_PROBE + 1; k++)
		if (pub_hash(k) == pub_hash(base)) {
			fake_mr(&crowd[n], &pd2, k, IBV_ACCESS_LOCAL_WRITE |
				IBV_ACCESS_REMOTE_READ, 0, 4096);
			ursa_pub_mr_add(&crowd[n]);
			n++;
		}
	bad = 0;
	for (uint32_t i = 0; i < URSA_PUB_PROBE; i++)
		bad += !find(m, crowd[i].ibv.rkey, &e) || e.pd != 8;
	EXPECT_EQ(bad, 0);
	EXPECT_EQ(crowd[URSA_PUB_PROBE].pub_idx, 0);
	EXPECT_TRUE(!find(m, crowd[URSA_PUB_PROBE].ibv.rkey, &e));
	for (uint32_t i = 0; i <= URSA_PUB_PROBE; i++)
		ursa_pub_mr_del(&crowd[i]);
	/* re-registration: the entry follows the MR's new rights */
	fake_mr(&ro, &pd, 0x55aa55aau, IBV_ACCESS_REMOTE_READ, 0, 8192);
	ursa_pub_mr_add(&ro);
	EXPECT_TRUE(ursa_pub_find(m, 0x55aa55aau, &e, &where, &seq) &&
		    !(e.access & IBV_ACCESS_REMOTE_WRITE));
	ursa_pub_mr_del(&ro);
	ro.access |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	ursa_pub_mr_add(&ro);
	/* the same key in the same slot again: the old copy is stale */
	EXPECT_TRUE(!ursa_pub_same(m, where, seq));
	EXPECT_TRUE(find(m, 0x55aa55aau, &e) &&
		    (e.access & IBV_ACCESS_REMOTE_WRITE));
	ursa_pub_mr_del(&ro);
	/* a QP's word: QPN, PD, accepting state and remote rights */
	memset(&qp, 0, sizeof(qp));
	qp.pd = &pd;
	qp.ex.qp_base.qp_num = 0xbeef12;
	atomic_init(&qp.state, IBV_QPS_INIT);
	slot = ursa_pub_qp_slot(&qp);
	REQUIRE(slot >= 0 && slot < (int)URSA_PUB_QPS);
	w = atomic_load(&((struct ursa_pubmem *)m)->qp[slot]);
	EXPECT_EQ(w & 0xffffff, 0xbeef12);
	EXPECT_EQ(w >> 32, 7);
	EXPECT_EQ((w >> 24) & URSA_PUBQ_ACCEPT, 0);
	atomic_store(&qp.state, IBV_QPS_RTR);
	qp.attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
	ursa_pub_qp_update(&qp);
	w = atomic_load(&((struct ursa_pubmem *)m)->qp[slot]);
	/* no responder resources: READs must reach the target, which NAKs */
	EXPECT_EQ((w >> 24) & 7, URSA_PUBQ_ACCEPT);
	qp.attr.max_dest_rd_atomic = 1;
	ursa_pub_qp_update(&qp);
	w = atomic_load(&((struct ursa_pubmem *)m)->qp[slot]);
	EXPECT_EQ((w >> 24) & 7, URSA_PUBQ_ACCEPT | URSA_PUBQ_READ);
	EXPECT_EQ(ursa_pub_qp_slot(&qp), slot);	/* one slot per QP */
	ursa_pub_qp_free(&qp);
	EXPECT_EQ(atomic_load(&((struct ursa_pubmem *)m)->qp[slot]), 0);
	ursa_pub_unmap(m);
	return TEST_RESULT();
}

/* A requester refuses a table that is too short or not sealed against
 * shrinking (its owner could make it fault). */
static int test_pub_map_refuses(void)
{
	int fd = memfd_create("t", MFD_ALLOW_SEALING);

	REQUIRE(fd >= 0);
	REQUIRE(ftruncate(fd, 4096) == 0);
	EXPECT_TRUE(ursa_pub_map(fd) == NULL);
	REQUIRE(ftruncate(fd, sizeof(struct ursa_pubmem)) == 0);
	EXPECT_TRUE(ursa_pub_map(fd) == NULL);	/* right size, not sealed */
	REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	EXPECT_TRUE(ursa_pub_map(fd) == NULL);	/* others may still write it */
	REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0);
	EXPECT_TRUE(ursa_pub_map(fd) == NULL);	/* sealed, but no magic */
	close(fd);
	/* a well-formed table in an ordinary file, which cannot be sealed
	 * (F_GET_SEALS fails: not "all seals set") */
	{
		struct ursa_pubmem h = { .magic = URSA_PUB_MAGIC,
					 .nqp = URSA_PUB_QPS, .nmr = URSA_PUB_MRS };
		char path[] = "/tmp/ursa-pub-XXXXXX";

		fd = mkstemp(path);
		REQUIRE(fd >= 0);
		unlink(path);
		REQUIRE(ftruncate(fd, sizeof(struct ursa_pubmem)) == 0);
		REQUIRE(pwrite(fd, &h, offsetof(struct ursa_pubmem, qp), 0) ==
			(ssize_t)offsetof(struct ursa_pubmem, qp));
		EXPECT_TRUE(ursa_pub_map(fd) == NULL);
		close(fd);
	}
	return TEST_RESULT();
}

/* Memfds that cross a process boundary (ursa_memfd_shared/_map_peer):
 * the owner writes through its mapping; no holder of the descriptor (here,
 * a second open of it through /proc, as a peer's is) can write, map it
 * writable or resize it; and a receiver refuses what is short or lacks the
 * seals it relies on. */
static int test_memfd_seals(void)
{
	char path[64], b = 'x';
	void *own = NULL, *m;
	int fd, other, plain;

	fd = ursa_memfd_shared("t", 8192, true, &own);
	REQUIRE(fd >= 0 && own);
	memset(own, 7, 8192);			/* the owner writes */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	other = open(path, O_RDWR);
	REQUIRE(other >= 0);
	EXPECT_TRUE(mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, other, 0) ==
		    MAP_FAILED);
	EXPECT_EQ(pwrite(other, &b, 1, 0), -1);
	EXPECT_EQ(ftruncate(other, 0), -1);
	EXPECT_EQ(ftruncate(other, 1 << 20), -1);
	m = ursa_memfd_map_peer(other, 8192, F_SEAL_FUTURE_WRITE, false);
	REQUIRE(m != NULL);
	EXPECT_EQ(((unsigned char *)m)[100], 7);
	munmap(m, 8192);
	EXPECT_TRUE(ursa_memfd_map_peer(other, 8193, 0, false) == NULL);
	EXPECT_TRUE(ursa_memfd_map_peer(other, 8192, 0, true) == NULL);
	close(other);
	munmap(own, 8192);
	close(fd);
	/* both sides write a channel: writable, but sealed in size */
	fd = ursa_memfd_shared("t", 4096, false, &own);
	REQUIRE(fd >= 0);
	EXPECT_TRUE(ursa_memfd_map_peer(fd, 4096, F_SEAL_FUTURE_WRITE, false) == NULL);
	m = ursa_memfd_map_peer(fd, 4096, 0, true);
	EXPECT_TRUE(m != NULL);
	if (m)
		munmap(m, 4096);
	EXPECT_EQ(ftruncate(fd, 0), -1);
	munmap(own, 4096);
	close(fd);
	/* a memfd a peer could truncate under us */
	plain = memfd_create("t", MFD_ALLOW_SEALING);
	REQUIRE(plain >= 0 && ftruncate(plain, 4096) == 0);
	EXPECT_TRUE(ursa_memfd_map_peer(plain, 4096, 0, true) == NULL);
	close(plain);
	return TEST_RESULT();
}

/* ursa_mutex (ctx->qp_lock): threads that all add under it end with the
 * exact sum, and some of them had to sleep in the futex (the counter of
 * sleepers' wakes is not visible, so the test makes the holder slow: a
 * sleep inside the lock forces the others past their spin). */
struct mutex_arg {
	ursa_mutex *m;
	uint64_t *sum;
	int n;
};

static void *mutex_adder(void *p)
{
	struct mutex_arg *a = p;

	for (int i = 0; i < a->n; i++) {
		ursa_mutex_lock(a->m);
		/* a plain read-modify-write: only the lock makes it exact */
		*(volatile uint64_t *)a->sum = *(volatile uint64_t *)a->sum + 1;
		if (!(i % 5000))
			usleep(200);
		ursa_mutex_unlock(a->m);
	}
	return NULL;
}

static int test_mutex(void)
{
	ursa_mutex m;
	uint64_t sum = 0;
	pthread_t t[4];
	struct mutex_arg a = { &m, &sum, 100000 };

	atomic_init(&m.v, 0);
	EXPECT_TRUE(ursa_mutex_trylock(&m));
	EXPECT_TRUE(!ursa_mutex_trylock(&m));	/* held: refused */
	ursa_mutex_unlock(&m);
	EXPECT_TRUE(ursa_mutex_trylock(&m));
	ursa_mutex_unlock(&m);
	for (int i = 0; i < 4; i++)
		REQUIRE(pthread_create(&t[i], NULL, mutex_adder, &a) == 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	EXPECT_EQ(sum, 4 * 100000);
	EXPECT_EQ(atomic_load(&m.v), 0);	/* free, no sleeper marked */
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(keys_unique_random, "keys are unique and not sequential"),
	TEST_ENTRY(keys_revoked_and_quarantined, "freed keys fail and stay unused"),
	TEST_ENTRY(keys_rekey, "type 2 window key byte changes"),
	TEST_ENTRY(pin_refcounts_overlaps, "overlapping pins are counted"),
	TEST_ENTRY(pin_limit_and_failure, "memlock limit and undo on failure"),
	TEST_ENTRY(pin_gone_relocks, "pages unmapped under a pin are locked anew at the next pin"),
	TEST_ENTRY(mtt_page_sizes, "translation entries follow page sizes"),
	TEST_ENTRY(vma_query, "the mapping of an address: ioctl and text agree"),
	TEST_ENTRY(mtt_self_real_memory, "translation table of real memory"),
	TEST_ENTRY(qp_state_table, "IBTA modify-QP table"),
	TEST_ENTRY(ring_wraparound, "ring indices wrap and stay bounded"),
	TEST_ENTRY(mutex, "the QP lock: exact under four threads, trylock refuses a held lock"),
	TEST_ENTRY(pub_table, "published rkeys and QP words, as a requester reads them"),
	TEST_ENTRY(pub_map_refuses, "a short, unsealed or foreign table is refused"),
	TEST_ENTRY(rcache, "registration cache: hits, misses, stale ranges, eviction, drain"),
	TEST_ENTRY(memfd_seals, "shared memfds: only the owner writes, nobody resizes, receivers check"),
};

int main(int argc, char **argv)
{
	return harness_main(tests, (int)ARRAY_SIZE(tests), argc, argv);
}
