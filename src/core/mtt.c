// SPDX-License-Identifier: MIT
/*
 * mtt.c - building and searching translation tables (see mtt.h).
 *
 * Telling a transparent huge page apart from 512 small ones needs the page
 * flags: with CAP_SYS_ADMIN /proc/self/pagemap gives the frame number and
 * /proc/kpageflags its THP bit. Without it, smaps only says how many bytes of
 * a mapping are huge; when that equals every aligned 2 MiB block of the
 * mapping the answer is still exact, otherwise ursa stays conservative and
 * lists 4 KiB entries. Where the kernel has the PAGEMAP_SCAN ioctl (Linux
 * 6.7), anonymous memory needs neither: it reports which pages are mapped
 * huge, for the range alone, without privileges.
 */
#include "mtt.h"
#include "vma.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define BASE_SHIFT 12
#define THP_SHIFT 21
#define THP_SIZE (1ul << THP_SHIFT)
#define KPF_THP 22

static int grow(struct ursa_mtt *m, uint32_t *cap)
{
	struct ursa_mtt_entry *n;
	uint32_t c = *cap ? *cap * 2 : 64;

	n = realloc(m->e, (size_t)c * sizeof(*n));
	if (!n)
		return -ENOMEM;
	m->e = n;
	*cap = c;
	return 0;
}

static int push(struct ursa_mtt *m, uint32_t *cap, uintptr_t va, uint32_t sh)
{
	if (m->n == *cap && grow(m, cap))
		return -ENOMEM;
	m->e[m->n].va = va;
	m->e[m->n].shift = sh;
	m->n++;
	if (sh > BASE_SHIFT)
		m->huge++;
	return 0;
}

/* Whole aligned 2 MiB blocks of a VMA. */
static uint64_t thp_capacity(const struct ursa_vma *v)
{
	uintptr_t a = (v->start + THP_SIZE - 1) & ~(THP_SIZE - 1);
	uintptr_t b = v->end & ~(THP_SIZE - 1);

	return b > a ? b - a : 0;
}

int ursa_mtt_build(struct ursa_mtt *m, uintptr_t start, uintptr_t end,
		   const struct ursa_vma *vmas, size_t nvmas,
		   ursa_thp_probe_fn probe)
{
	uint32_t cap = 0;
	uintptr_t va = start;

	memset(m, 0, sizeof(*m));
	while (va < end) {
		const struct ursa_vma *v = NULL;
		uint32_t sh = BASE_SHIFT;

		for (size_t i = 0; i < nvmas; i++)
			if (vmas[i].start <= va && va < vmas[i].end) {
				v = &vmas[i];
				break;
			}
		if (v && v->kernel_page_shift > BASE_SHIFT) {
			sh = v->kernel_page_shift;
			va &= ~((1ul << sh) - 1);
		} else if (v && v->anon_huge_bytes && !(va & (THP_SIZE - 1)) &&
			   va + THP_SIZE <= v->end) {
			int huge = probe ? probe(va) : -1;

			if (huge < 0)
				huge = v->anon_huge_bytes >= thp_capacity(v);
			if (huge)
				sh = THP_SHIFT;
		}
		if (push(m, &cap, va, sh)) {
			ursa_mtt_free(m);
			return -ENOMEM;
		}
		va += 1ul << sh;
	}
	return 0;
}

static int kpageflags_probe(uintptr_t va)
{
	static int no_access;
	uint64_t ent, flags;
	int fd, ret = -1;

	if (no_access)
		return -1;
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto deny;
	if (pread(fd, &ent, 8, (off_t)(va >> BASE_SHIFT) * 8) != 8) {
		close(fd);
		return -1;
	}
	close(fd);
	/* Bit 63: present; bits 0-54: PFN, zero without CAP_SYS_ADMIN. */
	if (!(ent >> 63))
		return -1;
	if (!(ent & ((1ull << 55) - 1)))
		goto deny;
	fd = open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto deny;
	if (pread(fd, &flags, 8, (off_t)(ent & ((1ull << 55) - 1)) * 8) == 8)
		ret = (flags >> KPF_THP) & 1;
	close(fd);
	return ret;
deny:
	no_access = 1;
	return -1;
}

/* May memfds have pages larger than 4 KiB (shmem transparent huge pages
 * that apply without madvise)? */
static bool shmem_huge(void)
{
	static _Atomic int huge = -1;	/* threads may race to set it: same value */
	char buf[128] = "";
	int fd;

	if (atomic_load_explicit(&huge, memory_order_relaxed) < 0) {
		fd = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
			  O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			if (read(fd, buf, sizeof(buf) - 1) < 0)
				buf[0] = 0;
			close(fd);
		}
		/* unreadable: assume they may */
		atomic_store_explicit(&huge, !buf[0] || strstr(buf, "[always]") ||
				      strstr(buf, "[within_size]") ||
				      strstr(buf, "[force]"), memory_order_relaxed);
	}
	return atomic_load_explicit(&huge, memory_order_relaxed);
}

/* Does [start, end) touch a mapping that is a file or a hugetlb mapping
 * ("/anon_hugepage"), whose pages may be larger than 4 KiB? A memfd of
 * ursa_mem_alloc (shmap.h) has huge pages only when shmem huge pages are
 * on. Unsure (no maps): yes. */
static bool named_in(uintptr_t start, uintptr_t end)
{
	struct ursa_vma_info v;

	for (uintptr_t at = start; at < end; at = v.end) {
		int ret = ursa_vma_query(at, true, false, &v);

		if (ret == -ENOENT || (!ret && v.start >= end))
			return false;
		if (ret || (v.name[0] == '/' &&
			    (strncmp(v.name, "/memfd:ursa-mem ", 16) ||
			     shmem_huge())))
			return true;
	}
	return false;
}

/* Does [start, end) hold a whole aligned 2 MiB block, which may be one
 * transparent huge page? */
static bool holds_block(uintptr_t start, uintptr_t end)
{
	uintptr_t a2 = (start + THP_SIZE - 1) & ~(THP_SIZE - 1);

	return a2 + THP_SIZE <= end;
}

/* The kernel's ABI (include/uapi/linux/fs.h, Linux 6.7), spelled out for
 * older headers. */
struct pm_page_region {
	uint64_t start, end, categories;
};
struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask;
	uint64_t return_mask;
};
#define PM_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_PAGE_IS_HUGE (1u << 6)

/* The huge pages of [start, end) as the kernel maps them, for scan_probe. */
static _Thread_local const struct pm_page_region *scan_regs;
static _Thread_local size_t scan_n;

static int scan_probe(uintptr_t va)
{
	for (size_t i = 0; i < scan_n; i++)
		if (scan_regs[i].start <= va && va + THP_SIZE <= scan_regs[i].end)
			return 1;
	return 0;
}

/* Build the table of anonymous [start, end) from PAGEMAP_SCAN: 0, or -1
 * when the kernel cannot tell (then smaps does). */
static int build_scanned(struct ursa_mtt *m, uintptr_t start, uintptr_t end)
{
	static atomic_int absent;
	size_t cap = ((end - start) >> THP_SHIFT) + 1, n = 0;
	struct pm_page_region *r;
	struct ursa_vma v = { start, end, BASE_SHIFT, 1 };
	struct pm_scan_arg a;
	int fd, ret = -1;

	if (atomic_load_explicit(&absent, memory_order_relaxed))
		return -1;
	r = calloc(cap, sizeof(*r));
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	for (uintptr_t at = start; r && fd >= 0 && at < end && n < cap;) {
		long got;

		memset(&a, 0, sizeof(a));
		a.size = sizeof(a);
		a.start = at;
		a.end = end;
		a.vec = (uintptr_t)(r + n);
		a.vec_len = cap - n;
		a.category_mask = PM_PAGE_IS_HUGE;
		a.return_mask = PM_PAGE_IS_HUGE;
		got = ioctl(fd, PM_SCAN, &a);
		if (got < 0) {
			if (errno == ENOTTY || errno == EINVAL)
				atomic_store_explicit(&absent, 1, memory_order_relaxed);
			n = SIZE_MAX;
			break;
		}
		n += (size_t)got;
		if (a.walk_end <= at || a.walk_end >= end)
			break;
		at = a.walk_end;
	}
	if (fd >= 0)
		close(fd);
	if (r && n != SIZE_MAX) {
		scan_regs = r;
		scan_n = n;
		ret = ursa_mtt_build(m, start, end, &v, 1, scan_probe);
		scan_regs = NULL;
		scan_n = 0;
	}
	free(r);
	return ret;
}

bool ursa_mtt_small_only(uintptr_t start, uintptr_t end)
{
	return !holds_block(start, end) && !named_in(start, end);
}

int ursa_mtt_build_self(struct ursa_mtt *m, uintptr_t start, uintptr_t end)
{
	bool named;
	struct ursa_vma *vmas = NULL, *cur = NULL;
	size_t n = 0, cap = 0;
	char line[512];
	FILE *f;
	int ret;

	/*
	 * Only a range that may hold pages larger than 4 KiB (a whole 2 MiB
	 * block, or a named mapping, which /proc/self/maps tells without
	 * walking anything) asks more: PAGEMAP_SCAN for anonymous memory, or
	 * else smaps, which walks the page tables of every mapping of the
	 * process (a hundred times an mlock of 4 KiB).
	 */
	named = named_in(start, end);
	if (!named && !holds_block(start, end))	/* 4 KiB pages throughout */
		return ursa_mtt_build(m, start, end, NULL, 0, NULL);
	if (!named) {
		ret = build_scanned(m, start, end);
		if (ret >= 0)
			return ret;
	}
	f = fopen("/proc/self/smaps", "re");
	if (!f)
		return ursa_mtt_build(m, start, end, NULL, 0, NULL);
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b, kb;

		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') &&
		    line[0] != ' ' && strncmp(line, "VmFlags", 7)) {
			cur = NULL;
			if (b <= start || a >= end)
				continue;
			if (n == cap) {
				struct ursa_vma *nv;

				cap = cap ? cap * 2 : 8;
				nv = realloc(vmas, cap * sizeof(*nv));
				if (!nv) {
					fclose(f);
					free(vmas);
					return -ENOMEM;
				}
				vmas = nv;
			}
			cur = &vmas[n++];
			memset(cur, 0, sizeof(*cur));
			cur->start = a;
			cur->end = b;
			cur->kernel_page_shift = BASE_SHIFT;
		} else if (cur && sscanf(line, "KernelPageSize: %lu kB", &kb) == 1) {
			uint32_t sh = 10;

			while ((1ul << sh) < kb * 1024)
				sh++;
			cur->kernel_page_shift = sh;
		} else if (cur && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
			cur->anon_huge_bytes = (uint64_t)kb * 1024;
		}
	}
	fclose(f);
	ret = ursa_mtt_build(m, start, end, vmas, n, kpageflags_probe);
	free(vmas);
	return ret;
}

void ursa_mtt_free(struct ursa_mtt *m)
{
	free(m->e);
	memset(m, 0, sizeof(*m));
}

long ursa_mtt_search(const struct ursa_mtt *m, uintptr_t va)
{
	long lo = 0, hi = (long)m->n - 1;

	while (lo <= hi) {
		long mid = lo + (hi - lo) / 2;
		const struct ursa_mtt_entry *e = &m->e[mid];

		if (va < e->va)
			hi = mid - 1;
		else if (va >= e->va + (1ul << e->shift))
			lo = mid + 1;
		else
			return mid;
	}
	return -1;
}
