// SPDX-License-Identifier: MIT
/*
 * rc_sr.c - selective repeat between ursa peers (rc.h, proto/roce.h
 * ROCE_BTH4_SR). IBTA RC is go-back-N: a responder drops every packet
 * after a gap and NAKs once, the requester sends everything again from
 * the first missing packet. On a path that loses packets at random that
 * resends a round trip's worth of packets per loss, and the window the
 * losses leave is too small to keep the path full.
 *
 * Between ursa peers, as IRN (SIGCOMM 2018) proposes for RoCE NICs:
 * - the responder holds the WRITE and SEND packets that arrive after a
 *   gap (a copy each, up to URSA_SR_SLOTS PSNs past the expected one),
 *   executes them in PSN order once the gap is filled (rc_sr_drain), and
 *   answers the gap with a PSN-sequence NAK that carries a SACK: which
 *   PSNs after the expected one it holds. Requests are executed in PSN
 *   order as before, so completions, RNR and errors are unchanged;
 * - the requester (the functions below rc_sr_sack) takes a SACK as the
 *   cumulative ACK of the PSNs before the NAK's, resends only the packets
 *   the SACK shows missing below the highest one held, once a round trip,
 *   and halves its window once a round trip with losses, as TCP with SACK
 *   does (RFC 6675). The packets the responder holds do not count against
 *   the window.
 * - READ responses, which the requester receives: placed out of order
 *   and the missing runs asked for alone (rc_comp.c rd_take; the bits
 *   below say which are in place and which were asked for).
 * READ requests and atomics after a gap are dropped and NAKed as before;
 * a tail loss probe (rc_comp.c rc_tlp) stands in for the SACK that a loss
 * at the tail never causes; the timers still go back to the first
 * unacknowledged packet. A peer that does not set ROCE_BTH4_SR (rxe, a
 * NIC) never receives a SACK; a requester that gets plain NAKs goes back.
 */
#include "rc.h"

#include <stdlib.h>

/* A request packet held out of order: parsed, its payload copied. */
struct rc_held {
	struct roce_pkt p;
	addr_t me, peer;
	uint8_t data[];
};

#define SLOT(psn) ((psn) % URSA_SR_SLOTS)

static void held_free(struct ursa_rc *u, uint32_t slot)
{
	free(u->held[slot]);
	u->held[slot] = NULL;
	u->nheld--;
}

void rc_sr_free_held(struct ursa_rc *u)
{
	if (u->held)
		for (uint32_t i = 0; i < URSA_SR_SLOTS && u->nheld; i++)
			if (u->held[i])
				held_free(u, i);
	free(u->held);
	u->held = NULL;
	u->nheld = 0;
}

/* The NAK with its SACK: PSN-sequence error at the expected PSN, a bit
 * for each PSN up to the highest held. */
static void send_sack(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *to,
		      const addr_t *from)
{
	uint8_t buf[ROCE_BTH_LEN + 4 + 4 + ROCE_SACK_MAX_BITS / 8 +
		    ROCE_ICRC_LEN];
	uint8_t sack[4 + ROCE_SACK_MAX_BITS / 8] = { 0 };
	struct roce_pkt p = { 0 };
	uint32_t n = (u->held_hi - u->epsn) & 0xffffff;
	int b;

	if (!n || n > URSA_SR_SLOTS)
		return;
	sack[0] = (uint8_t)(n >> 8);
	sack[1] = (uint8_t)n;
	for (uint32_t i = 0; i < n; i++) {
		const struct rc_held *h = u->held[SLOT(u->epsn + 1 + i)];

		if (h && h->p.psn == psn_add(u->epsn, 1 + i))
			sack[4 + i / 8] |= (uint8_t)(1u << (i % 8));
	}
	p.opcode = ROCE_RC | OP_ACK;
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = u->epsn;
	p.syndrome = AETH_NAK_PSN;
	p.msn = u->msn & 0xffffff;
	p.sr = true;
	b = roce_build(buf, sizeof(buf), &p, sack, roce_sack_len(n));
	if (b > 0) {
		rc_tx(u, from, to, buf, (size_t)b,
		      qp->attr.ah_attr.grh.hop_limit, false);
		atomic_fetch_add(&ursa_udp_cnt.sacks_sent, 1);
	}
	u->held_since_sack = 0;
}

/*
 * A request packet d PSNs past the expected one (psn_check), from a
 * requester that repeats selectively: a WRITE or SEND packet is held for
 * its turn and the gap answered with a SACK, at once when it opens a gap
 * (the first after the expected PSN, or one past the highest held) or
 * asks for an ACK, else every URSA_SR_SACK_EVERY packets. Returns whether
 * the packet was taken here; if not, go-back-N's rules apply to it.
 */
bool rc_sr_hold(struct ursa_qp *qp, struct ursa_rc *u, const struct roce_pkt *p,
		uint32_t f, uint32_t d, const addr_t *me, const addr_t *peer)
{
	uint32_t s = SLOT(p->psn);
	struct rc_held *h;
	bool gap;

	if (!p->sr || !ursa_cfg()->sr || !(f & (P_WRITE | P_SEND)) ||
	    d >= URSA_SR_SLOTS)
		return false;
	if (!u->held && !(u->held = calloc(URSA_SR_SLOTS, sizeof(*u->held))))
		return false;
	if (u->held[s] && u->held[s]->p.psn == p->psn) {
		atomic_fetch_add(&ursa_udp_cnt.dup, 1);	/* held already */
		if (p->ackreq)
			send_sack(qp, u, peer, me);
		return true;
	}
	h = malloc(sizeof(*h) + p->paylen);
	if (!h)
		return false;
	if (u->held[s])
		held_free(u, s);	/* a stale one, for a PSN long gone */
	h->p = *p;
	memcpy(h->data, p->payload, p->paylen);
	h->p.payload = h->data;
	h->me = *me;
	h->peer = *peer;
	u->held[s] = h;
	gap = !u->nak_sent ||
	      (u->nheld && p->psn != psn_add(u->held_hi, 1));
	if (!u->nheld || psn_cmp(p->psn, u->held_hi) > 0)
		u->held_hi = p->psn;
	u->nheld++;
	u->nak_sent = true;
	atomic_fetch_add(&ursa_udp_cnt.ooo_held, 1);
	if (gap || p->ackreq || ++u->held_since_sack >= URSA_SR_SACK_EVERY)
		send_sack(qp, u, peer, me);
	return true;
}

/* The packet at psn arrived in order and is executed: a copy held for it
 * is not needed any more. */
void rc_sr_taken(struct ursa_rc *u, uint32_t psn)
{
	uint32_t s = SLOT(psn);

	if (u->nheld && u->held[s] && u->held[s]->p.psn == psn)
		held_free(u, s);
}

/*
 * The expected PSN moved: execute the held packets that are now next, in
 * PSN order, then tell the requester where the responder stands: a SACK
 * if packets are still held behind a gap, else an ACK (the requester's
 * window waits for it).
 */
void rc_sr_drain(struct ursa_qp *qp, struct ursa_rc *u)
{
	addr_t me, peer;
	bool moved = false;

	while (u->nheld) {
		uint32_t s = SLOT(u->epsn), before = u->epsn;
		struct rc_held *h = u->held[s];

		if (!h || h->p.psn != u->epsn)
			break;
		u->held[s] = NULL;
		u->nheld--;
		me = h->me;
		peer = h->peer;
		rc_on_request(qp, u, &h->p, &me, &peer);
		free(h);
		moved = true;
		if (u->epsn == before)
			break;	/* not executed (RNR, an error): it comes again */
	}
	if (u->nheld && psn_cmp(u->held_hi, u->epsn) < 0)
		rc_sr_free_held(u);	/* all behind the expected PSN */
	if (!moved)
		return;
	if (u->nheld)
		send_sack(qp, u, &peer, &me);
	else
		rc_send_ack(qp, u, &peer, &me, OP_ACK,
			    AETH_ACK | AETH_CREDIT_INVALID,
			    psn_add(u->epsn, 0xffffff), 0);
}

/* --- requester ------------------------------------------------------------ */

#define BIT(a, psn) ((a)[SLOT(psn) / 64] >> (SLOT(psn) % 64) & 1)
#define SET(a, psn) ((a)[SLOT(psn) / 64] |= 1ull << (SLOT(psn) % 64))
#define CLR(a, psn) ((a)[SLOT(psn) / 64] &= ~(1ull << (SLOT(psn) % 64)))

/* Go-back-N (a timer, a plain NAK, RNR): everything is sent again, what
 * was known of the responder's held packets no longer counts. */
void rc_sr_forget(struct ursa_rc *u)
{
	memset(u->sr.sacked, 0, sizeof(u->sr.sacked));
	memset(u->sr.want, 0, sizeof(u->sr.want));
	memset(u->sr.resent, 0, sizeof(u->sr.resent));
	memset(u->sr.resent_old, 0, sizeof(u->sr.resent_old));
	u->sr.nsacked = u->sr.nwant = 0;
}

/* The responder has every PSN before psn (a cumulative ACK). */
void rc_sr_advance(struct ursa_rc *u, uint32_t psn)
{
	uint32_t d = (psn - u->sr.una) & 0xffffff;

	if (!u->sr.on || d >= 0x800000)
		return;
	if (d >= URSA_SR_SLOTS) {
		rc_sr_forget(u);
	} else {
		for (uint32_t q = u->sr.una; q != psn; q = psn_add(q, 1)) {
			if (BIT(u->sr.sacked, q))
				u->sr.nsacked--;
			if (BIT(u->sr.want, q))
				u->sr.nwant--;
			CLR(u->sr.sacked, q);
			CLR(u->sr.want, q);
			CLR(u->sr.resent, q);
			CLR(u->sr.resent_old, q);
		}
	}
	u->sr.una = psn;
}

/*
 * New losses, once a round trip: congestion if the round trip shows a
 * queue (rc_queued), and the window halves with the threshold there, as
 * TCP's does. Without a queue the loss is taken as the path's own (a
 * lossy link, a bit error) and the window is kept: halving it once a
 * round trip with a loss holds it near 1.2 / sqrt(loss rate) packets
 * (Mathis et al. 1997), 12 at 1%, whatever the path could carry, and
 * selective repeat resends only what was lost, so a full window costs
 * no more resends than a small one. A flow that fills a queue still
 * backs off, since then the round trip shows it; ECN marks (CNPs) cut
 * the window whatever the round trip (rc_comp_cnp). TCP Veno (Fu and
 * Liew 2003) tells the two kinds of loss apart the same way.
 */
static void loss_response(struct ursa_rc *u, uint64_t now)
{
	u->sr.cut_at = now;
	if (!rc_queued(u, u->srtt)) {
		atomic_fetch_add(&ursa_udp_cnt.loss_kept, 1);
		return;
	}
	atomic_fetch_add(&ursa_udp_cnt.loss_cuts, 1);
	rc_window_cut(u);
}

/*
 * A SACK for the NAK at psn (the completer took it as the cumulative ACK
 * of the PSNs before it): mark what the responder holds, and want again
 * what it lacks below the highest PSN it holds, unless resent less than
 * two round trips ago (its copy may still be on the way); new losses
 * answered (loss_response). hi: past the highest PSN sent.
 */
void rc_sr_sack(struct ursa_rc *u, uint32_t psn, const uint8_t *bits,
		unsigned nbits, uint32_t hi, uint64_t now)
{
	uint64_t rtt = u->srtt ? u->srtt : (uint64_t)ursa_cfg()->rto_us * 1000;
	uint32_t top = 0, room = (hi - psn) & 0xffffff;
	bool lost = false;

	atomic_fetch_add(&ursa_udp_cnt.sacks_rcvd, 1);
	rc_sr_start(u, psn);
	rc_sr_advance(u, psn);
	if (u->sr.una != psn)
		return;		/* (an old SACK) */
	rc_sr_epoch(u, now);
	/* bits only for PSNs sent, inside the slots */
	nbits = MIN(nbits, MIN(room ? room - 1 : 0, URSA_SR_SLOTS - 1u));
	for (uint32_t i = 0; i < nbits; i++) {
		uint32_t q = psn_add(psn, 1 + i);

		if (!(bits[i / 8] >> (i % 8) & 1))
			continue;
		top = i + 1;
		if (!BIT(u->sr.sacked, q)) {
			SET(u->sr.sacked, q);
			u->sr.nsacked++;
		}
	}
	for (uint32_t i = 0; i < top; i++) {	/* psn itself, and holes */
		uint32_t q = psn_add(psn, i);

		if (BIT(u->sr.sacked, q) || BIT(u->sr.want, q) ||
		    rc_sr_asked(u, q))
			continue;
		SET(u->sr.want, q);
		u->sr.nwant++;
		lost = true;
	}
	/* No round-trip sample across a loss: the cumulative ACK of the
	 * timed packet waits for the hole's repair, and such samples,
	 * taken under 5% loss, stretched the round trip and with it the
	 * wait before a lost resend goes again. */
	if (lost)
		u->timing = false;
	if (lost && (!u->sr.cut_at || now - u->sr.cut_at > rtt))
		loss_response(u, now);
}

/* The peer repeats selectively (a SACK, or READ responses marked so):
 * the bits start at una, the oldest PSN not answered. */
void rc_sr_start(struct ursa_rc *u, uint32_t una)
{
	if (u->sr.on)
		return;
	rc_sr_forget(u);
	u->sr.on = true;
	u->sr.una = una;
	u->tlp_at = UINT64_MAX;	/* (armed by the next answer) */
}

static bool in_bits(const struct ursa_rc *u, uint32_t psn)
{
	return u->sr.on && ((psn - u->sr.una) & 0xffffff) < URSA_SR_SLOTS;
}

/* Does the responder hold psn (a READ response: is it in place)? */
bool rc_sr_has(const struct ursa_rc *u, uint32_t psn)
{
	return in_bits(u, psn) && BIT(u->sr.sacked, psn);
}

void rc_sr_mark(struct ursa_rc *u, uint32_t psn)
{
	if (in_bits(u, psn) && !BIT(u->sr.sacked, psn)) {
		SET(u->sr.sacked, psn);
		u->sr.nsacked++;
	}
}

/* Was psn resent (asked for again) lately? */
bool rc_sr_asked(const struct ursa_rc *u, uint32_t psn)
{
	return in_bits(u, psn) &&
	       (BIT(u->sr.resent, psn) || BIT(u->sr.resent_old, psn));
}

void rc_sr_mark_asked(struct ursa_rc *u, uint32_t psn)
{
	if (!in_bits(u, psn))
		return;
	SET(u->sr.resent, psn);
}

/*
 * What was resent two round trips ago or more and is still missing was
 * lost again: it may go once more. Two generations of bits, each two round
 * trips long: a packet resent just before a period ends stays "resent"
 * through the next one (one set of bits cleared all at once let such
 * packets go again at once, and a responder already behind answered
 * them twice).
 */
void rc_sr_epoch(struct ursa_rc *u, uint64_t now)
{
	uint64_t rtt = u->srtt ? u->srtt : (uint64_t)ursa_cfg()->rto_us * 1000;

	if (now - u->sr.tick_at > 2 * rtt) {
		memcpy(u->sr.resent_old, u->sr.resent, sizeof(u->sr.resent));
		memset(u->sr.resent, 0, sizeof(u->sr.resent));
		u->sr.tick_at = now;
	}
}

/* psn may be asked for again at once (the tail loss probe) */
void rc_sr_unask(struct ursa_rc *u, uint32_t psn)
{
	if (in_bits(u, psn)) {
		CLR(u->sr.resent, psn);
		CLR(u->sr.resent_old, psn);
	}
}

/* Want psn again, resent lately or not (the tail loss probe) */
void rc_sr_want(struct ursa_rc *u, uint32_t psn)
{
	if (in_bits(u, psn) && !BIT(u->sr.sacked, psn) &&
	    !BIT(u->sr.want, psn)) {
		SET(u->sr.want, psn);
		u->sr.nwant++;
	}
}

/* Is a packet of PSNs first .. first + n wanted again? */
bool rc_sr_wants(const struct ursa_rc *u, uint32_t first, uint32_t n)
{
	if (!u->sr.nwant)
		return false;
	for (uint32_t i = 0; i < n && i < URSA_SR_SLOTS; i++)
		if (BIT(u->sr.want, psn_add(first, i)))
			return true;
	return false;
}

/* Take the next wanted PSN of first .. first + n (it counts as resent
 * now): its index, or -1. */
int rc_sr_take(struct ursa_rc *u, uint32_t first, uint32_t n)
{
	for (uint32_t i = 0; i < n && i < URSA_SR_SLOTS; i++) {
		uint32_t q = psn_add(first, i);

		if (!BIT(u->sr.want, q))
			continue;
		CLR(u->sr.want, q);
		u->sr.nwant--;
		SET(u->sr.resent, q);
		atomic_fetch_add(&ursa_udp_cnt.sr_resent, 1);
		return (int)i;
	}
	return -1;
}
