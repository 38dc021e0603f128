/* SPDX-License-Identifier: MIT */
/*
 * harness.h - a small test harness (after Redis testhelp.h, rdma-core's
 * EXPECT_EQ and fabtests' TEST_ENTRY).
 *
 * Each test binary lists its tests in a table and calls harness_main().
 * Every test runs in its own forked child with an alarm, so a crash or a
 * hang fails that test only and prints its name. Output is one line per
 * test ("ok", "FAIL", "skip") and a closing "N passed, N failed, N skipped".
 * Exit status: 0 all passed, 1 some failed, 77 all skipped.
 *
 * Options: a test name (or substring) to filter, --list, --timeout S.
 */
#ifndef URSA_HARNESS_H
#define URSA_HARNESS_H

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

enum { TEST_PASS = 0, TEST_FAIL = 1, TEST_SKIP = 77 };

struct test {
	const char *name;
	int (*fn)(void);
	const char *desc;
};

#define TEST_ENTRY(n, d) { #n, test_##n, d }

extern int harness_failed;
extern char harness_skip_reason[256];

void harness_fail(const char *file, int line, const char *expr,
		  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int harness_main(const struct test *t, int n, int argc, char **argv);

#define EXPECT_TRUE(c) \
	do { if (!(c)) harness_fail(__FILE__, __LINE__, #c, "false"); } while (0)
#define EXPECT_EQ(a, b) \
	do { long long _a = (long long)(a), _b = (long long)(b); \
	     if (_a != _b) harness_fail(__FILE__, __LINE__, #a " == " #b, \
			"expected %lld (0x%llx), got %lld (0x%llx)", \
			_b, (unsigned long long)_b, _a, (unsigned long long)_a); \
	} while (0)
#define EXPECT_NE(a, b) \
	do { long long _a = (long long)(a), _b = (long long)(b); \
	     if (_a == _b) harness_fail(__FILE__, __LINE__, #a " != " #b, \
			"both are %lld", _a); } while (0)
/* A call that must fail with errno e: the libibverbs NULL+errno rule. */
#define EXPECT_NULL_ERRNO(call, e) \
	do { errno = 0; void *_p = (void *)(call); int _e = errno; \
	     if (_p || _e != (e)) harness_fail(__FILE__, __LINE__, #call, \
			"expected NULL with errno %d (%s), got %p with errno %d (%s)", \
			(e), strerror(e), _p, _e, strerror(_e)); } while (0)
#define REQUIRE(c) \
	do { if (!(c)) { harness_fail(__FILE__, __LINE__, #c, "required"); \
			 return TEST_FAIL; } } while (0)
#define SKIP(...) \
	do { snprintf(harness_skip_reason, sizeof(harness_skip_reason), \
		      __VA_ARGS__); return TEST_SKIP; } while (0)
#define TEST_RESULT() (harness_failed ? TEST_FAIL : TEST_PASS)

#endif
