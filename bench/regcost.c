// SPDX-License-Identifier: MIT
/*
 * regcost.c - the cost of memory registration: ibv_reg_mr + ibv_dereg_mr
 * from 4 KiB to 1 GiB, with 4 KiB pages, with transparent huge pages, and
 * on demand (IBV_ACCESS_ON_DEMAND: no pinning), next to bare mlock +
 * munlock of the same range (the physical floor of pinning), and the
 * translation entries each MR gets (ursa_mr_info).
 *
 *   bench/regcost [--quick] [--csv FILE]
 *
 * The memory is touched before it is registered, so the figures are the
 * registration's, not the page faults'. Median of several runs per size.
 * Reports; asserts nothing.
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ursa/ursa.h>

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

enum kind { K4K, KTHP, KODP, KMLOCK };
static const char *kname[] = { "4k", "thp", "odp", "mlock" };

/* An aligned, touched region; THP asked for or refused. *base is what to
 * munmap (len + 2 MiB). */
static void *region(size_t len, int thp, void **base)
{
	size_t align = 2u << 20;
	char *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *a;

	if (p == MAP_FAILED)
		return NULL;
	*base = p;
	a = (char *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
	madvise(a, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	for (size_t o = 0; o < len; o += 4096)
		a[o] = 1;
	return a;
}

/* median time (us) of one reg+dereg (or mlock+munlock); entries of the MR */
static double measure(struct ibv_pd *pd, void *buf, size_t len, enum kind k,
		      int reps, unsigned *entries)
{
	double t[64];
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		     IBV_ACCESS_REMOTE_READ | (k == KODP ? IBV_ACCESS_ON_DEMAND : 0);

	*entries = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now_us();

		if (k == KMLOCK) {
			if (mlock(buf, len))
				return -1;
			munlock(buf, len);
		} else {
			struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
			struct ursa_mr_info mi;

			if (!mr)
				return -1;
			if (r == 0 && !ursa_mr_info(mr, &mi)) {
				/* (outside the timing would be cleaner; the
				 * call reads a few fields) */
				*entries = mi.entries;
			}
			ibv_dereg_mr(mr);
		}
		t[r] = now_us() - t0;
	}
	qsort(t, (size_t)reps, sizeof(t[0]), cmp_d);
	return t[reps / 2];
}

int main(int argc, char **argv)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	size_t max = 1u << 30;
	FILE *csv = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			max = 64u << 20;
		else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
			csv = fopen(argv[++i], "w");
		else {
			fprintf(stderr, "usage: regcost [--quick] [--csv FILE]\n");
			return 2;
		}
	}
	if (!pd) {
		fprintf(stderr, "regcost: no device\n");
		return 1;
	}
	if (csv)
		fprintf(csv, "bytes,kind,us,entries,us_per_mib\n");
	printf("registration: ibv_reg_mr + ibv_dereg_mr, median (us); translation entries\n");
	printf("%10s %12s %7s %12s %7s %12s %7s %12s  %s\n", "size", "4k pages", "entries",
	       "THP", "entries", "on demand", "entries", "mlock+munlock", "4k/mlock");
	for (size_t len = 4096; len <= max; len *= 4) {
		double us[4];
		unsigned ent[4];
		int reps = len <= (1u << 20) ? 41 : len <= (64u << 20) ? 9 : 3;

		for (int k = K4K; k <= KMLOCK; k++) {
			void *base = NULL, *buf = region(len, k == KTHP, &base);

			ent[k] = 0;
			us[k] = buf ? measure(pd, buf, len, (enum kind)k, reps, &ent[k]) : -1;
			if (buf)
				munmap(base, len + (2u << 20));
			if (csv)
				fprintf(csv, "%zu,%s,%.2f,%u,%.2f\n", len, kname[k], us[k], ent[k],
					us[k] / ((double)len / (1 << 20)));
		}
		printf("%7zu %s %12.1f %7u %12.1f %7u %12.1f %7u %12.1f  %6.2fx\n",
		       len >= (1u << 20) ? len >> 20 : len >> 10, len >= (1u << 20) ? "MiB" : "KiB",
		       us[K4K], ent[K4K], us[KTHP], ent[KTHP], us[KODP], ent[KODP], us[KMLOCK],
		       us[KMLOCK] > 0 ? us[K4K] / us[KMLOCK] : 0);
		fflush(stdout);
	}
	if (csv)
		fclose(csv);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return 0;
}
