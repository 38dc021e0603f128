// SPDX-License-Identifier: MIT
/*
 * samehost.c - same-host benchmark: ursa between two processes, next to the
 * physical limits measured in the same run (memcpy of the same size, and a
 * cache-line ping-pong between two processes through shared memory).
 *
 *   bench/samehost [--quick] [--csv FILE]
 *
 * Latency: 8-byte WRITE one way (both sides spin on the last byte of their
 * buffer and poll the completion between post and spin, as perftest's
 * ib_write_lat does: half the round trip; next to the one-line ping-pong,
 * the same pattern with two lines and no ursa), SEND one
 * way (half a SEND ping-pong), READ and fetch-and-add round trips. Median
 * and p99 over the iterations, after a warm-up.
 * Bandwidth: WRITE and READ from 4 KiB to 64 MiB with one QP and with four
 * QPs, a window of 16 outstanding requests per QP.
 * Nothing here asserts a speed; it reports.
 */
#include <infiniband/verbs.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXQ 4
#define BUFSZ (64u << 20)

static int quick;
static int lat_only;	/* --lat N: only the WRITE latency, N round trips
			 * (for profiling) */
static int send_only;	/* --send N: only the SEND latency, N round trips */

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void pct(double *v, int n, double *med, double *p99)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	*med = v[n / 2];
	*p99 = v[(int)(n * 0.99)];
}

/* --- limits ---------------------------------------------------------------- */

static double memcpy_gbs(size_t sz)
{
	/* The same copies as the WRITE loop in bw(): alternately between
	 * two pairs of buffers (up to half of BUFSZ), so that both touch the
	 * same amount of memory; one pair reused would be cache resident up
	 * to twice the size (16 MiB: two thirds of a 32 MiB L3). b is not at
	 * a multiple of 4 KiB from a: small buffers malloc()ed back to back
	 * would otherwise alias in the store buffer (4K aliasing). */
	size_t halves = sz <= BUFSZ / 2 ? 2 : 1;
	char *a = malloc(halves * sz), *bb = malloc(halves * sz + 4096);
	char *b = bb + 1088;
	double t0, t, bytes = 0;
	int reps = (int)((quick ? 64u << 20 : 512u << 20) / sz) + 2;

	memset(a, 1, halves * sz);
	memset(b, 2, halves * sz);
	memcpy(b, a, sz); /* warm */
	t0 = now_us();
	for (int i = 0; i < reps; i++) {
		size_t off = (size_t)(i % halves) * sz;

		memcpy(b + off, a + off, sz);
		/* keep the copy: the compiler may not drop it */
		__asm__ __volatile__("" : : "r"(b) : "memory");
		a[off + (size_t)i % sz] = (char)i;
		bytes += (double)sz;
	}
	t = now_us() - t0;
	free(a);
	free(bb);
	return bytes / t / 1e3;
}

/*
 * One-way latency of a cache line bouncing between two processes. lines 1:
 * both write and spin on one line (the classic ping-pong: the limit the
 * targets name). lines 2: the pattern of a WRITE ping-pong without ursa:
 * each side spins on the last byte of a line of its own and places 8
 * bytes in the other's (7, then the last with release order, as ursa's
 * direct path does), so each one-way trip moves a line that the reader
 * holds and must lose first. The two figures bracket what the WRITE
 * latency can reach; ursa's own work is the distance to the second.
 */
static void pingpong_limit(int lines, double *med, double *p99)
{
	const int n = quick ? 2000 : 20000;
	volatile uint8_t *pg = mmap(NULL, 8192, PROT_READ | PROT_WRITE,
				    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	/* with two lines, on two pages, as two MRs would be */
	volatile uint64_t *a = (volatile uint64_t *)pg;
	volatile uint64_t *b = (volatile uint64_t *)(pg + (lines == 2 ? 4096 : 0));
	double *v = calloc((size_t)n, sizeof(double));
	pid_t pid;

	*a = *b = 0;
	pid = fork();
	if (pid == 0) {
		for (uint64_t i = 1; i <= (uint64_t)n * 2; i += 2) {
			while (*b != i)
				;
			*a = i + 1;
		}
		_exit(0);
	}
	for (int i = 0; i < n; i++) {
		uint64_t x = 2 * (uint64_t)i + 1;
		double t0 = now_us();

		*b = x;
		while (*a != x + 1)
			;
		v[i] = (now_us() - t0) / 2;
	}
	waitpid(pid, NULL, 0);
	pct(v, n, med, p99);
	free(v);
	munmap((void *)pg, 8192);
}

/*
 * The floor under a WRITE into memory the target did not share: one
 * process_vm_writev of 8 bytes (two vectors, the last byte last, as ursa's
 * direct path issues it) into another process. A private page of another
 * process can only be reached by a system call.
 */
static void cma_floor(double *med, double *p99)
{
	const int n = quick ? 2000 : 20000;
	static char page[4096] __attribute__((aligned(4096)));
	double *v = calloc((size_t)n, sizeof(double));
	char src[8] = "ursa-8B";
	struct iovec l = { src, 8 }, r[2] = { { page, 7 }, { page + 7, 1 } };
	pid_t pid;

	page[0] = 1;
	pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		pause();
		_exit(0);
	}
	for (int i = 0; i < n; i++) {
		double t0 = now_us();

		if (process_vm_writev(pid, &l, 1, r, 2, 0) != 8) {
			v[i] = -1;
			continue;
		}
		v[i] = now_us() - t0;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	pct(v, n, med, p99);
	free(v);
}

/* --- ursa setup ------------------------------------------------------------- */

struct info {
	uint32_t qpn[MAXQ];
	uint32_t rkey;
	uint64_t addr;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[MAXQ];
	struct ibv_mr *mr;
	char *buf;
};

static int side_open(struct side *s)
{
	struct ibv_device **l = ibv_get_device_list(NULL);

	memset(s, 0, sizeof(*s));
	if (!l || !l[0])
		return -1;
	s->ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!s->ctx)
		return -1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 4096, NULL, NULL, 0);
	{
		/* Memory the other process maps (ursa_mem_alloc, found at run
		 * time so that the program also runs on other libibverbs):
		 * one-sided operations are then plain loads and stores.
		 * Private memory would cost one system call per access. */
		int (*alloc)(size_t, void **) = (int (*)(size_t, void **))
			dlsym(RTLD_DEFAULT, "ursa_mem_alloc");
		void *p = NULL;

		if (!alloc || alloc(BUFSZ, &p)) {
			p = mmap(NULL, BUFSZ, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p != MAP_FAILED)
				madvise(p, BUFSZ, MADV_HUGEPAGE);
		}
		s->buf = p;
	}
	if (!s->pd || !s->cq || s->buf == MAP_FAILED)
		return -1;
	memset(s->buf, 0, BUFSZ);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUFSZ, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC);
	for (int i = 0; i < MAXQ; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 64, .max_recv_wr = 64,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};

		s->qp[i] = ibv_create_qp(s->pd, &ia);
		if (!s->qp[i])
			return -1;
	}
	return s->mr ? 0 : -1;
}

static int connect_qp(struct side *s, int i, uint32_t rqpn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };

	if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = rqpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	ibv_query_gid(s->ctx, 1, 0, &a.ah_attr.grh.dgid);
	if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void xfer(int fd, void *p, size_t n, int out)
{
	size_t d = 0;

	while (d < n) {
		ssize_t r = out ? write(fd, (char *)p + d, n - d) :
				  read(fd, (char *)p + d, n - d);

		if (r <= 0)
			exit(3);
		d += (size_t)r;
	}
}

static int post(struct side *s, int q, enum ibv_wr_opcode op, size_t off,
		uint32_t len, uint64_t raddr, uint32_t rkey, int signaled)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = signaled ? IBV_SEND_SIGNALED : 0 };
	struct ibv_send_wr *bad;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(s->qp[q], &wr, &bad);
}

/* An 8 B signaled WRITE, built once and posted many times, as perftest's
 * latency tests do: the loop then times ursa's post, not the building of
 * the request. */
struct prebuilt {
	struct ibv_sge sge;
	struct ibv_send_wr wr;
};

static void prebuild_write(struct side *s, struct prebuilt *pb, size_t off,
			   uint64_t raddr, uint32_t rkey)
{
	memset(pb, 0, sizeof(*pb));
	pb->sge = (struct ibv_sge){ (uintptr_t)s->buf + off, 8, s->mr->lkey };
	pb->wr.sg_list = &pb->sge;
	pb->wr.num_sge = 1;
	pb->wr.opcode = IBV_WR_RDMA_WRITE;
	pb->wr.send_flags = IBV_SEND_SIGNALED;
	pb->wr.wr.rdma.remote_addr = raddr;
	pb->wr.wr.rdma.rkey = rkey;
}

static int post_prebuilt(struct side *s, struct prebuilt *pb)
{
	struct ibv_send_wr *bad;

	return ibv_post_send(s->qp[0], &pb->wr, &bad);
}

static void wait_n(struct side *s, int n)
{
	struct ibv_wc wc[16];

	while (n > 0) {
		/* (never more than asked for: the peer's SEND ping-pong
		 * may have its next receive's completion queued already) */
		int k = ibv_poll_cq(s->cq, n < 16 ? n : 16, wc);

		for (int i = 0; i < k; i++)
			if (wc[i].status) {
				fprintf(stderr, "bench: %s\n", ibv_wc_status_str(wc[i].status));
				exit(2);
			}
		n -= k;
	}
}

static int post_recv(struct side *s, int q, size_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(s->qp[q], &wr, &bad);
}

/*
 * The peer process: sets up, then serves the latency ping-pongs it is told
 * to run (command bytes over the socket), otherwise sits passive.
 */
static int peer_main(int sock)
{
	struct side s;
	struct info me, them;
	char c;

	if (side_open(&s))
		return 1;
	for (int i = 0; i < MAXQ; i++)
		me.qpn[i] = s.qp[i]->qp_num;
	me.rkey = s.mr->rkey;
	me.addr = (uintptr_t)s.buf;
	xfer(sock, &me, sizeof(me), 1);
	xfer(sock, &them, sizeof(them), 0);
	for (int i = 0; i < MAXQ; i++)
		if (connect_qp(&s, i, them.qpn[i]))
			return 2;
	xfer(sock, &me, sizeof(me), 1);
	while (read(sock, &c, 1) == 1 && c != 'q') {
		int n = 0;

		xfer(sock, &n, sizeof(n), 0);
		if (c == 'w') {	/* WRITE ping-pong: answer each WRITE */
			volatile char *last = s.buf + 7;
			struct prebuilt pb;

			prebuild_write(&s, &pb, BUFSZ / 2, them.addr, them.rkey);
			for (int i = 1; i <= n; i++) {
				while (*last != (char)i)
					;
				s.buf[BUFSZ / 2 + 7] = (char)i;
				post_prebuilt(&s, &pb);
				wait_n(&s, 1);
			}
		} else if (c == 's') { /* SEND ping-pong */
			/* The receive for the next SEND is posted before
			 * our answer goes, as ib_send_lat keeps its receive
			 * queue filled: otherwise the next SEND may come
			 * first and wait out an RNR NAK. */
			post_recv(&s, 0, 0, 64);
			for (int i = 0; i < n; i++) {
				wait_n(&s, 1);
				if (i + 1 < n)
					post_recv(&s, 0, 0, 64);
				post(&s, 0, IBV_WR_SEND, 64, 8, 0, 0, 1);
				wait_n(&s, 1);
			}
		}
		xfer(sock, &c, 1, 1);
	}
	return 0;
}

static void lat_write(struct side *s, struct info *t, int sock, int n,
		      double *med, double *p99)
{
	double *v = calloc((size_t)n, sizeof(double));
	volatile char *last = s->buf + BUFSZ / 2 + 7 - BUFSZ / 2; /* buf+7 */
	char c = 'w';
	struct prebuilt pb;

	prebuild_write(s, &pb, BUFSZ / 4, t->addr, t->rkey);
	xfer(sock, &c, 1, 1);
	xfer(sock, &n, sizeof(n), 1);
	for (int i = 1; i <= n; i++) {
		double t0 = now_us();

		s->buf[BUFSZ / 4 + 7] = (char)i;
		post_prebuilt(s, &pb);
		/* The completion before the spin, as ib_write_lat and the
		 * peer poll: after it, the poll would delay the next post. */
		wait_n(s, 1);
		while (*last != (char)i)
			;
		v[i - 1] = (now_us() - t0) / 2;
	}
	xfer(sock, &c, 1, 0);
	pct(v + n / 10, n - n / 10, med, p99);
	free(v);
}

static void lat_send(struct side *s, int sock, int n, double *med, double *p99)
{
	double *v = calloc((size_t)n, sizeof(double));
	char c = 's';

	xfer(sock, &c, 1, 1);
	xfer(sock, &n, sizeof(n), 1);
	usleep(10000);
	for (int i = 0; i < n; i++) {
		double t0 = now_us();

		/* (the peer's answer comes only after this SEND) */
		post_recv(s, 0, 4096, 64);
		post(s, 0, IBV_WR_SEND, 0, 8, 0, 0, 1);
		wait_n(s, 2);
		v[i] = (now_us() - t0) / 2;
	}
	xfer(sock, &c, 1, 0);
	pct(v + n / 10, n - n / 10, med, p99);
	free(v);
}

static void lat_rt(struct side *s, struct info *t, enum ibv_wr_opcode op, int n,
		   double *med, double *p99)
{
	double *v = calloc((size_t)n, sizeof(double));

	for (int i = 0; i < n; i++) {
		double t0 = now_us();

		post(s, 0, op, 0, 8, t->addr + 64, t->rkey, 1);
		wait_n(s, 1);
		v[i] = now_us() - t0;
	}
	pct(v + n / 10, n - n / 10, med, p99);
	free(v);
}

static double bw(struct side *s, struct info *t, enum ibv_wr_opcode op,
		 size_t sz, int nq)
{
	const int win = 16;
	size_t total = quick ? (64u << 20) : (1u << 30);
	int n = (int)(total / sz);
	int posted = 0, done = 0, inflight[MAXQ] = { 0 };
	double t0;

	if (n < 8 * nq)
		n = 8 * nq;
	t0 = now_us();
	while (done < n) {
		for (int q = 0; q < nq && posted < n; q++) {
			while (inflight[q] < win && posted < n) {
				size_t off = (size_t)(posted % 2) * (BUFSZ / 2);

				if (sz > BUFSZ / 2)
					off = 0;
				post(s, q, op, off, (uint32_t)sz, t->addr + off,
				     t->rkey, 1);
				inflight[q]++;
				posted++;
			}
		}
		struct ibv_wc wc[16];
		int k = ibv_poll_cq(s->cq, 16, wc);

		for (int i = 0; i < k; i++) {
			if (wc[i].status) {
				fprintf(stderr, "bench: %s\n",
					ibv_wc_status_str(wc[i].status));
				exit(2);
			}
			for (int q = 0; q < nq; q++)
				if (s->qp[q]->qp_num == wc[i].qp_num)
					inflight[q]--;
		}
		done += k;
	}
	return (double)sz * n / (now_us() - t0) / 1e3;
}

int main(int argc, char **argv)
{
	struct side s;
	struct info me, t;
	int sv[2];
	pid_t pid;
	double m, p, pm, pp, pm2, pp2, fm, fp;
	FILE *csv = NULL;
	const int nlat = quick ? 2000 : 20000;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
			csv = fopen(argv[++i], "w");
		else if (!strcmp(argv[i], "--lat") && i + 1 < argc)
			lat_only = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--send") && i + 1 < argc)
			send_only = atoi(argv[++i]);
	}
	printf("ursa same-host benchmark%s: 2 processes, %ld CPUs\n",
	       quick ? " (quick)" : "", sysconf(_SC_NPROCESSORS_ONLN));
	pingpong_limit(1, &pm, &pp);
	printf("\nlimit: cache-line ping-pong between processes, one way: "
	       "median %.3f us, p99 %.3f us\n", pm, pp);
	pingpong_limit(2, &pm2, &pp2);
	printf("  the same with two lines (a WRITE ping-pong's pattern, no ursa): "
	       "median %.3f us, p99 %.3f us\n", pm2, pp2);
	cma_floor(&fm, &fp);
	printf("floor: one process_vm_writev of 8 B into another process: "
	       "median %.2f us, p99 %.2f us\n", fm, fp);

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 1;
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(peer_main(sv[1]));
	}
	close(sv[1]);
	if (side_open(&s))
		return 1;
	for (int i = 0; i < MAXQ; i++)
		me.qpn[i] = s.qp[i]->qp_num;
	me.rkey = s.mr->rkey;
	me.addr = (uintptr_t)s.buf;
	xfer(sv[0], &t, sizeof(t), 0);
	xfer(sv[0], &me, sizeof(me), 1);
	for (int i = 0; i < MAXQ; i++)
		if (connect_qp(&s, i, t.qpn[i]))
			return 2;
	xfer(sv[0], &t, sizeof(t), 0);

	printf("\nlatency (us)                 median      p99   median/limit\n");
	if (csv)
		fprintf(csv, "kind,op,size,qps,value,unit,limit,ratio\n");
	if (send_only) {
		lat_send(&s, sv[0], send_only, &m, &p);
		printf("  8 B SEND, one way        %8.2f %8.2f   %6.2fx\n", m, p, m / pm);
		return 0;
	}
	lat_write(&s, &t, sv[0], lat_only ? lat_only : nlat, &m, &p);
	printf("  8 B WRITE, one way       %8.3f %8.3f   %6.2fx   (%.2fx the two-line pattern, %.2fx the syscall floor)\n",
	       m, p, m / pm, m / pm2, m / fm);
	if (lat_only)
		return 0;
	if (csv) {
		fprintf(csv, "lat,write,8,1,%.3f,us,%.3f,%.3f\n", m, pm, m / pm);
		fprintf(csv, "limit2,write,8,1,%.3f,us,%.3f,%.3f\n", m, pm2, m / pm2);
		fprintf(csv, "floor,cma_write,8,1,%.3f,us,%.3f,%.3f\n", m, fm, m / fm);
	}
	lat_send(&s, sv[0], nlat / 2, &m, &p);
	printf("  8 B SEND, one way        %8.2f %8.2f   %6.2fx\n", m, p, m / pm);
	if (csv)
		fprintf(csv, "lat,send,8,1,%.3f,us,%.3f,%.3f\n", m, pm, m / pm);
	lat_rt(&s, &t, IBV_WR_RDMA_READ, nlat, &m, &p);
	printf("  8 B READ, round trip     %8.2f %8.2f   %6.2fx (of 2x limit)\n",
	       m, p, m / (2 * pm));
	if (csv)
		fprintf(csv, "lat,read,8,1,%.3f,us,%.3f,%.3f\n", m, 2 * pm, m / (2 * pm));
	lat_rt(&s, &t, IBV_WR_ATOMIC_FETCH_AND_ADD, nlat, &m, &p);
	printf("  fetch-and-add, round trip%8.2f %8.2f   %6.2fx (of 2x limit)\n",
	       m, p, m / (2 * pm));
	if (csv)
		fprintf(csv, "lat,fadd,8,1,%.3f,us,%.3f,%.3f\n", m, 2 * pm, m / (2 * pm));

	/* The first pass through the target's pages: on this VM the
	 * requester's first touch of each page of its new mapping of them
	 * (shmap.h) costs about 12 us, even though the mapping was
	 * populated (docs/design.md, "Requests and answers"), once per MR
	 * and channel. Measured here, once, over the whole MR; the loop
	 * below then measures the steady state, as memcpy_gbs measures its
	 * buffers after touching them. */
	{
		double t0 = now_us(), first;

		if (post(&s, 0, IBV_WR_RDMA_WRITE, 0, BUFSZ, t.addr, t.rkey, 1))
			return 2;
		wait_n(&s, 1);
		first = (double)BUFSZ / (now_us() - t0) / 1e3;
		printf("\nfirst WRITE through the mapping of the target's pages, %u MiB: %.2f GB/s\n",
		       BUFSZ >> 20, first);
		if (csv)
			fprintf(csv, "first,write,%u,1,%.3f,GB/s,,\n", BUFSZ, first);
		/* the other QPs' channels map the MR too: the same pass,
		 * untimed */
		for (int q = 1; q < MAXQ; q++) {
			if (post(&s, q, IBV_WR_RDMA_WRITE, 0, BUFSZ, t.addr,
				 t.rkey, 1))
				return 2;
			wait_n(&s, 1);
		}
	}
	printf("\nbandwidth (GB/s)   memcpy   WRITE 1qp  ratio   WRITE 4qp   READ 1qp  ratio   READ 4qp\n");
	for (size_t sz = 4096; sz <= BUFSZ; sz *= (quick ? 16 : 4)) {
		double mc = memcpy_gbs(sz);
		double w1 = bw(&s, &t, IBV_WR_RDMA_WRITE, sz, 1);
		double w4 = bw(&s, &t, IBV_WR_RDMA_WRITE, sz, 4);
		double r1 = bw(&s, &t, IBV_WR_RDMA_READ, sz, 1);
		double r4 = bw(&s, &t, IBV_WR_RDMA_READ, sz, 4);

		printf("  %8zu KiB %8.2f   %8.2f  %5.2f   %8.2f   %8.2f  %5.2f   %8.2f\n",
		       sz >> 10, mc, w1, w1 / mc, w4, r1, r1 / mc, r4);
		if (csv) {
			fprintf(csv, "bw,write,%zu,1,%.3f,GB/s,%.3f,%.3f\n", sz, w1, mc, w1 / mc);
			fprintf(csv, "bw,write,%zu,4,%.3f,GB/s,%.3f,%.3f\n", sz, w4, mc, w4 / mc);
			fprintf(csv, "bw,read,%zu,1,%.3f,GB/s,%.3f,%.3f\n", sz, r1, mc, r1 / mc);
			fprintf(csv, "bw,read,%zu,4,%.3f,GB/s,%.3f,%.3f\n", sz, r4, mc, r4 / mc);
		}
	}
	{
		char c = 'q';

		xfer(sv[0], &c, 1, 1);
	}
	waitpid(pid, NULL, 0);
	if (csv)
		fclose(csv);
	return 0;
}
