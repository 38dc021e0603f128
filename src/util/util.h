/* SPDX-License-Identifier: MIT */
/*
 * util.h - small helpers shared by every layer: logging, clocks, the random
 * generator behind keys and QPNs, container_of and friends.
 *
 * Logging goes to stderr and is controlled by URSA_LOG (0 = errors only,
 * the default; 1 = info; 2 = debug). Messages carry the "ursa:" prefix so a
 * user running an unmodified binary can tell where a line came from.
 */
#ifndef URSA_UTIL_H
#define URSA_UTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "limits.h"

#define URSA_HIDDEN __attribute__((visibility("hidden")))
#define URSA_EXPORT __attribute__((visibility("default")))

#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

enum { URSA_LOG_ERR = 0, URSA_LOG_INFO = 1, URSA_LOG_DEBUG = 2 };

void ursa_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int ursa_log_level(void);

#define ursa_err(...) ursa_log(URSA_LOG_ERR, __VA_ARGS__)
#define ursa_info(...) ursa_log(URSA_LOG_INFO, __VA_ARGS__)
#define ursa_dbg(...) ursa_log(URSA_LOG_DEBUG, __VA_ARGS__)

static inline uint64_t ursa_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* memcpy for a few bytes, in ascending order, without the call: an 8 B
 * WRITE's 7 bytes through glibc's memmove were a tenth of a same-host
 * post. */
static inline void ursa_copy_small(uint8_t *d, const uint8_t *s, uint64_t n)
{
	for (; n >= 8; n -= 8, d += 8, s += 8)
		memcpy(d, s, 8);
	if (n & 4) {
		memcpy(d, s, 4);
		d += 4;
		s += 4;
	}
	if (n & 2) {
		memcpy(d, s, 2);
		d += 2;
		s += 2;
	}
	if (n & 1)
		*d = *s;
}

/* Copy len (> 0) bytes, the last byte last, with release order: every
 * other byte of the message is visible before it, for readers that spin
 * on it (perftest's latency tests). */
static inline void ursa_copy_ordered(uint8_t *dst, const uint8_t *src,
				     uint64_t len)
{
	typedef uint64_t __attribute__((may_alias)) word_t;

	if (len == 8 && !((uintptr_t)dst & 7)) {
		/* One aligned 8-byte store is seen whole or not at all
		 * (single-copy atomic): its last byte is never early. */
		uint64_t v;

		memcpy(&v, src, 8);
		__atomic_store_n((word_t *)(void *)dst, v, __ATOMIC_RELEASE);
		return;
	}
	if (len <= 64)
		ursa_copy_small(dst, src, len - 1);
	else
		memcpy(dst, src, len - 1);
	__atomic_store_n(dst + len - 1, src[len - 1], __ATOMIC_RELEASE);
}

/* Range [va, va+len) inside [base, base+size), without overflow. */
static inline bool ursa_in_bounds(uint64_t base, uint64_t size, uint64_t va,
				  uint64_t len)
{
	return va >= base && len <= size && va - base <= size - len;
}

static inline void ursa_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* Ask for the cache line at p in the state to be written (exclusive), so
 * that a store to it a little later needs no further trip. A hint: it
 * never faults, whatever p is. (x86's PREFETCHW, where the CPU has it:
 * cpuid 0x80000001 ECX bit 8; else a prefetch for reading.) */
extern bool ursa_have_prefetchw;

static inline void ursa_prefetch_write(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
	if (ursa_have_prefetchw) {
		__asm__ __volatile__("prefetchw %0" : : "m"(*(const char *)p));
		return;
	}
#endif
	__builtin_prefetch(p, 1, 3);
}

/*
 * The mutex behind ctx->qp_lock, which every same-host post takes: taking
 * it is one compare-and-swap and releasing it one exchange, both inline (a
 * pthread mutex adds two calls and some forty instructions to
 * ibv_post_send's path). The three states of the classic futex mutex: 0
 * free, 1 held, 2 held and a thread may sleep on it. Not recursive, one
 * process.
 */
typedef struct {
	atomic_int v;
} ursa_mutex;

void ursa_mutex_wait(ursa_mutex *m);	/* lock's slow path (util.c) */
void ursa_mutex_wake(ursa_mutex *m);	/* wake one sleeper */

/* true when taken. Acquire: what the holder before us did is visible. */
static inline bool ursa_mutex_trylock(ursa_mutex *m)
{
	int free_ = 0;

	return atomic_compare_exchange_strong_explicit(&m->v, &free_, 1,
						       memory_order_acquire,
						       memory_order_relaxed);
}

static inline void ursa_mutex_lock(ursa_mutex *m)
{
	if (!ursa_mutex_trylock(m))
		ursa_mutex_wait(m);
}

/* Release: our writes under the lock before the next holder's reads. */
static inline void ursa_mutex_unlock(ursa_mutex *m)
{
	if (atomic_exchange_explicit(&m->v, 0, memory_order_release) == 2)
		ursa_mutex_wake(m);
}

/* Random numbers for keys and QPNs: a xoshiro256** stream seeded from
 * getrandom(), reseeded after fork. Not for cryptography, but 32 fresh bits
 * per key make a key unguessable from the ones handed out before it. */
uint64_t ursa_rand64(void);

/* Environment helpers: integer with default, bounded. */
long ursa_env_long(const char *name, long def, long min, long max);

/*
 * Memory shared with other processes (a memfd whose descriptor crosses a
 * socket). ursa_memfd_shared creates one of size bytes, maps it read-write
 * in *map, and seals it: its size never changes (F_SEAL_SHRINK, GROW), so
 * no holder can make another's accesses fault (SIGBUS), and with
 * only_we_write no holder can ever write it but this mapping
 * (F_SEAL_FUTURE_WRITE: no write(2), no new writable mapping). Returns the
 * descriptor or -errno.
 *
 * ursa_memfd_map_peer maps what a peer sent, after checking it: at least
 * size bytes, sealed against shrinking and growing, and sealed against
 * writes by others when the caller relies on that (seals). Read-only unless
 * writable. NULL if it fails a check.
 */
int ursa_memfd_shared(const char *name, size_t size, bool only_we_write,
		      void **map);
void *ursa_memfd_map_peer(int fd, size_t size, int seals, bool writable);

#endif
