// SPDX-License-Identifier: MIT
/*
 * client.c - the ursa-kv client: GET by TCP, by SEND (two-sided) or by
 * RDMA READ (one-sided); PUT and DELETE by TCP or SEND.
 *
 * The one-sided GET reads the key's bucket (512 bytes, one READ), picks
 * the slot whose hash matches and whose check word is right, then reads
 * the value block and accepts it only if its version is the slot's and
 * its checksum matches; anything else means the server changed the entry
 * while we read, and we read again. The server's CPU takes no part.
 *
 * Everything the server sends is bounded before use (a slot's offset and
 * lengths against the heap, a response's length against our buffer). An
 * operation that finds the connection broken (the server restarted)
 * reconnects and is tried once more; GET, PUT and DELETE are idempotent
 * from the client's side (a repeated DELETE may answer "not found").
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_verbs.h"
#include "kv_app.h"

#define RESP_LEN (sizeof(struct kv_vresp) + KV_MAX_VAL)
#define BLK_LEN (sizeof(struct kv_block) + KV_MAX_KEY + KV_MAX_VAL)
/* registered buffer: response | block | bucket | request | PUT value */
#define OFF_BLK RESP_LEN
#define OFF_BKT (OFF_BLK + BLK_LEN)
#define OFF_REQ (OFF_BKT + sizeof(struct kv_bucket))
#define OFF_VAL (OFF_REQ + sizeof(struct kv_vreq))
#define BUF_LEN (OFF_VAL + KV_MAX_VAL)
#define WAIT_S 10.0		/* a verbs operation that takes longer failed */
#define READ_TRIES 100000

struct kv_client {
	char host[256];
	int port;
	bool verbs;
	int fd;
	struct kv_ep ep;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct kv_welcome w;
	uint64_t id, retries;
	char why[96];		/* the last failure, for people */
	/* key -> block locations seen (one-sided GET), direct-mapped */
	struct { uint64_t khash, off; uint32_t klen, vlen; } loc[4096];
};

const char *kv_path_name(enum kv_path p)
{
	return p == KV_TCP ? "tcp" : p == KV_SEND ? "send" : "read";
}

int kv_path_parse(const char *s, enum kv_path *p)
{
	if (!strcmp(s, "tcp"))
		*p = KV_TCP;
	else if (!strcmp(s, "send"))
		*p = KV_SEND;
	else if (!strcmp(s, "read"))
		*p = KV_READ;
	else
		return -EINVAL;
	return 0;
}

uint64_t kvc_retries(const struct kv_client *c)
{
	return c->retries;
}

const char *kvc_why(const struct kv_client *c)
{
	return c->why;
}

static void teardown(struct kv_client *c)
{
	if (c->qp)
		ibv_destroy_qp(c->qp);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	kv_ep_close(&c->ep);
	free(c->buf);
	if (c->fd >= 0)
		close(c->fd);
	c->qp = NULL;
	c->cq = NULL;
	c->mr = NULL;
	c->buf = NULL;
	c->fd = -1;
}

static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai, *a;
	char ps[16];
	int fd = -1, one = 1;

	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(host, ps, &hints, &ai))
		return -EHOSTUNREACH;
	for (a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && !connect(fd, a->ai_addr, a->ai_addrlen))
			break;
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return -ECONNREFUSED;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int setup(struct kv_client *c)
{
	struct kv_hello h = { .magic = KV_MAGIC };
	struct sockaddr_storage local;
	socklen_t ll = sizeof(local);
	struct timeval tv = { 10, 0 };
	int ret;

	c->fd = tcp_connect(c->host, c->port);
	if (c->fd < 0)
		return c->fd;
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	getsockname(c->fd, (struct sockaddr *)&local, &ll);
	if (c->verbs) {
		ret = kv_ep_open(&c->ep, &local);
		if (ret)
			return ret;
		c->buf = aligned_alloc(4096, (BUF_LEN + 4095) & ~(size_t)4095);
		if (!c->buf)
			return -ENOMEM;
		memset(c->buf, 0, BUF_LEN);
		c->mr = ibv_reg_mr(c->ep.pd, c->buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE |
				   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
		c->cq = ibv_create_cq(c->ep.ctx, 64, NULL, NULL, 0);
		c->qp = c->cq ? kv_qp_create(&c->ep, c->cq, 16) : NULL;
		if (!c->mr || !c->qp)
			return -ENOMEM;
		h.qpn = c->qp->qp_num;
		h.resp_addr = (uintptr_t)c->buf;
		h.resp_len = RESP_LEN;
		h.resp_key = c->mr->rkey;
		memcpy(h.gid, c->ep.gid.raw, 16);
	}
	if (kv_xio(c->fd, &h, sizeof(h), 1) || kv_xio(c->fd, &c->w, sizeof(c->w), 0) ||
	    c->w.magic != KV_MAGIC)
		return -ECONNRESET;
	if (c->verbs) {
		if (!c->w.qpn)
			return -EPROTONOSUPPORT;
		/* the table's geometry bounds every one-sided READ */
		if (!c->w.nbuckets || (c->w.nbuckets & (c->w.nbuckets - 1)))
			return -EPROTO;
		ret = kv_qp_connect(&c->ep, c->qp, c->w.qpn, c->w.gid);
		if (ret)
			return ret;
	}
	return 0;
}

struct kv_client *kvc_open(const char *host, int port, bool verbs)
{
	struct kv_client *c = calloc(1, sizeof(*c));
	int ret;

	if (!c)
		return NULL;
	snprintf(c->host, sizeof(c->host), "%s", host);
	c->port = port;
	c->verbs = verbs;
	c->fd = -1;
	ret = setup(c);
	if (ret) {
		teardown(c);
		free(c);
		errno = -ret;
		return NULL;
	}
	return c;
}

void kvc_close(struct kv_client *c)
{
	if (!c)
		return;
	teardown(c);
	free(c);
}

/* The server went away: connect again, for up to 10 s. */
static int reconnect(struct kv_client *c)
{
	double t0 = kv_now();
	int ret;

	do {
		teardown(c);
		ret = setup(c);
		if (!ret)
			return 0;
		usleep(50000);
	} while (kv_now() - t0 < 10);
	teardown(c);
	return ret;
}

/* --- verbs primitives ------------------------------------------------------ */

/* Wait for the completions of wr_id a and b (b 0: none); every work
 * request of ours is signaled and waited for, so others cannot be
 * pending. A response can complete before the SEND that asked for it. */
static int wait_wc(struct kv_client *c, uint64_t a, uint64_t b, struct ibv_wc *wb)
{
	double t0 = kv_now();
	unsigned spins = 0;
	bool got_a = false, got_b = !b;

	while (!got_a || !got_b) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(c->cq, 1, &wc);

		if (n < 0)
			return -EIO;
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS) {
				snprintf(c->why, sizeof(c->why), "%s (vendor error 0x%x)",
					 ibv_wc_status_str(wc.status), wc.vendor_err);
				return -EIO;
			}
			if (wc.wr_id == a) {
				got_a = true;
			} else if (b && wc.wr_id == b) {
				got_b = true;
				*wb = wc;
			}
			continue;
		}
		/* Spin briefly, then give the core away between polls: more
		 * busy clients than cores would otherwise starve the server
		 * and the software NIC's threads that must answer them. */
		if (++spins > 64)
			sched_yield();
		if (spins % 1024 == 0 && kv_now() - t0 > WAIT_S)
			return -ETIMEDOUT;
	}
	return 0;
}

static int rdma_read(struct kv_client *c, uint64_t loff, uint64_t raddr,
		     uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)c->buf + loff, len, c->mr->lkey };
	struct ibv_send_wr w = { .wr_id = ++c->id, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;

	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = c->w.table_key;
	if (ibv_post_send(c->qp, &w, &bad))
		return -EIO;
	return wait_wc(c, w.wr_id, 0, NULL);
}

/* A verbs request; the answer's header is at c->buf. */
static int vcall(struct kv_client *c, uint8_t op, const void *key,
		 uint32_t klen, const void *val, uint32_t vlen)
{
	struct kv_vreq *q = (struct kv_vreq *)(c->buf + OFF_REQ);
	struct kv_vresp *r = (struct kv_vresp *)c->buf;
	struct ibv_recv_wr rw = { .wr_id = ++c->id }, *rbad;
	struct ibv_sge s = { (uintptr_t)q, (uint32_t)offsetof(struct kv_vreq, key) + klen,
			     c->mr->lkey };
	struct ibv_send_wr w = { .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	uint64_t id = rw.wr_id;
	int ret;

	memset(q, 0, sizeof(*q));
	q->op = op;
	q->klen = (uint16_t)klen;
	q->vlen = vlen;
	q->id = id;
	memcpy(q->key, key, klen);
	if (op == KV_PUT) {
		memcpy(c->buf + OFF_VAL, val, vlen);
		q->vaddr = (uintptr_t)c->buf + OFF_VAL;
		q->vkey = c->mr->rkey;
	}
	r->id = 0;
	w.wr_id = ++c->id;
	if (ibv_post_recv(c->qp, &rw, &rbad) || ibv_post_send(c->qp, &w, &bad))
		return -EIO;
	ret = wait_wc(c, w.wr_id, id, &wc);
	if (ret)
		return ret;
	/* the answer must be to this request, and fit */
	if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || ntohl(wc.imm_data) != (uint32_t)id ||
	    r->id != id || r->vlen > KV_MAX_VAL)
		return -EPROTO;
	return r->status;
}

/* --- operations ------------------------------------------------------------ */

static int get_tcp(struct kv_client *c, const void *key, uint32_t klen,
		   void *out, uint32_t cap, uint32_t *vlen)
{
	struct kv_treq q = { .op = KV_GET, .klen = (uint16_t)klen, .id = ++c->id };
	struct kv_tresp r;
	uint8_t msg[sizeof(q) + KV_MAX_KEY];

	memcpy(msg, &q, sizeof(q));
	memcpy(msg + sizeof(q), key, klen);
	if (kv_xio(c->fd, msg, sizeof(q) + klen, 1) || kv_xio(c->fd, &r, sizeof(r), 0))
		return -ECONNRESET;
	if (r.id != q.id || r.vlen > KV_MAX_VAL)
		return -EPROTO;
	if (r.status != KV_OK)
		return r.status;
	if (r.vlen > cap) {
		/* keep the stream in step, then refuse */
		char sink[4096];

		for (uint32_t left = r.vlen; left;) {
			uint32_t n = left < sizeof(sink) ? left : (uint32_t)sizeof(sink);

			if (kv_xio(c->fd, sink, n, 0))
				return -ECONNRESET;
			left -= n;
		}
		return KV_EINVAL;
	}
	if (kv_xio(c->fd, out, r.vlen, 0))
		return -ECONNRESET;
	*vlen = r.vlen;
	return KV_OK;
}

static int get_send(struct kv_client *c, const void *key, uint32_t klen,
		    void *out, uint32_t cap, uint32_t *vlen)
{
	const struct kv_vresp *r = (const struct kv_vresp *)c->buf;
	const uint8_t *v = c->buf + sizeof(*r);

	for (int tries = 0; tries < READ_TRIES; tries++) {
		int st = vcall(c, KV_GET, key, klen, NULL, 0);

		if (st != KV_OK)
			return st;
		/* the value left its block after the server answered: if a
		 * PUT reused the block meanwhile, the sum tells */
		if (kv_sum(r->ver, key, klen, v, r->vlen) != r->sum) {
			c->retries++;
			continue;
		}
		if (r->vlen > cap)
			return KV_EINVAL;
		memcpy(out, v, r->vlen);
		*vlen = r->vlen;
		return KV_OK;
	}
	return KV_EIO;
}

/* Read the block at off for key and check it: 1 if it holds the key's
 * value (copied out), 0 if not (moved, being reused, another key). */
static int read_block(struct kv_client *c, const void *key, uint32_t klen,
		      uint64_t off, uint32_t vlen, uint64_t ver, void *out,
		      uint32_t cap, uint32_t *outlen)
{
	const struct kv_block *blk = (const struct kv_block *)(c->buf + OFF_BLK);
	uint64_t len = sizeof(struct kv_block) + (uint64_t)klen + vlen;
	int ret;

	/* bounded before the READ: a wrong offset would be a remote access
	 * error and cost the connection */
	if (vlen > KV_MAX_VAL || off > c->w.heap_len || len > c->w.heap_len - off)
		return 0;
	ret = rdma_read(c, OFF_BLK, c->w.table_addr + c->w.heap_off + off, (uint32_t)len);
	if (ret)
		return ret;
	if (!blk->ver || (ver && blk->ver != ver) || blk->klen != klen ||
	    blk->vlen != vlen || memcmp(blk + 1, key, klen) ||
	    kv_sum(blk->ver, blk + 1, klen, (const uint8_t *)(blk + 1) + klen, vlen) != blk->sum)
		return 0;
	if (vlen > cap)
		return KV_EINVAL + 100;	/* found, but does not fit */
	memcpy(out, (const uint8_t *)(blk + 1) + klen, vlen);
	*outlen = vlen;
	return 1;
}

static int get_read(struct kv_client *c, const void *key, uint32_t klen,
		    void *out, uint32_t cap, uint32_t *vlen)
{
	uint64_t h = kv_hash(key, klen);
	uint64_t baddr = c->w.table_addr + c->w.buckets_off +
			 (h & (c->w.nbuckets - 1)) * sizeof(struct kv_bucket);
	const struct kv_bucket *b = (const struct kv_bucket *)(c->buf + OFF_BKT);
	unsigned li = (unsigned)(h >> 52) % (sizeof(c->loc) / sizeof(c->loc[0]));
	int ret;

	/* where we last found it: one READ, if the block is still current */
	if (c->loc[li].khash == h && c->loc[li].klen == klen) {
		ret = read_block(c, key, klen, c->loc[li].off, c->loc[li].vlen, 0,
				 out, cap, vlen);
		if (ret < 0)
			return ret;
		if (ret == 1)
			return KV_OK;
		if (ret > 1)
			return KV_EINVAL;
		c->loc[li].khash = 0;
	}
	for (int tries = 0; tries < READ_TRIES; tries++) {
		bool torn = false;

		if (tries)
			c->retries++;
		ret = rdma_read(c, OFF_BKT, baddr, sizeof(*b));
		if (ret)
			return ret;
		for (int i = 0; i < KV_SLOTS; i++) {
			struct kv_slot s = b->s[i];

			if (s.khash != h)
				continue;
			if (kv_slot_check(&s) != s.check) {
				torn = true;	/* changing under us */
				continue;
			}
			if (s.klen != klen)
				continue;
			ret = read_block(c, key, klen, s.off, s.vlen, s.ver, out, cap, vlen);
			if (ret < 0)
				return ret;
			if (ret > 1)
				return KV_EINVAL;
			if (ret == 1) {
				c->loc[li].khash = h;
				c->loc[li].off = s.off;
				c->loc[li].klen = klen;
				c->loc[li].vlen = s.vlen;
				return KV_OK;
			}
			/* moved, being reused, or another key with this hash:
			 * read the bucket again unless the block is simply
			 * someone else's */
			torn = true;
		}
		if (!torn)
			return KV_NOTFOUND;
	}
	return KV_EIO;
}

static int tcp_simple(struct kv_client *c, uint8_t op, const void *key,
		      uint32_t klen, const void *val, uint32_t vlen)
{
	struct kv_treq q = { .op = op, .klen = (uint16_t)klen, .vlen = vlen, .id = ++c->id };
	struct kv_tresp r;
	uint8_t msg[sizeof(q) + KV_MAX_KEY];

	memcpy(msg, &q, sizeof(q));
	memcpy(msg + sizeof(q), key, klen);
	if (kv_xio(c->fd, msg, sizeof(q) + klen, 1) ||
	    (vlen && kv_xio(c->fd, (void *)val, vlen, 1)) ||
	    kv_xio(c->fd, &r, sizeof(r), 0))
		return -ECONNRESET;
	if (r.id != q.id || r.vlen)
		return -EPROTO;
	return r.status;
}

static int check_args(struct kv_client *c, enum kv_path p, uint32_t klen,
		      uint32_t vlen)
{
	if (klen < 1 || klen > KV_MAX_KEY || vlen > KV_MAX_VAL)
		return KV_EINVAL;
	if (p != KV_TCP && (!c->verbs || !c->qp))
		return -EPROTONOSUPPORT;
	return 0;
}

/* Run op; if the connection broke, reconnect and run it once more. */
#define RETRY_ONCE(c, expr)                                          \
	({                                                           \
		int r_ = (c)->fd >= 0 ? (expr) : -ECONNRESET;        \
		if (r_ < 0 && r_ != -EPROTONOSUPPORT && !reconnect(c)) \
			r_ = (expr);                                 \
		r_;                                                  \
	})

int kvc_get(struct kv_client *c, enum kv_path p, const void *key,
	    uint32_t klen, void *out, uint32_t cap, uint32_t *vlen)
{
	int ret = check_args(c, p, klen, 0);

	if (ret)
		return ret;
	return RETRY_ONCE(c, p == KV_TCP ? get_tcp(c, key, klen, out, cap, vlen) :
			     p == KV_SEND ? get_send(c, key, klen, out, cap, vlen) :
					    get_read(c, key, klen, out, cap, vlen));
}

int kvc_put(struct kv_client *c, enum kv_path p, const void *key,
	    uint32_t klen, const void *val, uint32_t vlen)
{
	int ret = check_args(c, p, klen, vlen);

	if (ret)
		return ret;
	if (p == KV_READ)
		return -EOPNOTSUPP;	/* writes go through the server */
	return RETRY_ONCE(c, p == KV_TCP ? tcp_simple(c, KV_PUT, key, klen, val, vlen) :
			     vcall(c, KV_PUT, key, klen, val, vlen));
}

int kvc_del(struct kv_client *c, enum kv_path p, const void *key, uint32_t klen)
{
	int ret = check_args(c, p, klen, 0);

	if (ret)
		return ret;
	if (p == KV_READ)
		return -EOPNOTSUPP;
	return RETRY_ONCE(c, p == KV_TCP ? tcp_simple(c, KV_DEL, key, klen, NULL, 0) :
			     vcall(c, KV_DEL, key, klen, NULL, 0));
}

int kvc_stats(struct kv_client *c, struct kv_stats *st)
{
	struct kv_treq q = { .op = KV_STATS, .id = ++c->id };

	if (c->fd < 0 || kv_xio(c->fd, &q, sizeof(q), 1) || kv_xio(c->fd, st, sizeof(*st), 0))
		return -ECONNRESET;
	return 0;
}
