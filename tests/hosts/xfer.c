// SPDX-License-Identifier: MIT
/*
 * xfer.c - a cross-host transfer checker, run as two processes on two
 * "hosts" (network namespaces) by tests/scripts/hosts.sh.
 *
 *   xfer server PORT
 *   xfer client SERVER_IP PORT MIB [--cut-check|--acks|--bad-middle|
 *                                    --bad-middle-atomic]
 *
 * The two exchange (QPN, GID, address, rkey) over TCP, connect an RC QP
 * pair, and the client then moves MIB MiB of pseudo-random data three ways:
 * RDMA WRITE into the server's memory, RDMA READ back, and SEND into
 * receives the server posts. Every byte is checked with a checksum
 * computed independently on each side. It prints one "ok" line per
 * operation and exits 0 only if all data arrived exactly once, in order,
 * byte for byte. Each keeps DEPTH requests outstanding (WRITEs and READs
 * in pieces of 1 KiB to 1 MiB), so that RC messages follow each other
 * before their answers (engine/rc_qp.c, pipelining) through every loss.
 * Completions must come in posting order. Then ATOMICS fetch-and-adds
 * and compare-and-swaps on one word of the server, with 8-byte READs of
 * it among them, 16 outstanding (max_rd_atomic): each atomic must return
 * the word as every operation posted before it left it, and none after
 * (the responder executes in PSN order, a resent atomic is answered from
 * its saved result, never applied twice); a READ at least that.
 *
 * XFER_QP_TIMEOUT and XFER_RETRY_CNT set the QP's ACK timeout and retry
 * count (default 14 and 7; issue 23's tighter QPs use 10 and 3).
 *
 * --cut-check: after connecting, wait for the link to be cut (the script
 * removes the route), then post a WRITE and report the completion status
 * and how long it took (RETRY_EXC_ERR is expected).
 *
 * --bad-middle: 12 WRITEs of 4 KiB posted at once, the 6th with a wrong
 * rkey: the 5 before it complete successfully, it with REM_ACCESS_ERR
 * (the responder's NAK reaches a message sent behind others, rc_qp.c
 * pipelining), the 6 after it with WR_FLUSH_ERR, all in order; the first
 * 5 WRITEs' bytes are in the server's buffer.
 *
 * --bad-middle-atomic: the same with 12 fetch-and-adds on 12 zero words:
 * the 5 before the refused one return 0.
 *
 * --unmapped / --hole: the server unmaps page 6 of its registered buffer
 * (and, with --unmapped, maps new memory full of 'N' there); a WRITE into
 * it must fail with REM_ACCESS_ERR, the new page must stay untouched, and
 * the server must live on (it answers the next command). Run with the server's URSA_UFFD=0, --hole exercises the
 * responder's fault guard instead of the watch (design.md, "Memory
 * unmapped under an MR").
 *
 * --acks: the delayed ACK (engine/rc_ack.c rc_ack_later):
 * - PINGS one-way WRITEs, each awaited: the server, which never sends a
 *   request, holds only a few ACKs (the backoff), not one per WRITE;
 * - a SEND ping-pong of PINGS rounds: the client's ACKs of the server's
 *   answers must mostly leave with its next SEND, few alone (the server's
 *   backoff runs out meanwhile); each answer, which the server sends
 *   before its held ACK, must complete after the SEND it answers;
 * - the server receives one more SEND and exits at once, without
 *   destroying its QP: the client's SEND must still complete successfully
 *   (the held ACK leaves at exit; without that, retries exhaust).
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ursa/ursa.h>

#define CHUNK (1u << 20)
#define PINGS 200
#define DEPTH 24
#define ATOMICS 3000

struct info {
	uint32_t qpn, rkey;
	uint64_t addr, len;
	union ibv_gid gid;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t fnv(const uint8_t *p, size_t n, uint64_t h)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static void xio(int fd, void *p, size_t n, int out)
{
	size_t d = 0;

	while (d < n) {
		ssize_t r = out ? write(fd, (char *)p + d, n - d) :
				  read(fd, (char *)p + d, n - d);

		if (r <= 0) {
			fprintf(stderr, "xfer: control connection lost\n");
			exit(3);
		}
		d += (size_t)r;
	}
}

struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	size_t len;
	int gid_index;
};

static void die(const char *what)
{
	fprintf(stderr, "xfer: %s failed\n", what);
	exit(2);
}

static void ep_open(struct ep *e, size_t len, const char *ip)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_qp_init_attr ia = { 0 };
	struct ibv_port_attr pa;
	uint8_t want[16] = { [10] = 0xff, [11] = 0xff };

	memset(e, 0, sizeof(*e));
	if (!l || !l[0] || !(e->ctx = ibv_open_device(l[0])))
		die("open device");
	ibv_free_device_list(l);
	/* the GID of our address on this host (IPv4 or IPv6) */
	if (inet_pton(AF_INET6, ip, want) != 1 &&
	    inet_pton(AF_INET, ip, want + 12) != 1)
		die("parsing our address");
	ibv_query_port(e->ctx, 1, &pa);
	e->gid_index = -1;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid g;

		if (!ibv_query_gid(e->ctx, 1, i, &g) && !memcmp(g.raw, want, 16))
			e->gid_index = i;
	}
	if (e->gid_index < 0)
		die("finding the GID of our address");
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = ibv_create_cq(e->ctx, 1024, NULL, NULL, 0);
	e->len = len;
	e->buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!e->pd || !e->cq || e->buf == MAP_FAILED)
		die("resources");
	memset(e->buf, 0, len);
	e->mr = ibv_reg_mr(e->pd, e->buf, len, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC);
	ia.send_cq = ia.recv_cq = e->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 512;
	ia.cap.max_send_sge = 4;
	ia.cap.max_recv_sge = 1;
	e->qp = ibv_create_qp(e->pd, &ia);
	if (!e->mr || !e->qp)
		die("MR/QP");
}

static void ep_connect(struct ep *e, const struct info *peer, int timeout,
		       int retry)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };

	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0xfffff0;	/* start near the 24-bit wrap on purpose */
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)e->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0xfffff0;
	/* XFER_QP_TIMEOUT, XFER_RETRY_CNT: the QP's ACK timeout and retry
	 * count instead (a tighter QP than the default) */
	if (getenv("XFER_QP_TIMEOUT"))
		timeout = atoi(getenv("XFER_QP_TIMEOUT"));
	if (getenv("XFER_RETRY_CNT"))
		retry = atoi(getenv("XFER_RETRY_CNT"));
	a.timeout = (uint8_t)timeout;
	a.retry_cnt = (uint8_t)retry;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static void info_of(struct ep *e, struct info *x)
{
	x->qpn = e->qp->qp_num;
	x->rkey = e->mr->rkey;
	x->addr = (uintptr_t)e->buf;
	x->len = e->len;
	ibv_query_gid(e->ctx, 1, e->gid_index, &x->gid);
}

static struct ibv_wc wait1(struct ep *e)
{
	struct ibv_wc wc;
	double t0 = now_s();

	while (ibv_poll_cq(e->cq, 1, &wc) == 0)
		if (now_s() - t0 > 120)
			die("waiting for a completion (120 s)");
	return wc;
}

/* A WRITE or SEND of 2 KiB or more gathers its bytes from pieces of odd
 * sizes (1001, 7, the rest; from 16 KiB on 1001, 7, 9000, the rest): the
 * first packet takes parts of three, and a MIDDLE packet (the sender's
 * short way, send_mid) parts of two, which the sender copies and
 * checksums piece by piece. */
static void post(struct ep *e, enum ibv_wr_opcode op, uint64_t off,
		 uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t id)
{
	uintptr_t a = (uintptr_t)e->buf + off;
	struct ibv_sge s[4] = { { a, len, e->mr->lkey } };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = s, .num_sge = 1,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	if (op != IBV_WR_RDMA_READ && len >= 2048) {
		s[0].length = 1001;
		s[1] = (struct ibv_sge){ a + 1001, 7, e->mr->lkey };
		s[2] = (struct ibv_sge){ a + 1008, len - 1008, e->mr->lkey };
		wr.num_sge = 3;
		if (len >= 16384) {
			s[2].length = 9000;
			s[3] = (struct ibv_sge){ a + 10008, len - 10008,
						 e->mr->lkey };
			wr.num_sge = 4;
		}
	}

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(e->qp, &wr, &bad))
		die("post_send");
}

/* ATOMICS operations on the word at raddr, 16 outstanding: every 8th a
 * compare-and-swap that expects the word's value then, every 5th an
 * 8-byte READ, the rest fetch-and-adds of 3. Results land in res[i]. */
static int atomics(struct ep *e, uint64_t res_off, uint64_t raddr,
		   uint32_t rkey)
{
	uint64_t *res = (uint64_t *)(e->buf + res_off), base, v;
	uint64_t posted = 0, done = 0;
	struct ibv_wc wc;
	int bad = 0;

	post(e, IBV_WR_RDMA_READ, res_off, 8, raddr, rkey, 0);
	if (wait1(e).status)
		die("reading the word");
	base = v = res[0];
	while (done < ATOMICS) {
		while (posted < ATOMICS && posted - done < 16) {
			uint64_t i = posted;
			struct ibv_sge sg = { (uintptr_t)&res[i], 8, e->mr->lkey };
			struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sg,
				.num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *b;

			res[i] = 0xdeadbeefdeadbeefull;
			if (i % 5 == 4) {
				wr.opcode = IBV_WR_RDMA_READ;
				wr.wr.rdma.remote_addr = raddr;
				wr.wr.rdma.rkey = rkey;
			} else {
				wr.opcode = i % 8 == 7 ? IBV_WR_ATOMIC_CMP_AND_SWP :
							 IBV_WR_ATOMIC_FETCH_AND_ADD;
				wr.wr.atomic.remote_addr = raddr;
				wr.wr.atomic.rkey = rkey;
				wr.wr.atomic.compare_add = i % 8 == 7 ? v : 3;
				wr.wr.atomic.swap = v + 3;
				v += 3;
			}
			if (ibv_post_send(e->qp, &wr, &b))
				die("post atomic");
			posted++;
		}
		wc = wait1(e);
		if (wc.status || wc.wr_id != done) {
			printf("FAIL atomic: completion %" PRIu64 ": %s, wr_id %" PRIu64 "\n",
			       done, ibv_wc_status_str(wc.status), (uint64_t)wc.wr_id);
			return 1;
		}
		done++;
	}
	/* What each saw: an atomic, the word after every earlier operation
	 * (asked again, it is answered from the saved result); a READ at
	 * least that, but a lost READ is executed again (IBTA 9.7.5.1.3)
	 * and may see the atomics posted after it too. */
	v = base;
	for (uint64_t i = 0; i < ATOMICS; i++) {
		bool rd = i % 5 == 4;

		if ((rd ? res[i] < v || res[i] > base + 3 * ATOMICS : res[i] != v) &&
		    !bad++)
			printf("FAIL atomic: operation %" PRIu64 " (%s) saw %" PRIu64
			       ", not %" PRIu64 "\n", i, rd ? "READ" : "atomic",
			       res[i] - base, v - base);
		if (!rd)
			v += 3;
	}
	post(e, IBV_WR_RDMA_READ, res_off, 8, raddr, rkey, 0);
	if (wait1(e).status)
		die("reading the word");
	if (res[0] != v && !bad++)
		printf("FAIL atomic: the word is base + %" PRIu64 ", not + %" PRIu64 "\n",
		       res[0] - base, v - base);
	return bad;
}

/* Post op over [0, len) in pieces (WRITE and READ: sizes cycling from
 * 1 KiB to 1 MiB; SEND: CHUNK, as the server's receives), DEPTH
 * outstanding; every completion must succeed, in order. A READ lands in
 * the second half of our buffer. */
/* Posts len bytes as messages of varied sizes; *nmsg (if not NULL): how
 * many. */
static int stream(struct ep *e, enum ibv_wr_opcode op, size_t len,
		  const struct info *peer, uint64_t *nmsg)
{
	static const uint32_t sizes[] = { 1024, 65536, 4096, CHUNK, 3072, 262144 };
	uint64_t posted = 0, done = 0;
	size_t off = 0;

	while (done < posted || off < len) {
		struct ibv_wc wc;

		while (off < len && posted - done < DEPTH) {
			uint32_t n = op == IBV_WR_SEND ? CHUNK :
				     sizes[posted % (sizeof(sizes) / sizeof(sizes[0]))];

			n = (uint32_t)(n < len - off ? n : len - off);
			post(e, op, op == IBV_WR_RDMA_READ ? len + off : off, n,
			     op == IBV_WR_SEND ? 0 : peer->addr + off,
			     peer->rkey, posted++);
			off += n;
		}
		wc = wait1(e);
		if (wc.status || wc.wr_id != done) {
			printf("FAIL %s: completion %" PRIu64 " of %" PRIu64
			       ": %s, wr_id %" PRIu64 "\n",
			       op == IBV_WR_SEND ? "send" :
			       op == IBV_WR_RDMA_READ ? "read" : "write", done, posted,
			       ibv_wc_status_str(wc.status), (uint64_t)wc.wr_id);
			return 1;
		}
		done++;
	}
	if (nmsg)
		*nmsg = posted;
	return 0;
}

static void post_recv_at(struct ep *e, uint64_t off, uint32_t len, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)e->buf + off, len, e->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *b;

	if (ibv_post_recv(e->qp, &w, &b))
		die("post_recv");
}

static int server(int port)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
	int ls = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0, c;
	struct info me, peer;
	struct ep e;
	uint64_t cmd, sum;
	char myip[64];
	struct sockaddr_in6 la;
	socklen_t ll = sizeof(la);

	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1))
		die("listen");
	c = accept(ls, NULL, NULL);
	if (c < 0)
		die("accept");
	getsockname(c, (struct sockaddr *)&la, &ll);
	inet_ntop(AF_INET6, &la.sin6_addr, myip, sizeof(myip));
	xio(c, &peer, sizeof(peer), 0);
	ep_open(&e, peer.len, myip);
	info_of(&e, &me);
	xio(c, &me, sizeof(me), 1);
	ep_connect(&e, &peer, 14, 7);
	xio(c, &cmd, sizeof(cmd), 1);	/* ready */
	/* commands: 1 = checksum my buffer, 2 = receive N MiB by SEND,
	 * 3 = answer PINGS SENDs, 4 = report held ACKs, 5 = receive one
	 * SEND and exit at once, 6 = checksum the first 5 pages, 7 = report
	 * the WRITEs my QP executed (ursa_qp_stats), 8 = unmap page 6 and
	 * map new memory of 'N' there, 10 = the first word of page 6,
	 * 11 = unmap page 6 */
	while (read(c, &cmd, sizeof(cmd)) == sizeof(cmd)) {
		if (cmd == 8 || cmd == 11) {
			uint8_t *pg = e.buf + 6 * 4096;

			sum = (uint64_t)munmap(pg, 4096);
			if (cmd == 8 && mmap(pg, 4096, PROT_READ | PROT_WRITE,
					     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
					     -1, 0) == pg)
				memset(pg, 'N', 4096);
			xio(c, &sum, sizeof(sum), 1);
		} else if (cmd == 10) {
			memcpy(&sum, e.buf + 6 * 4096, 8);
			xio(c, &sum, sizeof(sum), 1);
		} else if (cmd == 3 || cmd == 5) {
			int n = cmd == 3 ? PINGS : 1;

			for (int i = 0; i < n; i++)
				post_recv_at(&e, 0, 64, 0);
			sum = 0;
			xio(c, &sum, sizeof(sum), 1); /* receives posted */
			for (int i = 0; i < n; i++) {
				struct ibv_wc wc = wait1(&e);

				if (wc.status || wc.opcode != IBV_WC_RECV)
					die("ping receive");
				if (cmd == 5)
					exit(0);	/* no ibv_destroy_qp */
				post(&e, IBV_WR_SEND, 64, 64, 0, 0, (uint64_t)i);
				if (wait1(&e).status)
					die("ping answer");
			}
		} else if (cmd == 4) {
			struct ursa_udp_stats st;
			uint64_t r[2] = { 0, 0 };

			if (!ursa_udp_stats(&st)) {
				r[0] = st.acks_held;
				r[1] = st.acks_alone;
			}
			xio(c, r, sizeof(r), 1);
		} else if (cmd == 7) {
			struct ursa_qp_stats qs;
			uint64_t w = UINT64_MAX;

			if (!ursa_qp_stats(e.qp, &qs))
				w = qs.writes;
			xio(c, &w, sizeof(w), 1);
		} else if (cmd == 1) {
			sum = fnv(e.buf, e.len, 1469598103934665603ull);
			xio(c, &sum, sizeof(sum), 1);
		} else if (cmd == 6) {	/* --bad-middle: the first 5 pages */
			sum = fnv(e.buf, 5 * 4096, 1469598103934665603ull);
			xio(c, &sum, sizeof(sum), 1);
		} else if (cmd == 2) {
			uint64_t n = e.len / CHUNK, got = 0;
			/* XFER_RECV_AHEAD: receives posted ahead (400);
			 * XFER_RECV_DELAY_US: each posted that long after a
			 * completion. Few and late, SENDs meet RNR NAKs. */
			const char *ra = getenv("XFER_RECV_AHEAD");
			const char *rd = getenv("XFER_RECV_DELAY_US");
			uint64_t ahead = ra ? strtoull(ra, NULL, 0) : 400;
			unsigned delay = rd ? (unsigned)atoi(rd) : 0;

			memset(e.buf, 0, e.len);
			for (uint64_t i = 0; i < n && i < ahead; i++)
				post_recv_at(&e, i * CHUNK, CHUNK, i);
			sum = 0;
			xio(c, &sum, sizeof(sum), 1); /* receives posted */
			for (uint64_t i = 0; i < n; i++) {
				struct ibv_wc wc = wait1(&e);

				if (wc.status || wc.opcode != IBV_WC_RECV || wc.byte_len != CHUNK ||
				    wc.wr_id != i) {
					fprintf(stderr, "xfer: receive %" PRIu64 ": %s, %u bytes, wr_id %" PRIu64 "\n",
						i, ibv_wc_status_str(wc.status), wc.byte_len, wc.wr_id);
					break;
				}
				got++;
				if (delay)
					usleep(delay);
				if (i + ahead < n)
					post_recv_at(&e, (i + ahead) * CHUNK, CHUNK, i + ahead);
			}
			sum = got == n ? fnv(e.buf, e.len, 1469598103934665603ull) : 0;
			xio(c, &sum, sizeof(sum), 1);
		} else {
			break;
		}
	}
	return 0;
}

static void print_counters(void)
{
	struct ursa_udp_stats st;

	if (ursa_udp_stats(&st) == 0)
		printf("counters: tx %" PRIu64 " rx %" PRIu64 " packets, retransmits %" PRIu64
		       ", NAKs sent %" PRIu64 " received %" PRIu64 ", drops: ICRC %" PRIu64
		       " PSN %" PRIu64 " duplicate %" PRIu64 ", injected: lost %" PRIu64
		       " duplicated %" PRIu64 " reordered %" PRIu64 " corrupted %" PRIu64
		       ", forwarded %" PRIu64 " (dropped %" PRIu64 "), GSO runs sent %" PRIu64
		       " received whole %" PRIu64 ", packets with an IPv4 ID %" PRIu64
		       ", CNPs received %" PRIu64 " window cuts %" PRIu64
		       ", held out of order %" PRIu64 ", SACKs received %" PRIu64
		       ", resent alone %" PRIu64 ", losses cutting the window %"
		       PRIu64 " keeping it %" PRIu64 "\n",
		       st.tx_pkts, st.rx_pkts, st.retransmits, st.naks_sent,
		       st.naks_rcvd, st.drop_icrc, st.drop_psn, st.dup,
		       st.fault_lost, st.fault_dup, st.fault_reorder, st.fault_corrupt,
		       st.forwarded, st.drop_fwd, st.tx_gso, st.rx_gro, st.rx_ipid,
		       st.cnp_rcvd, st.cnp_cuts, st.ooo_held, st.sacks_rcvd,
		       st.sr_resent, st.loss_cuts, st.loss_kept);
}

/* The delayed ACK, three ways (see the top of the file). */
static int acks_check(struct ep *e, int s, const struct info *peer)
{
	struct ursa_udp_stats st;
	uint64_t cmd, r[2], r0[2], along;
	struct ibv_wc wc;
	int bad = 0, misordered = 0;

	for (int i = 0; i < PINGS; i++) {
		post(e, IBV_WR_RDMA_WRITE, 0, 4096, peer->addr, peer->rkey, 1);
		if (wait1(e).status)
			die("one-way WRITE");
	}
	cmd = 4;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, r, sizeof(r), 0);
	/* One ACK held alone, then 1, 3, 7 ... sent at once: about log2
	 * (8). A duplicate's ACK, which goes at once and takes the held one
	 * along, starts the backoff over: on a loaded host the client's RTO
	 * (1 ms) sometimes fires while the server holds an ACK (500 us here)
	 * and waits for a core, which once made 14. Not holding: 200. */
	printf("%s one way: %d WRITEs, the server held %" PRIu64 " ACKs, %"
	       PRIu64 " sent alone\n", r[1] >= 1 && r[1] <= 24 ? "ok" : "FAIL",
	       PINGS, r[0], r[1]);
	bad |= !(r[1] >= 1 && r[1] <= 24);
	memcpy(r0, r, sizeof(r0));

	cmd = 3;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, r, sizeof(r[0]), 0);	/* the server's receives are posted */
	for (int i = 0; i < PINGS; i++) {
		int got = 0;

		post_recv_at(e, 64, 64, 0);
		post(e, IBV_WR_SEND, 0, 64, 0, 0, (uint64_t)i);
		while (got < 2) {	/* our SEND, then the answer */
			wc = wait1(e);
			if (wc.status)
				die("ping");
			if (wc.opcode != (got ? IBV_WC_RECV : IBV_WC_SEND))
				misordered++;
			got++;
		}
	}
	if (ursa_udp_stats(&st))
		die("ursa_udp_stats");
	/* (the last ACK is still held: nothing follows it yet) An ACK goes
	 * alone when this thread waits for a core longer than the ACK delay
	 * (50 us) before its next SEND: under a CPU hog up to 46 of 144 (a
	 * quarter was the bound before, and failed there 2 times in 30);
	 * without holding, all of them. */
	printf("%s ping-pong: %d rounds, %" PRIu64 " ACKs held, %" PRIu64
	       " of them sent alone\n",
	       st.acks_held >= PINGS / 2 && st.acks_alone * 2 < st.acks_held ?
	       "ok" : "FAIL", PINGS, st.acks_held, st.acks_alone);
	bad |= !(st.acks_held >= PINGS / 2 && st.acks_alone * 2 < st.acks_held);
	/* The server sends its held ACK after its answer; we hold the answer
	 * until the ACK has completed our SEND. When the server answers late
	 * (a loaded machine: its thread waited for a core longer than the
	 * ACK delay), its ACK leaves alone at its due time, first, and there
	 * is nothing to hold: so some answer must have been held only if
	 * some ACKs went along with answers (the last one is still held). */
	cmd = 4;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, r, sizeof(r), 0);
	along = (r[0] - r0[0]) - (r[1] - r0[1]);
	printf("%s ping-pong: %d answers before the send completion they "
	       "answer, %" PRIu64 " answers held for their ACK (the server "
	       "sent %" PRIu64 " ACKs along with an answer)\n",
	       !misordered && (st.reqs_held || along <= 1) ? "ok" : "FAIL",
	       misordered, st.reqs_held, along);
	bad |= misordered || (!st.reqs_held && along > 1);

	cmd = 5;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, r, sizeof(r[0]), 0);
	post(e, IBV_WR_SEND, 0, 64, 0, 0, 7);
	wc = wait1(e);
	printf("%s SEND to a server that exits without destroying its QP: %s\n",
	       wc.status ? "FAIL" : "ok", ibv_wc_status_str(wc.status));
	bad |= wc.status != IBV_WC_SUCCESS;
	return bad;
}

/* --bad-middle (see the top of the file) */
static int bad_middle(struct ep *e, int s, const struct info *peer,
		      uint64_t *cmd, bool atomic)
{
	const int n = 12, bad_at = 5;
	uint64_t sum, *res = (uint64_t *)e->buf;
	int bad = 0;

	for (int i = 0; i < n; i++) {
		uint32_t rkey = i == bad_at ? peer->rkey ^ 0x5a5a00 : peer->rkey;

		if (atomic) {	/* fetch-and-add 1 on word i (zero) */
			struct ibv_sge sg = { (uintptr_t)&res[i], 8, e->mr->lkey };
			struct ibv_send_wr wr = { .wr_id = (uint64_t)i,
				.sg_list = &sg, .num_sge = 1,
				.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				.send_flags = IBV_SEND_SIGNALED }, *b;

			res[i] = 77;
			wr.wr.atomic.remote_addr = peer->addr + (uint64_t)i * 8;
			wr.wr.atomic.rkey = rkey;
			wr.wr.atomic.compare_add = 1;
			if (ibv_post_send(e->qp, &wr, &b))
				die("post atomic");
		} else {
			post(e, IBV_WR_RDMA_WRITE, (uint64_t)i * 4096, 4096,
			     peer->addr + (uint64_t)i * 4096, rkey, (uint64_t)i);
		}
	}
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc = wait1(e);
		enum ibv_wc_status want = i < bad_at ? IBV_WC_SUCCESS :
					  i == bad_at ? IBV_WC_REM_ACCESS_ERR :
							IBV_WC_WR_FLUSH_ERR;

		if (wc.wr_id != (uint64_t)i || wc.status != want) {
			printf("FAIL completion %d: wr_id %" PRIu64 " %s, want %s\n",
			       i, (uint64_t)wc.wr_id, ibv_wc_status_str(wc.status),
			       ibv_wc_status_str(want));
			bad = 1;
		}
	}
	if (atomic) {
		/* the good ones saw their words' first value */
		for (int i = 0; i < bad_at; i++)
			if (res[i]) {
				printf("FAIL atomic %d returned %" PRIu64 "\n", i, res[i]);
				bad = 1;
			}
	} else {
		/* the server checksums the part the good WRITEs covered */
		*cmd = 6;
		xio(s, cmd, sizeof(*cmd), 1);
		xio(s, &sum, sizeof(sum), 0);
		if (sum != fnv(e->buf, (size_t)bad_at * 4096, 1469598103934665603ull)) {
			printf("FAIL the good WRITEs' bytes\n");
			bad = 1;
		}
	}
	printf("%s %s before, at and after a refused one, pipelined\n",
	       bad ? "FAIL" : "ok", atomic ? "atomics" : "WRITEs");
	*cmd = 9;
	xio(s, cmd, sizeof(*cmd), 1);
	return bad;
}

/* --unmapped, --hole (see the top of the file) */
static int unmapped(struct ep *e, int s, const struct info *peer,
		    uint64_t *cmd, bool remap)
{
	struct ibv_wc wc;
	uint64_t r;
	int bad = 0;

	*cmd = remap ? 8 : 11;
	xio(s, cmd, sizeof(*cmd), 1);
	xio(s, &r, sizeof(r), 0);
	if (r)
		die("the server's munmap");
	usleep(20000);	/* (the server's watcher marks its MR just after) */
	post(e, IBV_WR_RDMA_WRITE, 0, 4096, peer->addr + 6 * 4096, peer->rkey, 1);
	wc = wait1(e);
	/* (a RoCEv2 NAK carries no reason: the requester cannot name it) */
	if (wc.status != IBV_WC_REM_ACCESS_ERR) {
		printf("FAIL WRITE into unmapped memory: %s (%s)\n",
		       ibv_wc_status_str(wc.status), ursa_vendor_err_str(wc.vendor_err));
		bad = 1;
	}
	/* the server lives, and a new page there kept its bytes */
	*cmd = remap ? 10 : 6;
	xio(s, cmd, sizeof(*cmd), 1);
	xio(s, &r, sizeof(r), 0);
	if (remap && r != 0x4e4e4e4e4e4e4e4eull) {
		printf("FAIL the page mapped anew was written\n");
		bad = 1;
	}
	printf("%s WRITE into the server's unmapped memory%s: %s, server alive\n",
	       bad ? "FAIL" : "ok", remap ? " (mapped anew)" : "",
	       ibv_wc_status_str(wc.status));
	*cmd = 9;
	xio(s, cmd, sizeof(*cmd), 1);
	return bad;
}

static int client(const char *host, int port, size_t mib, int cut_check,
		  int acks, int badm, int bada, int unm)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
	int s = socket(AF_INET6, SOCK_STREAM, 0), bad = 0;
	struct info me, peer;
	struct ep e;
	uint64_t cmd, want, got, nmsg = 0, seed = 0x1234567;
	size_t len = mib << 20;
	uint8_t *copy;
	struct sockaddr_in6 la;
	socklen_t ll = sizeof(la);
	char myip[64], h6[80];
	double t0;

	/* IPv4 addresses as ::ffff:a.b.c.d on a dual-stack socket */
	snprintf(h6, sizeof(h6), strchr(host, ':') ? "%s" : "::ffff:%s", host);
	if (inet_pton(AF_INET6, h6, &sa.sin6_addr) != 1)
		die("parsing the server address");
	for (int i = 0; connect(s, (struct sockaddr *)&sa, sizeof(sa)); i++) {
		if (i > 100)
			die("connect");
		usleep(50000);
		close(s);
		s = socket(AF_INET6, SOCK_STREAM, 0);
	}
	getsockname(s, (struct sockaddr *)&la, &ll);
	inet_ntop(AF_INET6, &la.sin6_addr, myip, sizeof(myip));
	ep_open(&e, 2 * len, myip);
	info_of(&e, &me);
	me.len = len;
	xio(s, &me, sizeof(me), 1);
	xio(s, &peer, sizeof(peer), 0);
	ep_connect(&e, &peer, cut_check ? 10 : 14, cut_check ? 3 : 7);
	xio(s, &cmd, sizeof(cmd), 0);
	for (size_t i = 0; i < len; i += 8) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		memcpy(e.buf + i, &seed, 8);
	}
	want = fnv(e.buf, len, 1469598103934665603ull);

	if (acks)
		return acks_check(&e, s, &peer);
	if (badm || bada)
		return bad_middle(&e, s, &peer, &cmd, bada);
	if (unm)
		return unmapped(&e, s, &peer, &cmd, unm == 2);
	if (cut_check) {
		struct ibv_wc wc;

		post(&e, IBV_WR_RDMA_WRITE, 0, 4096, peer.addr, peer.rkey, 1);
		wc = wait1(&e);
		printf("before cut: %s\n", ibv_wc_status_str(wc.status));
		fflush(stdout);
		/* the script cuts the link when it sees the line above */
		sleep(2);
		t0 = now_s();
		post(&e, IBV_WR_RDMA_WRITE, 0, 4096, peer.addr, peer.rkey, 2);
		wc = wait1(&e);
		printf("after cut: %s (%d) in %.3f s\n", ibv_wc_status_str(wc.status),
		       wc.status, now_s() - t0);
		print_counters();
		return wc.status == IBV_WC_RETRY_EXC_ERR ? 0 : 1;
	}

	/* 1. WRITE everything */
	t0 = now_s();
	if (stream(&e, IBV_WR_RDMA_WRITE, len, &peer, &nmsg))
		return 1;
	cmd = 1;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, &got, sizeof(got), 0);
	printf("%s write %zu MiB: %.1f MB/s\n", got == want ? "ok" : "FAIL", mib,
	       len / (now_s() - t0) / 1e6);
	bad |= got != want;
	/* the target counts each WRITE once, whatever its packets and
	 * their retransmissions */
	cmd = 7;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, &got, sizeof(got), 0);
	printf("%s write messages the target counted: %" PRIu64 " of %" PRIu64 "\n",
	       got == nmsg ? "ok" : "FAIL", got, nmsg);
	bad |= got != nmsg;
	/* 2. READ it back into the second half */
	t0 = now_s();
	if (stream(&e, IBV_WR_RDMA_READ, len, &peer, NULL))
		return 1;
	copy = e.buf + len;
	got = fnv(copy, len, 1469598103934665603ull);
	printf("%s read %zu MiB: %.1f MB/s\n", got == want ? "ok" : "FAIL", mib,
	       len / (now_s() - t0) / 1e6);
	if (got != want) {
		/* where: the first and last byte that differ */
		size_t a = 0, z = len;

		while (a < len && copy[a] == e.buf[a])
			a++;
		while (z > a && copy[z - 1] == e.buf[z - 1])
			z--;
		printf("FAIL read: bytes %zu to %zu differ\n", a, z - 1);
	}
	bad |= got != want;
	/* 3. SEND it into posted receives */
	cmd = 2;
	xio(s, &cmd, sizeof(cmd), 1);
	xio(s, &got, sizeof(got), 0);
	t0 = now_s();
	if (stream(&e, IBV_WR_SEND, len, &peer, NULL))
		return 1;
	xio(s, &got, sizeof(got), 0);
	printf("%s send %zu MiB: %.1f MB/s\n", got == want ? "ok" : "FAIL", mib,
	       len / (now_s() - t0) / 1e6);
	bad |= got != want;
	/* 4. atomics and READs of one word, pipelined */
	t0 = now_s();
	if (atomics(&e, len, peer.addr, peer.rkey))
		return 1;
	printf("ok atomic %d operations: %.0f a second\n", ATOMICS,
	       ATOMICS / (now_s() - t0));
	print_counters();
	cmd = 9;
	xio(s, &cmd, sizeof(cmd), 1);
	return bad;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]));
	if (argc >= 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0),
			      argc > 5 && !strcmp(argv[5], "--cut-check"),
			      argc > 5 && !strcmp(argv[5], "--acks"),
			      argc > 5 && !strcmp(argv[5], "--bad-middle"),
			      argc > 5 && !strcmp(argv[5], "--bad-middle-atomic"),
			      argc <= 5 ? 0 : !strcmp(argv[5], "--unmapped") ? 2 :
			      !strcmp(argv[5], "--hole"));
	fprintf(stderr, "usage: xfer server PORT | xfer client IP PORT MIB "
		"[--cut-check|--acks|--bad-middle|--bad-middle-atomic]\n");
	return 2;
}
