/* SPDX-License-Identifier: MIT */
/*
 * udp.h - RoCEv2 between hosts: InfiniBand transport packets in UDP
 * datagrams to port 4791, with a correct ICRC.
 *
 * One UDP socket per process receives on the RoCEv2 port (URSA_UDP_PORT,
 * default 4791) of its network namespace; every QP sends from a socket of
 * its own, bound to a per-QP source port in 0xC000-0xFFFF (flow entropy, as
 * rxe). Datagrams are sent from an unconnected socket with DF set, so Linux
 * gives them IP ID 0: the ICRC, which covers the IPv4 ID, is computed over
 * the exact IP and UDP headers the kernel will send, without raw sockets.
 * Received packets have their ICRC checked the same way.
 *
 * Reliability (RC, IBTA 9.7): PSNs per packet, AckReq on the last packet of
 * a message and every 16 packets, cumulative ACKs, one PSN-sequence NAK per
 * gap and go-back-N from the NAKed PSN, duplicate handling (SEND/WRITE
 * acknowledged not applied, READ re-executed, atomic answered from the saved
 * value), local ACK timeout with retry_cnt, RNR NAK with rnr_retry.
 */
#ifndef URSA_UDP_H
#define URSA_UDP_H

#include "../engine/engine.h"

struct ursa_uqp;

/* Device-wide: open the RoCEv2 socket (first context). 0 or -errno. */
int ursa_udp_start(struct ursa_ctx *ctx);
void ursa_udp_ctx_gone(struct ursa_ctx *ctx);
/* Receive and process what is waiting; returns packets handled. */
int ursa_udp_poll(void);
/* Whether application passes read the RoCEv2 sockets (there was traffic). */
bool ursa_udp_live(void);
/* The engine saw a RoCEv2 socket readable: passes read the sockets from
 * now on (until then they skip them). */
void ursa_udp_wake(void);
/* Add (on) or remove the RoCEv2 sockets in an engine's epoll set. */
void ursa_udp_engine_watch(struct ursa_engine *e, bool on);
int ursa_udp_fd(void);
/* Fault injection on transmit: "loss=P,dup=P,reorder=P,corrupt=P,delay=P,
 * delay_us=N,seed=S" (P in percent); NULL turns it off. */
int ursa_udp_fault(const char *spec);

/* fork(): the child's own sockets (opened with its first context), and
 * the inherited QPs' sockets closed. */
void ursa_udp_atfork_child(void);
void ursa_udp_qp_forget(struct ursa_qp *qp);

int ursa_uqp_init(struct ursa_qp *qp);
void ursa_uqp_fini(struct ursa_qp *qp);
/* modify_qp hooks: new sq_psn / rq_psn / path. */
void ursa_uqp_modified(struct ursa_qp *qp, int mask);

/* Requester step for a WQE whose target is another host (same contract as
 * ursa_shm_step). */
int ursa_udp_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		  const struct ursa_req *r, uint64_t now,
		  struct ursa_resp *resp, uint64_t *until);
bool ursa_udp_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now);
/* The QP's held-back ACK and held request (udp.c "Delayed ACK"): sent or
 * executed if due, else *deadline lowered to when they are (engine: the
 * engine's own pass). *now: the clock, 0 until read (ursa_need_now).
 * Returns how many were due. */
int ursa_udp_acks(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline,
		  bool engine);
/* At process exit: send the QP's held-back ACK. */
void ursa_udp_ack_exit(struct ursa_qp *qp);
/* WQE w completes: release what its message holds (done, flushed). */
void ursa_udp_abort(struct ursa_qp *qp, const struct ursa_send_wqe *w);
/* May WQE w go out now, while the messages before it wait for their ACK
 * (pipelining: RC WRITEs and SENDs, or READs and atomics)? */
bool ursa_udp_can_start(struct ursa_qp *qp, const struct ursa_send_wqe *w);
/* Steps between on and off leave their packets for one flush at off (one
 * sendmmsg for the messages a pipelined send queue starts at once). */
void ursa_udp_tx_hold(bool on);
/* How many WQEs, from the head, wait sent whole (the one being sent, if
 * any, comes next in the queue). */
uint32_t ursa_udp_piped(struct ursa_qp *qp);
/* Is w in flight: 1 sent whole, waiting for its ACK; 2 being sent; 0 no. */
int ursa_udp_inflight(struct ursa_qp *qp, const struct ursa_send_wqe *w);

/* Test hooks (fuzz target). */
void ursa_udp_inject(uint8_t *buf, size_t len, const union ibv_gid *src,
		     uint16_t sport, const union ibv_gid *dst);
uint32_t ursa_udp_epsn(struct ursa_qp *qp);
/* For the responder fuzz target: the PSN of the requester's oldest packet
 * not yet answered (what a response the fuzzer aims at it should carry). */
uint32_t ursa_udp_unanswered_psn(struct ursa_qp *qp);
uint16_t ursa_udp_port(void);
/* For gsi.c: write the ICRC of a packet sent from sport to dst's RoCEv2
 * port, and capture it. */
void ursa_udp_seal(uint8_t *ib, size_t len, const union ibv_gid *src,
		   const union ibv_gid *dst, uint16_t sport);

/* QP1 (transport/gsi.c): a received packet for QP 1 */
struct roce_pkt;
void ursa_gsi_atfork_child(void);
void ursa_gsi_rx(const struct roce_pkt *p, const union ibv_gid *src,
		 uint16_t sport, const union ibv_gid *dst);

struct ursa_udp_counters {
	atomic_uint_fast64_t tx_pkts, rx_pkts, tx_bytes, rx_bytes;
	atomic_uint_fast64_t retransmits, naks_sent, naks_rcvd, rnr_naks;
	atomic_uint_fast64_t drop_short, drop_opcode, drop_icrc, drop_qpn,
		drop_src, drop_psn, drop_state, dup;
	atomic_uint_fast64_t fault_lost, fault_dup, fault_corrupt,
		fault_reorder;
	atomic_uint_fast64_t forwarded;	/* to another process of the host */
	atomic_uint_fast64_t drop_fwd;	/* for another process, which was behind */
	/* names of forwarding sockets held by a process that is not the
	 * owner they name (a squatter), and packets for unknown QPNs not
	 * looked up (over the lookup budget) */
	atomic_uint_fast64_t drop_fwd_name, drop_unknown;
	/* answers whose PSN is not in flight, duplicate READs that match no
	 * READ executed lately: stale, or forged */
	atomic_uint_fast64_t drop_stale;
	atomic_uint_fast64_t fault_delay;
	atomic_uint_fast64_t tx_gso, rx_gro, rx_ipid;
	atomic_uint_fast64_t acks_held, acks_alone, reqs_held;
	atomic_uint_fast64_t tx_nomem;	/* packets not sent: no send batch */
	/* CM MADs (QP1, transport/gsi.c): received and handed to their
	 * owner, sent, answered because nobody owns their destination,
	 * dropped (malformed, or the owner's socket was full) */
	atomic_uint_fast64_t cm_rx, cm_tx, cm_orphan, cm_drop;
};
extern struct ursa_udp_counters ursa_udp_cnt;

#endif
