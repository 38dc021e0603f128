/* SPDX-License-Identifier: MIT */
/*
 * ursa.h - ursa's own extensions to the verbs API.
 *
 * Everything here is optional: programs use <infiniband/verbs.h> as with any
 * RDMA device. These calls make ursa's mechanisms visible: what a
 * registration pinned and how its translation table looks, what a QP and the
 * progress engine counted, and a way to take the port down and up to test an
 * application's async-event handling. All calls return 0 or a negative errno
 * (liburing style) and never touch errno. Structs carry comp_mask for growth.
 * Exported in the URSA_1.0 symbol version of libibverbs.so.1.
 */
#ifndef URSA_URSA_H
#define URSA_URSA_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ursa_mr_info {
	uint64_t comp_mask;	/* 0 for now */
	uint64_t addr;		/* process address of the first byte */
	uint64_t iova;		/* address the keys expose */
	uint64_t length;
	uint32_t lkey, rkey;
	uint32_t access;	/* enum ibv_access_flags */
	uint32_t entries;	/* translation-table entries */
	uint32_t huge_entries;	/* entries for pages larger than 4 KiB */
	uint64_t page_size;	/* page size backing most of the range */
	uint64_t pages_4k;	/* 4 KiB pages the range spans */
	uint64_t pinned_bytes;	/* bytes pinned for this MR (0 with ODP) */
	int on_demand;		/* registered with IBV_ACCESS_ON_DEMAND */
	/* bytes of the memory (from ursa_mem_alloc) that holds the MR and
	 * that requesters on this host map: their WRITE, READ and atomics
	 * need no system call. 0: they reach it by process_vm_writev/readv,
	 * one system call and one copy per access. */
	uint64_t shared_bytes;
	/* 1 if this registration took its pins and translation table back
	 * from the registration cache (ursa_rcache_stats) */
	int cached;
	/* 1 once memory under the MR was unmapped or moved while it was
	 * registered: every access through it is refused from then on (a
	 * NIC would keep reaching the old pages; ursa refuses rather than
	 * reach what is mapped there next). Needs userfaultfd (no root:
	 * UFFD_USER_MODE_ONLY); without it the MR follows its addresses. */
	int unmapped;
};

/* Describe a memory region. */
int ursa_mr_info(struct ibv_mr *mr, struct ursa_mr_info *info);

/* Translation-table entry idx of mr: page start address and page size. */
int ursa_mr_entry(struct ibv_mr *mr, uint32_t idx, uint64_t *va,
		  uint64_t *page_size);

/* Bytes currently pinned by all registrations of this process (and by
 * deregistered ones parked in the registration cache). */
int64_t ursa_pinned_total(void);

/* 1 if this process watches registered memory for unmaps (userfaultfd; an
 * MR over memory unmapped then refuses its accesses), 0 if it cannot
 * (userfaultfd refused by the kernel or a seccomp profile, or URSA_UFFD=0:
 * an MR then follows its addresses). */
int ursa_unmap_watch(void);

/* Print every URSA_* environment variable ursa reads: its effective value
 * in this process, its default and bounds, and what it does (`ursa
 * config`). */
void ursa_config_print(FILE *f);

/*
 * Memory that same-host peers map: len bytes (rounded up to 4 KiB pages),
 * zeroed, in a memfd mapped shared and sealed against resizing. An MR
 * inside one allocation is reached by requesters of other processes with
 * plain loads and stores; private memory (malloc, mmap) by one system call
 * per access. The memory is shared with children of fork(), like any
 * MAP_SHARED mapping. Free with ursa_mem_free (not munmap).
 */
int ursa_mem_alloc(size_t len, void **out);
int ursa_mem_free(void *p);

/*
 * The registration cache: ibv_dereg_mr parks the pinned pages and the
 * translation table of an MR, and an ibv_reg_mr of the same page range
 * takes them back (docs/design.md, "Registration cache"). Parked pages stay
 * locked until taken back or evicted. URSA_RCACHE=0 turns it off;
 * URSA_RCACHE_ENTRIES and URSA_RCACHE_MB bound it.
 */
struct ursa_rcache_stats {
	uint64_t comp_mask;	/* 0 for now */
	uint64_t hits, misses;	/* registrations served / not served */
	uint64_t stale;		/* parked ranges found unmapped at a hit */
	uint64_t evictions;	/* parked ranges unpinned to make room */
	uint64_t entries, bytes;	/* parked now */
	uint64_t max_entries, max_bytes;	/* bounds (0 entries: off) */
};

int ursa_rcache_stats(struct ursa_rcache_stats *st);
/* Unpin every parked range: returns the bytes the parked ranges held, or
 * -errno. */
int64_t ursa_rcache_flush(void);

struct ursa_qp_stats {
	uint64_t comp_mask;
	uint64_t sends, recvs;	/* messages sent (requester) / received */
	/* executed as responder: WRITE messages (once each, however many
	 * packets or fragments), READ and atomic requests */
	uint64_t writes, reads, atomics;
	uint64_t tx_bytes, rx_bytes;
	uint64_t rnr_naks;	/* RNR NAKs this QP answered as responder */
	uint64_t retries;	/* requester retransmissions (ACK timeout) */
	uint64_t errors;	/* error completions and refused requests */
	/* bytes this QP sent, by path: to a QP of the same process; through
	 * shared-memory slots (small messages, or when cross-memory attach
	 * is not permitted); by cross-memory attach, one copy straight
	 * between the two MRs */
	uint64_t loop_bytes, ring_bytes, cma_bytes;
	/* RoCEv2: packets, NAKs received by kind, packets refused */
	uint64_t pkts_tx, pkts_rx;
	uint64_t naks_seq, naks_inv, naks_access, naks_op, rnr_rcvd;
	uint64_t drops;
	/* same host: bytes this QP's WRITEs and READs moved itself, one
	 * copy straight into or out of the target's MR, without the target's
	 * engine (the direct path) */
	uint64_t direct_bytes;
	/* of those, bytes moved by plain loads and stores, in the target's
	 * MR pages mapped into this process (shared mapping, no system
	 * call); and atomics carried out the same way */
	uint64_t map_bytes, map_atomics;
	/* same host, as target: connections refused (a forged source QPN,
	 * a memfd not sealed or too small, another user over its share,
	 * no hello in time), and requests dropped because they came from a
	 * QP that is not this QP's connected peer */
	uint64_t refused_chans, not_peer;
};

int ursa_qp_stats(struct ibv_qp *qp, struct ursa_qp_stats *st);

struct ursa_engine_stats {
	uint64_t comp_mask;
	uint64_t doorbells;	/* posts that had to wake the engine */
	uint64_t wakeups;	/* times the engine returned from sleep */
};

int ursa_engine_stats(struct ibv_context *ctx, struct ursa_engine_stats *st);

/* RoCEv2 (between hosts) counters of this process. */
struct ursa_udp_stats {
	uint64_t comp_mask;
	uint64_t tx_pkts, rx_pkts, tx_bytes, rx_bytes;
	uint64_t retransmits;	/* go-back-N restarts and timeouts */
	uint64_t naks_sent, naks_rcvd, rnr_naks;
	/* received packets dropped, by reason */
	uint64_t drop_short, drop_opcode, drop_icrc, drop_qpn, drop_src,
		 drop_psn, drop_state, dup;
	/* injected on transmit (URSA_FAULT) */
	uint64_t fault_lost, fault_dup, fault_corrupt, fault_reorder;
	uint64_t forwarded;	/* handed to the process owning the QP */
	uint64_t fault_delay;
	uint64_t drop_fwd;	/* for another process of the host, whose
				 * connection was full (it was behind) */
	/* UDP segmentation offload: runs sent as one GSO send, coalesced
	 * runs received (UDP_GRO), packets whose ICRC matched with a
	 * non-zero IPv4 ID (a segment k of a run that was cut apart) */
	uint64_t tx_gso, rx_gro, rx_ipid;
	/* delayed ACKs: held back, and of those sent alone when their
	 * time was up (the others left with a packet of the QP) */
	uint64_t acks_held, acks_alone;
	/* requests held until the ACK that completes our send came (the
	 * peer sends a held ACK after its next request) */
	uint64_t reqs_held;
	/* forwarding socket names held by a process other than the one
	 * they name (refused), and packets for QPNs nobody on this host
	 * owns dropped without a look-up (over the look-up budget) */
	uint64_t drop_fwd_name, drop_unknown;
	/* answers (ACK, NAK, RNR NAK, READ responses) for PSNs not in
	 * flight, and duplicate READs matching no READ executed lately */
	uint64_t drop_stale;
	/* CM MADs on QP1: received and handed to the process that owns
	 * their destination, sent, answered for a destination nobody owns
	 * (REJ, SIDR_REP, DREP), dropped (malformed, undeliverable) */
	uint64_t cm_rx, cm_tx, cm_orphan, cm_drop;
	/* ECN: packets received marked Congestion Experienced, CNPs sent
	 * for them (one per QP per 50 us at most), CNPs received, and the
	 * window cuts they made (one per round trip at most) */
	uint64_t rx_ce, cnp_sent, cnp_rcvd, cnp_cuts;
	/* selective repeat between ursa peers: packets a responder held out
	 * of order, SACKs sent and received, packets resent alone */
	uint64_t ooo_held, sacks_sent, sacks_rcvd, sr_resent;
	/* losses a SACK showed, once a round trip at most: those that cut
	 * the window (the round trip showed a queue) and those taken as
	 * the path's own, which kept it (docs/design.md "Congestion") */
	uint64_t loss_cuts, loss_kept;
	/* runs of packets longer than the path MTU the kernel learned
	 * (ICMP "fragmentation needed"), sent packet by packet for the
	 * kernel to fragment (docs/design.md "Path MTU") */
	uint64_t tx_pmtu;
};

int ursa_udp_stats(struct ursa_udp_stats *st);

/* Inject faults into this process's RoCEv2 transmissions, as URSA_FAULT
 * does: "loss=5,dup=1,reorder=1,corrupt=1,delay=2,delay_us=500,seed=7"
 * (probabilities in percent; corrupt flips a bit the ICRC must catch;
 * delay holds a packet back delay_us). NULL or "" turns faults off. */
int ursa_fault_set(const char *spec);

/* Send one CM MAD (256 bytes) from QP1 to the QP1 of the host owning dgid,
 * from the address sgid, with IP traffic class tclass: what ursa's
 * librdmacm uses to speak the IB CM protocol on RoCEv2. Received CM MADs
 * go to the abstract socket of their destination (docs/design.md,
 * "Connection management"). 0, or a negative errno (-ENETDOWN: no
 * context is open, so this process has no RoCEv2 port). */
int ursa_cm_send(const union ibv_gid *sgid, const union ibv_gid *dgid,
		 uint8_t tclass, const void *mad);

/* The uid whose processes hold the RoCEv2 UDP port in this network
 * namespace (they receive every CM MAD and forward it to its owner), or
 * -1 if nobody holds it. */
long ursa_roce_port_uid(void);

/* Set port 1 to IBV_PORT_ACTIVE or IBV_PORT_DOWN; every open context gets
 * IBV_EVENT_PORT_ACTIVE or IBV_EVENT_PORT_ERR. For testing applications. */
int ursa_port_set_state(struct ibv_context *ctx, enum ibv_port_state state);

/* Which check refused a work request: the text for wc.vendor_err of an
 * error completion ("remote: range outside the registered region", ...). */
const char *ursa_vendor_err_str(uint32_t vendor_err);

/* "ursa <version>" */
const char *ursa_version(void);

#ifdef __cplusplus
}
#endif

#endif
