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
 * The request is transport neutral (core/request.h): the loop transport passes it by pointer
 * to a QP of the same process; the shared-memory and UDP transports of the
 * later milestones marshal the same fields.
 */
#ifndef URSA_ENGINE_H
#define URSA_ENGINE_H

#include "../core/core.h"
#include "../core/request.h"
#include "../transport/loop.h"
#include "../transport/shm.h"
#include "../transport/udp.h"

struct ursa_engine {
	struct ursa_ctx *ctx;
	pthread_t thr;
	int efd;		/* doorbell: an eventfd, shared with peers */
	int epfd;		/* what the engine sleeps on */
	int ctl_fd;		/* memfd of the ctl page */
	struct ursa_ctl *ctl;	/* (transport/shm.h) */
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
	struct ursa_shm_eng shm;   /* the same-host channels (transport/shm.h) */
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

/* resp.c: execute req on the target QP (rs may be NULL for single-fragment
 * transports). */
void ursa_resp_execute(struct ursa_qp *tqp, const struct ursa_req *req,
		       struct ursa_resp *resp, struct ursa_rstate *rs);

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

/* ursa_sg_copy (core/request.h) when one side lives in another process
 * (cross-memory attach: process_vm_readv/writev). Skips the first skip
 * bytes of dst. Returns 0, -EFAULT when an address of this process faulted
 * (memory unmapped while registered: util/fault.h), -EIO when cross-memory
 * attach failed (the peer died, or the kernel refused the access), -EINVAL
 * for lists too long to pass to the kernel. */
int ursa_xfer(const struct ursa_sg *dst, uint32_t ndst, bool dst_remote,
	      const struct ursa_sg *src, uint32_t nsrc, bool src_remote,
	      pid_t peer, uint64_t skip, uint64_t len);

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
