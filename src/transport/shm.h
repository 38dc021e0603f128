/* SPDX-License-Identifier: MIT */
/*
 * shm.h - the same-host transport between processes.
 *
 * Discovery: every QP binds the abstract UNIX socket "\0ursa/qp/<qpn>" of
 * its network namespace. The bind is what makes QPNs unique host-wide (a
 * taken name fails with EADDRINUSE), it is how a requester finds the process
 * that owns a QPN, and the kernel removes it when the process dies, so a
 * crashed process leaves nothing behind.
 *
 * Channel: a requester QP connects (SOCK_SEQPACKET) to the target QP's
 * socket and passes three descriptors: a memfd holding the channel's two
 * rings (requests, responses), the memfd of its engine's control page (the
 * "sleeping" flag), and its engine's doorbell eventfd. The target answers
 * with its own control page and doorbell, and whether cross-memory attach
 * works from it to the requester (it probes the requester's memory with
 * process_vm_readv). The socket stays open only to notice the peer's death.
 * Memfds are sealed and checked before use; the hello's source QPN is
 * verified by the credentials of that QPN's listener; another user gets
 * no MR table (docs/design.md, "Users of one host, and who says hello").
 *
 * Data: requests and responses are fixed slots in the shared rings. Small
 * payloads travel inside the slot; larger ones stay where they are and the
 * target's engine copies them once, straight between the two MRs, with
 * process_vm_readv (WRITE, SEND) or process_vm_writev (READ). When
 * cross-memory attach is not permitted, larger payloads travel through the
 * slots in fragments. The target's engine executes every request (resp.c),
 * so one-sided operations need nothing from the target application.
 *
 * Trust: the peer controls the shared rings. Every index is bounded by the
 * ring size, every length and count by the slot's capacity, and data only
 * ever lands in our memory through an rkey we check (resp.c) or into our
 * own WQE's buffers; the peer's addresses are only used inside the peer.
 */
#ifndef URSA_SHM_H
#define URSA_SHM_H

#include "../core/core.h"
#include "../core/pub.h"
#include "../core/request.h"

#define URSA_SHM_MAGIC 0x55525341u /* "URSA" */
#define URSA_SHM_VERSION 4	/* 4: sealed memfds, verified source QPNs */

/* The handshake on the channel socket (tests/tools/shm_attack.c speaks it
 * too): the requester's hello with its three descriptors, the target's
 * welcome with two or three. */
struct ursa_shm_hello {
	uint32_t magic, version;
	uint32_t src_qpn, dst_qpn, qp_type;
	uint32_t pad;
	uint64_t probe_addr, probe_val;
};

struct ursa_shm_welcome {
	uint32_t magic, version;
	int32_t status;		/* 0, or -errno: the target refuses */
	uint32_t cma_ok;
	/* With a third descriptor (the target's published table, pub.h):
	 * the target QP's word in it, and a word of the target for the
	 * requester's own cross-memory attach probe. */
	int32_t qp_slot;
	int32_t pub_fd;		/* the table's descriptor number in the target:
				 * the requester's probe of /proc/<pid>/fd */
	uint64_t probe_addr, probe_val;
};

/* The part of an engine other processes see: a shared page holding the
 * "I am asleep" flag that decides whether a peer must ring the doorbell.
 * Each engine writes its own (engine/engine.c); a peer maps it read-only
 * from the handshake and reads it before ringing (ring_peer in shm.c). */
struct ursa_ctl {
	uint32_t magic;
	uint32_t version;
	atomic_int sleeping;	/* 1 while blocked (or about to block) */
	int32_t pid;
	/* version 2: while sleeping, when the engine wakes by itself
	 * (CLOCK_MONOTONIC ns; UINT64_MAX: not before a doorbell) */
	atomic_uint_fast64_t wake_by;
	/* the last pass an application thread ran (ursa_engine_progress),
	 * on a line of its own: that thread writes it, peers read it */
	_Alignas(64) atomic_uint_fast64_t app_poll_ns;
};

/* What the engine's epoll set watches: the tag of each event. The engine
 * has its doorbell and the RoCEv2 sockets; this transport adds a QP's
 * listening socket and each channel's socket, whose events the engine
 * hands to ursa_shm_event. */
enum ursa_watch_kind { URSA_W_DOORBELL, URSA_W_LISTEN, URSA_W_CHAN, URSA_W_UDP };
struct ursa_watch {
	enum ursa_watch_kind kind;
	void *ptr;		/* NULL once closed */
	struct ursa_watch *next;
};

enum ursa_chan_state { URSA_CHAN_CONNECTING, URSA_CHAN_READY, URSA_CHAN_DEAD };
enum ursa_chan_role { URSA_CHAN_REQUESTER, URSA_CHAN_RESPONDER };

/* The channel memfd: the requester's rings of requests and answers
 * (tests/fuzz/fuzz_chan.c writes them as a hostile requester would). */
enum {
	WF_SOLICITED = 1, WF_IMM = 2, WF_INV = 4, WF_CMA = 8,
};

struct ursa_wsg {
	uint64_t va, len;
};

struct ursa_wreq {
	uint32_t seq, opcode, frag, flags;
	uint32_t src_qpn, dst_qpn, qkey, rkey;
	uint64_t raddr, len, msg_len, offset;
	uint32_t imm, nsg;
	uint64_t compare_add, swap;
	uint8_t sgid[16], dgid[16];
	uint8_t tclass, hop;
	uint16_t pad;
	uint32_t flow;
	uint32_t inline_len, pad2;
	struct ursa_wsg sg[URSA_MAX_SGE];
	uint8_t data[URSA_SHM_INLINE];
};

struct ursa_wresp {
	uint32_t seq, ack, why, rnr_timer;
	uint64_t atomic_orig;
	uint32_t inline_len, pad;
	uint8_t data[URSA_SHM_INLINE];
};

struct ursa_chanmem {
	uint32_t magic, version;
	/* Each index on its own line: producers and consumers are in
	 * different processes. */
	_Alignas(128) atomic_uint req_tail;	/* requester produces */
	_Alignas(128) atomic_uint req_head;	/* responder consumes */
	_Alignas(128) atomic_uint resp_tail;	/* responder produces */
	_Alignas(128) atomic_uint resp_head;	/* requester consumes */
	/* Non-zero while the requester may be placing data in the target
	 * itself (direct_xfer): the target's deregistration waits. */
	_Alignas(128) atomic_uint busy;
	_Alignas(128) struct ursa_wreq req[URSA_SHM_SLOTS];
	struct ursa_wresp resp[URSA_SHM_SLOTS];
};


struct ursa_chan {
	enum ursa_chan_role role;
	enum ursa_chan_state state;
	struct ursa_watch watch;
	int sock;
	struct ursa_chanmem *mem;
	struct ursa_ctl *peer_ctl;
	int peer_efd;
	pid_t peer_pid;
	uid_t peer_uid;
	bool cma;		/* the target may use cross-memory attach */
	/* requester: the target's published table, when this side may
	 * place WRITE and READ data itself (pub.h), and the target QP's
	 * word in it */
	const struct ursa_pubmem *dpub;
	uint32_t dslot;
	bool dcma;		/* and may use process_vm_* on the target */
	bool dnomap;		/* the target's memfds cannot be opened */
	/* the target's MR memfds mapped here (shmap.h), by inode */
	struct ursa_dmap {
		uint64_t ino, len;
		uint8_t *base;
	} dmap[URSA_DMAPS];
	uint32_t dmap_next;
	uint32_t dgen;		/* the table's gen when the cache was checked */
	/* The entry the direct path used last, and what it found for it: a
	 * WRITE stream to one MR then checks one seq instead of looking the
	 * rkey up, copying the entry and searching dmap again. */
	struct ursa_dlast {
		bool valid;
		uint32_t where;		/* index in the table's mr[] */
		unsigned int seq;	/* the entry's seq when copied */
		struct ursa_pub_mr e;
		uint8_t *base;		/* its memfd mapped here, or NULL */
	} dlast;
	struct ursa_qp *qp;	/* our QP: requester or target */
	uint32_t peer_qpn;
	uint32_t seq;		/* requester: seq of the current request;
				 * responder: next expected seq */
	struct ursa_rstate rs;	/* responder: fragmented SEND in progress */
	void *last_resp;	/* responder: last response, for duplicates */
	bool closed;		/* waiting in the engine's graveyard */
	uint64_t hello_by;	/* responder: the hello's deadline (ns) */
	bool was_ready;		/* requester: the handshake completed */
	uint64_t dead_ns;	/* when it died */
	struct ursa_chan *next;
};

/* What this transport keeps per engine (struct ursa_engine holds one, and
 * ctx->shm points to it while the engine runs). The descriptors are the
 * engine's, copied in by it when it starts: its epoll set, where our
 * sockets go (-1 in a fork child, whose engine is the parent's), and the
 * control page and doorbell every hello and welcome hands to the peer. */
struct ursa_shm_eng {
	int epfd, ctl_fd, efd;
	struct ursa_chan *served;  /* channels whose target QP is ours */
	struct ursa_wreq *snap;	   /* ursa_shm_serve's copy of a request */
	struct ursa_chan *grave;   /* closed, freed at the next pass */
	struct ursa_watch *grave_watches;
};

/* Up-calls the engine registers (its constructor): the transport sits
 * below the engine and calls it only through these. Set before any verb
 * runs; ursa_shm_serve calls them without checking. */
struct ursa_shm_up {
	/* Execute a request from the ring on the target QP and fill the
	 * answer (engine/resp.c ursa_resp_execute). */
	void (*execute)(struct ursa_qp *tqp, const struct ursa_req *req,
			struct ursa_resp *resp, struct ursa_rstate *rs);
	/* Run a QP's send queue (engine/req.c ursa_req_process_lazy), so
	 * that its answers from a peer complete before that peer's next
	 * request is served. Returns the WQEs processed. */
	int (*run_sq)(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline);
};
extern struct ursa_shm_up ursa_shm_up;

/* What one other user may hold of a process's channels (its own user may
 * hold anything: it could ptrace the process anyway): handshakes not
 * finished (URSA_SHM_FOREIGN_PENDING), and channels in all
 * (URSA_SHM_FOREIGN_CHANS); beyond, connections are closed at once. A
 * hello must arrive within URSA_SHM_HELLO_NS of the connect. */

/* QPN registry: bind the QP's socket; -EADDRINUSE if the QPN is taken. */
int ursa_shm_listen(struct ursa_qp *qp, uint32_t qpn);
void ursa_shm_unlisten(struct ursa_qp *qp);
/* Close every channel of a QP (it is being destroyed or reset). */
void ursa_shm_qp_close(struct ursa_qp *qp);

/* Engine hooks (called with ctx->qp_lock held). */
void ursa_shm_reap(struct ursa_shm_eng *e);
void ursa_shm_engine_fini(struct ursa_shm_eng *e);
/* fork(): the child closes the served channels' sockets and leaves the
 * epoll set (the engine closes it) to the parent. */
void ursa_shm_engine_forget(struct ursa_shm_eng *e);
void ursa_shm_event(struct ursa_shm_eng *e, struct ursa_watch *w,
		    uint32_t events);
int ursa_shm_serve(struct ursa_shm_eng *e);
bool ursa_shm_serve_pending(struct ursa_shm_eng *e);

/* Wait until no requester of this context's served channels may still be
 * using a table entry the owner just removed (MR deregistration). */
void ursa_shm_quiesce(struct ursa_ctx *ctx);

/* Requester step for a WQE whose target is another process: returns 1 with
 * resp filled when the WQE's fate is known, 0 while it waits (until at
 * most *until). */
int ursa_shm_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		  const struct ursa_req *r, uint64_t now,
		  struct ursa_resp *resp, uint64_t *until);
/* What the direct path needs of an RDMA WRITE, READ or atomic: less than
 * an ursa_req, so that ursa_req_direct's WR is described in a few stores. */
struct ursa_dop {
	uint32_t opcode;		/* enum ibv_wr_opcode */
	uint32_t rkey;
	uint64_t remote_addr;
	uint64_t len;			/* 8 for an atomic */
	const struct ursa_sg *sg;	/* WRITE: the source; READ: the sink */
	uint32_t nsg;
	uint64_t compare_add, swap;	/* atomics */
};
/* The direct path (pub.h) for a WR never queued (ursa_req_direct): true
 * when it is done, the atomic's original value in *orig. Reads no clock. */
bool ursa_shm_direct_op(struct ursa_qp *qp, const struct ursa_dop *op,
			uint64_t *orig);
/* The same, tried before ursa_shm_step for a WQE not yet in flight on a
 * ready channel: true when it is done (resp filled). */
bool ursa_shm_direct(struct ursa_qp *qp, struct ursa_send_wqe *w,
		     const struct ursa_req *r, struct ursa_resp *resp);
/* Ask for the lines of the request slot the QP's next SEND through the
 * slots will fill (qp->shm_hint): their transfer then overlaps building
 * the request. A hint: nothing is read or written there. */
void ursa_shm_prefetch_next(struct ursa_qp *qp);
/* Whether a WQE waiting in ursa_shm_step has news. */
bool ursa_shm_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now);

#endif
