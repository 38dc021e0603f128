// SPDX-License-Identifier: MIT
/*
 * cma.c - the librdmacm API (<rdma/rdma_cma.h>, rdma-core 44's exports)
 * over ursa: event channels, ids and their calls, events, the QP
 * transitions librdmacm makes for its users, and librdmacm's errno rules
 * (-1 and errno; sync ids, made without a channel, wait for their own
 * events). The wire protocol is cm.c's; addresses are addr.c's.
 */
#include "cma.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

pthread_mutex_t cma_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t cma_cond = PTHREAD_COND_INITIALIZER;
struct cma_id *cma_ids;

static struct ibv_context *g_ctx;
static struct ibv_pd *g_pd;

int cma_errno(int neg)
{
	if (neg >= 0)
		return neg;
	errno = -neg;
	return -1;
}

/* The device every id uses (ursa has one), opened once, and the PD
 * librdmacm gives every id with a device (id->pd, as rdma-core's: UCX
 * creates its placeholder QPs in it). dev_lock is taken under no other. */
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

struct ibv_context *cma_ctx(void)
{
	pthread_mutex_lock(&dev_lock);
	if (!g_ctx) {
		int n;
		struct ibv_device **l = ibv_get_device_list(&n);

		if (l && n > 0)
			g_ctx = ibv_open_device(l[0]);
		if (l)
			ibv_free_device_list(l);
	}
	pthread_mutex_unlock(&dev_lock);
	return g_ctx;
}

struct ibv_pd *cma_default_pd(void)
{
	struct ibv_context *c = cma_ctx();

	pthread_mutex_lock(&dev_lock);
	if (!g_pd && c)
		g_pd = ibv_alloc_pd(c);
	pthread_mutex_unlock(&dev_lock);
	return g_pd;
}

/* the id has the device: its context, port and PD */
void cma_set_dev(struct cma_id *id)
{
	id->id.verbs = cma_ctx();
	id->id.port_num = 1;
	if (!id->id.pd)
		id->id.pd = cma_default_pd();
}

/*
 * fork(): the child has only the forking thread, and libibverbs gave it a
 * device without contexts (docs/design.md, fork()), so librdmacm starts
 * afresh there. The parent's ids are forgotten in the child: the child's
 * copies of their sockets are closed (the parent's stay bound, so its
 * ports and connections remain its own), and the child's first event
 * channel opens the device and starts a CM thread of its own. The
 * parent's rsockets are EBADF in the child but for rclose (rsocket.c).
 * The locks are taken across fork() so that the child's copies are
 * consistent: cma_lock before tab_lock, the order of no other path (none
 * holds one while taking the other).
 */
static void cma_fork_prepare(void)
{
	pthread_mutex_lock(&cma_lock);
	rs_fork_prepare();
}

static void cma_fork_parent(void)
{
	rs_fork_parent();
	pthread_mutex_unlock(&cma_lock);
}

static void cma_fork_child(void)
{
	for (struct cma_id *id = cma_ids; id; id = id->next) {
		if (id->sfd >= 0)
			close(id->sfd);
		if (id->cfd >= 0)
			close(id->cfd);
		id->sfd = id->cfd = -1;
	}
	cma_ids = NULL;
	g_ctx = NULL;
	g_pd = NULL;
	pthread_mutex_init(&dev_lock, NULL);
	cm_fork_child();
	rs_fork_child();
	pthread_cond_init(&cma_cond, NULL);
	pthread_mutex_unlock(&cma_lock);
}

__attribute__((constructor)) static void cma_init(void)
{
	pthread_atfork(cma_fork_prepare, cma_fork_parent, cma_fork_child);
}

/* --- channels and events ---------------------------------------------- */

static struct cma_chan *chan_new(bool own)
{
	struct cma_chan *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (c->ch.fd < 0) {
		free(c);
		return NULL;
	}
	c->own = own;
	return c;
}

CMA_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cma_chan *c;

	pthread_mutex_lock(&cma_lock);
	c = cma_ctx() && !cm_start() ? chan_new(false) : NULL;
	pthread_mutex_unlock(&cma_lock);
	if (!c && !errno)
		errno = ENODEV;
	return c ? &c->ch : NULL;
}

static void chan_free(struct cma_chan *c)
{
	close(c->ch.fd);
	free(c);
}

/*
 * A thread may still wait in rdma_get_cm_event on the channel, as rping's
 * event thread does when its main thread tears down and exits. With the
 * kernel's rdma_cm that thread stays blocked in its read of the closed
 * file. Here the channel stays whole until that thread leaves: its
 * eventfd may still hold the count of an event rdma_destroy_id dropped,
 * and the thread woken by it reads the channel's queue (freed memory
 * there crashed rping's client at exit); finding nothing, it waits on
 * the eventfd again, which nothing writes any more.
 */
CMA_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *ch)
{
	struct cma_chan *c = (struct cma_chan *)ch;
	bool waited;

	if (!c)
		return;
	pthread_mutex_lock(&cma_lock);
	waited = c->waiters > 0;
	c->dead = true;
	pthread_mutex_unlock(&cma_lock);
	if (!waited)
		chan_free(c);
}

/* Queue an event for id on its channel (cma_lock held). The private data
 * of m (if any) is copied; *out lets the caller fill the parameters. */
void cma_queue(struct cma_id *id, enum rdma_cm_event_type t, int status,
	       const struct cm_msg *m, struct cma_event **out)
{
	struct cma_event *e = calloc(1, sizeof(*e));
	uint64_t one = 1;

	if (out)
		*out = e;
	if (!e)
		return;
	e->ev.id = &id->id;
	e->ev.event = t;
	e->ev.status = status;
	e->owner = id;
	if (m)
		memcpy(e->priv, m->priv, m->priv_len);
	if (id->chan->tail)
		id->chan->tail->next = e;
	else
		id->chan->head = e;
	id->chan->tail = e;
	if (write(id->chan->ch.fd, &one, sizeof(one)) < 0)
		return;		/* cannot happen below 2^64 - 1 events */
	pthread_cond_broadcast(&cma_cond);
}

CMA_EXPORT int rdma_get_cm_event(struct rdma_event_channel *ch,
				 struct rdma_cm_event **event)
{
	struct cma_chan *c = (struct cma_chan *)ch;
	struct cma_event *e = NULL;
	bool last;
	uint64_t v;

	if (!c || !event)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	c->waiters++;
	pthread_mutex_unlock(&cma_lock);
	/* blocks, or EAGAIN if the app made the fd non-blocking */
	while (read(c->ch.fd, &v, sizeof(v)) == sizeof(v)) {
		pthread_mutex_lock(&cma_lock);
		e = c->head;
		if (e) {
			c->head = e->next;
			if (!c->head)
				c->tail = NULL;
			e->owner->reported++;
			if (e->ev.listen_id)
				((struct cma_id *)e->ev.listen_id)->reported++;
		}
		pthread_mutex_unlock(&cma_lock);
		if (e)
			break;
		/* (an event of an id destroyed before it was read) */
	}
	pthread_mutex_lock(&cma_lock);
	last = --c->waiters == 0 && c->dead;
	pthread_mutex_unlock(&cma_lock);
	if (last) {
		int err = errno;

		chan_free(c);
		errno = err;
	}
	if (!e)
		return -1;
	*event = &e->ev;
	return 0;
}

CMA_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct cma_event *e = (struct cma_event *)event;

	if (!e)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	e->owner->acked++;
	if (e->ev.listen_id)
		((struct cma_id *)e->ev.listen_id)->acked++;
	pthread_cond_broadcast(&cma_cond);
	pthread_mutex_unlock(&cma_lock);
	free(e);
	return 0;
}

CMA_EXPORT const char *rdma_event_str(enum rdma_cm_event_type t)
{
	static const char *const s[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR",
		"RDMA_CM_EVENT_ROUTE_RESOLVED", "RDMA_CM_EVENT_ROUTE_ERROR",
		"RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE",
		"RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED",
		"RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
		"RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};

	return (unsigned)t < sizeof(s) / sizeof(s[0]) ? s[t]
						      : "UNKNOWN EVENT";
}

/* A synchronous id's last event is acked by its next call (librdmacm's
 * rule): this one */
static void ack_last(struct cma_id *id)
{
	if (id->sync && id->id.event) {
		rdma_ack_cm_event(id->id.event);
		id->id.event = NULL;
	}
}

/*
 * A sync id's call waits for the event it caused (librdmacm's
 * ucma_complete): the event stays in id->event until the next call; its
 * status becomes errno (REJECTED: ECONNREFUSED).
 */
static int complete(struct cma_id *id)
{
	struct rdma_cm_event *ev;
	int st;

	if (!id->sync)
		return 0;
	ack_last(id);
	if (rdma_get_cm_event(id->id.channel, &ev))
		return -1;
	id->id.event = ev;
	st = ev->status;
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		return cma_errno(-ECONNREFUSED);
	if (st)
		return cma_errno(st < 0 ? st : -st);
	if (ev->event == RDMA_CM_EVENT_ADDR_ERROR ||
	    ev->event == RDMA_CM_EVENT_ROUTE_ERROR ||
	    ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
	    ev->event == RDMA_CM_EVENT_UNREACHABLE)
		return cma_errno(-EIO);
	return 0;
}

/* --- ids ---------------------------------------------------------------- */

static struct cma_id *id_new(struct rdma_event_channel *ch, void *ctx,
			     enum rdma_port_space ps)
{
	struct cma_id *id = calloc(1, sizeof(*id));

	if (!id)
		return NULL;
	id->sfd = id->cfd = -1;
	id->chan = ch ? (struct cma_chan *)ch : chan_new(true);
	if (!id->chan) {
		free(id);
		return NULL;
	}
	id->sync = !ch;
	id->id.channel = &id->chan->ch;
	id->id.context = ctx;
	id->id.ps = ps;
	id->id.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ?
			 IBV_QPT_UD : IBV_QPT_RC;
	id->ack_timeout = 14;
	id->next = cma_ids;
	cma_ids = id;
	return id;
}

CMA_EXPORT int rdma_create_id(struct rdma_event_channel *ch,
			      struct rdma_cm_id **out, void *ctx,
			      enum rdma_port_space ps)
{
	struct cma_id *id;

	if (!out)
		return cma_errno(-EINVAL);
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IPOIB &&
	    ps != RDMA_PS_IB)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	if (!cma_ctx() || cm_start()) {
		pthread_mutex_unlock(&cma_lock);
		return cma_errno(-ENODEV);
	}
	id = id_new(ch, ctx, ps);
	pthread_mutex_unlock(&cma_lock);
	if (!id)
		return cma_errno(-ENOMEM);
	*out = &id->id;
	return 0;
}

static void unlink_id(struct cma_id *id)
{
	for (struct cma_id **p = &cma_ids; *p; p = &(*p)->next)
		if (*p == id) {
			*p = id->next;
			return;
		}
}

/* Drop the events of id not yet read from its channel (cma_lock held) */
static void drop_events(struct cma_id *id)
{
	struct cma_chan *c = id->chan;
	struct cma_event **p = &c->head, *last = NULL;

	while (*p) {
		struct cma_event *e = *p;

		if (e->owner == id || e->ev.listen_id == &id->id) {
			struct cma_id *child = e->owner;

			*p = e->next;
			free(e);
			/* a request the app never saw goes with its listener,
			 * refused as the kernel refuses it */
			if (child != id) {
				cm_send_rej(child, NULL, 0, CM_REJ_CONSUMER);
				cm_close(child);
				unlink_id(child);
				free(child->id.route.path_rec);
				free(child);
			}
			continue;
		}
		last = e;
		p = &e->next;
	}
	c->tail = last;
}

/* Leave the connection as the kernel's destroy does: the peer hears
 * REJ, DREQ or DREP at once instead of waiting out its timers. Under
 * cma_lock. */
static void leave(struct cma_id *id)
{
	switch (id->state) {
	case CS_REQ_RCVD:
		if (id->id.ps != RDMA_PS_UDP)
			cm_send_rej(id, NULL, 0, CM_REJ_CONSUMER);
		break;
	case CS_REQ_SENT:
	case CS_REP_RCVD:
		cm_send_rej(id, NULL, 0, CM_REJ_TIMEOUT);
		break;
	case CS_REP_SENT:
	case CS_ESTABLISHED:
		cm_send_dreq(id);
		break;
	case CS_DREQ_RCVD:
		cm_send_drep(id);
		break;
	default:
		break;
	}
}

/*
 * A process that exits without destroying its ids: the kernel destroys
 * them when the process's rdma_cm file closes, so its peers hear the
 * DREQ or DREP at once. Here that is this destructor (qperf's server
 * children exit with a DREQ unanswered; the peer otherwise waited for its
 * DREQ's retransmission, seconds, for the orphan DREP). The lock is only
 * tried: a thread that holds it at exit keeps it.
 */
__attribute__((destructor)) static void cma_exit(void)
{
	for (int i = 0; i < 100; i++) {
		if (!pthread_mutex_trylock(&cma_lock)) {
			for (struct cma_id *id = cma_ids; id; id = id->next)
				if (!id->destroying)
					leave(id);
			pthread_mutex_unlock(&cma_lock);
			return;
		}
		usleep(1000);
	}
}

CMA_EXPORT int rdma_destroy_id(struct rdma_cm_id *cid)
{
	struct cma_id *id = (struct cma_id *)cid;

	if (!id)
		return cma_errno(-EINVAL);
	ack_last(id);
	pthread_mutex_lock(&cma_lock);
	id->destroying = true;
	drop_events(id);
	/* every event handed out must be acked first (librdmacm's rule) */
	while (id->reported != id->acked)
		pthread_cond_wait(&cma_cond, &cma_lock);
	leave(id);
	if (id->listener && id->state == CS_REQ_RCVD &&
	    id->listener->pending > 0)
		id->listener->pending--;
	/* a listener's children not yet given to the app go with it */
	for (struct cma_id *c = cma_ids; c; c = c->next)
		if (c->listener == id)
			c->listener = NULL;
	cm_close(id);
	unlink_id(id);
	pthread_mutex_unlock(&cma_lock);
	free(id->id.route.path_rec);
	free(id->ep_qp_attr);
	if (id->chan->own)
		rdma_destroy_event_channel(&id->chan->ch);
	free(id);
	return 0;
}

CMA_EXPORT int rdma_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr)
{
	struct cma_id *id = (struct cma_id *)cid;
	union ibv_gid g;
	int r = 0, port;

	if (!id || !addr)
		return cma_errno(-EINVAL);
	if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)
		return cma_errno(-EAFNOSUPPORT);
	port = addr_port_of(addr);
	pthread_mutex_lock(&cma_lock);
	if (id->state != CS_IDLE) {
		r = -EINVAL;
	} else if (!addr_gid(addr, &g)) {
		/* a specific address: it must be one of the device's GIDs */
		r = addr_local_gid_index(&g);
		if (r >= 0) {
			id->sgid_index = (uint8_t)r;
			id->id.route.addr.addr.ibaddr.sgid = g;
			/* A loopback address is bound as the wildcard is, with
			 * no device yet: a kernel refuses it (ENODEV, no RoCE
			 * port has lo's GID) and libfabric, which asks for
			 * "localhost" first, then looks for the device's real
			 * addresses only if the bind left id->verbs NULL. */
			if (!addr_is_loopback(addr))
				cma_set_dev(id);
			r = 0;
		} else {
			r = -ENODEV;
		}
	}
	if (!r)
		r = cm_bind_port(id, (uint16_t)port);
	if (!r) {
		memcpy(&id->id.route.addr.src_storage, addr, addr_len(addr));
		addr_set_port(&id->id.route.addr.src_addr, id->port);
		id->state = CS_BOUND;
	}
	pthread_mutex_unlock(&cma_lock);
	return cma_errno(r);
}

CMA_EXPORT int rdma_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src,
				 struct sockaddr *dst, int timeout_ms)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r;

	(void)timeout_ms;
	if (!id || !dst)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	r = addr_resolve(id, src, dst);
	if (!r)
		cma_queue(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, NULL);
	pthread_mutex_unlock(&cma_lock);
	if (r)
		return cma_errno(r);
	return complete(id);
}

CMA_EXPORT int rdma_resolve_route(struct rdma_cm_id *cid, int timeout_ms)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r = 0;

	(void)timeout_ms;
	if (!id)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	if (id->state != CS_ADDR) {
		r = -EINVAL;
	} else {
		/* RoCE: no SA query, the path is the port's (rdma-cm.md 3.4) */
		addr_route(id);
		id->state = CS_ROUTE;
		cma_queue(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, NULL);
	}
	pthread_mutex_unlock(&cma_lock);
	if (r)
		return cma_errno(r);
	return complete(id);
}

CMA_EXPORT int rdma_listen(struct rdma_cm_id *cid, int backlog)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r = 0;

	if (!id)
		return cma_errno(-EINVAL);
	if (id->state == CS_IDLE) {
		struct sockaddr_in any = { .sin_family = AF_INET };

		if (rdma_bind_addr(cid, (struct sockaddr *)&any))
			return -1;
	}
	pthread_mutex_lock(&cma_lock);
	if (id->state != CS_BOUND)
		r = -EINVAL;
	else {
		id->backlog = backlog <= 0 || backlog > 1024 ? 1024 : backlog;
		id->state = CS_LISTEN;
	}
	pthread_mutex_unlock(&cma_lock);
	return cma_errno(r);
}

/* --- QPs ------------------------------------------------------------------ */

static int qp_init(struct cma_id *id, struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;

	if (qp->qp_type == IBV_QPT_UD) {
		a.qkey = CM_UDP_QKEY;
		if (ibv_modify_qp(qp, &a, mask | IBV_QP_QKEY))
			return -1;
		/* UD QPs of rdma_create_qp go to RTS at once */
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
			return -1;
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? -1 : 0;
	}
	(void)id;
	a.qp_access_flags = 0;
	return ibv_modify_qp(qp, &a, mask | IBV_QP_ACCESS_FLAGS) ? -1 : 0;
}

/* A CQ of the id's own and its completion channel, of n entries (at
 * least one); 0, or -1 with errno */
static int own_cq(struct cma_id *id, uint32_t n, struct ibv_cq **use,
		  struct ibv_cq **cq, struct ibv_comp_channel **ch)
{
	*ch = ibv_create_comp_channel(id->id.verbs);
	if (!*ch)
		return -1;
	*cq = ibv_create_cq(id->id.verbs, n ? (int)n : 1, id, *ch, 0);
	if (!*cq) {
		int e = errno;

		ibv_destroy_comp_channel(*ch);
		*ch = NULL;
		errno = e;
		return -1;
	}
	*use = *cq;
	return 0;
}

CMA_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *cid,
				 struct ibv_qp_init_attr_ex *attr)
{
	struct cma_id *id = (struct cma_id *)cid;
	struct ibv_qp *qp;

	if (!id || !attr)
		return cma_errno(-EINVAL);
	if (!id->id.verbs)
		return cma_errno(-EINVAL);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->id.pd ? id->id.pd : cma_default_pd();
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	id->id.pd = attr->pd;
	/* no CQs given: the id gets its own, with channels (ucma_create_cqs) */
	if ((!attr->recv_cq && own_cq(id, attr->cap.max_recv_wr, &attr->recv_cq,
				      &id->id.recv_cq, &id->id.recv_cq_channel)) ||
	    (!attr->send_cq && own_cq(id, attr->cap.max_send_wr, &attr->send_cq,
				      &id->id.send_cq, &id->id.send_cq_channel)))
		return -1;
	attr->qp_type = attr->qp_type ? attr->qp_type : id->id.qp_type;
	qp = ibv_create_qp_ex(id->id.verbs, attr);
	if (!qp)
		return -1;
	if (qp_init(id, qp)) {
		int e = errno;

		ibv_destroy_qp(qp);
		errno = e;
		return -1;
	}
	id->id.qp = qp;
	id->id.qp_type = qp->qp_type;
	id->id.srq = attr->srq;
	return 0;
}

CMA_EXPORT int rdma_create_qp(struct rdma_cm_id *cid, struct ibv_pd *pd,
			      struct ibv_qp_init_attr *qa)
{
	struct ibv_qp_init_attr_ex ex;
	int r;

	if (!cid || !qa)
		return cma_errno(-EINVAL);
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, qa, sizeof(*qa));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	r = rdma_create_qp_ex(cid, &ex);
	if (!r) {
		qa->send_cq = ex.send_cq;
		qa->recv_cq = ex.recv_cq;
		qa->cap = ex.cap;
	}
	return r;
}

CMA_EXPORT void rdma_destroy_qp(struct rdma_cm_id *cid)
{
	struct ibv_qp *qp;

	if (!cid)
		return;
	/* the CM thread reads id->qp under cma_lock (a DREQ names the QP,
	 * a REJ moves it to the error state): take it away first */
	pthread_mutex_lock(&cma_lock);
	qp = cid->qp;
	cid->qp = NULL;
	pthread_mutex_unlock(&cma_lock);
	if (!qp)
		return;
	ibv_destroy_qp(qp);
	if (cid->send_cq) {
		ibv_destroy_cq(cid->send_cq);
		ibv_destroy_comp_channel(cid->send_cq_channel);
		cid->send_cq = NULL;
		cid->send_cq_channel = NULL;
	}
	if (cid->recv_cq) {
		ibv_destroy_cq(cid->recv_cq);
		ibv_destroy_comp_channel(cid->recv_cq_channel);
		cid->recv_cq = NULL;
		cid->recv_cq_channel = NULL;
	}
}

/* rdma_init_qp_attr's answer for the state the QP should go to next */
static int qp_attr_for(struct cma_id *id, enum ibv_qp_state s,
		       struct ibv_qp_attr *a, int *mask)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = s;
	switch (s) {
	case IBV_QPS_INIT:
		a->port_num = 1;
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (id->id.qp_type == IBV_QPT_UD) {
			a->qkey = CM_UDP_QKEY;
			*mask |= IBV_QP_QKEY;
		} else {
			a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				(id->resp_res ? IBV_ACCESS_REMOTE_READ |
				 IBV_ACCESS_REMOTE_ATOMIC : 0);
			*mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	case IBV_QPS_RTR:
		a->path_mtu = (enum ibv_mtu)(id->mtu ? id->mtu : IBV_MTU_1024);
		a->dest_qp_num = id->rqpn;
		a->rq_psn = id->psn;
		a->max_dest_rd_atomic = id->resp_res;
		a->min_rnr_timer = 12;
		a->ah_attr.is_global = 1;
		a->ah_attr.port_num = 1;
		a->ah_attr.grh.dgid = id->id.route.addr.addr.ibaddr.dgid;
		a->ah_attr.grh.sgid_index = id->sgid_index;
		a->ah_attr.grh.hop_limit = 64;
		a->ah_attr.grh.traffic_class = id->tos;
		a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
			(id->resp_res ? IBV_ACCESS_REMOTE_READ |
			 IBV_ACCESS_REMOTE_ATOMIC : 0);
		*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		return 0;
	case IBV_QPS_RTS:
		a->sq_psn = id->rpsn;
		a->timeout = id->ack_timeout;
		a->retry_cnt = id->retry;
		a->rnr_retry = id->rnr_retry;
		a->max_rd_atomic = id->init_depth;
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			IBV_QP_MAX_QP_RD_ATOMIC;
		return 0;
	default:
		return -EINVAL;
	}
}

int cma_modify_qp_rtr_rts(struct cma_id *id)
{
	struct ibv_qp_attr a;
	int mask;

	qp_attr_for(id, IBV_QPS_RTR, &a, &mask);
	if (ibv_modify_qp(id->id.qp, &a, mask | IBV_QP_ACCESS_FLAGS))
		return -1;
	qp_attr_for(id, IBV_QPS_RTS, &a, &mask);
	return ibv_modify_qp(id->id.qp, &a, mask) ? -1 : 0;
}

int cma_qp_to_error(struct cma_id *id)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	return id->id.qp ? ibv_modify_qp(id->id.qp, &a, IBV_QP_STATE) : 0;
}

CMA_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *cid,
				 struct ibv_qp_attr *a, int *mask)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r;

	if (!id || !a || !mask)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	r = qp_attr_for(id, a->qp_state, a, mask);
	pthread_mutex_unlock(&cma_lock);
	return cma_errno(r);
}

/* --- connecting ------------------------------------------------------------ */

/* librdmacm's defaults and limits for connection parameters */
static int conn_param(struct cma_id *id, const struct rdma_conn_param *in,
		      struct rdma_conn_param *p, bool accept)
{
	struct ibv_device_attr da;

	if (ibv_query_device(id->id.verbs ? id->id.verbs : cma_ctx(), &da))
		return -ENODEV;
	if (!in) {
		if (!id->id.qp && id->id.qp_type != IBV_QPT_UD)
			return -EINVAL;
		memset(p, 0, sizeof(*p));
		p->retry_count = p->rnr_retry_count = 7;
		p->responder_resources = RDMA_MAX_RESP_RES;
		p->initiator_depth = RDMA_MAX_INIT_DEPTH;
	} else {
		*p = *in;
	}
	if (p->responder_resources == RDMA_MAX_RESP_RES)
		p->responder_resources = (uint8_t)da.max_qp_rd_atom;
	else if (p->responder_resources > da.max_qp_rd_atom)
		return accept ? (p->responder_resources = (uint8_t)da.max_qp_rd_atom), 0
			      : -EINVAL;
	if (p->initiator_depth == RDMA_MAX_INIT_DEPTH)
		p->initiator_depth = (uint8_t)da.max_qp_init_rd_atom;
	else if (p->initiator_depth > da.max_qp_init_rd_atom)
		return -EINVAL;
	return 0;
}

CMA_EXPORT int rdma_connect(struct rdma_cm_id *cid,
			    struct rdma_conn_param *in)
{
	struct cma_id *id = (struct cma_id *)cid;
	struct rdma_conn_param p;
	uint32_t psn;
	int r;

	if (!id)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	r = id->state != CS_ROUTE ? -EINVAL : conn_param(id, in, &p, false);
	if (!r)
		r = cm_new_comm_id(id);
	if (!r && id->id.qp_type == IBV_QPT_UD) {
		id->state = CS_SIDR_SENT;
		r = cm_send_sidr_req(id, in);
	} else if (!r) {
		if (getrandom(&psn, sizeof(psn), 0) != sizeof(psn))
			psn = (uint32_t)(uintptr_t)id;
		id->psn = psn & 0xffffff;
		id->state = CS_REQ_SENT;
		r = cm_send_req(id, &p);
	}
	if (r && id->state != CS_ROUTE)
		id->state = CS_ROUTE;
	pthread_mutex_unlock(&cma_lock);
	if (r)
		return cma_errno(r);
	return complete(id);
}

CMA_EXPORT int rdma_establish(struct rdma_cm_id *cid)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r = 0;

	if (!id)
		return cma_errno(-EINVAL);
	/* the RTU and nothing more: the kernel reports no ESTABLISHED to an
	 * active side that took CONNECT_RESPONSE (UCX asserts it never
	 * comes), and rdma-core's call waits for no event */
	pthread_mutex_lock(&cma_lock);
	if (id->state != CS_REP_RCVD || id->id.qp) {
		r = -EINVAL;
	} else {
		r = cm_send_rtu(id);
		if (!r)
			id->state = CS_ESTABLISHED;
	}
	pthread_mutex_unlock(&cma_lock);
	return r ? cma_errno(r) : 0;
}

CMA_EXPORT int rdma_accept(struct rdma_cm_id *cid, struct rdma_conn_param *in)
{
	struct cma_id *id = (struct cma_id *)cid;
	struct rdma_conn_param p;
	int r;

	if (!id)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	r = id->state != CS_REQ_RCVD ? -EINVAL : conn_param(id, in, &p, true);
	if (!r && id->id.qp_type == IBV_QPT_UD) {
		r = cm_send_sidr_rep(id, &p, CM_SIDR_OK, p.private_data,
				     p.private_data_len);
		if (!r) {
			id->state = CS_ESTABLISHED;
			if (id->listener && id->listener->pending > 0)
				id->listener->pending--;
		}
		pthread_mutex_unlock(&cma_lock);
		return cma_errno(r);
	}
	if (!r) {
		id->resp_res = p.responder_resources;
		id->init_depth = p.initiator_depth;
		if (id->id.qp && cma_modify_qp_rtr_rts(id))
			r = -errno;
	}
	if (!r)
		r = cm_send_rep(id, &p);
	if (!r) {
		id->state = CS_REP_SENT;
		if (id->listener && id->listener->pending > 0)
			id->listener->pending--;
	}
	pthread_mutex_unlock(&cma_lock);
	if (r)
		return cma_errno(r);
	return complete(id);
}

static int reject(struct rdma_cm_id *cid, const void *priv, uint8_t len,
		  uint16_t reason)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r;

	if (!id)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	if (id->state != CS_REQ_RCVD)
		r = -EINVAL;
	else if (id->id.qp_type == IBV_QPT_UD)
		r = cm_send_sidr_rep(id, NULL, CM_SIDR_REJECT, priv, len);
	else
		r = cm_send_rej(id, priv, len, reason);
	if (!r) {
		if (id->listener && id->listener->pending > 0)
			id->listener->pending--;
		id->state = CS_DISCONNECTED;
	}
	pthread_mutex_unlock(&cma_lock);
	return cma_errno(r);
}

CMA_EXPORT int rdma_reject(struct rdma_cm_id *cid, const void *priv,
			   uint8_t len)
{
	return reject(cid, priv, len, CM_REJ_CONSUMER);
}

CMA_EXPORT int rdma_reject_ece(struct rdma_cm_id *cid, const void *priv,
			       uint8_t len)
{
	return reject(cid, priv, len, CM_REJ_VENDOR_OPTION);
}

CMA_EXPORT int rdma_notify(struct rdma_cm_id *cid, enum ibv_event_type ev)
{
	struct cma_id *id = (struct cma_id *)cid;

	if (!id)
		return cma_errno(-EINVAL);
	if (ev != IBV_EVENT_COMM_EST)
		return 0;
	pthread_mutex_lock(&cma_lock);
	/* data came before the RTU: the connection is up (12.9.6) */
	if (id->state == CS_REP_SENT) {
		id->out_left = 0;
		id->state = CS_ESTABLISHED;
		cma_queue(id, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, NULL);
	}
	pthread_mutex_unlock(&cma_lock);
	return 0;
}

CMA_EXPORT int rdma_disconnect(struct rdma_cm_id *cid)
{
	struct cma_id *id = (struct cma_id *)cid;
	int r = 0;

	if (!id)
		return cma_errno(-EINVAL);
	pthread_mutex_lock(&cma_lock);
	cma_qp_to_error(id);
	switch (id->state) {
	case CS_ESTABLISHED:
	case CS_REP_SENT:
		if (id->id.qp_type == IBV_QPT_UD)
			break;
		id->state = CS_DREQ_SENT;
		r = cm_send_dreq(id);
		break;
	case CS_DREQ_RCVD:
		r = cm_send_drep(id);
		id->state = CS_DISCONNECTED;
		break;
	case CS_DREQ_SENT:
	case CS_DISCONNECTED:
		break;
	default:
		r = -EINVAL;
	}
	pthread_mutex_unlock(&cma_lock);
	if (r)
		return cma_errno(r);
	if (id->sync && id->state == CS_DREQ_SENT)
		return complete(id);
	return 0;
}

/* A synchronous id of its own, now (rdma_get_request: the request's
 * event, still unacked, stays the id's) */
int cma_own_channel(struct cma_id *id)
{
	struct cma_chan *nc = chan_new(true);

	if (!nc)
		return -ENOMEM;
	pthread_mutex_lock(&cma_lock);
	id->chan = nc;
	id->id.channel = &nc->ch;
	id->sync = true;
	pthread_mutex_unlock(&cma_lock);
	return 0;
}

CMA_EXPORT int rdma_migrate_id(struct rdma_cm_id *cid,
			       struct rdma_event_channel *ch)
{
	struct cma_id *id = (struct cma_id *)cid;
	struct cma_chan *old, *nc;

	if (!id || (id->sync && !ch))
		return cma_errno(-EINVAL);
	nc = ch ? (struct cma_chan *)ch : chan_new(true);
	if (!nc)
		return cma_errno(-ENOMEM);
	ack_last(id);	/* (libfabric migrates rdma_create_ep's ids) */
	pthread_mutex_lock(&cma_lock);
	while (id->reported != id->acked)
		pthread_cond_wait(&cma_cond, &cma_lock);
	old = id->chan;
	/* events not yet read follow the id (the old channel's count stays
	 * one higher: its reader finds nothing and reads again) */
	for (struct cma_event **p = &old->head, *last = NULL; *p;) {
		struct cma_event *e = *p;
		uint64_t one = 1;

		if (e->owner != id) {
			last = e;
			p = &e->next;
			old->tail = last;
			continue;
		}
		*p = e->next;
		if (!*p)
			old->tail = last;
		e->next = NULL;
		if (nc->tail)
			nc->tail->next = e;
		else
			nc->head = e;
		nc->tail = e;
		if (write(nc->ch.fd, &one, sizeof(one)) < 0)
			break;
	}
	id->chan = nc;
	id->id.channel = &nc->ch;
	id->sync = !ch;
	pthread_mutex_unlock(&cma_lock);
	if (old->own)
		rdma_destroy_event_channel(&old->ch);
	return 0;
}

CMA_EXPORT int rdma_set_option(struct rdma_cm_id *cid, int level, int name,
			       void *val, size_t len)
{
	struct cma_id *id = (struct cma_id *)cid;

	if (!id || !val)
		return cma_errno(-EINVAL);
	if (level != RDMA_OPTION_ID)
		return cma_errno(-ENOSYS);
	switch (name) {
	case RDMA_OPTION_ID_TOS:
		if (len != sizeof(uint8_t))
			return cma_errno(-EINVAL);
		id->tos = *(uint8_t *)val;
		id->tos_set = true;
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
		if (len != sizeof(int))
			return cma_errno(-EINVAL);
		id->reuse = *(int *)val;
		return 0;
	case RDMA_OPTION_ID_AFONLY:
		if (len != sizeof(int) || id->state > CS_BOUND)
			return cma_errno(-EINVAL);
		id->afonly = *(int *)val;
		return 0;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (len != sizeof(uint8_t) || id->id.qp_type != IBV_QPT_RC)
			return cma_errno(-EINVAL);
		id->ack_timeout = *(uint8_t *)val;
		id->ack_timeout_set = true;
		return 0;
	default:
		return cma_errno(-ENOSYS);
	}
}

CMA_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *cid)
{
	return htobe16((uint16_t)addr_port_of(&cid->route.addr.src_addr));
}

CMA_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *cid)
{
	return htobe16((uint16_t)addr_port_of(&cid->route.addr.dst_addr));
}

CMA_EXPORT struct ibv_context **rdma_get_devices(int *num)
{
	struct ibv_context **l = calloc(2, sizeof(*l));

	pthread_mutex_lock(&cma_lock);
	if (l)
		l[0] = cma_ctx();
	pthread_mutex_unlock(&cma_lock);
	if (num)
		*num = l && l[0] ? 1 : 0;
	return l;
}

CMA_EXPORT void rdma_free_devices(struct ibv_context **l)
{
	free(l);
}

/* ECE (rdma-cm.md 5.6): ursa's device has no vendor options, as rxe */
CMA_EXPORT int rdma_set_local_ece(struct rdma_cm_id *cid, struct ibv_ece *e)
{
	if (!cid || !e || cid->qp || !e->vendor_id || e->comp_mask)
		return cma_errno(-EINVAL);
	return 0;
}

CMA_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *cid, struct ibv_ece *e)
{
	if (!cid || !e || cid->qp)
		return cma_errno(-EINVAL);
	memset(e, 0, sizeof(*e));
	return 0;
}

/* Multicast: ursa's device has none (max_mcast_grp 0), so as a device
 * without multicast support, ENOSYS */
CMA_EXPORT int rdma_join_multicast(struct rdma_cm_id *cid,
				   struct sockaddr *addr, void *ctx)
{
	(void)cid, (void)addr, (void)ctx;
	return cma_errno(-ENOSYS);
}

CMA_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *cid,
				      struct rdma_cm_join_mc_attr_ex *a,
				      void *ctx)
{
	(void)cid, (void)a, (void)ctx;
	return cma_errno(-ENOSYS);
}

CMA_EXPORT int rdma_leave_multicast(struct rdma_cm_id *cid,
				    struct sockaddr *addr)
{
	(void)cid, (void)addr;
	return cma_errno(-EADDRNOTAVAIL);
}
