// SPDX-License-Identifier: MIT
/*
 * verbs.c (functional) - each verb's good path and its bad-flow twin, which
 * checks libibverbs' exact return and errno convention: constructors return
 * NULL and set errno; int verbs return the errno value; ibv_query_gid,
 * ibv_query_pkey and ibv_get_cq_event return -1 and set errno.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ursa/ursa.h>

#include "common.h"

static int test_device_list(void)
{
	int n = -1;
	struct ibv_device **l = ibv_get_device_list(&n);

	REQUIRE(l);
	EXPECT_EQ(n, 1);
	EXPECT_TRUE(l[1] == NULL);
	EXPECT_TRUE(!strcmp(ibv_get_device_name(l[0]), "ursa0"));
	EXPECT_EQ(l[0]->node_type, IBV_NODE_CA);
	EXPECT_NE(ibv_get_device_guid(l[0]), 0);
	EXPECT_EQ(ibv_get_device_index(l[0]), 0);
	ibv_free_device_list(l);
	/* NULL count pointer is allowed */
	l = ibv_get_device_list(NULL);
	EXPECT_TRUE(l && l[0]);
	ibv_free_device_list(l);
	return TEST_RESULT();
}

/* A thread with a small stack (here PTHREAD_STACK_MIN and 64 KiB) can be
 * created and use verbs: a library's static thread-locals are carved out
 * of every thread's stack, and ursa's once made glibc refuse such threads
 * (EINVAL) in any program linked with it. */
static void *small_stack_verbs(void *arg)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	intptr_t ok = pd != NULL;

	(void)arg;
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
	if (l)
		ibv_free_device_list(l);
	return (void *)ok;
}

static int test_small_stack_threads(void)
{
	const size_t sizes[] = { PTHREAD_STACK_MIN, 64 * 1024 };

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		pthread_attr_t a;
		pthread_t t;
		void *ok = NULL;

		pthread_attr_init(&a);
		REQUIRE(!pthread_attr_setstacksize(&a, sizes[i]));
		EXPECT_EQ(pthread_create(&t, &a, small_stack_verbs, NULL), 0);
		pthread_attr_destroy(&a);
		if (!pthread_join(t, &ok))
			EXPECT_TRUE(ok != NULL);
	}
	return TEST_RESULT();
}

static int test_device_name_env(void)
{
	struct ibv_device **l;

	setenv("URSA_DEVICE_NAME", "mynic7", 1);
	l = ibv_get_device_list(NULL);
	REQUIRE(l && l[0]);
	EXPECT_TRUE(!strcmp(l[0]->name, "mynic7"));
	ibv_free_device_list(l);
	return TEST_RESULT();
}

static int test_query_device(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_device_attr a;
	struct ibv_device_attr_ex ax;
	struct ibv_query_device_ex_input in = { 0 };

	REQUIRE(c);
	EXPECT_EQ(ibv_query_device(c, &a), 0);
	EXPECT_TRUE(a.max_sge >= 32);
	EXPECT_TRUE(a.max_qp_rd_atom >= 16);
	EXPECT_TRUE(a.max_qp_init_rd_atom >= 16);
	EXPECT_EQ(a.atomic_cap, IBV_ATOMIC_HCA);
	EXPECT_EQ(a.phys_port_cnt, 1);
	EXPECT_TRUE(strstr(a.fw_ver, "ursa") != NULL);
	/* frameworks pick parameters by vendor: a real id (rxe's) */
	EXPECT_EQ(a.vendor_id, 0xffffff);
	EXPECT_TRUE(a.vendor_part_id != 0 && a.hw_ver != 0);
	EXPECT_EQ(a.max_qp_rd_atom, a.max_qp_init_rd_atom);
	EXPECT_TRUE(a.max_qp_wr >= 8192 && a.max_cqe >= 65536);
	EXPECT_TRUE(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	EXPECT_EQ(ibv_query_device_ex(c, NULL, &ax), 0);
	EXPECT_EQ(ax.orig_attr.max_sge, a.max_sge);
	EXPECT_TRUE(ax.odp_caps.general_caps & IBV_ODP_SUPPORT);
	/* bad flow: a non-zero input comp_mask */
	in.comp_mask = 1;
	EXPECT_EQ(ibv_query_device_ex(c, &in, &ax), EINVAL);
	ibv_close_device(c);
	return TEST_RESULT();
}

static int test_query_port_gid_pkey(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_port_attr p;
	union ibv_gid g;
	struct ibv_gid_entry e, tab[64];
	__be16 pkey;
	ssize_t n;

	REQUIRE(c);
	EXPECT_EQ(ibv_query_port(c, 1, &p), 0);
	EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
	EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
	EXPECT_TRUE(p.active_mtu >= IBV_MTU_256 && p.active_mtu <= IBV_MTU_4096);
	EXPECT_EQ(p.max_mtu, IBV_MTU_4096);
	/* The entries in use come first; as on a NIC, the table is longer
	 * than they are, and an empty entry is the zero GID for
	 * ibv_query_gid and ENODATA for ibv_query_gid_ex. */
	n = ibv_query_gid_table(c, tab, 64, 0);
	EXPECT_TRUE(n >= 1 && n < p.gid_tbl_len);
	for (int i = 0; i < p.gid_tbl_len; i++) {
		static const union ibv_gid zero;

		EXPECT_EQ(ibv_query_gid(c, 1, i, &g), 0);
		if (i >= n) {
			EXPECT_TRUE(!memcmp(&g, &zero, 16));
			EXPECT_EQ(ibv_query_gid_ex(c, 1, (uint32_t)i, &e, 0),
				  ENODATA);
			continue;
		}
		EXPECT_EQ(ibv_query_gid_ex(c, 1, (uint32_t)i, &e, 0), 0);
		EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
		EXPECT_EQ(e.gid_index, (uint32_t)i);
		EXPECT_TRUE(e.ndev_ifindex > 0);
		EXPECT_TRUE(!memcmp(&e.gid, &g, 16));
		EXPECT_TRUE(!memcmp(&tab[i].gid, &g, 16));
	}
	/* bad flows */
	errno = 0;
	EXPECT_EQ(ibv_query_port(c, 2, &p), EINVAL);
	errno = 0;
	EXPECT_EQ(ibv_query_gid(c, 1, p.gid_tbl_len, &g), -1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(ibv_query_gid(c, 2, 0, &g), -1);
	EXPECT_EQ(ibv_query_gid_ex(c, 1, (uint32_t)p.gid_tbl_len, &e, 0), EINVAL);
	EXPECT_EQ(ibv_query_gid_ex(c, 1, 0, &e, 1), EINVAL);
	EXPECT_EQ(ibv_query_pkey(c, 1, 0, &pkey), 0);
	EXPECT_EQ(be16toh(pkey), 0xffff);
	errno = 0;
	EXPECT_EQ(ibv_query_pkey(c, 1, 1, &pkey), -1);
	EXPECT_EQ(errno, EINVAL);
	ibv_close_device(c);
	return TEST_RESULT();
}

static int test_async_port_events(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_async_event ev;
	struct ibv_port_attr p;
	int fl;

	REQUIRE(c);
	/* The async fd is a real descriptor: non-blocking read fails with
	 * EAGAIN while nothing is queued. */
	fl = fcntl(c->async_fd, F_GETFL);
	REQUIRE(fcntl(c->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
	errno = 0;
	EXPECT_EQ(ibv_get_async_event(c, &ev), -1);
	EXPECT_EQ(errno, EAGAIN);
	EXPECT_EQ(ursa_port_set_state(c, IBV_PORT_DOWN), 0);
	EXPECT_EQ(ibv_get_async_event(c, &ev), 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
	EXPECT_EQ(ev.element.port_num, 1);
	ibv_ack_async_event(&ev);
	EXPECT_EQ(ibv_query_port(c, 1, &p), 0);
	EXPECT_EQ(p.state, IBV_PORT_DOWN);
	EXPECT_EQ(ursa_port_set_state(c, IBV_PORT_ACTIVE), 0);
	EXPECT_EQ(ibv_get_async_event(c, &ev), 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
	ibv_ack_async_event(&ev);
	EXPECT_EQ(ursa_port_set_state(c, IBV_PORT_ARMED), -EINVAL);
	ibv_close_device(c);
	return TEST_RESULT();
}

static int test_pd(void)
{
	struct fx f;
	char buf[64];
	struct ibv_mr *mr;

	REQUIRE(fx_open(&f, 1) == 0);
	mr = ibv_reg_mr(f.pd, buf, sizeof(buf), 0);
	REQUIRE(mr);
	EXPECT_TRUE(mr->pd == f.pd && mr->context == f.ctx);
	errno = 0;
	EXPECT_EQ(ibv_dealloc_pd(f.pd), EBUSY);
	EXPECT_EQ(errno, EBUSY);
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_reg_mr(void)
{
	struct fx f;
	char *buf = aligned_alloc(4096, 1 << 20);
	struct ibv_mr *m1, *m2, *m3;
	struct ursa_mr_info info;

	REQUIRE(fx_open(&f, 1) == 0);
	m1 = ibv_reg_mr(f.pd, buf + 100, 10000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(m1);
	EXPECT_TRUE(m1->addr == buf + 100);
	EXPECT_EQ(m1->length, 10000);
	EXPECT_NE(m1->lkey, m1->rkey);
	EXPECT_EQ(ursa_mr_info(m1, &info), 0);
	EXPECT_EQ(info.entries, 3);		/* 100..10100 spans 3 pages */
	EXPECT_EQ(info.pinned_bytes, 3 * 4096);
	EXPECT_EQ(info.on_demand, 0);
	/* iova registration */
	m2 = ibv_reg_mr_iova2(f.pd, buf, 8192, 0x10000000, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(m2);
	EXPECT_EQ(ursa_mr_info(m2, &info), 0);
	EXPECT_EQ(info.iova, 0x10000000);
	/* ODP: translated but not pinned */
	m3 = ibv_reg_mr(f.pd, buf, 1 << 20, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(m3);
	EXPECT_EQ(ursa_mr_info(m3, &info), 0);
	EXPECT_EQ(info.on_demand, 1);
	EXPECT_EQ(info.pinned_bytes, 0);
	EXPECT_TRUE(info.entries >= 1);
	/* keys are all distinct */
	EXPECT_NE(m1->lkey, m2->lkey);
	EXPECT_NE(m2->rkey, m3->rkey);
	EXPECT_EQ(ibv_dereg_mr(m1), 0);
	EXPECT_EQ(ibv_dereg_mr(m2), 0);
	EXPECT_EQ(ibv_dereg_mr(m3), 0);
	{
		/* the pinned ones are parked in the registration cache,
		 * still pinned, until flushed */
		struct ursa_rcache_stats rs;

		EXPECT_EQ(ursa_rcache_stats(&rs), 0);
		EXPECT_TRUE(rs.entries >= 1 && ursa_pinned_total() > 0);
		EXPECT_TRUE(ursa_rcache_flush() > 0);
		EXPECT_EQ(ursa_rcache_stats(&rs), 0);
		EXPECT_EQ(rs.entries, 0);
	}
	EXPECT_EQ(ursa_pinned_total(), 0);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_reg_mr_bad_flow(void)
{
	struct fx f;
	char *buf = aligned_alloc(4096, 8192);
	void *hole;

	REQUIRE(fx_open(&f, 1) == 0);
	/* IBTA: remote write or atomic require local write */
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, buf, 8192, IBV_ACCESS_REMOTE_WRITE), EINVAL);
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, buf, 8192, IBV_ACCESS_REMOTE_ATOMIC), EINVAL);
	/* unknown access bit */
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, buf, 8192, 1 << 15), EINVAL);
	/* zero length, wrapping range */
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, (void *)(UINTPTR_MAX - 100), 4096, 0), EINVAL);
	/* memory that is not mapped: below vm.mmap_min_addr nothing can
	 * ever be (a freshly unmapped hole could be reused by another
	 * thread before the call) */
	hole = (void *)0x2000;
	EXPECT_TRUE(ursa_rcache_flush() >= 0);
	EXPECT_NULL_ERRNO(ibv_reg_mr(f.pd, hole, 8192, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	EXPECT_EQ(ursa_pinned_total(), 0);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_overlapping_pins(void)
{
	struct fx f;
	char *buf = aligned_alloc(4096, 16 * 4096);
	struct ibv_mr *a, *b;

	REQUIRE(fx_open(&f, 1) == 0);
	/* (the registration cache would keep deregistered pins: drained
	 * before each count) */
	EXPECT_TRUE(ursa_rcache_flush() >= 0);
	a = ibv_reg_mr(f.pd, buf, 8 * 4096, IBV_ACCESS_LOCAL_WRITE);
	b = ibv_reg_mr(f.pd, buf + 4 * 4096, 8 * 4096, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(a && b);
	EXPECT_EQ(ursa_pinned_total(), 12 * 4096);
	EXPECT_EQ(ibv_dereg_mr(a), 0);
	EXPECT_EQ(ursa_pinned_total(), 12 * 4096);	/* a's parked */
	EXPECT_TRUE(ursa_rcache_flush() == 8 * 4096);
	/* b's pages stay pinned */
	EXPECT_EQ(ursa_pinned_total(), 8 * 4096);
	EXPECT_EQ(ibv_dereg_mr(b), 0);
	EXPECT_TRUE(ursa_rcache_flush() >= 0);
	EXPECT_EQ(ursa_pinned_total(), 0);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

/* Real RLIMIT_MEMLOCK: drop root (and CAP_IPC_LOCK) in a child, lower the
 * limit, and register more than it allows. */
static int test_memlock_limit(void)
{
	pid_t pid;
	int st;

	if (geteuid() != 0) {
		struct rlimit rl;

		getrlimit(RLIMIT_MEMLOCK, &rl);
		if (rl.rlim_max == RLIM_INFINITY)
			SKIP("cannot lower RLIMIT_MEMLOCK reliably here");
	}
	pid = fork();
	if (pid == 0) {
		struct rlimit rl = { 64 * 1024, 64 * 1024 };
		struct fx f;
		char *buf = aligned_alloc(4096, 1 << 20);
		struct ibv_mr *ok, *bad;

		if (setrlimit(RLIMIT_MEMLOCK, &rl))
			_exit(10);
		if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
			_exit(11);
		if (fx_open(&f, 1))
			_exit(12);
		ok = ibv_reg_mr(f.pd, buf, 32 * 1024, IBV_ACCESS_LOCAL_WRITE);
		if (!ok)
			_exit(13);
		errno = 0;
		bad = ibv_reg_mr(f.pd, buf + 65536, 256 * 1024, IBV_ACCESS_LOCAL_WRITE);
		if (bad || errno != ENOMEM)
			_exit(14);
		/* on-demand registration does not count against it */
		bad = ibv_reg_mr(f.pd, buf + 65536, 256 * 1024,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		if (!bad)
			_exit(15);
		_exit(0);
	}
	REQUIRE(pid > 0 && waitpid(pid, &st, 0) == pid);
	EXPECT_TRUE(WIFEXITED(st));
	EXPECT_EQ(WEXITSTATUS(st), 0);
	return TEST_RESULT();
}

static int test_thp_cuts_entries(void)
{
	const size_t M2 = 2 << 20, len = 8 << 20;
	struct fx f;
	char *raw, *buf;
	struct ibv_mr *mr;
	struct ursa_mr_info info;
	char mode[128] = "";
	FILE *fp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

	if (fp) {
		if (!fgets(mode, sizeof(mode), fp))
			mode[0] = 0;
		fclose(fp);
	}
	if (strstr(mode, "[never]") || !mode[0])
		SKIP("transparent huge pages disabled on this machine");
	raw = mmap(NULL, len + M2, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(raw != MAP_FAILED);
	buf = (char *)(((uintptr_t)raw + M2 - 1) & ~(M2 - 1));
	madvise(buf, len, MADV_HUGEPAGE);
	memset(buf, 1, len);
	REQUIRE(fx_open(&f, 1) == 0);
	mr = ibv_reg_mr(f.pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	EXPECT_EQ(ursa_mr_info(mr, &info), 0);
	if (info.huge_entries == 0)
		SKIP("the kernel backed the buffer with small pages");
	/* 8 MiB: 4 entries of 2 MiB instead of 2048 of 4 KiB */
	EXPECT_EQ(info.entries, 4);
	EXPECT_EQ(info.page_size, M2);
	ibv_dereg_mr(mr);
	fx_close(&f);
	munmap(raw, len + M2);
	return TEST_RESULT();
}

static int test_dereg_revokes_at_once(void)
{
	struct fx f;
	char *a = calloc(1, 4096), *b = calloc(1, 4096);
	struct ibv_mr *ma, *mb;
	struct ibv_qp *q1, *q2;
	struct ibv_wc wc;
	uint32_t old_rkey;

	REQUIRE(fx_open(&f, 16) == 0);
	ma = ibv_reg_mr(f.pd, a, 4096, ALL_REMOTE);
	mb = ibv_reg_mr(f.pd, b, 4096, ALL_REMOTE);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(ma && mb && q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	old_rkey = mb->rkey;
	EXPECT_EQ(ibv_dereg_mr(mb), 0);
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, 8, ma->lkey, (uintptr_t)b,
			   old_rkey, 1) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dereg_mr(ma);
	fx_close(&f);
	free(a);
	free(b);
	return TEST_RESULT();
}

/*
 * The responder keeps the MR of the last receive it filled (the QP's
 * rcache) without a reference: deregistration must clear it. A receive
 * posted with a key that is then deregistered fails with LOC_PROT_ERR
 * and its buffer stays untouched (under ASan, a stale cache is a use
 * after free).
 */
static int test_recv_mr_deregistered(void)
{
	struct fx f;
	struct ibv_qp *a, *b;
	char *sbuf = aligned_alloc(4096, 4096), *rbuf = aligned_alloc(4096, 4096);
	struct ibv_mr *smr, *rmr;
	struct ibv_wc wc;
	int st[5] = { -1, -1, -1, -1, -1 };

	REQUIRE(sbuf && rbuf && fx_open(&f, 64) == 0);
	a = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	smr = ibv_reg_mr(f.pd, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	rmr = ibv_reg_mr(f.pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(a && b && smr && rmr && connect_pair(a, b, 0) == 0);
	memset(rbuf, 0, 4096);
	memcpy(sbuf, "first", 6);
	REQUIRE(post_recv1(b, rbuf, 64, rmr->lkey, 1) == 0);
	REQUIRE(post_send1(a, IBV_WR_SEND, sbuf, 6, smr->lkey, 0, 0, 2) == 0);
	/* then a receive with the same key, and the key goes */
	for (int i = 0; i < 2 && wait_wc(f.cq, &wc, 5000) == 1; i++)
		st[wc.wr_id < 5 ? wc.wr_id : 0] = wc.status;
	EXPECT_TRUE(st[1] == IBV_WC_SUCCESS && st[2] == IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(rbuf, "first"));
	memset(rbuf, 0, 64);
	REQUIRE(post_recv1(b, rbuf, 64, rmr->lkey, 3) == 0);
	REQUIRE(ibv_dereg_mr(rmr) == 0);
	memcpy(sbuf, "second", 7);
	REQUIRE(post_send1(a, IBV_WR_SEND, sbuf, 7, smr->lkey, 0, 0, 4) == 0);
	for (int i = 0; i < 2 && wait_wc(f.cq, &wc, 5000) == 1; i++)
		st[wc.wr_id < 5 ? wc.wr_id : 0] = wc.status;
	EXPECT_EQ(st[3], IBV_WC_LOC_PROT_ERR);
	EXPECT_EQ(st[4], IBV_WC_REM_OP_ERR);
	EXPECT_EQ(rbuf[0], 0);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	fx_close(&f);
	free(sbuf);
	free(rbuf);
	return TEST_RESULT();
}

static int test_rereg_mr(void)
{
	struct fx f;
	char *a = aligned_alloc(4096, 8192), *b = aligned_alloc(4096, 16384);
	struct ibv_mr *mr;
	struct ibv_pd *pd2;
	uint32_t lk;
	struct ursa_mr_info info;

	REQUIRE(fx_open(&f, 1) == 0);
	pd2 = ibv_alloc_pd(f.ctx);
	mr = ibv_reg_mr(f.pd, a, 8192, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr && pd2);
	lk = mr->lkey;
	EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b, 16384, 0), 0);
	EXPECT_TRUE(mr->addr == b);
	EXPECT_EQ(mr->length, 16384);
	EXPECT_EQ(mr->lkey, lk);
	EXPECT_EQ(ursa_mr_info(mr, &info), 0);
	EXPECT_EQ(info.entries, 4);
	EXPECT_TRUE(ursa_rcache_flush() >= 0);	/* (a's old pins) */
	EXPECT_EQ(ursa_pinned_total(), 16384);
	EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS,
			       pd2, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ), 0);
	EXPECT_TRUE(mr->pd == pd2);
	EXPECT_EQ(ibv_dealloc_pd(f.pd), EBUSY == EBUSY ? 0 : 1); /* f.pd now free */
	f.pd = NULL;
	/* bad flows */
	errno = 0;
	EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			       IBV_ACCESS_REMOTE_WRITE), IBV_REREG_MR_ERR_INPUT);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0), IBV_REREG_MR_ERR_INPUT);
	EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0), IBV_REREG_MR_ERR_INPUT);
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	ibv_dealloc_pd(pd2);
	fx_close(&f);
	free(a);
	free(b);
	return TEST_RESULT();
}

static int test_mw_type1(void)
{
	struct fx f;
	char *a = calloc(1, 4096), *b = calloc(1, 8192);
	struct ibv_mr *ma, *mb, *nobind;
	struct ibv_qp *q1, *q2;
	struct ibv_mw *mw;
	struct ibv_mw_bind bind = { 0 };
	struct ibv_wc wc;
	uint32_t old;

	REQUIRE(fx_open(&f, 16) == 0);
	ma = ibv_reg_mr(f.pd, a, 4096, ALL_REMOTE);
	mb = ibv_reg_mr(f.pd, b, 8192, ALL_REMOTE | IBV_ACCESS_MW_BIND);
	nobind = ibv_reg_mr(f.pd, b, 8192, ALL_REMOTE);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(ma && mb && nobind && q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	mw = ibv_alloc_mw(f.pd, IBV_MW_TYPE_1);
	REQUIRE(mw);
	old = mw->rkey;
	/* bind a 256-byte read-write window at offset 1024 (posted on q2,
	 * the QP that owns the memory) */
	bind.wr_id = 77;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info.mr = mb;
	bind.bind_info.addr = (uintptr_t)b + 1024;
	bind.bind_info.length = 256;
	/* LOCAL_WRITE means nothing for a window; rxe and mlx5 take it
	 * (pyverbs' tests pass it), and so must ursa. An unknown flag is a
	 * bind error. */
	bind.bind_info.mw_access_flags = 1u << 30;
	EXPECT_EQ(ibv_bind_mw(q2, mw, &bind), 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_MW_BIND_ERR);
	REQUIRE(ibv_modify_qp(q2, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			      IBV_QP_STATE) == 0);
	REQUIRE(to_rts(q2, q1->qp_num, ALL_REMOTE) == 0);
	bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
					 IBV_ACCESS_LOCAL_WRITE;
	EXPECT_EQ(ibv_bind_mw(q2, mw, &bind), 0);
	EXPECT_NE(mw->rkey, old);
	EXPECT_EQ(mw->rkey >> 8, old >> 8);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
	EXPECT_EQ(wc.wr_id, 77);
	/* the MR cannot go while the window is bound */
	EXPECT_EQ(ibv_dereg_mr(mb), EBUSY);
	/* write through the window */
	strcpy(a, "window");
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, 7, ma->lkey,
			   (uintptr_t)b + 1024, mw->rkey, 1) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(b + 1024, "window"));
	/* the old key is dead; outside the window is refused */
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, 7, ma->lkey,
			   (uintptr_t)b + 1024 + 250, mw->rkey, 2) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(b[1024 + 250], 0);
	/* bad flows: binding through an MR without MW_BIND fails as a
	 * completion; type checks fail at once */
	EXPECT_EQ(ibv_dealloc_mw(mw), 0);
	EXPECT_EQ(ibv_dereg_mr(mb), 0);
	EXPECT_NULL_ERRNO(ibv_alloc_mw(f.pd, (enum ibv_mw_type)9), EINVAL);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dereg_mr(ma);
	ibv_dereg_mr(nobind);
	fx_close(&f);
	free(a);
	free(b);
	return TEST_RESULT();
}

static int test_mw_type2_invalidate(void)
{
	struct fx f;
	char *a = calloc(1, 4096), *b = calloc(1, 8192);
	struct ibv_mr *ma, *mb;
	struct ibv_qp *q1, *q2;
	struct ibv_mw *mw;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;
	uint32_t rkey;
	int seen;

	REQUIRE(fx_open(&f, 32) == 0);
	ma = ibv_reg_mr(f.pd, a, 4096, ALL_REMOTE);
	mb = ibv_reg_mr(f.pd, b, 8192, ALL_REMOTE | IBV_ACCESS_MW_BIND);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(ma && mb && q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	mw = ibv_alloc_mw(f.pd, IBV_MW_TYPE_2);
	REQUIRE(mw);
	/* type 2 windows are bound with a work request, not ibv_bind_mw */
	{
		struct ibv_mw_bind mb1 = { 0 };

		EXPECT_EQ(ibv_bind_mw(q2, mw, &mb1), EINVAL);
	}
	rkey = ibv_inc_rkey(mw->rkey);
	wr.opcode = IBV_WR_BIND_MW;
	wr.wr_id = 5;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mb;
	wr.bind_mw.bind_info.addr = (uintptr_t)b;
	wr.bind_mw.bind_info.length = 4096;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(mw->rkey, rkey);
	/* binding a valid type 2 window again is an error */
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_MW_BIND_ERR);
	/* that moved q2 to ERR: rebuild the pair */
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	/* the window belongs to the destroyed QP; a fresh pair cannot use
	 * it, so test remote invalidation with a new window */
	EXPECT_EQ(ibv_dealloc_mw(mw), 0);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	mw = ibv_alloc_mw(f.pd, IBV_MW_TYPE_2);
	REQUIRE(mw);
	rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	/* remote write through it works */
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, 8, ma->lkey, (uintptr_t)b, rkey, 6) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	/* SEND with invalidate kills the window at the receiver */
	REQUIRE(post_recv1(q2, b + 4096, 64, mb->lkey, 7) == 0);
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.invalidate_rkey = rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr_id = 8;
	REQUIRE(ibv_post_send(q1, &wr, &bad) == 0);
	seen = 0;
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.wr_id == 7) {
			EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
			EXPECT_EQ(wc.invalidated_rkey, rkey);
			seen = 1;
		}
	}
	EXPECT_TRUE(seen);
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, 8, ma->lkey, (uintptr_t)b, rkey, 9) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dealloc_mw(mw);
	/* LOCAL_INV of a bound window, then of an MR (an error) */
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	mw = ibv_alloc_mw(f.pd, IBV_MW_TYPE_2);
	rkey = ibv_inc_rkey(mw->rkey);
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mb;
	wr.bind_mw.bind_info.addr = (uintptr_t)b;
	wr.bind_mw.bind_info.length = 64;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
	REQUIRE(post_send1(q1, IBV_WR_RDMA_READ, a, 8, ma->lkey, (uintptr_t)b, rkey, 9) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	wr.invalidate_rkey = mb->rkey;
	REQUIRE(ibv_post_send(q2, &wr, &bad) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_NE(wc.status, IBV_WC_SUCCESS);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dealloc_mw(mw);
	EXPECT_EQ(ibv_dereg_mr(mb), 0);
	ibv_dereg_mr(ma);
	fx_close(&f);
	free(a);
	free(b);
	return TEST_RESULT();
}

static int test_cq(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_cq *cq;
	struct ibv_wc wc[4];

	REQUIRE(c);
	cq = ibv_create_cq(c, 100, (void *)0x1234, NULL, 0);
	REQUIRE(cq);
	EXPECT_TRUE(cq->cqe >= 100);
	EXPECT_TRUE(cq->cq_context == (void *)0x1234);
	EXPECT_EQ(ibv_poll_cq(cq, 4, wc), 0);
	EXPECT_EQ(ibv_resize_cq(cq, 1000), 0);
	EXPECT_TRUE(cq->cqe >= 1000);
	EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
	/* bad flows */
	EXPECT_EQ(ibv_resize_cq(cq, 0), EINVAL);
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_NULL_ERRNO(ibv_create_cq(c, 0, NULL, NULL, 0), EINVAL);
	EXPECT_NULL_ERRNO(ibv_create_cq(c, 1 << 30, NULL, NULL, 0), EINVAL);
	EXPECT_NULL_ERRNO(ibv_create_cq(c, 10, NULL, NULL, 5), EINVAL);
	ibv_close_device(c);
	return TEST_RESULT();
}

/* ibv_destroy_qp waits for this thread's acknowledgement */
struct destroyer {
	struct ibv_qp *qp;
	atomic_int done;
};

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;

	ibv_destroy_qp(d->qp);
	atomic_store(&d->done, 1);
	return NULL;
}

/* As with the kernel and libibverbs: destroying a QP drops its async events
 * not yet read, and waits until the ones read are acknowledged (UCX's async
 * thread crashed on a LAST_WQE_REACHED read after its QP was gone). */
static int test_async_events_of_destroyed(void)
{
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct destroyer d = { 0 };
	struct ibv_async_event ev, ev2;
	struct ibv_srq *srq;
	struct ibv_qp *q1, *q2;
	struct fx f;
	pthread_t t;
	int fl;

	REQUIRE(fx_open(&f, 16) == 0);
	srq = ibv_create_srq(f.pd, &sia);
	REQUIRE(srq);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, srq);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, srq);
	REQUIRE(q1 && q2 && to_init(q1, ALL_REMOTE) == 0 &&
		to_init(q2, ALL_REMOTE) == 0);
	fl = fcntl(f.ctx->async_fd, F_GETFL);
	REQUIRE(fcntl(f.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
	/* IBTA 11.6.3.3: an SRQ's QP in error reports its last WQE */
	REQUIRE(ibv_modify_qp(q1, &err, IBV_QP_STATE) == 0);
	REQUIRE(ibv_modify_qp(q2, &err, IBV_QP_STATE) == 0);
	EXPECT_EQ(ibv_destroy_qp(q1), 0);
	/* q1's event went with it; q2's is there */
	REQUIRE(ibv_get_async_event(f.ctx, &ev) == 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
	EXPECT_TRUE(ev.element.qp == q2);
	errno = 0;
	EXPECT_EQ(ibv_get_async_event(f.ctx, &ev2), -1);
	EXPECT_EQ(errno, EAGAIN);
	/* q2's event is read, not acknowledged: its destroy waits */
	d.qp = q2;
	REQUIRE(pthread_create(&t, NULL, destroy_thread, &d) == 0);
	usleep(200000);
	EXPECT_EQ(atomic_load(&d.done), 0);
	ibv_ack_async_event(&ev);
	for (int i = 0; i < 200 && !atomic_load(&d.done); i++)
		usleep(10000);
	EXPECT_EQ(atomic_load(&d.done), 1);
	pthread_join(t, NULL);
	EXPECT_EQ(ibv_destroy_srq(srq), 0);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_cq_busy_and_overflow(void)
{
	struct fx f;
	struct ibv_cq *small;
	struct ibv_qp *a, *b;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr;
	struct ibv_async_event ev;
	struct ibv_wc wc;
	int got_cq_err = 0, got_fatal = 0;

	REQUIRE(fx_open(&f, 16) == 0);
	small = ibv_create_cq(f.ctx, 2, NULL, NULL, 0);
	mr = ibv_reg_mr(f.pd, buf, 4096, ALL_REMOTE);
	a = make_qp(&f, IBV_QPT_RC, small, NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(small && mr && a && b && connect_pair(a, b, ALL_REMOTE) == 0);
	EXPECT_EQ(ibv_destroy_cq(small), EBUSY);
	/* 8 signaled WRITEs into a 2-entry CQ (4 with the spare entry
	 * and rounding) that nobody polls */
	for (int i = 0; i < 8; i++)
		REQUIRE(post_send1(a, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey,
				   (uintptr_t)buf + 1024, mr->rkey, (uint64_t)i) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(ibv_get_async_event(f.ctx, &ev) == 0);
		got_cq_err |= ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
		got_fatal |= ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == a;
		ibv_ack_async_event(&ev);
	}
	EXPECT_TRUE(got_cq_err);
	EXPECT_TRUE(got_fatal);
	EXPECT_EQ(ibv_poll_cq(small, 1, &wc), 1);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	EXPECT_EQ(ibv_destroy_cq(small), 0);
	ibv_dereg_mr(mr);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_comp_channel_epoll(void)
{
	struct fx f;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *evcq;
	struct ibv_qp *a, *b;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr;
	struct epoll_event ee = { .events = EPOLLIN }, out;
	void *cctx;
	int ep;

	REQUIRE(fx_open(&f, 16) == 0);
	ch = ibv_create_comp_channel(f.ctx);
	REQUIRE(ch);
	cq = ibv_create_cq(f.ctx, 16, (void *)0x77, ch, 0);
	mr = ibv_reg_mr(f.pd, buf, 4096, ALL_REMOTE);
	a = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, cq, NULL);
	REQUIRE(cq && mr && a && b && connect_pair(a, b, ALL_REMOTE) == 0);
	EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
	ep = epoll_create1(0);
	REQUIRE(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ee) == 0);
	/* not armed: a completion does not fire */
	REQUIRE(post_recv1(b, buf, 64, mr->lkey, 1) == 0);
	REQUIRE(post_send1(a, IBV_WR_SEND, buf + 512, 8, mr->lkey, 0, 0, 2) == 0);
	EXPECT_EQ(epoll_wait(ep, &out, 1, 100), 0);
	{
		struct ibv_wc wc;

		EXPECT_EQ(wait_wc(cq, &wc, 1000), 1);
	}
	/* solicited-only: an unsolicited SEND does not fire, a solicited
	 * one does */
	REQUIRE(ibv_req_notify_cq(cq, 1) == 0);
	REQUIRE(post_recv1(b, buf, 64, mr->lkey, 3) == 0);
	REQUIRE(post_send1(a, IBV_WR_SEND, buf + 512, 8, mr->lkey, 0, 0, 4) == 0);
	EXPECT_EQ(epoll_wait(ep, &out, 1, 100), 0);
	{
		struct ibv_sge s = { (uintptr_t)buf + 512, 8, mr->lkey };
		struct ibv_send_wr wr = { .sg_list = &s, .num_sge = 1,
			.opcode = IBV_WR_SEND_WITH_IMM,
			.send_flags = IBV_SEND_SOLICITED }, *bad;

		REQUIRE(post_recv1(b, buf, 64, mr->lkey, 5) == 0);
		REQUIRE(ibv_post_send(a, &wr, &bad) == 0);
	}
	EXPECT_EQ(epoll_wait(ep, &out, 1, 2000), 1);
	REQUIRE(ibv_get_cq_event(ch, &evcq, &cctx) == 0);
	EXPECT_TRUE(evcq == cq);
	EXPECT_TRUE(cctx == (void *)0x77);
	ibv_ack_cq_events(cq, 1);
	/* non-blocking channel with nothing queued: -1 / EAGAIN */
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	EXPECT_EQ(ibv_get_cq_event(ch, &evcq, &cctx), -1);
	EXPECT_EQ(errno, EAGAIN);
	close(ep);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
	ibv_dereg_mr(mr);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_cq_ex(void)
{
	struct fx f;
	struct ibv_cq_init_attr_ex ca = { .cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_IMM };
	struct ibv_poll_cq_attr pa = { 0 };
	struct ibv_cq_ex *cx;
	struct ibv_qp *a, *b;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr;
	int n = 0;

	REQUIRE(fx_open(&f, 16) == 0);
	cx = ibv_create_cq_ex(f.ctx, &ca);
	REQUIRE(cx);
	mr = ibv_reg_mr(f.pd, buf, 4096, ALL_REMOTE);
	a = make_qp(&f, IBV_QPT_RC, ibv_cq_ex_to_cq(cx), NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(mr && a && b && connect_pair(a, b, ALL_REMOTE) == 0);
	EXPECT_EQ(ibv_start_poll(cx, &pa), ENOENT);
	for (int i = 0; i < 3; i++)
		REQUIRE(post_send1(a, IBV_WR_RDMA_READ, buf, 16, mr->lkey,
				   (uintptr_t)buf + 2048, mr->rkey, (uint64_t)(10 + i)) == 0);
	usleep(100000);
	REQUIRE(ibv_start_poll(cx, &pa) == 0);
	do {
		EXPECT_EQ(cx->status, IBV_WC_SUCCESS);
		EXPECT_EQ(cx->wr_id, (uint64_t)(10 + n));
		EXPECT_EQ(ibv_wc_read_opcode(cx), IBV_WC_RDMA_READ);
		EXPECT_EQ(ibv_wc_read_byte_len(cx), 16);
		EXPECT_EQ(ibv_wc_read_qp_num(cx), a->qp_num);
		n++;
	} while (ibv_next_poll(cx) == 0);
	ibv_end_poll(cx);
	EXPECT_EQ(n, 3);
	/* bad flow: unsupported completion fields */
	ca.wc_flags = IBV_WC_EX_WITH_CVLAN;
	EXPECT_NULL_ERRNO(ibv_create_cq_ex(f.ctx, &ca), EOPNOTSUPP);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(ibv_cq_ex_to_cq(cx));

	/* Completion timestamps in the device clock that
	 * ibv_query_rt_values_ex reads (1 GHz, hca_core_clock in kHz), and
	 * the same instant on the wall clock. */
	{
		struct ibv_device_attr_ex dx;
		struct ibv_values_ex v0 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK }, v1 = v0;
		struct timespec w0, w1;
		uint64_t t0, t1, last = 0;

		REQUIRE(ibv_query_device_ex(f.ctx, NULL, &dx) == 0);
		EXPECT_EQ(dx.hca_core_clock, 1000000);
		EXPECT_TRUE(dx.completion_timestamp_mask != 0);
		ca.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
		cx = ibv_create_cq_ex(f.ctx, &ca);
		REQUIRE(cx);
		a = make_qp(&f, IBV_QPT_RC, ibv_cq_ex_to_cq(cx), NULL, NULL);
		b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
		REQUIRE(a && b && connect_pair(a, b, ALL_REMOTE) == 0);
		REQUIRE(ibv_query_rt_values_ex(f.ctx, &v0) == 0);
		EXPECT_EQ(v0.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
		clock_gettime(CLOCK_REALTIME, &w0);
		for (int i = 0; i < 3; i++)
			REQUIRE(post_send1(a, IBV_WR_RDMA_READ, buf, 16, mr->lkey,
					   (uintptr_t)buf + 2048, mr->rkey, (uint64_t)i) == 0);
		usleep(100000);
		REQUIRE(ibv_query_rt_values_ex(f.ctx, &v1) == 0);
		clock_gettime(CLOCK_REALTIME, &w1);
		t0 = (uint64_t)v0.raw_clock.tv_sec * 1000000000ull + (uint64_t)v0.raw_clock.tv_nsec;
		t1 = (uint64_t)v1.raw_clock.tv_sec * 1000000000ull + (uint64_t)v1.raw_clock.tv_nsec;
		n = 0;
		REQUIRE(ibv_start_poll(cx, &pa) == 0);
		do {
			uint64_t ts = ibv_wc_read_completion_ts(cx);
			uint64_t wc = ibv_wc_read_completion_wallclock_ns(cx);

			EXPECT_TRUE(ts >= t0 && ts <= t1 && ts >= last);
			EXPECT_TRUE(wc + 1000000 >= (uint64_t)w0.tv_sec * 1000000000ull + (uint64_t)w0.tv_nsec &&
				    wc <= (uint64_t)w1.tv_sec * 1000000000ull + (uint64_t)w1.tv_nsec + 1000000);
			last = ts;
			n++;
		} while (ibv_next_poll(cx) == 0);
		ibv_end_poll(cx);
		EXPECT_EQ(n, 3);
		ibv_destroy_qp(a);
		ibv_destroy_cq(ibv_cq_ex_to_cq(cx));
	}
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_create_qp(void)
{
	struct fx f;
	struct ibv_qp_init_attr ia = { 0 };
	struct ibv_qp *qp;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	uint32_t qpns[64];

	REQUIRE(fx_open(&f, 16) == 0);
	ia.send_cq = ia.recv_cq = f.cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 100;
	ia.cap.max_recv_wr = 10;
	ia.cap.max_send_sge = 32;
	ia.cap.max_recv_sge = 2;
	ia.cap.max_inline_data = 200;
	qp = ibv_create_qp(f.pd, &ia);
	REQUIRE(qp);
	/* granted caps are written back, at least what was asked */
	EXPECT_TRUE(ia.cap.max_send_wr >= 100);
	EXPECT_TRUE(ia.cap.max_inline_data >= 256);
	EXPECT_EQ(qp->state, IBV_QPS_RESET);
	EXPECT_TRUE(qp->qp_num > 1 && qp->qp_num <= 0xffffff);
	EXPECT_EQ(ibv_query_qp(qp, &qa, IBV_QP_CAP | IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_RESET);
	EXPECT_EQ(qi.cap.max_inline_data, ia.cap.max_inline_data);
	EXPECT_EQ(qi.qp_type, IBV_QPT_RC);
	EXPECT_EQ(ibv_dealloc_pd(f.pd), EBUSY);
	EXPECT_EQ(ibv_destroy_cq(f.cq), EBUSY);
	EXPECT_EQ(ibv_destroy_qp(qp), 0);
	/* QPNs are unique */
	for (int i = 0; i < 64; i++) {
		struct ibv_qp *q = make_qp(&f, IBV_QPT_UD, NULL, NULL, NULL);

		REQUIRE(q);
		qpns[i] = q->qp_num;
		for (int j = 0; j < i; j++)
			EXPECT_NE(qpns[j], qpns[i]);
		ibv_destroy_qp(q);
	}
	/* bad flows */
	ia.cap.max_send_sge = 33;
	EXPECT_NULL_ERRNO(ibv_create_qp(f.pd, &ia), EINVAL);
	ia.cap.max_send_sge = 1;
	ia.cap.max_inline_data = 100000;
	EXPECT_NULL_ERRNO(ibv_create_qp(f.pd, &ia), EINVAL);
	ia.cap.max_inline_data = 0;
	ia.cap.max_send_wr = 1 << 20;
	EXPECT_NULL_ERRNO(ibv_create_qp(f.pd, &ia), EINVAL);
	ia.cap.max_send_wr = 1;
	ia.send_cq = NULL;
	EXPECT_NULL_ERRNO(ibv_create_qp(f.pd, &ia), EINVAL);
	ia.send_cq = f.cq;
	ia.qp_type = IBV_QPT_XRC_SEND;
	EXPECT_NULL_ERRNO(ibv_create_qp(f.pd, &ia), EOPNOTSUPP);
	/* Every size inside the advertised limits works (pyverbs draws them
	 * at random; some draws once failed with EOPNOTSUPP). */
	{
		struct ibv_device_attr da;
		unsigned seed = 20;

		REQUIRE(ibv_query_device(f.ctx, &da) == 0);
		for (int i = 0; i < 60; i++) {
			static const enum ibv_qp_type t[] = { IBV_QPT_RC, IBV_QPT_UC,
							      IBV_QPT_UD };
			struct ibv_qp *q;

			ia.qp_type = t[i % 3];
			ia.cap.max_send_wr = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_qp_wr;
			ia.cap.max_recv_wr = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_qp_wr;
			ia.cap.max_send_sge = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_sge;
			ia.cap.max_recv_sge = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_sge;
			ia.cap.max_inline_data = (uint32_t)rand_r(&seed) % 257;
			q = ibv_create_qp(f.pd, &ia);
			EXPECT_TRUE(q != NULL);
			if (!q) {
				fprintf(stderr, "draw %d: type %d wr %u/%u sge %u/%u inline %u: %s\n",
					i, ia.qp_type, ia.cap.max_send_wr, ia.cap.max_recv_wr,
					ia.cap.max_send_sge, ia.cap.max_recv_sge,
					ia.cap.max_inline_data, strerror(errno));
				break;
			}
			EXPECT_EQ(ibv_destroy_qp(q), 0);
		}
	}
	fx_close(&f);
	return TEST_RESULT();
}

/* What rxe (and mlx5) accept and ursa refused, found by rdma-core's own
 * pyverbs tests: the CREATE_FLAGS bit of ibv_create_qp_ex with no flag
 * set, for every QP type; any MR flag in qp_access_flags (ODP tests set
 * ON_DEMAND there); and a RESET or destroyed QP leaving nothing in its CQs
 * (mlx5_cq_clean; pyverbs' rereg tests poll after a RESET). */
static int test_rxe_conformance(void)
{
	static const enum ibv_qp_type types[] = { IBV_QPT_RC, IBV_QPT_UC,
						  IBV_QPT_UD };
	struct ibv_qp_init_attr_ex ia = { 0 };
	struct ibv_qp *qp, *other;
	struct ibv_wc wc;
	struct fx f;
	char buf[64];
	struct ibv_mr *mr;

	REQUIRE(fx_open(&f, 16) == 0);
	ia.send_cq = ia.recv_cq = f.cq;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	ia.pd = f.pd;
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		ia.qp_type = types[i];
		ia.create_flags = 0;
		qp = ibv_create_qp_ex(f.ctx, &ia);
		EXPECT_TRUE(qp != NULL);
		if (qp)
			ibv_destroy_qp(qp);
		ia.create_flags = IBV_QP_CREATE_SCATTER_FCS;
		EXPECT_NULL_ERRNO(ibv_create_qp_ex(f.ctx, &ia), EOPNOTSUPP);
	}
	qp = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	other = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(qp && other);
	EXPECT_EQ(to_init(qp, ALL_REMOTE | IBV_ACCESS_ON_DEMAND |
			  IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING), 0);
	/* a remote right without LOCAL_WRITE is fine for a QP */
	EXPECT_EQ(ibv_modify_qp(qp, &(struct ibv_qp_attr){
			.qp_access_flags = IBV_ACCESS_REMOTE_ATOMIC },
			IBV_QP_ACCESS_FLAGS), 0);
	EXPECT_EQ(ibv_modify_qp(qp, &(struct ibv_qp_attr){
			.qp_access_flags = 1u << 30 }, IBV_QP_ACCESS_FLAGS),
		  EINVAL);
	/* RESET: the QP's flushed receives leave the CQ, another QP's stay */
	mr = ibv_reg_mr(f.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr && to_init(other, 0) == 0);
	EXPECT_EQ(post_recv1(qp, buf, 8, mr->lkey, 1), 0);
	EXPECT_EQ(post_recv1(qp, buf, 8, mr->lkey, 2), 0);
	EXPECT_EQ(post_recv1(other, buf, 8, mr->lkey, 3), 0);
	EXPECT_EQ(ibv_modify_qp(qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR },
				IBV_QP_STATE), 0);
	EXPECT_EQ(ibv_modify_qp(other, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR },
				IBV_QP_STATE), 0);
	usleep(20000);
	EXPECT_EQ(ibv_modify_qp(qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
				IBV_QP_STATE), 0);
	REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.wr_id, 3);
	EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_TRUE(cq_stays_empty(f.cq, 20));
	/* destroy: the same */
	EXPECT_EQ(post_recv1(other, buf, 8, mr->lkey, 4), 0);
	usleep(20000);
	EXPECT_EQ(ibv_destroy_qp(other), 0);
	EXPECT_TRUE(cq_stays_empty(f.cq, 20));
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_modify_qp_bad_flow(void)
{
	struct fx f;
	struct ibv_qp *qp, *ud;
	struct ibv_qp_attr a = { 0 };
	char buf[64];
	struct ibv_mr *mr;

	REQUIRE(fx_open(&f, 16) == 0);
	qp = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	ud = make_qp(&f, IBV_QPT_UD, NULL, NULL, NULL);
	mr = ibv_reg_mr(f.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(qp && ud && mr);
	/* posting in RESET */
	EXPECT_EQ(post_recv1(qp, buf, 8, mr->lkey, 1), EINVAL);
	EXPECT_EQ(post_send1(qp, IBV_WR_SEND, buf, 8, mr->lkey, 0, 0, 1), EINVAL);
	/* RESET -> RTR skips INIT */
	a.qp_state = IBV_QPS_RTR;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
	/* INIT without the port */
	a.qp_state = IBV_QPS_INIT;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS), EINVAL);
	/* port 2 does not exist, pkey index 1 neither */
	a.port_num = 2;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL);
	a.port_num = 1;
	a.pkey_index = 1;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL);
	a.pkey_index = 0;
	/* Q_Key is not an RC attribute */
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_QKEY), EINVAL);
	/* the state did not change through all of that */
	EXPECT_EQ(qp->state, IBV_QPS_RESET);
	EXPECT_EQ(to_init(qp, ALL_REMOTE), 0);
	EXPECT_EQ(qp->state, IBV_QPS_INIT);
	/* receives may be posted from INIT on, sends may not */
	EXPECT_EQ(post_recv1(qp, buf, 8, mr->lkey, 1), 0);
	EXPECT_EQ(post_send1(qp, IBV_WR_SEND, buf, 8, mr->lkey, 0, 0, 1), EINVAL);
	/* RTR needs an AV with a GRH on RoCE, and an MTU the port has */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = ud->qp_num;
	a.max_dest_rd_atomic = 1;
	a.ah_attr.port_num = 1;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), EINVAL);
	fill_av(f.ctx, &a.ah_attr);
	{	/* one more than the device's max_qp_rd_atom */
		struct ibv_device_attr da;

		REQUIRE(ibv_query_device(f.ctx, &da) == 0 && da.max_qp_rd_atom < 255);
		a.max_dest_rd_atomic = (uint8_t)(da.max_qp_rd_atom + 1);
	}
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), EINVAL);
	a.max_dest_rd_atomic = 1;
	a.path_mtu = (enum ibv_mtu)6;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), EINVAL);
	a.path_mtu = IBV_MTU_1024;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), 0);
	/* RTS with retry_cnt 8 */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.retry_cnt = 8;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), EINVAL);
	/* wrong current state given */
	a.retry_cnt = 7;
	a.cur_qp_state = IBV_QPS_INIT;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), EINVAL);
	EXPECT_EQ(qp->state, IBV_QPS_RTR);
	/* any state -> RESET works and empties the queues */
	a.qp_state = IBV_QPS_RESET;
	EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	EXPECT_EQ(qp->state, IBV_QPS_RESET);
	EXPECT_TRUE(cq_stays_empty(f.cq, 20));
	ibv_destroy_qp(qp);
	ibv_destroy_qp(ud);
	ibv_dereg_mr(mr);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_post_bad_flow(void)
{
	struct fx f;
	struct ibv_qp *a, *b;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr;
	struct ibv_sge s[40];
	struct ibv_send_wr wr = { 0 }, *bad = NULL;
	struct ibv_recv_wr rwr = { 0 }, *rbad = NULL;
	int posted = 0, ret;

	REQUIRE(fx_open(&f, 256) == 0);
	mr = ibv_reg_mr(f.pd, buf, 4096, ALL_REMOTE);
	a = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(mr && a && b && connect_pair(a, b, ALL_REMOTE) == 0);
	for (int i = 0; i < 40; i++)
		s[i] = (struct ibv_sge){ (uintptr_t)buf, 1, mr->lkey };
	/* too many SGEs */
	wr.sg_list = s;
	wr.num_sge = 33;
	wr.opcode = IBV_WR_RDMA_WRITE;
	EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
	EXPECT_TRUE(bad == &wr);
	rwr.sg_list = s;
	rwr.num_sge = 33;
	EXPECT_EQ(ibv_post_recv(b, &rwr, &rbad), EINVAL);
	EXPECT_TRUE(rbad == &rwr);
	/* inline larger than granted */
	wr.num_sge = 1;
	s[0].length = 4000;
	wr.send_flags = IBV_SEND_INLINE;
	EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
	/* unknown opcode */
	s[0].length = 1;
	wr.send_flags = 0;
	wr.opcode = (enum ibv_wr_opcode)99;
	EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
	/* the receive queue fills up: ENOMEM and bad_wr names the WR */
	rwr.num_sge = 1;
	for (;;) {
		ret = ibv_post_recv(b, &rwr, &rbad);
		if (ret)
			break;
		posted++;
		if (posted > 100000)
			break;
	}
	EXPECT_EQ(ret, ENOMEM);
	EXPECT_TRUE(posted >= 64);
	/* a chain stops at the first bad WR; the ones before it are posted */
	{
		struct ibv_send_wr w2[3];

		for (int i = 0; i < 3; i++) {
			memset(&w2[i], 0, sizeof(w2[i]));
			w2[i].wr_id = (uint64_t)i;
			w2[i].sg_list = s;
			w2[i].num_sge = 1;
			w2[i].opcode = IBV_WR_RDMA_WRITE;
			w2[i].send_flags = IBV_SEND_SIGNALED;
			w2[i].wr.rdma.remote_addr = (uintptr_t)buf + 100;
			w2[i].wr.rdma.rkey = mr->rkey;
			w2[i].next = i < 2 ? &w2[i + 1] : NULL;
		}
		w2[1].num_sge = 40;
		EXPECT_EQ(ibv_post_send(a, &w2[0], &bad), EINVAL);
		EXPECT_TRUE(bad == &w2[1]);
		{
			struct ibv_wc wc;

			EXPECT_EQ(wait_wc(f.cq, &wc, 1000), 1);
			EXPECT_EQ(wc.wr_id, 0);
			EXPECT_TRUE(cq_stays_empty(f.cq, 30));
		}
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_ah(void)
{
	struct fx f;
	struct ibv_ah_attr av;
	struct ibv_ah *ah;

	REQUIRE(fx_open(&f, 1) == 0);
	fill_av(f.ctx, &av);
	ah = ibv_create_ah(f.pd, &av);
	REQUIRE(ah);
	EXPECT_TRUE(ah->pd == f.pd);
	EXPECT_EQ(ibv_dealloc_pd(f.pd), EBUSY);
	EXPECT_EQ(ibv_destroy_ah(ah), 0);
	/* RoCE needs the GRH; sgid index must exist */
	av.is_global = 0;
	EXPECT_NULL_ERRNO(ibv_create_ah(f.pd, &av), EINVAL);
	av.is_global = 1;
	av.grh.sgid_index = 200;
	EXPECT_NULL_ERRNO(ibv_create_ah(f.pd, &av), EINVAL);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_engine_sleeps(void)
{
	struct fx f;
	struct ursa_engine_stats s1, s2;

	REQUIRE(fx_open(&f, 1) == 0);
	/* An idle engine goes to sleep and stays asleep: no wake-ups and
	 * no CPU burnt while nothing is posted. */
	usleep(50000);
	EXPECT_EQ(ursa_engine_stats(f.ctx, &s1), 0);
	{
		struct rusage r1, r2;

		getrusage(RUSAGE_SELF, &r1);
		usleep(300000);
		getrusage(RUSAGE_SELF, &r2);
		long us = (r2.ru_utime.tv_sec - r1.ru_utime.tv_sec) * 1000000L +
			  (r2.ru_utime.tv_usec - r1.ru_utime.tv_usec);

		EXPECT_TRUE(us < 30000);
	}
	EXPECT_EQ(ursa_engine_stats(f.ctx, &s2), 0);
	EXPECT_EQ(s2.wakeups, s1.wakeups);
	fx_close(&f);
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(device_list, "ibv_get_device_list and friends"),
	TEST_ENTRY(small_stack_threads, "threads with 16 and 64 KiB stacks are created and use verbs"),
	TEST_ENTRY(device_name_env, "URSA_DEVICE_NAME renames the device"),
	TEST_ENTRY(query_device, "device limits and query_device_ex"),
	TEST_ENTRY(query_port_gid_pkey, "port, GID table, P_Key"),
	TEST_ENTRY(rxe_conformance, "create flags, QP access flags, CQ cleaned at RESET/destroy"),
	TEST_ENTRY(async_port_events, "async fd: port down/up events"),
	TEST_ENTRY(async_events_of_destroyed, "destroy_qp drops unread async events, waits for acks"),
	TEST_ENTRY(pd, "PD in use cannot be freed"),
	TEST_ENTRY(reg_mr, "registration, translation, ODP"),
	TEST_ENTRY(reg_mr_bad_flow, "registration errno rules"),
	TEST_ENTRY(overlapping_pins, "overlapping MRs share pins"),
	TEST_ENTRY(memlock_limit, "RLIMIT_MEMLOCK gives ENOMEM"),
	TEST_ENTRY(thp_cuts_entries, "huge pages cut translation entries"),
	TEST_ENTRY(dereg_revokes_at_once, "a deregistered rkey fails at once"),
	TEST_ENTRY(rereg_mr, "ibv_rereg_mr translation, PD, access"),
	TEST_ENTRY(recv_mr_deregistered, "a receive whose MR went: LOC_PROT_ERR, buffer untouched"),
	TEST_ENTRY(mw_type1, "type 1 window: bind, access, bounds"),
	TEST_ENTRY(mw_type2_invalidate, "type 2 window: bind, invalidate"),
	TEST_ENTRY(cq, "CQ create, resize, bad sizes"),
	TEST_ENTRY(cq_busy_and_overflow, "CQ in use, CQ overrun events"),
	TEST_ENTRY(comp_channel_epoll, "completion channel with epoll, solicited"),
	TEST_ENTRY(cq_ex, "ibv_create_cq_ex and start/next/end poll"),
	TEST_ENTRY(create_qp, "QP creation, caps, unique QPNs"),
	TEST_ENTRY(modify_qp_bad_flow, "state machine refuses bad transitions"),
	TEST_ENTRY(post_bad_flow, "post errors: EINVAL, ENOMEM, bad_wr"),
	TEST_ENTRY(ah, "address handles"),
	TEST_ENTRY(engine_sleeps, "idle engine sleeps"),
};

int main(int argc, char **argv)
{
	return harness_main(tests, (int)(sizeof(tests) / sizeof(tests[0])), argc, argv);
}
