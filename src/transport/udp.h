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
 * Received packets have their ICRC checked the same way, accepting any
 * IPv4 ID a sending kernel or NIC chose (docs/design.md "Wire").
 *
 * The protocol on top (RC, UC, UD: PSNs, ACKs, retransmission, the
 * responder's checks) is the engine's, engine/rc.h; this header is what it
 * asks of the transport (the wire interface below) and what the rest of
 * the library starts and stops.
 */
#ifndef URSA_UDP_H
#define URSA_UDP_H

#include <string.h>
#include <sys/socket.h>

#include "../core/core.h"
#include "loop.h"

/* An engine's epoll set as the RoCEv2 side sees it (struct ursa_engine
 * holds one): the receive sockets' events there carry tag. */
struct ursa_udp_watch {
	int epfd;
	void *tag;
	bool watched;	/* the side set is in epfd (under the udp lock) */
	bool gone;	/* the context left RoCEv2 (under the udp lock) */
};

/* Device-wide: open the RoCEv2 socket (first context); w: the context's
 * engine (NULL: none). 0 or -errno. */
int ursa_udp_start(struct ursa_udp_watch *w);
void ursa_udp_ctx_gone(struct ursa_udp_watch *w);
/* Receive and process what is waiting; returns packets handled. */
int ursa_udp_poll(void);
/* Whether application passes read the RoCEv2 sockets (there was traffic). */
bool ursa_udp_live(void);
/* The engine saw a RoCEv2 socket readable: passes read the sockets from
 * now on (until then they skip them). */
void ursa_udp_wake(void);
/* Add (on) or remove the RoCEv2 sockets in an engine's epoll set. */
void ursa_udp_engine_watch(struct ursa_udp_watch *w, bool on);
int ursa_udp_fd(void);
/* Fault injection on transmit: "loss=P,dup=P,reorder=P,corrupt=P,delay=P,
 * delay_us=N,seed=S" (P in percent); NULL turns it off. */
int ursa_udp_fault(const char *spec);

/* fork(): the child's own sockets (opened with its first context). */
void ursa_udp_atfork_child(void);
/* Steps between on and off leave their packets for one flush at off (one
 * sendmmsg for the messages a pipelined send queue starts at once). */
void ursa_udp_tx_hold(bool on);

/* --- the wire interface: what the RoCEv2 engine (engine/rc.h) asks of the
 * transport. The transport moves packets and knows sockets, batches,
 * segmentation offload, forwarding between processes, injected faults and
 * the capture; the engine knows the protocol. --- */

static inline bool ursa_gid_v4(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(g->raw, pfx, 12);
}

/* A QP's sockets: it sends from its own source port (flow entropy, as
 * rxe: 0xC000 + a hash of the QPN) and, once it hears from its peer,
 * receives on a socket connected to the peer's address and port. */
struct ursa_udp_ep {
	int txfd, txfd6;
	uint16_t sport;
	int rxfd;		/* connected to the peer's address and port */
	uint16_t rx_port;	/* the peer's source port it is connected to */
};
/* 0 or -errno (a socket that cannot be opened leaves its fd -1: the QP
 * then sends nothing on that family). */
int ursa_udp_ep_open(struct ursa_udp_ep *ep, uint32_t qpn);
void ursa_udp_ep_close(struct ursa_udp_ep *ep);
/* fork(): the child leaves the inherited sockets to the parent. */
void ursa_udp_ep_forget(struct ursa_udp_ep *ep);
/* Connect the QP's receive socket to the peer (under the receive lock the
 * up-call runs with); on failure packets keep coming through the group. */
void ursa_udp_ep_connect(struct ursa_udp_ep *ep, const union ibv_gid *peer,
			 uint16_t sport);
/* Whether packets from src to dst can leave and answers come back (the
 * receive sockets are open); marks the transport live. */
bool ursa_udp_reachable(const struct ursa_udp_ep *ep, const union ibv_gid *src,
			const union ibv_gid *dst);

/*
 * The ICRC's register after the masked IP and UDP headers (roce_icrc_pfx)
 * for one pair of addresses, ports and length, kept for the next packet:
 * a stream's packets share it, and building the headers and their CRC was
 * a fifth of the work a 1 KiB packet costs on either side, besides the
 * payload's CRC.
 */
struct ursa_udp_pfx {
	union ibv_gid src, dst;
	size_t len;
	uint16_t sport, dport;
	bool ok;
	uint32_t reg;
};
uint32_t ursa_udp_icrc_pfx(struct ursa_udp_pfx *c, const union ibv_gid *src,
			   const union ibv_gid *dst, uint16_t sport,
			   size_t ib_len);

/* Where the next packet of this thread's send batch is built (NULL: no
 * batch, the packet is lost); a packet built there is not copied again.
 * ursa_udp_in_slot: is ib that place? */
uint8_t *ursa_udp_slot(void);
bool ursa_udp_in_slot(const uint8_t *ib);
/* Send one transport packet (ib, len with the ICRC's room) from the QP's
 * socket; computes the ICRC unless the builder did (have_icrc); applies
 * injected faults; writes the capture. Returns whether it was taken (the
 * families match and the QP has a socket for them). */
bool ursa_udp_send(const struct ursa_udp_ep *ep, const union ibv_gid *src,
		   const union ibv_gid *dst, uint8_t *ib, size_t len,
		   uint8_t ttl, bool have_icrc);
/*
 * The short way for a message's packets of one size to one destination
 * (the MIDDLE packets of a stream): ursa_udp_dest_set once per message,
 * then ursa_udp_send_to per packet, whose ICRC the engine computed. Only
 * while ursa_udp_plain() (no faults injected, no capture: ursa_udp_send
 * does those); a destination's tag lets its packets join one GSO run
 * without comparing addresses.
 */
struct ursa_udp_dest {
	int fd;
	uint64_t tag;
	socklen_t tolen;
	struct sockaddr_storage to;
};
bool ursa_udp_plain(void);
/* 0, or -EAFNOSUPPORT when the QP has no socket for dst's family. */
int ursa_udp_dest_set(const struct ursa_udp_ep *ep, const union ibv_gid *src,
		      const union ibv_gid *dst, struct ursa_udp_dest *d);
void ursa_udp_send_to(const struct ursa_udp_dest *d, uint8_t *ib, size_t len);
/* Packets this thread ever put in its batch (did a step send any?) */
unsigned long ursa_udp_added(void);
/* Path MTU (udp.c): a count that moves whenever a path is found narrower
 * than the packets sent on it, and the longest RoCEv2 packet (the UDP
 * payload) the kernel sends to dst unfragmented (0: it cannot tell). */
unsigned ursa_udp_pmtu_gen(void);
size_t ursa_udp_path_seg(const union ibv_gid *dst);
/* Send this thread's batch now; _soon: unless a hold is on (tx_hold). */
void ursa_udp_flush(void);
void ursa_udp_flush_soon(void);
/* What the kernel granted the receive socket (bytes): bounds the window. */
int ursa_udp_rcvbuf(void);

/* Up-calls the engine registers (its constructor): a received packet,
 * ICRC checked, for the engine to dispatch. run_qp: see rc_rx in
 * engine/rc_recv.c. Returns 0, or -ENOENT for a QPN no QP of this process has
 * (*dqpn set: the transport may forward it). */
enum { URSA_UDP_RX_CE = 1 };	/* flags: ECN Congestion Experienced */
struct ursa_udp_up {
	int (*rx)(uint8_t *buf, size_t len, const union ibv_gid *src,
		  uint16_t sport, const union ibv_gid *dst, unsigned flags,
		  struct ursa_qp **run_qp, uint32_t *dqpn);
};
extern struct ursa_udp_up ursa_udp_up;

/* Test hooks (fuzz target). */
void ursa_udp_inject(uint8_t *buf, size_t len, const union ibv_gid *src,
		     uint16_t sport, const union ibv_gid *dst);
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
	/* ECN: congestion-marked packets received, CNPs sent for them
	 * (at most one per QP per URSA_CNP_GAP_NS), CNPs received, and the
	 * window cuts they made */
	atomic_uint_fast64_t rx_ce, cnp_sent, cnp_rcvd, cnp_cuts;
	/* selective repeat (engine/rc_sr.c) */
	atomic_uint_fast64_t ooo_held, sacks_sent, sacks_rcvd, sr_resent;
	/* loss episodes a SACK showed: the window cut (a queue), kept */
	atomic_uint_fast64_t loss_cuts, loss_kept;
	atomic_uint_fast64_t tx_pmtu;	/* runs over the path MTU, sent fragmented */
};
extern struct ursa_udp_counters ursa_udp_cnt;

#endif
