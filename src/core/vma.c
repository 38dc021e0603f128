// SPDX-License-Identifier: MIT
/*
 * vma.c - the mapping of this process that holds an address (vma.h): by
 * the PROCMAP_QUERY ioctl where the kernel has it, else by the text of
 * /proc/self/maps.
 */
#include "vma.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* The kernel's ABI (include/uapi/linux/fs.h, Linux 6.11), spelled out here
 * because older kernel headers lack it. */
struct procmap_query {
	uint64_t size;
	uint64_t query_flags;
	uint64_t query_addr;
	uint64_t vma_start;
	uint64_t vma_end;
	uint64_t vma_flags;
	uint64_t vma_page_size;
	uint64_t vma_offset;
	uint64_t inode;
	uint32_t dev_major;
	uint32_t dev_minor;
	uint32_t vma_name_size;
	uint32_t build_id_size;
	uint64_t vma_name_addr;
	uint64_t build_id_addr;
};
_Static_assert(sizeof(struct procmap_query) == 104, "procmap_query ABI");
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
#define PQ_READ 0x01
#define PQ_WRITE 0x02
#define PQ_EXEC 0x04
#define PQ_SHARED 0x08
#define PQ_COVERING_OR_NEXT 0x10

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static int maps_fd = -1;
static atomic_int procmap_state;	/* 0 unknown, 1 works, -1 absent */

static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

/* One inherited across fork() names the parent: the child opens its own
 * (an atfork handler rather than a getpid() system call per query). */
static void maps_atfork_child(void)
{
	pthread_mutex_init(&maps_lock, NULL);
	if (maps_fd >= 0)
		close(maps_fd);
	maps_fd = -1;
}

static void maps_register(void)
{
	pthread_atfork(NULL, NULL, maps_atfork_child);
}

/* Our descriptor of /proc/self/maps for the ioctl, opened once per
 * process. */
static int maps_fd_get(void)
{
	int fd;

	pthread_once(&maps_once, maps_register);
	pthread_mutex_lock(&maps_lock);
	if (maps_fd < 0)
		maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	fd = maps_fd;
	pthread_mutex_unlock(&maps_lock);
	return fd;
}

static void set_name(struct ursa_vma_info *out, const char *s, size_t n)
{
	if (n >= sizeof(out->name))
		n = sizeof(out->name) - 1;
	memcpy(out->name, s, n);
	out->name[n] = 0;
}

/* 1: answered (ret in *ret); 0: the kernel has no PROCMAP_QUERY. */
static int query_ioctl(uintptr_t addr, bool next, struct ursa_vma_info *out,
		       int *ret)
{
	char name[PATH_MAX];
	struct procmap_query q;
	int fd = maps_fd_get();

	if (fd < 0)
		return 0;
	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.query_flags = next ? PQ_COVERING_OR_NEXT : 0;
	q.query_addr = addr;
	q.vma_name_addr = (uintptr_t)name;
	q.vma_name_size = sizeof(name);
	if (ioctl(fd, PROCMAP_QUERY, &q) < 0) {
		if (errno == ENOTTY || errno == EINVAL || errno == EOPNOTSUPP)
			return 0;
		*ret = -errno;
		return 1;
	}
	out->start = (uintptr_t)q.vma_start;
	out->end = (uintptr_t)q.vma_end;
	out->perms[0] = q.vma_flags & PQ_READ ? 'r' : '-';
	out->perms[1] = q.vma_flags & PQ_WRITE ? 'w' : '-';
	out->perms[2] = q.vma_flags & PQ_EXEC ? 'x' : '-';
	out->perms[3] = q.vma_flags & PQ_SHARED ? 's' : 'p';
	out->perms[4] = 0;
	out->ino = q.inode;
	out->offset = q.vma_offset;
	/* (vma_name_size counts the terminating NUL; 0: no name) */
	set_name(out, name, q.vma_name_size ? strnlen(name, q.vma_name_size) : 0);
	*ret = 0;
	return 1;
}

static const char *hex(const char *p, uint64_t *v)
{
	uint64_t x = 0;
	int d;

	for (;; p++) {
		if (*p >= '0' && *p <= '9')
			d = *p - '0';
		else if (*p >= 'a' && *p <= 'f')
			d = *p - 'a' + 10;
		else
			break;
		x = x << 4 | (uint64_t)d;
	}
	*v = x;
	return p;
}

static const char *field(const char *p)
{
	while (*p && *p != ' ')
		p++;
	while (*p == ' ')
		p++;
	return p;
}

/* One line of /proc/self/maps: "start-end perms offset dev inode   name". */
static bool parse_line(const char *l, struct ursa_vma_info *v)
{
	uint64_t a, b, off, ino = 0;
	const char *p = hex(l, &a);
	size_t n;

	if (*p != '-')
		return false;
	p = hex(p + 1, &b);
	if (*p != ' ' || strlen(p + 1) < 4)
		return false;
	memcpy(v->perms, p + 1, 4);
	v->perms[4] = 0;
	p = field(p + 1);		/* perms */
	hex(p, &off);
	p = field(field(p));		/* offset, dev */
	for (; *p >= '0' && *p <= '9'; p++)
		ino = ino * 10 + (uint64_t)(*p - '0');
	while (*p == ' ')
		p++;
	n = strcspn(p, "\n");
	v->start = (uintptr_t)a;
	v->end = (uintptr_t)b;
	v->ino = ino;
	v->offset = off;
	set_name(v, p, n);
	return true;
}

static int query_text(uintptr_t addr, bool next, struct ursa_vma_info *out)
{
	char line[PATH_MAX + 128];
	FILE *f = fopen("/proc/self/maps", "re");
	int ret = -ENOENT;

	if (!f)
		return -errno;
	/* (lines come in ascending address order) */
	while (fgets(line, sizeof(line), f)) {
		struct ursa_vma_info v;

		if (!parse_line(line, &v) || v.end <= addr)
			continue;
		if (v.start <= addr || next) {
			*out = v;
			ret = 0;
		}
		break;
	}
	fclose(f);
	return ret;
}

int ursa_vma_query(uintptr_t addr, bool next, bool text,
		   struct ursa_vma_info *out)
{
	int ret;

	if (!text && atomic_load_explicit(&procmap_state,
					  memory_order_relaxed) >= 0) {
		if (query_ioctl(addr, next, out, &ret)) {
			atomic_store_explicit(&procmap_state, 1,
					      memory_order_relaxed);
			return ret;
		}
		atomic_store_explicit(&procmap_state, -1, memory_order_relaxed);
	}
	return query_text(addr, next, out);
}
