// SPDX-License-Identifier: MIT
/*
 * shm.c - the same-host transport between processes (design in shm.h and
 * docs/design.md).
 *
 * One request is outstanding per channel (stop and wait): a requester QP
 * executes its WQEs in order anyway, and a channel belongs to one requester
 * QP. Sequence numbers make retransmission safe: the responder executes a
 * request only when its seq is the next expected one, answers a repeat of
 * the previous one from its saved answer (so a retried atomic is not applied
 * twice), and ignores anything else.
 */
#include "shm.h"

#include "../core/pub.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

struct ursa_shm_up ursa_shm_up;

static const uint64_t probe_value = 0x7572736170726f62ull; /* "ursaprob" */
static volatile uint64_t probe_word = 0x7572736170726f62ull;

static void sock_name(struct sockaddr_un *sa, socklen_t *len, uint32_t qpn)
{
	int n;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* abstract namespace: sun_path starts with a NUL byte */
	n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
		     "ursa/qp/%06x", qpn & 0xffffff);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int epoll_add(struct ursa_shm_eng *e, int fd, struct ursa_watch *w,
		     uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = w };

	return epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

int ursa_shm_listen(struct ursa_qp *qp, uint32_t qpn)
{
	struct sockaddr_un sa;
	struct ursa_watch *w;
	socklen_t len;
	int fd, ret;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	sock_name(&sa, &len, qpn);
	if (bind(fd, (struct sockaddr *)&sa, len) || listen(fd, 64)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		close(fd);
		return -ENOMEM;
	}
	w->kind = URSA_W_LISTEN;
	w->ptr = qp;
	qp->listen_fd = fd;
	qp->listen_watch = w;
	if (qp->ctx->shm) {
		ret = epoll_add(qp->ctx->shm, fd, w, EPOLLIN);
		if (ret) {
			close(fd);
			free(w);
			qp->listen_fd = -1;
			qp->listen_watch = NULL;
			return ret;
		}
	}
	return 0;
}

void ursa_shm_unlisten(struct ursa_qp *qp)
{
	struct ursa_shm_eng *e = qp->ctx->shm;
	struct ursa_watch *w = qp->listen_watch;

	if (qp->listen_fd >= 0) {
		if (e)
			epoll_ctl(e->epfd, EPOLL_CTL_DEL, qp->listen_fd, NULL);
		close(qp->listen_fd);
	}
	qp->listen_fd = -1;
	qp->listen_watch = NULL;
	if (!w)
		return;
	/* freed by the engine, like channels (see chan_free) */
	w->ptr = NULL;
	if (e) {
		w->next = e->grave_watches;
		e->grave_watches = w;
	} else {
		free(w);
	}
}

static void chan_release(struct ursa_chan *c)
{
	if (c->mem)
		munmap(c->mem, sizeof(*c->mem));
	if (c->peer_ctl)
		munmap(c->peer_ctl, sizeof(*c->peer_ctl));
	if (c->peer_efd >= 0)
		close(c->peer_efd);
	ursa_pub_unmap(c->dpub);
	for (uint32_t i = 0; i < URSA_DMAPS; i++)
		if (c->dmap[i].base)
			munmap(c->dmap[i].base, c->dmap[i].len);
	ursa_rstate_drop(&c->rs);
	free(c->last_resp);
	free(c);
}

/*
 * Channels are freed in two steps: closing takes the socket out of the
 * engine's epoll set and marks the channel closed; the memory is released
 * by the engine itself at the start of its next pass (ursa_shm_reap). An
 * event the engine already fetched may still name the channel; it finds it
 * closed and ignores it.
 */
static void chan_free(struct ursa_shm_eng *e, struct ursa_chan *c)
{
	if (c->sock >= 0) {
		if (e)
			epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->sock, NULL);
		close(c->sock);
		c->sock = -1;
	}
	c->closed = true;
	c->state = URSA_CHAN_DEAD;
	if (!e) {
		chan_release(c);
		return;
	}
	c->next = e->grave;
	e->grave = c;
}

void ursa_shm_reap(struct ursa_shm_eng *e)
{
	while (e->grave) {
		struct ursa_chan *c = e->grave;

		e->grave = c->next;
		c->sock = -1;
		chan_release(c);
	}
	while (e->grave_watches) {
		struct ursa_watch *w = e->grave_watches;

		e->grave_watches = w->next;
		free(w);
	}
}

void ursa_shm_engine_forget(struct ursa_shm_eng *e)
{
	for (struct ursa_chan *c = e->served; c; c = c->next) {
		if (c->sock >= 0)
			close(c->sock);
		c->sock = -1;
	}
	e->epfd = -1;
}

void ursa_shm_engine_fini(struct ursa_shm_eng *e)
{
	while (e->served) {
		struct ursa_chan *c = e->served;

		e->served = c->next;
		chan_free(e, c);
	}
	ursa_shm_reap(e);
	free(e->snap);
	e->snap = NULL;
}

static void chan_dead(struct ursa_shm_eng *e, struct ursa_chan *c)
{
	if (c->state == URSA_CHAN_DEAD)
		return;
	ursa_dbg("channel qp %u <-> qp %u: peer pid %d gone",
		 c->qp ? c->qp->ex.qp_base.qp_num : 0, c->peer_qpn,
		 (int)c->peer_pid);
	c->state = URSA_CHAN_DEAD;
	c->dead_ns = ursa_now_ns();
	if (c->sock >= 0) {
		epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->sock, NULL);
		close(c->sock);
		c->sock = -1;
	}
	ursa_rstate_drop(&c->rs);
}

/*
 * The doorbell is skipped when the peer's engine sleeps but will wake by
 * itself anyway:
 * - within URSA_SHM_RING_SOON_NS (20 µs): the write(2) and the wake-up it
 *   causes would gain the request no more than that (a same-host SEND to a
 *   server blocked on its completion channel, bench/kv.sh: docs/design.md);
 * - or within URSA_RING_WAKE_US (2000) while an application thread of the
 *   peer polled in the last URSA_RING_APP_US (50 µs; 0 turns this skip
 *   off): that thread's next pass serves the ring (a same-host SEND
 *   ping-pong paid a write(2) and an engine wake-up per message, most of
 *   its latency). A thread polls only while its CQ is not armed; arming
 *   (ibv_req_notify_cq, before it blocks) withdraws it and serves what a
 *   poster left meanwhile (ursa_engine_app_blocks). One that stops
 *   polling without arming leaves a request to the engine's own wake-up.
 * Either way the wait is bounded by the engine's timer, never unbounded.
 */

static void ring_peer(struct ursa_chan *c)
{
	uint64_t one = 1, now;

	/* Pairs with the peer engine's fence between setting "sleeping"
	 * (after wake_by) and its last look at the rings (engine.c). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!c->peer_ctl || c->peer_efd < 0 ||
	    !atomic_load_explicit(&c->peer_ctl->sleeping, memory_order_acquire))
		return;
	/* (acquire: the wake_by the engine stored before "sleeping") */
	now = ursa_now_ns();
	if (c->peer_ctl->version >= 2) {
		const struct ursa_config *cfg = ursa_cfg();
		uint64_t wake = atomic_load_explicit(&c->peer_ctl->wake_by,
						     memory_order_relaxed);

		if (wake < now + URSA_SHM_RING_SOON_NS ||
		    (now - atomic_load_explicit(&c->peer_ctl->app_poll_ns,
						memory_order_relaxed) <
		     (uint64_t)cfg->ring_app_us * 1000 &&
		     wake < now + (uint64_t)cfg->ring_wake_us * 1000))
			return;
	}
	if (write(c->peer_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ursa_dbg("doorbell to pid %d: %s", (int)c->peer_pid,
			 strerror(errno));
}

/* --- requester side ------------------------------------------------------ */

static int send_fds(int sock, const void *msg, size_t len, const int *fds,
		    int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { (void *)msg, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;

	memset(cbuf, 0, sizeof(cbuf));
	mh.msg_control = cbuf;
	mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/* Receive one message and up to max fds; returns the payload length or
 * -errno. Closes fds beyond max. */
static ssize_t recv_fds(int sock, void *msg, size_t len, int *fds, int max,
			int *nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 8)];
	struct iovec iov = { msg, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

	*nfds = 0;
	if (n < 0)
		return -errno;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm;
	     cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *in = (int *)CMSG_DATA(cm);

		for (int i = 0; i < cnt; i++) {
			if (*nfds < max)
				fds[(*nfds)++] = in[i];
			else
				close(in[i]);
		}
	}
	return n;
}

/* chan_connect: the hello, with our ring's memfd and our engine's control
 * page and doorbell. Returns as send_fds. */
static int send_hello(struct ursa_qp *qp, int sock, uint32_t dqpn, int memfd)
{
	struct ursa_shm_eng *e = qp->ctx->shm;
	struct ursa_shm_hello h = { 0 };
	int fds[3];

	h.magic = URSA_SHM_MAGIC;
	h.version = URSA_SHM_VERSION;
	h.src_qpn = qp->ex.qp_base.qp_num;
	h.dst_qpn = dqpn;
	h.qp_type = qp->ex.qp_base.qp_type;
	h.probe_addr = (uintptr_t)&probe_word;
	h.probe_val = probe_value;
	fds[0] = memfd;
	fds[1] = e->ctl_fd;
	fds[2] = e->efd;
	return send_fds(sock, &h, sizeof(h), fds, 3);
}

static struct ursa_chan *chan_connect(struct ursa_qp *qp, uint32_t dqpn)
{
	struct ursa_shm_eng *e = qp->ctx->shm;
	struct sockaddr_un sa;
	struct ursa_chan *c;
	socklen_t len;
	int memfd;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->role = URSA_CHAN_REQUESTER;
	c->state = URSA_CHAN_CONNECTING;
	c->qp = qp;
	c->peer_qpn = dqpn;
	c->peer_efd = -1;
	c->watch.kind = URSA_W_CHAN;
	c->watch.ptr = c;
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->sock < 0)
		goto fail;
	sock_name(&sa, &len, dqpn);
	if (connect(c->sock, (struct sockaddr *)&sa, len))
		goto fail;	/* no such QPN on this host (or backlog full) */
	/* Both sides write the rings; its size is sealed. */
	memfd = ursa_memfd_shared("ursa-chan", sizeof(*c->mem), false,
				  (void **)&c->mem);
	if (memfd < 0) {
		errno = -memfd;
		c->mem = NULL;
		goto fail;
	}
	c->mem->magic = URSA_SHM_MAGIC;
	c->mem->version = URSA_SHM_VERSION;
	if (send_hello(qp, c->sock, dqpn, memfd)) {
		close(memfd);
		goto fail;
	}
	close(memfd);
	if (epoll_add(e, c->sock, &c->watch, EPOLLIN | EPOLLRDHUP))
		goto fail;
	c->next = qp->chans;
	qp->chans = c;
	return c;
fail:
	ursa_dbg("qp %u: cannot reach qp %u on this host: %s",
		 qp->ex.qp_base.qp_num, dqpn, strerror(errno));
	chan_free(NULL, c);
	return NULL;
}

/*
 * Can we open the target's descriptor n through /proc, and is it the file
 * we hold as mine? That is how MR memfds are reached (chan_dmap), so this
 * connect-time probe on the table's memfd tells whether mapping works
 * here (ptrace rules, a seccomp filter on open, another PID namespace).
 */
static int peer_fd_open(pid_t pid, int n, int flags)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, n);
	return open(path, flags | O_CLOEXEC);
}

static bool proc_fd_same(pid_t pid, int n, int mine)
{
	struct stat a, b;
	bool same;
	int fd;

	if (n < 0)
		return false;
	fd = peer_fd_open(pid, n, O_RDONLY);
	if (fd < 0)
		return false;
	same = !fstat(fd, &a) && !fstat(mine, &b) && a.st_ino == b.st_ino &&
	       a.st_dev == b.st_dev;
	close(fd);
	return same;
}

/*
 * Direct path: may this requester place data in the target itself? It needs
 * the target's table (pub.h) and the target QP's word in it; then either MR
 * pages it can map (shmap.h, opened per MR on first use) or permission to
 * use cross-memory attach on the target, which it probes on a word whose
 * value the target told it.
 */
static void direct_setup(struct ursa_chan *c, int fd,
			 const struct ursa_shm_welcome *wl)
{
	uint64_t v = 0;
	struct iovec l = { &v, 8 },
		     rv = { (void *)(uintptr_t)wl->probe_addr, 8 };

	if (wl->qp_slot < 0 || (uint32_t)wl->qp_slot >= URSA_PUB_QPS ||
	    !ursa_cfg()->direct)
		return;
	c->dcma = ursa_cfg()->cma &&
		  process_vm_readv(c->peer_pid, &l, 1, &rv, 1, 0) == 8 &&
		  v == wl->probe_val;
	c->dnomap = !ursa_cfg()->map ||
		    !proc_fd_same(c->peer_pid, wl->pub_fd, fd);
	if (!c->dcma && c->dnomap)
		return;
	c->dpub = ursa_pub_map(fd);
	c->dslot = (uint32_t)wl->qp_slot;
}

/* The target's answer to our hello. */
static void chan_welcome(struct ursa_shm_eng *e, struct ursa_chan *c)
{
	struct ursa_shm_welcome wl;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	int fds[3], nfds;
	ssize_t n = recv_fds(c->sock, &wl, sizeof(wl), fds, 3, &nfds);

	if (n == -EAGAIN)
		return;
	if (n != (ssize_t)sizeof(wl) || nfds < 2 || wl.magic != URSA_SHM_MAGIC ||
	    wl.version != URSA_SHM_VERSION || wl.status ||
	    getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		chan_dead(e, c);
		return;
	}
	c->peer_ctl = ursa_memfd_map_peer(fds[0], sizeof(*c->peer_ctl),
					  F_SEAL_FUTURE_WRITE, false);
	close(fds[0]);
	c->peer_efd = fds[1];
	if (!c->peer_ctl) {
		chan_dead(e, c);
		return;
	}
	c->peer_pid = cred.pid;
	c->peer_uid = cred.uid;
	c->cma = wl.cma_ok;
	if (nfds == 3) {
		direct_setup(c, fds[2], &wl);
		close(fds[2]);
	}
	c->state = URSA_CHAN_READY;
	c->was_ready = true;
	ursa_dbg("qp %u -> qp %u (pid %d): channel ready, %s%s",
		 c->qp->ex.qp_base.qp_num, c->peer_qpn, (int)c->peer_pid,
		 c->cma ? "cross-memory attach" : "copies through shared memory",
		 !c->dpub ? "" : c->dcma ? ", direct WRITE/READ" :
		 ", direct WRITE/READ in mapped MRs only");
}

static struct ursa_chan *chan_for(struct ursa_qp *qp, uint32_t dqpn)
{
	struct ursa_chan **pp, *c;
	int n = 0;

	for (pp = &qp->chans; (c = *pp); pp = &c->next, n++) {
		if (c->peer_qpn != dqpn)
			continue;
		/* A dead channel to a QPN is retried once the peer may be
		 * back (a RESET/RTR cycle, or a new process); a connected
		 * QP's channel only if it never got past the handshake (the
		 * target refused it, or could not verify us yet), not
		 * sooner than 10 ms after: a peer that died while connected
		 * stays dead to it. */
		if (c->state == URSA_CHAN_DEAD &&
		    (qp->ex.qp_base.qp_type == IBV_QPT_UD ||
		     (!c->was_ready && ursa_now_ns() - c->dead_ns > 10000000ull))) {
			*pp = c->next;
			chan_free(qp->ctx->shm, c);
			break;
		}
		return c;
	}
	/* UD talks to many QPs: keep at most 64 channels. */
	if (n >= 64 && qp->chans) {
		struct ursa_chan **last = &qp->chans;

		while ((*last)->next)
			last = &(*last)->next;
		chan_free(qp->ctx->shm, *last);
		*last = NULL;
	}
	return chan_connect(qp, dqpn);
}

void ursa_shm_qp_close(struct ursa_qp *qp)
{
	struct ursa_shm_eng *e = qp->ctx->shm;

	while (qp->chans) {
		struct ursa_chan *c = qp->chans;

		qp->chans = c->next;
		chan_free(e, c);
	}
	/* Channels others opened to this QP go too: their owners see the
	 * socket close, as if this QP's process had died. */
	if (e) {
		for (struct ursa_chan **pp = &e->served; *pp;) {
			struct ursa_chan *c = *pp;

			if (c->qp == qp) {
				*pp = c->next;
				chan_free(e, c);
			} else {
				pp = &c->next;
			}
		}
	}
}

static uint64_t ack_timeout(struct ursa_qp *qp)
{
	/* UC and UD have no ACK timeout; bound the wait for the target's
	 * "done reading" answer so a stuck peer cannot block the queue. */
	if (qp->ex.qp_base.qp_type != IBV_QPT_RC)
		return 100000000ull;
	return ursa_ack_timeout_ns(qp->attr.timeout);
}

/* push_request: the request's own fields, in slot q. */
static void wreq_header(struct ursa_wreq *q, const struct ursa_chan *c,
			const struct ursa_req *r)
{
	memset(q, 0, offsetof(struct ursa_wreq, sg));
	q->seq = c->seq;
	q->opcode = r->opcode;
	q->src_qpn = r->src_qpn;
	q->dst_qpn = c->peer_qpn;
	q->qkey = r->qkey;
	q->rkey = r->rkey;
	q->imm = r->imm;
	q->compare_add = r->compare_add;
	q->swap = r->swap;
	memcpy(q->sgid, r->sgid.raw, 16);
	memcpy(q->dgid, r->dgid.raw, 16);
	q->tclass = r->traffic_class;
	q->hop = r->hop_limit;
	q->flow = r->flow_label;
	q->flags = (r->solicited ? WF_SOLICITED : 0) |
		   (r->has_imm ? WF_IMM : 0) | (r->invalidate ? WF_INV : 0);
	q->msg_len = r->msg_len;
}

/* push_request: what slot q carries from offset off of the message (the
 * fragment's data, or the whole message's SGEs for cross-memory attach);
 * returns the length it covers. */
static uint64_t wreq_payload(struct ursa_qp *qp, const struct ursa_chan *c,
			     struct ursa_wreq *q, const struct ursa_req *r,
			     uint64_t off)
{
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	bool at = r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	uint64_t total = r->msg_len, flen;
	struct ursa_sg part[URSA_MAX_SGE];

	if (at) {
		flen = 8;
		q->frag = URSA_FRAG_ONLY;
	} else if (total <= URSA_SHM_INLINE || !c->cma) {
		/* Through the slot, in fragments if need be. */
		flen = MIN(total - off, (uint64_t)URSA_SHM_INLINE);
		q->frag = (off == 0 ? URSA_FRAG_FIRST : 0) |
			  (off + flen == total ? URSA_FRAG_LAST : 0);
		if (!rd && flen) {
			struct ursa_sg d = { (uintptr_t)q->data, flen };
			uint32_t k = ursa_sg_slice(r->src, r->nsrc, off, flen, part);

			ursa_sg_copy(&d, 1, part, k, flen);
			q->inline_len = (uint32_t)flen;
		}
		atomic_fetch_add(&qp->cnt.ring_bytes, flen);
	} else {
		/* One request for the whole message: the target copies it
		 * straight between the MRs. */
		const struct ursa_sg *l = rd ? r->dst : r->src;
		uint32_t n = rd ? r->ndst : r->nsrc;

		flen = total;
		q->frag = URSA_FRAG_ONLY;
		q->flags |= WF_CMA;
		q->nsg = ursa_sg_slice(l, n, 0, total, part);
		for (uint32_t i = 0; i < q->nsg; i++) {
			q->sg[i].va = part[i].va;
			q->sg[i].len = part[i].len;
		}
		atomic_fetch_add(&qp->cnt.cma_bytes, flen);
	}
	return flen;
}

static void push_request(struct ursa_qp *qp, struct ursa_chan *c,
			 struct ursa_send_wqe *w, const struct ursa_req *r,
			 uint64_t now)
{
	struct ursa_chanmem *m = c->mem;
	uint32_t tail = atomic_load_explicit(&m->req_tail, memory_order_relaxed);
	uint32_t head = atomic_load_explicit(&m->req_head, memory_order_acquire);
	struct ursa_wreq *q = &m->req[tail % URSA_SHM_SLOTS];
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	uint64_t off = w->shm.xfer_off;

	w->inflight = true;
	w->deadline_ns = ack_timeout(qp) == UINT64_MAX ? UINT64_MAX :
						       now + ack_timeout(qp);
	if (tail - head >= URSA_SHM_SLOTS) {
		/* Earlier transmissions still queued (a slow responder):
		 * this one is "lost"; the ACK timeout sends it again. */
		return;
	}
	wreq_header(q, c, r);
	q->len = wreq_payload(qp, c, q, r, off);
	q->offset = off;
	q->raddr = r->remote_addr + (rd || r->opcode == IBV_WR_RDMA_WRITE ||
				     r->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ?
				     off : 0);
	/* Release: the slot is complete before the responder sees it. */
	atomic_store_explicit(&m->req_tail, tail + 1, memory_order_release);
	ring_peer(c);
	atomic_store_explicit(&qp->shm_hint, &m->req[(tail + 1) % URSA_SHM_SLOTS],
			      memory_order_relaxed);
}

void ursa_shm_prefetch_next(struct ursa_qp *qp)
{
	const uint8_t *q = atomic_load_explicit(&qp->shm_hint,
						memory_order_relaxed);

	if (!q)
		return;
	/* the header's lines and the first of the inline data: what a
	 * small SEND writes */
	for (size_t o = 0; o < offsetof(struct ursa_wreq, sg); o += 64)
		ursa_prefetch_write(q + o);
	ursa_prefetch_write(q + offsetof(struct ursa_wreq, data));
}

/* chan_dmap: is fd, the target's descriptor we opened, the memfd its
 * table names? We opened it with our rights, which may exceed the
 * target's: it must be a memfd the target itself created and sealed (only
 * memfds take F_SEAL_SHRINK), never a file it merely holds open. */
static bool dmap_fd_ok(const struct ursa_chan *c, const struct ursa_pub_mr *e,
		       int fd)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);

	if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_ino != e->map_ino || st.st_uid != c->peer_uid ||
	    (uint64_t)st.st_size < e->map_len || seals < 0 ||
	    !(seals & F_SEAL_SHRINK) || (seals & F_SEAL_WRITE))
		return false;
	return true;
}

/*
 * The target's memfd holding an MR's pages (shmap.h), mapped here: found by
 * inode among those this channel mapped before, else opened through /proc
 * (which needs the right to read the target's descriptors, not ptrace
 * attach) and checked: the inode the table names, sealed against shrinking,
 * at least as long as the table says. NULL when it cannot be had.
 */
static uint8_t *chan_dmap(struct ursa_chan *c, const struct ursa_pub_mr *e)
{
	struct ursa_dmap *d;
	void *p;
	int fd;

	for (uint32_t i = 0; i < URSA_DMAPS; i++)
		if (c->dmap[i].base && c->dmap[i].ino == e->map_ino &&
		    c->dmap[i].len == e->map_len)
			return c->dmap[i].base;
	if (c->dnomap || e->map_fd < 0 || e->map_len > URSA_MAX_MR_SIZE)
		return NULL;
	fd = peer_fd_open(c->peer_pid, e->map_fd, O_RDWR);
	if (fd < 0) {
		/* Refused (ptrace rules), or the pid is not the peer's here
		 * (another PID namespace): not again on this channel, or
		 * every WRITE would pay a failing open. Running out of
		 * descriptors passes. */
		if (errno != EMFILE && errno != ENFILE && errno != ENOMEM &&
		    errno != EINTR) {
			ursa_dbg("qp %u -> qp %u: cannot map the target's MRs: %s",
				 c->qp->ex.qp_base.qp_num, c->peer_qpn,
				 strerror(errno));
			c->dnomap = true;
		}
		return NULL;
	}
	/* Anything but the target's memfd is a broken peer: no mapping on
	 * this channel. */
	if (!dmap_fd_ok(c, e, fd)) {
		close(fd);
		c->dnomap = true;
		return NULL;
	}
	/* Populated now, once per MR and channel: otherwise the first pass
	 * of WRITEs over a large MR takes a page fault per 4 KiB (16 MiB
	 * WRITEs over a 64 MiB MR, bench/samehost: 0.74-0.83x memcpy
	 * before, 0.84-0.88x after, in three runs each). */
	p = mmap(NULL, e->map_len, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	/* A full cache drops the oldest mapping: only this channel's
	 * requester uses it, under the engine lock, so nothing else holds a
	 * pointer into it. */
	d = &c->dmap[c->dmap_next++ % URSA_DMAPS];
	if (d->base) {
		munmap(d->base, d->len);
		c->dlast.valid = false;	/* (its base may be this one) */
	}
	d->ino = e->map_ino;
	d->len = e->map_len;
	d->base = p;
	return p;
}

/*
 * The target removed an MR since we last looked (its table's gen moved):
 * unmap the memfds no entry names any more, or a long-lived channel would
 * keep the pages of every MR the target ever freed. Entries are read
 * without their sequence lock: a torn read can only keep a mapping a
 * little longer or drop one that is mapped again on its next use.
 */
static void chan_dmap_prune(struct ursa_chan *c, const struct ursa_pubmem *m)
{
	uint32_t g = atomic_load_explicit((atomic_uint *)&m->gen,
					  memory_order_acquire);

	if (g == c->dgen)
		return;
	c->dgen = g;
	for (uint32_t i = 0; i < URSA_DMAPS; i++) {
		struct ursa_dmap *d = &c->dmap[i];
		bool named = false;

		for (uint32_t k = 0; d->base && !named && k < URSA_PUB_MRS; k++)
			named = __atomic_load_n(&m->mr[k].map_ino, __ATOMIC_RELAXED) ==
				d->ino &&
				__atomic_load_n(&m->mr[k].rkey, __ATOMIC_RELAXED);
		if (d->base && !named) {
			munmap(d->base, d->len);
			memset(d, 0, sizeof(*d));
			c->dlast.valid = false;
		}
	}
}

/* A WRITE, READ or atomic on the target's pages mapped at t. (Inline: its
 * one caller is the direct path, where it is most of an 8 B WRITE.) */
static inline __attribute__((always_inline)) void
map_xfer(const struct ursa_dop *r, uint8_t *t, uint64_t len, uint64_t *orig)
{
	struct ursa_sg part[URSA_MAX_SGE], s = { (uintptr_t)t, len };
	uint32_t nl;

	switch (r->opcode) {
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		/* The same locked instructions as the target's responder
		 * (resp.c) on the same physical memory: atomic against it
		 * and against every other requester. */
		*orig = __atomic_fetch_add((uint64_t *)t, r->compare_add,
					   __ATOMIC_SEQ_CST);
		return;
	case IBV_WR_ATOMIC_CMP_AND_SWP: {
		uint64_t expect = r->compare_add;

		__atomic_compare_exchange_n((uint64_t *)t, &expect, r->swap,
					    false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
		*orig = expect;
		return;
	}
	case IBV_WR_RDMA_READ:
		nl = ursa_sg_slice(r->sg, r->nsg, 0, len, part);
		ursa_sg_copy(part, nl, &s, 1, len);
		return;
	default:
		/* The last byte last, with release order (ursa_sg_copy): a
		 * target spinning on it sees the whole message. */
		if (r->nsg == 1 && r->sg[0].len == len) {
			ursa_copy_ordered(t, (const uint8_t *)r->sg[0].va, len);
			return;
		}
		nl = ursa_sg_slice(r->sg, r->nsg, 0, len, part);
		ursa_sg_copy(&s, 1, part, nl, len);
		return;
	}
}

/* The copy by cross-memory attach: one process_vm_writev/readv between
 * the two MRs. Returns the bytes moved or -1 (errno set). */
static ssize_t cma_xfer(struct ursa_chan *c, const struct ursa_dop *r,
			uint64_t ta, uint64_t len)
{
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	struct ursa_sg part[URSA_MAX_SGE];
	struct iovec l[URSA_MAX_SGE], rv[2];
	uint32_t nl;
	ssize_t n;

	nl = ursa_sg_slice(r->sg, r->nsg, 0, len, part);
	for (uint32_t i = 0; i < nl; i++) {
		l[i].iov_base = (void *)(uintptr_t)part[i].va;
		l[i].iov_len = part[i].len;
	}
	if (rd) {
		rv[0].iov_base = (void *)(uintptr_t)ta;
		rv[0].iov_len = len;
		return process_vm_readv(c->peer_pid, l, nl, rv, 1, 0);
	}
	/* The last byte last, for a reader spinning on it: the kernel
	 * copies the remote vectors in order, and x86 keeps stores in order
	 * (elsewhere, two calls). */
	rv[0].iov_base = (void *)(uintptr_t)ta;
	rv[0].iov_len = len - 1;
	rv[1].iov_base = (void *)(uintptr_t)(ta + len - 1);
	rv[1].iov_len = 1;
#if defined(__x86_64__) || defined(__i386__)
	n = process_vm_writev(c->peer_pid, l, nl, rv + (len == 1),
			      len == 1 ? 1 : 2, 0);
#else
	n = len == 1 ? 0 : process_vm_writev(c->peer_pid, l, nl, rv, 1, 0);
	if (n == (ssize_t)(len - 1)) {
		struct ursa_sg lb;
		struct iovec tl;

		ursa_sg_slice(part, nl, len - 1, 1, &lb);
		tl.iov_base = (void *)(uintptr_t)lb.va;
		tl.iov_len = 1;
		n = process_vm_writev(c->peer_pid, &tl, 1, rv + 1, 1, 0) == 1 ?
			(ssize_t)len : -1;
	}
#endif
	return n;
}

/* direct_xfer: whether the target's table lists its QP for the channel's
 * peer and accepting the operation; *qw, the table's word for it (the
 * QP's PD in the high half). */
static bool direct_qp_ok(const struct ursa_chan *c, const struct ursa_dop *r,
			 uint32_t need, uint64_t *qw)
{
	const struct ursa_pubmem *m = c->dpub;
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	bool at = r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		  r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;

	if (!m || c->dslot >= URSA_PUB_QPS || !r->len ||
	    (!rd && !at && r->opcode != IBV_WR_RDMA_WRITE) ||
	    (at && (r->remote_addr & 7)))
		return false;
	*qw = atomic_load_explicit(&m->qp[c->dslot], memory_order_acquire);
	return ursa_pub_alive(m) && (*qw & 0xffffff) == c->peer_qpn &&
	       ((*qw >> 24) & (URSA_PUBQ_ACCEPT | need)) ==
	       (URSA_PUBQ_ACCEPT | need);
}

/* direct_xfer, the busy flag raised: the target's entry for rkey in
 * c->dlast, and its mapping. False when the table has none. */
static bool direct_entry(struct ursa_chan *c, uint32_t rkey)
{
	const struct ursa_pubmem *m = c->dpub;
	struct ursa_dlast *dl = &c->dlast;

	/* The last entry again, unchanged since it was copied (the seq load
	 * is after the fence, as the lookup's would be), and no MR removed
	 * since (else the slow way prunes the mappings first)? */
	if (dl->valid && dl->e.rkey == rkey &&
	    ursa_pub_same(m, dl->where, dl->seq) &&
	    atomic_load_explicit((atomic_uint *)&m->gen,
				 memory_order_relaxed) == c->dgen)
		return true;
	dl->valid = false;
	if (!ursa_pub_find(m, rkey, &dl->e, &dl->where, &dl->seq))
		return false;
	chan_dmap_prune(c, m);
	dl->base = dl->e.map_len ? chan_dmap(c, &dl->e) : NULL;
	/* (a mapping that failed is tried again next time) */
	dl->valid = !dl->e.map_len || dl->base;
	return true;
}

/* direct_xfer: the copy to or from target address ta, through our mapping
 * of the target's pages when it covers them (*base: where it starts),
 * else by cross-memory attach. Returns the bytes moved, or -1. (Inline,
 * as map_xfer: the direct path is timed in nanoseconds.) */
static inline __attribute__((always_inline)) ssize_t
direct_copy(struct ursa_qp *qp, struct ursa_chan *c, const struct ursa_dop *r,
	    uint64_t ta, uint64_t *orig, uint8_t **base)
{
	const struct ursa_pub_mr *e = &c->dlast.e;
	bool at = r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		  r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
	uint64_t len = r->len;
	ssize_t n = -1;

	*base = ursa_in_bounds(e->map_start, e->map_len, ta, len) ?
		c->dlast.base : NULL;
	if (*base) {
		map_xfer(r, *base + (ta - e->map_start), len, orig);
		n = (ssize_t)len;
		/* (the hint for the next post's prefetch: core.h) */
		atomic_store_explicit(&qp->dhint_delta, (uintptr_t)*base -
				      e->map_start + e->addr - e->iova,
				      memory_order_relaxed);
		atomic_store_explicit(&qp->dhint_rkey, r->rkey,
				      memory_order_relaxed);
	} else if (!at && c->dcma) {
		n = cma_xfer(c, r, ta, len);
		if (n < 0 && (errno == EPERM || errno == ENOSYS || errno == EACCES)) {
			/* Refused (seccomp, a changed ptrace rule): not
			 * again on this channel. */
			ursa_dbg("qp %u -> qp %u: direct path refused: %s",
				 qp->ex.qp_base.qp_num, c->peer_qpn,
				 strerror(errno));
			c->dcma = false;
		}
	}
	return n;
}

/*
 * Direct path (pub.h): an RDMA WRITE, READ or atomic whose target QP and
 * MR the target's table vouches for is carried out here, by the requester,
 * straight between the two MRs: by memcpy (or a locked instruction) when
 * the target's pages are mapped here (shmap.h), else by one
 * process_vm_writev/readv (not for atomics, which a system call cannot make
 * atomic). The target process is not woken and its engine does nothing.
 * Returns false when the table cannot prove the access allowed or the copy
 * did not complete: the WQE then goes the ordinary way, where the target's
 * responder checks it again and names the check that refuses.
 */
static bool direct_xfer(struct ursa_qp *qp, struct ursa_chan *c,
			const struct ursa_dop *r, uint64_t *orig)
{
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	bool at = r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		  r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
	uint32_t need = at ? URSA_PUBQ_ATOMIC : rd ? URSA_PUBQ_READ : URSA_PUBQ_WRITE;
	unsigned int acc = at ? IBV_ACCESS_REMOTE_ATOMIC :
			   rd ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	uint64_t len = r->len, qw, ta;
	const struct ursa_pub_mr *e;
	uint8_t *base = NULL;
	ssize_t n = -1;

	if (!direct_qp_ok(c, r, need, &qw))
		return false;
	/* Raise the flag before reading the entry: the owner removes an
	 * entry and then waits for raised flags (ursa_shm_quiesce), so either
	 * it sees ours or we see the entry gone. The store, then the
	 * entry's loads after a seq_cst fence (the fence alone orders our
	 * store before our loads against the owner's seq_cst operations):
	 * the other half of the pair is in pub.c (ent_write, then the
	 * owner's loads of busy). */
	atomic_store_explicit(&c->mem->busy, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	if (!direct_entry(c, r->rkey))
		goto out;
	e = &c->dlast.e;
	if (e->pd != (uint32_t)(qw >> 32) || (e->access & acc) != acc ||
	    !ursa_in_bounds(e->iova, e->length, r->remote_addr, len))
		goto out;
	ta = e->addr + (r->remote_addr - e->iova);
	if (at && (ta & 7))
		goto out;
	n = direct_copy(qp, c, r, ta, orig, &base);
out:
	/* Release: our copy is complete before the owner sees the flag
	 * down (memcpy's stores, or process_vm_* returned). */
	atomic_store_explicit(&c->mem->busy, 0, memory_order_release);
	if (n != (ssize_t)len)
		return false;
	/* (counters: every writer holds ctx->qp_lock) */
	if (at) {
		ursa_cnt_add(&qp->cnt.map_atomics, 1);
		return true;
	}
	ursa_cnt_add(&qp->cnt.direct_bytes, len);
	if (base)
		ursa_cnt_add(&qp->cnt.map_bytes, len);
	return true;
}

/* The channel to the connected QP, if the direct path may use it. */
static inline struct ursa_chan *direct_chan(struct ursa_qp *qp)
{
	uint32_t dqpn = qp->attr.dest_qp_num & 0xffffff;

	for (struct ursa_chan *c = qp->chans; c; c = c->next)
		if (c->peer_qpn == dqpn)
			return c->state == URSA_CHAN_READY && c->dpub ? c : NULL;
	return NULL;
}

bool ursa_shm_direct_op(struct ursa_qp *qp, const struct ursa_dop *op,
			uint64_t *orig)
{
	struct ursa_chan *c = direct_chan(qp);

	return c && direct_xfer(qp, c, op, orig);
}

bool ursa_shm_direct(struct ursa_qp *qp, struct ursa_send_wqe *w,
		     const struct ursa_req *r, struct ursa_resp *resp)
{
	bool rd = r->opcode == IBV_WR_RDMA_READ;
	bool at = r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		  r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
	struct ursa_dop op = {
		.opcode = r->opcode, .rkey = r->rkey,
		.remote_addr = r->remote_addr, .len = at ? 8 : r->msg_len,
		.sg = rd ? r->dst : r->src, .nsg = rd ? r->ndst : r->nsrc,
		.compare_add = r->compare_add, .swap = r->swap,
	};
	struct ursa_chan *c;

	/* (a SEND or a WRITE with immediate needs the target's receive) */
	if ((!rd && !at && r->opcode != IBV_WR_RDMA_WRITE) ||
	    (w && (w->inflight || w->shm.xfer_off)) ||
	    qp->ex.qp_base.qp_type == IBV_QPT_UD || !(c = direct_chan(qp)))
		return false;
	memset(resp, 0, sizeof(*resp));
	if (!direct_xfer(qp, c, &op, &resp->atomic_orig))
		return false;
	resp->ack = URSA_ACK;
	return true;
}

__attribute__((constructor)) static void shm_hooks(void)
{
	ursa_hooks.chans_close = ursa_shm_qp_close;
	ursa_hooks.unlisten = ursa_shm_unlisten;
	ursa_hooks.prefetch_next = ursa_shm_prefetch_next;
	ursa_hooks.quiesce = ursa_shm_quiesce;
}

void ursa_shm_quiesce(struct ursa_ctx *ctx)
{
	struct ursa_shm_eng *e = ctx->shm;

	if (!e)
		return;
	ursa_mutex_lock(&ctx->qp_lock);
	for (struct ursa_chan *c = e->served; c; c = c->next) {
		/* seq_cst loads: see direct_xfer. A requester that died with
		 * its flag up has hung up its socket: skip it (the engine
		 * cannot mark it dead while we hold its lock). */
		while (c->state == URSA_CHAN_READY && c->mem &&
		       atomic_load(&c->mem->busy)) {
			struct pollfd pf = { c->sock, POLLRDHUP, 0 };

			if (c->sock < 0 || poll(&pf, 1, 0) != 0)
				break;
			sched_yield();
		}
	}
	ursa_mutex_unlock(&ctx->qp_lock);
}

/* The answer to our outstanding request, if it is there. Stale answers
 * (to an earlier transmission) are skipped. */
static struct ursa_wresp *peek_resp(struct ursa_chan *c)
{
	struct ursa_chanmem *m = c->mem;

	for (;;) {
		uint32_t head = atomic_load_explicit(&m->resp_head, memory_order_relaxed);
		uint32_t tail = atomic_load_explicit(&m->resp_tail, memory_order_acquire);
		struct ursa_wresp *p;

		if (tail - head == 0 || tail - head > URSA_SHM_SLOTS)
			return NULL;
		p = &m->resp[head % URSA_SHM_SLOTS];
		if (p->seq == c->seq)
			return p;
		atomic_store_explicit(&m->resp_head, head + 1, memory_order_release);
	}
}

bool ursa_shm_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now)
{
	struct ursa_chan *c;

	if (w->shm.connecting) {
		/* waiting for the welcome (or the refusal) */
		for (c = qp->chans; c; c = c->next)
			if (c->state != URSA_CHAN_CONNECTING)
				return true;
		return now >= w->not_before_ns;
	}
	if (!w->inflight)
		return now >= w->not_before_ns;
	if (now >= w->deadline_ns)
		return true;
	for (c = qp->chans; c; c = c->next)
		if (c->state == URSA_CHAN_READY && peek_resp(c))
			return true;
	return false;
}

/* The answer at the head of the channel's answer ring into resp (an
 * inline READ's data into our own WQE's buffers), and the ring moves on. */
static void take_answer(struct ursa_chan *c, struct ursa_send_wqe *w,
			const struct ursa_req *r, struct ursa_resp *resp)
{
	struct ursa_wresp *p = peek_resp(c);

	resp->ack = p->ack <= URSA_DROPPED ? (enum ursa_ack)p->ack : URSA_NAK_OP_ERR;
	resp->why = p->why;
	resp->rnr_timer = (uint8_t)p->rnr_timer;
	resp->atomic_orig = p->atomic_orig;
	if (resp->ack == URSA_ACK && r->opcode == IBV_WR_RDMA_READ && p->inline_len) {
		/* Inline READ data lands in our own WQE's buffers (checked by
		 * the requester), never where the peer says. */
		uint64_t off = w->shm.xfer_off;
		uint64_t n = MIN((uint64_t)p->inline_len, r->msg_len - off);
		struct ursa_sg part[URSA_MAX_SGE];
		struct ursa_sg s = { (uintptr_t)p->data, n };
		uint32_t k = ursa_sg_slice(r->dst, r->ndst, off, n, part);

		ursa_sg_copy(part, k, &s, 1, n);
	}
	atomic_store_explicit(&c->mem->resp_head,
			      atomic_load(&c->mem->resp_head) + 1,
			      memory_order_release);
	w->inflight = false;
}

/* No answer in time (IBTA 9.7.6.1.3): retransmit the same request (same
 * seq) until retry_cnt runs out. Returns as ursa_shm_step. */
static int step_timeout(struct ursa_qp *qp, struct ursa_chan *c,
			struct ursa_send_wqe *w, const struct ursa_req *r,
			uint64_t now, struct ursa_resp *resp, uint64_t *until)
{
	w->inflight = false;
	if (qp->ex.qp_base.qp_type != IBV_QPT_RC) {
		resp->ack = URSA_DROPPED;
		return 1;
	}
	if (!ursa_retry_take(qp, w)) {
		resp->ack = URSA_DROPPED;
		resp->why = c && c->state != URSA_CHAN_DEAD ? URSA_WHY_NOT_READY :
							      URSA_WHY_PEER_DEAD;
		resp->final = true;
		return 1;
	}
	if (c && c->state == URSA_CHAN_READY) {
		push_request(qp, c, w, r, now);
	} else {
		w->inflight = true;
		w->deadline_ns = now + ack_timeout(qp);
	}
	*until = w->deadline_ns;
	return 0;
}

/* ursa_shm_step with an answer at the head of the channel's answer ring:
 * take it; an ACK of one fragment sends the next. Returns as
 * ursa_shm_step. */
static int step_answered(struct ursa_qp *qp, struct ursa_chan *c,
			 struct ursa_send_wqe *w, const struct ursa_req *r,
			 uint64_t now, struct ursa_resp *resp, uint64_t *until)
{
	bool rc = qp->ex.qp_base.qp_type == IBV_QPT_RC;
	uint64_t sent;

	take_answer(c, w, r, resp);
	if (resp->ack != URSA_ACK) {
		if (resp->ack == URSA_DROPPED && rc)	/* RC: "no answer" */
			return step_timeout(qp, c, w, r, now, resp, until);
		return 1;
	}
	c->seq++;
	if (r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
	    r->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
		return 1;
	/* Acknowledged a fragment: the next one goes now. */
	sent = (r->msg_len <= URSA_SHM_INLINE || !c->cma) ?
		MIN(r->msg_len - w->shm.xfer_off, (uint64_t)URSA_SHM_INLINE) :
		r->msg_len;
	w->shm.xfer_off += sent;
	if (w->shm.xfer_off >= r->msg_len)
		return 1;
	push_request(qp, c, w, r, now);
	*until = w->deadline_ns;
	return 0;
}

int ursa_shm_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		  const struct ursa_req *r, uint64_t now,
		  struct ursa_resp *resp, uint64_t *until)
{
	bool rc = qp->ex.qp_base.qp_type == IBV_QPT_RC;
	uint32_t dqpn = r->type == IBV_QPT_UD ? w->remote_qpn : qp->attr.dest_qp_num;
	struct ursa_chan *c = chan_for(qp, dqpn & 0xffffff);

	memset(resp, 0, sizeof(*resp));
	w->shm.connecting = false;
	/* A peer may answer and then exit: its answer counts even if the
	 * channel died right after. */
	if (c && c->state == URSA_CHAN_DEAD && c->mem && w->inflight &&
	    peek_resp(c))
		return step_answered(qp, c, w, r, now, resp, until);
	if (!c || c->state == URSA_CHAN_DEAD) {
		/* Nobody answers. UC/UD never know; RC waits for its ACK
		 * timeout like for a lost packet. */
		if (!rc) {
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_UNREACHABLE;
			return 1;
		}
		if (!w->inflight) {
			w->inflight = true;
			w->deadline_ns = ack_timeout(qp) == UINT64_MAX ?
				UINT64_MAX : now + ack_timeout(qp);
		}
		goto wait;
	}
	if (c->state == URSA_CHAN_CONNECTING) {
		w->shm.connecting = true;
		*until = now + 1000000000ull; /* the welcome wakes us earlier */
		return 0;
	}
	if (!w->inflight) {
		/* (the direct path was tried first: ursa_shm_direct) */
		push_request(qp, c, w, r, now);
		*until = w->deadline_ns;
		return 0;
	}
	if (peek_resp(c))
		return step_answered(qp, c, w, r, now, resp, until);
wait:
	if (now < w->deadline_ns) {
		*until = w->deadline_ns;
		return 0;
	}
	return step_timeout(qp, c, w, r, now, resp, until);
}

/* --- responder side ------------------------------------------------------ */

/* May another user's connection be served? Not beyond its share. */
static bool foreign_room(struct ursa_shm_eng *e, uid_t uid)
{
	unsigned int pending = 0, all = 0;

	for (struct ursa_chan *c = e->served; c; c = c->next) {
		if (c->peer_uid != uid || c->state == URSA_CHAN_DEAD)
			continue;
		all++;
		pending += c->state == URSA_CHAN_CONNECTING;
	}
	return pending < URSA_SHM_FOREIGN_PENDING && all < URSA_SHM_FOREIGN_CHANS;
}

static void accept_chan(struct ursa_shm_eng *e, struct ursa_qp *qp)
{
	for (;;) {
		int s = accept4(qp->listen_fd, NULL, NULL,
				SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct ursa_chan *c;
		struct ucred cred;
		socklen_t cl = sizeof(cred);

		if (s < 0)
			return;
		if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) ||
		    (cred.uid != geteuid() && !foreign_room(e, cred.uid))) {
			atomic_fetch_add(&qp->cnt.refused_chans, 1);
			close(s);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(s);
			return;
		}
		c->role = URSA_CHAN_RESPONDER;
		c->state = URSA_CHAN_CONNECTING;
		c->sock = s;
		c->qp = qp;
		c->peer_efd = -1;
		c->peer_pid = cred.pid;
		c->peer_uid = cred.uid;
		c->hello_by = ursa_now_ns() + URSA_SHM_HELLO_NS;
		c->watch.kind = URSA_W_CHAN;
		c->watch.ptr = c;
		if (epoll_add(e, s, &c->watch, EPOLLIN | EPOLLRDHUP)) {
			chan_free(NULL, c);
			continue;
		}
		c->next = e->served;
		e->served = c;
	}
}

/*
 * Does process pid own QPN qpn on this host? A hello's source QPN is only a
 * claim: it names the QP whose completions will say src_qp, and the QP an
 * RC or UC target accepts as its connected peer. Only the process that
 * created a QP listens on its name (ursa_shm_listen; the abstract name is
 * unique in the network namespace), and the kernel keeps the listener's
 * credentials from listen(): connect to the name and ask SO_PEERCRED. The
 * owner's engine sees the connection close without a hello and drops it.
 */
static bool owns_qpn(pid_t pid, uint32_t qpn)
{
	struct sockaddr_un sa;
	struct ucred cr;
	socklen_t len, cl = sizeof(cr);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	bool ok;

	if (s < 0)
		return false;
	sock_name(&sa, &len, qpn);
	ok = !connect(s, (struct sockaddr *)&sa, len) &&
	     !getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) && cr.pid == pid;
	close(s);
	return ok;
}

/* serve_hello: can we reach the requester's memory? Try it on a word
 * whose value we know. URSA_CMA=0 forces the slot path (tests,
 * benchmarks). */
static bool hello_cma_probe(const struct ursa_chan *c,
			    const struct ursa_shm_hello *h)
{
	uint64_t v = 0;
	struct iovec l = { &v, 8 }, rv = { (void *)(uintptr_t)h->probe_addr, 8 };

	if (!ursa_cfg()->cma)
		return false;
	return process_vm_readv(c->peer_pid, &l, 1, &rv, 1, 0) == 8 &&
	       v == h->probe_val;
}

/*
 * serve_hello: the direct path's table in the welcome, its descriptor
 * added to out[]. Connected QPs of the same user may take WRITE and READ
 * directly (pub.h). The table names every published rkey and address:
 * another uid, which could use none of it (no cross-memory attach, no
 * /proc/<pid>/fd across users), is not shown it and goes through the
 * ring, where this side checks every key. Nor is a QP that is not (yet)
 * this QP's connected peer: the direct path bypasses the responder,
 * which drops requests from anyone else (resp.c).
 */
static void hello_offer_pub(const struct ursa_chan *c, uid_t uid,
			    struct ursa_shm_welcome *wl, int *out, int *nout)
{
	if (c->qp->ex.qp_base.qp_type != IBV_QPT_UD && !wl->status &&
	    uid == geteuid() &&
	    c->peer_qpn == (c->qp->attr.dest_qp_num & 0xffffff)) {
		int fd = ursa_pub_fd(), slot = fd >= 0 ? ursa_pub_qp_slot(c->qp) : -1;

		if (slot >= 0) {
			wl->qp_slot = slot;
			wl->pub_fd = fd;
			out[(*nout)++] = fd;
		}
	}
}

static void serve_hello(struct ursa_shm_eng *e, struct ursa_chan *c)
{
	struct ursa_shm_hello h;
	struct ursa_shm_welcome wl = { URSA_SHM_MAGIC, URSA_SHM_VERSION, 0, 0,
				       -1, -1, (uintptr_t)&probe_word,
				       probe_value };
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	int fds[3], nfds, out[3], nout = 2;
	ssize_t n = recv_fds(c->sock, &h, sizeof(h), fds, 3, &nfds);

	if (n == -EAGAIN)
		return;
	if (n != (ssize_t)sizeof(h) || nfds != 3 || h.magic != URSA_SHM_MAGIC ||
	    h.version != URSA_SHM_VERSION ||
	    getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		chan_dead(e, c);
		return;
	}
	c->mem = ursa_memfd_map_peer(fds[0], sizeof(*c->mem), 0, true);
	c->peer_ctl = ursa_memfd_map_peer(fds[1], sizeof(*c->peer_ctl),
					  F_SEAL_FUTURE_WRITE, false);
	close(fds[0]);
	close(fds[1]);
	c->peer_efd = fds[2];
	c->peer_pid = cred.pid;	/* the kernel's word, not the hello's */
	c->peer_uid = cred.uid;
	c->peer_qpn = h.src_qpn & 0xffffff;
	c->last_resp = calloc(1, sizeof(struct ursa_wresp));
	if (!c->mem || !c->peer_ctl || !c->last_resp ||
	    c->mem->magic != URSA_SHM_MAGIC) {
		chan_dead(e, c);
		return;
	}
	if (h.qp_type != c->qp->ex.qp_base.qp_type)
		wl.status = -EPROTOTYPE;
	else if (!owns_qpn(c->peer_pid, c->peer_qpn))
		wl.status = -EACCES;	/* a forged source QPN */
	if (wl.status)
		atomic_fetch_add(&c->qp->cnt.refused_chans, 1);
	wl.cma_ok = hello_cma_probe(c, &h);
	c->cma = wl.cma_ok;
	out[0] = e->ctl_fd;
	out[1] = e->efd;
	hello_offer_pub(c, cred.uid, &wl, out, &nout);
	if (send_fds(c->sock, &wl, sizeof(wl), out, nout) || wl.status) {
		chan_dead(e, c);
		return;
	}
	c->state = URSA_CHAN_READY;
}

void ursa_shm_event(struct ursa_shm_eng *e, struct ursa_watch *w,
		    uint32_t events)
{
	struct ursa_chan *c;

	if (!w->ptr)
		return;	/* closed while the event was on its way */
	if (w->kind == URSA_W_LISTEN) {
		accept_chan(e, w->ptr);
		return;
	}
	c = w->ptr;
	if (c->closed)
		return;
	if (c->state == URSA_CHAN_CONNECTING && (events & EPOLLIN)) {
		if (c->role == URSA_CHAN_REQUESTER)
			chan_welcome(e, c);
		else
			serve_hello(e, c);
		if (c->state == URSA_CHAN_DEAD)
			return;
		events &= ~(uint32_t)EPOLLIN;
	}
	if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR | EPOLLIN)) {
		char b;

		/* After the handshake a channel socket carries nothing:
		 * readable means closed. */
		if (recv(c->sock, &b, 1, MSG_DONTWAIT) != -1 || errno != EAGAIN)
			chan_dead(e, c);
	}
}

static bool req_waiting(struct ursa_chan *c)
{
	uint32_t t, h;

	if (c->state != URSA_CHAN_READY)
		return false;
	t = atomic_load_explicit(&c->mem->req_tail, memory_order_acquire);
	h = atomic_load_explicit(&c->mem->req_head, memory_order_relaxed);
	return t != h;
}

bool ursa_shm_serve_pending(struct ursa_shm_eng *e)
{
	for (struct ursa_chan *c = e->served; c; c = c->next)
		if (req_waiting(c))
			return true;
	return false;
}

static void push_resp(struct ursa_chan *c, const struct ursa_wresp *src,
		      size_t len)
{
	struct ursa_chanmem *m = c->mem;
	uint32_t tail = atomic_load_explicit(&m->resp_tail, memory_order_relaxed);
	uint32_t head = atomic_load_explicit(&m->resp_head, memory_order_acquire);

	/* Full (the requester has not read our earlier answers): drop this
	 * one; the requester retransmits and we answer from last_resp. */
	if (tail - head >= URSA_SHM_SLOTS)
		return;
	memcpy(&m->resp[tail % URSA_SHM_SLOTS], src, len);
	/* Release: the answer is complete before the requester sees it. */
	atomic_store_explicit(&m->resp_tail, tail + 1, memory_order_release);
	ring_peer(c);
}

/* Execute one request from the ring. Every field is the peer's word:
 * bound it before use. */
/* The request of a channel's slot, decoded into the responder's form
 * (its data lists come from wreq_data). */
static void wreq_decode(const struct ursa_chan *c, const struct ursa_wreq *q,
			struct ursa_req *r)
{
	r->opcode = q->opcode;
	r->frag = q->frag & URSA_FRAG_ONLY;
	r->type = c->qp->ex.qp_base.qp_type;
	r->src_qpn = c->peer_qpn;
	r->qkey = q->qkey;
	r->rkey = q->rkey;
	r->remote_addr = q->raddr;
	r->len = q->len;
	r->msg_len = q->msg_len;
	r->offset = q->offset;
	r->imm = q->imm;
	r->has_imm = q->flags & WF_IMM;
	r->invalidate = q->flags & WF_INV;
	r->solicited = q->flags & WF_SOLICITED;
	r->compare_add = q->compare_add;
	r->swap = q->swap;
	r->peer = c->peer_pid;
	memcpy(r->sgid.raw, q->sgid, 16);
	memcpy(r->dgid.raw, q->dgid, 16);
	r->traffic_class = q->tclass;
	r->hop_limit = q->hop;
	r->flow_label = q->flow;
}

/* Where the request's data is: the requester's memory by cross-memory
 * attach (sg), the answer's slot for a small READ, or the request's own
 * slot (slot). Everything the peer wrote is bounded first. Returns
 * whether the request is well formed. */
static bool wreq_data(const struct ursa_chan *c, const struct ursa_wreq *q,
		      struct ursa_wresp *out, struct ursa_sg *sg,
		      struct ursa_sg *slot, struct ursa_req *r)
{
	if (q->len > URSA_MAX_MSG_SZ || q->msg_len > URSA_MAX_MSG_SZ ||
	    q->offset > q->msg_len || q->nsg > URSA_MAX_SGE ||
	    ((q->flags & WF_CMA) && !c->cma))
		return false;
	if (q->flags & WF_CMA) {
		uint64_t tot = 0;

		for (uint32_t i = 0; i < q->nsg; i++) {
			sg[i].va = q->sg[i].va;
			sg[i].len = q->sg[i].len;
			tot += q->sg[i].len;
		}
		if (tot < q->len)
			return false;
		if (q->opcode == IBV_WR_RDMA_READ) {
			r->dst = sg;
			r->ndst = q->nsg;
			r->dst_remote = true;
		} else {
			r->src = sg;
			r->nsrc = q->nsg;
			r->src_remote = true;
		}
	} else if (q->opcode == IBV_WR_RDMA_READ) {
		if (q->len > URSA_SHM_INLINE)
			return false;
		/* Small READ: the data rides back in the answer's slot. */
		slot->va = (uintptr_t)out->data;
		slot->len = q->len;
		r->dst = slot;
		r->ndst = 1;
	} else {
		uint32_t il = q->inline_len; /* bounded by the snapshot */

		if (il < q->len && q->opcode != IBV_WR_ATOMIC_CMP_AND_SWP &&
		    q->opcode != IBV_WR_ATOMIC_FETCH_AND_ADD)
			return false;
		/* Copy out of the shared slot first: the peer could change
		 * it while we read. */
		slot->va = (uintptr_t)q->data;
		slot->len = il;
		r->src = slot;
		r->nsrc = 1;
	}
	return true;
}

static void serve_one(struct ursa_chan *c, const struct ursa_wreq *q)
{
	struct ursa_qp *tqp = c->qp;
	struct ursa_wresp *out = c->last_resp;
	struct ursa_sg sg[URSA_MAX_SGE], slot;
	struct ursa_req r = { 0 };
	struct ursa_resp resp = { 0 };	/* (a refusal sets two fields) */
	size_t olen = offsetof(struct ursa_wresp, data);
	bool rc = tqp->ex.qp_base.qp_type == IBV_QPT_RC;

	/* The slot our answer goes to, asked for while we execute (the
	 * requester reads it only after resp_tail moves). A hint. */
	ursa_prefetch_write(&c->mem->resp[atomic_load_explicit(&c->mem->resp_tail,
			memory_order_relaxed) % URSA_SHM_SLOTS]);
	if (q->seq == c->seq - 1 && out->seq == q->seq) {
		/* A retransmission of what we already executed: answer it
		 * again, do not execute it again (IBTA 9.7.5.1.3). */
		push_resp(c, out, olen + out->inline_len);
		return;
	}
	if (q->seq != c->seq)
		return;	/* out of sequence: dropped */
	wreq_decode(c, q, &r);
	memset(out, 0, olen);
	out->seq = q->seq;
	if (!wreq_data(c, q, out, sg, &slot, &r)) {
		resp.ack = rc ? URSA_NAK_INV_REQ : URSA_DROPPED;
		resp.why = URSA_WHY_OPCODE;
	} else {
		ursa_shm_up.execute(tqp, &r, &resp, &c->rs);
		if (resp.ack == URSA_ACK && q->opcode == IBV_WR_RDMA_READ &&
		    !(q->flags & WF_CMA))
			out->inline_len = (uint32_t)q->len;
	}
	out->ack = resp.ack;
	out->why = resp.why;
	out->rnr_timer = resp.rnr_timer;
	out->atomic_orig = resp.atomic_orig;
	if (resp.ack == URSA_ACK)
		c->seq++;
	/* RC drops are silence; UC/UD answer so the requester knows its
	 * buffer is free again. */
	if (resp.ack == URSA_DROPPED && rc)
		return;
	push_resp(c, out, olen + out->inline_len);
}

/* ursa_shm_serve: the requests waiting in c's ring, in order; returns
 * how many. */
static int serve_requests(struct ursa_shm_eng *e, struct ursa_chan *c)
{
	int work = 0;

	while (req_waiting(c)) {
		uint32_t h = atomic_load_explicit(&c->mem->req_head,
						  memory_order_relaxed);
		uint32_t t = atomic_load_explicit(&c->mem->req_tail,
						  memory_order_acquire);

		if (t - h > URSA_SHM_SLOTS) {
			/* a corrupt index: the peer is broken */
			chan_dead(e, c);
			break;
		}
		/* Snapshot the request: the peer may rewrite the slot
		 * while we execute it. Header first, then only as much
		 * inline data as it claims (bounded). */
		struct ursa_wreq *q = e->snap;
		const struct ursa_wreq *sq = &c->mem->req[h % URSA_SHM_SLOTS];

		memcpy(q, sq, offsetof(struct ursa_wreq, data));
		q->inline_len = MIN(q->inline_len, (uint32_t)URSA_SHM_INLINE);
		memcpy(q->data, sq->data, q->inline_len);
		atomic_store_explicit(&c->mem->req_head, h + 1,
				      memory_order_release);
		/* Our QP's own answers from this peer first: an answer the
		 * peer gave before sending this request completes before it
		 * does (see on_packet in udp.c). */
		{
			uint64_t d = UINT64_MAX, now = 0;

			ursa_shm_up.run_sq(c->qp, &now, &d);
		}
		serve_one(c, q);
		work++;
	}
	return work;
}

int ursa_shm_serve(struct ursa_shm_eng *e)
{
	int work = 0;

	/* The snapshot of a request (8.8 KB) is the engine's, allocated once
	 * (the context's lock serializes serving): a thread-local of that size
	 * came out of every thread's stack (struct txbatch in udp.c). */
	if (!e->snap && e->served && !(e->snap = malloc(sizeof(*e->snap))))
		return 0;	/* (the requests wait in their rings) */

	for (struct ursa_chan **pp = &e->served; *pp;) {
		struct ursa_chan *c = *pp;

		if (c->state == URSA_CHAN_CONNECTING && c->hello_by &&
		    ursa_now_ns() > c->hello_by) {
			/* connected and said nothing: a held descriptor */
			atomic_fetch_add(&c->qp->cnt.refused_chans, 1);
			chan_dead(e, c);
		}
		if (c->state == URSA_CHAN_DEAD) {
			*pp = c->next;
			chan_free(e, c);
			continue;
		}
		work += serve_requests(e, c);
		pp = &c->next;
	}
	return work;
}
