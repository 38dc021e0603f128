// SPDX-License-Identifier: MIT
/*
 * cm.c - the IB CM protocol (IBTA vol. 1 chapter 12) under ursa's
 * librdmacm: the messages an id sends, what each received message does to
 * the id it names, retransmission, and the thread that runs it.
 *
 * Every id that holds a port (a service ID: rdma_bind_addr, or the
 * ephemeral port of an active id) binds the abstract datagram socket
 * "ursa/cm/s/<sid>", and every id in a connection "ursa/cm/c/<comm id>".
 * The kernel makes those names unique in the network namespace (a second
 * listener on a port gets EADDRINUSE, whichever process it is in) and
 * removes them when the process dies. libibverbs' QP1 (transport/gsi.c)
 * hands each received CM MAD to the socket its destination names, as a
 * struct cm_fwd; this thread reads them, and sends with ursa_cm_send().
 *
 * The CM sends no acknowledgements: REQ, REP, DREQ and SIDR_REQ are sent
 * again every out_ms until answered, out_left times in all; RTU, REJ,
 * DREP and MRA go once and again only when what they answer comes again
 * (12.9.2). Timeouts and retries are the kernel's (rdma-cm.md 4.3) unless
 * URSA_CM_TIMEOUT_MS / URSA_CM_RETRIES say otherwise.
 */
#include "cma.h"
#include "../util/config.h"
#include "../util/limits.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../../include/ursa/ursa.h"


static int ep_fd = -1, wake_fd = -1;
static pthread_t thr;

/* URSA_CM_TIMEOUT_MS / URSA_CM_RETRIES, read once (cm_start) */
static unsigned cfg_timeout_ms, cfg_retries = URSA_CM_MAX_RETRIES;
static bool cfg_trace;		/* URSA_CM_TRACE: every MAD on stderr */

static const char *attr_name(uint16_t a)
{
	static const char *const n[] = { "REQ", "MRA", "REJ", "REP", "RTU",
					 "DREQ", "DREP", "SIDR_REQ",
					 "SIDR_REP" };

	return a >= CM_REQ && a <= CM_SIDR_REP ? n[a - CM_REQ] : "?";
}

/* this process's MADs: taken, sent (retransmissions too), refused */
static _Atomic uint32_t n_rx, n_tx, n_refused;

static void trace(const char *dir, const struct cm_msg *m)
{
	if (cfg_trace)
		fprintf(stderr, "ursa cm: pid %d %s %s local 0x%08x remote 0x%08x"
			" qpn 0x%06x reason %u status %u sid 0x%" PRIx64 "\n",
			(int)getpid(), dir, attr_name(m->attr), m->local_id,
			m->remote_id, m->qpn, m->reason, m->status, m->sid);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t rand32(void)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint32_t)now_ns() * 2654435761u;
	return v;
}

uint64_t cm_node_guid(void)
{
	struct ibv_device_attr a;
	struct ibv_context *c = cma_ctx();

	if (!c || ibv_query_device(c, &a))
		return 0;
	return be64toh(a.node_guid);
}

/* Bind the abstract datagram socket of a route (cm_route_addr) and watch
 * it; the fd, or -errno. */
static int bind_name(uint64_t key, bool by_sid)
{
	struct sockaddr_un sa;
	socklen_t sl = cm_route_addr(&sa, key, by_sid);
	struct epoll_event ev = { .events = EPOLLIN };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return -errno;
	/* the sender's credentials come with every datagram (on_fd) */
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &(int){ 1 }, sizeof(int)) ||
	    bind(fd, (struct sockaddr *)&sa, sl)) {
		int e = errno;

		close(fd);
		return -e;
	}
	ev.data.fd = fd;
	epoll_ctl(ep_fd, EPOLL_CTL_ADD, fd, &ev);
	return fd;
}

static void unbind_fd(int *fd)
{
	if (*fd >= 0) {
		epoll_ctl(ep_fd, EPOLL_CTL_DEL, *fd, NULL);
		close(*fd);
		*fd = -1;
	}
}

int cm_bind_port(struct cma_id *id, uint16_t port)
{
	int fd = -EADDRINUSE;

	for (int i = 0; i < (port ? 1 : 64) && fd == -EADDRINUSE; i++) {
		/* ephemeral: net.ipv4.ip_local_port_range's default span */
		uint16_t p = port ? port : (uint16_t)(32768 + rand32() % 28232);

		fd = bind_name(cm_sid((uint16_t)id->id.ps, p), true);
		if (fd >= 0)
			id->port = p;
	}
	if (fd < 0)
		return fd == -EADDRINUSE && !port ? -EADDRNOTAVAIL : fd;
	id->sfd = fd;
	return 0;
}

int cm_new_comm_id(struct cma_id *id)
{
	int fd = -EADDRINUSE;

	for (int i = 0; i < 64 && fd == -EADDRINUSE; i++) {
		uint32_t c = rand32();

		if (!c)
			continue;	/* 0 means "unknown" (12.6.5) */
		fd = bind_name(c, false);
		if (fd >= 0)
			id->lcid = c;
	}
	if (fd < 0)
		return fd;
	id->cfd = fd;
	return 0;
}

void cm_close(struct cma_id *id)
{
	unbind_fd(&id->sfd);
	unbind_fd(&id->cfd);
	id->out_left = 0;
}

/* --- sending ----------------------------------------------------------- */

static int send_msg(struct cma_id *id, const struct cm_msg *m, bool keep,
		    unsigned ms, int sends)
{
	uint8_t mad[CM_MAD_LEN];
	int r = cm_build(mad, m);

	if (r)
		return r;
	trace("send", m);
	if (keep) {
		memcpy(id->out, mad, sizeof(mad));
		id->out_ms = cfg_timeout_ms ? cfg_timeout_ms : ms;
		id->out_left = sends;
		id->out_due = now_ns() + (uint64_t)id->out_ms * 1000000ull;
		cm_wake();
	}
	r = ursa_cm_send(&id->id.route.addr.addr.ibaddr.sgid,
			 &id->id.route.addr.addr.ibaddr.dgid, id->tos, mad);
	n_tx++;
	/* a lost send is a lost packet: the retransmission covers it */
	return keep ? 0 : r;
}

static uint8_t cap7(uint8_t v)
{
	return v > 7 ? 7 : v;
}

static void put_priv(struct cm_msg *m, size_t off, const void *p, size_t n)
{
	memcpy(m->priv + off, p, n);
	m->priv_len = (uint8_t)(off + n);
}

static void cma_header(struct cma_id *id, struct cm_msg *m)
{
	struct cma_hdr h = { .port = id->port };
	uint8_t b[CMA_HDR_LEN];

	h.ipver = id->id.route.addr.src_addr.sa_family == AF_INET6 &&
		  !IN6_IS_ADDR_V4MAPPED(&id->id.route.addr.src_sin6.sin6_addr) ? 6 : 4;
	memcpy(h.src, id->id.route.addr.addr.ibaddr.sgid.raw, 16);
	memcpy(h.dst, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
	cma_hdr_put(b, &h);
	put_priv(m, 0, b, sizeof(b));
}

int cm_send_req(struct cma_id *id, const struct rdma_conn_param *p)
{
	struct cm_msg m = { .attr = CM_REQ };
	uint16_t dport = (uint16_t)addr_port_of(&id->id.route.addr.dst_addr);

	if (p->private_data_len > CM_REQ_PRIV - CMA_HDR_LEN)
		return -EINVAL;
	m.local_id = id->lcid;
	m.tid = (uint64_t)rand32() << 32 | id->lcid;
	id->tid = m.tid;
	m.sid = cm_sid((uint16_t)id->id.ps, dport);
	m.guid = cm_node_guid();
	m.qpn = id->id.qp ? id->id.qp->qp_num : p->qp_num;
	m.resp_res = p->responder_resources;
	m.init_depth = p->initiator_depth;
	m.remote_cm_timeout = m.local_cm_timeout = URSA_CM_RESPONSE_TIMEOUT;
	m.transport = id->id.qp && id->id.qp->qp_type == IBV_QPT_UC ? 1 : 0;
	m.flow_ctl = p->flow_control;
	m.psn = id->psn;
	m.retry = cap7(p->retry_count);
	m.rnr_retry = cap7(p->rnr_retry_count);
	m.pkey = 0xffff;
	m.mtu = id->mtu;
	m.max_cm_retries = (uint8_t)(cfg_retries > 15 ? 15 : cfg_retries);
	m.srq = id->id.qp ? !!id->id.qp->srq : p->srq;
	memcpy(m.sgid, id->id.route.addr.addr.ibaddr.sgid.raw, 16);
	memcpy(m.dgid, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
	m.flow_label = (uint32_t)(id->port * 31u + dport) & 0xfffff;
	m.tclass = id->tos;
	m.hop_limit = 64;
	m.ack_timeout = id->ack_timeout;
	cma_header(id, &m);
	if (p->private_data_len)
		put_priv(&m, CMA_HDR_LEN, p->private_data, p->private_data_len);
	id->retry = m.retry;
	return send_msg(id, &m, true,
			2 * cm_ms(URSA_CM_LIFETIME) +
				cm_ms(URSA_CM_RESPONSE_TIMEOUT),
			(int)cfg_retries + 1);
}

int cm_send_rep(struct cma_id *id, const struct rdma_conn_param *p)
{
	struct cm_msg m = { .attr = CM_REP, .tid = id->tid };

	if (p->private_data_len > CM_REP_PRIV)
		return -EINVAL;
	m.local_id = id->lcid;
	m.remote_id = id->rcid;
	m.qpn = id->id.qp ? id->id.qp->qp_num : p->qp_num;
	m.psn = id->psn;
	m.resp_res = p->responder_resources;
	m.init_depth = p->initiator_depth;
	m.target_ack_delay = URSA_CM_ACK_DELAY;
	m.flow_ctl = p->flow_control;
	m.rnr_retry = cap7(p->rnr_retry_count);
	m.srq = id->id.qp ? !!id->id.qp->srq : p->srq;
	m.guid = cm_node_guid();
	if (p->private_data_len)
		put_priv(&m, 0, p->private_data, p->private_data_len);
	/* the REQ said how long to wait and how often (12.7.28-29) */
	return send_msg(id, &m, true, id->out_ms, (int)cfg_retries + 1);
}

static int send_simple(struct cma_id *id, uint16_t attr)
{
	struct cm_msg m = { .attr = attr, .tid = id->tid,
			    .local_id = id->lcid, .remote_id = id->rcid };

	return send_msg(id, &m, false, 0, 0);
}

int cm_send_rtu(struct cma_id *id)
{
	return send_simple(id, CM_RTU);
}

int cm_send_drep(struct cma_id *id)
{
	return send_simple(id, CM_DREP);
}

int cm_send_dreq(struct cma_id *id)
{
	struct cm_msg m = { .attr = CM_DREQ, .local_id = id->lcid,
			    .remote_id = id->rcid, .qpn = id->rqpn };

	m.tid = (uint64_t)rand32() << 32 | id->lcid;
	return send_msg(id, &m, true, cm_ms(id->ack_timeout) +
			cm_ms(URSA_CM_RESPONSE_TIMEOUT), (int)cfg_retries + 1);
}

int cm_send_rej(struct cma_id *id, const void *priv, uint8_t len,
		uint16_t reason)
{
	struct cm_msg m = { .attr = CM_REJ, .tid = id->tid,
			    .local_id = id->lcid, .remote_id = id->rcid,
			    .reason = reason };

	if (len > CM_REJ_PRIV)
		return -EINVAL;
	m.msg = id->state == CS_REQ_RCVD ? CM_MSG_REQ :
		id->state == CS_REP_RCVD ? CM_MSG_REP : CM_MSG_OTHER;
	if (len)
		put_priv(&m, 0, priv, len);
	return send_msg(id, &m, false, 0, 0);
}

int cm_send_sidr_req(struct cma_id *id, const struct rdma_conn_param *p)
{
	struct cm_msg m = { .attr = CM_SIDR_REQ, .pkey = 0xffff };
	uint16_t dport = (uint16_t)addr_port_of(&id->id.route.addr.dst_addr);

	if (p && p->private_data_len > CM_SIDR_REQ_PRIV - CMA_HDR_LEN)
		return -EINVAL;
	m.local_id = id->lcid;
	m.tid = (uint64_t)rand32() << 32 | id->lcid;
	m.sid = cm_sid((uint16_t)id->id.ps, dport);
	cma_header(id, &m);
	if (p && p->private_data_len)
		put_priv(&m, CMA_HDR_LEN, p->private_data, p->private_data_len);
	return send_msg(id, &m, true, cm_ms(URSA_CM_RESPONSE_TIMEOUT),
			(int)cfg_retries + 1);
}

int cm_send_sidr_rep(struct cma_id *id, const struct rdma_conn_param *p,
		     uint8_t status, const void *priv, uint8_t len)
{
	struct cm_msg m = { .attr = CM_SIDR_REP, .tid = id->tid,
			    .local_id = id->rcid, .status = status };

	if (len > CM_SIDR_REP_PRIV)
		return -EINVAL;
	m.sid = cm_sid((uint16_t)id->id.ps, id->port);
	if (!status) {
		m.qpn = id->id.qp ? id->id.qp->qp_num : (p ? p->qp_num : 0);
		m.qkey = CM_UDP_QKEY;
	}
	if (len)
		put_priv(&m, 0, priv, len);
	return send_msg(id, &m, false, 0, 0);
}

/* --- receiving ---------------------------------------------------------- */

void cm_fill_ud(struct cma_id *id, struct rdma_ud_param *ud,
		const union ibv_gid *dgid, uint32_t qpn, uint32_t qkey)
{
	memset(&ud->ah_attr, 0, sizeof(ud->ah_attr));
	ud->ah_attr.is_global = 1;
	ud->ah_attr.port_num = 1;
	ud->ah_attr.grh.dgid = *dgid;
	ud->ah_attr.grh.sgid_index = id->sgid_index;
	ud->ah_attr.grh.hop_limit = 64;
	ud->ah_attr.grh.traffic_class = id->tos;
	ud->qp_num = qpn;
	ud->qkey = qkey;
}

/* A new id for a request a listener took (12.9.5.1, 12.11.1) */
static struct cma_id *child_of(struct cma_id *l, const struct cm_msg *m,
			       const struct cma_hdr *h)
{
	struct cma_id *c = calloc(1, sizeof(*c));
	union ibv_gid g;
	int gi;

	if (!c)
		return NULL;
	memcpy(g.raw, h->dst, 16);
	gi = addr_local_gid_index(&g);
	if (gi < 0) {
		free(c);
		return NULL;
	}
	c->sfd = c->cfd = -1;
	cma_set_dev(c);
	c->id.channel = l->id.channel;
	c->chan = l->chan;
	c->id.context = l->id.context;
	c->id.ps = l->id.ps;
	c->id.qp_type = l->id.qp_type;
	c->id.port_num = 1;
	c->port = l->port;
	c->listener = l;
	c->sgid_index = (uint8_t)gi;
	c->tos = l->tos;
	c->afonly = l->afonly;
	c->id.route.addr.addr.ibaddr.sgid = g;
	memcpy(c->id.route.addr.addr.ibaddr.dgid.raw, h->src, 16);
	c->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	addr_from_gid(&c->id.route.addr.src_storage, h->dst, l->port);
	addr_from_gid(&c->id.route.addr.dst_storage, h->src, h->port);
	addr_route(c);
	c->rcid = m->local_id;
	c->tid = m->tid;
	c->rguid = m->guid;
	c->next = cma_ids;
	cma_ids = c;
	return c;
}

static struct cma_id *dup_req(const struct cm_msg *m)
{
	for (struct cma_id *i = cma_ids; i; i = i->next)
		if (i->listener && i->rcid == m->local_id &&
		    i->rguid == m->guid && !i->destroying)
			return i;
	return NULL;
}

static void orphan(const struct cm_fwd *f, const struct cm_msg *m)
{
	struct cm_msg r;
	uint8_t mad[CM_MAD_LEN];
	union ibv_gid s, d;

	memcpy(s.raw, f->dst, 16);
	memcpy(d.raw, f->src, 16);
	if (cm_orphan_reply(m, &r) && !cm_build(mad, &r))
		ursa_cm_send(&s, &d, 0, mad);
}

static void on_req(struct cma_id *l, const struct cm_fwd *f,
		   const struct cm_msg *m)
{
	struct cma_id *c = dup_req(m);
	struct cma_event *e;
	struct cma_hdr h;
	struct ibv_port_attr pa;

	if (c) {
		/* a duplicate: MRA while the app decides (12.6.6) */
		if (c->state == CS_REQ_RCVD) {
			struct cm_msg r = { .attr = CM_MRA, .tid = c->tid,
					    .local_id = c->lcid,
					    .remote_id = c->rcid,
					    .msg = CM_MSG_REQ,
					    .service_timeout =
						    URSA_CM_MRA_TIMEOUT };

			send_msg(c, &r, false, 0, 0);
		}
		return;
	}
	if (l->state != CS_LISTEN || m->transport > 1 ||
	    cma_hdr_get(m->priv, &h)) {
		orphan(f, m);
		return;
	}
	if (l->pending >= l->backlog)
		return;		/* as the kernel: silence, the REQ comes again */
	c = child_of(l, m, &h);
	if (c && cm_new_comm_id(c)) {
		cma_ids = c->next;	/* (child_of put it first) */
		free(c->id.route.path_rec);
		free(c);
		return;		/* no event: the REQ comes again */
	}
	if (!c)
		return;
	c->state = CS_REQ_RCVD;
	c->rqpn = m->qpn;
	c->rpsn = m->psn;
	c->psn = rand32() & 0xffffff;
	c->mtu = m->mtu;
	if (!ibv_query_port(c->id.verbs, 1, &pa) && pa.active_mtu < c->mtu)
		c->mtu = (uint8_t)pa.active_mtu;
	c->path.mtu = c->mtu;
	c->retry = m->retry;
	c->rnr_retry = m->rnr_retry;
	c->ack_timeout = m->ack_timeout;
	c->out_ms = cm_ms(m->local_cm_timeout);
	c->srq = m->srq;
	l->pending++;
	cma_queue(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, m, &e);
	if (e) {
		struct rdma_conn_param *cp = &e->ev.param.conn;

		e->ev.listen_id = &l->id;
		memmove(e->priv, e->priv + CMA_HDR_LEN, CM_REQ_PRIV - CMA_HDR_LEN);
		cp->private_data = e->priv;
		cp->private_data_len = CM_REQ_PRIV - CMA_HDR_LEN;
		/* each side's depth is the other's resources (12.7.27) */
		cp->responder_resources = m->init_depth;
		cp->initiator_depth = m->resp_res;
		cp->flow_control = m->flow_ctl;
		cp->retry_count = m->retry;
		cp->rnr_retry_count = m->rnr_retry;
		cp->srq = m->srq;
		cp->qp_num = m->qpn;
	}
}

static void on_sidr_req(struct cma_id *l, const struct cm_fwd *f,
			const struct cm_msg *m)
{
	struct cma_id *c;
	struct cma_event *e;
	struct cma_hdr h;

	if (l->state != CS_LISTEN || cma_hdr_get(m->priv, &h)) {
		orphan(f, m);
		return;
	}
	if (l->pending >= l->backlog)
		return;
	c = child_of(l, m, &h);
	if (!c)
		return;
	c->state = CS_REQ_RCVD;
	l->pending++;
	cma_queue(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, m, &e);
	if (e) {
		e->ev.listen_id = &l->id;
		memmove(e->priv, e->priv + CMA_HDR_LEN,
			CM_SIDR_REQ_PRIV - CMA_HDR_LEN);
		e->ev.param.ud.private_data = e->priv;
		e->ev.param.ud.private_data_len = 180;
		cm_fill_ud(c, &e->ev.param.ud,
			   &c->id.route.addr.addr.ibaddr.dgid, 0, 0);
	}
}

static void conn_event(struct cma_id *id, enum rdma_cm_event_type t,
		       const struct cm_msg *m, unsigned len)
{
	struct cma_event *e;

	cma_queue(id, t, 0, m, &e);
	if (e) {
		e->ev.param.conn.private_data = len ? e->priv : NULL;
		e->ev.param.conn.private_data_len = (uint8_t)len;
		e->ev.param.conn.responder_resources = id->resp_res;
		e->ev.param.conn.initiator_depth = id->init_depth;
		e->ev.param.conn.rnr_retry_count = id->rnr_retry;
		e->ev.param.conn.qp_num = id->rqpn;
	}
}

static void on_rep(struct cma_id *id, const struct cm_msg *m)
{
	if (id->state == CS_ESTABLISHED && m->local_id == id->rcid) {
		cm_send_rtu(id);	/* our RTU was lost (12.9.5.2) */
		return;
	}
	if (id->state != CS_REQ_SENT)
		return;
	id->out_left = 0;
	id->rcid = m->local_id;
	id->rqpn = m->qpn;
	id->rpsn = m->psn;
	id->rguid = m->guid;
	id->resp_res = m->init_depth;	/* our max_dest_rd_atomic */
	id->init_depth = m->resp_res;	/* our max_rd_atomic */
	id->rnr_retry = m->rnr_retry;
	id->tid = id->tid ? id->tid : m->tid;
	if (!id->id.qp) {
		id->state = CS_REP_RCVD;	/* rdma_establish sends the RTU */
		conn_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, m, CM_REP_PRIV);
		return;
	}
	if (cma_modify_qp_rtr_rts(id)) {
		cm_send_rej(id, NULL, 0, CM_REJ_CONSUMER);
		id->state = CS_DISCONNECTED;
		cma_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL, NULL, NULL);
		return;
	}
	/* the event before the RTU (both under cma_lock): nothing the peer
	 * sends once it has the RTU can complete ahead of ESTABLISHED */
	id->state = CS_ESTABLISHED;
	conn_event(id, RDMA_CM_EVENT_ESTABLISHED, m, CM_REP_PRIV);
	cm_send_rtu(id);
}

/*
 * A REQ refused for an unknown service ID soon after it left is sent again,
 * URSA_CM_SID_RETRIES times URSA_CM_SID_RETRY_MS apart, before REJECTED: a
 * listener being replaced (perftest -R closes the listener of its first
 * connection and opens the next on the same port while the client is already
 * connecting) must not lose a race that the kernel's slower path hides.
 */

/* The connection is over: the QP to the error state, the event out */
static void conn_end(struct cma_id *id, enum rdma_cm_event_type t, int status,
		     const struct cm_msg *m, struct cma_event **e)
{
	id->out_left = 0;
	id->state = CS_DISCONNECTED;
	cma_qp_to_error(id);
	cma_queue(id, t, status, m, e);
}

static void on_rej(struct cma_id *id, const struct cm_msg *m)
{
	struct cma_event *e;

	if (id->state == CS_REQ_SENT && m->reason == CM_REJ_INVALID_SID &&
	    id->sid_retries < URSA_CM_SID_RETRIES) {
		id->sid_retries++;
		id->out_due = now_ns() + URSA_CM_SID_RETRY_MS * 1000000ull;
		id->out_left++;		/* (this one is not a timeout's) */
		cm_wake();
		return;
	}

	if (id->state != CS_REQ_SENT && id->state != CS_REP_SENT &&
	    id->state != CS_REP_RCVD && id->state != CS_ESTABLISHED)
		return;
	conn_end(id, RDMA_CM_EVENT_REJECTED, m->reason, m, &e);
	if (e) {
		e->ev.param.conn.private_data = e->priv;
		e->ev.param.conn.private_data_len = CM_REJ_PRIV;
	}
}

static void on_dreq(struct cma_id *id, const struct cm_msg *m)
{
	/* 12.9.8.3: a DREQ names the receiver's QP; the kernel ignores one
	 * that names another */
	if (id->id.qp && m->qpn != id->id.qp->qp_num)
		return;
	if (m->local_id != id->rcid)
		return;
	switch (id->state) {
	case CS_ESTABLISHED:
	case CS_REP_SENT:	/* the RTU was lost, the peer is done */
		id->out_left = 0;
		id->state = CS_DREQ_RCVD;
		cma_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL);
		break;
	case CS_DREQ_SENT:	/* both sides at once */
		id->out_left = 0;
		cm_send_drep(id);
		id->state = CS_DISCONNECTED;
		cma_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL);
		break;
	case CS_DISCONNECTED:
		cm_send_drep(id);	/* our DREP was lost */
		break;
	default:
		break;
	}
}

static void on_comm(struct cma_id *id, const struct cm_msg *m)
{
	struct cma_event *e;

	switch (m->attr) {
	case CM_REP:
		on_rep(id, m);
		break;
	case CM_RTU:
		if (id->state == CS_REP_SENT && m->local_id == id->rcid) {
			id->out_left = 0;
			id->state = CS_ESTABLISHED;
			conn_event(id, RDMA_CM_EVENT_ESTABLISHED, m, 0);
		}
		break;
	case CM_REJ:
		on_rej(id, m);
		break;
	case CM_MRA:
		/* 12.6.6: the peer needs longer; wait that, no event */
		if (id->out_left)
			id->out_due = now_ns() +
				(uint64_t)(cm_ms(m->service_timeout) +
					   id->out_ms) * 1000000ull;
		break;
	case CM_DREQ:
		on_dreq(id, m);
		break;
	case CM_DREP:
		if (id->state == CS_DREQ_SENT && m->local_id == id->rcid) {
			id->out_left = 0;
			id->state = CS_DISCONNECTED;
			cma_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL);
		}
		break;
	case CM_SIDR_REP:
		if (id->state != CS_SIDR_SENT)
			break;
		id->out_left = 0;
		if (m->status) {
			id->state = CS_DISCONNECTED;
			cma_queue(id, RDMA_CM_EVENT_UNREACHABLE, m->status, m,
				  NULL);
			break;
		}
		id->state = CS_ESTABLISHED;
		id->rqpn = m->qpn;
		cma_queue(id, RDMA_CM_EVENT_ESTABLISHED, 0, m, &e);
		if (e) {
			e->ev.param.ud.private_data = e->priv;
			e->ev.param.ud.private_data_len = CM_SIDR_REP_PRIV;
			cm_fill_ud(id, &e->ev.param.ud,
				   &id->id.route.addr.addr.ibaddr.dgid, m->qpn,
				   m->qkey);
		}
		break;
	default:
		break;
	}
}

/*
 * Who may hand this process a CM MAD: its own user, root, or the user
 * whose processes hold the RoCEv2 port (they receive every MAD of the
 * host and forward it). The socket names are public (/proc/net/unix
 * lists them, comm IDs included), so without this any local user could
 * end another user's connections with a forged DREQ or REJ; now only
 * the port's holders can, who see every packet anyway. The holder is
 * looked up at most once a second.
 */
static bool sender_trusted(uid_t u)
{
	static uint64_t at;
	static long holder = -1;
	uint64_t now;

	if (u == geteuid() || u == 0)
		return true;
	now = now_ns();
	if (!at || now - at > 1000000000ull) {
		holder = ursa_roce_port_uid();
		at = now;
	}
	return holder >= 0 && (uid_t)holder == u;
}

/* One datagram, its sender's address and uid; its length, or -1 */
static ssize_t recv_cred(int fd, struct cm_fwd *f, struct sockaddr_un *from,
			 socklen_t *fl, uid_t *uid)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(struct ucred))];
	} c;
	struct iovec v = { f, sizeof(*f) };
	struct msghdr mh = { .msg_name = from, .msg_namelen = sizeof(*from),
			     .msg_iov = &v, .msg_iovlen = 1,
			     .msg_control = c.b, .msg_controllen = sizeof(c.b) };
	ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	struct cmsghdr *h;

	*uid = (uid_t)-1;	/* no credentials: nobody */
	for (h = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; h; h = CMSG_NXTHDR(&mh, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_CREDENTIALS &&
		    h->cmsg_len == CMSG_LEN(sizeof(struct ucred)))
			*uid = ((struct ucred *)(void *)CMSG_DATA(h))->uid;
	*fl = mh.msg_namelen;
	return n;
}

static const char *const state_names[] = {
	[CS_IDLE] = "idle", [CS_BOUND] = "bound", [CS_ADDR] = "addr-resolved",
	[CS_ROUTE] = "route-resolved", [CS_LISTEN] = "listen",
	[CS_REQ_SENT] = "req-sent", [CS_REP_RCVD] = "rep-rcvd",
	[CS_REQ_RCVD] = "req-rcvd", [CS_REP_SENT] = "rep-sent",
	[CS_SIDR_SENT] = "sidr-req-sent", [CS_ESTABLISHED] = "established",
	[CS_DREQ_SENT] = "dreq-sent", [CS_DREQ_RCVD] = "dreq-rcvd",
	[CS_DISCONNECTED] = "disconnected",
};

/* `ursa cm` asks what the id of this socket holds (the same user or
 * root only: the answer names addresses and QPNs) */
static void answer_query(const struct cma_id *id, int fd,
			 const struct sockaddr_un *to, socklen_t tl, uid_t uid)
{
	struct cm_info in = { .magic = CM_INFO_MAGIC, .pid = (int32_t)getpid() };

	if ((uid != geteuid() && uid != 0) || tl <= sizeof(sa_family_t))
		return;
	in.local_id = id->lcid;
	in.remote_id = id->rcid;
	in.qpn = id->id.qp ? id->id.qp->qp_num : 0;
	in.rqpn = id->rqpn;
	in.ps = (uint16_t)id->id.ps;
	in.port = id->port;
	snprintf(in.state, sizeof(in.state), "%s",
		 (unsigned)id->state < sizeof(state_names) / sizeof(state_names[0]) ?
		 state_names[id->state] : "?");
	memcpy(in.src, id->id.route.addr.addr.ibaddr.sgid.raw, 16);
	memcpy(in.dst, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
	in.mads_rx = n_rx;
	in.mads_tx = n_tx;
	in.refused = n_refused;
	sendto(fd, &in, sizeof(in), MSG_DONTWAIT, (const struct sockaddr *)to, tl);
}

/* the id a CM socket belongs to (a listener's name, or a connection's) */
static struct cma_id *owner_of(int fd)
{
	struct cma_id *id;

	for (id = cma_ids; id; id = id->next)
		if (id->sfd == fd || id->cfd == fd)
			break;
	return id;
}

static void on_fd(int fd)
{
	struct cm_fwd f;
	struct cm_msg m;
	struct sockaddr_un from;
	socklen_t fl;
	ssize_t n;
	uid_t uid;

	while ((n = recv_cred(fd, &f, &from, &fl, &uid)) >= 0) {
		struct cma_id *id;

		if (n == sizeof(uint32_t) && f.magic == CM_QUERY_MAGIC) {
			if ((id = owner_of(fd)) && !id->destroying)
				answer_query(id, fd, &from, fl, uid);
			continue;
		}
		if ((size_t)n != sizeof(f) || f.magic != CM_FWD_MAGIC ||
		    cm_parse(f.mad, sizeof(f.mad), &m))
			continue;	/* not a CM message: nothing to do */
		if (!sender_trusted(uid)) {
			n_refused++;
			if (cfg_trace)
				fprintf(stderr, "ursa cm: pid %d drops a %s from uid %d: not the port's holder\n",
					(int)getpid(), attr_name(m.attr), (int)uid);
			continue;
		}
		id = owner_of(fd);
		trace("recv", &m);
		n_rx++;
		if (!id || id->destroying)
			continue;
		if (id->sfd == fd) {
			if (m.attr == CM_REQ && id->id.ps != RDMA_PS_UDP)
				on_req(id, &f, &m);
			else if (m.attr == CM_SIDR_REQ)
				on_sidr_req(id, &f, &m);
		} else {
			/* only the peer of this connection may speak in it */
			if (memcmp(f.src, id->id.route.addr.addr.ibaddr.dgid.raw,
				   16))
				continue;
			on_comm(id, &m);
		}
	}
}

/* Retransmit what is due; end what has run out of tries. */
static uint64_t timers(void)
{
	uint64_t now = now_ns(), next = UINT64_MAX;

	for (struct cma_id *id = cma_ids; id; id = id->next) {
		if (id->out_left <= 0 || id->destroying)
			continue;
		if (id->out_due <= now) {
			if (--id->out_left > 0) {
				n_tx++;
				ursa_cm_send(&id->id.route.addr.addr.ibaddr.sgid,
					     &id->id.route.addr.addr.ibaddr.dgid,
					     id->tos, id->out);
				id->out_due = now + (uint64_t)id->out_ms * 1000000ull;
			} else {
				conn_end(id, id->state == CS_DREQ_SENT ?
					 RDMA_CM_EVENT_DISCONNECTED :
					 RDMA_CM_EVENT_UNREACHABLE,
					 -ETIMEDOUT, NULL, NULL);
				continue;
			}
		}
		if (id->out_due < next)
			next = id->out_due;
	}
	return next;
}

/*
 * A peer process of this host that died cannot send its DREQ (its
 * kernel would have): its comm ID's socket is gone with it. So every
 * URSA_CM_PROBE_MS each connection to a peer on this host knocks on that name;
 * ECONNREFUSED ends the connection as a DREQ would, with DISCONNECTED.
 * (A peer on another host that dies is noticed by the data path: its
 * QP's retries run out. The IB CM has no keep-alive.)
 */

static void probe_peers(void)
{
	static int fd = -1;

	if (fd < 0)
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	for (struct cma_id *id = cma_ids; id && fd >= 0; id = id->next) {
		struct sockaddr_un sa;

		if (id->destroying || id->state != CS_ESTABLISHED ||
		    id->id.qp_type == IBV_QPT_UD || !id->rcid ||
		    addr_local_gid_index(&id->id.route.addr.addr.ibaddr.dgid) < 0)
			continue;
		socklen_t sl;

		sl = cm_route_addr(&sa, id->rcid, false);
		/* (a one-byte datagram: the owner's reader drops it) */
		if (sendto(fd, "", 1, MSG_DONTWAIT, (struct sockaddr *)&sa, sl) < 0 &&
		    errno == ECONNREFUSED)
			conn_end(id, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL);
	}
}

static void *cm_thread(void *arg)
{
	uint64_t probe_at = 0;

	(void)arg;
	for (;;) {
		struct epoll_event ev[16];
		uint64_t next, now;
		int n, to;

		pthread_mutex_lock(&cma_lock);
		next = timers();
		now = now_ns();
		if (now >= probe_at) {
			probe_peers();
			probe_at = now + URSA_CM_PROBE_MS * 1000000ull;
		}
		if (probe_at < next)
			next = probe_at;
		pthread_mutex_unlock(&cma_lock);
		now = now_ns();
		to = next == UINT64_MAX ? -1 :
		     next <= now ? 0 : (int)((next - now) / 1000000 + 1);
		n = epoll_wait(ep_fd, ev, 16, to);
		pthread_mutex_lock(&cma_lock);
		for (int i = 0; i < n; i++) {
			if (ev[i].data.fd == wake_fd) {
				uint64_t v;

				if (read(wake_fd, &v, sizeof(v)) < 0)
					continue;
			} else {
				on_fd(ev[i].data.fd);
			}
		}
		pthread_mutex_unlock(&cma_lock);
	}
	return NULL;
}

void cm_wake(void)
{
	uint64_t one = 1;

	if (wake_fd >= 0 && write(wake_fd, &one, sizeof(one)) < 0)
		return;		/* the counter is full: a wake-up is pending */
}

/* the child of fork() has no CM thread: its first channel starts one */
void cm_fork_child(void)
{
	if (ep_fd >= 0)
		close(ep_fd);
	if (wake_fd >= 0)
		close(wake_fd);
	ep_fd = wake_fd = -1;
}

int cm_start(void)
{
	struct epoll_event ev = { .events = EPOLLIN };
	sigset_t all, old;
	int r;

	if (ep_fd >= 0)
		return 0;
	cfg_timeout_ms = (unsigned)ursa_cfg()->cm_timeout_ms;
	cfg_trace = ursa_cfg()->cm_trace;
	cfg_retries = (unsigned)ursa_cfg()->cm_retries;
	ep_fd = epoll_create1(EPOLL_CLOEXEC);
	wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ep_fd < 0 || wake_fd < 0)
		return -errno;
	ev.data.fd = wake_fd;
	epoll_ctl(ep_fd, EPOLL_CTL_ADD, wake_fd, &ev);
	/* the thread takes no signals: they stay the application's */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = pthread_create(&thr, NULL, cm_thread, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r)
		return -r;
	pthread_detach(thr);
	return 0;
}
