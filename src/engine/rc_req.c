// SPDX-License-Identifier: MIT
/*
 * rc_req.c - the requester of the RoCEv2 engine (rc.h): the WQE at the head of
 * the send queue becomes path-MTU packets with consecutive PSNs, sent in a
 * window; WRITEs and SENDs, or READs and atomics, follow each other
 * without waiting for their answers (pipelining, rc_qp.c). Each step
 * first looks at what the completer decided and at the timers: ACK
 * timeout (against retry_cnt), RNR timer (against rnr_retry), RTO.
 */
#include "rc.h"

#include <stdlib.h>

static uint8_t req_opcode(uint32_t op, bool first, bool last, bool imm_inv)
{
	uint8_t o;

	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		if (first && last)
			o = op == IBV_WR_RDMA_WRITE ? OP_WRITE_ONLY : OP_WRITE_ONLY_IMM;
		else if (first)
			o = OP_WRITE_FIRST;
		else if (last)
			o = op == IBV_WR_RDMA_WRITE ? OP_WRITE_LAST : OP_WRITE_LAST_IMM;
		else
			o = OP_WRITE_MIDDLE;
		return o;
	default: /* SEND family */
		if (first && last)
			o = op == IBV_WR_SEND_WITH_IMM ? OP_SEND_ONLY_IMM :
			    op == IBV_WR_SEND_WITH_INV ? OP_SEND_ONLY_INV : OP_SEND_ONLY;
		else if (first)
			o = OP_SEND_FIRST;
		else if (last)
			o = op == IBV_WR_SEND_WITH_IMM ? OP_SEND_LAST_IMM :
			    op == IBV_WR_SEND_WITH_INV ? OP_SEND_LAST_INV : OP_SEND_LAST;
		else
			o = OP_SEND_MIDDLE;
		(void)imm_inv;
		return o;
	}
}

/* Whether packet k of the message asks for an ACK: the last, the one
 * that fills the window, and every URSA_UDP_ACKREQ_EVERY-th, or every
 * quarter window when the window is smaller. Each ACK costs the
 * responder a send, which on a veth path carries it through the whole
 * stack: fewer ACKs, more bandwidth. But a small window (after losses)
 * asked only at its end stalls whenever that one packet is lost: nothing
 * answers until the RTO, and no later packet shows the responder the gap. */
static bool ack_wanted(const struct ursa_qp *qp, const struct ursa_rc *u,
		       uint32_t k, bool last)
{
	uint32_t every = MIN(URSA_UDP_ACKREQ_EVERY, MAX(4u, u->cwnd / 4));

	return qp->ex.qp_base.qp_type == IBV_QPT_RC &&
	       (last || k % every == every - 1 ||
		k + 1 == u->m.acked + u->cwnd);
}

/* Where a message's packets go: its first PSN, packets, path MTU */
struct msg_at {
	uint32_t first, npkts, mtu;
};

/* Whether this QP's requests ask for selective repeat (rc_sr.c) */
static bool sr_asked(const struct ursa_qp *qp)
{
	return qp->ex.qp_base.qp_type == IBV_QPT_RC && ursa_cfg()->sr;
}

/* Send packet k of message at; ackreq: whether it asks for an ACK. */
static void send_data_pkt(struct ursa_qp *qp, struct ursa_rc *u,
			  const struct ursa_req *r, const struct ursa_send_wqe *w,
			  const struct msg_at *at, uint32_t k, bool ackreq,
			  const addr_t *src, const addr_t *dst)
{
	/* built where the batch will send it from: one copy, from the MR
	 * (none: not sent, see struct txbatch in transport/udp.c) */
	uint8_t *buf = ursa_udp_slot();
	struct roce_pkt p = { 0 };
	uint64_t off = (uint64_t)k * at->mtu;
	uint32_t len = (uint32_t)MIN((uint64_t)at->mtu, r->msg_len - off);
	bool first = k == 0, last = k + 1 == at->npkts;
	bool ud = qp->ex.qp_base.qp_type == IBV_QPT_UD;
	struct ursa_sg part[URSA_MAX_SGE];
	uint8_t *pay, ttl;
	int n;

	if (!buf)
		return;
	if (r->msg_len == 0)
		len = 0;
	p.opcode = (uint8_t)(rc_transport_bits(qp) |
			     req_opcode(r->opcode, first, last, false));
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = ud ? w->remote_qpn : qp->attr.dest_qp_num;
	p.psn = psn_add(at->first, k);
	p.se = last && r->solicited;
	p.ackreq = ackreq;
	p.sr = sr_asked(qp);
	if (!first && !last) {
		/* a MIDDLE packet (RC, UC): the BTH, then a whole MTU of
		 * payload (a multiple of 4: no pad); most of a stream */
		roce_bth_put(buf, p.opcode, false, false, 0, p.pkey, p.dqpn,
			     p.ackreq, p.psn);
		if (p.sr)
			buf[4] = ROCE_BTH4_SR;	/* (masked in the ICRC) */
		pay = buf + ROCE_BTH_LEN;
		n = (int)(ROCE_BTH_LEN + len + ROCE_ICRC_LEN);
	} else {
		p.va = r->remote_addr;
		p.rkey = r->rkey;
		p.dmalen = (uint32_t)r->msg_len;
		p.imm = r->imm;
		p.qkey = r->qkey;
		p.sqpn = qp->ex.qp_base.qp_num;
		/* the headers and the pad, then the payload and the ICRC
		 * together */
		pay = buf + roce_hdr_len(p.opcode);
		n = roce_build(buf, URSA_UDP_MAX_PKT, &p, pay, len);
		if (n <= 0)
			return;
	}
	ttl = r->hop_limit ? r->hop_limit : 64;
	/* (between families ursa_udp_send sends nothing) */
	if (ursa_gid_v4(src) == ursa_gid_v4(dst)) {
		uint32_t pfx = ursa_udp_icrc_pfx(&u->pfx, src, dst, u->ep.sport,
					(size_t)n);
		struct iovec v[URSA_MAX_SGE];
		uint32_t np = len ? ursa_sg_slice(r->src, r->nsrc, off, len, part) : 0;

		for (uint32_t i = 0; i < np; i++)
			v[i] = (struct iovec){ (void *)(uintptr_t)part[i].va,
					       part[i].len };
		roce_icrc_put(buf + n - 4,
			      roce_icrc_fill_from(pfx, buf, (size_t)n - 4,
						  (size_t)(pay - buf), v, np));
	}
	rc_tx(u, src, dst, buf, (size_t)n, ttl, true);
}

/* Packets up to (not including) end have been sent: answers for them
 * may come (psn_in_flight). */
static inline void psn_sent(struct ursa_rc *u, uint32_t end)
{
	if (((end - u->psn_hi) & 0xffffff) - 1 < 0x7fffff)
		u->psn_hi = end;
}

/* Packets of the READ in flight asked for and neither in place in order
 * nor out of order, with the pipe's: what counts against the window. */
static uint32_t read_out(const struct ursa_rc *u)
{
	uint32_t out = u->pipe_out + u->m.sent - u->m.acked;

	return out - MIN(out, u->sr.nsacked);
}

/* The least piece asked for ahead (below it, requests would outnumber
 * what the responder remembers for the asks into them) */
static uint32_t ahead_min(const struct ursa_rc *u)
{
	return MAX((uint32_t)URSA_UDP_WINDOW_MIN, u->cwnd / 4);
}

/*
 * May the READ in flight ask for its next piece? When the pieces before
 * are whole; or, from a responder that repeats selectively, while their
 * holes are asked for alone (rd_ask_missing), if the window has room for
 * a piece and fewer than URSA_READ_AHEAD pieces are not whole. Otherwise
 * every lost response stops the READ for the round trip of its ask.
 */
static bool read_piece_due(const struct ursa_rc *u)
{
	uint32_t live = 0;

	if (!u->m.is_read || u->m.resend_read || u->m.sent >= u->m.npkts)
		return false;
	if (u->m.acked == u->m.sent)
		return true;
	for (uint32_t i = 0; i < u->m.nahead; i++)
		live += u->m.ahead[i] > u->m.acked;
	/* (each piece is one more READ request outstanding: with the
	 * pipe's, the piece from acked and the live ones ahead, they stay
	 * within the initiator depth, max_rd_atomic, IBTA 9.5 / o9-19) */
	return u->sr.on && live < URSA_READ_AHEAD &&
	       u->pipe_n + live + 2 <= u->qp->attr.max_rd_atomic &&
	       read_out(u) + ahead_min(u) <= u->cwnd &&
	       u->pipe_out + u->m.sent - u->m.acked + ahead_min(u) <
		       URSA_SR_SLOTS - 1;
}

/* The next piece of the READ in flight (read_piece_due): from sent, at
 * most a window's worth (a long burst of responses that loses one
 * packet would otherwise be resent whole), inside the PSNs whose
 * responses can be placed out of order (rc_sr.c). Returns where it
 * starts. */
static uint32_t read_piece(struct ursa_rc *u)
{
	uint32_t from = u->m.sent, span, room, k = 0;

	span = u->pipe_out + u->m.sent - u->m.acked;
	room = u->sr.on ? URSA_SR_SLOTS - 1 - MIN(URSA_SR_SLOTS - 1u, span) :
			  u->cwnd;
	room = MIN(room, u->cwnd - MIN(u->cwnd, read_out(u)));
	u->m.sent = MIN(u->m.npkts, from + MAX(1u, room));
	/* (the pieces still not whole, and this one) */
	for (uint32_t i = 0; i < u->m.nahead; i++)
		if (u->m.ahead[i] > u->m.acked)
			u->m.ahead[k++] = u->m.ahead[i];
	u->m.nahead = k;
	if (from > u->m.acked && k < URSA_READ_AHEAD)
		u->m.ahead[u->m.nahead++] = u->m.sent;
	rc_rtt_start(u, from, ursa_now_ns());
	return from;
}

/* A READ request: the next piece (read_piece_due), or, asked again
 * (resend_read), what is still missing from the first response not in
 * place, at its PSN. */
static void send_read_req(struct ursa_qp *qp, struct ursa_rc *u,
			  const struct ursa_req *r, const addr_t *src,
			  const addr_t *dst, bool piece)
{
	uint8_t buf[64];
	struct roce_pkt p = { 0 };
	uint32_t from = u->m.acked;
	uint64_t off;
	int n;

	if (piece) {
		from = read_piece(u);
	} else {
		u->timing = false;	/* asked again */
		u->m.nahead = 0;	/* (one request again) */
	}
	off = (uint64_t)from * u->m.mtu;
	p.opcode = ROCE_RC | OP_READ_REQ;
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = psn_add(u->m.first, from);
	p.ackreq = true;
	p.va = r->remote_addr + off;
	p.rkey = r->rkey;
	p.sr = sr_asked(qp);	/* (its responses say if the peer repeats) */
	p.wide = rc_read_code(qp, u->m.mtu);
	/* A re-request stays inside its piece: a duplicate READ must be a
	 * subset of the original (IBTA 9.7.5.1.3); ursa's responder also
	 * answers one that spans pieces asked ahead. */
	p.dmalen = (uint32_t)MIN(r->msg_len - MIN(off, r->msg_len),
				 (uint64_t)(u->m.sent - from) * u->m.mtu);
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		rc_tx(u, src, dst, buf, (size_t)n, r->hop_limit ? r->hop_limit : 64,
		      false);
}

/*
 * Selective repeat of READ responses (rc_comp.c rd_ask_missing): a READ
 * of just the len bytes at va whose responses were lost, at the PSN of
 * the first: a duplicate READ inside the original one (IBTA 9.7.5.1.3),
 * which the responder executes again from its PSN.
 */
void rc_read_again(struct ursa_qp *qp, struct ursa_rc *u, uint32_t psn,
		   uint32_t mtu, uint64_t va, uint32_t rkey, uint32_t len)
{
	uint8_t buf[64];
	struct roce_pkt p = { .opcode = ROCE_RC | OP_READ_REQ,
			      .pkey = ROCE_DEFAULT_PKEY, .ackreq = true,
			      .sr = true };
	int n;

	p.dqpn = qp->attr.dest_qp_num;
	p.psn = psn;
	p.va = va;
	p.rkey = rkey;
	p.dmalen = len;
	p.wide = rc_read_code(qp, mtu);
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0) {
		rc_tx(u, &u->src, &u->dst, buf, (size_t)n, u->hop, false);
		atomic_fetch_add(&ursa_udp_cnt.sr_resent, 1);
	}
}

static void send_atomic(struct ursa_qp *qp, struct ursa_rc *u,
			const struct ursa_req *r, const addr_t *src,
			const addr_t *dst)
{
	uint8_t buf[96];
	struct roce_pkt p = { 0 };
	int n;

	p.opcode = (uint8_t)(ROCE_RC | (r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ?
					OP_CMP_SWAP : OP_FETCH_ADD));
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = u->m.first;
	p.ackreq = true;
	p.va = r->remote_addr;
	p.rkey = r->rkey;
	if (r->opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
		p.swap_add = r->swap;
		p.compare = r->compare_add;
	} else {
		p.swap_add = r->compare_add;
	}
	psn_sent(u, psn_add(u->m.first, 1));
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		rc_tx(u, src, dst, buf, (size_t)n, r->hop_limit ? r->hop_limit : 64,
		      false);
}

/* Would more packets of m, beyond those out already, fit the window? The
 * window counts the pipe's packets too, but not those the responder
 * holds out of order (selective repeat), and never spans more PSNs than
 * the responder can hold. */
static bool window_has(const struct ursa_rc *u, uint32_t more)
{
	uint32_t out = u->pipe_out + more;

	return out - MIN(out, u->sr.nsacked) < u->cwnd &&
	       (!u->sr.on || out < URSA_SR_SLOTS - 1);
}

/* Packets of m that may go out now. UC and UD have no window: nothing
 * acknowledges their packets (a UC message longer than the window
 * waited for ACKs that never come). */
static bool window_open(const struct ursa_rc *u)
{
	return !u->m.is_read && u->m.sent < u->m.npkts &&
	       (u->qp->ex.qp_base.qp_type != IBV_QPT_RC ||
		window_has(u, u->m.sent - u->m.acked));
}

/* Are packets of w wanted again (sr_resend)? */
static bool sr_wanted(const struct ursa_rc *u, const struct ursa_send_wqe *w)
{
	if (!u->sr.nwant)
		return false;
	if (u->pipe_n && PIPE(u, 0)->wqe == w)
		return rc_sr_wants(u, psn_add(PIPE(u, 0)->first,
					      PIPE(u, 0)->acked),
				   PIPE(u, 0)->npkts - PIPE(u, 0)->acked);
	return u->m.active && u->m.wqe == w &&
	       rc_sr_wants(u, psn_add(u->m.first, u->m.acked),
			   u->m.sent - u->m.acked);
}

static bool can_start(struct ursa_qp *qp, const struct ursa_rc *u,
		      const struct ursa_send_wqe *w)
{
	int c = rc_pipe_class(u->m.op);

	return qp->ex.qp_base.qp_type == IBV_QPT_RC && u->m.active &&
	       !u->m.done && !u->m.nak && !u->pipe_nak && !u->pipe_gap &&
	       c && c == rc_pipe_class(w->opcode) && !u->m.resend_read &&
	       (c != 2 || (u->pipe_n + 2 <= qp->attr.max_rd_atomic &&
			   !u->pipe_cool)) &&
	       u->m.sent == u->m.npkts && u->pipe_n < URSA_UDP_PIPE &&
	       window_has(u, u->m.npkts - u->m.acked) &&
	       u->m.mtu == rc_msg_mtu(qp, u, u->m.op, u->m.first);
}

bool ursa_rc_can_start(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_rc *u = qp->rc;
	bool ok;

	if (!u)
		return false;
	pthread_mutex_lock(&u->lock);
	ok = can_start(qp, u, w);
	pthread_mutex_unlock(&u->lock);
	return ok;
}

uint32_t ursa_rc_piped(struct ursa_qp *qp)
{
	struct ursa_rc *u = qp->rc;

	return u ? __atomic_load_n(&u->pipe_n, __ATOMIC_RELAXED) : 0;
}

int ursa_rc_inflight(struct ursa_qp *qp, const struct ursa_send_wqe *w)
{
	struct ursa_rc *u = qp->rc;
	int in = 0;

	if (!u)
		return 0;
	pthread_mutex_lock(&u->lock);
	if (u->m.active && u->m.wqe == w)
		in = 2;
	else if (w->piped)
		in = 1;
	pthread_mutex_unlock(&u->lock);
	return in;
}

bool ursa_rc_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now)
{
	struct ursa_rc *u = qp->rc;

	if (u && (sr_wanted(u, w) || (u->sr.on && now >= u->tlp_at)))
		return true;
	if (u && u->pipe_n && PIPE(u, 0)->wqe == w)
		return PIPE(u, 0)->done || u->pipe_nak || u->pipe_gap ||
		       now >= u->m.deadline ||
		       now >= u->m.rto || (!u->m.nak && window_open(u));
	if (!u || !u->m.active || u->m.wqe != w)
		return true;
	return u->m.done || u->m.nak || now >= u->m.deadline ||
	       now >= u->m.rto || read_piece_due(u) ||
	       u->m.resend_read || window_open(u);
}

/*
 * A MIDDLE packet (RC, UC) by the short way, most of a stream: what the
 * message's MIDDLE packets share is worked out at the first (u->m.mid_*:
 * opcode, socket, destination, and the ICRC's register up to the BTH's
 * AckReq byte, since only that byte and the PSN differ), and each packet
 * then costs its BTH, four bytes of CRC, the payload's copy with its CRC
 * and its place in the batch. Not taken while faults are injected or a
 * capture is written (ursa_udp_send does those), nor where the SGEs do not fill
 * the packet. Returns whether the packet was sent (or, with no batch,
 * lost as send_data_pkt would lose it); false: send it the long way.
 */
static bool send_mid(struct ursa_qp *qp, struct ursa_rc *u,
		     const struct ursa_req *r, uint32_t k, const addr_t *src,
		     const addr_t *dst)
{
	uint32_t mtu = u->m.mtu, np, got = 0;
	size_t n = ROCE_BTH_LEN + mtu + ROCE_ICRC_LEN;
	struct ursa_sg part[URSA_MAX_SGE];
	uint8_t *buf, *at;
	uint32_t reg;

	if (!ursa_udp_plain())
		return false;
	np = ursa_sg_slice(r->src, r->nsrc, (uint64_t)k * mtu, mtu, part);
	for (uint32_t i = 0; i < np; i++)
		got += (uint32_t)part[i].len;
	if (got != mtu)
		return false;
	if (!u->m.mid_ok) {
		uint8_t bth[ROCE_BTH_LEN];
		uint32_t dqpn = qp->attr.dest_qp_num;

		if (ursa_udp_dest_set(&u->ep, src, dst, &u->m.mid_to))
			return false;
		u->m.mid_op = (uint8_t)(rc_transport_bits(qp) |
					req_opcode(r->opcode, false, false, false));
		roce_bth_put(bth, u->m.mid_op, false, false, 0,
			     ROCE_DEFAULT_PKEY, dqpn, false, 0);
		bth[4] = 0xff;	/* masked in the ICRC: FECN, BECN, reserved */
		u->m.mid_reg = roce_crc32_raw(ursa_udp_icrc_pfx(&u->pfx, src,
								dst,
								u->ep.sport,
								n),
					      bth, 8);
		u->m.mid_ok = true;
	}
	buf = ursa_udp_slot();
	if (buf) {
		roce_bth_put(buf, u->m.mid_op, false, false, 0,
			     ROCE_DEFAULT_PKEY, qp->attr.dest_qp_num,
			     ack_wanted(qp, u, k, false), psn_add(u->m.first, k));
		if (sr_asked(qp))
			buf[4] = ROCE_BTH4_SR;	/* (masked in the ICRC) */
		reg = roce_crc32_4(u->m.mid_reg, buf + 8);
		at = buf + ROCE_BTH_LEN;
		for (uint32_t i = 0; i < np; i++) {
			reg = roce_crc32_copy(reg, at,
					      (const void *)(uintptr_t)part[i].va,
					      part[i].len);
			at += part[i].len;
		}
		roce_icrc_put(at, ~reg);
		ursa_udp_send_to(&u->m.mid_to, buf, n);
		ursa_cnt_add(&qp->cnt.pkts_tx, 1);	/* (under u->lock) */
	}
	return true;
}

static void send_more(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct ursa_req *r, struct ursa_send_wqe *w,
		      const addr_t *src, const addr_t *dst, uint64_t now)
{
	while (window_open(u)) {
		uint32_t k = u->m.sent;

		if (k >= u->m.hiwat) {
			rc_rtt_start(u, k, now);
			u->m.hiwat = k + 1;
		}
		if (k == 0 || k + 1 >= u->m.npkts || u->m.is_read ||
		    !send_mid(qp, u, r, k, src, dst)) {
			struct msg_at at = { u->m.first, u->m.npkts, u->m.mtu };

			send_data_pkt(qp, u, r, w, &at, k,
				      ack_wanted(qp, u, k, k + 1 == u->m.npkts),
				      src, dst);
		}
		u->m.sent++;
		psn_sent(u, psn_add(u->m.first, u->m.sent));
	}
}

/* m goes into the pipe, sent whole, to wait there for its answer; the
 * next WQE may start (can_start said so). */
static void pipe_push(struct ursa_rc *u)
{
	struct upipe *e = PIPE(u, u->pipe_n++);

	u->m.wqe->piped = true;
	*e = (struct upipe){
		.wqe = u->m.wqe, .op = u->m.op, .first = u->m.first,
		.npkts = u->m.npkts, .mtu = u->m.mtu,
		.acked = u->m.acked, .len = u->m.len,
		.is_read = u->m.is_read, .ndst = u->m.ndst,
		.va = u->m.va, .rkey = u->m.rkey,
		.is_atomic = rc_is_atomic_op(u->m.op),
	};
	memcpy(e->dst, u->m.dst, u->m.ndst * sizeof(e->dst[0]));
	u->pipe_out += u->m.npkts - u->m.acked;
	u->m.active = false;
}

/* w becomes the message in flight: its PSNs, its timers; a READ or an
 * atomic asks at once (WRITEs and SENDs go out in send_more). */
static void msg_start(struct ursa_qp *qp, struct ursa_rc *u,
		      struct ursa_send_wqe *w, const struct ursa_req *r,
		      const addr_t *src, const addr_t *dst, uint64_t now)
{
	bool atomic = rc_is_atomic_op(r->opcode);

	memset(&u->m, 0, sizeof(u->m));
	u->m.active = true;
	u->m.wqe = w;
	u->m.op = r->opcode;
	if (u->peer_wide)
		rc_path_learn(qp, u, dst);
	u->m.mtu = rc_msg_mtu(qp, u, r->opcode, u->next_psn);
	/* nothing older can start again (rc_msg_mtu) */
	if (u->peer_wide && !u->pipe_n &&
	    psn_cmp(u->next_psn, u->wide_psn) >= 0)
		u->wide_all = true;
	if (u->path_wide && !u->pipe_n &&
	    psn_cmp(u->next_psn, u->path_psn) >= 0)
		u->path_all = true;
	u->m.len = r->msg_len;
	u->m.is_read = r->opcode == IBV_WR_RDMA_READ;
	u->m.npkts = atomic ? 1 :
		     (uint32_t)MAX(1, (r->msg_len + u->m.mtu - 1) / u->m.mtu);
	u->m.first = u->next_psn;
	u->next_psn = psn_add(u->next_psn, u->m.npkts);
	/* A READ's responses may come for all its PSNs as soon as it
	 * is asked for (a re-request asks for the rest); a SEND's or
	 * WRITE's answers only for packets sent (send_more). */
	if (u->m.is_read)
		psn_sent(u, u->next_psn);
	u->src = r->sgid;
	u->dst = r->dgid;
	u->hop = r->hop_limit ? r->hop_limit : 64;
	if (u->m.is_read) {
		u->m.ndst = MIN(r->ndst, (uint32_t)URSA_MAX_SGE);
		memcpy(u->m.dst, r->dst, u->m.ndst * sizeof(*r->dst));
		u->m.va = r->remote_addr;
		u->m.rkey = r->rkey;
	}
	u->m.deadline = rc_after(now, rc_timeout_ns(qp));
	u->m.rto = rc_after(now, rc_rto_ns(qp));
	if (u->m.is_read) {
		send_read_req(qp, u, r, src, dst, true);
	} else if (atomic) {
		rc_rtt_start(u, 0, now);
		send_atomic(qp, u, r, src, dst);
		u->m.sent = u->m.npkts;
	}
}

/* What the step sends once the completer has decided nothing: the next
 * READ piece or a READ/atomic asked again, and the window's packets.
 * Returns 1 when an unacknowledged (UC, UD) message is complete. */
static int msg_send(struct ursa_qp *qp, struct ursa_rc *u,
		    struct ursa_send_wqe *w, const struct ursa_req *r,
		    const addr_t *src, const addr_t *dst, uint64_t now,
		    struct ursa_resp *resp)
{
	bool atomic = rc_is_atomic_op(r->opcode);

	if (u->m.resend_read && u->m.acked == u->m.sent)
		u->m.resend_read = false;	/* nothing missing: go on */
	if (read_piece_due(u)) {
		send_read_req(qp, u, r, src, dst, true);
	} else if (u->m.resend_read) {
		u->m.resend_read = false;
		send_read_req(qp, u, r, src, dst, false);
	} else if (atomic && u->m.sent == 0) {
		send_atomic(qp, u, r, src, dst);
		u->m.sent = 1;
	}
	if (!atomic)
		send_more(qp, u, r, w, src, dst, now);
	if (qp->ex.qp_base.qp_type != IBV_QPT_RC && u->m.sent >= u->m.npkts) {
		/* UC and UD: sent is done (nobody acknowledges) */
		resp->ack = URSA_ACK;
		u->m.active = false;
		return 1;
	}
	return 0;
}

/*
 * Selective repeat (rc_sr.c): resend, alone, the packets of w that a SACK
 * showed missing, w being the oldest message of the pipe or the one in
 * flight (a later message of the pipe resends when it is the oldest: its
 * WQE's step has its request). Each asks for an ACK, which tells how the
 * gap it fills went.
 */
static void sr_resend(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct ursa_send_wqe *w, const struct ursa_req *r,
		      const addr_t *src, const addr_t *dst)
{
	struct msg_at at;
	uint32_t from, to;
	int k;

	if (u->pipe_n && PIPE(u, 0)->wqe == w) {
		const struct upipe *e = PIPE(u, 0);

		if (e->is_read || e->is_atomic || e->done)
			return;
		at = (struct msg_at){ e->first, e->npkts, e->mtu };
		from = e->acked;
		to = e->npkts;
	} else if (u->m.active && u->m.wqe == w && !u->m.is_read &&
		   !rc_is_atomic_op(u->m.op) && !u->m.nak) {
		at = (struct msg_at){ u->m.first, u->m.npkts, u->m.mtu };
		from = u->m.acked;
		to = u->m.sent;
	} else {
		return;
	}
	while (from < to && (k = rc_sr_take(u, psn_add(at.first, from),
					    to - from)) >= 0)
		send_data_pkt(qp, u, r, w, &at, from + (uint32_t)k, true, src,
			      dst);
}

/* ursa_rc_step under the QP's lock. */
static int step(struct ursa_qp *qp, struct ursa_rc *u, struct ursa_send_wqe *w,
		const struct ursa_req *r, uint64_t now, struct ursa_resp *resp,
		uint64_t *until)
{
	const addr_t *src = &r->sgid, *dst = &r->dgid;
	int ret;

	if (u->sr.on && now >= u->tlp_at)
		rc_tlp(qp, u, now);
	if (u->sr.nwant)
		sr_resend(qp, u, w, r, src, dst);
	if (u->pipe_n && PIPE(u, 0)->wqe == w) {
		/* the oldest message in flight: done, waiting, or taken
		 * back (then on as the message in flight) */
		ret = rc_comp_pipe_head(qp, u, now, resp, until);
		if (ret >= 0)
			return ret;
	} else if (u->m.active && (u->m.wqe != w || u->pipe_n)) {
		if (u->m.wqe == w || w->piped || !can_start(qp, u, w)) {
			/* behind older messages: more packets of m at most
			 * (their NAK or timeout is the oldest one's step) */
			if (u->m.wqe == w && !u->m.nak)
				send_more(qp, u, r, w, src, dst, now);
			*until = rc_wait_until(u);
			return 0;
		}
		pipe_push(u);
	}
	if (!u->m.active)
		msg_start(qp, u, w, r, src, dst, now);
	ret = rc_comp_decide(qp, u, w, now, resp);
	if (!ret)
		ret = msg_send(qp, u, w, r, src, dst, now, resp);
	if (!ret)
		*until = rc_wait_until(u);
	return ret;
}

int ursa_rc_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		 const struct ursa_req *r, uint64_t now,
		 struct ursa_resp *resp, uint64_t *until)
{
	struct ursa_rc *u = qp->rc;
	unsigned long batch0;
	int ret;

	memset(resp, 0, sizeof(*resp));
	if (!u || !ursa_udp_reachable(&u->ep, &r->sgid, &r->dgid)) {
		/* no way out: an unanswered request */
		resp->ack = URSA_DROPPED;
		resp->why = URSA_WHY_UNREACHABLE;
		resp->final = true;
		return 1;
	}
	pthread_mutex_lock(&u->lock);
	batch0 = ursa_udp_added();
	*until = UINT64_MAX;
	ret = step(qp, u, w, r, now, resp, until);
	if (u->ack_owed && ursa_udp_added() != batch0)
		rc_ack_emit(u, true);	/* after what we sent (rc_tx) */
	w->inflight = ret == 0;
	/* The engine and ursa_req_pending read the wait's end here: left
	 * stale (0), every pass took it for an expired timer, the engine
	 * never slept and posters rang its doorbell at every poll. */
	w->deadline_ns = *until;
	pthread_mutex_unlock(&u->lock);
	ursa_udp_flush_soon();
	return ret;
}
