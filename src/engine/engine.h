/* SPDX-License-Identifier: MIT */
/*
 * engine.h - the progress engine and the protocol roles it runs.
 *
 * Each context has one engine thread. It consumes the send queues of the
 * context's QPs (req.c, the requester), hands each request to a transport,
 * and the transport delivers it to the responder of the target QP (resp.c),
 * which checks and executes it against the target's memory and receive
 * queue and answers like an RC responder would: ACK, RNR NAK, one of the
 * NAK codes of IBTA 9.7.5.2.4, or nothing (a dropped packet). The requester
 * turns the answer into a completion, a retry after the RNR timer or the
 * local ACK timeout, or an error completion plus the QP state change the
 * spec requires.
 *
 * The request is transport neutral: the loop transport passes it by pointer
 * to a QP of the same process; the shared-memory and UDP transports of the
 * later milestones marshal the same fields.
 */
#ifndef URSA_ENGINE_H
#define URSA_ENGINE_H

#include "../core/core.h"
#include "../transport/loop.h"
#include "../transport/udp.h"

/* The part of an engine other processes see: a shared page holding the
 * "I am asleep" flag that decides whether a peer must ring the doorbell. */
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

struct ursa_chan;

struct ursa_engine {
	struct ursa_ctx *ctx;
	pthread_t thr;
	int efd;		/* doorbell: an eventfd, shared with peers */
	int epfd;		/* what the engine sleeps on */
	int ctl_fd;		/* memfd of the ctl page */
	struct ursa_ctl *ctl;
	atomic_int stop;
	atomic_int started;	/* the thread runs engine_main (see start) */
	bool forked;		/* a copy inherited by a fork child */
	/* while asleep: when the engine will wake by itself (0 = awake);
	 * application threads that set an earlier timer must wake it */
	atomic_uint_fast64_t sleep_until;
	atomic_uint_fast64_t wakeups, doorbells, inline_passes;
	atomic_uint_fast64_t active_ns;	/* last pass that did work */
	atomic_uint_fast64_t app_pass_ns; /* last pass on an application's thread */
	atomic_bool app_in_pass; /* one runs now (it holds ctx->qp_lock) */
	atomic_bool quiet_sleep; /* the engine sleeps because one polls */
	uint64_t quiet_ns;	/* URSA_QUIET_US (engine.c) */
	uint64_t quiet_cur, quiet_off;	/* adapted quiet time; when it went to 0 */
	struct ursa_udp_watch udp; /* the RoCEv2 sockets in epfd */
	uint64_t spin_ns;
	uint64_t spin_max_ns;	/* URSA_SPIN_MAX_US: the adapted spin's bound */
	struct ursa_chan *served;  /* channels whose target QP is ours */
	struct ursa_wreq *snap;	   /* ursa_shm_serve's copy of a request */
	struct ursa_chan *grave;   /* closed, freed at the next pass */
	struct ursa_watch *grave_watches;
};

/* What the engine's epoll set watches. */
enum ursa_watch_kind { URSA_W_DOORBELL, URSA_W_LISTEN, URSA_W_CHAN, URSA_W_UDP };
struct ursa_watch {
	enum ursa_watch_kind kind;
	void *ptr;		/* NULL once closed */
	struct ursa_watch *next;
};

int ursa_engine_start(struct ursa_ctx *ctx);
void ursa_engine_stop(struct ursa_ctx *ctx);
/* Doorbell: wakes the engine if (and only if) it sleeps. */
void ursa_engine_kick(struct ursa_engine *e);
void ursa_engine_forget(struct ursa_engine *e);
/* The context whose pass this thread is running (NULL outside a pass): its
 * send queues run after the receive step of the same pass, so news for
 * them needs no doorbell. */
extern __thread struct ursa_ctx *ursa_pass_ctx;
/* One engine pass on the calling (application) thread, if the engine is
 * not in the middle of one: ibv_poll_cq and ibv_post_send make progress
 * themselves instead of waiting for a context switch. polling: the caller
 * polls a CQ it has not armed, so it will be back soon (peers may skip
 * our doorbell, shm.c ring_peer). Returns the work done, or -EBUSY. */
int ursa_engine_progress(struct ursa_ctx *ctx, bool polling);
/* ibv_req_notify_cq: the calling thread is about to block. */
void ursa_engine_app_blocks(struct ursa_ctx *ctx);
/* Only this QP's send queue (a post): no receiving, no serving. */
int ursa_engine_progress_qp(struct ursa_qp *qp);

/* A scatter/gather element already translated to process memory. */
struct ursa_sg {
	uintptr_t va;
	uint64_t len;
};

enum ursa_ack {
	URSA_ACK = 0,
	URSA_NAK_RNR,		/* receiver not ready: retry after timer */
	URSA_NAK_INV_REQ,	/* invalid request */
	URSA_NAK_ACCESS,	/* remote access error */
	URSA_NAK_OP_ERR,	/* remote operational error */
	URSA_DROPPED,		/* silently dropped: no answer at all */
};

/* Fragment flags: a message larger than a ring slot that cannot use
 * cross-memory attach travels as several requests. */
enum { URSA_FRAG_FIRST = 1, URSA_FRAG_LAST = 2, URSA_FRAG_ONLY = 3 };

struct ursa_req {
	uint32_t opcode;	/* enum ibv_wr_opcode */
	uint32_t frag;		/* URSA_FRAG_* */
	uint64_t msg_len;	/* whole message (SEND fragments) */
	uint64_t offset;	/* of this fragment in the message */
	pid_t peer;		/* src/dst lists are in this process (0: ours) */
	enum ibv_qp_type type;
	uint32_t src_qpn;
	uint32_t qkey;		/* UD */
	union ibv_gid sgid, dgid;
	uint8_t traffic_class, hop_limit;
	uint32_t flow_label;
	uint64_t remote_addr;
	uint32_t rkey;
	uint64_t len;		/* message length */
	const struct ursa_sg *src; /* payload (SEND, WRITE) */
	uint32_t nsrc;
	bool src_remote;	/* src lists live in peer's memory */
	const struct ursa_sg *dst; /* READ response target */
	uint32_t ndst;
	bool dst_remote;
	uint32_t imm;		/* imm data (BE) or rkey to invalidate */
	bool has_imm, invalidate, solicited;
	uint64_t compare_add, swap;
};

/*
 * Why a request was refused: reported in wc.vendor_err of the error
 * completion (URSA_WHY_REMOTE set when the responder refused) and spelled
 * out by ursa_vendor_err_str(). Codes 1-5 are the ursa_mem_err checks.
 */
enum ursa_why {
	URSA_WHY_NONE = 0,
	URSA_WHY_KEY = 1, URSA_WHY_PD, URSA_WHY_BOUNDS, URSA_WHY_ACCESS,
	URSA_WHY_MW_QP, URSA_WHY_UNMAPPED,	/* = -URSA_MEM_* */
	URSA_WHY_QP_ACCESS = 0x10, URSA_WHY_ALIGN, URSA_WHY_NO_RECV,
	URSA_WHY_RECV_SHORT, URSA_WHY_INVALIDATE, URSA_WHY_UNSUPPORTED,
	URSA_WHY_OPCODE, URSA_WHY_NOT_READY, URSA_WHY_QKEY, URSA_WHY_UD_MTU,
	URSA_WHY_UNREACHABLE, URSA_WHY_MSG_LEN, URSA_WHY_ATOMIC_LEN,
	URSA_WHY_BIND, URSA_WHY_LOCAL_INV, URSA_WHY_FLUSH, URSA_WHY_PEER_MEM,
	URSA_WHY_PEER_DEAD, URSA_WHY_RD_ATOMIC, URSA_WHY_NOT_PEER,
	URSA_WHY_REMOTE = 0x100,
};
const char *ursa_why_str(uint32_t code);

struct ursa_resp {
	enum ursa_ack ack;
	uint8_t rnr_timer;	/* responder's min_rnr_timer, for RNR */
	uint64_t atomic_orig;
	uint32_t why;		/* enum ursa_why: which check refused */
	bool final;		/* DROPPED after the last retry already */
};

/* Responder state that outlives one request: a SEND arriving in several
 * fragments keeps its receive WQE here between them. */
struct ursa_rstate {
	bool active;
	struct ursa_recv_wqe w;
	struct ursa_sg sg[URSA_MAX_SGE];
	struct ursa_mem_ref refs[URSA_MAX_SGE];
	uint32_t nsg;
	uint64_t room;
};

/* resp.c: execute req on the target QP (rs may be NULL for single-fragment
 * transports). */
void ursa_resp_execute(struct ursa_qp *tqp, const struct ursa_req *req,
		       struct ursa_resp *resp, struct ursa_rstate *rs);
void ursa_rstate_drop(struct ursa_rstate *rs);

/* The clock, read once per pass and only when something needs it (*now 0:
 * not read yet): an idle poll or a direct WRITE needs none, and
 * clock_gettime costs 25-30 ns on this VM. */
static inline uint64_t ursa_need_now(uint64_t *now)
{
	if (!*now)
		*now = ursa_now_ns();
	return *now;
}
/* ibv_post_send's shortcut (req.c): true when the WR was carried out and
 * completed; false when nothing happened. */
bool ursa_req_direct(struct ursa_qp *qp, const struct ibv_send_wr *wr);
/* req.c: run a QP's send queue; returns WQEs processed, lowers *deadline
 * to the earliest time a deferred WQE becomes due. *now: the clock, 0
 * until something needs it (ursa_need_now). */
int ursa_req_process_lazy(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline);
/* Whether the QP has work the engine can do now; lowers *deadline to the
 * time its head WQE becomes due otherwise. */
bool ursa_req_pending(struct ursa_qp *qp, uint64_t now, uint64_t *deadline);

/* The entries of sg covering [off, off + len) into out (at most n);
 * returns how many. */
uint32_t ursa_sg_slice(const struct ursa_sg *sg, uint32_t n, uint64_t off,
		       uint64_t len, struct ursa_sg *out);
/* Copy len bytes from src to dst lists; the last byte is stored last with
 * release ordering, so a reader spinning on it sees the whole message. */
void ursa_sg_copy(const struct ursa_sg *dst, uint32_t ndst,
		  const struct ursa_sg *src, uint32_t nsrc, uint64_t len);
/* The same when one side lives in another process (cross-memory attach:
 * process_vm_readv/writev). Skips the first skip bytes of dst. Returns 0,
 * -EFAULT when an address of this process faulted (memory unmapped while
 * registered: util/fault.h), -EIO when cross-memory attach failed (the
 * peer died, or the kernel refused the access), -EINVAL for lists too long
 * to pass to the kernel. */
int ursa_xfer(const struct ursa_sg *dst, uint32_t ndst, bool dst_remote,
	      const struct ursa_sg *src, uint32_t nsrc, bool src_remote,
	      pid_t peer, uint64_t skip, uint64_t len);

/* RNR timer and ACK timeout encodings (IBTA 9.7.5.2.8, 9.7.6.1.3). */
uint64_t ursa_rnr_timer_ns(uint8_t code);
uint64_t ursa_ack_timeout_ns(uint8_t code);

/*
 * The retry counts of a WQE (IBTA 9.7.6.1.3, 9.7.5.2.8), for every
 * transport: set when it starts (and retry_cnt again whenever the
 * responder shows progress), taken one at a time by the transport that
 * saw a local ACK timeout or an RNR NAK. A take that finds none left is
 * the WQE's RETRY_EXC_ERR or RNR_RETRY_EXC_ERR; rnr_retry 7 never runs
 * out. These are the only places the counts change.
 */
static inline void ursa_retry_start(struct ursa_qp *qp, struct ursa_send_wqe *w)
{
	w->rnr_left = qp->attr.rnr_retry;
	w->retry_left = qp->attr.retry_cnt;
}

static inline void ursa_retry_progress(struct ursa_qp *qp,
				       struct ursa_send_wqe *w)
{
	w->retry_left = qp->attr.retry_cnt;
}

static inline bool ursa_retry_take(struct ursa_qp *qp, struct ursa_send_wqe *w)
{
	if (!w->retry_left)
		return false;
	w->retry_left--;
	atomic_fetch_add(&qp->cnt.retries, 1);
	return true;
}

static inline bool ursa_rnr_retry_take(struct ursa_qp *qp,
				       struct ursa_send_wqe *w)
{
	if (qp->attr.rnr_retry == 7)
		return true;	/* (7: for ever) */
	if (!w->rnr_left)
		return false;
	w->rnr_left--;
	return true;
}

/* The RoCEv2 packet engine (rc.h, rc_*.c): a QP's protocol state, made
 * and dropped with the QP (core's hooks), and reset by modify_qp. */
int ursa_rc_qp_init(struct ursa_qp *qp);
void ursa_rc_qp_fini(struct ursa_qp *qp);
void ursa_rc_qp_modified(struct ursa_qp *qp, int mask);
/* fork(): the child closes the inherited QP's sockets. */
void ursa_rc_qp_forget(struct ursa_qp *qp);
/* Requester step for a WQE whose target is another host (same contract as
 * ursa_shm_step). */
int ursa_rc_step(struct ursa_qp *qp, struct ursa_send_wqe *w,
		 const struct ursa_req *r, uint64_t now,
		 struct ursa_resp *resp, uint64_t *until);
bool ursa_rc_ready(struct ursa_qp *qp, struct ursa_send_wqe *w, uint64_t now);
/* The QP's held-back ACK and held request (rc_ack.c "Delayed ACK"): sent or
 * executed if due, else *deadline lowered to when they are (engine: the
 * engine's own pass). *now: the clock, 0 until read (ursa_need_now).
 * Returns how many were due. */
int ursa_rc_acks(struct ursa_qp *qp, uint64_t *now, uint64_t *deadline,
		 bool engine);
/* At process exit: send the QP's held-back ACK. */
void ursa_rc_ack_exit(struct ursa_qp *qp);
/* WQE w completes: release what its message holds (done, flushed). */
void ursa_rc_abort(struct ursa_qp *qp, const struct ursa_send_wqe *w);
/* May WQE w go out now, while the messages before it wait for their ACK
 * (pipelining: RC WRITEs and SENDs, or READs and atomics)? */
bool ursa_rc_can_start(struct ursa_qp *qp, const struct ursa_send_wqe *w);
/* How many WQEs, from the head, wait sent whole (the one being sent, if
 * any, comes next in the queue). */
uint32_t ursa_rc_piped(struct ursa_qp *qp);
/* Is w in flight: 1 sent whole, waiting for its ACK; 2 being sent; 0 no. */
int ursa_rc_inflight(struct ursa_qp *qp, const struct ursa_send_wqe *w);
/* For the fuzz targets: the responder's expected PSN; the PSN of the
 * requester's oldest packet not yet answered (what a response aimed at it
 * should carry). */
uint32_t ursa_rc_epsn(struct ursa_qp *qp);
uint32_t ursa_rc_unanswered_psn(struct ursa_qp *qp);


#endif
