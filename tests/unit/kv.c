// SPDX-License-Identifier: MIT
/*
 * kv.c (unit) - the ursa-kv table (apps/kv/kv_table.c): what a one-sided
 * reader relies on. A slot caught halfway through a change fails its check
 * word; a block that moved, was freed or reused fails its version or
 * checksum; freed blocks wait out the quarantine; the buddy allocator
 * splits and merges; full buckets and the heap's end are refused, not
 * overrun.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../../apps/kv/kv_verbs.h"

static int put(struct kv_table *t, const char *key, const char *val)
{
	uint32_t kl = (uint32_t)strlen(key), vl = (uint32_t)strlen(val);
	int64_t off = kv_table_alloc(t, kl, vl);

	if (off < 0)
		return (int)off;
	memcpy(kv_table_val(t, (uint64_t)off, kl), val, vl);
	return kv_table_install(t, key, kl, (uint64_t)off, vl);
}

/* What a reader that READ this slot and its block would accept. */
static int reader_accepts(struct kv_table *t, const struct kv_slot *s,
			  const char *key)
{
	const struct kv_block *b = (const struct kv_block *)(t->heap + s->off);
	uint32_t kl = (uint32_t)strlen(key);

	return kv_slot_check(s) == s->check && b->ver && b->ver == s->ver &&
	       b->klen == kl && b->vlen == s->vlen && !memcmp(b + 1, key, kl) &&
	       kv_sum(b->ver, b + 1, kl, (const uint8_t *)(b + 1) + kl, s->vlen) == b->sum;
}

static int test_put_get_del(void)
{
	struct kv_table t;
	struct kv_slot *s;

	REQUIRE(kv_table_init(&t, 64, 2 << 20) == 0);
	EXPECT_EQ(put(&t, "alpha", "one"), KV_OK);
	s = kv_table_find(&t, "alpha", 5);
	REQUIRE(s);
	EXPECT_EQ(s->vlen, 3);
	EXPECT_TRUE(!memcmp(kv_table_val(&t, s->off, 5), "one", 3));
	EXPECT_TRUE(reader_accepts(&t, s, "alpha"));
	EXPECT_EQ(s->ver % 2, 0);
	EXPECT_EQ(put(&t, "alpha", "second"), KV_OK);
	EXPECT_EQ(kv_table_find(&t, "alpha", 5)->vlen, 6);
	EXPECT_EQ(t.nkeys, 1);
	EXPECT_TRUE(kv_table_find(&t, "alph", 4) == NULL);
	EXPECT_EQ(kv_table_del(&t, "alpha", 5), KV_OK);
	EXPECT_TRUE(kv_table_find(&t, "alpha", 5) == NULL);
	EXPECT_EQ(kv_table_del(&t, "alpha", 5), KV_NOTFOUND);
	EXPECT_EQ(t.nkeys, 0);
	kv_table_free(&t);
	return TEST_RESULT();
}

static int test_torn_slot_detected(void)
{
	struct kv_table t;
	struct kv_slot before, after, mixed;
	size_t half = offsetof(struct kv_slot, off);

	REQUIRE(kv_table_init(&t, 64, 2 << 20) == 0);
	REQUIRE(put(&t, "k", "value-1") == KV_OK);
	before = *kv_table_find(&t, "k", 1);
	REQUIRE(put(&t, "k", "value-number-2") == KV_OK);
	after = *kv_table_find(&t, "k", 1);
	/* a READ that saw the first half old and the second half new, and
	 * the other way round */
	memcpy(&mixed, &before, sizeof(mixed));
	memcpy((char *)&mixed + half, (char *)&after + half, sizeof(mixed) - half);
	EXPECT_NE(kv_slot_check(&mixed), mixed.check);
	memcpy(&mixed, &after, sizeof(mixed));
	memcpy((char *)&mixed + half, (char *)&before + half, sizeof(mixed) - half);
	EXPECT_NE(kv_slot_check(&mixed), mixed.check);
	/* the old slot still checks, but its block was freed: refused */
	EXPECT_EQ(kv_slot_check(&before), before.check);
	EXPECT_TRUE(!reader_accepts(&t, &before, "k"));
	EXPECT_TRUE(reader_accepts(&t, &after, "k"));
	kv_table_free(&t);
	return TEST_RESULT();
}

static int test_block_change_detected(void)
{
	struct kv_table t;
	struct kv_slot *s;
	uint8_t *v;

	REQUIRE(kv_table_init(&t, 64, 2 << 20) == 0);
	REQUIRE(put(&t, "key", "0123456789") == KV_OK);
	s = kv_table_find(&t, "key", 3);
	v = kv_table_val(&t, s->off, 3);
	v[5] ^= 1;		/* a byte rewritten under the reader */
	EXPECT_TRUE(!reader_accepts(&t, s, "key"));
	v[5] ^= 1;
	EXPECT_TRUE(reader_accepts(&t, s, "key"));
	kv_table_free(&t);
	return TEST_RESULT();
}

static int test_quarantine_split_merge(void)
{
	struct kv_table t;
	int64_t a, b, c, x, y;
	const uint32_t big = (1u << 20) + 1;	/* a 2 MiB block */
	int n = 0;

	REQUIRE(kv_table_init(&t, 64, 4u << 20) == 0);	/* two 2 MiB blocks */
	a = kv_table_alloc(&t, 1, big);
	REQUIRE(a >= 0);
	kv_table_release(&t, (uint64_t)a, 1, big);
	b = kv_table_alloc(&t, 1, big);
	EXPECT_TRUE(b >= 0 && b != a);	/* freed just now: the other one */
	c = kv_table_alloc(&t, 1, big);
	EXPECT_EQ(c, a);		/* full: the quarantine gives way */
	EXPECT_EQ(kv_table_alloc(&t, 1, 10), -ENOSPC);
	kv_table_release(&t, (uint64_t)b, 1, big);
	kv_table_release(&t, (uint64_t)c, 1, big);
	usleep(60000);
	/* small blocks split a big one, within the heap, never overlapping */
	while ((x = kv_table_alloc(&t, 1, 100)) >= 0) {
		EXPECT_TRUE((uint64_t)x + 128 <= t.heap_len && x % 128 == 0);
		n++;
	}
	EXPECT_EQ(n, (4 << 20) / 128);
	/* freed, they merge back into blocks big enough for 1 MiB values */
	for (uint64_t off = 0; off < t.heap_len; off += 128)
		kv_table_release(&t, off, 1, 100);
	usleep(60000);
	x = kv_table_alloc(&t, 1, big);
	y = kv_table_alloc(&t, 1, big);
	EXPECT_TRUE(x >= 0 && y >= 0 && x != y);
	EXPECT_EQ(kv_table_alloc(&t, 64, KV_MAX_VAL * 2), -ENOSPC);
	kv_table_free(&t);
	return TEST_RESULT();
}

static int test_full_bucket(void)
{
	struct kv_table t;
	int ok = 0, full = 0;

	/* one bucket: the ninth key has no slot */
	REQUIRE(kv_table_init(&t, 1, 2 << 20) == 0);
	for (int i = 0; i < KV_SLOTS + 1; i++) {
		char key[16];

		snprintf(key, sizeof(key), "k%d", i);
		int st = put(&t, key, "v");

		ok += st == KV_OK;
		full += st == KV_ENOSPC;
	}
	EXPECT_EQ(ok, KV_SLOTS);
	EXPECT_EQ(full, 1);
	EXPECT_EQ(kv_table_del(&t, "k0", 2), KV_OK);
	EXPECT_EQ(put(&t, "k8", "v"), KV_OK);
	kv_table_free(&t);
	EXPECT_EQ(kv_table_init(&t, 3, 4096), -EINVAL);	/* not a power of two */
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(put_get_del, "PUT, overwrite, GET, DELETE"),
	TEST_ENTRY(torn_slot_detected, "a slot read halfway through a change fails its check"),
	TEST_ENTRY(block_change_detected, "a value rewritten under a reader fails its checksum"),
	TEST_ENTRY(quarantine_split_merge, "freed blocks wait; big blocks split, small ones merge back"),
	TEST_ENTRY(full_bucket, "a full bucket refuses a new key; a deleted slot is reused"),
};

int main(int argc, char **argv)
{
	return harness_main(tests, (int)(sizeof(tests) / sizeof(tests[0])), argc, argv);
}
