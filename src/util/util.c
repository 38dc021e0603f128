// SPDX-License-Identifier: MIT
/*
 * util.c - logging, environment parsing and the key/QPN random stream.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int ursa_log_level(void)
{
	return (int)ursa_cfg()->log;
}

void ursa_log(int level, const char *fmt, ...)
{
	va_list ap;
	char buf[512];

	/* (errors never ask the configuration: its parsing logs them) */
	if (level > URSA_LOG_ERR && level > ursa_log_level())
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ursa: %s\n", buf);
}

long ursa_env_long(const char *name, long def, long min, long max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 0);
	if (errno || *end || v < min || v > max) {
		ursa_err("ignoring %s=%s (expected an integer in [%ld, %ld])",
			 name, s, min, max);
		return def;
	}
	return v;
}

/* xoshiro256** (Blackman and Vigna, public domain algorithm). */
static pthread_mutex_t rand_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rand_s[4];
static bool rand_seeded;	/* under rand_lock; false again in a child */
static pthread_once_t rand_once = PTHREAD_ONCE_INIT;

/* A child of fork() must not draw the parent's sequence (keys, PSNs): it
 * seeds anew. (An atfork handler, not a getpid() per draw: registration
 * draws two keys, and each getpid is a system call.) */
static void rand_atfork_child(void)
{
	pthread_mutex_init(&rand_lock, NULL);
	rand_seeded = false;
}

static void rand_register(void)
{
	pthread_atfork(NULL, NULL, rand_atfork_child);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static void rand_seed(void)
{
	uint64_t seed[4] = { 0 };
	ssize_t n = getrandom(seed, sizeof(seed), 0);

	if (n != (ssize_t)sizeof(seed)) {
		/* No entropy source: mix the clock and pid, never all-zero. */
		seed[0] = ursa_now_ns() ^ 0x9e3779b97f4a7c15ull;
		seed[1] = (uint64_t)getpid() * 0xbf58476d1ce4e5b9ull;
		seed[2] = (uint64_t)(uintptr_t)&seed ^ 0x94d049bb133111ebull;
		seed[3] = 1;
	}
	for (int i = 0; i < 4; i++)
		rand_s[i] = seed[i];
	rand_seeded = true;
}

uint64_t ursa_rand64(void)
{
	uint64_t r, t;

	pthread_once(&rand_once, rand_register);
	pthread_mutex_lock(&rand_lock);
	if (!rand_seeded)
		rand_seed();
	r = rotl(rand_s[1] * 5, 7) * 9;
	t = rand_s[1] << 17;
	rand_s[2] ^= rand_s[0];
	rand_s[3] ^= rand_s[1];
	rand_s[1] ^= rand_s[2];
	rand_s[0] ^= rand_s[3];
	rand_s[2] ^= t;
	rand_s[3] = rotl(rand_s[3], 45);
	pthread_mutex_unlock(&rand_lock);
	return r;
}

void ursa_mutex_wait(ursa_mutex *m)
{
	/* A holder usually lets go within a pass: spin a little first. */
	for (int i = 0; i < 100; i++) {
		ursa_cpu_relax();
		if (atomic_load_explicit(&m->v, memory_order_relaxed) == 0 &&
		    ursa_mutex_trylock(m))
			return;
	}
	/* Mark it contended (2) and sleep while it stays held; whoever
	 * takes it from here holds it as contended, so its unlock wakes
	 * the next sleeper. Acquire, as trylock's. */
	while (atomic_exchange_explicit(&m->v, 2, memory_order_acquire) != 0)
		syscall(SYS_futex, &m->v, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void ursa_mutex_wake(ursa_mutex *m)
{
	syscall(SYS_futex, &m->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

bool ursa_have_prefetchw;

__attribute__((constructor)) static void prefetchw_probe(void)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned int a, b, c, d;

	if (__get_cpuid(0x80000001, &a, &b, &c, &d))
		ursa_have_prefetchw = c & (1u << 8);
#endif
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010	/* Linux 5.1 */
#endif

int ursa_memfd_shared(const char *name, size_t size, bool only_we_write,
		      void **map)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), err;
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size))
		goto fail;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	/* After the mapping: the future-write seal leaves it writable. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
		  (only_we_write ? F_SEAL_FUTURE_WRITE : 0) | F_SEAL_SEAL)) {
		err = -errno;
		munmap(p, size);
		close(fd);
		return err;
	}
	*map = p;
	return fd;
fail:
	err = -errno;
	close(fd);
	return err;
}

void *ursa_memfd_map_peer(int fd, size_t size, int seals, bool writable)
{
	int want = F_SEAL_SHRINK | F_SEAL_GROW | seals;
	int have = fcntl(fd, F_GET_SEALS);
	struct stat st;
	void *p;

	if (have < 0 || (have & want) != want || fstat(fd, &st) ||
	    (size_t)st.st_size < size)
		return NULL;
	p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0),
		 MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}
