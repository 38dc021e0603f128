// SPDX-License-Identifier: MIT
/*
 * shmap.c - moving registered pages into memfds other processes can map,
 * and back (design and rules in shmap.h).
 *
 * The copies go through the kernel (pwrite and pread system calls made
 * directly): the pages may hold bytes a sanitizer considers poisoned (the
 * redzones of globals in .bss), and this code moves memory, it does not
 * read the application's objects.
 */
#include "shmap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pin.h"
#include "vma.h"
#include "../util/util.h"

#define SHMAP_PAGE 4096ul

struct region {
	uintptr_t start, end;
	int fd;
	uint64_t ino;
	uint32_t refs;		/* MRs whose pages overlap the region */
	struct region *next;
};

static pthread_mutex_t shmap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;
static int (*world_stop)(void);
static void (*world_start)(void);
static bool world_stopped;	/* by quiet_begin, under shmap_lock */

void ursa_shmap_set_world(int (*stop)(void), void (*start)(void))
{
	pthread_mutex_lock(&shmap_lock);
	world_stop = stop;
	world_start = start;
	pthread_mutex_unlock(&shmap_lock);
}

/* Threads of this process, or -1. */
static int count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static void quiet_end(void)
{
	if (world_stopped)
		world_start();
	world_stopped = false;
}

/* Stop the world for a move (see shmap.h): true if no thread but the
 * caller can write memory until quiet_end(). */
static bool quiet_begin(void)
{
	int mine = 0, n = count_threads();

	if (n == 1)
		return true;
	if (!world_stop || n < 1)
		return false;
	mine = world_stop();
	if (mine < 0)
		return false;
	world_stopped = true;
	if (count_threads() == 1 + mine)
		return true;
	quiet_end();
	return false;
}

bool ursa_shmap_enabled(void)
{
	return ursa_env_long("URSA_MAP", 1, 0, 1) &&
	       ursa_env_long("URSA_DIRECT", 1, 0, 1) &&
	       sysconf(_SC_PAGESIZE) == (long)SHMAP_PAGE;
}

/* The mapping that holds [s, e) whole, or -ENOENT. */
static int vma_of(uintptr_t s, uintptr_t e, struct ursa_vma_info *v)
{
	int ret = ursa_vma_query(s, false, false, v);

	if (!ret && v->end < e)
		ret = -ENOENT;
	return ret;
}

/* Is the memfd of r still mapped over all of it? */
static bool region_in_place(const struct region *r)
{
	struct ursa_vma_info v;

	return !vma_of(r->start, r->end, &v) && v.ino == r->ino &&
	       v.start == r->start && v.perms[3] == 's';
}

/* Whole-buffer kernel copies, restarted after partial transfers. */
static int kcopy(bool to_file, int fd, uintptr_t mem, size_t n)
{
	size_t done = 0;

	while (done < n) {
		long r = syscall(to_file ? SYS_pwrite64 : SYS_pread64, fd,
				 (void *)(mem + done), n - done, (off_t)done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		done += (size_t)r;
	}
	return 0;
}

static struct region *region_create(uintptr_t s, uintptr_t e)
{
	size_t n = e - s;
	struct region *r;
	struct stat st;
	struct ursa_vma_info v;
	int fd;

	/* Private anonymous, readable and writable: no file, no hugetlbfs,
	 * not the stack. ([heap] is the brk area: anonymous too.) */
	if (vma_of(s, e, &v) || strcmp(v.perms, "rw-p") || v.ino ||
	    (v.name[0] && strcmp(v.name, "[heap]")))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	fd = memfd_create("ursa-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto fail;
	/* Sealed size: a requester's mapping can never run past the end
	 * and fault. */
	if (ftruncate(fd, (off_t)n) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
	    fstat(fd, &st) || kcopy(true, fd, s, n))
		goto fail;
	/* One call replaces the private pages with the memfd's: the
	 * addresses stay valid throughout, the contents are the same. */
	if (mmap((void *)s, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		 fd, 0) == MAP_FAILED)
		goto fail;
	r->start = s;
	r->end = e;
	r->fd = fd;
	r->ino = (uint64_t)st.st_ino;
	return r;
fail:
	if (fd >= 0)
		close(fd);
	free(r);
	return NULL;
}

/* Back to private anonymous memory with the same contents (the world
 * stopped, or a fork child). */
static void region_restore(struct region *r)
{
	size_t n = r->end - r->start;
	void *tmp;

	if (!region_in_place(r))
		goto out;	/* the application replaced it: leave it */
	/* Populated first: the copy then takes no page fault per page (a
	 * fifth faster for 64 MiB here). */
	tmp = mmap(NULL, n, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (tmp == MAP_FAILED)
		goto out;	/* stays shared: still correct, only unusual */
	if (kcopy(false, r->fd, (uintptr_t)tmp, n) ||
	    mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED,
		   (void *)r->start) == MAP_FAILED)
		munmap(tmp, n);
out:
	close(r->fd);
	free(r);
}

void ursa_shmap_reg(uintptr_t a, uint64_t len, uintptr_t ps, uintptr_t pe,
		    bool share, struct ursa_pinmap *pins,
		    struct ursa_shmap_ref *out)
{
	uintptr_t is = (a + SHMAP_PAGE - 1) & ~(SHMAP_PAGE - 1);
	uintptr_t ie = (a + len) & ~(SHMAP_PAGE - 1);
	struct region *r, *hit = NULL;
	bool overlap = false;

	memset(out, 0, sizeof(*out));
	out->fd = -1;
	pthread_mutex_lock(&shmap_lock);
	if (share && ie > is) {
		for (r = regions; r; r = r->next) {
			if (r->start >= ie || r->end <= is)
				continue;
			if (r->start <= is && r->end >= ie && region_in_place(r))
				hit = r;
			else
				overlap = true;
		}
		if (!hit && !overlap && !ursa_pinned_any(pins, is, ie) &&
		    quiet_begin()) {
			hit = region_create(is, ie);
			quiet_end();
			if (hit) {
				hit->next = regions;
				regions = hit;
			}
		}
		if (overlap)
			hit = NULL;
	}
	if (hit) {
		out->fd = hit->fd;
		out->ino = hit->ino;
		out->start = hit->start;
		out->len = hit->end - hit->start;
	}
	for (r = regions; r; r = r->next)
		if (r->start < pe && r->end > ps)
			r->refs++;
	pthread_mutex_unlock(&shmap_lock);
}

void ursa_shmap_unreg(uintptr_t ps, uintptr_t pe)
{
	struct region **pp = &regions, *r;
	bool any = false, quiet = false;

	pthread_mutex_lock(&shmap_lock);
	for (r = regions; r; r = r->next)
		if (r->start < pe && r->end > ps && r->refs)
			any |= !--r->refs;
	/* Regions no MR references go back now if the world stops; else
	 * they stay shared (still correct) until a later call finds it
	 * quiet. */
	for (r = regions; r && !any; r = r->next)
		any = !r->refs;
	if (any)
		quiet = quiet_begin();
	while (quiet && (r = *pp)) {
		if (!r->refs) {
			*pp = r->next;
			region_restore(r);
			continue;
		}
		pp = &r->next;
	}
	if (quiet)
		quiet_end();
	pthread_mutex_unlock(&shmap_lock);
}

void ursa_shmap_atfork_child(void)
{
	/* The child has no MRs (dev_atfork_child) and, like after any
	 * fork, a copy of the parent's memory of its own: shared pages
	 * would let its writes reach the parent's buffers. */
	pthread_mutex_init(&shmap_lock, NULL);
	while (regions) {
		struct region *r = regions;

		regions = r->next;
		region_restore(r);
	}
}
