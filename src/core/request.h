/* SPDX-License-Identifier: MIT */
/*
 * request.h - the transport-neutral request and its answer: what a
 * requester hands to the responder of the target QP, whichever transport
 * carries it, and the helpers every carrier shares (scatter/gather slices
 * and copies, IBTA's timer encodings, the WQE's retry counts).
 *
 * The engine builds requests (engine/req.c) and executes them
 * (engine/resp.c); the same-host transport (transport/shm.c) marshals the
 * same fields through its rings and retransmits on its own. The transports
 * sit below the engine (docs/design.md, "Layers"), so what both need is
 * here, in core: types on core's objects and pure helpers that call
 * nothing above core.
 */
#ifndef URSA_REQUEST_H
#define URSA_REQUEST_H

#include "core.h"

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

/* A message given up half way (QP state change, a gap on UC): nothing to
 * release, no reference outlives its packet (engine/resp.c). rs may be
 * NULL. */
static inline void ursa_rstate_drop(struct ursa_rstate *rs)
{
	if (rs)
		rs->active = false;
}

/* The entries of sg covering [off, off + len) into out (at most n);
 * returns how many. */
uint32_t ursa_sg_slice(const struct ursa_sg *sg, uint32_t n, uint64_t off,
		       uint64_t len, struct ursa_sg *out);
/* Copy len bytes from src to dst lists; the last byte is stored last with
 * release ordering, so a reader spinning on it sees the whole message. */
void ursa_sg_copy(const struct ursa_sg *dst, uint32_t ndst,
		  const struct ursa_sg *src, uint32_t nsrc, uint64_t len);

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

#endif
