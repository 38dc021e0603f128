// SPDX-License-Identifier: MIT
/*
 * data.c (functional) - the data path between QPs of one process: every
 * operation, and the error completions of the spec.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ursa/ursa.h>

#include "common.h"

struct pair {
	struct fx f;
	struct ibv_qp *a, *b;
	char *abuf, *bbuf;
	struct ibv_mr *amr, *bmr;
	size_t len;
};

static int pair_open(struct pair *p, enum ibv_qp_type t, int access,
		     size_t len)
{
	memset(p, 0, sizeof(*p));
	if (fx_open(&p->f, 256))
		return -1;
	p->len = len;
	p->abuf = aligned_alloc(4096, len);
	p->bbuf = aligned_alloc(4096, len);
	if (!p->abuf || !p->bbuf)
		return -1;
	memset(p->abuf, 0, len);
	memset(p->bbuf, 0, len);
	p->amr = ibv_reg_mr(p->f.pd, p->abuf, len, ALL_REMOTE);
	p->bmr = ibv_reg_mr(p->f.pd, p->bbuf, len, ALL_REMOTE);
	p->a = make_qp(&p->f, t, NULL, NULL, NULL);
	p->b = make_qp(&p->f, t, NULL, NULL, NULL);
	if (!p->amr || !p->bmr || !p->a || !p->b)
		return -1;
	if (t == IBV_QPT_UD)
		return to_rts(p->a, 0, 0) || to_rts(p->b, 0, 0);
	return connect_pair(p->a, p->b, access);
}

static void pair_close(struct pair *p)
{
	if (p->a)
		ibv_destroy_qp(p->a);
	if (p->b)
		ibv_destroy_qp(p->b);
	if (p->amr)
		ibv_dereg_mr(p->amr);
	if (p->bmr)
		ibv_dereg_mr(p->bmr);
	fx_close(&p->f);
	free(p->abuf);
	free(p->bbuf);
}

static int test_send_recv(void)
{
	struct pair p;
	struct ibv_wc wc;
	int got_send = 0, got_recv = 0;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	memcpy(p.abuf, "hello, ursa", 12);
	EXPECT_EQ(post_recv1(p.b, p.bbuf, 4096, p.bmr->lkey, 7), 0);
	EXPECT_EQ(post_send1(p.a, IBV_WR_SEND, p.abuf, 12, p.amr->lkey, 0, 0, 9), 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_SEND) {
			got_send = 1;
			EXPECT_EQ(wc.wr_id, 9);
			EXPECT_EQ(wc.qp_num, p.a->qp_num);
		} else {
			got_recv = 1;
			EXPECT_EQ(wc.opcode, IBV_WC_RECV);
			EXPECT_EQ(wc.wr_id, 7);
			EXPECT_EQ(wc.byte_len, 12);
			EXPECT_EQ(wc.qp_num, p.b->qp_num);
			EXPECT_EQ(wc.src_qp, p.a->qp_num);
			EXPECT_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
		}
	}
	EXPECT_TRUE(got_send && got_recv);
	EXPECT_TRUE(!memcmp(p.bbuf, "hello, ursa", 12));
	pair_close(&p);
	return TEST_RESULT();
}

static int test_send_imm_sge_list_inline(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_sge s[3], r[2];
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_recv_wr rwr = { 0 }, *rbad;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 8192) == 0);
	for (int i = 0; i < 300; i++)
		p.abuf[i] = (char)i;
	/* gather 3 pieces into 2 scattered receive buffers */
	s[0] = (struct ibv_sge){ (uintptr_t)p.abuf, 100, p.amr->lkey };
	s[1] = (struct ibv_sge){ (uintptr_t)p.abuf + 100, 1, p.amr->lkey };
	s[2] = (struct ibv_sge){ (uintptr_t)p.abuf + 101, 199, p.amr->lkey };
	r[0] = (struct ibv_sge){ (uintptr_t)p.bbuf, 150, p.bmr->lkey };
	r[1] = (struct ibv_sge){ (uintptr_t)p.bbuf + 4096, 500, p.bmr->lkey };
	rwr.sg_list = r;
	rwr.num_sge = 2;
	REQUIRE(ibv_post_recv(p.b, &rwr, &rbad) == 0);
	wr.sg_list = s;
	wr.num_sge = 3;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htobe32(0xdeadbeef);
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV) {
			EXPECT_EQ(wc.byte_len, 300);
			EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
			EXPECT_EQ(be32toh(wc.imm_data), 0xdeadbeef);
		}
	}
	EXPECT_TRUE(!memcmp(p.bbuf, p.abuf, 150));
	EXPECT_TRUE(!memcmp(p.bbuf + 4096, p.abuf + 150, 150));

	/* Inline: the buffer may change right after post returns, and
	 * the lkey is not used at all. */
	memset(p.bbuf, 0, 8192);
	REQUIRE(post_recv1(p.b, p.bbuf, 64, p.bmr->lkey, 1) == 0);
	strcpy(p.abuf, "inline data");
	s[0] = (struct ibv_sge){ (uintptr_t)p.abuf, 12, 0xbad };
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	memset(p.abuf, 'X', 12);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	}
	EXPECT_TRUE(!strcmp(p.bbuf, "inline data"));

	/* An inline entry of length 0 may have a NULL address (UCX posts
	 * such): the empty payload arrives with its immediate. */
	REQUIRE(post_recv1(p.b, p.bbuf, 64, p.bmr->lkey, 2) == 0);
	s[0] = (struct ibv_sge){ 0, 0, 0 };
	s[1] = (struct ibv_sge){ (uintptr_t)p.abuf, 4, 0 };
	memcpy(p.abuf, "tail", 4);
	wr.num_sge = 2;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htobe32(7);
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV)
			EXPECT_EQ(wc.byte_len, 4);
	}
	EXPECT_TRUE(!memcmp(p.bbuf, "tail", 4));
	pair_close(&p);
	return TEST_RESULT();
}

static int test_write_read(void)
{
	struct pair p;
	struct ibv_wc wc;
	size_t len = 1 << 20;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, len) == 0);
	for (size_t i = 0; i < len; i++)
		p.abuf[i] = (char)(i * 7);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, (uint32_t)len,
			   p.amr->lkey, (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 5000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
	EXPECT_TRUE(!memcmp(p.abuf, p.bbuf, len));
	/* READ it back from b into the second half of a */
	memset(p.abuf, 0, len);
	memcpy(p.bbuf + 100, "read me", 8);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_READ, p.abuf + 4096, 4096,
			   p.amr->lkey, (uintptr_t)p.bbuf, p.bmr->rkey, 2) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 5000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
	EXPECT_EQ(wc.byte_len, 4096);
	EXPECT_TRUE(!memcmp(p.abuf + 4096, p.bbuf, 4096));
	EXPECT_TRUE(!strcmp(p.abuf + 4096 + 100, "read me"));
	/* The target made no verbs call and has no completion. */
	EXPECT_TRUE(cq_stays_empty(p.f.cq, 50));
	pair_close(&p);
	return TEST_RESULT();
}

static int test_write_imm(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_sge s;
	struct ibv_send_wr wr = { 0 }, *bad;
	int seen_recv = 0;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	strcpy(p.abuf, "written");
	/* A zero-length receive buffer is enough: the data goes to the
	 * rkey's memory; the WQE only carries the immediate. */
	REQUIRE(post_recv1(p.b, NULL, 0, 0, 55) == 0);
	s = (struct ibv_sge){ (uintptr_t)p.abuf, 8, p.amr->lkey };
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(42);
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)p.bbuf + 16;
	wr.wr.rdma.rkey = p.bmr->rkey;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			seen_recv = 1;
			EXPECT_EQ(wc.wr_id, 55);
			EXPECT_EQ(wc.byte_len, 8);
			EXPECT_EQ(be32toh(wc.imm_data), 42);
		}
	}
	EXPECT_TRUE(seen_recv);
	EXPECT_TRUE(!strcmp(p.bbuf + 16, "written"));

	/* No SGE at all, and so no list: sg_list may be NULL (ursa once
	 * passed that NULL to memcpy; UBSan caught it) */
	{
		struct ibv_recv_wr rw = { .wr_id = 56, .sg_list = NULL, .num_sge = 0 }, *rbad;

		REQUIRE(ibv_post_recv(p.b, &rw, &rbad) == 0);
	}
	wr.imm_data = htobe32(43);
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	seen_recv = 0;
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			seen_recv = 1;
			EXPECT_EQ(wc.wr_id, 56);
			EXPECT_EQ(be32toh(wc.imm_data), 43);
		}
	}
	EXPECT_TRUE(seen_recv);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_atomics(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_sge s;
	struct ibv_send_wr wr = { 0 }, *bad;
	uint64_t *target, *result;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	target = (uint64_t *)p.bbuf;
	result = (uint64_t *)p.abuf;
	*target = 100;
	s = (struct ibv_sge){ (uintptr_t)result, 8, p.amr->lkey };
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)target;
	wr.wr.atomic.rkey = p.bmr->rkey;
	wr.wr.atomic.compare_add = 5;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_FETCH_ADD);
	EXPECT_EQ(*result, 100);
	EXPECT_EQ(*target, 105);
	/* compare-and-swap that matches, then one that does not */
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 105;
	wr.wr.atomic.swap = 7;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_COMP_SWAP);
	EXPECT_EQ(*result, 105);
	EXPECT_EQ(*target, 7);
	wr.wr.atomic.compare_add = 999;
	wr.wr.atomic.swap = 1;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(*result, 7);
	EXPECT_EQ(*target, 7);
	/* misaligned: invalid request, and both QPs go to ERR */
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)target + 4;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
	EXPECT_EQ(*target, 7);
	pair_close(&p);
	return TEST_RESULT();
}

/* Several threads, each with its own context and QP pair, add to one
 * counter: the sum is exact. */
struct faa_arg {
	uint64_t *counter;
	struct ibv_mr *counter_mr;	/* registered in the first context */
	int iters, ok;
};

static void *faa_thread(void *v)
{
	struct faa_arg *a = v;
	struct fx f;
	struct ibv_qp *q, *t;
	struct ibv_mr *res_mr, *cmr;
	uint64_t res = 0;
	struct ibv_wc wc;

	a->ok = 0;
	if (fx_open(&f, 64))
		return NULL;
	/* The target QP lives in this context too, so the counter is
	 * registered again here under this context's PD. */
	cmr = ibv_reg_mr(f.pd, a->counter, 8, ALL_REMOTE);
	res_mr = ibv_reg_mr(f.pd, &res, 8, IBV_ACCESS_LOCAL_WRITE);
	q = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	t = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	if (!cmr || !res_mr || !q || !t || connect_pair(q, t, ALL_REMOTE))
		return NULL;
	for (int i = 0; i < a->iters; i++) {
		struct ibv_sge s = { (uintptr_t)&res, 8, res_mr->lkey };
		struct ibv_send_wr wr = { .sg_list = &s, .num_sge = 1,
			.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
			.send_flags = IBV_SEND_SIGNALED }, *bad;

		wr.wr.atomic.remote_addr = (uintptr_t)a->counter;
		wr.wr.atomic.rkey = cmr->rkey;
		wr.wr.atomic.compare_add = 1;
		if (ibv_post_send(q, &wr, &bad) || wait_wc(f.cq, &wc, 5000) != 1 ||
		    wc.status != IBV_WC_SUCCESS)
			return NULL;
	}
	ibv_destroy_qp(q);
	ibv_destroy_qp(t);
	ibv_dereg_mr(cmr);
	ibv_dereg_mr(res_mr);
	fx_close(&f);
	a->ok = 1;
	return NULL;
}

static int test_atomics_concurrent_contexts(void)
{
	static uint64_t counter __attribute__((aligned(64)));
	struct faa_arg args[4];
	pthread_t th[4];

	counter = 0;
	for (int i = 0; i < 4; i++) {
		args[i] = (struct faa_arg){ &counter, NULL, 500, 0 };
		pthread_create(&th[i], NULL, faa_thread, &args[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		EXPECT_TRUE(args[i].ok);
	}
	EXPECT_EQ(counter, 2000);
	return TEST_RESULT();
}

static int test_two_contexts(void)
{
	struct fx f1, f2;
	struct ibv_qp *q1, *q2;
	char *b1 = calloc(1, 4096), *b2 = calloc(1, 4096);
	struct ibv_mr *m1, *m2;
	struct ibv_wc wc;

	REQUIRE(fx_open(&f1, 16) == 0 && fx_open(&f2, 16) == 0);
	m1 = ibv_reg_mr(f1.pd, b1, 4096, ALL_REMOTE);
	m2 = ibv_reg_mr(f2.pd, b2, 4096, ALL_REMOTE);
	q1 = make_qp(&f1, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f2, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(m1 && m2 && q1 && q2);
	REQUIRE(connect_pair(q1, q2, ALL_REMOTE) == 0);
	strcpy(b1, "across contexts");
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, b1, 16, m1->lkey,
			   (uintptr_t)b2, m2->rkey, 1) == 0);
	REQUIRE(wait_wc(f1.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(b2, "across contexts"));
	/* The target context's CQ saw nothing: WRITE is one-sided. */
	EXPECT_TRUE(cq_stays_empty(f2.cq, 20));
	/* SEND lands in the other context's CQ */
	REQUIRE(post_recv1(q2, b2, 4096, m2->lkey, 3) == 0);
	REQUIRE(post_send1(q1, IBV_WR_SEND, b1, 16, m1->lkey, 0, 0, 2) == 0);
	REQUIRE(wait_wc(f2.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.wr_id, 3);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dereg_mr(m1);
	ibv_dereg_mr(m2);
	fx_close(&f1);
	fx_close(&f2);
	free(b1);
	free(b2);
	return TEST_RESULT();
}

static int test_unsignaled_and_sq_sig_all(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_sge s;
	struct ibv_send_wr wr[10], *bad;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	s = (struct ibv_sge){ (uintptr_t)p.abuf, 8, p.amr->lkey };
	/* 200 unsignaled WRITEs through a 64-entry queue: slots must be
	 * freed without completions; only every 10th is signaled. */
	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < 10; i++) {
			memset(&wr[i], 0, sizeof(wr[i]));
			wr[i].wr_id = (uint64_t)(round * 10 + i);
			wr[i].sg_list = &s;
			wr[i].num_sge = 1;
			wr[i].opcode = IBV_WR_RDMA_WRITE;
			wr[i].send_flags = i == 9 ? IBV_SEND_SIGNALED : 0;
			wr[i].wr.rdma.remote_addr = (uintptr_t)p.bbuf + 8 * (uint64_t)i;
			wr[i].wr.rdma.rkey = p.bmr->rkey;
			wr[i].next = i < 9 ? &wr[i + 1] : NULL;
		}
		REQUIRE(ibv_post_send(p.a, &wr[0], &bad) == 0);
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc.wr_id, (uint64_t)(round * 10 + 9));
	}
	EXPECT_TRUE(cq_stays_empty(p.f.cq, 20));
	pair_close(&p);
	return TEST_RESULT();
}

static int test_rnr_retry_exceeded(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	long long t0;

	memset(&p, 0, sizeof(p));
	REQUIRE(fx_open(&p.f, 64) == 0);
	p.abuf = calloc(1, 4096);
	p.amr = ibv_reg_mr(p.f.pd, p.abuf, 4096, ALL_REMOTE);
	p.a = make_qp(&p.f, IBV_QPT_RC, NULL, NULL, NULL);
	p.b = make_qp(&p.f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(p.amr && p.a && p.b);
	/* rnr_retry 2, responder's RNR timer 0.32 ms (code 10) */
	REQUIRE(to_rts_ex(p.a, p.b->qp_num, ALL_REMOTE, 2, 14, 7, 10) == 0);
	REQUIRE(to_rts_ex(p.b, p.a->qp_num, ALL_REMOTE, 2, 14, 7, 10) == 0);
	t0 = now_ms();
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 8, p.amr->lkey, 0, 0, 5) == 0);
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 8, p.amr->lkey, 0, 0, 6) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
	EXPECT_EQ(wc.wr_id, 5);
	EXPECT_TRUE(now_ms() - t0 < 2000);
	/* the WR behind it is flushed, the QP is in ERR */
	REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(wc.wr_id, 6);
	EXPECT_EQ(ibv_query_qp(p.a, &qa, IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_rnr_infinite_then_recv(void)
{
	struct pair p;
	struct ibv_wc wc;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	/* rnr_retry 7 = forever: the SEND waits for the receive */
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 8, p.amr->lkey, 0, 0, 1) == 0);
	EXPECT_TRUE(cq_stays_empty(p.f.cq, 100));
	REQUIRE(post_recv1(p.b, p.bbuf, 64, p.bmr->lkey, 2) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	}
	pair_close(&p);
	return TEST_RESULT();
}

/* A refused remote access completes with REM_ACCESS_ERR, leaves the
 * target memory untouched and moves both QPs to ERR. */
static int check_refused(uint32_t rkey_delta, int mr_access, int qp_access,
			 enum ibv_wr_opcode op, uint64_t off, uint32_t len,
			 const char *why)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_mr *tmr;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	int fails0 = harness_failed;

	memset(&p, 0, sizeof(p));
	REQUIRE(fx_open(&p.f, 64) == 0);
	p.abuf = calloc(1, 8192);
	p.bbuf = calloc(1, 8192);
	memset(p.abuf, 'A', 8192);
	memset(p.bbuf, 'B', 8192);
	p.amr = ibv_reg_mr(p.f.pd, p.abuf, 8192, ALL_REMOTE);
	tmr = ibv_reg_mr(p.f.pd, p.bbuf, 4096, mr_access);
	p.a = make_qp(&p.f, IBV_QPT_RC, NULL, NULL, NULL);
	p.b = make_qp(&p.f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(p.amr && tmr && p.a && p.b);
	REQUIRE(to_rts(p.a, p.b->qp_num, ALL_REMOTE) == 0);
	REQUIRE(to_rts(p.b, p.a->qp_num, qp_access) == 0);
	REQUIRE(post_send1(p.a, op, p.abuf, len, p.amr->lkey,
			   (uintptr_t)p.bbuf + off, tmr->rkey + rkey_delta, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	/* vendor_err names the check that refused */
	if (!strstr(ursa_vendor_err_str(wc.vendor_err), why))
		harness_fail(__FILE__, __LINE__, "vendor_err", "'%s' lacks '%s'",
			     ursa_vendor_err_str(wc.vendor_err), why);
	for (int i = 0; i < 8192; i++)
		if (p.bbuf[i] != 'B' || p.abuf[i] != 'A') {
			harness_fail(__FILE__, __LINE__, "untouched", "byte %d changed", i);
			break;
		}
	EXPECT_EQ(ibv_query_qp(p.a, &qa, IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
	EXPECT_EQ(ibv_query_qp(p.b, &qa, IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
	ibv_dereg_mr(tmr);
	pair_close(&p);
	return harness_failed != fails0;
}

static int test_remote_access_errors(void)
{
	const int lw = IBV_ACCESS_LOCAL_WRITE;

	/* wrong rkey */
	EXPECT_EQ(check_refused(0x100, ALL_REMOTE, ALL_REMOTE, IBV_WR_RDMA_WRITE, 0, 64,
				"remote: key unknown"), 0);
	/* MR without REMOTE_WRITE / REMOTE_READ */
	EXPECT_EQ(check_refused(0, lw | IBV_ACCESS_REMOTE_READ, ALL_REMOTE, IBV_WR_RDMA_WRITE, 0, 64,
				"access rights of the region"), 0);
	EXPECT_EQ(check_refused(0, lw | IBV_ACCESS_REMOTE_WRITE, ALL_REMOTE, IBV_WR_RDMA_READ, 0, 64,
				"access rights of the region"), 0);
	/* QP access flags without remote write */
	EXPECT_EQ(check_refused(0, ALL_REMOTE, lw | IBV_ACCESS_REMOTE_READ, IBV_WR_RDMA_WRITE, 0, 64,
				"QP access flags"), 0);
	/* past the end of the MR, and a length that wraps */
	EXPECT_EQ(check_refused(0, ALL_REMOTE, ALL_REMOTE, IBV_WR_RDMA_WRITE, 4090, 64,
				"outside the registered region"), 0);
	EXPECT_EQ(check_refused(0, ALL_REMOTE, ALL_REMOTE, IBV_WR_RDMA_WRITE, (uint64_t)-4096, 8192,
				"outside the registered region"), 0);
	return TEST_RESULT();
}

/*
 * Registered memory the application unmaps. A NIC's MR keeps the pages it
 * pinned; ursa's names addresses, so it hears of the unmap (userfaultfd,
 * core/uffd.h) and from then on refuses every access through the MR, with
 * the error that names the cause, even once other memory is mapped at the
 * same address: a peer holding the rkey never reaches it. With
 * URSA_UFFD=0 (as where userfaultfd is refused) the MR follows its
 * addresses: the hole faults inside the engine's guard (util/fault.h) and
 * fails the same way, and memory mapped there anew is what the MR reaches.
 * Either way the process that owns the MR lives on.
 */
static int unmapped_op(enum ibv_wr_opcode op, bool remap, bool watched)
{
	size_t pg = 4096;
	struct ibv_mr *amr, *tmr;
	struct ibv_qp *a, *b;
	struct ibv_wc wc[2];
	struct ursa_mr_info in;
	struct fx f;
	uint64_t *res = aligned_alloc(64, pg);
	char *t = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *hole = t + pg;
	bool follows = remap && !watched;
	int fails0 = harness_failed;

	REQUIRE(res && t != MAP_FAILED && fx_open(&f, 16) == 0);
	memset(res, 'A', pg);
	amr = ibv_reg_mr(f.pd, res, pg, ALL_REMOTE);
	tmr = ibv_reg_mr(f.pd, t, 3 * pg, ALL_REMOTE);
	a = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	b = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(amr && tmr && a && b && connect_pair(a, b, ALL_REMOTE) == 0);
	if (op == IBV_WR_SEND)
		REQUIRE(post_recv1(b, hole + 8, 64, tmr->lkey, 2) == 0);
	REQUIRE(munmap(hole, pg) == 0);
	if (remap) {
		REQUIRE(mmap(hole, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE |
			     MAP_ANONYMOUS | MAP_FIXED, -1, 0) == hole);
		memset(hole, 'N', pg);
	}
	/* the watcher marks the MR just after munmap returns (uffd.h) */
	for (int i = 0; i < 1000; i++) {
		REQUIRE(ursa_mr_info(tmr, &in) == 0);
		if (in.unmapped || !watched)
			break;
		usleep(1000);
	}
	EXPECT_EQ(in.unmapped, watched);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		struct ibv_sge s = { (uintptr_t)res, 8, amr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &s, .num_sge = 1,
					  .opcode = op,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		wr.wr.atomic.remote_addr = (uintptr_t)hole + 8;
		wr.wr.atomic.rkey = tmr->rkey;
		wr.wr.atomic.compare_add = 0x4e4e4e4e4e4e4e4eull;
		wr.wr.atomic.swap = 5;
		REQUIRE(ibv_post_send(a, &wr, &bad) == 0);
	} else {
		REQUIRE(post_send1(a, op, res, 64, amr->lkey,
				   (uintptr_t)hole + 8, tmr->rkey, 1) == 0);
	}
	REQUIRE(wait_wc(f.cq, &wc[0], 3000) == 1);
	if (op == IBV_WR_SEND && wc[0].wr_id == 2) {
		/* the receiver's completion may come first */
		wc[1] = wc[0];
		REQUIRE(wait_wc(f.cq, &wc[0], 3000) == 1);
	} else if (op == IBV_WR_SEND) {
		REQUIRE(wait_wc(f.cq, &wc[1], 3000) == 1);
	}
	if (follows) {
		/* the new page: the access lands there as on any memory */
		EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
		if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_SEND)
			EXPECT_EQ(hole[8 + 63], 'A');
		if (op == IBV_WR_RDMA_READ)
			EXPECT_EQ(((char *)res)[63], 'N');
		if (op == IBV_WR_ATOMIC_CMP_AND_SWP)
			EXPECT_EQ(*(uint64_t *)(void *)(hole + 8), 5);
	} else if (op == IBV_WR_SEND) {
		/* the sender learns of the receiver's failure; the receive
		 * completes with an error that names the hole */
		EXPECT_EQ(wc[0].status, IBV_WC_REM_OP_ERR);
		EXPECT_EQ(wc[1].wr_id, 2);
		EXPECT_TRUE(wc[1].status == IBV_WC_LOC_PROT_ERR ||
			    wc[1].status == IBV_WC_LOC_ACCESS_ERR);
		if (!strstr(ursa_vendor_err_str(wc[1].vendor_err), "no longer mapped"))
			harness_fail(__FILE__, __LINE__, "vendor_err", "'%s'",
				     ursa_vendor_err_str(wc[1].vendor_err));
	} else {
		EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
		if (!strstr(ursa_vendor_err_str(wc[0].vendor_err),
			    "remote: registered memory is no longer mapped"))
			harness_fail(__FILE__, __LINE__, "vendor_err", "'%s'",
				     ursa_vendor_err_str(wc[0].vendor_err));
		/* nothing came back into the requester's buffer */
		EXPECT_EQ(((char *)res)[0], 'A');
	}
	if (remap && !follows)
		for (size_t i = 0; i < pg; i++)
			if (hole[i] != 'N') {
				harness_fail(__FILE__, __LINE__, "new page",
					     "byte %zu changed", i);
				break;
			}
	/* the mapped pages around the hole are as they were */
	EXPECT_EQ(t[0], 0);
	EXPECT_EQ(t[2 * pg], 0);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	EXPECT_EQ(ibv_dereg_mr(tmr), 0);
	EXPECT_EQ(ibv_dereg_mr(amr), 0);
	fx_close(&f);
	munmap(t, 3 * pg);
	free(res);
	return harness_failed != fails0;
}

static int unmapped_all(bool watched)
{
	const enum ibv_wr_opcode ops[] = {
		IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
		IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_SEND,
	};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		EXPECT_EQ(unmapped_op(ops[i], false, watched), 0);
		EXPECT_EQ(unmapped_op(ops[i], true, watched), 0);
	}
	return TEST_RESULT();
}

static int test_unmapped_mr(void)
{
	/* does the kernel give this process a userfaultfd? (then ursa must
	 * have one too) */
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* USER_MODE_ONLY */);

	if (fd < 0) {
		EXPECT_EQ(ursa_unmap_watch(), 0);
		SKIP("userfaultfd refused here (%s): unmaps are not watched",
		     strerror(errno));
	}
	close(fd);
	EXPECT_EQ(ursa_unmap_watch(), 1);
	return unmapped_all(true);
}

/* mremap moves registered pages away: the MR over the old addresses is
 * refused, the pages keep their contents at the new place. */
static int test_mremap_mr(void)
{
	size_t len = 4 * 4096;
	struct ursa_mr_info in = { 0 };
	struct pair p;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	char *t = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (!ursa_unmap_watch())
		SKIP("userfaultfd refused here: unmaps are not watched");
	REQUIRE(t != MAP_FAILED && to != MAP_FAILED);
	memset(t, 'T', len);
	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	mr = ibv_reg_mr(p.f.pd, t, len, ALL_REMOTE);
	REQUIRE(mr);
	REQUIRE(mremap(t, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to) == to);
	for (int i = 0; i < 1000 && !in.unmapped; i++) {
		REQUIRE(ursa_mr_info(mr, &in) == 0);
		if (!in.unmapped)
			usleep(1000);
	}
	EXPECT_EQ(in.unmapped, 1);
	memset(p.abuf, 'W', 64);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 64, p.amr->lkey,
			   (uintptr_t)t, mr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	EXPECT_TRUE(strstr(ursa_vendor_err_str(wc.vendor_err), "no longer mapped") != NULL);
	EXPECT_EQ(to[0], 'T');
	EXPECT_EQ(to[len - 1], 'T');
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	pair_close(&p);
	munmap(to, len);
	return TEST_RESULT();
}

static bool mr_unmapped_within(struct ibv_mr *mr, int ms)
{
	struct ursa_mr_info in = { 0 };

	for (int i = 0; i < ms && !in.unmapped; i++) {
		if (ursa_mr_info(mr, &in))
			return false;
		if (!in.unmapped)
			usleep(1000);
	}
	return in.unmapped;
}

/* Memory mapped anew where an MR's memory was unmapped, and registered
 * again while the old MR still holds its pins: the new MR is watched too
 * (the old pins were marked stale, so the new pages are locked and
 * registered with the watch as on a first pin). */
static int test_remapped_mr_watched(void)
{
	size_t len = 2 * 4096;
	struct fx f;
	struct ibv_mr *a, *b;
	char *t = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (!ursa_unmap_watch())
		SKIP("userfaultfd refused here: unmaps are not watched");
	REQUIRE(t != MAP_FAILED && fx_open(&f, 16) == 0);
	a = ibv_reg_mr(f.pd, t, len, ALL_REMOTE);
	REQUIRE(a);
	REQUIRE(munmap(t, len) == 0);
	REQUIRE(mmap(t, len, PROT_READ | PROT_WRITE, MAP_PRIVATE |
		     MAP_ANONYMOUS | MAP_FIXED, -1, 0) == t);
	EXPECT_TRUE(mr_unmapped_within(a, 1000));
	b = ibv_reg_mr(f.pd, t, len, ALL_REMOTE);
	REQUIRE(b);
	EXPECT_TRUE(!mr_unmapped_within(b, 1));
	REQUIRE(munmap(t, len) == 0);
	EXPECT_TRUE(mr_unmapped_within(b, 1000));
	EXPECT_EQ(ibv_dereg_mr(b), 0);
	EXPECT_EQ(ibv_dereg_mr(a), 0);
	fx_close(&f);
	return TEST_RESULT();
}

static int test_unmapped_mr_unwatched(void)
{
	setenv("URSA_UFFD", "0", 1);
	return unmapped_all(false);
}

static int test_remote_key_other_pd(void)
{
	struct pair p;
	struct ibv_pd *pd2;
	struct ibv_mr *m2;
	struct ibv_wc wc;
	char *buf = calloc(1, 4096);

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	pd2 = ibv_alloc_pd(p.f.ctx);
	m2 = ibv_reg_mr(pd2, buf, 4096, ALL_REMOTE);
	REQUIRE(pd2 && m2);
	/* The rkey is valid but belongs to another PD than the target QP. */
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 64, p.amr->lkey,
			   (uintptr_t)buf, m2->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(buf[0], 0);
	/* EBUSY while the MR holds the PD */
	EXPECT_EQ(ibv_dealloc_pd(pd2), EBUSY);
	ibv_dereg_mr(m2);
	EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
	pair_close(&p);
	free(buf);
	return TEST_RESULT();
}

static int test_local_errors(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_mr *ro;
	char *rbuf = calloc(1, 4096);

	/* bad lkey */
	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 64, p.amr->lkey ^ 0x80,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
	pair_close(&p);

	/* READ into an MR without local write */
	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	ro = ibv_reg_mr(p.f.pd, rbuf, 4096, IBV_ACCESS_REMOTE_READ);
	REQUIRE(ro);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_READ, rbuf, 64, ro->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
	ibv_dereg_mr(ro);
	pair_close(&p);

	/* receive buffer too small: receiver LOC_LEN_ERR, sender
	 * REM_INV_REQ_ERR */
	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	REQUIRE(post_recv1(p.b, p.bbuf, 16, p.bmr->lkey, 9) == 0);
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 64, p.amr->lkey, 0, 0, 8) == 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		if (wc.wr_id == 9)
			EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
		else
			EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
	}
	pair_close(&p);
	free(rbuf);
	return TEST_RESULT();
}

static int test_retry_exceeded_no_peer(void)
{
	struct fx f;
	struct ibv_qp *q;
	char buf[64];
	struct ibv_mr *mr;
	struct ibv_wc wc;
	long long t0, dt;

	REQUIRE(fx_open(&f, 16) == 0);
	mr = ibv_reg_mr(f.pd, buf, sizeof(buf), ALL_REMOTE);
	q = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(mr && q);
	/* No QP 0xabcde exists: every attempt goes unanswered. timeout 10
	 * (4.2 ms) x (1 + retry_cnt 3) ~ 17 ms. */
	REQUIRE(to_rts_ex(q, 0xabcde, ALL_REMOTE, 7, 10, 3, 1) == 0);
	t0 = now_ms();
	REQUIRE(post_send1(q, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey, 0x1000, 0x1234, 1) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 3000) == 1);
	dt = now_ms() - t0;
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
	EXPECT_TRUE(dt >= 12 && dt < 1000);
	ibv_destroy_qp(q);
	ibv_dereg_mr(mr);
	fx_close(&f);
	return TEST_RESULT();
}

/* A connected QP takes requests from its peer only (rxe's check_addr): a
 * third QP that names it as its destination is dropped and counted, its
 * WRITE lands nowhere and ends in RETRY_EXC_ERR, and the pair goes on. */
static int test_not_the_peer(void)
{
	struct ursa_qp_stats st;
	struct ibv_qp *c;
	struct ibv_wc wc;
	struct pair p;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	c = make_qp(&p.f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(c && to_rts_ex(c, p.b->qp_num, ALL_REMOTE, 7, 10, 2, 1) == 0);
	memset(p.abuf, 'x', 64);
	REQUIRE(post_send1(c, IBV_WR_RDMA_WRITE, p.abuf, 64, p.amr->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
	EXPECT_EQ(p.bbuf[0], 0);
	REQUIRE(ursa_qp_stats(p.b, &st) == 0);
	EXPECT_TRUE(st.not_peer >= 1);
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 64, p.amr->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 2) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 3000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(p.bbuf[63], 'x');
	ibv_destroy_qp(c);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_uc_write_and_silent_drop(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;

	REQUIRE(pair_open(&p, IBV_QPT_UC, ALL_REMOTE, 4096) == 0);
	strcpy(p.abuf, "uc write");
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 9, p.amr->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(p.bbuf, "uc write"));
	/* A bad rkey on UC: the responder drops silently, the requester
	 * completes successfully and memory is untouched. */
	strcpy(p.abuf, "nope");
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 5, p.amr->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey ^ 0x100, 2) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(p.bbuf, "uc write"));
	/* UC SEND with no receive posted: dropped, no RNR wait. */
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 5, p.amr->lkey, 0, 0, 3) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(ibv_query_qp(p.b, &qa, IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
	/* READ is not a UC operation */
	EXPECT_EQ(post_send1(p.a, IBV_WR_RDMA_READ, p.abuf, 5, p.amr->lkey,
			     (uintptr_t)p.bbuf, p.bmr->rkey, 4), EINVAL);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_ud_grh_qkey(void)
{
	struct pair p;
	struct ibv_wc wc;
	struct ibv_ah_attr av;
	struct ibv_ah *ah;
	struct ibv_sge s;
	struct ibv_send_wr wr = { 0 }, *bad;
	union ibv_gid gid;
	struct ibv_ah *back;

	REQUIRE(pair_open(&p, IBV_QPT_UD, 0, 8192) == 0);
	fill_av(p.f.ctx, &av);
	ah = ibv_create_ah(p.f.pd, &av);
	REQUIRE(ah);
	REQUIRE(post_recv1(p.b, p.bbuf, 40 + 100, p.bmr->lkey, 1) == 0);
	strcpy(p.abuf, "datagram");
	s = (struct ibv_sge){ (uintptr_t)p.abuf, 9, p.amr->lkey };
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = p.b->qp_num;
	wr.wr.ud.remote_qkey = 0x11111111;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	ibv_query_gid(p.f.ctx, 1, 0, &gid);
	for (int i = 0; i < 2; i++) {
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV) {
			EXPECT_EQ(wc.byte_len, 40 + 9);
			EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
			/* the packet type in sl, as mlx5 reports it: RoCEv2
			 * (bit 3) over IPv4 (2) or IPv6 (1); UCX's ud
			 * transports read it */
			EXPECT_EQ(wc.sl, gid.raw[10] == 0xff ? 0xa : 0x9);
			EXPECT_EQ(wc.slid, 0);
			EXPECT_EQ(wc.pkey_index, 0);
			EXPECT_EQ(wc.src_qp, p.a->qp_num);
			back = ibv_create_ah_from_wc(p.f.pd, &wc,
						     (struct ibv_grh *)p.bbuf, 1);
			EXPECT_TRUE(back != NULL);
			if (back)
				ibv_destroy_ah(back);
		}
	}
	EXPECT_TRUE(!strcmp(p.bbuf + 40, "datagram"));
	/* The GRH carries the sender's address: IPv4 header at offset 20
	 * for an IPv4-mapped GID, IPv6 header otherwise. */
	if (gid.raw[10] == 0xff)
		EXPECT_TRUE(!memcmp(p.bbuf + 20 + 12, gid.raw + 12, 4));
	else
		EXPECT_TRUE(!memcmp(p.bbuf + 8, gid.raw, 16));
	/* Wrong Q_Key: dropped, the receive stays posted. */
	REQUIRE(post_recv1(p.b, p.bbuf, 40 + 100, p.bmr->lkey, 2) == 0);
	wr.wr.ud.remote_qkey = 0x2222;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc.opcode, IBV_WC_SEND);
	EXPECT_TRUE(cq_stays_empty(p.f.cq, 50));
	/* Message larger than the MTU: local length error. */
	s.length = 8000;
	wr.wr.ud.remote_qkey = 0x11111111;
	REQUIRE(ibv_post_send(p.a, &wr, &bad) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
	/* UD without an AH cannot be posted. */
	wr.wr.ud.ah = NULL;
	EXPECT_EQ(ibv_post_send(p.a, &wr, &bad), EINVAL);
	EXPECT_TRUE(bad == &wr);
	ibv_destroy_ah(ah);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_srq_and_limit_event(void)
{
	struct fx f;
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 16, .max_sge = 1, .srq_limit = 0 } };
	struct ibv_srq_attr sa = { .srq_limit = 3 };
	struct ibv_srq *srq;
	struct ibv_qp *a, *b1, *b2, *a2;
	char *buf = calloc(1, 65536);
	struct ibv_mr *mr;
	struct ibv_async_event ev;
	struct ibv_wc wc;
	struct pollfd pfd;

	REQUIRE(fx_open(&f, 128) == 0);
	mr = ibv_reg_mr(f.pd, buf, 65536, ALL_REMOTE);
	srq = ibv_create_srq(f.pd, &sia);
	REQUIRE(mr && srq);
	EXPECT_TRUE(sia.attr.max_wr >= 16);
	a = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	a2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	b1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, srq);
	b2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, srq);
	REQUIRE(a && a2 && b1 && b2);
	REQUIRE(connect_pair(a, b1, ALL_REMOTE) == 0);
	REQUIRE(connect_pair(a2, b2, ALL_REMOTE) == 0);
	/* posting to the QP's own RQ is refused when it uses an SRQ */
	EXPECT_EQ(post_recv1(b1, buf, 64, mr->lkey, 0), EINVAL);
	for (int i = 0; i < 5; i++) {
		struct ibv_sge s = { (uintptr_t)buf + 1024 * (uint64_t)i, 1024, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = (uint64_t)(100 + i), .sg_list = &s, .num_sge = 1 }, *rb;

		REQUIRE(ibv_post_srq_recv(srq, &rw, &rb) == 0);
	}
	REQUIRE(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0);
	/* Two QPs share the SRQ's receives. */
	REQUIRE(post_send1(a, IBV_WR_SEND, buf + 32768, 10, mr->lkey, 0, 0, 1) == 0);
	REQUIRE(post_send1(a2, IBV_WR_SEND, buf + 32768, 10, mr->lkey, 0, 0, 2) == 0);
	REQUIRE(post_send1(a, IBV_WR_SEND, buf + 32768, 10, mr->lkey, 0, 0, 3) == 0);
	int recvs = 0;

	for (int i = 0; i < 6; i++) {
		REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV) {
			recvs++;
			EXPECT_TRUE(wc.qp_num == b1->qp_num || wc.qp_num == b2->qp_num);
		}
	}
	EXPECT_EQ(recvs, 3);
	/* 2 left < limit 3: the limit event fired, once */
	pfd.fd = f.ctx->async_fd;
	pfd.events = POLLIN;
	EXPECT_EQ(poll(&pfd, 1, 1000), 1);
	REQUIRE(ibv_get_async_event(f.ctx, &ev) == 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
	EXPECT_TRUE(ev.element.srq == srq);
	ibv_ack_async_event(&ev);
	EXPECT_EQ(ibv_query_srq(srq, &sa), 0);
	EXPECT_EQ(sa.srq_limit, 0);
	EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
	ibv_destroy_qp(a);
	ibv_destroy_qp(a2);
	ibv_destroy_qp(b1);
	ibv_destroy_qp(b2);
	EXPECT_EQ(ibv_destroy_srq(srq), 0);
	ibv_dereg_mr(mr);
	fx_close(&f);
	free(buf);
	return TEST_RESULT();
}

static int test_wr_api(void)
{
	struct fx f;
	struct ibv_qp_init_attr_ex ia = { 0 };
	struct ibv_qp *qp, *t, *plain;
	struct ibv_qp_ex *qx;
	char *a = calloc(1, 4096), *b = calloc(1, 4096);
	uint64_t *res = (uint64_t *)(a + 1024), *ctr = (uint64_t *)(b + 1024);
	struct ibv_mr *ma, *mb;
	struct ibv_wc wc;

	REQUIRE(fx_open(&f, 64) == 0);
	ma = ibv_reg_mr(f.pd, a, 4096, ALL_REMOTE);
	mb = ibv_reg_mr(f.pd, b, 4096, ALL_REMOTE);
	ia.qp_type = IBV_QPT_RC;
	ia.send_cq = ia.recv_cq = f.cq;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 4;
	ia.cap.max_inline_data = 64;
	ia.pd = f.pd;
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
			    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	qp = ibv_create_qp_ex(f.ctx, &ia);
	t = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(qp && t && ma && mb);
	plain = t;
	EXPECT_TRUE(ibv_qp_to_qp_ex(plain) == NULL);
	qx = ibv_qp_to_qp_ex(qp);
	REQUIRE(qx);
	REQUIRE(connect_pair(qp, t, ALL_REMOTE) == 0);
	*ctr = 40;
	strcpy(a, "via wr api");
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)a, 11);
	qx->wr_id = 2;
	ibv_wr_atomic_fetch_add(qx, mb->rkey, (uintptr_t)ctr, 2);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)res, 8);
	qx->wr_id = 3;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)b + 100);
	ibv_wr_set_inline_data(qx, "inl", 4);
	EXPECT_EQ(ibv_wr_complete(qx), 0);
	for (int i = 1; i <= 3; i++) {
		REQUIRE(wait_wc(f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc.wr_id, (uint64_t)i);
	}
	EXPECT_TRUE(!strcmp(b, "via wr api"));
	EXPECT_TRUE(!strcmp(b + 100, "inl"));
	EXPECT_EQ(*res, 40);
	EXPECT_EQ(*ctr, 42);
	/* READ was not in send_ops_flags: the batch is refused whole. */
	ibv_wr_start(qx);
	qx->wr_id = 4;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)a, 4);
	ibv_wr_rdma_read(qx, mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)a, 4);
	EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
	EXPECT_TRUE(cq_stays_empty(f.cq, 50));
	/* abort discards */
	ibv_wr_start(qx);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)a, 4);
	ibv_wr_abort(qx);
	EXPECT_TRUE(cq_stays_empty(f.cq, 50));
	ibv_destroy_qp(qp);
	ibv_destroy_qp(t);
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	fx_close(&f);
	free(a);
	free(b);
	return TEST_RESULT();
}

/* The last byte of a WRITE becomes visible last: a reader spinning on it
 * (as perftest's latency test does) sees the whole message. */
struct spin_arg {
	volatile char *buf;
	size_t len;
	int rounds, torn;
	int checked;	/* rounds the spinner has finished looking at */
};

static void *spinner(void *v)
{
	struct spin_arg *s = v;

	for (int r = 1; r <= s->rounds; r++) {
		while (s->buf[s->len - 1] != (char)r)
			;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		for (size_t i = 0; i < s->len; i++)
			if (s->buf[i] != (char)r) {
				s->torn++;
				break;
			}
		__atomic_store_n(&s->checked, r, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int test_last_byte_last(void)
{
	struct pair p;
	struct ibv_wc wc;
	pthread_t th;
	struct spin_arg sa;
	const int rounds = 100;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 1 << 16) == 0);
	sa = (struct spin_arg){ p.bbuf, 1 << 16, rounds, 0, 0 };
	pthread_create(&th, NULL, spinner, &sa);
	for (int r = 1; r <= rounds; r++) {
		/* the next WRITE may start only after the reader looked */
		while (__atomic_load_n(&sa.checked, __ATOMIC_ACQUIRE) != r - 1)
			usleep(10);
		memset(p.abuf, r, 1 << 16);
		REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 1 << 16,
				   p.amr->lkey, (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
		REQUIRE(wait_wc(p.f.cq, &wc, 2000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	}
	pthread_join(th, NULL);
	EXPECT_EQ(sa.torn, 0);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_flush_on_error_state(void)
{
	struct pair p;
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
	struct ibv_wc wc;
	int flushed = 0;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	for (int i = 0; i < 3; i++)
		REQUIRE(post_recv1(p.b, p.bbuf, 64, p.bmr->lkey, (uint64_t)(10 + i)) == 0);
	REQUIRE(ibv_modify_qp(p.b, &qa, IBV_QP_STATE) == 0);
	while (wait_wc(p.f.cq, &wc, 200) == 1) {
		EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
		EXPECT_EQ(wc.qp_num, p.b->qp_num);
		flushed++;
	}
	EXPECT_EQ(flushed, 3);
	/* receives posted in ERR are flushed at once */
	REQUIRE(post_recv1(p.b, p.bbuf, 64, p.bmr->lkey, 20) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 1000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(wc.wr_id, 20);
	/* sends too, signaled or not */
	REQUIRE(ibv_modify_qp(p.a, &qa, IBV_QP_STATE) == 0);
	REQUIRE(post_send1(p.a, IBV_WR_SEND, p.abuf, 8, p.amr->lkey, 0, 0, 30) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 1000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(wc.wr_id, 30);
	pair_close(&p);
	return TEST_RESULT();
}

static int test_sqd_holds_work(void)
{
	struct pair p;
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
	struct ibv_async_event ev;
	struct ibv_wc wc;

	REQUIRE(pair_open(&p, IBV_QPT_RC, ALL_REMOTE, 4096) == 0);
	REQUIRE(ibv_modify_qp(p.a, &qa, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
	REQUIRE(ibv_get_async_event(p.f.ctx, &ev) == 0);
	EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
	ibv_ack_async_event(&ev);
	strcpy(p.abuf, "held");
	REQUIRE(post_send1(p.a, IBV_WR_RDMA_WRITE, p.abuf, 5, p.amr->lkey,
			   (uintptr_t)p.bbuf, p.bmr->rkey, 1) == 0);
	EXPECT_TRUE(cq_stays_empty(p.f.cq, 50));
	EXPECT_EQ(p.bbuf[0], 0);
	qa.qp_state = IBV_QPS_RTS;
	REQUIRE(ibv_modify_qp(p.a, &qa, IBV_QP_STATE) == 0);
	REQUIRE(wait_wc(p.f.cq, &wc, 1000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(!strcmp(p.bbuf, "held"));
	pair_close(&p);
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(send_recv, "SEND/RECV completions and data"),
	TEST_ENTRY(send_imm_sge_list_inline, "immediate, gather/scatter, inline"),
	TEST_ENTRY(write_read, "RDMA WRITE and READ, 1 MiB"),
	TEST_ENTRY(write_imm, "WRITE with immediate consumes a receive (also one with no SGE)"),
	TEST_ENTRY(atomics, "fetch-and-add and compare-and-swap"),
	TEST_ENTRY(atomics_concurrent_contexts, "atomics from 4 contexts sum exactly"),
	TEST_ENTRY(two_contexts, "QPs of two contexts"),
	TEST_ENTRY(unsignaled_and_sq_sig_all, "unsignaled WRs free their slots"),
	TEST_ENTRY(rnr_retry_exceeded, "no receive: RNR retries then error"),
	TEST_ENTRY(rnr_infinite_then_recv, "rnr_retry 7 waits for the receive"),
	TEST_ENTRY(remote_access_errors, "refused accesses never touch memory"),
	TEST_ENTRY(remote_key_other_pd, "rkey of another PD is refused"),
	TEST_ENTRY(unmapped_mr, "registered memory unmapped: the MR refuses, the owner lives"),
	TEST_ENTRY(remapped_mr_watched, "memory mapped anew under an old MR: a new MR there is watched"),
	TEST_ENTRY(mremap_mr, "registered pages moved by mremap: the old MR refuses"),
	TEST_ENTRY(unmapped_mr_unwatched, "URSA_UFFD=0: the MR follows its addresses, a hole faults safely"),
	TEST_ENTRY(local_errors, "LOC_PROT_ERR and LOC_LEN_ERR"),
	TEST_ENTRY(retry_exceeded_no_peer, "unanswered requests: RETRY_EXC_ERR"),
	TEST_ENTRY(not_the_peer, "a QP that is not the connected peer is dropped and counted"),
	TEST_ENTRY(uc_write_and_silent_drop, "UC semantics"),
	TEST_ENTRY(ud_grh_qkey, "UD: GRH, Q_Key, MTU"),
	TEST_ENTRY(srq_and_limit_event, "SRQ shared by two QPs, limit event"),
	TEST_ENTRY(wr_api, "ibv_wr_* post API"),
	TEST_ENTRY(last_byte_last, "spinning reader never sees a torn WRITE"),
	TEST_ENTRY(flush_on_error_state, "ERR flushes receives and sends"),
	TEST_ENTRY(sqd_holds_work, "SQD holds new work until RTS"),
};

int main(int argc, char **argv)
{
	return harness_main(tests, (int)(sizeof(tests) / sizeof(tests[0])), argc, argv);
}
