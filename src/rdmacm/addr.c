// SPDX-License-Identifier: MIT
/*
 * addr.c - addresses for ursa's librdmacm: IP addresses as GIDs, the
 * source address and GID a destination is reached from (the kernel's
 * route lookup, asked through a connected UDP socket: no privileges, no
 * netlink), the path record of a resolved route, rdma_getaddrinfo and the
 * endpoint calls (rdma_create_ep, rdma_get_request) and the SRQ helpers.
 */
#include "cma.h"

#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

socklen_t addr_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
					 : sizeof(struct sockaddr_in);
}

int addr_port_of(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)sa)->sin_port);
	if (sa->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	return 0;
}

void addr_set_port(struct sockaddr *sa, uint16_t port)
{
	if (sa->sa_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons(port);
	else if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

bool addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr)
			>> 24) == 127;
	return sa->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* The GID of an address; -EADDRNOTAVAIL for a wildcard. */
int addr_gid(const struct sockaddr *sa, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)sa;

		if (a->sin_addr.s_addr == INADDR_ANY)
			return -EADDRNOTAVAIL;
		g->raw[10] = g->raw[11] = 0xff;
		memcpy(g->raw + 12, &a->sin_addr, 4);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;

		if (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr))
			return -EADDRNOTAVAIL;
		memcpy(g->raw, &a->sin6_addr, 16);
		return 0;
	}
	return -EAFNOSUPPORT;
}

void addr_from_gid(struct sockaddr_storage *ss, const uint8_t g[16],
		   uint16_t port)
{
	static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

	memset(ss, 0, sizeof(*ss));
	if (!memcmp(g, pfx, 12)) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;

		a->sin_family = AF_INET;
		a->sin_port = htons(port);
		memcpy(&a->sin_addr, g + 12, 4);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons(port);
		memcpy(&a->sin6_addr, g, 16);
	}
}

int addr_local_gid_index(const union ibv_gid *g)
{
	struct ibv_context *c = cma_ctx();
	struct ibv_port_attr pa;

	if (!c || ibv_query_port(c, 1, &pa))
		return -ENODEV;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid x;

		if (!ibv_query_gid(c, 1, i, &x) && !memcmp(&x, g, sizeof(x)))
			return i;
	}
	return -ENODEV;
}

/* The source address the kernel's routing picks for dst. */
static int route_src(const struct sockaddr *dst, struct sockaddr_storage *src)
{
	struct sockaddr_storage d;
	socklen_t sl = sizeof(*src);
	int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), r = 0;

	if (fd < 0)
		return -errno;
	memcpy(&d, dst, addr_len(dst));
	addr_set_port((struct sockaddr *)&d, 4791);
	if (connect(fd, (struct sockaddr *)&d, addr_len(dst)) ||
	    getsockname(fd, (struct sockaddr *)src, &sl))
		r = -errno;
	close(fd);
	return r;
}

int addr_resolve(struct cma_id *id, const struct sockaddr *src,
		 const struct sockaddr *dst)
{
	struct sockaddr_storage s;
	union ibv_gid sg, dg;
	int r, gi;

	if (dst->sa_family != AF_INET && dst->sa_family != AF_INET6)
		return -EAFNOSUPPORT;
	if (id->state != CS_IDLE && id->state != CS_BOUND)
		return -EINVAL;
	if (addr_gid(dst, &dg))
		return -EINVAL;
	if (src && !addr_gid(src, &sg)) {
		memcpy(&s, src, addr_len(src));
	} else if (id->state == CS_BOUND &&
		   !addr_gid(&id->id.route.addr.src_addr, &sg)) {
		memcpy(&s, &id->id.route.addr.src_storage, sizeof(s));
	} else {
		r = route_src(dst, &s);
		if (r)
			return r;
		addr_gid((struct sockaddr *)&s, &sg);
	}
	gi = addr_local_gid_index(&sg);
	if (gi < 0)
		return -ENODEV;		/* no RDMA device has that address */
	if (id->state == CS_IDLE) {
		r = cm_bind_port(id, src ? (uint16_t)addr_port_of(src) : 0);
		if (r)
			return r;
	}
	addr_set_port((struct sockaddr *)&s, id->port);
	memcpy(&id->id.route.addr.src_storage, &s, sizeof(s));
	memset(&id->id.route.addr.dst_storage, 0, sizeof(s));
	memcpy(&id->id.route.addr.dst_storage, dst, addr_len(dst));
	id->id.route.addr.addr.ibaddr.sgid = sg;
	id->id.route.addr.addr.ibaddr.dgid = dg;
	id->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	id->sgid_index = (uint8_t)gi;
	cma_set_dev(id);
	id->state = CS_ADDR;
	return 0;
}

/* The path of a RoCE route: computed here, no SA (rdma-cm.md 3.4) */
void addr_route(struct cma_id *id)
{
	struct ibv_sa_path_rec *p = id->id.route.path_rec;
	struct ibv_port_attr pa;

	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return;
		id->id.route.path_rec = p;
	}
	memset(p, 0, sizeof(*p));
	p->dgid = id->id.route.addr.addr.ibaddr.dgid;
	p->sgid = id->id.route.addr.addr.ibaddr.sgid;
	p->pkey = htobe16(0xffff);
	p->hop_limit = 64;
	p->traffic_class = id->tos;
	p->reversible = 1;
	p->numb_path = 1;
	p->mtu_selector = 2;
	p->packet_life_time = 16;
	if (id->ack_timeout_set && id->ack_timeout)
		p->packet_life_time = (uint8_t)(id->ack_timeout - 1);
	if (!ibv_query_port(cma_ctx(), 1, &pa)) {
		p->mtu = (uint8_t)pa.active_mtu;
		p->rate = 0;
	}
	if (!id->mtu || id->mtu > p->mtu)
		id->mtu = p->mtu;
	id->path = *p;
	id->id.route.num_paths = 1;
}

/* --- rdma_getaddrinfo ---------------------------------------------------- */

static struct sockaddr *dup_sa(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr *d = malloc(len);

	if (d)
		memcpy(d, sa, len);
	return d;
}

CMA_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;

		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}

/* The first answer of getaddrinfo(3) for node and service, as an
 * rdma_addrinfo; 0 or an EAI_ code. */
static int from_getaddrinfo(const char *node, const char *service,
			    const struct rdma_addrinfo *hints,
			    struct rdma_addrinfo *r)
{
	struct addrinfo h = { 0 }, *ai;
	struct sockaddr **sa;
	socklen_t *len;
	int e;

	h.ai_flags = hints->ai_flags & RAI_PASSIVE ? AI_PASSIVE : 0;
	if (hints->ai_flags & RAI_NUMERICHOST)
		h.ai_flags |= AI_NUMERICHOST;
	h.ai_family = hints->ai_family == AF_IB ? AF_UNSPEC : hints->ai_family;
	if (hints->ai_qp_type == IBV_QPT_UD || (!hints->ai_qp_type &&
	    (hints->ai_port_space == RDMA_PS_UDP ||
	     hints->ai_port_space == RDMA_PS_IPOIB)))
		h.ai_socktype = SOCK_DGRAM;
	else
		h.ai_socktype = SOCK_STREAM;
	if (h.ai_family == AF_UNSPEC)
		h.ai_family = AF_INET;	/* ursa's ids are IPv4 first */
	e = getaddrinfo(node, service, &h, &ai);
	if (e && h.ai_family == AF_INET && hints->ai_family != AF_INET) {
		h.ai_family = AF_UNSPEC;
		e = getaddrinfo(node, service, &h, &ai);
	}
	if (e)
		return e;
	r->ai_flags = hints->ai_flags & RAI_PASSIVE;
	r->ai_family = ai->ai_family;
	r->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type :
			h.ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
	r->ai_port_space = hints->ai_port_space ? hints->ai_port_space :
			   h.ai_socktype == SOCK_DGRAM ? RDMA_PS_UDP : RDMA_PS_TCP;
	sa = r->ai_flags & RAI_PASSIVE ? &r->ai_src_addr : &r->ai_dst_addr;
	len = r->ai_flags & RAI_PASSIVE ? &r->ai_src_len : &r->ai_dst_len;
	*sa = dup_sa(ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return *sa ? 0 : EAI_MEMORY;
}

/*
 * As rdma-core's: a node or service is looked up by getaddrinfo(3) (the
 * address is the source of a passive lookup, the destination otherwise);
 * with neither, the hints' addresses and types are the answer. A source
 * in the hints is kept when the lookup gave none. Failure is -1 with
 * errno set (to the EAI_ code of a failed lookup, as rdma-core sets it).
 */
CMA_EXPORT int rdma_getaddrinfo(const char *node, const char *service,
				const struct rdma_addrinfo *hints,
				struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo none;
	struct rdma_addrinfo *r;
	int e = 0;

	if (!res || (!node && !service && !hints))
		return cma_errno(-EINVAL);
	if (!hints)
		hints = &none;
	r = calloc(1, sizeof(*r));
	if (!r)
		return cma_errno(-ENOMEM);
	if (node || service) {
		e = from_getaddrinfo(node, service, hints, r);
	} else {
		r->ai_flags = hints->ai_flags;
		r->ai_family = hints->ai_family;
		r->ai_qp_type = hints->ai_qp_type;
		r->ai_port_space = hints->ai_port_space;
		if (hints->ai_dst_len && hints->ai_dst_addr) {
			r->ai_dst_addr = dup_sa(hints->ai_dst_addr,
						hints->ai_dst_len);
			r->ai_dst_len = hints->ai_dst_len;
			e = r->ai_dst_addr ? 0 : EAI_MEMORY;
		}
	}
	if (!e && !r->ai_src_len && hints->ai_src_len && hints->ai_src_addr) {
		r->ai_src_addr = dup_sa(hints->ai_src_addr, hints->ai_src_len);
		r->ai_src_len = hints->ai_src_len;
		e = r->ai_src_addr ? 0 : EAI_MEMORY;
	}
	if (e) {
		rdma_freeaddrinfo(r);
		errno = e;
		return -1;
	}
	*res = r;
	return 0;
}

/* --- endpoints ------------------------------------------------------------ */

CMA_EXPORT int rdma_create_ep(struct rdma_cm_id **out, struct rdma_addrinfo *res,
			      struct ibv_pd *pd,
			      struct ibv_qp_init_attr *qa)
{
	struct rdma_cm_id *cid;
	struct cma_id *id;

	if (!out || !res)
		return cma_errno(-EINVAL);
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)
			   res->ai_port_space))
		return -1;
	id = (struct cma_id *)cid;
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cid, res->ai_src_addr))
			goto fail;
		if (qa) {
			id->ep_qp_attr = malloc(sizeof(*qa));
			if (!id->ep_qp_attr)
				goto fail;
			*id->ep_qp_attr = *qa;
		}
		id->ep_pd = pd;
		*out = cid;
		return 0;
	}
	if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) ||
	    rdma_resolve_route(cid, 2000))
		goto fail;
	if (qa && rdma_create_qp(cid, pd, qa))
		goto fail;
	*out = cid;
	return 0;
fail:
	{
		int e = errno;

		rdma_destroy_id(cid);
		errno = e;
	}
	return -1;
}

CMA_EXPORT void rdma_destroy_ep(struct rdma_cm_id *cid)
{
	if (!cid)
		return;
	rdma_destroy_qp(cid);
	rdma_destroy_id(cid);
}

CMA_EXPORT int rdma_get_request(struct rdma_cm_id *lcid, struct rdma_cm_id **out)
{
	struct cma_id *l = (struct cma_id *)lcid;
	struct rdma_cm_event *ev;
	struct cma_id *c;

	if (!l || !out || !l->sync)
		return cma_errno(-EINVAL);
	for (;;) {
		if (rdma_get_cm_event(lcid->channel, &ev))
			return -1;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		rdma_ack_cm_event(ev);	/* (nothing else comes here) */
	}
	c = (struct cma_id *)ev->id;
	/* the new id is synchronous too: its own channel */
	if (cma_own_channel(c)) {
		rdma_ack_cm_event(ev);
		return cma_errno(-ENOMEM);
	}
	if (l->ep_qp_attr) {
		struct ibv_qp_init_attr qa = *l->ep_qp_attr;

		if (rdma_create_qp(&c->id, l->ep_pd, &qa)) {
			int e = errno;

			rdma_reject(&c->id, NULL, 0);
			rdma_destroy_id(&c->id);
			errno = e;
			return -1;
		}
	}
	c->id.event = ev;	/* acked by its next call, as librdmacm */
	*out = &c->id;
	return 0;
}

/* --- SRQ helpers -------------------------------------------------------------- */

CMA_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *cid,
				  struct ibv_srq_init_attr_ex *a)
{
	struct ibv_srq *srq;

	if (!cid || !a || !cid->verbs)
		return cma_errno(-EINVAL);
	if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd) {
		a->pd = cid->pd ? cid->pd : cma_default_pd();
		a->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (a->srq_type != IBV_SRQT_BASIC)
		return cma_errno(-EOPNOTSUPP);
	srq = ibv_create_srq(a->pd, (struct ibv_srq_init_attr *)
			     &a->srq_context);
	if (!srq)
		return -1;
	cid->pd = a->pd;
	cid->srq = srq;
	return 0;
}

CMA_EXPORT int rdma_create_srq(struct rdma_cm_id *cid, struct ibv_pd *pd,
			       struct ibv_srq_init_attr *a)
{
	struct ibv_srq_init_attr_ex ex = { 0 };
	int r;

	if (!a)
		return cma_errno(-EINVAL);
	ex.srq_context = a->srq_context;
	ex.attr = a->attr;
	ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ex.srq_type = IBV_SRQT_BASIC;
	ex.pd = pd;
	r = rdma_create_srq_ex(cid, &ex);
	if (!r)
		a->attr = ex.attr;
	return r;
}

CMA_EXPORT void rdma_destroy_srq(struct rdma_cm_id *cid)
{
	if (cid && cid->srq) {
		ibv_destroy_srq(cid->srq);
		cid->srq = NULL;
	}
}
