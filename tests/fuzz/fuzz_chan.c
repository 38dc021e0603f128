// SPDX-License-Identifier: MIT
/*
 * fuzz_chan.c - fuzz target for the same-host channel as a hostile process
 * speaks it: the hello on a QP's socket (its bytes, how many descriptors
 * come with it, whether the channel memfd is sealed or large enough,
 * whether the control page is sealed, whose QPN it claims), then requests
 * written straight into the channel's ring (their bytes, the ring's tail
 * moved anywhere) for the target's engine to serve (transport/shm.c,
 * serve_hello and ursa_shm_serve; the responder in engine/resp.c).
 *
 * The first input bytes steer, and fix fields up so that the fuzzer gets
 * past the first checks (the magic, a claimed QPN the process owns, the
 * next sequence number, an rkey and address inside the MR); without the
 * fix-ups the same bytes exercise the refusals. The "hostile process" is
 * this process itself (the kernel's credentials then match, which is what
 * lets a welcome happen); cross-memory attach is off (URSA_CMA=0), since a
 * requester's addresses are its own and here they would be the target's.
 *
 * Invariants after every input: no crash or sanitizer report, and the
 * memory around the target's MR untouched (guard canaries).
 *
 * Built as a libFuzzer target by `make fuzz`; otherwise main() replays the
 * committed corpus (tests/fuzz/corpus/chan) in `make test`.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "../../src/core/core.h"
#include "../../src/transport/shm.h"
#include "replay.h"


#define MRLEN 65536
#define GUARD 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_qp *qps[4];	/* RC target, its RC peer, UD, UC */
static uint8_t *area, *buf;
static unsigned long welcomed, served;

static int to_rts(struct ibv_qp *qp, uint32_t dqpn)
{
	union ibv_gid me;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE,
		.qkey = 0x11111111 };
	bool ud = qp->qp_type == IBV_QPT_UD, rc = qp->qp_type == IBV_QPT_RC;

	ibv_query_gid(ctx, 1, 0, &me);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = me;
	if (ibv_modify_qp(qp, &a, ud ? IBV_QP_STATE : IBV_QP_STATE | IBV_QP_AV |
			  IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0)))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
			     (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0));
}

static void setup(void)
{
	static const enum ibv_qp_type t[4] = { IBV_QPT_RC, IBV_QPT_RC, IBV_QPT_UD,
					       IBV_QPT_UC };
	struct ibv_device **l;

	if (ctx)
		return;
	setenv("URSA_CMA", "0", 1);
	setenv("URSA_UDP_PORT", "47912", 0);
	l = ibv_get_device_list(NULL);
	ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
	area = mmap(NULL, MRLEN + 2 * GUARD, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!ctx || !pd || !cq || area == MAP_FAILED)
		abort();
	memset(area, 0xa5, MRLEN + 2 * GUARD);
	buf = area + GUARD;
	mr = ibv_reg_mr(pd, buf, MRLEN, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC);
	for (int i = 0; i < 4; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq,
			.qp_type = t[i],
			.cap = { .max_send_wr = 16, .max_recv_wr = 256,
				 .max_send_sge = 1, .max_recv_sge = 1 } };

		qps[i] = ibv_create_qp(pd, &ia);
		if (!qps[i])
			abort();
	}
	if (!mr || to_rts(qps[0], qps[1]->qp_num) || to_rts(qps[1], qps[0]->qp_num) ||
	    to_rts(qps[2], 0) || to_rts(qps[3], qps[1]->qp_num))
		abort();
	/* receives for SENDs the fuzzer makes */
	for (int q = 0; q < 4; q++)
		for (int i = 0; i < 64; i++) {
			struct ibv_sge sg = { (uintptr_t)buf + (MRLEN / 2), 1024, mr->lkey };
			struct ibv_recv_wr w = { .sg_list = &sg, .num_sge = 1 }, *b;

			ibv_post_recv(qps[q], &w, &b);
		}
}

static int connect_qp(uint32_t qpn)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "ursa/qp/%06x",
			 qpn & 0xffffff);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (s >= 0 && connect(s, (struct sockaddr *)&sa,
			      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n))) {
		close(s);
		s = -1;
	}
	return s;
}

static int memfd(size_t size, int seals)
{
	int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)size))
		abort();
	if (seals)
		fcntl(fd, F_ADD_SEALS, seals);
	return fd;
}

static bool wait_in(int s, int ms)
{
	struct pollfd p = { s, POLLIN, 0 };

	return poll(&p, 1, ms) == 1;
}

/* Requests written into the ring: the input's bytes over each slot's
 * header (and a little inline data), fixed up when asked. */
static void fill_ring(struct ursa_chanmem *m, const uint8_t *d, size_t n,
		      unsigned nreq, bool fix, uint32_t target, int which)
{
	size_t hdr = offsetof(struct ursa_wreq, sg);

	for (unsigned i = 0; i < nreq && i < URSA_SHM_SLOTS; i++) {
		struct ursa_wreq *q = &m->req[i];
		size_t k = MIN(n, hdr + 64);

		memset(q, 0, offsetof(struct ursa_wreq, data) + 64);
		memcpy(q, d, k);
		if (n > k)
			memcpy(q->data, d + k, MIN(n - k, (size_t)64));
		d += MIN(n, k + 64);
		n -= MIN(n, k + 64);
		if (!fix)
			continue;
		static const uint32_t ops[] = { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
			IBV_WR_SEND, IBV_WR_ATOMIC_FETCH_AND_ADD,
			IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_RDMA_WRITE_WITH_IMM,
			IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_INV };
		q->seq = i;
		q->opcode = ops[q->opcode % 8];
		q->dst_qpn = target;
		q->src_qpn = qps[1]->qp_num;
		q->qkey = which == 2 ? 0x11111111 : q->qkey;
		q->rkey = (q->rkey & 1) ? q->rkey : mr->rkey;
		q->raddr = (uintptr_t)buf + (q->raddr % MRLEN);
		if (q->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		    q->opcode == IBV_WR_ATOMIC_CMP_AND_SWP)
			q->raddr &= ~7ull;
		q->msg_len %= 2 * 65536;
		q->len = MIN(q->len % 8192, (uint64_t)URSA_SHM_INLINE);
		q->offset %= q->msg_len + 1;
		q->inline_len %= 65;
		q->nsg = 0;
		q->flags &= ~(uint32_t)WF_CMA;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ursa_shm_hello h;
	struct ursa_shm_welcome wl = { 0 };
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov;
	struct msghdr mh = { 0 };
	struct cmsghdr *cm;
	struct ursa_chanmem *m = NULL;
	int fds[4], nfds, s, which, rfds[4], nr = 0;
	size_t csize;
	uint8_t st, cnt;
	ssize_t n;

	setup();
	if (size < 4 + sizeof(h))
		return 0;
	st = data[0];
	which = st & 3;
	if (which == 1)
		which = 0;	/* (the peer takes no hello of its own here) */
	cnt = data[1];
	memcpy(&h, data + 4, sizeof(h));
	if (!(st & 4)) {	/* a well-formed hello */
		h.magic = URSA_SHM_MAGIC;
		h.version = URSA_SHM_VERSION;
		h.qp_type = qps[which]->qp_type;
		h.dst_qpn = qps[which]->qp_num;
		if (!(st & 8))
			h.src_qpn = qps[1]->qp_num;	/* a QPN we own */
	}
	s = connect_qp(qps[which]->qp_num);
	if (s < 0)
		return 0;
	csize = (st & 32) ? 4096 : sizeof(struct ursa_chanmem);
	fds[0] = memfd(csize, (st & 16) ? 0 : F_SEAL_SHRINK | F_SEAL_GROW);
	fds[1] = memfd(4096, (st & 64) ? 0 : F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE);
	fds[2] = eventfd(0, EFD_CLOEXEC);
	fds[3] = memfd(4096, 0);
	nfds = (cnt & 0x80) ? cnt & 3 : 3;
	m = mmap(NULL, csize, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (m == MAP_FAILED)
		abort();
	if (csize >= sizeof(struct ursa_chanmem)) {
		m->magic = (st & 4) && (cnt & 0x40) ? 0 : URSA_SHM_MAGIC;
		m->version = URSA_SHM_VERSION;
	}
	iov.iov_base = &h;
	iov.iov_len = (st & 4) ? MIN(sizeof(h), (size_t)(cnt & 0x3f)) : sizeof(h);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (nfds) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	sendmsg(s, &mh, MSG_NOSIGNAL);
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	/* the welcome, or the connection closed */
	if (wait_in(s, 200)) {
		char rb[CMSG_SPACE(4 * sizeof(int))];
		struct msghdr rm = { 0 };

		iov.iov_base = &wl;
		iov.iov_len = sizeof(wl);
		rm.msg_iov = &iov;
		rm.msg_iovlen = 1;
		rm.msg_control = rb;
		rm.msg_controllen = sizeof(rb);
		n = recvmsg(s, &rm, MSG_CMSG_CLOEXEC);
		for (cm = CMSG_FIRSTHDR(&rm); n > 0 && cm; cm = CMSG_NXTHDR(&rm, cm))
			for (int i = 0; i < (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int)) &&
			     nr < 4; i++)
				rfds[nr++] = ((int *)CMSG_DATA(cm))[i];
		if (n == (ssize_t)sizeof(wl) && wl.status == 0 && nr >= 2 &&
		    csize >= sizeof(struct ursa_chanmem)) {
			unsigned nreq = data[2] % (URSA_SHM_SLOTS + 1);
			uint64_t one = 1;
			uint32_t tail = nreq + ((data[3] & 0x80) ? data[3] : 0);

			welcomed++;
			fill_ring(m, data + 4 + sizeof(h), size - 4 - sizeof(h), nreq,
				  st & 128, qps[which]->qp_num, which);
			atomic_store_explicit(&m->req_tail, tail, memory_order_release);
			if (write(rfds[1], &one, sizeof(one)) < 0)
				(void)0;
			/* until the engine has taken them, or gave up on the ring */
			for (int i = 0; i < 200; i++) {
				uint32_t hd = atomic_load_explicit(&m->req_head,
								   memory_order_acquire);

				if (hd == tail || wait_in(s, 0))
					break;
				usleep(100);
			}
			served += atomic_load(&m->req_head);
		}
		for (int i = 0; i < nr; i++)
			close(rfds[i]);
	}
	close(s);
	munmap(m, csize);
	/* completions the fuzzer's SENDs made, and the receives back */
	{
		struct ibv_wc wc[64];

		while (ibv_poll_cq(cq, 64, wc) > 0)
			;
	}
	for (int i = 0; i < GUARD; i++)
		if (area[i] != 0xa5 || area[GUARD + MRLEN + i] != 0xa5)
			abort();	/* written outside the MR */
	for (int q = 0; q < 4; q++) {
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;

		if (!ibv_query_qp(qps[q], &a, IBV_QP_STATE, &ia) &&
		    a.qp_state == IBV_QPS_ERR) {
			/* an input moved it to ERR: bring it back */
			a.qp_state = IBV_QPS_RESET;
			ibv_modify_qp(qps[q], &a, IBV_QP_STATE);
			to_rts(qps[q], q == 2 ? 0 : q == 1 ? qps[0]->qp_num :
							   qps[1]->qp_num);
		}
	}
	return 0;
}

#ifndef URSA_LIBFUZZER
int main(int argc, char **argv)
{
	int n = fuzz_replay(argc, argv);

	printf("%s channel corpus replay: %d inputs, %lu welcomed, %lu requests taken\n",
	       n && welcomed ? "ok  " : "FAIL", n, welcomed, served);
	printf("%d passed, %d failed, 0 skipped\n", n && welcomed ? 1 : 0,
	       n && welcomed ? 0 : 1);
	return n && welcomed ? 0 : 1;
}
#endif
