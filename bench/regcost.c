// SPDX-License-Identifier: MIT
/*
 * regcost.c - the cost of memory registration: ibv_reg_mr + ibv_dereg_mr
 * from 4 KiB to 1 GiB, with 4 KiB pages, transparent huge pages and
 * hugetlbfs (where the host has huge pages reserved), on demand
 * (IBV_ACCESS_ON_DEMAND: no pinning), the first time (the registration
 * cache flushed after each deregistration, so its munlock is counted) and
 * cached (the same range again), next to bare mlock + munlock of the same
 * range (the physical floor of pinning), with the translation entries each
 * MR gets (ursa_mr_info). Then the lesson of registration cost as an
 * experiment: PUTs (an RDMA WRITE of the value, waited for) whose source
 * buffer is registered per request, once up front, or per request through
 * the cache.
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

enum kind { K4K, K4K_C, KTHP, KTHP_C, KHTLB, KODP, KMLOCK, NKIND };
static const char *kname[] = { "4k", "4k_cached", "thp", "thp_cached",
			       "hugetlb", "odp", "mlock" };

/* An aligned, touched region (THP asked for or refused, or hugetlbfs
 * pages); NULL if there is none. *base, *blen: what to munmap. */
static void *region(size_t len, enum kind k, void **base, size_t *blen)
{
	size_t align = 2u << 20;
	int thp = k == KTHP || k == KTHP_C;
	char *p, *a;

	if (k == KHTLB) {
		if (len < align)
			return NULL;
		p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		*base = a = p;
		*blen = len;
	} else {
		p = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		*base = p;
		*blen = len + align;
		a = (char *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
		madvise(a, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	}
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
	int cached = k == K4K_C || k == KTHP_C;

	*entries = 0;
	ursa_rcache_flush();
	if (cached) {
		/* once before, untimed: then every timed one is a hit */
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);

		if (!mr)
			return -1;
		ibv_dereg_mr(mr);
	}
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
			/* the first time: what deregistration defers to
			 * the cache's eviction (munlock) counts */
			if (!cached)
				ursa_rcache_flush();
		}
		t[r] = now_us() - t0;
	}
	ursa_rcache_flush();
	qsort(t, (size_t)reps, sizeof(t[0]), cmp_d);
	return t[reps / 2];
}

/* Two RC QPs of this process connected to each other (the loop path). */
static int connect_pair(struct ibv_context *ctx, struct ibv_qp *q[2])
{
	union ibv_gid gid;

	if (ibv_query_gid(ctx, 1, 0, &gid))
		return -1;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
			.qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

		if (ibv_modify_qp(q[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096,
			.dest_qp_num = q[!i]->qp_num, .max_dest_rd_atomic = 1,
			.min_rnr_timer = 1 };

		a.ah_attr.is_global = 1;
		a.ah_attr.port_num = 1;
		a.ah_attr.grh.dgid = gid;
		if (ibv_modify_qp(q[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			return -1;
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		if (ibv_modify_qp(q[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
				  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -1;
	}
	return 0;
}

enum put_mode { PUT_PER_REQ, PUT_ONCE, PUT_CACHED };
static const char *put_name[] = { "registered per request", "registered once",
				  "per request, cached" };

/* n PUTs of len bytes from src into the store's MR: median latency (us)
 * of one (register if asked, WRITE, wait, deregister); total in *secs. */
static double puts_run(struct ibv_pd *pd, struct ibv_qp *q, struct ibv_cq *cq,
		       char *src, size_t len, struct ibv_mr *dst, enum put_mode m,
		       int n, double *secs)
{
	struct ibv_mr *once = m == PUT_ONCE ?
		ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE) : NULL;
	double *t = calloc((size_t)n, sizeof(*t)), t_all = now_us(), med;

	if (!t || (m == PUT_ONCE && !once))
		return -1;
	ursa_rcache_flush();
	for (int i = 0; i < n; i++) {
		double t0 = now_us();
		struct ibv_mr *mr = once ? once :
			ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_sge sge = { (uintptr_t)src, (uint32_t)len, 0 };
		struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
		struct ibv_wc wc;
		int got = 0;

		if (!mr)
			return -1;
		src[0] = (char)i;	/* the application writes its value */
		sge.lkey = mr->lkey;
		wr.wr.rdma.remote_addr = (uintptr_t)dst->addr;
		wr.wr.rdma.rkey = dst->rkey;
		if (ibv_post_send(q, &wr, &bad))
			return -1;
		while (!got)
			got = ibv_poll_cq(cq, 1, &wc);
		if (got < 0 || wc.status != IBV_WC_SUCCESS)
			return -1;
		if (!once) {
			ibv_dereg_mr(mr);
			if (m == PUT_PER_REQ)
				ursa_rcache_flush();
		}
		t[i] = now_us() - t0;
	}
	*secs = (now_us() - t_all) / 1e6;
	if (once)
		ibv_dereg_mr(once);
	ursa_rcache_flush();
	qsort(t, (size_t)n, sizeof(*t), cmp_d);
	med = t[n / 2];
	free(t);
	return med;
}

/* The key-value lesson: PUT latency and throughput by registration
 * strategy, over the in-process loop path (the copy is one memcpy, so
 * registration is what differs). */
static void put_experiment(struct ibv_context *ctx, struct ibv_pd *pd, FILE *csv,
			   int quick)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 } };
	struct ibv_qp *q[2] = { NULL, NULL };
	size_t sizes[] = { 4096, 1u << 20 };
	size_t maxlen = 1u << 20;
	char *src = aligned_alloc(4096, maxlen), *store = aligned_alloc(4096, maxlen);
	struct ibv_mr *dst;

	ia.send_cq = ia.recv_cq = cq;
	if (cq) {
		q[0] = ibv_create_qp(pd, &ia);
		q[1] = ibv_create_qp(pd, &ia);
	}
	if (!src || !store || !q[0] || !q[1] || connect_pair(ctx, q)) {
		printf("put experiment: setup failed\n");
		return;
	}
	memset(src, 1, maxlen);
	memset(store, 0, maxlen);
	dst = ibv_reg_mr(pd, store, maxlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!dst)
		return;
	printf("\nPUT (RDMA WRITE of the value, waited for) by how its buffer is registered\n");
	printf("%9s %-24s %12s %12s %10s\n", "value", "registration", "median us",
	       "PUTs/s", "MB/s");
	if (csv)
		fprintf(csv, "\nput_bytes,mode,median_us,puts_per_s,mb_per_s\n");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int n = sizes[i] <= 4096 ? (quick ? 2000 : 20000) : (quick ? 200 : 1000);

		for (int m = PUT_PER_REQ; m <= PUT_CACHED; m++) {
			double secs = 0, med = puts_run(pd, q[0], cq, src, sizes[i], dst,
						      (enum put_mode)m, n, &secs);

			if (med < 0) {
				printf("%9zu %-24s failed\n", sizes[i], put_name[m]);
				continue;
			}
			printf("%5zu KiB %-24s %12.2f %12.0f %10.1f\n", sizes[i] >> 10,
			       put_name[m], med, n / secs, n * (double)sizes[i] / secs / 1e6);
			if (csv)
				fprintf(csv, "%zu,%s,%.3f,%.0f,%.1f\n", sizes[i], put_name[m],
					med, n / secs, n * (double)sizes[i] / secs / 1e6);
		}
	}
	ibv_dereg_mr(dst);
	ibv_destroy_qp(q[0]);
	ibv_destroy_qp(q[1]);
	ibv_destroy_cq(cq);
	free(src);
	free(store);
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
	{
		/* warm up: the first registrations of a process open
		 * /proc/self/maps, grow tables, fault in code */
		void *base = NULL;
		size_t blen = 0;
		void *buf = region(1u << 20, K4K, &base, &blen);
		unsigned e;

		if (buf) {
			measure(pd, buf, 4096, K4K, 63, &e);
			measure(pd, buf, 4096, KMLOCK, 63, &e);
			munmap(base, blen);
		}
	}
	printf("registration: ibv_reg_mr + ibv_dereg_mr, median (us); translation entries in ()\n");
	printf("first: the registration cache flushed after each (its munlock counted);\n"
	       "cached: the same range registered again\n");
	printf("%9s %15s %9s %15s %9s %15s %13s %9s  %8s %8s\n", "size", "4k first",
	       "4k cached", "THP first", "THP cached", "hugetlbfs", "on demand", "mlock+unl",
	       "first/ml", "cach/1st");
	for (size_t len = 4096; len <= max; len *= 4) {
		double us[NKIND];
		unsigned ent[NKIND];
		int reps = len <= (64u << 10) ? 63 : len <= (1u << 20) ? 41 :
			   len <= (64u << 20) ? 9 : 3;
		char h[32];

		for (int k = 0; k < NKIND; k++) {
			void *base = NULL;
			size_t blen = 0;
			void *buf = region(len, (enum kind)k, &base, &blen);

			ent[k] = 0;
			us[k] = buf ? measure(pd, buf, len, (enum kind)k, reps, &ent[k]) : -1;
			if (buf)
				munmap(base, blen);
			if (csv && us[k] >= 0)
				fprintf(csv, "%zu,%s,%.2f,%u,%.2f\n", len, kname[k], us[k], ent[k],
					us[k] / ((double)len / (1 << 20)));
		}
		if (us[KHTLB] >= 0)
			snprintf(h, sizeof(h), "%.1f (%u)", us[KHTLB], ent[KHTLB]);
		else
			snprintf(h, sizeof(h), "-");
		printf("%5zu %s %9.1f (%5u) %9.1f %9.1f (%5u) %9.1f %15s %6.1f (%5u) %9.1f  %7.2fx %7.2fx\n",
		       len >= (1u << 20) ? len >> 20 : len >> 10, len >= (1u << 20) ? "MiB" : "KiB",
		       us[K4K], ent[K4K], us[K4K_C], us[KTHP], ent[KTHP], us[KTHP_C], h,
		       us[KODP], ent[KODP], us[KMLOCK],
		       us[KMLOCK] > 0 ? us[K4K] / us[KMLOCK] : 0,
		       us[K4K] > 0 ? us[K4K_C] / us[K4K] : 0);
		fflush(stdout);
	}
	puts("(hugetlbfs '-': no huge pages reserved on this host, vm.nr_hugepages)");
	put_experiment(ctx, pd, csv, max < (1u << 30));
	if (csv)
		fclose(csv);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return 0;
}
