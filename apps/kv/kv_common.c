// SPDX-License-Identifier: MIT
/*
 * kv_common.c - what the ursa-kv server and client share: the hash and the
 * checksums that make a torn one-sided read detectable, and blocking I/O
 * on the TCP connection. No verbs here (the unit tests link it alone).
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv.h"
#include <sys/socket.h>

/* 64-bit FNV-1a over words, with a final mix; never 0 (0 = empty slot). */
static uint64_t mix(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t w;

	for (; n >= 8; n -= 8, b += 8) {
		memcpy(&w, b, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; n; n--, b++)
		h = (h ^ *b) * 0x100000001b3ull;
	return h;
}

static uint64_t fin(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h;
}

uint64_t kv_hash(const void *key, size_t len)
{
	uint64_t h = fin(mix(0xcbf29ce484222325ull ^ len, key, len));

	return h ? h : 1;
}

uint64_t kv_sum(uint64_t ver, const void *key, size_t klen, const void *val,
		size_t vlen)
{
	uint64_t h = mix(0x84222325cbf29ce4ull, &ver, sizeof(ver));

	h = mix(h ^ klen, key, klen);
	return fin(mix(h ^ vlen, val, vlen));
}

uint64_t kv_slot_check(const struct kv_slot *s)
{
	uint64_t f[4] = { s->ver, s->khash, s->off,
			  (uint64_t)s->klen << 32 | s->vlen };

	return fin(mix(0x5157a7e5ull, f, sizeof(f))) | 1;
}

double kv_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* All of n bytes, or -1 (connection gone, or timed out). */
int kv_xio(int fd, void *p, size_t n, int out)
{
	size_t d = 0;

	while (d < n) {
		ssize_t r = out ? send(fd, (char *)p + d, n - d, MSG_NOSIGNAL) :
				  recv(fd, (char *)p + d, n - d, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		d += (size_t)r;
	}
	return 0;
}

const char *kv_status_str(int st)
{
	switch (st) {
	case KV_OK: return "ok";
	case KV_NOTFOUND: return "not found";
	case KV_EINVAL: return "invalid request";
	case KV_ENOSPC: return "no space";
	case KV_EIO: return "I/O error";
	default: return st < 0 ? strerror(-st) : "unknown status";
	}
}
