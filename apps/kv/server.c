// SPDX-License-Identifier: MIT
/*
 * server.c - the ursa-kv server: one thread, one epoll loop over the TCP
 * listener, the clients' TCP connections and the completion channel of
 * one CQ shared by every client's queue pair.
 *
 * Each client connects over TCP and may ask for a queue pair in its hello
 * (kv_hello); the TCP connection then carries TCP-path requests and tells
 * the server the client is gone (EOF), so its queue pair is destroyed with
 * it. Verbs-path requests arrive as SENDs into small receive buffers; the
 * server answers every one with an RDMA WRITE with immediate of a
 * kv_vresp header and, for a GET, the value straight out of its block
 * (zero copy). A PUT's value is pulled with an RDMA READ from the client's
 * memory into the new block (zero copy again) before the slot switches.
 *
 * Nothing a client sends is trusted: lengths are bounded before use, a
 * request arriving while the previous one is still being served is
 * refused, and a client whose queue pair fails (a bad key for its value,
 * a client that died) is disconnected without touching the table.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kv_verbs.h"
#include "kv_app.h"

#define NRECV 4			/* receive buffers per client QP */
#define MAXCONN 1024

struct conn {
	int fd, idx;
	struct ibv_qp *qp;
	uint64_t resp_addr, resp_len;
	uint32_t resp_key;
	struct kv_vreq *rbuf;	/* NRECV receive buffers (ctl MR) */
	struct kv_vresp *hdr;	/* the response header (ctl MR) */
	bool pulling;		/* the READ of a PUT's value is outstanding */
	struct kv_vreq pend;	/* the PUT being pulled */
	uint64_t pend_off;
	uint8_t *tbuf;		/* TCP: value buffer (KV_MAX_VAL) */
};

/* wr_id: connection index << 8 | kind << 4 | receive buffer */
enum { WR_RECV = 1, WR_RESP = 2, WR_PULL = 3 };
#define WRID(c, k, i) ((uint64_t)(c)->idx << 8 | (k) << 4 | (i))

static struct {
	struct kv_table t;
	struct kv_ep ep;
	bool have_ep;
	struct ibv_mr *tmr, *cmr;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	uint8_t *ctl;		/* per connection: rbufs + header */
	struct conn *c[MAXCONN];
	int ep_fd, lfd;
	bool poll;		/* busy-poll instead of sleeping */
	struct kv_stats st;
} S;

#define CTL_PER (NRECV * sizeof(struct kv_vreq) + sizeof(struct kv_vresp))

static uint64_t cpu_ns(int who)
{
	struct rusage ru;
	struct timespec ts;

	if (who == RUSAGE_THREAD) {
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
		return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}
	getrusage(who, &ru);
	return ((uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
		(uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)) * 1000;
}

/* Bring up the device side once: the table's MR, the control MR, the CQ. */
static int verbs_up(const struct sockaddr_storage *local)
{
	int ret;

	if (S.have_ep)
		return 0;
	ret = kv_ep_open(&S.ep, local);
	if (ret)
		return ret;
	S.tmr = ibv_reg_mr(S.ep.pd, S.t.base, S.t.len, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_READ);
	S.ctl = calloc(MAXCONN, CTL_PER);
	S.cmr = S.ctl ? ibv_reg_mr(S.ep.pd, S.ctl, MAXCONN * CTL_PER,
				   IBV_ACCESS_LOCAL_WRITE) : NULL;
	S.ch = ibv_create_comp_channel(S.ep.ctx);
	S.cq = S.ch ? ibv_create_cq(S.ep.ctx, 4096, NULL, S.ch, 0) : NULL;
	if (!S.tmr || !S.cmr || !S.cq) {
		fprintf(stderr, "ursa-kv: verbs setup failed: %s\n", strerror(errno));
		return -ENOMEM;
	}
	ibv_req_notify_cq(S.cq, 0);
	{
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = UINT64_MAX };

		epoll_ctl(S.ep_fd, EPOLL_CTL_ADD, S.ch->fd, &ev);
	}
	S.have_ep = true;
	return 0;
}

static void conn_close(struct conn *c)
{
	if (c->qp)
		ibv_destroy_qp(c->qp);	/* flushes what it had posted */
	if (c->pulling)	/* the block never got a slot */
		kv_table_release(&S.t, c->pend_off, c->pend.klen, c->pend.vlen);
	epoll_ctl(S.ep_fd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	S.c[c->idx] = NULL;
	free(c->tbuf);
	free(c);
}

static int post_recv(struct conn *c, int i)
{
	struct ibv_sge s = { (uintptr_t)&c->rbuf[i], sizeof(c->rbuf[i]), S.cmr->lkey };
	struct ibv_recv_wr w = { .wr_id = WRID(c, WR_RECV, i), .sg_list = &s,
				 .num_sge = 1 }, *bad;

	return ibv_post_recv(c->qp, &w, &bad);
}

/* Answer a verbs request: header (+ value) by WRITE with immediate. */
static void vrespond(struct conn *c, int status, uint64_t id,
		     const struct kv_slot *sl)
{
	struct ibv_sge sg[2] = { { (uintptr_t)c->hdr, sizeof(*c->hdr), S.cmr->lkey } };
	struct ibv_send_wr w = { .wr_id = WRID(c, WR_RESP, 0), .sg_list = sg,
				 .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;

	memset(c->hdr, 0, sizeof(*c->hdr));
	c->hdr->status = status;
	c->hdr->id = id;
	if (sl && status == KV_OK) {
		const struct kv_block *b = (const struct kv_block *)(S.t.heap + sl->off);

		if (sizeof(*c->hdr) + (uint64_t)sl->vlen > c->resp_len) {
			c->hdr->status = KV_EINVAL;	/* its buffer is too small */
		} else {
			c->hdr->vlen = sl->vlen;
			c->hdr->sum = b->sum;
			c->hdr->ver = b->ver;
			sg[1].addr = (uintptr_t)kv_table_val(&S.t, sl->off, sl->klen);
			sg[1].length = sl->vlen;
			sg[1].lkey = S.tmr->lkey;
			w.num_sge = sl->vlen ? 2 : 1;
		}
	}
	w.imm_data = htonl((uint32_t)id);
	w.wr.rdma.remote_addr = c->resp_addr;
	w.wr.rdma.rkey = c->resp_key;
	if (ibv_post_send(c->qp, &w, &bad)) {
		conn_close(c);
		return;
	}
}

static bool key_ok(uint32_t klen)
{
	return klen >= 1 && klen <= KV_MAX_KEY;
}

static void on_vreq(struct conn *c, int i, uint32_t len)
{
	struct kv_vreq q;

	memcpy(&q, &c->rbuf[i], sizeof(q));
	if (post_recv(c, i)) {
		conn_close(c);
		return;
	}
	if (c->pulling) {
		/* one request at a time per client: a well-behaved client
		 * waits for the answer to its PUT */
		vrespond(c, KV_EINVAL, q.id, NULL);
		return;
	}
	if (len < offsetof(struct kv_vreq, key) || !key_ok(q.klen) ||
	    len < offsetof(struct kv_vreq, key) + q.klen) {
		vrespond(c, KV_EINVAL, q.id, NULL);
		return;
	}
	switch (q.op) {
	case KV_GET: {
		struct kv_slot *s = kv_table_find(&S.t, q.key, q.klen);

		S.st.gets++;
		vrespond(c, s ? KV_OK : KV_NOTFOUND, q.id, s);
		return;
	}
	case KV_DEL:
		S.st.dels++;
		vrespond(c, kv_table_del(&S.t, q.key, q.klen), q.id, NULL);
		return;
	case KV_PUT: {
		int64_t off;
		struct ibv_sge s;
		struct ibv_send_wr w = { .wr_id = WRID(c, WR_PULL, 0), .sg_list = &s,
					 .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED }, *bad;

		if (q.vlen > KV_MAX_VAL) {
			vrespond(c, KV_EINVAL, q.id, NULL);
			return;
		}
		off = kv_table_alloc(&S.t, q.klen, q.vlen);
		if (off < 0) {
			vrespond(c, KV_ENOSPC, q.id, NULL);
			return;
		}
		c->pend = q;
		c->pend_off = (uint64_t)off;
		if (!q.vlen) {
			S.st.puts++;
			vrespond(c, kv_table_install(&S.t, q.key, q.klen, c->pend_off, 0),
				 q.id, NULL);
			return;
		}
		s.addr = (uintptr_t)kv_table_val(&S.t, c->pend_off, q.klen);
		s.length = q.vlen;
		s.lkey = S.tmr->lkey;
		w.wr.rdma.remote_addr = q.vaddr;
		w.wr.rdma.rkey = q.vkey;
		if (ibv_post_send(c->qp, &w, &bad)) {
			kv_table_release(&S.t, c->pend_off, q.klen, q.vlen);
			conn_close(c);
			return;
		}
		c->pulling = true;
		return;
	}
	default:
		vrespond(c, KV_EINVAL, q.id, NULL);
	}
}

static void on_wc(const struct ibv_wc *wc)
{
	unsigned idx = (unsigned)(wc->wr_id >> 8), kind = (wc->wr_id >> 4) & 15;
	struct conn *c = idx < MAXCONN ? S.c[idx] : NULL;

	if (!c || !c->qp || wc->qp_num != c->qp->qp_num)
		return;		/* a flushed completion of a closed client */
	if (wc->status != IBV_WC_SUCCESS) {
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			fprintf(stderr, "ursa-kv: client %d: %s, disconnected\n",
				c->idx, ibv_wc_status_str(wc->status));
		conn_close(c);
		return;
	}
	switch (kind) {
	case WR_RECV:
		on_vreq(c, (int)(wc->wr_id & 15), wc->byte_len);
		break;
	case WR_RESP:
		break;
	case WR_PULL:
		c->pulling = false;
		S.st.puts++;
		vrespond(c, kv_table_install(&S.t, c->pend.key, c->pend.klen,
					     c->pend_off, c->pend.vlen),
			 c->pend.id, NULL);
		break;
	}
}

static void drain_cq(void)
{
	struct ibv_wc wc[32];
	int n;

	while ((n = ibv_poll_cq(S.cq, 32, wc)) > 0)
		for (int i = 0; i < n; i++)
			on_wc(&wc[i]);
}

/* --- TCP ------------------------------------------------------------------- */

static int tcp_answer(struct conn *c, int status, uint64_t id,
		      const struct kv_slot *sl)
{
	struct kv_tresp r = { .status = status, .id = id };
	const struct kv_block *b = sl ? (const struct kv_block *)(S.t.heap + sl->off) : NULL;

	if (b && status == KV_OK) {
		r.vlen = sl->vlen;
		r.sum = b->sum;
		r.ver = b->ver;
	}
	if (kv_xio(c->fd, &r, sizeof(r), 1))
		return -1;
	if (b && status == KV_OK && sl->vlen &&
	    kv_xio(c->fd, kv_table_val(&S.t, sl->off, sl->klen), sl->vlen, 1))
		return -1;
	return 0;
}

/* One TCP request; -1 closes the connection. */
static int on_tcp(struct conn *c)
{
	struct kv_treq q;
	uint8_t key[KV_MAX_KEY];

	if (kv_xio(c->fd, &q, sizeof(q), 0))
		return -1;
	if (q.op == KV_STATS) {
		struct kv_stats st = S.st;

		st.keys = S.t.nkeys;
		st.app_cpu_ns = cpu_ns(RUSAGE_THREAD);
		st.proc_cpu_ns = cpu_ns(RUSAGE_SELF);
		return kv_xio(c->fd, &st, sizeof(st), 1);
	}
	if (!key_ok(q.klen) || q.vlen > KV_MAX_VAL || (q.op != KV_PUT && q.vlen)) {
		/* the rest of the stream cannot be trusted: answer, then close */
		tcp_answer(c, KV_EINVAL, q.id, NULL);
		return -1;
	}
	if (kv_xio(c->fd, key, q.klen, 0))
		return -1;
	switch (q.op) {
	case KV_GET: {
		struct kv_slot *s = kv_table_find(&S.t, key, q.klen);

		S.st.gets++;
		return tcp_answer(c, s ? KV_OK : KV_NOTFOUND, q.id, s);
	}
	case KV_DEL:
		S.st.dels++;
		return tcp_answer(c, kv_table_del(&S.t, key, q.klen), q.id, NULL);
	case KV_PUT: {
		int64_t off;

		if (!c->tbuf && !(c->tbuf = malloc(KV_MAX_VAL)))
			return -1;
		/* read the value first: the stream stays in step either way */
		if (kv_xio(c->fd, c->tbuf, q.vlen, 0))
			return -1;
		off = kv_table_alloc(&S.t, q.klen, q.vlen);
		if (off < 0)
			return tcp_answer(c, KV_ENOSPC, q.id, NULL);
		memcpy(kv_table_val(&S.t, (uint64_t)off, q.klen), c->tbuf, q.vlen);
		S.st.puts++;
		return tcp_answer(c, kv_table_install(&S.t, key, q.klen,
						      (uint64_t)off, q.vlen),
				  q.id, NULL);
	}
	default:
		tcp_answer(c, KV_EINVAL, q.id, NULL);
		return -1;
	}
}

static void on_accept(void)
{
	struct kv_hello h;
	struct kv_welcome w = { .magic = KV_MAGIC };
	struct sockaddr_storage local;
	socklen_t ll = sizeof(local);
	struct timeval tv = { 2, 0 };
	struct conn *c;
	int fd = accept4(S.lfd, NULL, NULL, SOCK_CLOEXEC), one = 1, idx = -1;

	if (fd < 0)
		return;
	for (int i = 0; i < MAXCONN && idx < 0; i++)
		if (!S.c[i])
			idx = i;
	/* a client that stops halfway through a request is dropped */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c = idx >= 0 ? calloc(1, sizeof(*c)) : NULL;
	if (!c || kv_xio(fd, &h, sizeof(h), 0) || h.magic != KV_MAGIC) {
		free(c);
		close(fd);
		return;
	}
	c->fd = fd;
	c->idx = idx;
	getsockname(fd, (struct sockaddr *)&local, &ll);
	if (h.qpn && !verbs_up(&local) && h.resp_len >= sizeof(struct kv_vresp)) {
		c->rbuf = (struct kv_vreq *)(S.ctl + (size_t)idx * CTL_PER);
		c->hdr = (struct kv_vresp *)(c->rbuf + NRECV);
		c->resp_addr = h.resp_addr;
		c->resp_len = h.resp_len;
		c->resp_key = h.resp_key;
		c->qp = kv_qp_create(&S.ep, S.cq, NRECV + 4);
		if (c->qp && !kv_qp_connect(&S.ep, c->qp, h.qpn, h.gid)) {
			for (int i = 0; i < NRECV; i++)
				post_recv(c, i);
			w.qpn = c->qp->qp_num;
			w.table_key = S.tmr->rkey;
			w.table_addr = (uintptr_t)S.t.base;
			w.nbuckets = S.t.hdr->nbuckets;
			w.buckets_off = S.t.hdr->buckets_off;
			w.heap_off = S.t.hdr->heap_off;
			w.heap_len = S.t.heap_len;
			memcpy(w.gid, S.ep.gid.raw, 16);
		} else if (c->qp) {
			ibv_destroy_qp(c->qp);
			c->qp = NULL;
		}
	}
	S.c[idx] = c;
	if (kv_xio(fd, &w, sizeof(w), 1)) {
		conn_close(c);
		return;
	}
	{
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = (uint64_t)idx };

		epoll_ctl(S.ep_fd, EPOLL_CTL_ADD, fd, &ev);
	}
}

int kv_server(const struct kv_server_opts *o)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6,
				   .sin6_port = htons((uint16_t)o->port) };
	int one = 1, zero = 0, ret;

	ret = kv_table_init(&S.t, o->nbuckets, o->heap_mib << 20);
	if (ret) {
		fprintf(stderr, "ursa-kv: table: %s\n", strerror(-ret));
		return 1;
	}
	S.poll = o->poll;
	S.lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(S.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(S.lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (S.lfd < 0 || bind(S.lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(S.lfd, 128)) {
		fprintf(stderr, "ursa-kv: port %d: %s\n", o->port, strerror(errno));
		return 1;
	}
	S.ep_fd = epoll_create1(EPOLL_CLOEXEC);
	{
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = UINT64_MAX - 1 };

		epoll_ctl(S.ep_fd, EPOLL_CTL_ADD, S.lfd, &ev);
	}
	printf("ursa-kv: serving on port %d: %" PRIu64 " buckets of %d slots, %" PRIu64
	       " MiB heap\n", o->port, o->nbuckets, KV_SLOTS, o->heap_mib);
	fflush(stdout);
	for (;;) {
		struct epoll_event ev[64];
		int n = epoll_wait(S.ep_fd, ev, 64, S.poll ? 0 : -1);

		if (S.have_ep)
			drain_cq();
		for (int i = 0; i < n; i++) {
			uint64_t k = ev[i].data.u64;

			if (k == UINT64_MAX) {
				struct ibv_cq *cq;
				void *cctx;

				if (!ibv_get_cq_event(S.ch, &cq, &cctx))
					ibv_ack_cq_events(cq, 1);
				ibv_req_notify_cq(S.cq, 0);
				drain_cq();
			} else if (k == UINT64_MAX - 1) {
				on_accept();
			} else if (k < MAXCONN && S.c[k] && on_tcp(S.c[k])) {
				conn_close(S.c[k]);
			}
		}
	}
	return 0;
}
