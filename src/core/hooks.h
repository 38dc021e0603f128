/* SPDX-License-Identifier: MIT */
/*
 * hooks.h - what core asks of the layers above it, without calling up.
 *
 * core (devices, PDs, MRs, CQs, QPs and their state machine) sits below
 * the transports and the engine (docs/design.md, "Layers"): it never
 * includes their headers or calls their functions. Where a change of a
 * core object concerns them (a QP created, modified or destroyed, an MR
 * taken out of the same-host table, a WR posted, a fork), core calls
 * through this table, which each of them fills in for its part from a
 * constructor when the library is loaded (transport/loop.c, shm.c, udp.c,
 * engine/engine.c, req.c, rc_qp.c). All of them are in the same library, so every
 * entry is set before any verb runs; core calls them without checking.
 */
#ifndef URSA_HOOKS_H
#define URSA_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

struct ibv_send_wr;
struct ursa_ctx;
struct ursa_engine;
struct ursa_qp;

struct ursa_hooks {
	/* transport/loop.c: the process's QPN table */
	int (*qp_add)(struct ursa_qp *qp);	/* findable by its QPN */
	void (*qp_del)(struct ursa_qp *qp);	/* no longer, and idle */
	/* engine/rc_qp.c: the QP's RoCEv2 protocol state */
	int (*rc_qp_init)(struct ursa_qp *qp);
	void (*rc_qp_modified)(struct ursa_qp *qp, int mask);
	void (*rc_qp_fini)(struct ursa_qp *qp);
	void (*rc_qp_forget)(struct ursa_qp *qp);  /* in a fork child */
	/* transport/shm.c: channels to same-host peers */
	void (*chans_close)(struct ursa_qp *qp);   /* peers see them close */
	void (*unlisten)(struct ursa_qp *qp);
	void (*prefetch_next)(struct ursa_qp *qp); /* before a post */
	void (*quiesce)(struct ursa_ctx *ctx);	   /* after an unpublish */
	/* engine: work posted, progress */
	bool (*post_direct)(struct ursa_qp *qp, const struct ibv_send_wr *wr);
	int (*progress_qp)(struct ursa_qp *qp);
	void (*kick)(struct ursa_engine *e);
	void (*engine_forget)(struct ursa_engine *e); /* in a fork child */
	/* fork: the child's fresh start, in this order */
	void (*loop_atfork_child)(void);
	void (*udp_atfork_child)(void);
};

extern struct ursa_hooks ursa_hooks;

#endif
