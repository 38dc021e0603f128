// SPDX-License-Identifier: MIT
/*
 * rc_comp.c - the completer of the RoCEv2 engine (rc.h): ACKs, NAKs, READ
 * responses and atomic answers move the requester's messages on; the
 * cumulative ACK completes the pipe's WRITEs and SENDs (IBTA 9.7.5.1.1),
 * a PSN-sequence NAK or the RTO goes back to the first unacknowledged
 * packet (go-back-N); between ursa peers a NAK with a SACK and READ
 * responses out of order are taken selectively (rc_sr.c), and a tail
 * loss probe comes before the RTO; the round trip is measured (Karn) for
 * the RTO; a CNP halves the window.
 */
#include "rc.h"

#include <stdlib.h>

/* Time one first-sent packet at a time; a retransmission cancels the
 * measurement, since its answer could be for either copy (Karn). */
void rc_rtt_start(struct ursa_rc *u, uint32_t idx, uint64_t now)
{
	if (u->timing)
		return;
	u->timing = true;
	u->t_psn = psn_add(u->m.first, idx);
	u->t_sent = now;
}

/* Whether a round trip of r shows a queue on the path: well past the
 * least one, both twice it and URSA_SS_EXIT_DELAY_NS more (HyStart's
 * delay test, Ha and Rhee 2011). */
bool rc_queued(const struct ursa_rc *u, uint64_t r)
{
	return u->rtt_min && r > 2 * u->rtt_min &&
	       r - u->rtt_min > URSA_SS_EXIT_DELAY_NS;
}

/* The timed packet arrived now (acknowledged, or a READ response placed
 * out of order): the round trip's sample. */
static void rtt_sample(struct ursa_rc *u, uint64_t now)
{
	uint64_t r = now - u->t_sent, d;

	u->timing = false;
	if (!u->rtt_min || r < u->rtt_min)
		u->rtt_min = r;
	/* Slow start ends when a queue is building, so the window stops
	 * doubling into it before it drops packets. A flow next to others
	 * then takes its share from there, not from a queue it filled
	 * first. */
	if (u->cwnd < u->ssthresh && rc_queued(u, r))
		u->ssthresh = u->cwnd;
	if (!u->srtt) {
		u->srtt = r;
		u->rttvar = r / 2;
		return;
	}
	d = r > u->srtt ? r - u->srtt : u->srtt - r;
	u->rttvar = (3 * u->rttvar + d) / 4;
	u->srtt = (7 * u->srtt + r) / 8;
}

/* PSNs up to last are acknowledged: take the sample if it is one of them,
 * and progress ends the backoff. */
static void rtt_acked_psn(struct ursa_rc *u, uint32_t last, uint64_t now)
{
	u->backoff = 0;
	if (!u->timing || ((last - u->t_psn) & 0xffffff) >= 0x800000)
		return;
	rtt_sample(u, now);
}

/* The first acked packets of the message in flight are acknowledged. */
static void rtt_acked(struct ursa_rc *u, uint32_t acked, uint64_t now)
{
	if (acked)
		rtt_acked_psn(u, psn_add(u->m.first, acked - 1), now);
	else
		u->backoff = 0;
}

uint64_t rc_timeout_ns(struct ursa_qp *qp)
{
	return ursa_ack_timeout_ns(qp->attr.timeout);
}

uint64_t rc_after(uint64_t now, uint64_t d)
{
	return d == UINT64_MAX ? UINT64_MAX : now + d;
}

/*
 * Early retransmission: packets outstanding with no news for the RTO are
 * sent again from the first unacknowledged one. A lost last packet, ACK or
 * NAK then costs about a round trip instead of a whole ACK timeout;
 * duplicates are harmless to the responder (IBTA 9.7.5.1.3). Only the ACK
 * timeout counts against retry_cnt.
 *
 * The RTO follows the measured round trip as TCP's does (RFC 6298):
 * srtt + 4 * rttvar, never below URSA_RTO_US (default 1 ms) nor above
 * the ACK timeout, doubled for each early retransmission that brought no
 * progress. A fixed RTO shorter than the round trip of a loaded host (a
 * peer process waiting for a core) resends windows that were never lost,
 * which loads the host further: congestion collapse.
 */
uint64_t rc_rto_ns(struct ursa_qp *qp)
{
	struct ursa_rc *u = qp->rc;
	uint64_t floor = (uint64_t)ursa_cfg()->rto_us * 1000, r;

	r = u->srtt ? MAX(floor, u->srtt + 4 * u->rttvar) : floor;
	r <<= MIN(u->backoff, 8u);
	return MIN(rc_timeout_ns(qp), r);
}

/* Send again from the first unacknowledged packet (a READ asks again
 * inside its piece, an atomic is resent whole), and back the RTO off. */
void rc_go_back(struct ursa_qp *qp, struct ursa_rc *u, bool atomic,
		uint64_t now)
{
	atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
	u->timing = false;
	u->backoff++;
	u->cwnd = MAX(URSA_UDP_WINDOW_MIN, u->cwnd / 2);
	/* Go-back-N resends the window: the threshold keeps it at least
	 * URSA_UDP_WINDOW (rc_window_grow). A peer that repeats selectively
	 * loses nothing by a small window: TCP's threshold, which lets a
	 * flow next to others back off (docs/design.md "Congestion"). */
	u->ssthresh = u->sr.on ? u->cwnd : MAX(URSA_UDP_WINDOW, u->cwnd);
	u->cwnd_acc = 0;
	rc_sr_forget(u);
	if (u->m.is_read)
		u->m.resend_read = true;
	else
		u->m.sent = u->m.acked;
	if (atomic)
		u->m.sent = 0;
	u->m.rto = rc_after(now, rc_rto_ns(qp));
}

/* PSNs up to last are acknowledged (cumulative): the pipe's messages they
 * cover are done. */
static void pipe_ack(struct ursa_qp *qp, struct ursa_rc *u, uint32_t last,
		     uint64_t now)
{
	bool moved = false;

	for (uint32_t i = 0; i < u->pipe_n; i++) {
		struct upipe *e = PIPE(u, i);
		uint32_t idx = (last - e->first) & 0xffffff, n;

		if (e->done)
			continue;
		if (idx >= 0x800000 || e->is_read || e->is_atomic)
			break;	/* (before this message; READ, atomic: their
				 * responses) */
		n = MIN(idx + 1, e->npkts);
		if (n > e->acked) {
			u->pipe_out -= MIN(u->pipe_out, n - e->acked);
			rc_window_grow(qp, u, n - e->acked);
			e->acked = n;
			moved = true;
		}
		if (e->acked < e->npkts)
			break;
		e->done = true;
	}
	if (moved) {
		rtt_acked_psn(u, last, now);
		u->m.deadline = rc_after(now, rc_timeout_ns(qp));
		u->m.rto = rc_after(now, rc_rto_ns(qp));
	}
}

/* The oldest message of the pipe becomes the one in flight again (see
 * rc_pipe_class); the others' state goes: they start again behind it. */
void rc_pipe_collapse(struct ursa_rc *u)
{
	struct upipe e = *PIPE(u, 0);
	uint64_t deadline = u->m.deadline, rto = u->m.rto;

	memset(&u->m, 0, sizeof(u->m));
	u->m.active = true;
	u->m.wqe = e.wqe;
	u->m.op = e.op;
	u->m.mtu = e.mtu;
	u->m.len = e.len;
	u->m.npkts = e.npkts;
	u->m.first = e.first;
	u->m.sent = u->m.acked = e.acked;
	u->m.hiwat = e.npkts;
	u->m.deadline = deadline;
	u->m.rto = rto;
	u->m.is_read = e.is_read;	/* (asks again from acked) */
	u->m.ndst = e.ndst;
	memcpy(u->m.dst, e.dst, e.ndst * sizeof(e.dst[0]));
	u->m.va = e.va;
	u->m.rkey = e.rkey;
	if (u->pipe_nak && ((u->pipe_nak_psn - e.first) & 0xffffff) < e.npkts) {
		u->m.nak = u->pipe_nak;
		u->m.nak_psn = u->pipe_nak_psn;
	}
	u->next_psn = psn_add(e.first, e.npkts);
	rc_pipe_drop(u);
	rc_sr_forget(u);
	u->timing = false;
	if (e.is_read || e.is_atomic)
		u->pipe_cool = e.wqe;
}

/* Place READ response packet idx of a READ of len bytes (npkts packets of
 * mtu) into dst: bounded by what was asked for, into our own buffers.
 * False (and counted) when its length does not fit. */
static bool read_place(const struct ursa_sg *dst, uint32_t ndst, uint64_t len,
		       uint32_t npkts, uint32_t mtu, uint32_t idx,
		       const struct roce_pkt *p)
{
	uint64_t off = (uint64_t)idx * mtu;

	if (off + p->paylen > len || (idx + 1 < npkts && p->paylen != mtu)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_short, 1);
		return false;
	}
	if (p->paylen) {
		struct ursa_sg s = { (uintptr_t)p->payload, p->paylen };

		ursa_xfer(dst, ndst, false, &s, 1, false, 0, off, p->paylen);
	}
	return true;
}

/*
 * Selective repeat of READ responses (rc_sr.c). A READ whose responses
 * come in, the message in flight or one of the pipe: where they go, what
 * was asked for (end: packets), what is in place in order (acked).
 */
struct rd {
	uint32_t first, npkts, mtu, end, acked, rkey, ndst;
	uint64_t len, va;
	const struct ursa_sg *dst;
};

static struct rd rd_pipe(const struct upipe *e)
{
	return (struct rd){ e->first, e->npkts, e->mtu, e->npkts, e->acked,
			    e->rkey, e->ndst, e->len, e->va, e->dst };
}

static struct rd rd_msg(const struct ursa_rc *u)
{
	return (struct rd){ u->m.first, u->m.npkts, u->m.mtu, u->m.sent,
			    u->m.acked, u->m.rkey, u->m.ndst, u->m.len,
			    u->m.va, u->m.dst };
}

/* The oldest PSN not answered: where selective repeat's bits start */
static uint32_t oldest_open(const struct ursa_rc *u)
{
	for (uint32_t i = 0; i < u->pipe_n; i++)
		if (!PIPE(u, i)->done)
			return psn_add(PIPE(u, i)->first, PIPE(u, i)->acked);
	return psn_add(u->m.first, u->m.acked);
}

/*
 * Ask again, alone, for r's missing responses before packet upto: each
 * run of them as one READ of just those packets (rc_read_again). A run
 * asked for less than two round trips ago is not asked again. The
 * responder answers in PSN order, so a response arrived past a run means
 * the run is lost.
 */
static void rd_ask_missing(struct ursa_qp *qp, struct ursa_rc *u,
			   const struct rd *r, uint32_t upto, uint64_t now)
{
	rc_sr_epoch(u, now);
	for (uint32_t k = r->acked, j; k < upto; k = MAX(j, k + 1)) {
		for (j = k; j < upto; j++) {
			uint32_t q = psn_add(r->first, j);

			if (rc_sr_has(u, q) || rc_sr_asked(u, q))
				break;
		}
		if (j == k)
			continue;
		rc_read_again(qp, u, psn_add(r->first, k), r->mtu,
			      r->va + (uint64_t)k * r->mtu, r->rkey,
			      (uint32_t)MIN(r->len - (uint64_t)k * r->mtu,
					    (uint64_t)(j - k) * r->mtu));
		/* Karn: the timed response, if asked again, may now come
		 * for either request. Any other sample stands, taken when
		 * its response arrives (in order or not, rd_take): cancelled
		 * at every ask, none finished under loss, and the round trip
		 * stayed that of an idle responder, too short to wait for
		 * an ask's answer behind the responses queued before it. */
		if (u->timing &&
		    ((u->t_psn - psn_add(r->first, k)) & 0xffffff) < j - k)
			u->timing = false;
		for (uint32_t i = k; i < j; i++)
			rc_sr_mark_asked(u, psn_add(r->first, i));
	}
}

/*
 * A READ response for packet idx of r: placed in order (returns how many
 * packets are now in place past r->acked, counting those placed out of
 * order before), or, from a responder that marks its responses
 * ROCE_BTH4_SR, out of order (returns 0; the runs missing before it are
 * asked for again). -1: not placed (a gap for go-back-N, or refused).
 */
static int rd_take(struct ursa_qp *qp, struct ursa_rc *u, const struct rd *r,
		   uint32_t idx, const struct roce_pkt *p)
{
	uint64_t now;
	uint32_t n;

	if (idx == r->acked && idx < r->npkts) {
		if (!read_place(r->dst, r->ndst, r->len, r->npkts, r->mtu, idx,
				p))
			return -1;
		for (n = idx + 1; n < r->end && rc_sr_has(u, psn_add(r->first, n));)
			n++;
		return (int)(n - r->acked);
	}
	if (!p->sr || !ursa_cfg()->sr || idx <= r->acked || idx >= r->end)
		return -1;
	rc_sr_start(u, oldest_open(u));
	if (rc_sr_has(u, p->psn)) {
		atomic_fetch_add(&ursa_udp_cnt.dup, 1);
		return 0;
	}
	if (!read_place(r->dst, r->ndst, r->len, r->npkts, r->mtu, idx, p))
		return -1;
	rc_sr_mark(u, p->psn);
	if (!rc_sr_has(u, p->psn))
		return -1;	/* (beyond the bits: go back for it) */
	now = ursa_now_ns();
	if (u->timing && p->psn == u->t_psn)
		rtt_sample(u, now);	/* (it arrived now) */
	rd_ask_missing(qp, u, r, idx, now);
	return 0;
}

/* A READ response or an ATOMIC ACKNOWLEDGE for a READ or atomic of the
 * pipe (see rc_pipe_class). */
static void pipe_resp(struct ursa_qp *qp, struct ursa_rc *u,
		      struct upipe *e, const struct roce_pkt *p)
{
	uint32_t idx = (p->psn - e->first) & 0xffffff;
	bool atomic_ack = (p->opcode & 0x1f) == OP_ATOMIC_ACK;
	struct rd r = rd_pipe(e);
	uint64_t now;
	int n = -1;

	if (!e->done && atomic_ack == e->is_atomic) {
		if (e->is_read)
			n = rd_take(qp, u, &r, idx, p);
		else if (e->is_atomic && idx == e->acked)
			n = 1;
	}
	if (n < 0) {
		if (e->is_read && !atomic_ack && !e->done && idx > e->acked &&
		    !u->pipe_gap) {
			u->pipe_gap = true;	/* ask again (rc_pipe_collapse) */
			atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
		}
		atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
		return;
	}
	if (!n)
		return;
	if (e->is_atomic)
		e->orig = p->orig;
	now = ursa_now_ns();
	e->acked += (uint32_t)n;
	u->pipe_out -= MIN(u->pipe_out, (uint32_t)n);
	rc_window_grow(qp, u, (uint32_t)n);
	rtt_acked_psn(u, psn_add(e->first, e->acked - 1), now);
	u->m.deadline = rc_after(now, rc_timeout_ns(qp));
	u->m.rto = rc_after(now, rc_rto_ns(qp));
	if (e->acked == e->npkts)
		e->done = true;
}

/*
 * Responses of a later READ came while the pipe's READs before it (before
 * entry i; i < 0: before the message in flight) still miss some: with
 * selective repeat those are asked for alone, and the later responses are
 * taken. Returns false when that cannot be (an atomic's answer is
 * missing, or the responder does not repeat selectively): go back.
 */
static bool sr_ask_before(struct ursa_qp *qp, struct ursa_rc *u, int i,
			  const struct roce_pkt *p)
{
	uint32_t end = i < 0 ? u->pipe_n : (uint32_t)i;
	uint64_t now = ursa_now_ns();

	if (!p->sr || !ursa_cfg()->sr || !(roce_opcode_flags(p->opcode) & P_READ))
		return false;
	for (uint32_t j = 0; j < end; j++)
		if (!PIPE(u, j)->done && !PIPE(u, j)->is_read)
			return false;
	rc_sr_start(u, oldest_open(u));
	for (uint32_t j = 0; j < end; j++) {
		struct rd r = rd_pipe(PIPE(u, j));

		if (!PIPE(u, j)->done)
			rd_ask_missing(qp, u, &r, r.npkts, now);
	}
	return true;
}

/*
 * Does an answer's PSN name a packet this requester sent and has not seen
 * acknowledged: from the oldest message waiting (the pipe's, else the one
 * in flight) up to the highest PSN ever sent? Any other is stale or forged
 * (IBTA 9.7.5.2.x: a PSN outside the outstanding requests is not an
 * answer to one), and a forged one must not change the QP: a NAK there
 * would end a healthy QP in error, an RNR NAK stall it, an ACK complete
 * messages never delivered.
 */
static bool psn_in_flight(const struct ursa_rc *u, uint32_t psn)
{
	uint32_t oldest = u->pipe_n ? PIPE(u, 0)->first : u->m.first;

	return ((psn - oldest) & 0xffffff) < ((u->psn_hi - oldest) & 0xffffff);
}

/* An answer for a message of the pipe (or one that shows a pipe's READ
 * or atomic lost its responses). Returns whether it was taken here. */
static bool pipe_answer(struct ursa_qp *qp, struct ursa_rc *u,
			const struct roce_pkt *p, uint32_t f, uint32_t idx)
{
	bool resp = (f & P_READ) || (p->opcode & 0x1f) == OP_ATOMIC_ACK;
	int i;

	if (!resp) {
		bool nak = (p->syndrome & AETH_TYPE_MASK) != AETH_ACK;

		/* (a NAK acknowledges the PSNs before its own) */
		pipe_ack(qp, u, nak ? psn_add(p->psn, 0xffffff) : p->psn,
			 ursa_now_ns());
		i = rc_pipe_holds(u, p->psn);
		if (i < 0)
			return false;
		if (nak && !PIPE(u, i)->done) {
			u->pipe_nak = p->syndrome;
			u->pipe_nak_psn = p->psn;
		}
		return true;
	}
	i = rc_pipe_holds(u, p->psn);
	const struct upipe *prev = i > 0 ? PIPE(u, i - 1) :
				   i < 0 && idx < u->m.npkts ?
				   PIPE(u, u->pipe_n - 1) : NULL;

	if (prev && !prev->done && !sr_ask_before(qp, u, i, p)) {
		/* a later READ's or atomic's responses while an
		 * earlier one's are missing: those were lost (the
		 * responder answers in PSN order) */
		if (!u->pipe_gap) {
			u->pipe_gap = true;
			atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
		}
		atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
		return true;
	}
	if (i < 0)
		return false;
	pipe_resp(qp, u, PIPE(u, i), p);
	return true;
}

/* Packets up to n of the message in flight are answered: the window
 * grows, the timers restart, the retry count will (IBTA 9.7.6.1.3). */
static void msg_acked(struct ursa_qp *qp, struct ursa_rc *u, uint32_t n)
{
	uint64_t now = ursa_now_ns();

	rc_window_grow(qp, u, n - u->m.acked);
	u->m.acked = n;
	/* (a responder that held packets may acknowledge past what a go-back
	 * has sent again: they need not go again) */
	u->m.sent = MAX(u->m.sent, n);
	u->m.progress = true;
	rtt_acked(u, u->m.acked, now);
	u->m.deadline = rc_after(now, rc_timeout_ns(qp));
	u->m.rto = rc_after(now, rc_rto_ns(qp));
	if (u->m.acked == u->m.npkts)
		u->m.done = true;
}

/*
 * Tail loss probe (selective repeat; TCP's, RFC 8985 7): the answers
 * stopped for two round trips while packets are out. A loss at the tail of
 * what was sent shows the responder no later packet, so no SACK tells of
 * it, and the RTO (at least URSA_RTO_US, for hosts whose processes wait for
 * a core) is many round trips. Probe once per quiet spell: a READ asks
 * again for its missing responses, a WRITE or SEND sends its last packet
 * again, asking for an ACK. Neither goes back nor cuts the window; the RTO
 * still does if the probe brings nothing.
 */
static uint64_t tlp_ns(struct ursa_qp *qp, const struct ursa_rc *u)
{
	uint64_t rto = rc_rto_ns(qp);

	return u->srtt ? MIN(rto, MAX(2 * u->srtt, URSA_TLP_MIN_NS)) : rto;
}

void rc_tlp(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now)
{
	u->tlp_at = UINT64_MAX;
	if (!u->sr.on || !u->m.active || u->m.done || u->m.nak ||
	    u->m.sent <= u->m.acked)
		return;
	if (u->m.is_read) {
		/* one run: the first hole (its request may have been lost
		 * too: asked again, whenever asked before), else the
		 * responses past the last one held. Not more: responses
		 * that are only late would come twice, and a responder
		 * that is behind would fall further behind. */
		struct rd r = rd_msg(u);
		uint32_t k = r.acked, j;

		while (k < r.end && rc_sr_has(u, psn_add(r.first, k)))
			k++;
		for (j = k; j < r.end && !rc_sr_has(u, psn_add(r.first, j)); j++)
			rc_sr_unask(u, psn_add(r.first, j));
		r.acked = k;
		rd_ask_missing(qp, u, &r, j, now);
	} else if (rc_pipe_class(u->m.op) == 1) {
		rc_sr_want(u, psn_add(u->m.first, u->m.sent - 1));
	}
}

/* When the requester's next timer is due: the ACK timeout, the RTO, the
 * tail loss probe */
uint64_t rc_wait_until(const struct ursa_rc *u)
{
	uint64_t t = MIN(u->m.deadline, u->m.rto);

	return u->sr.on ? MIN(t, u->tlp_at) : t;
}

/*
 * A NAK with a SACK (selective repeat, rc_sr.c) while WRITEs and SENDs are
 * in flight: the cumulative ACK of the PSNs before the NAK's, and what the
 * responder holds after it; nothing goes back. Returns whether it was
 * taken here (else it is a plain NAK: go back).
 */
static bool take_sack(struct ursa_qp *qp, struct ursa_rc *u,
		      const struct roce_pkt *p)
{
	const uint8_t *bits;
	unsigned nbits;
	uint32_t idx = (p->psn - u->m.first) & 0xffffff;
	uint64_t now = ursa_now_ns();

	if (rc_pipe_class(u->m.op) != 1 || roce_sack_parse(p, &bits, &nbits))
		return false;
	if (u->pipe_n)
		pipe_ack(qp, u, psn_add(p->psn, 0xffffff), now);
	if (idx <= u->m.sent && idx > u->m.acked)
		msg_acked(qp, u, idx);
	rc_sr_sack(u, p->psn, bits, nbits, u->psn_hi, now);
	return true;
}

/* A READ response packet for the message in flight: placed if it is the
 * next one (or out of order, rd_take); a gap asks again from the first
 * missing packet. */
static void read_answer(struct ursa_qp *qp, struct ursa_rc *u,
			const struct roce_pkt *p, uint32_t idx)
{
	struct rd r = rd_msg(u);
	int n = u->m.is_read ? rd_take(qp, u, &r, idx, p) : -1;

	if (n > 0)
		msg_acked(qp, u, u->m.acked + (uint32_t)n);
	if (n >= 0 || (u->m.is_read && idx == u->m.acked))
		return;	/* (taken, or refused and counted) */
	/* A gap in the responses: ask again from the first missing
	 * packet, once per gap (as rxe's completer does), rather than
	 * wait for the ACK timeout. */
	atomic_fetch_add(&ursa_udp_cnt.drop_psn, 1);
	if (u->m.is_read && idx > u->m.acked && idx < u->m.npkts &&
	    u->m.rerequested != u->m.acked + 1) {
		u->m.rerequested = u->m.acked + 1;
		u->m.resend_read = true;
		u->timing = false;
		atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
	}
}

/* rc_on_response, before the selective repeat's bits follow */
static void on_response(struct ursa_qp *qp, struct ursa_rc *u,
			const struct roce_pkt *p)
{
	uint32_t idx, n;
	uint32_t f = roce_opcode_flags(p->opcode);
	bool acks, past;

	if (!u->m.active) {
		atomic_fetch_add(&ursa_udp_cnt.dup, 1);
		return;
	}
	/* Any answer, even a stale one, shows the responder is still
	 * sending: hold the early retransmission back until the answers
	 * stop. Otherwise a requester slower than its RTO at draining its
	 * socket asks again and again, each request adds a window of
	 * duplicates, and no answer to the newest request gets through
	 * (congestion collapse). Only progress moves the ACK timeout. */
	u->m.rto = rc_after(ursa_now_ns(), rc_rto_ns(qp));
	u->tlp_at = rc_after(ursa_now_ns(), tlp_ns(qp, u));
	if (!psn_in_flight(u, p->psn)) {
		atomic_fetch_add(&ursa_udp_cnt.drop_stale, 1);
		return;
	}
	if (p->sr && p->paylen && take_sack(qp, u, p))
		return;
	idx = (p->psn - u->m.first) & 0xffffff;
	if (u->pipe_n && pipe_answer(qp, u, p, f, idx))
		return;
	if (f & P_READ) {
		read_answer(qp, u, p, idx);
		return;
	}
	/* An answer past the message's last PSN (not before its first)
	 * acknowledges all of it: after rc_pipe_collapse the responder may
	 * already hold the messages that go out again behind this one, and
	 * answers their copies from where it is. A NAK out there concerns
	 * one of those, which will be sent again. */
	acks = !u->m.is_read && !rc_is_atomic_op(u->m.op);
	past = acks && idx >= u->m.npkts && idx < 0x800000;
	if ((p->syndrome & AETH_TYPE_MASK) != AETH_ACK && !past) {
		u->m.nak = p->syndrome;
		u->m.nak_psn = p->psn;
		return;
	}
	if ((p->opcode & 0x1f) == OP_ATOMIC_ACK) {
		if (idx == 0 && u->m.npkts == 1 && !u->m.is_read) {
			u->m.orig = p->orig;
			u->m.done = true;
			rtt_acked(u, 1, ursa_now_ns());
		}
		return;
	}
	/* cumulative ACK of SEND/WRITE packets */
	n = past ? u->m.npkts : idx + 1;
	if (acks && (idx < u->m.npkts || past) && n > u->m.acked)
		msg_acked(qp, u, n);
}

/* A response for our requester QP (RC): move the message forward. Called
 * with u->lock held. */
void rc_on_response(struct ursa_qp *qp, struct ursa_rc *u,
		    const struct roce_pkt *p)
{
	on_response(qp, u, p);
	if (u->sr.on && u->m.active)
		rc_sr_advance(u, oldest_open(u));
}

/* The oldest message of the pipe, at its WQE's step: 1 done (resp: its
 * answer), 0 still waiting (*until: for how long), -1 taken back after a
 * NAK, a gap or a timer: it is the message in flight again. */
int rc_comp_pipe_head(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now,
		      struct ursa_resp *resp, uint64_t *until)
{
	(void)qp;
	if (PIPE(u, 0)->done) {
		resp->ack = URSA_ACK;
		resp->atomic_orig = PIPE(u, 0)->orig;
		rc_pipe_pop(u);
		return 1;
	}
	if (!u->pipe_nak && !u->pipe_gap && now < u->m.deadline &&
	    now < u->m.rto) {
		*until = rc_wait_until(u);
		return 0;
	}
	rc_pipe_collapse(u);
	return -1;
}

/*
 * A PSN-sequence NAK at packet idx of the READ in flight: the responder
 * executed the requests before idx and dropped those after (a request was
 * lost). Go-back-N asks again from the first response not in place. With
 * selective repeat the pieces before idx were answered; their missing
 * responses are asked for alone as usual (rd_ask_missing, the tail loss
 * probe), so only the pieces from idx are asked again: going back to the
 * first missing response had the responder send again every response of
 * the pieces asked ahead (rc_req.c read_piece_due).
 */
static void read_nak(struct ursa_rc *u, uint32_t idx)
{
	uint32_t k = 0;

	if (!u->sr.on || idx <= u->m.acked || idx >= u->m.sent) {
		u->m.sent = u->m.acked;
		u->m.nahead = 0;
		return;
	}
	u->m.sent = idx;
	while (k < u->m.nahead && u->m.ahead[k] <= idx)
		k++;
	u->m.nahead = k;
}

/* A NAK for the message in flight (IBTA 9.7.5.2): RNR, PSN sequence
 * error (go back), or a fatal one. Returns 1 when it decides the WQE. */
static int take_nak(struct ursa_qp *qp, struct ursa_rc *u, bool atomic,
		    struct ursa_resp *resp)
{
	uint8_t syn = u->m.nak;
	uint32_t idx = (u->m.nak_psn - u->m.first) & 0xffffff;

	u->m.nak = 0;
	atomic_fetch_add(&ursa_udp_cnt.naks_rcvd, 1);
	if ((syn & AETH_TYPE_MASK) == AETH_RNR || syn == AETH_NAK_PSN)
		rc_sr_forget(u);	/* (go back) */
	atomic_fetch_add((syn & AETH_TYPE_MASK) == AETH_RNR ? &qp->cnt.rnr_rcvd :
			 syn == AETH_NAK_PSN ? &qp->cnt.naks_seq :
			 syn == AETH_NAK_ACCESS ? &qp->cnt.naks_access :
			 syn == AETH_NAK_OP ? &qp->cnt.naks_op :
					      &qp->cnt.naks_inv, 1);
	if ((syn & AETH_TYPE_MASK) == AETH_RNR) {
		/* resend from the refused packet after the timer (req.c
		 * takes one of rnr_retry) */
		u->timing = false;
		if (idx < u->m.npkts && !u->m.is_read)
			u->m.sent = u->m.acked = idx;
		u->m.resend_read = u->m.is_read;
		if (atomic)
			u->m.sent = 0;
		resp->ack = URSA_NAK_RNR;
		resp->rnr_timer = syn & 0x1f;
		resp->why = URSA_WHY_NO_RECV;
		atomic_fetch_add(&ursa_udp_cnt.rnr_naks, 1);
		return 1;
	}
	if (syn == AETH_NAK_PSN) {
		/* go back to the PSN the responder expects. For a
		 * READ that PSN tells which requests arrived, not which
		 * responses did: ask again from the first missing
		 * response (taken for received, the packets between
		 * were never written: a 256 KiB READ came back with
		 * 101 KiB of zeros under injected loss). */
		u->timing = false;
		if (u->m.is_read) {
			read_nak(u, idx);
		} else if (idx < u->m.npkts && idx >= u->m.acked) {
			u->m.acked = idx;
			u->m.sent = idx;
		}
		atomic_fetch_add(&ursa_udp_cnt.retransmits, 1);
		return 0;
	}
	resp->ack = syn == AETH_NAK_ACCESS ? URSA_NAK_ACCESS :
		    syn == AETH_NAK_OP ? URSA_NAK_OP_ERR :
					 URSA_NAK_INV_REQ;
	resp->why = URSA_WHY_OPCODE;
	if (syn == AETH_NAK_ACCESS)
		resp->why = URSA_WHY_ACCESS;
	u->m.active = false;
	return 1;
}

/*
 * What the answers and the timers decided for the message in flight, at
 * its WQE's step: done (ACKed, answered), a NAK, the local ACK timeout
 * (IBTA 9.7.6.1.3: one of retry_cnt, none left is RETRY_EXC_ERR) or the
 * RTO (go back, free of charge). Returns 1 when the WQE is decided (resp:
 * how), 0 when the requester sends on.
 */
int rc_comp_decide(struct ursa_qp *qp, struct ursa_rc *u,
		   struct ursa_send_wqe *w, uint64_t now,
		   struct ursa_resp *resp)
{
	bool atomic = rc_is_atomic_op(u->m.op);

	if (u->m.progress) {
		/* IBTA 9.7.6.1.3: the retry count restarts with progress */
		u->m.progress = false;
		ursa_retry_progress(qp, w);
	}
	if (u->m.done) {
		resp->ack = URSA_ACK;
		resp->atomic_orig = u->m.orig;
		u->m.active = false;
		return 1;
	}
	if (u->m.nak && take_nak(qp, u, atomic, resp))
		return 1;
	if (now >= u->m.deadline) {
		if (!ursa_retry_take(qp, w)) {
			ursa_dbg("qp %u: retries exhausted at PSN %u (packet %u of %u, %u sent)",
				 qp->ex.qp_base.qp_num,
				 psn_add(u->m.first, u->m.acked), u->m.acked,
				 u->m.npkts, u->m.sent);
			resp->ack = URSA_DROPPED;
			resp->why = URSA_WHY_NOT_READY;
			resp->final = true;
			u->m.active = false;
			return 1;
		}
		rc_go_back(qp, u, atomic, now);
		u->m.deadline = rc_after(now, rc_timeout_ns(qp));
	} else if (now >= u->m.rto && qp->ex.qp_base.qp_type == IBV_QPT_RC) {
		rc_go_back(qp, u, atomic, now);	/* early (see rc_rto_ns) */
	}
	return 0;
}

/*
 * A CNP for our requester: the path marks our packets Congestion
 * Experienced. The window halves, once a round trip at most (a round
 * trip's CNPs answer one window: RFC 3168 6.1.2 reduces once per window
 * of data too), never below URSA_UDP_WINDOW_MIN packets, and grows back
 * by one packet per window acknowledged (rc_window_grow above ssthresh).
 * DCQCN cuts a rate by a factor it learns; a window halved per round
 * trip is what TCP does with the same marks, so the two share a queue.
 */
void rc_comp_cnp(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now)
{
	uint64_t rtt = u->srtt ? u->srtt : URSA_CNP_GAP_NS;

	(void)qp;
	atomic_fetch_add(&ursa_udp_cnt.cnp_rcvd, 1);
	if (u->cut_at && now - u->cut_at < rtt)
		return;
	u->cut_at = now;
	rc_window_cut(u);
	atomic_fetch_add(&ursa_udp_cnt.cnp_cuts, 1);
}
