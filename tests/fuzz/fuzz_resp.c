// SPDX-License-Identifier: MIT
/*
 * fuzz_resp.c - fuzz target for the RoCEv2 receive path and the responder:
 * packets from the input go through everything a datagram from the
 * network goes through (ICRC, parsing, QP lookup, source and state checks,
 * PSN checks, duplicates, then the responder executing SEND, WRITE, READ,
 * atomics against real QPs and a real registered MR).
 *
 * The first input byte steers: which QP (RC, UC, UD, or an RC requester)
 * the packet is aimed at, and which fields the harness fixes up so the
 * fuzzer reaches deep code rather than stopping at the first check
 * (destination QPN, expected PSN, a valid rkey and address inside the MR,
 * a correct ICRC). Without the fix-ups the same bytes exercise the
 * refusals. The requester keeps a pipeline of READs, atomics and a WRITE
 * outstanding towards a peer that never answers, so that responses the
 * fuzzer makes (READ responses, ATOMIC ACKNOWLEDGEs, ACKs and NAKs, at or
 * near the PSN it waits for) reach the requester's side: the peer
 * controls those too.
 *
 * Invariants after every input: no crash or sanitizer report, memory
 * around the MR is untouched (guard pages' canaries intact), and so is
 * the requester's memory outside what its READs and atomics asked for. QPs that an
 * input moved to ERR are brought back.
 *
 * Built as a libFuzzer target by `make fuzz`; otherwise main() replays the
 * committed corpus (tests/fuzz/corpus/resp) in `make test`.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "../../src/core/core.h"
#include "../../src/engine/engine.h"
#include "../../src/proto/roce.h"
#include "../../src/transport/udp.h"
#include "replay.h"


#define MRLEN 65536
#define RLEN (5 * 4096)	/* the requester's local buffers */
#define GUARD 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq, *rcq;	/* rcq: the requester's */
static struct ibv_mr *mr, *rmr;	/* rmr: the requester's, local only */
static struct ibv_qp *qps[4];		/* RC, UC, UD, the RC requester */
static int outstanding;			/* the requester's WRs */
static uint8_t *area, *buf, *rarea;
static union ibv_gid me;
/* The requester's peer: an address of this host that is not one of
 * ursa's GIDs, so that its packets take RoCEv2 (and die on the loopback,
 * at our own port, for a QPN that does not exist). */
static union ibv_gid far = { .raw = { [10] = 0xff, [11] = 0xff,
				      [12] = 127, [15] = 2 } };

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE,
		.qkey = 0x11111111 };
	bool ud = qp->qp_type == IBV_QPT_UD;

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x123456;	/* a peer that does not exist */
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = qp == qps[3] ? far : me; /* answers: ourselves */
	if (ibv_modify_qp(qp, &a, ud ? IBV_QP_STATE : IBV_QP_STATE | IBV_QP_AV |
			  IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  (qp->qp_type == IBV_QPT_RC ?
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0)))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
			     (qp->qp_type == IBV_QPT_RC ? IBV_QP_TIMEOUT |
			      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			      IBV_QP_MAX_QP_RD_ATOMIC : 0));
}

static void setup(void)
{
	struct ibv_device **l;
	enum ibv_qp_type t[3] = { IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD };

	if (ctx)
		return;
	/* Do not take a real RoCEv2 port: answers go to a private one. */
	setenv("URSA_UDP_PORT", "47911", 0);
	l = ibv_get_device_list(NULL);
	ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	ibv_query_gid(ctx, 1, 0, &me);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
	area = mmap(NULL, MRLEN + 2 * GUARD, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(area, 0xa5, MRLEN + 2 * GUARD);
	buf = area + GUARD;
	mr = ibv_reg_mr(pd, buf, MRLEN, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	for (int i = 0; i < 4; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = i == 3 ? rcq : cq,
			.recv_cq = cq, .qp_type = t[i % 3],
			.cap = { .max_send_wr = 16, .max_recv_wr = 64,
				 .max_send_sge = 1, .max_recv_sge = 1 } };

		qps[i] = ibv_create_qp(pd, &ia);
		if (!qps[i] || to_rts(qps[i]))
			abort();
	}
	rarea = mmap(NULL, RLEN + 2 * GUARD, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(rarea, 0xa5, RLEN + 2 * GUARD);
	rmr = ibv_reg_mr(pd, rarea + GUARD, RLEN, IBV_ACCESS_LOCAL_WRITE);
	if (!mr || !rmr)
		abort();
}

/* The requester's pipeline: READs of 3 KiB and 8 B, a fetch-and-add, a
 * compare-and-swap, a WRITE, their local buffers in a region of their own
 * (no remote access) at 4 KiB steps. */
static void requester_post(void)
{
	static const enum ibv_wr_opcode ops[] = {
		IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
		IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_RDMA_WRITE,
	};

	for (unsigned i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		bool at = ops[i] != IBV_WR_RDMA_READ && ops[i] != IBV_WR_RDMA_WRITE;
		struct ibv_sge sg = { (uintptr_t)rarea + GUARD + 4096 * i,
				      at ? 8 : i == 0 ? 3072 : 8, rmr->lkey };
		struct ibv_send_wr wr = { .sg_list = &sg, .num_sge = 1,
			.opcode = ops[i], .send_flags = IBV_SEND_SIGNALED }, *b;

		if (at) {
			wr.wr.atomic.remote_addr = 0x10000;
			wr.wr.atomic.rkey = 0x77;
			wr.wr.atomic.compare_add = 1;
		} else {
			wr.wr.rdma.remote_addr = 0x10000;
			wr.wr.rdma.rkey = 0x77;
		}
		if (!ibv_post_send(qps[3], &wr, &b))
			outstanding++;
	}
}

static bool untouched(const uint8_t *p, size_t n)
{
	static uint8_t pattern[MRLEN];

	if (!pattern[0])
		memset(pattern, 0xa5, sizeof(pattern));
	return n <= sizeof(pattern) && !memcmp(p, pattern, n);
}

static void keep_going(void)
{
	struct ibv_wc wc[64];
	int n;

	while (ibv_poll_cq(cq, 64, wc) > 0)
		;
	while ((n = ibv_poll_cq(rcq, 64, wc)) > 0)
		outstanding -= n;
	for (int i = 0; i < 4; i++) {
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;

		ibv_query_qp(qps[i], &a, IBV_QP_STATE, &ia);
		if (a.qp_state != IBV_QPS_RTS) {
			struct ibv_qp_attr r = { .qp_state = IBV_QPS_RESET };

			ibv_modify_qp(qps[i], &r, IBV_QP_STATE);
			if (to_rts(qps[i]))
				abort();
			if (i == 3) {	/* (reset flushed them, uncompleted) */
				while (ibv_poll_cq(rcq, 64, wc) > 0)
					;
				outstanding = 0;
			}
		}
		if (i == 3) {
			if (!outstanding)
				requester_post();
			continue;
		}
		/* a few receives, small and large */
		for (int k = 0; k < 4; k++) {
			struct ibv_sge s = { (uintptr_t)buf + 1024 * (uint64_t)k,
					     (uint32_t)(k == 0 ? 16 : 4096), mr->lkey };
			struct ibv_recv_wr w = { .sg_list = &s, .num_sge = 1 }, *b;

			ibv_post_recv(qps[i], &w, &b);
		}
	}
	while (ibv_poll_cq(cq, 64, wc) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t pkt[4200], ip[40], udp[8];
	uint8_t mode;
	struct ibv_qp *qp;
	size_t len;

	setup();
	if (size < 2 || size > sizeof(pkt))
		return 0;
	mode = data[0];
	len = size - 1;
	memcpy(pkt, data + 1, len);
	qp = qps[mode & 3];
	if (len >= ROCE_BTH_LEN) {
		uint32_t f = roce_opcode_flags(pkt[0]);

		if (mode & 0x04) {		/* aim at the QP */
			uint32_t q = qp->qp_num;

			pkt[5] = (uint8_t)(q >> 16);
			pkt[6] = (uint8_t)(q >> 8);
			pkt[7] = (uint8_t)q;
		}
		if (mode & 0x08) {		/* the PSN it expects */
			/* (the requester: a response for its oldest
			 * unanswered packet or one of the next seven) */
			uint32_t e = qp == qps[3] ?
				(ursa_rc_unanswered_psn(to_uqp(qp)) + (pkt[11] & 7)) &
					0xffffff :
				ursa_rc_epsn(to_uqp(qp));

			pkt[9] = (uint8_t)(e >> 16);
			pkt[10] = (uint8_t)(e >> 8);
			pkt[11] = (uint8_t)e;
		}
		if ((mode & 0x10) && (f & (H_RETH | H_ATMETH)) &&
		    len >= (size_t)(ROCE_BTH_LEN + 12 + ((f & H_DETH) ? 8 : 0))) {
			/* a real rkey and an address inside the MR */
			uint8_t *h = pkt + ROCE_BTH_LEN + ((f & H_DETH) ? 8 : 0);
			uint64_t va = (uintptr_t)buf + ((uint64_t)h[6] << 8 | h[7]) % MRLEN;

			va &= ~7ull;
			for (int i = 0; i < 8; i++)
				h[i] = (uint8_t)(va >> (56 - 8 * i));
			h[8] = (uint8_t)(mr->rkey >> 24);
			h[9] = (uint8_t)(mr->rkey >> 16);
			h[10] = (uint8_t)(mr->rkey >> 8);
			h[11] = (uint8_t)mr->rkey;
		}
	}
	if ((mode & 0x20) && len >= ROCE_BTH_LEN + 4) {	/* a correct ICRC */
		size_t hl = 0;
		union ibv_gid src = qp == qps[3] ? far : me;

		/* the headers the receive path will rebuild */
		memset(ip, 0, sizeof(ip));
		if (src.raw[10] == 0xff) {
			uint16_t tot = (uint16_t)(28 + len);

			ip[0] = 0x45; ip[2] = (uint8_t)(tot >> 8); ip[3] = (uint8_t)tot;
			ip[6] = 0x40; ip[9] = 17;
			memcpy(ip + 12, src.raw + 12, 4);
			memcpy(ip + 16, me.raw + 12, 4);
			hl = 20;
		} else {
			ip[0] = 0x60; ip[4] = (uint8_t)((8 + len) >> 8);
			ip[5] = (uint8_t)(8 + len); ip[6] = 17;
			memcpy(ip + 8, src.raw, 16);
			memcpy(ip + 24, me.raw, 16);
			hl = 40;
		}
		udp[0] = 0xc0; udp[1] = 0x00;
		udp[2] = (uint8_t)(ursa_udp_port() >> 8);
		udp[3] = (uint8_t)ursa_udp_port();
		udp[4] = (uint8_t)((8 + len) >> 8);
		udp[5] = (uint8_t)(8 + len);
		udp[6] = udp[7] = 0;
		roce_icrc_put(pkt + len - 4, roce_icrc(ip, hl, udp, pkt, len - 4));
	}
	ursa_udp_inject(pkt, len, qp == qps[3] ? &far : &me, 0xc000, &me);
	keep_going();
	/* Nothing outside the MR may change, nor anything of the
	 * requester's memory but what its READs and atomics asked for: the
	 * 3 KiB at 0 and 8 bytes at 4, 8 and 12 KiB. (memcmp: a loop over
	 * the bytes, each comparison traced by the fuzzer, took most of its
	 * time.) */
	if (!untouched(area, GUARD) || !untouched(area + GUARD + MRLEN, GUARD) ||
	    !untouched(rarea, GUARD + 0) ||
	    !untouched(rarea + GUARD + 3072, 1024) ||
	    !untouched(rarea + GUARD + 4096 + 8, 4096 - 8) ||
	    !untouched(rarea + GUARD + 8192 + 8, 4096 - 8) ||
	    !untouched(rarea + GUARD + 12288 + 8, RLEN - 12288 - 8 + GUARD))
		abort();
	return 0;
}

#ifndef URSA_LIBFUZZER
static void *dereg_main(void *arg)
{
	return (void *)(intptr_t)ibv_dereg_mr(arg);
}

/*
 * A SEND whose sender is gone after its first packet holds no MR: the
 * receive WQE it took waits for the rest, but deregistering the MR under
 * it returns at once (it once waited for ever: qperf's server child,
 * which deregisters after its client's DREQ). The SEND_FIRST goes in
 * through the harness's fix-ups: UC QP, its QPN, its expected PSN, ICRC.
 */
static uint64_t drops(void)
{
	return ursa_udp_cnt.drop_icrc + ursa_udp_cnt.drop_opcode +
	       ursa_udp_cnt.drop_qpn + ursa_udp_cnt.drop_psn +
	       ursa_udp_cnt.drop_state + ursa_udp_cnt.dup;
}

static bool half_send_frees_mr(void)
{
	uint8_t in[1 + ROCE_BTH_LEN + 1024 + ROCE_ICRC_LEN] = {
		0x01 | 0x04 | 0x08 | 0x20,	/* UC; QPN, PSN, ICRC fixed */
		ROCE_UC | OP_SEND_FIRST, 0, 0xff, 0xff };
	struct ibv_sge sge = { (uintptr_t)buf, 4096, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
	struct ibv_wc wc[64];
	uint64_t before;
	struct timespec until;
	pthread_t t;
	void *r;

	/* an empty receive queue but for this WQE */
	if (ibv_modify_qp(qps[1], &reset, IBV_QP_STATE) || to_rts(qps[1]) ||
	    ibv_post_recv(qps[1], &wr, &bad))
		return false;
	while (ibv_poll_cq(cq, 64, wc) > 0)
		;
	before = drops();
	LLVMFuzzerTestOneInput(in, sizeof(in));
	if (drops() != before ||	/* taken, not dropped */
	    pthread_create(&t, NULL, dereg_main, mr))
		return false;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	if (pthread_timedjoin_np(t, &r, &until))
		return false;	/* still waiting: the MR is held */
	return r == NULL;
}

int main(int argc, char **argv)
{
	int n = fuzz_replay(argc, argv);
	bool half = n && half_send_frees_mr();

	printf("%s responder corpus replay: %d inputs; received %llu, dropped: ICRC %llu, opcode %llu, QPN %llu, PSN %llu, state %llu, duplicate %llu; NAKs sent %llu\n",
	       n ? "ok  " : "FAIL", n,
	       (unsigned long long)ursa_udp_cnt.rx_pkts,
	       (unsigned long long)ursa_udp_cnt.drop_icrc,
	       (unsigned long long)ursa_udp_cnt.drop_opcode,
	       (unsigned long long)ursa_udp_cnt.drop_qpn,
	       (unsigned long long)ursa_udp_cnt.drop_psn,
	       (unsigned long long)ursa_udp_cnt.drop_state,
	       (unsigned long long)ursa_udp_cnt.dup,
	       (unsigned long long)ursa_udp_cnt.naks_sent);
	printf("%s a half-received SEND holds no MR: ibv_dereg_mr returns\n",
	       half ? "ok  " : "FAIL");
	printf("%d passed, %d failed, 0 skipped\n", !!n + half, !n + !half);
	fflush(stdout);
	if (!half)
		_exit(1);	/* (a thread may be stuck in the MR) */
	return n ? 0 : 1;
}
#endif
