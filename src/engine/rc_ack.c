// SPDX-License-Identifier: MIT
/*
 * rc_ack.c - ACK scheduling and the packet send of the RoCEv2 engine (rc.h):
 * control packets (ACK, NAK, atomic ACK, CNP), ACKs held back to leave
 * with the QP's next packet, and rc_tx, through which every packet of the
 * engine reaches the transport's send batch.
 */
#include "rc.h"

#include <stdlib.h>

/* A held ACK leaves now: the QP is going away or changing state, and the
 * peer, whose request a real NIC would have acknowledged long ago, must
 * not wait for it (ibv_rc_pingpong's client destroys its QP as soon as it
 * has the last answer; the server's last SEND would end in retries).
 * !wait: only if the QP's lock is free (at exit). */
void rc_ack_flush(struct ursa_rc *u, bool wait)
{
	if (!wait && (!__atomic_load_n(&u->ack_owed, __ATOMIC_RELAXED) ||
		      pthread_mutex_trylock(&u->lock)))
		return;
	if (wait)
		pthread_mutex_lock(&u->lock);
	if (u->ack_owed)
		rc_ack_emit(u, true);
	pthread_mutex_unlock(&u->lock);
	ursa_udp_flush();
}

void ursa_rc_ack_exit(struct ursa_qp *qp)
{
	/* (at exit: never wait for a lock another thread may keep) */
	if (qp->rc)
		rc_ack_flush(qp->rc, false);
}

/*
 * Every packet of the engine leaves here: ursa_udp_send (counted in the
 * QP's pkts_tx when taken), with the QP's held-back ACK (rc_ack_later)
 * in the same batch. After the requests a step sends (ursa_rc_step emits it at its end): the peer,
 * polling for that ACK, then finds our whole request already there when
 * the ACK lets its poll return (perftest's WRITE latency test, which then
 * spins on memory, otherwise leaves the request to its engine, which on a
 * host whose cores spin may not run for milliseconds), and the request is
 * not delayed by the ACK's trip. The peer holds a request that would
 * complete a receive until the ACK is in (rc_hold_request), so its send
 * completion still comes first. Before a response (NAK, READ response,
 * atomic ACK): PSN order. Called with u->lock held.
 */
void rc_tx(struct ursa_rc *u, const addr_t *src, const addr_t *dst,
	   uint8_t *ib, size_t len, uint8_t ttl, bool have_icrc)
{
	uint8_t moved[URSA_UDP_MAX_PKT];

	if (u->ack_owed && (roce_opcode_flags(ib[0]) & P_RESP)) {
		/* (the ACK takes the slot a packet was built in) */
		if (ursa_udp_in_slot(ib) && len <= sizeof(moved)) {
			memcpy(moved, ib, len);
			ib = moved;
		}
		rc_ack_emit(u, true);
	}
	if (ursa_udp_send(&u->ep, src, dst, ib, len, ttl, have_icrc))
		ursa_cnt_add(&u->qp->cnt.pkts_tx, 1);	/* (under u->lock) */
}

/* Control packet (ACK, NAK, ATOMIC ACK) from a responder QP. */
void rc_send_ack(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *to,
		 const addr_t *from, uint8_t opcode, uint8_t syn, uint32_t psn,
		 uint64_t orig)
{
	uint8_t buf[64];
	struct roce_pkt p = { 0 };
	int n;

	p.opcode = (uint8_t)(ROCE_RC | opcode);
	p.pkey = ROCE_DEFAULT_PKEY;
	p.dqpn = qp->attr.dest_qp_num;
	p.psn = psn & 0xffffff;
	p.syndrome = syn;
	p.msn = u->msn & 0xffffff;
	p.orig = orig;
	/* (to an ursa requester: what we take, proto/roce.h) */
	p.wide = rc_wide_code(u);
	p.sr = p.wide;
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0)
		rc_tx(u, from, to, buf, (size_t)n, qp->attr.ah_attr.grh.hop_limit,
		      false);
	if ((syn & AETH_TYPE_MASK) == AETH_NAK)
		atomic_fetch_add(&ursa_udp_cnt.naks_sent, 1);
}

/*
 * A CNP (annex A17) to the requester of a request that arrived marked
 * Congestion Experienced, as a RoCE NIC's notification point sends one
 * (DCQCN): BECN set, DestQP the requester's QP, at most one per
 * URSA_CNP_GAP_NS for a QP. rxe drops CNPs; ursa and NICs slow down.
 */
void rc_send_cnp(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *to,
		 const addr_t *from)
{
	uint8_t buf[64];
	struct roce_pkt p = { .opcode = ROCE_CNP | OP_CNP,
			      .pkey = ROCE_DEFAULT_PKEY, .becn = true };
	uint64_t now = ursa_now_ns();
	int n;

	atomic_fetch_add(&ursa_udp_cnt.rx_ce, 1);
	if (u->cnp_at && now - u->cnp_at < URSA_CNP_GAP_NS)
		return;
	u->cnp_at = now;
	p.dqpn = qp->attr.dest_qp_num;
	n = roce_build(buf, sizeof(buf), &p, NULL, 0);
	if (n > 0) {
		rc_tx(u, from, to, buf, (size_t)n,
		      qp->attr.ah_attr.grh.hop_limit, false);
		atomic_fetch_add(&ursa_udp_cnt.cnp_sent, 1);
	}
}

/*
 * Delayed ACK. A responder that acknowledges at once pays a system call
 * per message on its critical path, and the requester, woken by the lone
 * ACK, returns to spinning on its memory (perftest's latency tests) so
 * that the answer it then gets must wake its engine thread. Held back, the
 * ACK leaves in the same sendmmsg as the QP's next packets to the peer
 * (after the requests of a step, see rc_tx), usually the application's
 * answer, which the peer, still polling for the ACK, then takes in the
 * same pass: in a ping-pong neither side's engine is needed. IBTA
 * 9.7.5.1.1 allows coalescing: an ACK covers every PSN up to its own.
 * Only the ACK of a message's last packet is held (rc_on_request).
 *
 * An ACK waits at most URSA_ACK_DELAY_US (default 50 us, 0: never; far
 * below the 1 ms floor of the peer's RTO). When one had to go alone, the
 * next ones go at once (at the pass's end), 1, 3, 7 ... 1023 of them: a
 * peer that only sends (a bandwidth test) is not slowed. NAKs, READ
 * responses and atomic ACKs are never held (they go after the held ACK,
 * in PSN order).
 */

static uint64_t ack_delay_ns(void)
{
	return (uint64_t)ursa_cfg()->ack_delay_us * 1000;
}

void rc_ack_later(struct ursa_qp *qp, struct ursa_rc *u,
		  const addr_t *peer, const addr_t *me, uint32_t psn)
{
	if (!ack_delay_ns() || u->ack_skip) {
		if (u->ack_skip)
			u->ack_skip--;
		if (qp->ctx != ursa_pass_ctx) {
			rc_send_ack(qp, u, peer, me, OP_ACK,
				    AETH_ACK | AETH_CREDIT_INVALID, psn, 0);
			return;
		}
		/* At once, but after the rest of what this pass receives
		 * (its ursa_rc_acks): one ACK then covers every message of
		 * a stream that came in together, where each had its own
		 * system call, which on a veth path carries it all the way
		 * to the peer's socket (a pipelined 64-byte WRITE stream was
		 * bound by that). */
		u->ack_now = true;
		u->ack_due = 0;
	} else if (!u->ack_owed) {
		u->ack_due = ursa_now_ns() + ack_delay_ns();
	}
	u->ack_psn = psn;
	u->ack_peer = *peer;
	u->ack_me = *me;
	__atomic_store_n(&u->ack_owed, true, __ATOMIC_RELAXED);
	atomic_store_explicit(&qp->rc_held, true, memory_order_relaxed);
	if (!u->ack_now)
		atomic_fetch_add(&ursa_udp_cnt.acks_held, 1);
}

/* Send the held ACK (u->lock held); along: with another packet. */
void rc_ack_emit(struct ursa_rc *u, bool along)
{
	__atomic_store_n(&u->ack_owed, false, __ATOMIC_RELAXED);
	if (u->ack_now) {
		u->ack_now = false;	/* (not held: the backoff stays) */
	} else if (along) {
		u->ack_backoff = 0;
	} else {
		if (u->ack_backoff < 10)
			u->ack_backoff++;
		u->ack_skip = (1u << u->ack_backoff) - 1;
		atomic_fetch_add(&ursa_udp_cnt.acks_alone, 1);
	}
	rc_send_ack(u->qp, u, &u->ack_peer, &u->ack_me, OP_ACK,
		    AETH_ACK | AETH_CREDIT_INVALID, u->ack_psn, 0);
}


/* Is what waits until due due now? If not, *deadline comes down to it. An
 * application's pass rings the sleeping engine only if it would sleep
 * well past the due time: an engine that naps while the application polls
 * wakes soon anyway. */
static bool held_due(uint64_t due, uint64_t now, uint64_t *deadline,
		     bool engine)
{
	uint64_t d = engine ? due : due + URSA_UDP_ACK_WAKE_SLACK_NS;

	if (now >= due)
		return true;
	if (d < *deadline)
		*deadline = d;
	return false;
}

int ursa_rc_acks(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline,
		 bool engine)
{
	struct ursa_rc *u = qp->rc;
	int sent = 0;

	if (!u || (!__atomic_load_n(&u->ack_owed, __ATOMIC_RELAXED) &&
		   !__atomic_load_n(&u->stash_len, __ATOMIC_RELAXED)))
		return 0;
	pthread_mutex_lock(&u->lock);
	if (u->stash_len &&
	    held_due(u->stash_due, ursa_need_now(now), deadline, engine)) {
		rc_run_held(qp, u);
		sent++;
	}
	if (u->ack_owed &&
	    held_due(u->ack_due, ursa_need_now(now), deadline, engine)) {
		rc_ack_emit(u, false);
		sent++;
	}
	pthread_mutex_unlock(&u->lock);
	ursa_udp_flush();
	return sent;
}
