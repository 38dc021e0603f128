// SPDX-License-Identifier: MIT
/*
 * shmap.c - memory other processes of the host can map: allocations in
 * sealed memfds, and the lookup registration does (design in shmap.h).
 */
#include "shmap.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vma.h"
#include "../util/util.h"

#define SHMAP_PAGE 4096ul

struct alloc {
	uintptr_t start;
	size_t len;
	int fd;
	uint64_t ino;
	struct alloc *next;
};

static pthread_mutex_t shmap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;

int ursa_shmap_alloc(size_t len, void **out)
{
	struct alloc *a;
	struct stat st;
	void *p;
	int fd;

	if (!len || len > SIZE_MAX - SHMAP_PAGE)
		return -EINVAL;
	len = (len + SHMAP_PAGE - 1) & ~(SHMAP_PAGE - 1);
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	/* Sealed against resizing: a requester that mapped it can never
	 * take SIGBUS from a truncation (transport/shm.c checks). */
	fd = ursa_memfd_shared("ursa-mem", len, false, &p);
	if (fd < 0 || fstat(fd, &st)) {
		int ret = fd < 0 ? fd : -errno;

		if (fd >= 0) {
			munmap(p, len);
			close(fd);
		}
		free(a);
		return ret;
	}
	a->start = (uintptr_t)p;
	a->len = len;
	a->fd = fd;
	a->ino = (uint64_t)st.st_ino;
	pthread_mutex_lock(&shmap_lock);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&shmap_lock);
	*out = p;
	return 0;
}

int ursa_shmap_free(void *p)
{
	struct alloc **pp, *a = NULL;

	pthread_mutex_lock(&shmap_lock);
	for (pp = &allocs; *pp; pp = &(*pp)->next)
		if ((*pp)->start == (uintptr_t)p) {
			a = *pp;
			*pp = a->next;
			break;
		}
	pthread_mutex_unlock(&shmap_lock);
	if (!a)
		return -EINVAL;
	munmap(p, a->len);
	close(a->fd);
	free(a);
	return 0;
}

/* Is [s, e) mapped shared from the memfd of a, at the offsets it was
 * allocated with? (mlock splits a mapping: walk every piece.) */
static bool still_there(const struct alloc *a, uintptr_t s, uintptr_t e)
{
	struct ursa_vma_info v;

	for (uintptr_t at = s; at < e; at = v.end)
		if (ursa_vma_query(at, false, false, &v) || v.perms[3] != 's' ||
		    v.perms[0] != 'r' || v.perms[1] != 'w' || v.ino != a->ino ||
		    v.start - v.offset != a->start || v.end <= at)
			return false;
	return true;
}

void ursa_shmap_find(uintptr_t s, uintptr_t e, struct ursa_shmap_ref *out)
{
	struct alloc *a;

	out->fd = -1;
	out->ino = out->start = out->len = 0;
	pthread_mutex_lock(&shmap_lock);
	for (a = allocs; a; a = a->next)
		if (s >= a->start && e <= a->start + a->len)
			break;
	if (a && still_there(a, s, e)) {
		out->fd = a->fd;
		out->ino = a->ino;
		out->start = a->start;
		out->len = a->len;
	}
	pthread_mutex_unlock(&shmap_lock);
}
