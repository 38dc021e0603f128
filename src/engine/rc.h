/* SPDX-License-Identifier: MIT */
/*
 * rc.h - the RoCEv2 packet engine: RC, UC and UD as IBTA chapter 9 defines
 * them, in role files as Linux rxe splits its engine:
 *
 *   rc_qp.c    per-QP protocol state: PSNs, the pipe of messages sent and
 *              waiting for their answer, the window (modify_qp, abort)
 *   rc_req.c   requester: a WQE cut into packets, PSNs, pipelining, the
 *              window, timers checked before each step
 *   rc_comp.c  completer: ACKs, NAKs, READ responses and atomic answers
 *              move the message on; go-back-N; RTT and RTO; the window's
 *              cuts on CNPs
 *   rc_resp.c  responder: PSN checks, duplicates, atomic replay, READ
 *              responses; executes through the shared responder (resp.c)
 *   rc_ack.c   ACK scheduling: held-back ACKs, NAKs, CNPs, the QP's
 *              packet send
 *   rc_recv.c  receive dispatch: parse, QPN lookup, state and source
 *              checks, then the completer or the responder; a CE mark
 *              answered with a CNP
 *   rc_sr.c    selective repeat between ursa peers: the responder holds
 *              packets after a gap and answers with SACKs, the requester
 *              resends only what they show missing
 *
 * retry_cnt and rnr_retry are taken only through ursa_retry_take and
 * ursa_rnr_retry_take (core/request.h). Packets leave and arrive through the UDP
 * transport's wire interface (transport/udp.h): the engine builds each
 * packet in the transport's send slot and hands it over; the transport
 * checks the ICRC of what it receives (which covers the IP and UDP
 * headers only the transport knows) and hands it up through ursa_udp_up.
 * All state of a QP's struct ursa_rc is under its lock.
 */
#ifndef URSA_RC_H
#define URSA_RC_H

#include <string.h>

#include "engine.h"
#include "../proto/roce.h"
#include "../transport/udp.h"

/* Addresses are GIDs: IPv4 as ::ffff:a.b.c.d, IPv6 as is. */
typedef union ibv_gid addr_t;

/* The i-th oldest message of the pipe (rc_qp.c) */
#define PIPE(u, i) (&(u)->pipe_ring[((u)->pipe_head + (i)) % URSA_UDP_PIPE])

struct ursa_rc {
	pthread_mutex_t lock;
	struct ursa_qp *qp;
	struct ursa_udp_ep ep;	/* the QP's sockets (transport/udp.c) */
	uint32_t next_psn;	/* requester: PSN of the next new message */
	addr_t src, dst;	/* requester: the path of its messages (RC) */
	uint8_t hop;
	uint32_t psn_hi;	/* requester: past the highest PSN sent so far
				 * (psn_sent; next_psn goes back at
				 * pipe_collapse, this does not) */
	uint64_t srtt, rttvar;	/* round-trip estimate, ns (0: none yet) */
	uint64_t rtt_min;	/* the least round trip seen */
	unsigned backoff;	/* early retransmissions with no progress */
	struct ursa_udp_pfx pfx;	/* of our data packets (send_data_pkt) */
	struct ursa_udp_pfx rpfx;	/* of our READ responses (on_read_req) */
	/* Window in packets: halved by every go-back, grown as acknowledged
	 * (rc_window_grow). Go-back-N resends everything in flight, so a
	 * full window under loss resends many packets per packet delivered
	 * (docs/design.md "Reliability"); a window that shrinks with loss
	 * keeps that down while a clean path runs at the full window. */
	uint32_t cwnd, ssthresh, cwnd_acc; /* (window_grow) */
	uint32_t peer_wide;	/* requester: the payload the responder takes
				 * (ROCE_BTH4_WIDE_SHIFT; 0: its path MTU) */
	uint32_t wide_psn;	/* requester: messages from this PSN on are
				 * wide (rc_msg_mtu) */
	bool wide_all;		/* requester: every message from now on */
	/* requester: the path found narrower than the wide packets (once a
	 * connection): messages from path_psn on (path_all: every one) are
	 * cut at path_wide, or the path MTU (rc_msg_mtu) */
	uint32_t path_wide, path_psn;
	bool path_all;
	unsigned pmtu_gen;	/* ursa_udp_pmtu_gen when last looked */
	bool req_sr;		/* responder: the requester set ROCE_BTH4_SR */
	uint64_t cnp_at;	/* responder: when it last sent a CNP */
	uint64_t cut_at;	/* requester: when a CNP last cut the window */
	/* requester: the message in flight (the head WQE) */
	struct {
		bool active, done, is_read;
		struct ursa_send_wqe *wqe;
		uint32_t op;	/* ibv_wr_opcode */
		uint32_t first, npkts, mtu;
		uint32_t sent, acked;	/* packets */
		uint8_t nak;	/* AETH syndrome of a NAK/RNR, 0 = none */
		uint32_t nak_psn;
		uint64_t orig, len;
		uint64_t deadline;	/* ACK timeout: counts against retry_cnt */
		uint64_t rto;		/* early go-back-N, free of charge */
		bool resend_read;
		bool progress;	/* acknowledged something since last look */
		uint32_t rerequested;	/* READ: re-asked from this packet */
		/* READ: where the pieces asked ahead of acked end
		 * (rc_req.c read_piece), oldest first */
		uint32_t ahead[URSA_READ_AHEAD], nahead;
		uint32_t hiwat;	/* packets ever sent (beyond: first sends) */
		struct ursa_sg dst[URSA_MAX_SGE];
		uint32_t ndst;
		uint64_t va;	/* READ: the remote buffer (rc_read_again) */
		uint32_t rkey;
		/* What the message's MIDDLE packets share (send_mid) */
		bool mid_ok;
		uint8_t mid_op;
		uint32_t mid_reg;	/* ICRC register after the BTH's 8th byte */
		struct ursa_udp_dest mid_to;
	} m;
	/* requester: messages sent whole before m and waiting for their ACK,
	 * oldest first (pipelining: ursa_udp_can_start) */
	struct upipe {
		struct ursa_send_wqe *wqe;
		uint32_t op, first, npkts, mtu, acked;
		uint64_t len;
		bool done, is_read, is_atomic;
		uint64_t orig;		/* an atomic's answer */
		uint32_t ndst;		/* READ: where the responses go */
		struct ursa_sg dst[URSA_MAX_SGE];
		uint64_t va;		/* READ: from where (rc_read_again) */
		uint32_t rkey;
	} pipe_ring[URSA_UDP_PIPE];	/* PIPE(u, i): the i-th oldest */
	uint32_t pipe_head, pipe_n;
	uint32_t pipe_out;	/* their packets not yet acknowledged */
	uint8_t pipe_nak;	/* a NAK's syndrome for the oldest one ... */
	uint32_t pipe_nak_psn;	/* ... and its PSN */
	bool pipe_gap;		/* responses missing before others */
	/* A READ taken back (pipe_collapse): no READ joins the pipe until it
	 * is complete. Each READ asked for again is answered whole again, so
	 * restarting the ones behind it at every loss multiplied the
	 * responses until the useful ones drowned (RETRY_EXC_ERR under 5 %
	 * loss). */
	const struct ursa_send_wqe *pipe_cool;
	/* requester: selective repeat (rc_sr.c), one bit per PSN from una
	 * (bit psn % URSA_SR_SLOTS): held by the responder (a READ's
	 * response: placed out of order), to resend, resent (asked for
	 * again) in this period of two round trips (from tick_at) and in
	 * the one before (resent_old) */
	struct {
		bool on;	/* the peer has sent a SACK or READ responses
				 * marked ROCE_BTH4_SR */
		uint32_t una;	/* the PSN the responder expects */
		uint32_t nsacked, nwant;
		uint64_t tick_at, cut_at;
		uint64_t sacked[URSA_SR_SLOTS / 64], want[URSA_SR_SLOTS / 64],
			 resent[URSA_SR_SLOTS / 64],
			 resent_old[URSA_SR_SLOTS / 64];
	} sr;
	uint64_t tlp_at;	/* the tail loss probe is due (rc_tlp) */
	bool timing;		/* one packet's round trip being timed */
	uint32_t t_psn;
	uint64_t t_sent;
	/* responder */
	uint32_t epsn, msn;
	bool nak_sent, uc_broken;
	/* packets held out of order (rc_sr.c), at psn % URSA_SR_SLOTS;
	 * held_hi the highest */
	struct rc_held **held;
	uint32_t nheld, held_hi;
	unsigned held_since_sack;
	struct ursa_rstate rs;
	uint64_t soff;		/* SEND in progress: bytes so far */
	uint64_t wva, wlen, woff;	/* WRITE in progress */
	uint32_t wrkey;
	struct { uint32_t psn; uint64_t orig; bool valid; } ares[URSA_UDP_ARES];
	unsigned ares_next;
	/* READ requests executed lately: a duplicate READ is executed again
	 * only if it starts inside one of them, at the same rkey and the
	 * matching address (IBTA 9.7.5.1.3; rxe keeps such resources too),
	 * never on the word of a packet behind the expected PSN alone */
	struct { uint32_t psn, npkts, rkey, mtu; uint64_t va; bool valid; }
		rres[URSA_UDP_RRES];
	unsigned rres_next;
	/* Delayed ACK (ack_later): a positive ACK held back to leave with
	 * this QP's next packets to the peer, or at ack_due. */
	bool ack_owed;		/* written under lock; read as a hint */
	uint32_t ack_psn;
	uint64_t ack_due;
	addr_t ack_me, ack_peer;
	unsigned ack_skip;	/* ACKs to send at once before holding again */
	unsigned ack_backoff;	/* held ACKs in a row that went alone */
	bool ack_now;		/* owed, but not held: due at this pass's end */
	/* A request that would complete a receive while our own signaled
	 * message waits for its ACK, held until that ACK (hold_request) */
	uint8_t *stash;		/* URSA_UDP_MAX_PKT bytes, once used */
	size_t stash_len;	/* 0: none */
	uint64_t stash_due;
	addr_t stash_me, stash_peer;
};

/* rc_qp.c */
uint32_t rc_mtu_of(struct ursa_qp *qp);
uint32_t rc_msg_mtu(struct ursa_qp *qp, const struct ursa_rc *u, uint32_t op,
		    uint32_t psn);
void rc_wide_learn(struct ursa_rc *u, uint8_t code);
void rc_path_learn(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *dst);
uint8_t rc_wide_code(const struct ursa_rc *u);
uint8_t rc_read_code(struct ursa_qp *qp, uint32_t mtu);
uint32_t rc_read_mtu(struct ursa_qp *qp, const struct roce_pkt *p);
uint8_t rc_transport_bits(struct ursa_qp *qp);
bool rc_can_receive(int st);
bool rc_is_atomic_op(uint32_t op);
int rc_pipe_class(uint32_t op);
int rc_pipe_holds(const struct ursa_rc *u, uint32_t psn);
void rc_pipe_drop(struct ursa_rc *u);
void rc_pipe_pop(struct ursa_rc *u);
void rc_window_grow(struct ursa_qp *qp, struct ursa_rc *u, uint32_t n);
void rc_window_cut(struct ursa_rc *u);
bool rc_queued(const struct ursa_rc *u, uint64_t r);

/* rc_req.c */
void rc_read_again(struct ursa_qp *qp, struct ursa_rc *u, uint32_t psn,
		   uint32_t mtu,
		   uint64_t va, uint32_t rkey, uint32_t len);

/* rc_comp.c: the ACK timeout (IBTA 9.7.6.1.3), now + d (UINT64_MAX: never),
 * the RTO */
uint64_t rc_timeout_ns(struct ursa_qp *qp);
uint64_t rc_after(uint64_t now, uint64_t d);
uint64_t rc_rto_ns(struct ursa_qp *qp);
void rc_rtt_start(struct ursa_rc *u, uint32_t idx, uint64_t now);
void rc_go_back(struct ursa_qp *qp, struct ursa_rc *u, bool atomic,
		uint64_t now);
void rc_pipe_collapse(struct ursa_rc *u);
void rc_comp_cnp(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now);
void rc_tlp(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now);
uint64_t rc_wait_until(const struct ursa_rc *u);
int rc_comp_pipe_head(struct ursa_qp *qp, struct ursa_rc *u, uint64_t now,
		      struct ursa_resp *resp, uint64_t *until);
int rc_comp_decide(struct ursa_qp *qp, struct ursa_rc *u,
		   struct ursa_send_wqe *w, uint64_t now,
		   struct ursa_resp *resp);
void rc_on_response(struct ursa_qp *qp, struct ursa_rc *u,
		    const struct roce_pkt *p);

/* rc_resp.c */
void rc_run_held(struct ursa_qp *qp, struct ursa_rc *u);
void rc_on_request(struct ursa_qp *qp, struct ursa_rc *u,
		   const struct roce_pkt *p, const addr_t *me,
		   const addr_t *peer);
bool rc_hold_request(struct ursa_qp *qp, struct ursa_rc *u,
		     const struct roce_pkt *p, uint32_t f,
		     const uint8_t *buf, size_t len, const addr_t *me,
		     const addr_t *peer);

/* rc_sr.c */
void rc_sr_free_held(struct ursa_rc *u);
bool rc_sr_hold(struct ursa_qp *qp, struct ursa_rc *u, const struct roce_pkt *p,
		uint32_t f, uint32_t d, const addr_t *me, const addr_t *peer);
void rc_sr_taken(struct ursa_rc *u, uint32_t psn);
void rc_sr_drain(struct ursa_qp *qp, struct ursa_rc *u);
void rc_sr_forget(struct ursa_rc *u);
void rc_sr_advance(struct ursa_rc *u, uint32_t psn);
void rc_sr_sack(struct ursa_rc *u, uint32_t psn, const uint8_t *bits,
		unsigned nbits, uint32_t hi, uint64_t now);
bool rc_sr_wants(const struct ursa_rc *u, uint32_t first, uint32_t n);
int rc_sr_take(struct ursa_rc *u, uint32_t first, uint32_t n);
void rc_sr_start(struct ursa_rc *u, uint32_t una);
bool rc_sr_has(const struct ursa_rc *u, uint32_t psn);
void rc_sr_mark(struct ursa_rc *u, uint32_t psn);
bool rc_sr_asked(const struct ursa_rc *u, uint32_t psn);
void rc_sr_mark_asked(struct ursa_rc *u, uint32_t psn);
void rc_sr_epoch(struct ursa_rc *u, uint64_t now);
void rc_sr_want(struct ursa_rc *u, uint32_t psn);
void rc_sr_unask(struct ursa_rc *u, uint32_t psn);

/* rc_ack.c */
void rc_ack_emit(struct ursa_rc *u, bool along);
void rc_ack_flush(struct ursa_rc *u, bool wait);
void rc_tx(struct ursa_rc *u, const addr_t *src, const addr_t *dst,
	   uint8_t *ib, size_t len, uint8_t ttl, bool have_icrc);
void rc_send_ack(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *to,
		 const addr_t *from, uint8_t opcode, uint8_t syn, uint32_t psn,
		 uint64_t orig);
void rc_send_cnp(struct ursa_qp *qp, struct ursa_rc *u, const addr_t *to,
		 const addr_t *from);
void rc_ack_later(struct ursa_qp *qp, struct ursa_rc *u,
		  const addr_t *peer, const addr_t *me, uint32_t psn);

#endif
