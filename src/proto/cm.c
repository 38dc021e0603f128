// SPDX-License-Identifier: MIT
/*
 * cm.c - IB CM messages: parse and build the MADs of IBTA vol. 1 chapter
 * 12 (tables 106-120), rdma_cm's private-data header, and the routing of a
 * received message to its owner. Offsets below are into the message body,
 * which starts after the 24-byte MAD header; all fields are big-endian.
 */
#include "cm.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

/* a 24-bit field in the top of a word (QPN, PSN, EECN) */
static uint32_t get24(const uint8_t *p)
{
	return get32(p) >> 8;
}

static void put24(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16);
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)v;
}

/* where each message's private data lies in the body, and how much */
static const struct {
	uint16_t attr, off, room;
} layout[] = {
	{ CM_REQ, 140, CM_REQ_PRIV },	{ CM_MRA, 10, CM_MRA_PRIV },
	{ CM_REJ, 84, CM_REJ_PRIV },	{ CM_REP, 36, CM_REP_PRIV },
	{ CM_RTU, 8, CM_RTU_PRIV },	{ CM_DREQ, 12, CM_DREQ_PRIV },
	{ CM_DREP, 8, CM_DREP_PRIV },	{ CM_SIDR_REQ, 16, CM_SIDR_REQ_PRIV },
	{ CM_SIDR_REP, 96, CM_SIDR_REP_PRIV },
};

static int layout_of(uint16_t attr)
{
	for (unsigned i = 0; i < sizeof(layout) / sizeof(layout[0]); i++)
		if (layout[i].attr == attr)
			return (int)i;
	return -1;
}

unsigned cm_priv_room(uint16_t attr)
{
	int i = layout_of(attr);

	return i < 0 ? 0 : layout[i].room;
}

static void parse_req(const uint8_t *b, struct cm_msg *m)
{
	m->local_id = get32(b);
	m->vendor_id = (uint32_t)b[5] << 16 | (uint32_t)b[6] << 8 | b[7];
	m->sid = get64(b + 8);
	m->guid = get64(b + 16);
	m->qkey = get32(b + 28);
	m->qpn = get24(b + 32);
	m->resp_res = b[35];
	m->init_depth = b[39];
	m->remote_cm_timeout = b[43] >> 3;
	m->transport = (b[43] >> 1) & 3;
	m->flow_ctl = b[43] & 1;
	m->psn = get24(b + 44);
	m->local_cm_timeout = b[47] >> 3;
	m->retry = b[47] & 7;
	m->pkey = get16(b + 48);
	m->mtu = b[50] >> 4;
	m->rnr_retry = b[50] & 7;
	m->max_cm_retries = b[51] >> 4;
	m->srq = (b[51] >> 3) & 1;
	memcpy(m->sgid, b + 56, 16);
	memcpy(m->dgid, b + 72, 16);
	m->flow_label = get32(b + 88) >> 12;
	m->tclass = b[92];
	m->hop_limit = b[93];
	m->sl = b[94] >> 4;
	m->subnet_local = (b[94] >> 3) & 1;
	m->ack_timeout = b[95] >> 3;
}

static void build_req(uint8_t *b, const struct cm_msg *m)
{
	put32(b, m->local_id);
	put24(b + 5, m->vendor_id);
	put64(b + 8, m->sid);
	put64(b + 16, m->guid);
	put32(b + 28, m->qkey);
	put24(b + 32, m->qpn);
	b[35] = m->resp_res;
	b[39] = m->init_depth;
	b[43] = (uint8_t)(m->remote_cm_timeout << 3 | (m->transport & 3) << 1 |
			  (m->flow_ctl & 1));
	put24(b + 44, m->psn);
	b[47] = (uint8_t)(m->local_cm_timeout << 3 | (m->retry & 7));
	put16(b + 48, m->pkey);
	b[50] = (uint8_t)(m->mtu << 4 | (m->rnr_retry & 7));
	b[51] = (uint8_t)(m->max_cm_retries << 4 | (m->srq & 1) << 3);
	/* LIDs 0xFFFF: a routed path (rdma-cm.md 2.1) */
	put16(b + 52, 0xffff);
	put16(b + 54, 0xffff);
	memcpy(b + 56, m->sgid, 16);
	memcpy(b + 72, m->dgid, 16);
	put32(b + 88, m->flow_label << 12);
	b[92] = m->tclass;
	b[93] = m->hop_limit;
	b[94] = (uint8_t)(m->sl << 4 | (m->subnet_local & 1) << 3);
	b[95] = (uint8_t)(m->ack_timeout << 3);
}

static void parse_rep(const uint8_t *b, struct cm_msg *m)
{
	m->local_id = get32(b);
	m->remote_id = get32(b + 4);
	m->qkey = get32(b + 8);
	m->qpn = get24(b + 12);
	m->vendor_id = (uint32_t)b[15] << 16 | (uint32_t)b[19] << 8 | b[23];
	m->psn = get24(b + 20);
	m->resp_res = b[24];
	m->init_depth = b[25];
	m->target_ack_delay = b[26] >> 3;
	m->flow_ctl = b[26] & 1;
	m->rnr_retry = b[27] >> 5;
	m->srq = (b[27] >> 4) & 1;
	m->guid = get64(b + 28);
}

static void build_rep(uint8_t *b, const struct cm_msg *m)
{
	put32(b, m->local_id);
	put32(b + 4, m->remote_id);
	put32(b + 8, m->qkey);
	put24(b + 12, m->qpn);
	b[15] = (uint8_t)(m->vendor_id >> 16);
	b[19] = (uint8_t)(m->vendor_id >> 8);
	put24(b + 20, m->psn);
	b[23] = (uint8_t)m->vendor_id;
	b[24] = m->resp_res;
	b[25] = m->init_depth;
	b[26] = (uint8_t)(m->target_ack_delay << 3 | (m->flow_ctl & 1));
	b[27] = (uint8_t)((m->rnr_retry & 7) << 5 | (m->srq & 1) << 4);
	put64(b + 28, m->guid);
}

static int body(const uint8_t *b, struct cm_msg *m)
{
	switch (m->attr) {
	case CM_REQ:
		parse_req(b, m);
		break;
	case CM_REP:
		parse_rep(b, m);
		break;
	case CM_REJ:
		m->local_id = get32(b);
		m->remote_id = get32(b + 4);
		m->msg = b[8] >> 6;
		m->ari_len = b[9] >> 1;
		if (m->ari_len > sizeof(m->ari))
			return -EBADMSG;
		m->reason = get16(b + 10);
		memcpy(m->ari, b + 12, m->ari_len);
		break;
	case CM_MRA:
		m->local_id = get32(b);
		m->remote_id = get32(b + 4);
		m->msg = b[8] >> 6;
		m->service_timeout = b[9] >> 3;
		break;
	case CM_RTU:
	case CM_DREP:
		m->local_id = get32(b);
		m->remote_id = get32(b + 4);
		break;
	case CM_DREQ:
		m->local_id = get32(b);
		m->remote_id = get32(b + 4);
		m->qpn = get24(b + 8);
		break;
	case CM_SIDR_REQ:
		m->local_id = get32(b);
		m->pkey = get16(b + 4);
		m->sid = get64(b + 8);
		break;
	case CM_SIDR_REP:
		m->local_id = get32(b);
		m->status = b[4];
		m->ari_len = b[5];
		if (m->ari_len > sizeof(m->ari))
			return -EBADMSG;
		m->vendor_id = (uint32_t)b[6] << 16 | (uint32_t)b[7] << 8 | b[11];
		m->qpn = get24(b + 8);
		m->sid = get64(b + 12);
		m->qkey = get32(b + 20);
		memcpy(m->ari, b + 24, m->ari_len);
		break;
	default:
		return -EBADMSG;
	}
	return 0;
}

int cm_parse(const uint8_t *mad, size_t len, struct cm_msg *m)
{
	int i;

	memset(m, 0, sizeof(*m));
	if (len < CM_MAD_LEN || mad[0] != 1 || mad[1] != CM_CLASS ||
	    mad[2] != CM_CLASS_VERSION || mad[3] != CM_METHOD_SEND)
		return -EBADMSG;
	m->attr = get16(mad + 16);
	m->tid = get64(mad + 8);
	m->attr_mod = get32(mad + 20);
	i = layout_of(m->attr);
	if (i < 0 || body(mad + CM_HDR_LEN, m))
		return -EBADMSG;
	m->priv_len = (uint8_t)layout[i].room;
	memcpy(m->priv, mad + CM_HDR_LEN + layout[i].off, layout[i].room);
	return 0;
}

int cm_build(uint8_t mad[CM_MAD_LEN], const struct cm_msg *m)
{
	uint8_t *b = mad + CM_HDR_LEN;
	int i = layout_of(m->attr);

	if (i < 0 || m->priv_len > layout[i].room || m->ari_len > 72)
		return -EINVAL;
	memset(mad, 0, CM_MAD_LEN);
	mad[0] = 1;
	mad[1] = CM_CLASS;
	mad[2] = CM_CLASS_VERSION;
	mad[3] = CM_METHOD_SEND;
	put64(mad + 8, m->tid);
	put16(mad + 16, m->attr);
	put32(mad + 20, m->attr_mod);
	switch (m->attr) {
	case CM_REQ:
		build_req(b, m);
		break;
	case CM_REP:
		build_rep(b, m);
		break;
	case CM_REJ:
		put32(b, m->local_id);
		put32(b + 4, m->remote_id);
		b[8] = (uint8_t)(m->msg << 6);
		b[9] = (uint8_t)(m->ari_len << 1);
		put16(b + 10, m->reason);
		memcpy(b + 12, m->ari, m->ari_len);
		break;
	case CM_MRA:
		put32(b, m->local_id);
		put32(b + 4, m->remote_id);
		b[8] = (uint8_t)(m->msg << 6);
		b[9] = (uint8_t)(m->service_timeout << 3);
		break;
	case CM_RTU:
	case CM_DREP:
		put32(b, m->local_id);
		put32(b + 4, m->remote_id);
		break;
	case CM_DREQ:
		put32(b, m->local_id);
		put32(b + 4, m->remote_id);
		put24(b + 8, m->qpn);
		break;
	case CM_SIDR_REQ:
		put32(b, m->local_id);
		put16(b + 4, m->pkey);
		put64(b + 8, m->sid);
		break;
	case CM_SIDR_REP:
		put32(b, m->local_id);
		b[4] = m->status;
		b[5] = m->ari_len;
		b[6] = (uint8_t)(m->vendor_id >> 16);
		b[7] = (uint8_t)(m->vendor_id >> 8);
		put24(b + 8, m->qpn);
		b[11] = (uint8_t)m->vendor_id;
		put64(b + 12, m->sid);
		put32(b + 20, m->qkey);
		memcpy(b + 24, m->ari, m->ari_len);
		break;
	}
	memcpy(b + layout[i].off, m->priv, m->priv_len);
	return 0;
}

void cma_hdr_put(uint8_t p[CMA_HDR_LEN], const struct cma_hdr *h)
{
	memset(p, 0, CMA_HDR_LEN);
	p[0] = 0;				/* CMA_VERSION */
	p[1] = (uint8_t)(h->ipver << 4);
	put16(p + 2, h->port);
	if (h->ipver == 4) {
		memcpy(p + 16, h->src + 12, 4);
		memcpy(p + 32, h->dst + 12, 4);
	} else {
		memcpy(p + 4, h->src, 16);
		memcpy(p + 20, h->dst, 16);
	}
}

/* IPv4 in a GID: ::ffff:a.b.c.d */
static void v4_gid(uint8_t g[16], const uint8_t a[4])
{
	memset(g, 0, 10);
	g[10] = g[11] = 0xff;
	memcpy(g + 12, a, 4);
}

int cma_hdr_get(const uint8_t p[CMA_HDR_LEN], struct cma_hdr *h)
{
	if (p[0] != 0)
		return -EBADMSG;
	h->ipver = p[1] >> 4;
	h->port = get16(p + 2);
	if (h->ipver == 4) {
		v4_gid(h->src, p + 16);
		v4_gid(h->dst, p + 32);
	} else if (h->ipver == 6) {
		memcpy(h->src, p + 4, 16);
		memcpy(h->dst, p + 20, 16);
	} else {
		return -EBADMSG;
	}
	return 0;
}

void cm_route(const struct cm_msg *m, uint64_t *key, bool *by_sid)
{
	*by_sid = m->attr == CM_REQ || m->attr == CM_SIDR_REQ;
	if (*by_sid)
		*key = m->sid;
	else if (m->attr == CM_SIDR_REP)
		*key = m->local_id;	/* RequestID: the requester's ID */
	else
		*key = m->remote_id;
}

socklen_t cm_route_addr(struct sockaddr_un *sa, uint64_t key, bool by_sid)
{
	char *p = sa->sun_path + 1;	/* abstract: a leading NUL */
	size_t cap = sizeof(sa->sun_path) - 1;
	int n = by_sid ? snprintf(p, cap, "ursa/cm/s/%016llx",
				  (unsigned long long)key)
		       : snprintf(p, cap, "ursa/cm/c/%08x", (unsigned)key);

	sa->sun_family = AF_UNIX;
	sa->sun_path[0] = 0;
	/* (n < cap always: the names are at most 26 bytes) */
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
			   (size_t)n);
}

bool cm_orphan_reply(const struct cm_msg *in, struct cm_msg *out)
{
	memset(out, 0, sizeof(*out));
	out->tid = in->tid;
	switch (in->attr) {
	case CM_REQ:
	case CM_REP:
		/* REJ: RemoteCommID = the sender's ID, LocalCommID 0 */
		out->attr = CM_REJ;
		out->remote_id = in->local_id;
		out->msg = in->attr == CM_REQ ? CM_MSG_REQ : CM_MSG_REP;
		out->reason = in->attr == CM_REQ ? CM_REJ_INVALID_SID
						 : CM_REJ_INVALID_COMM_ID;
		return true;
	case CM_SIDR_REQ:
		out->attr = CM_SIDR_REP;
		out->local_id = in->local_id;
		out->sid = in->sid;
		out->status = CM_SIDR_UNSUPPORTED;
		return true;
	case CM_DREQ:
		out->attr = CM_DREP;
		out->local_id = in->remote_id;
		out->remote_id = in->local_id;
		return true;
	default:
		return false;
	}
}
