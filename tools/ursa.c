// SPDX-License-Identifier: MIT
/*
 * ursa.c - the ursa command: device information, a demo that shows the
 * mechanisms at work, a translation-table viewer, and a wrapper that runs
 * any verbs program on ursa.
 *
 *   ursa devinfo            the device, its port, GIDs and limits
 *   ursa demo               two QPs: registration, keys, zero-copy transfers
 *   ursa mr SIZE [--thp|--odp|--shared]   register SIZE bytes, print the table
 *   ursa cm                 rdma_cm listeners and connections of this host
 *   ursa run -- PROG ARGS   run PROG with ursa's libibverbs.so.1
 *   ursa setup [--undo]     the same for every program of the host (root)
 *   ursa version
 *
 * Exit status: 0 success, 1 runtime failure, 2 usage error.
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <infiniband/verbs.h>
#include <ursa/ursa.h>

#include "../src/proto/cm.h"
#include "setup.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ursa COMMAND [ARGS]\n"
		"  devinfo                 show the device, port, GID table and limits\n"
		"  demo                    two QPs register memory, exchange keys and move\n"
		"                          data zero-copy; prints keys, pinned pages,\n"
		"                          translation entries and completions\n"
		"  mr SIZE [--thp|--odp|--shared]\n"
		"                          register SIZE bytes (K/M/G suffixes) and print\n"
		"                          its translation table (--thp: ask for huge pages,\n"
		"                          --odp: register on demand, without pinning,\n"
		"                          --shared: memory from ursa_mem_alloc)\n"
		"  cm                      rdma_cm listeners and connections of this\n"
		"                          host: state, peer, QPNs, MAD counts\n"
		"  run -- PROG [ARGS]      run PROG on ursa (sets LD_LIBRARY_PATH, and\n"
		"                          LD_PRELOAD for the device's sysfs tree)\n"
		"  stats -- PROG [ARGS]    the same, and print ursa's counters (per QP\n"
		"                          when destroyed, RoCEv2 at exit) on stderr\n"
		"  setup [--undo]          (root) make ursa the device of every program on\n"
		"                          this host, however started: /etc/ld.so.preload,\n"
		"                          /etc/ld.so.conf.d; --undo removes it\n"
		"  config                  the URSA_* environment variables: effective\n"
		"                          values, defaults, bounds, what each does\n"
		"  version                 print the version\n");
}

static struct ibv_context *open_first(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = NULL;

	if (l && l[0])
		c = ibv_open_device(l[0]);
	if (!c)
		fprintf(stderr, "ursa: cannot open the device: %s\n", strerror(errno));
	ibv_free_device_list(l);
	return c;
}

static const char *mtu_str(enum ibv_mtu m)
{
	static const char *const s[] = { "?", "256", "512", "1024", "2048", "4096" };

	return (unsigned)m < 6 ? s[m] : "?";
}

static void gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };

	if (!memcmp(g->raw, v4, 12))
		snprintf(buf, len, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13],
			 g->raw[14], g->raw[15]);
	else
		inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len);
}

static int cmd_devinfo(void)
{
	struct ibv_context *c = open_first();
	struct ibv_device_attr a;
	struct ibv_port_attr p;
	uint8_t *g;

	if (!c)
		return 1;
	if (ibv_query_device(c, &a) || ibv_query_port(c, 1, &p)) {
		fprintf(stderr, "ursa: query failed\n");
		return 1;
	}
	g = (uint8_t *)&a.node_guid;
	printf("device      %s (%s)\n", ibv_get_device_name(c->device), ursa_version());
	printf("node_guid   %02x%02x:%02x%02x:%02x%02x:%02x%02x\n",
	       g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
	printf("port 1      %s, link layer Ethernet (RoCE v2), MTU %s (max %s)\n",
	       ibv_port_state_str(p.state), mtu_str(p.active_mtu), mtu_str(p.max_mtu));
	for (int i = 0; i < p.gid_tbl_len; i++) {
		union ibv_gid gid;
		char s[64];

		if (ibv_query_gid(c, 1, i, &gid))
			continue;
		gid_str(&gid, s, sizeof(s));
		printf("GID[%2d]     %s, RoCE v2\n", i, s);
	}
	printf("limits      max_qp %d, max_qp_wr %d, max_sge %d, max_cqe %d,\n"
	       "            max_mr_size %" PRIu64 ", max_qp_rd_atom %d, atomics %s,\n"
	       "            max_inline_data 256, max_msg_sz %u\n",
	       a.max_qp, a.max_qp_wr, a.max_sge, a.max_cqe, (uint64_t)a.max_mr_size,
	       a.max_qp_rd_atom, a.atomic_cap == IBV_ATOMIC_HCA ? "HCA" : "none",
	       p.max_msg_sz);
	printf("pinned      %" PRId64 " bytes by this process\n", ursa_pinned_total());
	ibv_close_device(c);
	return 0;
}

static void print_table(struct ibv_mr *mr, unsigned max_rows)
{
	struct ursa_mr_info in;

	if (ursa_mr_info(mr, &in))
		return;
	printf("    MR %p: iova 0x%" PRIx64 ", %" PRIu64 " bytes, lkey 0x%08x, rkey 0x%08x\n",
	       (void *)mr, in.iova, in.length, in.lkey, in.rkey);
	printf("      pinned %" PRIu64 " bytes%s; %" PRIu64 " pages of 4 KiB spanned;\n"
	       "      translation table: %u entries (%u huge), page size %" PRIu64 " KiB\n",
	       in.pinned_bytes, in.on_demand ? " (on demand: nothing pinned)" : "",
	       in.pages_4k, in.entries, in.huge_entries, in.page_size / 1024);
	if (in.shared_bytes)
		printf("      in %" PRIu64 " bytes from ursa_mem_alloc that requesters on this\n"
		       "      host map (no system call per access)\n", in.shared_bytes);
	else
		printf("      private memory: requesters on this host reach it by\n"
		       "      process_vm_writev/readv (one system call per access)\n");
	if (in.cached)
		printf("      pins and table taken back from the registration cache\n");
	if (!in.on_demand)
		printf("      %s\n", ursa_unmap_watch() ?
		       "watched: if its memory is unmapped, the MR refuses every access" :
		       "not watched (no userfaultfd): if its memory is unmapped, the MR\n"
		       "      reaches whatever is mapped at its addresses next");
	for (uint32_t i = 0; i < in.entries && i < max_rows; i++) {
		uint64_t va, ps;

		ursa_mr_entry(mr, i, &va, &ps);
		printf("        [%u] va 0x%" PRIx64 " .. 0x%" PRIx64 " (%" PRIu64 " KiB)\n",
		       i, va, va + ps, ps / 1024);
	}
	if (in.entries > max_rows)
		printf("        ... %u more\n", in.entries - max_rows);
}

static int wait1(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
	}
}

static const char *opname(enum ibv_wc_opcode o)
{
	switch (o) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_COMP_SWAP: return "COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "other";
	}
}

static void show_wc(const char *who, const struct ibv_wc *wc)
{
	printf("    %s CQE: wr_id %" PRIu64 ", %s, %s, %u bytes, qp 0x%06x",
	       who, wc->wr_id, opname(wc->opcode), ibv_wc_status_str(wc->status),
	       wc->byte_len, wc->qp_num);
	if (wc->status)
		printf("\n      why: %s", ursa_vendor_err_str(wc->vendor_err));
	if (wc->wc_flags & IBV_WC_WITH_IMM)
		printf(", imm 0x%x", ntohl(wc->imm_data));
	printf("\n");
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	size_t len;
};

static int side_open(struct side *s, const char *name, size_t len, int huge)
{
	struct ibv_qp_init_attr ia = { 0 };

	s->ctx = open_first();
	if (!s->ctx)
		return -1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	s->len = len;
	s->buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->buf == MAP_FAILED)
		return -1;
	if (huge)
		madvise(s->buf, len, MADV_HUGEPAGE);
	memset(s->buf, 0, len);
	s->mr = ibv_reg_mr(s->pd, s->buf, len, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC);
	ia.send_cq = ia.recv_cq = s->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->pd || !s->cq || !s->mr || !s->qp) {
		fprintf(stderr, "ursa demo: setup failed: %s\n", strerror(errno));
		return -1;
	}
	printf("  %s: context %p, QP 0x%06x\n", name, (void *)s->ctx, s->qp->qp_num);
	print_table(s->mr, 4);
	return 0;
}

static int connect_to(struct side *s, uint32_t qpn)
{
	struct ibv_qp_attr a = { 0 };

	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	ibv_query_gid(s->ctx, 1, 0, &a.ah_attr.grh.dgid);
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post(struct side *s, enum ibv_wr_opcode op, size_t off, uint32_t len,
		uint64_t raddr, uint32_t rkey, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 42;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(s->qp, &wr, &bad);
}

static int cmd_demo(void)
{
	const size_t len = 4u << 20;
	struct side A = { 0 }, B = { 0 };
	struct ibv_wc wc;
	struct ursa_qp_stats st;
	struct ursa_engine_stats es;
	uint64_t raddr;
	uint32_t rkey;

	printf("ursa demo: two contexts, one RC QP each, 4 MiB registered per side\n\n");
	printf("1. Memory registration: pin, translate, hand out keys\n");
	if (side_open(&A, "A", len, 0) || side_open(&B, "B (asked for huge pages)", len, 1))
		return 1;
	printf("  pinned by this process in all: %" PRId64 " bytes\n\n", ursa_pinned_total());

	printf("2. Out-of-band exchange, as applications do over TCP\n");
	raddr = (uintptr_t)B.buf;
	rkey = B.mr->rkey;
	printf("  A learns B's (QPN 0x%06x, addr 0x%" PRIx64 ", rkey 0x%08x)\n",
	       B.qp->qp_num, raddr, rkey);
	if (connect_to(&A, B.qp->qp_num) || connect_to(&B, A.qp->qp_num)) {
		fprintf(stderr, "ursa demo: connect failed: %s\n", strerror(errno));
		return 1;
	}
	printf("  both QPs RESET -> INIT -> RTR -> RTS\n\n");

	printf("3. RDMA WRITE of 1 MiB: one copy, straight from A's MR into B's MR;\n"
	       "   B makes no verbs call\n");
	for (size_t i = 0; i < (1u << 20); i++)
		A.buf[i] = (char)(i * 31 + 7);
	if (post(&A, IBV_WR_RDMA_WRITE, 0, 1u << 20, raddr, rkey, 1) || !wait1(A.cq, &wc))
		return 1;
	show_wc("A", &wc);
	printf("    B's memory %s A's\n\n",
	       memcmp(A.buf, B.buf, 1u << 20) ? "DIFFERS from" : "now equals");

	printf("4. SEND/RECV with a receive posted by B\n");
	strcpy(A.buf + 2048, "hello from A");
	{
		struct ibv_sge sge = { (uintptr_t)B.buf + (2u << 20), 64, B.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 10, .sg_list = &sge, .num_sge = 1 }, *rb;

		if (ibv_post_recv(B.qp, &rw, &rb))
			return 1;
	}
	if (post(&A, IBV_WR_SEND, 2048, 13, 0, 0, 2) || !wait1(A.cq, &wc))
		return 1;
	show_wc("A", &wc);
	if (!wait1(B.cq, &wc))
		return 1;
	show_wc("B", &wc);
	printf("    B received \"%s\"\n\n", B.buf + (2u << 20));

	printf("5. RDMA READ and FETCH_AND_ADD on B's memory\n");
	if (post(&A, IBV_WR_RDMA_READ, 3u << 20, 4096, raddr, rkey, 3) || !wait1(A.cq, &wc))
		return 1;
	show_wc("A", &wc);
	*(uint64_t *)(B.buf + 8192) = 100;
	if (post(&A, IBV_WR_ATOMIC_FETCH_AND_ADD, 4096, 8, raddr + 8192, rkey, 4) ||
	    !wait1(A.cq, &wc))
		return 1;
	show_wc("A", &wc);
	printf("    A got the old value %" PRIu64 ", B's counter is now %" PRIu64 "\n\n",
	       *(uint64_t *)(A.buf + 4096), *(uint64_t *)(B.buf + 8192));

	printf("6. A refused access: WRITE past the end of B's region\n");
	if (post(&A, IBV_WR_RDMA_WRITE, 0, 8192, raddr + len - 4096, rkey, 5) ||
	    !wait1(A.cq, &wc))
		return 1;
	show_wc("A", &wc);
	printf("    (both QPs are now in the error state, as IBTA requires)\n\n");

	printf("7. Counters\n");
	ursa_qp_stats(B.qp, &st);
	printf("    B as responder: %" PRIu64 " writes, %" PRIu64 " reads, %" PRIu64
	       " atomics, %" PRIu64 " receives, %" PRIu64 " bytes in, %" PRIu64 " refused\n",
	       st.writes, st.reads, st.atomics, st.recvs, st.rx_bytes, st.errors);
	ursa_engine_stats(A.ctx, &es);
	printf("    A's engine: %" PRIu64 " doorbells (posts that woke it), %" PRIu64
	       " wake-ups\n", es.doorbells, es.wakeups);

	ibv_destroy_qp(A.qp);
	ibv_destroy_qp(B.qp);
	ibv_dereg_mr(A.mr);
	ibv_dereg_mr(B.mr);
	{
		struct ursa_rcache_stats rs;

		ursa_rcache_stats(&rs);
		printf("    deregistered: %" PRIu64 " ranges (%" PRIu64 " bytes) parked, still pinned, in\n"
		       "    the registration cache for the next ibv_reg_mr of the same pages\n",
		       rs.entries, rs.bytes);
	}
	ursa_rcache_flush();
	printf("    after deregistration and ursa_rcache_flush: %" PRId64 " bytes pinned\n",
	       ursa_pinned_total());
	ibv_destroy_cq(A.cq);
	ibv_destroy_cq(B.cq);
	ibv_dealloc_pd(A.pd);
	ibv_dealloc_pd(B.pd);
	ibv_close_device(A.ctx);
	ibv_close_device(B.ctx);
	return 0;
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);

	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end || !v)
		return -1;
	*out = (size_t)v;
	return 0;
}

static int cmd_mr(int argc, char **argv)
{
	size_t len;
	int thp = 0, odp = 0, shared = 0;
	struct ursa_rcache_stats rs;
	struct ursa_mr_info in;
	struct ibv_context *c;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char *buf;

	if (argc < 2 || parse_size(argv[1], &len)) {
		usage(stderr);
		return 2;
	}
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--thp"))
			thp = 1;
		else if (!strcmp(argv[i], "--odp"))
			odp = 1;
		else if (!strcmp(argv[i], "--shared"))
			shared = 1;
		else {
			usage(stderr);
			return 2;
		}
	}
	c = open_first();
	if (!c)
		return 1;
	pd = ibv_alloc_pd(c);
	if (shared && ursa_mem_alloc(len, (void **)&buf))
		return 1;
	if (!shared) {
		buf = mmap(NULL, len + (2u << 20), PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (buf == MAP_FAILED)
			return 1;
		buf = (char *)(((uintptr_t)buf + (2u << 20) - 1) &
			       ~(uintptr_t)((2u << 20) - 1));
		madvise(buf, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	}
	if (!pd)
		return 1;
	memset(buf, 1, len);
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
			(odp ? IBV_ACCESS_ON_DEMAND : 0));
	if (!mr) {
		fprintf(stderr, "ursa mr: ibv_reg_mr: %s\n", strerror(errno));
		return 1;
	}
	print_table(mr, 16);
	ibv_dereg_mr(mr);
	/* the same pages again: the registration cache's case */
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
			(odp ? IBV_ACCESS_ON_DEMAND : 0));
	if (mr && !ursa_mr_info(mr, &in) && !ursa_rcache_stats(&rs))
		printf("    registered again: %s (registration cache: %" PRIu64 " hits, %"
		       PRIu64 " misses)\n", in.cached ? "pins and table from the cache" :
		       "built afresh", rs.hits, rs.misses);
	if (mr)
		ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
	return 0;
}

/* The directory of ursa's libraries: ../lib next to bin/ursa in the build
 * tree, ../lib/ursa when installed. */
static int lib_dir(char *out, size_t len)
{
	char self[PATH_MAX], probe[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n < 0)
		return -1;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	snprintf(probe, sizeof(probe), "%s/../lib/libibverbs.so.1", self);
	snprintf(out, len, access(probe, F_OK) ? "%s/../lib/ursa" : "%s/../lib",
		 self);
	return 0;
}

/* Prepend dir to the ':'-separated list in variable var. */
static void env_prepend(const char *var, const char *dir, bool before)
{
	const char *old = getenv(var);
	char env[4 * PATH_MAX];

	if (!old || !*old)
		snprintf(env, sizeof(env), "%s", dir);
	else if (before)
		snprintf(env, sizeof(env), "%s:%s", dir, old);
	else
		snprintf(env, sizeof(env), "%s:%s", old, dir);
	setenv(var, env, 1);
}

/* A sanitizer build's libraries need the ASan runtime first in the
 * program's initial library list (before libursa-preload.so, and in
 * uninstrumented programs at all). */
static void asan_first(void)
{
	const char *asan = asan_runtime();
	const char *old = getenv("LD_PRELOAD");

	if (asan && !(old && strstr(old, asan)))
		env_prepend("LD_PRELOAD", asan, true);
}

/* --- ursa cm ------------------------------------------------------------ */

/* One rdma_cm socket of this network namespace: its name in
 * /proc/net/unix, and what its owner answered (if it did). */
struct cm_sock {
	bool listener;
	uint64_t key;		/* service ID or comm ID */
	struct sockaddr_un sa;	/* its name, to ask and to match answers */
	socklen_t sl;
	bool answered;
	struct cm_info in;
};

static int cm_list(struct cm_sock *v, int max)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];
	int n = 0;

	while (f && n < max && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "@ursa/cm/");

		if (!p || (p[9] != 's' && p[9] != 'c') || p[10] != '/')
			continue;
		v[n] = (struct cm_sock){ .listener = p[9] == 's',
					 .key = strtoull(p + 11, NULL, 16) };
		v[n].sl = cm_route_addr(&v[n].sa, v[n].key, v[n].listener);
		n++;
	}
	if (f)
		fclose(f);
	return n;
}

/* Ask every owner; answers come within 200 ms or not at all (another
 * user's processes do not answer) */
static void cm_ask(struct cm_sock *v, int n)
{
	struct sockaddr_un me = { .sun_family = AF_UNIX };
	uint32_t q = CM_QUERY_MAGIC;
	struct timeval tv = { .tv_usec = 200000 };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct cm_info in;

	/* an autobound abstract name: the owners answer to it */
	if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof(sa_family_t)))
		goto out;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (int i = 0; i < n; i++)
		sendto(fd, &q, sizeof(q), MSG_DONTWAIT,
		       (struct sockaddr *)&v[i].sa, v[i].sl);
	for (int got = 0; got < n;) {
		struct sockaddr_un from;
		socklen_t fl = sizeof(from);
		ssize_t k = recvfrom(fd, &in, sizeof(in), 0,
				     (struct sockaddr *)&from, &fl);

		if (k < 0)
			break;		/* the 200 ms are over */
		if (k != sizeof(in) || in.magic != CM_INFO_MAGIC)
			continue;
		for (int i = 0; i < n; i++) {
			if (!v[i].answered && v[i].sl == fl &&
			    !memcmp(&v[i].sa, &from, fl)) {
				v[i].answered = true;
				v[i].in = in;
				got++;
			}
		}
	}
out:
	if (fd >= 0)
		close(fd);
}

static const char *ps_name(unsigned ps)
{
	switch (ps) {
	case 0x0002: return "IPOIB";
	case 0x0106: return "TCP";
	case 0x0111: return "UDP";
	case 0x013f: return "IB";
	default: return "?";
	}
}

static void gid_ip(const uint8_t g[16], char *s, size_t n)
{
	static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };

	if (!memcmp(g, v4, 12))
		inet_ntop(AF_INET, g + 12, s, (socklen_t)n);
	else
		inet_ntop(AF_INET6, g, s, (socklen_t)n);
}

static void comm_of(int pid, char *s, size_t n)
{
	char p[64];
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/comm", pid);
	f = fopen(p, "r");
	if (!f || !fgets(s, (int)n, f))
		snprintf(s, n, "?");
	s[strcspn(s, "\n")] = 0;
	if (f)
		fclose(f);
}

/* The rdma_cm listeners and connections of this network namespace (every
 * ursa process's, as /proc/net/unix lists their sockets); the owners of
 * the same user (all, for root) say their state, peer, QPNs and counts. */
static int cmd_cm(void)
{
	enum { MAX = 4096 };
	struct cm_sock *v = calloc(MAX, sizeof(*v));
	int n, nl = 0, nc = 0, quiet = 0;

	if (!v)
		return 1;
	n = cm_list(v, MAX);
	cm_ask(v, n);
	for (int i = 0; i < n; i++)
		v[i].listener ? nl++ : nc++;
	printf("rdma_cm in this network namespace: %d port%s held (listeners and active ids), %d connection%s\n",
	       nl, nl == 1 ? "" : "s", nc, nc == 1 ? "" : "s");
	if (n)
		printf("  %-10s %-10s %-14s %-21s %-19s %-33s %s\n", "kind", "port",
		       "state", "comm IDs (us/peer)", "QPN -> peer QPN",
		       "address -> peer", "process");
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < n; i++) {
			const struct cm_info *in = &v[i].in;
			char port[24], ids[24], qpn[24], addr[104], a[48], b[48];
			char comm[32];

			if (v[i].listener != !pass)
				continue;
			if (!v[i].answered) {
				/* what the name tells: a port, or a comm ID */
				quiet++;
				if (v[i].listener)
					snprintf(port, sizeof(port), "%s:%u",
						 ps_name((unsigned)(v[i].key >> 16)),
						 (unsigned)(v[i].key & 0xffff));
				else
					snprintf(ids, sizeof(ids), "0x%08x/?",
						 (unsigned)v[i].key);
				printf("  %-10s %-10s %-14s %s\n",
				       v[i].listener ? "port" : "connection",
				       v[i].listener ? port : "-", "(no answer)",
				       v[i].listener ? "-" : ids);
				continue;
			}
			snprintf(port, sizeof(port), "%s:%u", ps_name(in->ps), in->port);
			snprintf(ids, sizeof(ids), "0x%08x/0x%08x", in->local_id,
				 in->remote_id);
			snprintf(qpn, sizeof(qpn), "0x%06x -> 0x%06x", in->qpn, in->rqpn);
			gid_ip(in->src, a, sizeof(a));
			gid_ip(in->dst, b, sizeof(b));
			snprintf(addr, sizeof(addr), "%s -> %s", a, b);
			comm_of(in->pid, comm, sizeof(comm));
			/* an active id holds its port's name too */
			printf("  %-10s %-10s %-14s %-21s %-19s %-33s %d %s\n",
			       !v[i].listener ? "connection" :
			       strcmp(in->state, "listen") ? "port" : "listener", port,
			       in->state, v[i].listener ? "-" : ids,
			       v[i].listener ? "-" : qpn,
			       v[i].listener ? a : addr, in->pid, comm);
		}
	}
	/* each answering process's CM counters, once */
	for (int i = 0; i < n; i++) {
		bool seen = false;

		for (int j = 0; j < i && !seen; j++)
			seen = v[j].answered && v[j].in.pid == v[i].in.pid;
		if (!v[i].answered || seen)
			continue;
		printf("  pid %d: MADs taken %u, sent %u (retransmissions too), refused from other users %u\n",
		       v[i].in.pid, v[i].in.mads_rx, v[i].in.mads_tx, v[i].in.refused);
	}
	if (quiet)
		printf("  (%d without an answer: another user's, or busy)\n", quiet);
	free(v);
	return 0;
}

/* ursa run: ursa's libibverbs (and provider stand-ins) first on the
 * library path, and libursa-preload.so, which shows the device's sysfs
 * tree and /dev/infiniband node (src/preload/sysfs_preload.c), after any
 * preloads already asked for. Both pass on to the program's children. */
static int cmd_run(int argc, char **argv)
{
	char lib[PATH_MAX], pre[PATH_MAX + 32];

	if (argc > 1 && !strcmp(argv[1], "--")) {
		argv++;
		argc--;
	}
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (lib_dir(lib, sizeof(lib)))
		return 1;
	env_prepend("LD_LIBRARY_PATH", lib, true);
	snprintf(pre, sizeof(pre), "%s/libursa-preload.so", lib);
	if (!access(pre, R_OK))
		env_prepend("LD_PRELOAD", pre, false);
	asan_first();
	execvp(argv[1], argv + 1);
	fprintf(stderr, "ursa run: %s: %s\n", argv[1], strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "devinfo"))
		return cmd_devinfo();
	if (!strcmp(argv[1], "demo"))
		return cmd_demo();
	if (!strcmp(argv[1], "cm"))
		return cmd_cm();
	if (!strcmp(argv[1], "mr"))
		return cmd_mr(argc - 1, argv + 1);
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "setup")) {
		char lib[PATH_MAX];

		if (lib_dir(lib, sizeof(lib)))
			return 1;
		return cmd_setup(lib, argc - 1, argv + 1);
	}
	if (!strcmp(argv[1], "stats")) {
		setenv("URSA_STATS", "1", 1);
		return cmd_run(argc - 1, argv + 1);
	}
	if (!strcmp(argv[1], "config")) {
		ursa_config_print(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "version")) {
		printf("%s\n", ursa_version());
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
	    !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "ursa: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
