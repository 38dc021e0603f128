// SPDX-License-Identifier: MIT
/*
 * ud_sink.c - a UD QP that counts what arrives, for packets another
 * sender made (tests/scripts/hosts.sh: tests/tools/roce_forge.c's "ud",
 * which gives every packet a random IPv4 ID, as rxe does).
 *
 *   ud_sink COUNT SECONDS   prints "qpn 0x..." at once, then waits until
 *                           COUNT messages "rxe-like N" came or SECONDS
 *                           passed; prints "received R of COUNT" and
 *                           exits 0 if all came, each once, intact
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#define SLOT 128		/* GRH (40) + the 64-byte message, rounded */
#define DEPTH 1024	/* more than a test sends: UD drops what finds none */

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int post(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, int i)
{
	struct ibv_sge s = { (uintptr_t)(buf + i * SLOT), SLOT, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = (uint64_t)i, .sg_list = &s,
				 .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &w, &bad);
}

int main(int argc, char **argv)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, DEPTH, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_UD, .send_cq = cq,
		.recv_cq = cq, .cap = { .max_send_wr = 1, .max_recv_wr = DEPTH,
					.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111 };
	static char buf[DEPTH * SLOT];
	static unsigned char seen[1 << 16];
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	long count, got = 0, bad = 0;
	double until;

	if (argc != 3 || !pd || !cq)
		return 2;
	count = atol(argv[1]);
	until = now() + atof(argv[2]);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	qp = mr ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_QKEY))
		return 1;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return 1;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return 1;
	for (int i = 0; i < DEPTH; i++)
		if (post(qp, mr, buf, i))
			return 1;
	printf("qpn 0x%06x\n", qp->qp_num);
	fflush(stdout);
	while (got < count && now() < until) {
		struct ibv_wc wc;
		long k;

		if (ibv_poll_cq(cq, 1, &wc) != 1)
			continue;
		if (wc.status != IBV_WC_SUCCESS ||
		    sscanf(buf + wc.wr_id * SLOT + 40, "rxe-like %ld", &k) != 1 ||
		    k < 0 || k >= (long)sizeof(seen) || seen[k]++)
			bad++;
		else
			got++;
		if (post(qp, mr, buf, (int)wc.wr_id))
			return 1;
	}
	printf("received %ld of %ld (%ld bad)\n", got, count, bad);
	return got == count && !bad ? 0 : 1;
}
