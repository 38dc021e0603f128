// SPDX-License-Identifier: MIT
/*
 * rsocket.c - rsockets: byte-stream sockets over an RC QP that rdma_cm
 * connects (RDMACM_1.0's rsocket, rbind, ..., riomap, riowrite).
 *
 * An rsocket's number is the descriptor of its own rdma_cm event channel
 * (as in rdma-core), so it never collides with an ordinary descriptor and
 * rpoll can tell the two apart. Each connected rsocket owns a PD, a CQ
 * with a completion channel, an RC QP and two rings:
 *
 *   receive ring  registered for remote write; the peer RDMA-WRITEs its
 *                 bytes into it in order and says how many with the
 *                 immediate value of each WRITE;
 *   send ring     a registered staging copy, the same size as the peer's
 *                 receive ring and at the same offsets, so a WRITE always
 *                 goes from staging offset p to remote offset p.
 *
 * The immediate value is an op in its top three bits and a count below:
 * DATA n (a WRITE of n bytes), CREDIT n (the peer consumed n more bytes),
 * FIN (no more data: rshutdown or rclose), IOMAP (a SEND whose payload
 * names a riomap()ed buffer). Receive WRs carry no data but IOMAP's 32
 * bytes and are posted again as soon as their completion is read; a
 * message that finds none is held by RNR NAK and retried without limit
 * (rnr_retry 7, IBTA 9.7.5.2.8), which is the whole of the per-message
 * flow control. Bytes are flow-controlled by the credits: a sender may
 * have at most the ring's size in flight past the peer's last CREDIT.
 *
 * This is ursa's own wire format: the rdma_cm handshake carries a
 * 24-byte ursa private-data block, not rdma-core's rs_conn_data, so an
 * ursa rsocket talks to ursa rsockets only (docs/design.md). There is no
 * progress thread: completions and CM events are read inside the calls,
 * and a blocked call sleeps in poll(2) on the completion and event
 * channels. Each rsocket has a mutex; a call that sleeps drops it.
 */
#include "cma.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RS_MAGIC	0x75727331u	/* "urs1" */
#define RS_RQ		64		/* receive WRs */
#define RS_SQ		64		/* send WRs; one kept for control */
#define RS_CTRL		32		/* bytes of a control slot */
#define RS_SEG		(64u << 10)	/* largest WRITE */
#define RS_BUF_DEF	(1u << 20)
#define RS_BUF_MIN	(4u << 10)
#define RS_BUF_MAX	(64u << 20)
#define RS_IOBUF	(1u << 20)	/* riowrite staging */
#define RS_IOMAP_MAX	64
#define RS_CM_MS	2000		/* resolve_addr/route timeouts */
#define RS_CLOSE_MS	2000		/* rclose waits this for its sends */

enum { OP_DATA, OP_CREDIT, OP_FIN, OP_IOMAP };
#define IMM(op, v)	((uint32_t)(op) << 29 | (uint32_t)(v))
#define IMM_OP(i)	((i) >> 29)
#define IMM_VAL(i)	((i) & ((1u << 29) - 1))

/* wr_id of a send: kind in the top byte, bytes below */
enum { WR_DATA = 1, WR_CTRL, WR_IO };
#define WRID(k, n)	((uint64_t)(k) << 56 | (n))

enum rs_state {
	RS_NEW, RS_LISTEN, RS_RESOLVING, RS_CONNECTING, RS_CONNECTED,
	RS_FAILED,
};

/* the handshake's private data, big-endian */
struct rs_conn {
	uint32_t magic, size;		/* receive ring bytes */
	uint64_t addr;			/* receive ring address */
	uint32_t rkey, iomaps;		/* riomap()s this side may make */
};

struct rs_iomap_msg {
	uint64_t offset, addr, len;
	uint32_t rkey, slot;		/* slot < the sender's RDMA_IOMAPSIZE */
};

struct rs_map {				/* a slot; len 0: empty */
	uint64_t offset, addr, len;
	uint32_t rkey;
	struct ibv_mr *mr;		/* local maps */
};

struct rs_req {				/* a listener's pending request */
	struct rdma_cm_id *id;
	struct rs_conn conn;
	bool ok;			/* carried a valid rs_conn */
	struct rs_req *next;
};

struct rs {
	int fd;				/* = ch->fd */
	pthread_mutex_t lock;
	enum rs_state state;
	int err;			/* SO_ERROR: why it failed */
	bool nonblock, fin_sent, fin_rcvd, shut_rd, gone;
	bool inherited;			/* by a fork() child (rs_fork_child) */
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct rs_req *reqs;		/* listener */

	/* options */
	uint32_t rcvbuf, sndbuf, inline_size;
	int iomap_size, keepalive, nodelay, keepidle;

	/* receive ring: rhead bytes arrived, rtail consumed, racked credited */
	uint8_t *rbuf;
	struct ibv_mr *rmr;
	uint32_t rsize;
	uint64_t rhead, rtail, racked;

	/* control slots: RS_RQ receive slots, then RS_SQ send slots */
	uint8_t *ctrl;
	struct ibv_mr *cmr;
	unsigned ctrl_next;

	/* send ring: whead posted, wdone completed, peer_used peer credited */
	uint8_t *sbuf;
	struct ibv_mr *smr;
	uint32_t ssize, rkey;
	uint64_t raddr, whead, wdone, peer_used;
	int sq_used;
	uint32_t peer_iomaps;		/* riomap() slots the peer has */

	/* riowrite staging ring */
	uint8_t *iobuf;
	struct ibv_mr *iomr;
	uint64_t iohead, iodone;

	/* riomap() slots, this side's (lslots of them, as the handshake
	 * told the peer) and the peer's (by its IOMAP's slot) */
	struct rs_map lmap[RS_IOMAP_MAX], rmap[RS_IOMAP_MAX];
	int lslots;
};

/* --- the descriptor table ------------------------------------------------- */

static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rs **tab;
static int tab_len;

static struct rs *rs_entry(int fd)
{
	struct rs *rs = NULL;

	pthread_mutex_lock(&tab_lock);
	if (fd >= 0 && fd < tab_len)
		rs = tab[fd];
	pthread_mutex_unlock(&tab_lock);
	return rs;
}

/* a live rsocket: not one a fork() child inherited */
static struct rs *rs_get(int fd)
{
	struct rs *rs = rs_entry(fd);

	return rs && !rs->inherited ? rs : NULL;
}

void rs_fork_prepare(void)
{
	pthread_mutex_lock(&tab_lock);
}

void rs_fork_parent(void)
{
	pthread_mutex_unlock(&tab_lock);
}

/* The parent's rsockets stay the parent's: in the child their QPs belong
 * to a context libibverbs has dropped and their locks may be held by
 * threads that do not exist, so only rclose takes them, and it only
 * closes the descriptors. */
void rs_fork_child(void)
{
	for (int i = 0; i < tab_len; i++)
		if (tab[i])
			tab[i]->inherited = true;
	pthread_mutex_unlock(&tab_lock);
}

static int tab_set(int fd, struct rs *rs)
{
	int r = 0;

	pthread_mutex_lock(&tab_lock);
	if (fd >= tab_len) {
		int n = fd + 64;
		struct rs **t = realloc(tab, (size_t)n * sizeof(*t));

		if (!t) {
			r = -ENOMEM;
		} else {
			memset(t + tab_len, 0, (size_t)(n - tab_len) * sizeof(*t));
			tab = t;
			tab_len = n;
		}
	}
	if (!r)
		tab[fd] = rs;
	pthread_mutex_unlock(&tab_lock);
	return r;
}

static int fail(int e)
{
	errno = e;
	return -1;
}

/* a locked rsocket, or NULL with errno EBADF */
static struct rs *rs_lock(int fd)
{
	struct rs *rs = rs_get(fd);

	if (!rs) {
		errno = EBADF;
		return NULL;
	}
	pthread_mutex_lock(&rs->lock);
	return rs;
}

static int rs_unlock_ret(struct rs *rs, int ret, int e)
{
	pthread_mutex_unlock(&rs->lock);
	if (ret < 0)
		errno = e;
	return ret;
}

static uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* --- creation and teardown ------------------------------------------------ */

static struct rs *rs_alloc(struct rdma_event_channel *ch)
{
	struct rs *rs = calloc(1, sizeof(*rs));
	int fl;

	if (!rs)
		return NULL;
	pthread_mutex_init(&rs->lock, NULL);
	rs->ch = ch;
	rs->fd = ch->fd;
	rs->rcvbuf = rs->sndbuf = RS_BUF_DEF;
	rs->nodelay = 1;
	/* the channel is read only when poll says so or to drain it */
	fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    tab_set(rs->fd, rs)) {
		pthread_mutex_destroy(&rs->lock);
		free(rs);
		return NULL;
	}
	return rs;
}

static void dereg(struct ibv_mr **mr, uint8_t **buf)
{
	if (*mr)
		ibv_dereg_mr(*mr);
	*mr = NULL;
	if (buf) {
		free(*buf);
		*buf = NULL;
	}
}

/* the verbs objects of a connection, the CM id kept */
static void rs_free_qp(struct rs *rs)
{
	if (rs->qp)
		rdma_destroy_qp(rs->id);
	rs->qp = NULL;
	for (int i = 0; i < RS_IOMAP_MAX; i++) {
		dereg(&rs->lmap[i].mr, NULL);
		rs->lmap[i].len = 0;
	}
	dereg(&rs->rmr, &rs->rbuf);
	dereg(&rs->smr, &rs->sbuf);
	dereg(&rs->cmr, &rs->ctrl);
	dereg(&rs->iomr, &rs->iobuf);
	if (rs->cq)
		ibv_destroy_cq(rs->cq);
	rs->cq = NULL;
	if (rs->cc)
		ibv_destroy_comp_channel(rs->cc);
	rs->cc = NULL;
	if (rs->pd)
		ibv_dealloc_pd(rs->pd);
	rs->pd = NULL;
}

static void rs_free(struct rs *rs)
{
	while (rs->reqs) {
		struct rs_req *q = rs->reqs;

		rs->reqs = q->next;
		rdma_reject(q->id, NULL, 0);
		rdma_destroy_id(q->id);
		free(q);
	}
	rs_free_qp(rs);
	if (rs->id)
		rdma_destroy_id(rs->id);
	tab_set(rs->fd, NULL);
	rdma_destroy_event_channel(rs->ch);
	pthread_mutex_destroy(&rs->lock);
	free(rs);
}

static void *ralloc(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, n))
		return NULL;
	memset(p, 0, n);
	return p;
}

static int post_recv(struct rs *rs, unsigned slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(rs->ctrl + slot * RS_CTRL),
		.length = RS_CTRL, .lkey = rs->cmr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(rs->qp, &wr, &bad) ? -ECONNRESET : 0;
}

/* PD, CQ, QP, receive ring and control slots on rs->id, receives posted */
static int rs_setup(struct rs *rs)
{
	struct ibv_context *v = rs->id->verbs;
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = RS_SQ, .max_recv_wr = RS_RQ,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 1,
	};
	int fl;

	rs->rsize = rs->rcvbuf;
	rs->pd = ibv_alloc_pd(v);
	rs->cc = rs->pd ? ibv_create_comp_channel(v) : NULL;
	rs->cq = rs->cc ? ibv_create_cq(v, RS_SQ + RS_RQ, rs, rs->cc, 0) : NULL;
	if (!rs->cq)
		return -ENOMEM;
	fl = fcntl(rs->cc->fd, F_GETFL);
	if (fl < 0 || fcntl(rs->cc->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	qa.send_cq = qa.recv_cq = rs->cq;
	if (rdma_create_qp(rs->id, rs->pd, &qa))
		return -errno;
	rs->qp = rs->id->qp;
	rs->rbuf = ralloc(rs->rsize);
	rs->ctrl = ralloc((RS_RQ + RS_SQ) * RS_CTRL);
	if (!rs->rbuf || !rs->ctrl)
		return -ENOMEM;
	rs->rmr = ibv_reg_mr(rs->pd, rs->rbuf, rs->rsize,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	rs->cmr = ibv_reg_mr(rs->pd, rs->ctrl, (RS_RQ + RS_SQ) * RS_CTRL,
			     IBV_ACCESS_LOCAL_WRITE);
	if (!rs->rmr || !rs->cmr)
		return -ENOMEM;
	for (unsigned i = 0; i < RS_RQ; i++)
		if (post_recv(rs, i))
			return -ENOMEM;
	return ibv_req_notify_cq(rs->cq, 0) ? -EIO : 0;
}

static void conn_put(struct rs *rs, struct rs_conn *c)
{
	rs->lslots = rs->iomap_size;	/* later RDMA_IOMAPSIZEs come too late */
	c->magic = htobe32(RS_MAGIC);
	c->size = htobe32(rs->rsize);
	c->addr = htobe64((uintptr_t)rs->rbuf);
	c->rkey = htobe32(rs->rmr->rkey);
	c->iomaps = htobe32((uint32_t)rs->lslots);
}

/* the peer's block, checked: it sizes our send ring */
static bool conn_get(struct rs_conn *c, const void *priv, size_t len)
{
	if (!priv || len < sizeof(*c))
		return false;
	memcpy(c, priv, sizeof(*c));
	c->magic = be32toh(c->magic);
	c->size = be32toh(c->size);
	c->addr = be64toh(c->addr);
	c->rkey = be32toh(c->rkey);
	c->iomaps = be32toh(c->iomaps);
	return c->magic == RS_MAGIC && c->size >= RS_BUF_MIN &&
	       c->size <= RS_BUF_MAX;
}

/* the peer's ring known: the send ring mirrors it */
static int rs_connected(struct rs *rs, const struct rs_conn *c)
{
	rs->ssize = c->size;
	rs->raddr = c->addr;
	rs->rkey = c->rkey;
	rs->peer_iomaps = c->iomaps < RS_IOMAP_MAX ? c->iomaps : RS_IOMAP_MAX;
	rs->sbuf = ralloc(rs->ssize);
	rs->smr = rs->sbuf ? ibv_reg_mr(rs->pd, rs->sbuf, rs->ssize, 0) : NULL;
	if (!rs->smr)
		return -ENOMEM;
	rs->state = RS_CONNECTED;
	return 0;
}

static struct rdma_conn_param conn_param(struct rs_conn *c)
{
	struct rdma_conn_param p = {
		.private_data = c, .private_data_len = sizeof(*c),
		.responder_resources = 1, .initiator_depth = 1,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	return p;
}

static void rs_fail(struct rs *rs, int e)
{
	if (!rs->err)
		rs->err = e;
	rs->state = RS_FAILED;
}

/* --- progress: completions and CM events ---------------------------------- */

static int post_send(struct rs *rs, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;

	if (ibv_post_send(rs->qp, wr, &bad))
		return -ECONNRESET;
	rs->sq_used++;
	return 0;
}

/* CREDIT, FIN or IOMAP (payload of n bytes copied into a send slot) */
static int post_ctrl(struct rs *rs, uint32_t imm, const void *payload,
		     uint32_t n)
{
	unsigned slot = RS_RQ + rs->ctrl_next++ % RS_SQ;
	struct ibv_sge sge = {
		.addr = (uintptr_t)(rs->ctrl + slot * RS_CTRL),
		.length = n, .lkey = rs->cmr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = WRID(WR_CTRL, 0), .sg_list = &sge, .num_sge = n ? 1 : 0,
		.opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htobe32(imm),
	};

	/* the slot is free: RS_SQ sends later than its last use, and at most
	 * RS_SQ are outstanding, completing in order */
	if (n)
		memcpy(rs->ctrl + slot * RS_CTRL, payload, n);
	return post_send(rs, &wr);
}

static void on_recv(struct rs *rs, const struct ibv_wc *wc)
{
	uint32_t imm = be32toh(wc->imm_data), v = IMM_VAL(imm);
	struct rs_iomap_msg m;

	if (!(wc->wc_flags & IBV_WC_WITH_IMM) || wc->wr_id >= RS_RQ) {
		rs_fail(rs, EPROTO);
		return;
	}
	switch (IMM_OP(imm)) {
	case OP_DATA:
		/* the peer wrote v bytes at rhead: never more than the ring */
		if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || wc->byte_len != v ||
		    rs->rhead - rs->rtail + v > rs->rsize)
			return rs_fail(rs, EPROTO);
		rs->rhead += v;
		break;
	case OP_CREDIT:
		if (rs->peer_used + v > rs->whead)
			return rs_fail(rs, EPROTO);
		rs->peer_used += v;
		break;
	case OP_FIN:
		rs->fin_rcvd = true;
		break;
	case OP_IOMAP:
		if (wc->byte_len != sizeof(m))
			return rs_fail(rs, EPROTO);
		memcpy(&m, rs->ctrl + wc->wr_id * RS_CTRL, sizeof(m));
		/* a slot the peer unmapped is mapped again in place */
		v = be32toh(m.slot);
		if (v >= rs->peer_iomaps || !m.len)
			return rs_fail(rs, EPROTO);
		rs->rmap[v] = (struct rs_map){
			.offset = be64toh(m.offset), .addr = be64toh(m.addr),
			.len = be64toh(m.len), .rkey = be32toh(m.rkey),
		};
		break;
	default:
		return rs_fail(rs, EPROTO);
	}
	if (post_recv(rs, (unsigned)wc->wr_id))
		rs_fail(rs, ECONNRESET);
}

static void on_wc(struct rs *rs, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		/* flushed after a DREQ or our own disconnect: the end, not a
		 * failure, if the peer said FIN first */
		if (!(wc->opcode & IBV_WC_RECV))
			rs->sq_used--;
		if (wc->status == IBV_WC_WR_FLUSH_ERR && (rs->fin_rcvd || rs->gone))
			rs->gone = true;
		else if (rs->state == RS_CONNECTED)
			rs_fail(rs, ECONNRESET);
		return;
	}
	if (wc->opcode & IBV_WC_RECV) {
		on_recv(rs, wc);
		return;
	}
	rs->sq_used--;
	switch (wc->wr_id >> 56) {
	case WR_DATA:
		rs->wdone += wc->wr_id & 0xffffffffu;
		break;
	case WR_IO:
		rs->iodone += wc->wr_id & 0xffffffffu;
		break;
	}
}

/* what a listener's request says; the event is acknowledged */
static void take_request(struct rs *rs, struct rdma_cm_event *e)
{
	struct rs_req *q = calloc(1, sizeof(*q)), **p;

	if (!q) {
		rdma_reject(e->id, NULL, 0);
		rdma_ack_cm_event(e);
		return;
	}
	q->id = e->id;
	q->ok = conn_get(&q->conn, e->param.conn.private_data,
			 e->param.conn.private_data_len);
	rdma_ack_cm_event(e);
	for (p = &rs->reqs; *p; p = &(*p)->next)
		;
	*p = q;
}

static void on_cm(struct rs *rs, struct rdma_cm_event *e)
{
	struct rs_conn c, mine;
	struct rdma_conn_param p;
	int r = 0;

	switch (e->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		take_request(rs, e);
		return;
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(rs->id, RS_CM_MS))
			r = -errno;
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		r = rs_setup(rs);
		if (!r) {
			conn_put(rs, &mine);
			p = conn_param(&mine);
			rs->state = RS_CONNECTING;
			if (rdma_connect(rs->id, &p))
				r = -errno;
		}
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (rs->state != RS_CONNECTING)
			break;
		if (rs->sbuf)		/* passive: the REQ told us already */
			rs->state = RS_CONNECTED;
		else if (!conn_get(&c, e->param.conn.private_data,
			      e->param.conn.private_data_len))
			r = -EPROTO;
		else
			r = rs_connected(rs, &c);
		break;
	case RDMA_CM_EVENT_REJECTED:
		r = -ECONNREFUSED;
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		r = -EHOSTUNREACH;
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		r = -ETIMEDOUT;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		rs->gone = true;
		break;
	default:
		break;
	}
	rdma_ack_cm_event(e);
	if (r && rs->state != RS_CONNECTED)
		rs_fail(rs, -r);
	else if (r)
		rs_fail(rs, ECONNRESET);
}

/* credits owed, once a quarter of the ring is free again; a FIN owed */
static void send_owed(struct rs *rs)
{
	uint64_t owed = rs->rtail - rs->racked;

	if (rs->state != RS_CONNECTED || rs->gone)
		return;
	if (owed && owed >= rs->rsize / 4 && rs->sq_used < RS_SQ) {
		if (post_ctrl(rs, IMM(OP_CREDIT, owed), NULL, 0))
			return rs_fail(rs, ECONNRESET);
		rs->racked += owed;
	}
}

/* reads what completed and what the CM said; returns how many */
static int progress(struct rs *rs)
{
	struct rdma_cm_event *e;
	struct ibv_wc wc[16];
	int n = 0, got;

	/* while connecting, the CM first, and no completion before the
	 * ESTABLISHED that tells us the peer's ring and limits: the QP
	 * takes the peer's first messages (its riomap) from RTR on, which
	 * the CM reaches before it queues that event */
	while (rs->state == RS_CONNECTING && !rdma_get_cm_event(rs->ch, &e)) {
		on_cm(rs, e);
		n++;
	}
	while (rs->cq && rs->state != RS_CONNECTING &&
	       (got = ibv_poll_cq(rs->cq, 16, wc)) > 0) {
		for (int i = 0; i < got; i++)
			on_wc(rs, &wc[i]);
		n += got;
	}
	/* after the completions: a DISCONNECTED never overtakes the data
	 * that came before it */
	while (!rdma_get_cm_event(rs->ch, &e)) {
		on_cm(rs, e);
		n++;
	}
	send_owed(rs);
	return n;
}

static void drain_cq_events(struct rs *rs)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!rs->cc)
		return;
	while (!ibv_get_cq_event(rs->cc, &cq, &ctx))
		ibv_ack_cq_events(cq, 1);
}

/* arms the CQ; > 0 if something happened meanwhile (do not sleep) */
static int rs_arm(struct rs *rs)
{
	drain_cq_events(rs);
	if (rs->cq && ibv_req_notify_cq(rs->cq, 0))
		return 1;
	return progress(rs);
}

static int rs_pollfds(struct rs *rs, struct pollfd *p)
{
	int n = 0;

	p[n++] = (struct pollfd){ .fd = rs->ch->fd, .events = POLLIN };
	if (rs->cc)
		p[n++] = (struct pollfd){ .fd = rs->cc->fd, .events = POLLIN };
	return n;
}

/* sleeps (the lock dropped) until a completion or CM event, or ms */
static void rs_wait(struct rs *rs, int ms)
{
	struct pollfd p[2];
	int n;

	if (rs_arm(rs) > 0)
		return;
	n = rs_pollfds(rs, p);
	pthread_mutex_unlock(&rs->lock);
	poll(p, (nfds_t)n, ms);
	pthread_mutex_lock(&rs->lock);
	progress(rs);
}

/* --- sockets, addresses, connections -------------------------------------- */

CMA_EXPORT int rsocket(int domain, int type, int protocol)
{
	struct rdma_event_channel *ch;
	struct rs *rs;

	if (domain != AF_INET && domain != AF_INET6)
		return fail(EAFNOSUPPORT);
	/* rdma-core's datagram rsockets (udpong) are not implemented */
	if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM)
		return fail(EPROTONOSUPPORT);
	if (protocol && protocol != IPPROTO_TCP)
		return fail(EPROTONOSUPPORT);
	ch = rdma_create_event_channel();
	if (!ch)
		return -1;
	rs = rs_alloc(ch);
	if (!rs) {
		rdma_destroy_event_channel(ch);
		return fail(ENOMEM);
	}
	if (rdma_create_id(ch, &rs->id, rs, RDMA_PS_TCP)) {
		int e = errno;

		rs->id = NULL;
		rs_free(rs);
		return fail(e);
	}
	rs->nonblock = type & SOCK_NONBLOCK;
	return rs->fd;
}

CMA_EXPORT int rbind(int s, const struct sockaddr *a, socklen_t l)
{
	struct rs *rs = rs_lock(s);
	int r;

	if (!rs)
		return -1;
	if (rs->state != RS_NEW)
		return rs_unlock_ret(rs, -1, EINVAL);
	if (!a || l < sizeof(struct sockaddr_in))
		return rs_unlock_ret(rs, -1, EINVAL);
	r = rdma_bind_addr(rs->id, (struct sockaddr *)a);
	return rs_unlock_ret(rs, r, errno);
}

CMA_EXPORT int rlisten(int s, int backlog)
{
	struct rs *rs = rs_lock(s);
	int r;

	if (!rs)
		return -1;
	if (rs->state != RS_NEW)
		return rs_unlock_ret(rs, -1, EINVAL);
	r = rdma_listen(rs->id, backlog);
	if (!r)
		rs->state = RS_LISTEN;
	return rs_unlock_ret(rs, r, errno);
}

static void fill_addr(const struct sockaddr *src, struct sockaddr *a,
		      socklen_t *l)
{
	socklen_t n = src->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						 : sizeof(struct sockaddr_in);

	if (!a || !l)
		return;
	memcpy(a, src, *l < n ? *l : n);
	*l = n;
}

/* a pending request made a connected rsocket, or -errno */
static int accept_one(struct rs *ls, struct rs_req *q, struct rs **out)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rs_conn mine;
	struct rdma_conn_param p;
	struct rs *rs;
	uint64_t until = now_ms() + 2 * RS_CM_MS;
	int r = 0;

	if (!ch || !(rs = rs_alloc(ch))) {
		if (ch)
			rdma_destroy_event_channel(ch);
		rdma_reject(q->id, NULL, 0);
		rdma_destroy_id(q->id);
		return -ENOMEM;
	}
	rs->id = q->id;
	rs->id->context = rs;
	rs->rcvbuf = ls->rcvbuf;
	rs->sndbuf = ls->sndbuf;
	rs->iomap_size = ls->iomap_size;
	rs->nonblock = ls->nonblock;
	pthread_mutex_lock(&rs->lock);
	if (rdma_migrate_id(rs->id, ch))
		r = -errno;
	if (!r && !q->ok)
		r = -EPROTO;
	if (!r)
		r = rs_setup(rs);
	if (!r) {
		conn_put(rs, &mine);
		p = conn_param(&mine);
		if (rdma_accept(rs->id, &p))
			r = -errno;
	}
	if (!r)
		r = rs_connected(rs, &q->conn);
	if (!r) {
		/* data may flow once the active side is ready: its RTU */
		rs->state = RS_CONNECTING;
		while (rs->state == RS_CONNECTING && now_ms() < until)
			rs_wait(rs, 100);
		if (rs->state == RS_CONNECTING)
			r = -ETIMEDOUT;
		else if (rs->state != RS_CONNECTED)
			r = -rs->err;
	}
	pthread_mutex_unlock(&rs->lock);
	if (r) {
		if (r == -EPROTO)
			rdma_reject(rs->id, NULL, 0);
		rs_free(rs);
		return r;
	}
	*out = rs;
	return 0;
}

CMA_EXPORT int raccept(int s, struct sockaddr *a, socklen_t *l)
{
	struct rs *ls = rs_lock(s), *rs;
	struct rs_req *q;
	int r;

	if (!ls)
		return -1;
	if (ls->state != RS_LISTEN)
		return rs_unlock_ret(ls, -1, EINVAL);
	for (;;) {
		progress(ls);
		if (!ls->reqs) {
			if (ls->nonblock)
				return rs_unlock_ret(ls, -1, EAGAIN);
			rs_wait(ls, -1);
			continue;
		}
		q = ls->reqs;
		ls->reqs = q->next;
		r = accept_one(ls, q, &rs);
		free(q);
		if (!r)
			break;
		/* a request that failed is the peer's loss, not the listener's */
		if (ls->nonblock)
			return rs_unlock_ret(ls, -1, ECONNABORTED);
	}
	pthread_mutex_unlock(&ls->lock);
	fill_addr(rdma_get_peer_addr(rs->id), a, l);
	return rs->fd;
}

/* blocks until connected or failed (blocking rconnect) */
static int wait_connected(struct rs *rs)
{
	while (rs->state == RS_RESOLVING || rs->state == RS_CONNECTING)
		rs_wait(rs, -1);
	return rs->state == RS_CONNECTED ? 0 : -rs->err;
}

CMA_EXPORT int rconnect(int s, const struct sockaddr *a, socklen_t l)
{
	struct rs *rs = rs_lock(s);
	int r;

	if (!rs)
		return -1;
	if (rs->state == RS_RESOLVING || rs->state == RS_CONNECTING)
		return rs_unlock_ret(rs, -1, EALREADY);
	if (rs->state == RS_CONNECTED)
		return rs_unlock_ret(rs, -1, EISCONN);
	if (rs->state != RS_NEW)
		return rs_unlock_ret(rs, -1, EINVAL);
	if (!a || l < sizeof(struct sockaddr_in) ||
	    (a->sa_family != AF_INET && a->sa_family != AF_INET6))
		return rs_unlock_ret(rs, -1, EAFNOSUPPORT);
	if (rdma_resolve_addr(rs->id, NULL, (struct sockaddr *)a, RS_CM_MS))
		return rs_unlock_ret(rs, -1, errno);
	rs->state = RS_RESOLVING;
	if (rs->nonblock) {
		progress(rs);
		return rs_unlock_ret(rs, -1, EINPROGRESS);
	}
	r = wait_connected(rs);
	return rs_unlock_ret(rs, r ? -1 : 0, -r);
}

/* every posted send completed, or ms passed */
static void wait_sends(struct rs *rs, int ms)
{
	uint64_t until = now_ms() + (uint64_t)ms;

	progress(rs);
	while (rs->sq_used > 0 && rs->state == RS_CONNECTED && !rs->gone &&
	       now_ms() < until)
		rs_wait(rs, 50);
}

static int send_fin(struct rs *rs)
{
	uint64_t until = now_ms() + RS_CLOSE_MS;

	if (rs->fin_sent || rs->state != RS_CONNECTED || rs->gone)
		return 0;
	while (rs->sq_used >= RS_SQ && rs->state == RS_CONNECTED &&
	       now_ms() < until)
		rs_wait(rs, 50);
	if (rs->sq_used >= RS_SQ || rs->state != RS_CONNECTED)
		return -ECONNRESET;
	rs->fin_sent = true;
	return post_ctrl(rs, IMM(OP_FIN, 0), NULL, 0);
}

CMA_EXPORT int rshutdown(int s, int how)
{
	struct rs *rs = rs_lock(s);
	int r = 0;

	if (!rs)
		return -1;
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return rs_unlock_ret(rs, -1, EINVAL);
	if (rs->state != RS_CONNECTED && rs->state != RS_FAILED)
		return rs_unlock_ret(rs, -1, ENOTCONN);
	if (how != SHUT_WR)
		rs->shut_rd = true;
	if (how != SHUT_RD)
		r = send_fin(rs);
	return rs_unlock_ret(rs, r ? -1 : 0, -r);
}

CMA_EXPORT int rclose(int s)
{
	struct rs *rs = rs_entry(s);

	if (rs && rs->inherited) {
		/* a fork() child's copy: its memory is left, never used */
		if (rs->cc)
			close(rs->cc->fd);
		tab_set(s, NULL);
		return close(s);
	}
	if (!(rs = rs_lock(s)))
		return -1;
	if (rs->state == RS_CONNECTED && !rs->gone) {
		/* the peer reads everything up to our FIN before it sees the
		 * DREQ: the sends complete first */
		send_fin(rs);
		wait_sends(rs, RS_CLOSE_MS);
		rdma_disconnect(rs->id);
	}
	pthread_mutex_unlock(&rs->lock);
	rs_free(rs);
	return 0;
}

/* --- data ------------------------------------------------------------------ */

static bool readable(const struct rs *rs)
{
	return rs->rhead != rs->rtail || rs->fin_rcvd || rs->gone ||
	       rs->shut_rd || rs->state == RS_FAILED;
}

static uint64_t send_space(const struct rs *rs)
{
	uint64_t low = rs->peer_used < rs->wdone ? rs->peer_used : rs->wdone;

	return rs->ssize - (rs->whead - low);
}

static bool writable(const struct rs *rs)
{
	return rs->state != RS_CONNECTED || rs->gone || rs->fin_sent ||
	       (send_space(rs) > 0 && rs->sq_used < RS_SQ - 1);
}

/* copies up to n bytes out of the receive ring */
static size_t ring_read(struct rs *rs, uint8_t *dst, size_t n, bool peek)
{
	uint64_t avail = rs->rhead - rs->rtail, pos = rs->rtail;
	size_t done = 0;

	if (n > avail)
		n = (size_t)avail;
	while (done < n) {
		size_t off = (size_t)(pos % rs->rsize);
		size_t k = rs->rsize - off;

		if (k > n - done)
			k = n - done;
		memcpy(dst + done, rs->rbuf + off, k);
		done += k;
		pos += k;
	}
	if (!peek)
		rs->rtail = pos;
	return done;
}

CMA_EXPORT ssize_t rrecv(int s, void *b, size_t n, int f)
{
	struct rs *rs = rs_lock(s);
	bool nb, all = f & MSG_WAITALL, peek = f & MSG_PEEK;
	size_t got = 0;

	if (!rs)
		return -1;
	nb = rs->nonblock || (f & MSG_DONTWAIT);
	if (rs->state != RS_CONNECTED && rs->state != RS_FAILED)
		return rs_unlock_ret(rs, -1, ENOTCONN);
	if (n && !b)
		return rs_unlock_ret(rs, -1, EFAULT);
	for (;;) {
		progress(rs);
		if (!rs->shut_rd)
			got += ring_read(rs, (uint8_t *)b + got, n - got, peek);
		if (got == n || (got && (!all || peek)))
			break;
		if (rs->shut_rd || rs->fin_rcvd || rs->gone)
			break;		/* end of stream: 0, or what came */
		if (rs->state == RS_FAILED) {
			if (got)
				break;
			return rs_unlock_ret(rs, -1, rs->err);
		}
		if (nb) {
			if (got)
				break;
			return rs_unlock_ret(rs, -1, EAGAIN);
		}
		rs_wait(rs, -1);
	}
	send_owed(rs);
	pthread_mutex_unlock(&rs->lock);
	return (ssize_t)got;
}

/* one WRITE of at most RS_SEG bytes through the send ring, or 0 if none
 * fits now */
static int write_seg(struct rs *rs, const uint8_t *src, size_t n,
		     size_t *took)
{
	uint64_t space = send_space(rs);
	size_t off = (size_t)(rs->whead % rs->ssize), k = n;
	struct ibv_sge sge;
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
	};

	*took = 0;
	if (!space || rs->sq_used >= RS_SQ - 1)
		return 0;
	if (k > space)
		k = (size_t)space;
	if (k > rs->ssize - off)
		k = rs->ssize - off;
	if (k > RS_SEG)
		k = RS_SEG;
	memcpy(rs->sbuf + off, src, k);
	sge = (struct ibv_sge){ .addr = (uintptr_t)(rs->sbuf + off),
				.length = (uint32_t)k, .lkey = rs->smr->lkey };
	wr.wr_id = WRID(WR_DATA, k);
	wr.imm_data = htobe32(IMM(OP_DATA, k));
	wr.wr.rdma.remote_addr = rs->raddr + off;
	wr.wr.rdma.rkey = rs->rkey;
	if (post_send(rs, &wr))
		return -ECONNRESET;
	rs->whead += k;
	*took = k;
	return 0;
}

/* why a connection takes no more data, or 0 */
static int send_err(const struct rs *rs)
{
	if (rs->state == RS_FAILED)
		return rs->err ? rs->err : ECONNRESET;
	if (rs->state != RS_CONNECTED)
		return ENOTCONN;
	if (rs->gone || rs->fin_sent)
		return EPIPE;
	return 0;
}

CMA_EXPORT ssize_t rsend(int s, const void *b, size_t n, int f)
{
	struct rs *rs = rs_lock(s);
	size_t sent = 0, k;
	bool nb;
	int e;

	if (!rs)
		return -1;
	nb = rs->nonblock || (f & MSG_DONTWAIT);
	if (n && !b)
		return rs_unlock_ret(rs, -1, EFAULT);
	for (;;) {
		progress(rs);
		e = send_err(rs);
		if (e) {
			if (sent)
				break;
			return rs_unlock_ret(rs, -1, e);
		}
		while (sent < n) {
			if (write_seg(rs, (const uint8_t *)b + sent, n - sent, &k)) {
				rs_fail(rs, ECONNRESET);
				break;
			}
			if (!k)
				break;
			sent += k;
		}
		if (sent == n || (nb && sent))
			break;
		if (nb)
			return rs_unlock_ret(rs, -1, EAGAIN);
		if (rs->state == RS_CONNECTED)
			rs_wait(rs, -1);
	}
	pthread_mutex_unlock(&rs->lock);
	return (ssize_t)sent;
}

CMA_EXPORT ssize_t rrecvfrom(int s, void *b, size_t n, int f,
			     struct sockaddr *a, socklen_t *l)
{
	(void)a;
	if (l)
		*l = 0;		/* a stream socket names no sender */
	return rrecv(s, b, n, f);
}

CMA_EXPORT ssize_t rsendto(int s, const void *b, size_t n, int f,
			   const struct sockaddr *a, socklen_t l)
{
	(void)a, (void)l;
	return rsend(s, b, n, f);
}

/* readv/writev over rrecv/rsend: the first element may block, the rest
 * take only what is there at once */
static ssize_t vec(int s, const struct iovec *v, int cnt, int f, bool out)
{
	ssize_t total = 0, r;

	if (cnt < 0 || (cnt && !v))
		return fail(EINVAL);
	for (int i = 0; i < cnt; i++) {
		if (!v[i].iov_len)
			continue;
		r = out ? rsend(s, v[i].iov_base, v[i].iov_len, f)
			: rrecv(s, v[i].iov_base, v[i].iov_len, f);
		if (r < 0)
			return total ? total : -1;
		total += r;
		if ((size_t)r < v[i].iov_len || (!out && !r))
			break;
		if (!out)
			f |= MSG_DONTWAIT;
	}
	return total;
}

CMA_EXPORT ssize_t rrecvmsg(int s, struct msghdr *m, int f)
{
	if (!m)
		return fail(EINVAL);
	m->msg_namelen = 0;
	m->msg_controllen = 0;
	m->msg_flags = 0;
	return vec(s, m->msg_iov, (int)m->msg_iovlen, f, false);
}

CMA_EXPORT ssize_t rsendmsg(int s, const struct msghdr *m, int f)
{
	if (!m)
		return fail(EINVAL);
	return vec(s, m->msg_iov, (int)m->msg_iovlen, f, true);
}

CMA_EXPORT ssize_t rread(int s, void *b, size_t n)
{
	return rrecv(s, b, n, 0);
}

CMA_EXPORT ssize_t rreadv(int s, const struct iovec *v, int n)
{
	return vec(s, v, n, 0, false);
}

CMA_EXPORT ssize_t rwrite(int s, const void *b, size_t n)
{
	return rsend(s, b, n, 0);
}

CMA_EXPORT ssize_t rwritev(int s, const struct iovec *v, int n)
{
	return vec(s, v, n, 0, true);
}

/* --- poll and select ------------------------------------------------------- */

static short rs_revents(struct rs *rs, short want)
{
	short ev = 0;

	progress(rs);
	switch (rs->state) {
	case RS_LISTEN:
		if (rs->reqs)
			ev |= POLLIN;
		break;
	case RS_RESOLVING:
	case RS_CONNECTING:
		break;
	case RS_CONNECTED:
		if (readable(rs))
			ev |= POLLIN;
		if (writable(rs))
			ev |= POLLOUT;
		if (rs->gone)
			ev |= POLLHUP;
		break;
	case RS_FAILED:
		ev |= POLLIN | POLLOUT | POLLERR;
		break;
	case RS_NEW:
		ev |= POLLOUT | POLLHUP;	/* as poll(2) on a fresh socket */
		break;
	}
	return ev & (want | POLLERR | POLLHUP);
}

/* one pass: revents of every entry; the count of ready ones */
static int poll_pass(struct pollfd *fds, nfds_t n, bool *os)
{
	int ready = 0;

	for (nfds_t i = 0; i < n; i++) {
		struct rs *rs = rs_get(fds[i].fd);

		fds[i].revents = 0;
		if (!rs) {
			*os = true;
			continue;
		}
		pthread_mutex_lock(&rs->lock);
		fds[i].revents = rs_revents(rs, fds[i].events);
		pthread_mutex_unlock(&rs->lock);
		ready += fds[i].revents != 0;
	}
	return ready;
}

CMA_EXPORT int rpoll(struct pollfd *fds, nfds_t n, int timeout)
{
	uint64_t until = timeout > 0 ? now_ms() + (uint64_t)timeout : 0;
	struct pollfd *w;
	bool os = false;
	int ready;

	if (n && !fds)
		return fail(EFAULT);
	w = calloc(n * 2 + 1, sizeof(*w));
	if (!w)
		return fail(ENOMEM);
	for (;;) {
		nfds_t k = 0;
		int left = -1, r;

		ready = poll_pass(fds, n, &os);
		/* ordinary descriptors: their state now */
		for (nfds_t i = 0; os && i < n; i++)
			if (!rs_get(fds[i].fd))
				w[k++] = fds[i];
		if (k && poll(w, k, 0) > 0) {
			k = 0;
			for (nfds_t i = 0; i < n; i++) {
				if (rs_get(fds[i].fd))
					continue;
				fds[i].revents = w[k++].revents;
				ready += fds[i].revents != 0;
			}
		}
		if (ready || timeout == 0)
			break;
		if (timeout > 0) {
			uint64_t t = now_ms();

			if (t >= until)
				break;
			left = (int)(until - t);
		}
		/* sleep on everything: arm each rsocket's CQ first */
		k = 0;
		for (nfds_t i = 0; i < n; i++) {
			struct rs *rs = rs_get(fds[i].fd);

			if (!rs) {
				w[k++] = fds[i];
				continue;
			}
			pthread_mutex_lock(&rs->lock);
			if (rs_arm(rs) > 0)
				left = 0;
			k += (nfds_t)rs_pollfds(rs, &w[k]);
			pthread_mutex_unlock(&rs->lock);
		}
		r = poll(w, k, left);
		if (r < 0 && errno != EINTR) {
			ready = -1;
			break;
		}
		if (r < 0) {
			ready = -1;	/* EINTR, as poll(2) */
			break;
		}
	}
	free(w);
	return ready;
}

CMA_EXPORT int rselect(int nfds, fd_set *r, fd_set *w, fd_set *e,
		       struct timeval *t)
{
	struct pollfd *p;
	int n = 0, ready, ms = t ? (int)(t->tv_sec * 1000 + t->tv_usec / 1000)
				 : -1;

	if (nfds < 0 || nfds > FD_SETSIZE)
		return fail(EINVAL);
	p = calloc((size_t)nfds + 1, sizeof(*p));
	if (!p)
		return fail(ENOMEM);
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (r && FD_ISSET(fd, r))
			ev |= POLLIN;
		if (w && FD_ISSET(fd, w))
			ev |= POLLOUT;
		if (e && FD_ISSET(fd, e))
			ev |= POLLPRI;
		if (ev)
			p[n++] = (struct pollfd){ .fd = fd, .events = ev };
	}
	ready = rpoll(p, (nfds_t)n, ms);
	if (ready < 0) {
		free(p);
		return -1;
	}
	if (r)
		FD_ZERO(r);
	if (w)
		FD_ZERO(w);
	if (e)
		FD_ZERO(e);
	ready = 0;
	for (int i = 0; i < n; i++) {
		if (r && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(p[i].fd, r);
			ready++;
		}
		if (w && (p[i].revents & (POLLOUT | POLLERR))) {
			FD_SET(p[i].fd, w);
			ready++;
		}
		if (e && (p[i].revents & POLLPRI)) {
			FD_SET(p[i].fd, e);
			ready++;
		}
	}
	free(p);
	return ready;
}

/* --- names, options, fcntl ------------------------------------------------- */

static int name(int s, struct sockaddr *a, socklen_t *l, bool peer)
{
	struct rs *rs = rs_lock(s);
	struct sockaddr *src;

	if (!rs)
		return -1;
	if (!a || !l)
		return rs_unlock_ret(rs, -1, EFAULT);
	if (peer && rs->state != RS_CONNECTED && rs->state != RS_FAILED)
		return rs_unlock_ret(rs, -1, ENOTCONN);
	src = peer ? rdma_get_peer_addr(rs->id) : rdma_get_local_addr(rs->id);
	fill_addr(src, a, l);
	return rs_unlock_ret(rs, 0, 0);
}

CMA_EXPORT int rgetpeername(int s, struct sockaddr *a, socklen_t *l)
{
	return name(s, a, l, true);
}

CMA_EXPORT int rgetsockname(int s, struct sockaddr *a, socklen_t *l)
{
	return name(s, a, l, false);
}

/* the int an option is stored in, or NULL if rsockets has no such one */
static int *opt_int(struct rs *rs, int lv, int o)
{
	if (lv == SOL_SOCKET && o == SO_KEEPALIVE)
		return &rs->keepalive;
	if (lv == IPPROTO_TCP && o == TCP_NODELAY)
		return &rs->nodelay;
	if (lv == IPPROTO_TCP && o == TCP_KEEPIDLE)
		return &rs->keepidle;
	if (lv == SOL_RDMA && o == RDMA_IOMAPSIZE)
		return &rs->iomap_size;
	return NULL;
}

static uint32_t *opt_u32(struct rs *rs, int lv, int o)
{
	if (lv == SOL_SOCKET && o == SO_SNDBUF)
		return &rs->sndbuf;
	if (lv == SOL_SOCKET && o == SO_RCVBUF)
		return &rs->rcvbuf;
	if (lv == SOL_RDMA && o == RDMA_INLINE)
		return &rs->inline_size;
	return NULL;
}

CMA_EXPORT int rsetsockopt(int s, int lv, int o, const void *v, socklen_t l)
{
	struct rs *rs = rs_lock(s);
	int val, r = 0, *ip;
	uint32_t *up;

	if (!rs)
		return -1;
	if (!v || l < sizeof(int))
		return rs_unlock_ret(rs, -1, EINVAL);
	memcpy(&val, v, sizeof(val));
	if ((ip = opt_int(rs, lv, o))) {
		if (ip == &rs->iomap_size && (val < 0 || val > RS_IOMAP_MAX))
			r = -EINVAL;
		else
			*ip = val;
	} else if ((up = opt_u32(rs, lv, o))) {
		if (val < 0)
			r = -EINVAL;
		else if (up == &rs->inline_size)
			*up = (uint32_t)val;
		else if (rs->state != RS_NEW && rs->state != RS_LISTEN)
			r = 0;	/* the rings exist: as Linux, too late to matter */
		else	/* Linux doubles what it is given, within its bounds */
			*up = (uint32_t)val * 2 < RS_BUF_MIN ? RS_BUF_MIN :
			      (uint32_t)val * 2 > RS_BUF_MAX ? RS_BUF_MAX :
			      (uint32_t)val * 2;
	} else if (lv == SOL_SOCKET && o == SO_REUSEADDR) {
		r = rdma_set_option(rs->id, RDMA_OPTION_ID,
				    RDMA_OPTION_ID_REUSEADDR, &val, sizeof(val))
			? -errno : 0;
	} else if (lv == IPPROTO_IPV6 && o == IPV6_V6ONLY) {
		r = rdma_set_option(rs->id, RDMA_OPTION_ID,
				    RDMA_OPTION_ID_AFONLY, &val, sizeof(val))
			? -errno : 0;
	} else if ((lv == SOL_SOCKET && o == SO_LINGER) ||
		   (lv == SOL_RDMA && (o == RDMA_SQSIZE || o == RDMA_RQSIZE))) {
		r = 0;		/* accepted; the queues have fixed depths */
	} else {
		r = -ENOPROTOOPT;
	}
	return rs_unlock_ret(rs, r ? -1 : 0, -r);
}

CMA_EXPORT int rgetsockopt(int s, int lv, int o, void *v, socklen_t *l)
{
	struct rs *rs = rs_lock(s);
	int val, *ip;
	uint32_t *up;

	if (!rs)
		return -1;
	if (!v || !l || *l < sizeof(int))
		return rs_unlock_ret(rs, -1, EINVAL);
	progress(rs);
	if ((ip = opt_int(rs, lv, o))) {
		val = *ip;
	} else if ((up = opt_u32(rs, lv, o))) {
		val = (int)*up;
	} else if (lv == SOL_SOCKET && o == SO_ERROR) {
		val = rs->err;
		rs->err = 0;
	} else if (lv == SOL_SOCKET && o == SO_TYPE) {
		val = SOCK_STREAM;
	} else if (lv == IPPROTO_TCP && o == TCP_MAXSEG) {
		val = RS_SEG;
	} else if (lv == SOL_RDMA && o == RDMA_SQSIZE) {
		val = RS_SQ;
	} else if (lv == SOL_RDMA && o == RDMA_RQSIZE) {
		val = RS_RQ;
	} else {
		return rs_unlock_ret(rs, -1, ENOPROTOOPT);
	}
	memcpy(v, &val, sizeof(val));
	*l = sizeof(val);
	return rs_unlock_ret(rs, 0, 0);
}

CMA_EXPORT int rfcntl(int s, int cmd, ...)
{
	struct rs *rs = rs_lock(s);
	va_list ap;
	int arg, r = 0;

	if (!rs)
		return -1;
	switch (cmd) {
	case F_GETFL:
		r = O_RDWR | (rs->nonblock ? O_NONBLOCK : 0);
		break;
	case F_SETFL:
		va_start(ap, cmd);
		arg = va_arg(ap, int);
		va_end(ap);
		rs->nonblock = arg & O_NONBLOCK;
		break;
	default:
		return rs_unlock_ret(rs, -1, ENOSYS);
	}
	return rs_unlock_ret(rs, r, 0);
}

/* --- riomap, riowrite ------------------------------------------------------ */

/* Maps buf for the peer's riowrite at offset (-1: at buf's address) and
 * tells the peer. As in rdma-core, RDMA_IOMAPSIZE (set before the
 * connection; 0 by default) is how many maps this side may make; the
 * handshake tells the peer, which takes no more. */
CMA_EXPORT off_t riomap(int s, void *b, size_t n, int p, int f, off_t o)
{
	struct rs *rs = rs_lock(s);
	struct rs_iomap_msg m;
	struct rs_map *lm;
	int slot = 0;

	if (!rs)
		return -1;
	if (p != PROT_WRITE || f || !b || !n)
		return rs_unlock_ret(rs, -1, EINVAL);
	if (rs->state != RS_CONNECTED)
		return rs_unlock_ret(rs, -1, ENOTCONN);
	while (rs->sq_used >= RS_SQ && rs->state == RS_CONNECTED)
		rs_wait(rs, 50);
	if (rs->state != RS_CONNECTED)
		return rs_unlock_ret(rs, -1, send_err(rs));
	while (slot < rs->lslots && rs->lmap[slot].len)
		slot++;
	if (slot == rs->lslots)
		return rs_unlock_ret(rs, -1, ENOMEM);
	lm = &rs->lmap[slot];
	lm->mr = ibv_reg_mr(rs->pd, b, n,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!lm->mr)
		return rs_unlock_ret(rs, -1, errno);
	lm->offset = o == -1 ? (uintptr_t)b : (uint64_t)o;
	lm->addr = (uintptr_t)b;
	lm->len = n;
	m = (struct rs_iomap_msg){
		.offset = htobe64(lm->offset), .addr = htobe64(lm->addr),
		.len = htobe64(n), .rkey = htobe32(lm->mr->rkey),
		.slot = htobe32((uint32_t)slot),
	};
	if (post_ctrl(rs, IMM(OP_IOMAP, 0), &m, sizeof(m))) {
		dereg(&lm->mr, NULL);
		return rs_unlock_ret(rs, -1, ECONNRESET);
	}
	pthread_mutex_unlock(&rs->lock);
	return (off_t)lm->offset;
}

/* The peer is not told: a riowrite it makes afterwards fails its QP, as
 * with rdma-core's rsockets. */
CMA_EXPORT int riounmap(int s, void *b, size_t n)
{
	struct rs *rs = rs_lock(s);

	if (!rs)
		return -1;
	for (int i = 0; i < RS_IOMAP_MAX; i++) {
		if (!rs->lmap[i].len || rs->lmap[i].addr != (uintptr_t)b ||
		    rs->lmap[i].len != n)
			continue;
		dereg(&rs->lmap[i].mr, NULL);
		rs->lmap[i].len = 0;
		return rs_unlock_ret(rs, 0, 0);
	}
	return rs_unlock_ret(rs, -1, EINVAL);
}

static const struct rs_map *rmap_find(const struct rs *rs, uint64_t o,
				      size_t n)
{
	for (int i = 0; i < RS_IOMAP_MAX; i++) {
		const struct rs_map *m = &rs->rmap[i];

		if (m->len && o >= m->offset && n <= m->len &&
		    o - m->offset <= m->len - n)
			return m;
	}
	return NULL;
}

static int io_seg(struct rs *rs, const struct rs_map *m, const uint8_t *src,
		  size_t n, uint64_t o, size_t *took)
{
	uint64_t space = RS_IOBUF - (rs->iohead - rs->iodone);
	size_t off = (size_t)(rs->iohead % RS_IOBUF), k = n;
	struct ibv_sge sge;
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE };

	*took = 0;
	if (!space || rs->sq_used >= RS_SQ - 1)
		return 0;
	if (k > space)
		k = (size_t)space;
	if (k > RS_IOBUF - off)
		k = RS_IOBUF - off;
	if (k > RS_SEG)
		k = RS_SEG;
	memcpy(rs->iobuf + off, src, k);
	sge = (struct ibv_sge){ .addr = (uintptr_t)(rs->iobuf + off),
				.length = (uint32_t)k, .lkey = rs->iomr->lkey };
	wr.wr_id = WRID(WR_IO, k);
	wr.wr.rdma.remote_addr = m->addr + (o - m->offset);
	wr.wr.rdma.rkey = m->rkey;
	if (post_send(rs, &wr))
		return -ECONNRESET;
	rs->iohead += k;
	*took = k;
	return 0;
}

/* Writes count bytes into the peer's riomap()ed buffer at offset; the
 * bytes are ordered before anything rsend()s afterwards (one RC QP). */
CMA_EXPORT size_t riowrite(int s, const void *b, size_t n, off_t o, int f)
{
	struct rs *rs = rs_lock(s);
	const struct rs_map *m;
	size_t sent = 0, k;
	bool nb;
	int e;

	if (!rs)
		return (size_t)-1;
	nb = rs->nonblock || (f & MSG_DONTWAIT);
	if ((n && !b) || o < 0)
		return (size_t)rs_unlock_ret(rs, -1, EINVAL);
	progress(rs);
	m = rmap_find(rs, (uint64_t)o, n);
	if (!m)
		return (size_t)rs_unlock_ret(rs, -1, send_err(rs) ?: EINVAL);
	if (!rs->iobuf) {
		rs->iobuf = ralloc(RS_IOBUF);
		rs->iomr = rs->iobuf ? ibv_reg_mr(rs->pd, rs->iobuf, RS_IOBUF, 0)
				     : NULL;
		if (!rs->iomr) {
			dereg(&rs->iomr, &rs->iobuf);
			return (size_t)rs_unlock_ret(rs, -1, ENOMEM);
		}
	}
	for (;;) {
		e = send_err(rs);
		if (e) {
			if (sent)
				break;
			return (size_t)rs_unlock_ret(rs, -1, e);
		}
		while (sent < n) {
			if (io_seg(rs, m, (const uint8_t *)b + sent, n - sent,
				   (uint64_t)o + sent, &k)) {
				rs_fail(rs, ECONNRESET);
				break;
			}
			if (!k)
				break;
			sent += k;
		}
		if (sent == n || (nb && sent))
			break;
		if (nb)
			return (size_t)rs_unlock_ret(rs, -1, EAGAIN);
		if (rs->state == RS_CONNECTED)
			rs_wait(rs, -1);
		progress(rs);
	}
	pthread_mutex_unlock(&rs->lock);
	return sent;
}
