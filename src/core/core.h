/* SPDX-License-Identifier: MIT */
/*
 * core.h - ursa's objects: device, context, PD, MR, MW, CQ, SRQ, QP, AH.
 *
 * Every object embeds the libibverbs struct the application sees as its first
 * member, so the verbs layer converts with container_of and applications can
 * read the public fields (qp->qp_num, mr->lkey, ...) directly. Core functions
 * return 0 or a negative errno; only src/verbs/ knows libibverbs' conventions.
 *
 * Locking, from outermost to innermost:
 *   ctx->qp_lock   (the list of QPs an engine serves)
 *   qp->sq_lock    (posters of the send queue)
 *   qp->rq_lock / srq->lock   (posters and consumers of receive queues)
 *   cq->lock       (producers and pollers of a CQ)
 *   keytab rwlock, loop table rwlock   (leaves)
 * A responder (which may run on another context's engine) takes only the
 * target's rq/srq lock and CQ lock, never a ctx or sq lock, so two engines
 * serving each other cannot deadlock.
 */
#ifndef URSA_CORE_H
#define URSA_CORE_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../util/util.h"
#include "hooks.h"
#include "keytab.h"
#include "mtt.h"
#include "pin.h"
#include "ring.h"
#include "rcache.h"
#include "shmap.h"

/* (the device's limits: util/limits.h) */
#define URSA_VENDOR_ID 0xffffff /* as rxe: no IEEE OUI of its own */
#define URSA_VENDOR_PART 0x5552 /* "UR"; not an mlx5/efa part id */
#define URSA_HW_VER 1
#define URSA_FW_VER "ursa-0.1.0"
#define URSA_GRH_LEN 40
/* wc.sl of a UD receive on RoCE, as mlx5 reports it (resp.c). */
#define URSA_SL_ROCE_V2_IPV4 0xa
#define URSA_SL_ROCE_V2_IPV6 0x9

struct ursa_gid {
	union ibv_gid gid;
	int ifindex;
};

/* The single software device of the process. */
struct ursa_device {
	struct ibv_device ibdev;   /* first: handed to applications */
	uint64_t node_guid;	   /* network byte order */
	enum ibv_mtu max_mtu, active_mtu;
	uint32_t wide;		   /* payload of ursa's wide packets, bytes
				    * (proto/roce.h; 0: none above active) */
	char netdev[16];	   /* the interface the port follows */
	atomic_int port_state;	   /* enum ibv_port_state */
	int ngids;
	struct ursa_gid gids[URSA_MAX_GIDS];
	struct ursa_keytab keys;
	struct ursa_pinmap pins;
	struct ursa_rcache rcache;	/* parked registrations (rcache.h) */
	atomic_uint_fast64_t pd_handles;
	pthread_mutex_t ctx_lock;
	struct ursa_ctx *ctxs;	   /* open contexts, for port events */
};

struct ursa_engine;
struct ursa_shm_eng;

struct ursa_event {
	struct ibv_async_event ev;
	struct ursa_event *next;
};

/* An event queue read through a file descriptor: completion channels and the
 * async event fd. The eventfd (semaphore mode) counts queued items. */
struct ursa_evq {
	pthread_mutex_t lock;
	int fd;
	void **items;
	uint32_t head, count, cap;
};

/* A completion channel: the public struct and the queue behind its fd. */
struct ursa_channel {
	struct ibv_comp_channel ibv;
	struct ursa_evq q;
};

struct ursa_ctx {
	struct verbs_context vctx; /* context is its last member */
	struct ursa_device *dev;
	struct ursa_engine *eng;
	/* eng's part the same-host transport keeps (transport/shm.h), set
	 * and cleared with eng: the transport reaches it from a QP without
	 * knowing the engine */
	struct ursa_shm_eng *shm;
	ursa_mutex qp_lock;
	struct ursa_qp *qps;	   /* list served by this context's engine */
	struct ursa_evq async;
	atomic_int nobjs;	   /* live objects, for leak checks */
	struct ursa_ctx *next_ctx;
};

struct ursa_pd {
	struct ibv_pd ibv;
	atomic_int refs;	   /* MRs, MWs, QPs, AHs, SRQs using it */
};

enum ursa_mr_state { URSA_MR_VALID = 1, URSA_MR_INVALID = 2 };

struct ursa_mr {
	struct ursa_keyed lk;	   /* keyed by lkey */
	struct ursa_keyed rk;	   /* keyed by rkey */
	struct ibv_mr ibv;
	struct ursa_pd *pd;
	uint64_t iova;
	uintptr_t addr;		   /* process address of iova */
	uint64_t length;
	unsigned int access;
	atomic_int state;
	atomic_int mw_binds;	   /* windows bound to this MR */
	atomic_bool gone;	   /* memory unmapped under it (uffd.h) */
	struct ursa_mtt mtt;
	uintptr_t pin_start, pin_end;	/* page-aligned pinned range, or 0 */
	bool odp;
	bool cached;			/* pins and table came from the rcache */
	struct ursa_shmap_ref shm; /* the memfd that holds it (shmap.h) */
	uint32_t pub_idx;	   /* 1 + entry in the published table (pub.h) */
	void *pub_mem;		   /* the table it is in */
};

enum ursa_mw_state { URSA_MW_FREE = 0, URSA_MW_VALID = 1, URSA_MW_INVALID = 2 };

struct ursa_mw {
	struct ursa_keyed k;
	struct ibv_mw ibv;
	uint32_t key;		   /* the key as the key table holds it */
	struct ursa_pd *pd;
	pthread_mutex_t lock;
	int state;
	struct ursa_mr *mr;	   /* bound MR, with a reference */
	uint64_t addr, length;	   /* bound window, in the MR's iova space */
	unsigned int access;
	uint32_t qpn;		   /* type 2: the QP it is bound to */
};

struct ursa_cq {
	struct ibv_cq_ex ex;	   /* starts with a valid struct ibv_cq */
	pthread_mutex_t lock;
	struct ibv_wc *wc;	   /* ring of completions */
	uint32_t size, head, count;
	int armed;		   /* 0, or 1 + solicited_only */
	bool overflow;
	bool ex_api;		   /* created with ibv_create_cq_ex */
	uint64_t wc_flags_ex;
	struct ibv_wc cur;	   /* the entry between start_poll/end_poll */
	/* IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK): when each entry
	 * of wc[] was completed, CLOCK_MONOTONIC ns (the device clock:
	 * hca_core_clock 1 GHz); NULL when the CQ did not ask. cur_ts:
	 * cur's. */
	uint64_t *ts, cur_ts;
	atomic_uint comp_events;   /* events delivered on the channel */
	atomic_uint async_events;  /* async events read (evq.c) */
	atomic_int refs;	   /* QPs and SRQs attached */
};

struct ursa_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge;
	struct ibv_sge sge[URSA_MAX_SGE];
};

struct ursa_rq {
	struct ursa_ring ring;	   /* of struct ursa_recv_wqe */
	uint32_t max_sge;
};

struct ursa_srq {
	struct ibv_srq ibv;
	struct ursa_pd *pd;
	pthread_mutex_t lock;
	struct ursa_rq rq;
	uint32_t limit;		   /* armed limit, 0 = disarmed */
	atomic_int refs;
	atomic_uint async_events;  /* async events read (evq.c) */
	enum ibv_srq_type type;
	struct ursa_cq *cq;	   /* XRC only */
};

struct ursa_ah {
	struct ibv_ah ibv;
	struct ibv_ah_attr attr;
	struct ursa_pd *pd;
};

/* A send work request as the engine executes it. */
struct ursa_send_wqe {
	uint64_t wr_id;
	uint32_t opcode;	   /* enum ibv_wr_opcode */
	uint32_t flags;		   /* enum ibv_send_flags */
	uint32_t num_sge;
	uint32_t inline_len;
	uint32_t imm;		   /* imm_data (BE) or invalidate rkey */
	uint32_t rkey;
	uint64_t remote_addr;
	uint64_t compare_add, swap;
	/* UD */
	struct ibv_ah_attr av;
	uint32_t remote_qpn, remote_qkey;
	/* BIND_MW */
	struct ursa_mw *mw;
	uint32_t mw_new_rkey;
	struct ibv_mw_bind_info bind;
	/*
	 * The requester's state while the WQE executes. It lives in the
	 * slot rather than beside the QP because slots are reused, one WQE
	 * after another and several in flight at once on RoCEv2: every
	 * post's memset up to sge[] (fill_wqe, and the bind and
	 * ibv_wr_* posts) resets all of it for free, so a new WQE never
	 * sees a field its slot's last occupant left. Keep it above sge[].
	 */
	/* (a) every transport: engine/req.c and core/request.h */
	uint32_t rnr_left, retry_left; /* IBTA retry counts (request.h) */
	uint64_t not_before_ns;	   /* waiting: not to be tried before */
	uint64_t deadline_ns;	   /* in flight: when the answer is overdue
				    * (set by transport/shm.c and
				    * engine/rc_req.c, read by req.c) */
	bool started;		   /* begun, retry counts set (req.c);
				    * core/qp.c reads it to skip the doorbell */
	bool inflight;		   /* sent, awaiting its answer (shm.c,
				    * rc_req.c) */
	bool via_udp;		   /* the target is on another host (req.c);
				    * core/qp.c reads it to skip the doorbell */
	bool refused;		   /* behind the RoCEv2 head, refused before
				    * it left (req.c pipe_walk): it
				    * completes as the head */
	/* (b) one transport's private scratch, named after its owner */
	bool piped;		   /* engine/rc_qp.c, rc_req.c: sent whole,
				    * waiting for its ACK behind others in
				    * the RC pipe */
	struct {		   /* transport/shm.c */
		bool connecting;   /* waiting for the channel */
		uint64_t xfer_off; /* bytes of the message acknowledged */
	} shm;
	struct ibv_sge sge[URSA_MAX_SGE];
	uint8_t inline_data[URSA_MAX_INLINE];
};

struct ursa_qp_counters {
	atomic_uint_fast64_t sends, recvs, writes, reads, atomics;
	atomic_uint_fast64_t tx_bytes, rx_bytes;
	atomic_uint_fast64_t rnr_naks, retries, errors, doorbells;
	/* requester bytes by path: same process, shared-memory slots,
	 * cross-memory attach (one copy between the MRs) */
	atomic_uint_fast64_t loop_bytes, ring_bytes, cma_bytes, direct_bytes;
	atomic_uint_fast64_t map_bytes, map_atomics;
	/* RoCEv2 (engine/rc_*.c) */
	atomic_uint_fast64_t pkts_tx, pkts_rx, naks_seq, naks_inv, naks_access,
		naks_op, rnr_rcvd, drops;
	/* same host, as target (ursa_qp_stats) */
	atomic_uint_fast64_t refused_chans, not_peer;
};

/* Add to a counter whose writers all hold one lock (ctx->qp_lock for the
 * requester's byte counters), readers loading it without: a load and a
 * store, not a locked add on the post's path. */
static inline void ursa_cnt_add(atomic_uint_fast64_t *c, uint64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

struct ursa_qp {
	struct ibv_qp_ex ex;	   /* starts with struct ibv_qp */
	struct ursa_ctx *ctx;
	struct ursa_pd *pd;
	struct ursa_cq *scq, *rcq;
	struct ursa_srq *srq;
	struct ursa_qp *next;	   /* ctx->qps list */
	atomic_int refs;	   /* lookups through the loop transport */
	atomic_uint async_events;  /* async events read (evq.c) */
	bool in_ctx_list;
	/* The MR of the requester's last local SGE (ursa_req_direct and
	 * the engine), and of the responder's last receive SGE (a SEND in
	 * one piece), with no reference: read and written only under
	 * ctx->qp_lock; deregistration and rereg clear them
	 * (ursa_qp_lcache_drop) before the MR changes. */
	struct ursa_mr *lcache, *rcache;
	/* The requester's peer found in another process of this host, and
	 * the registry's generation then (transport/loop.c
	 * ursa_loop_route): under ctx->qp_lock. gen 0: none. */
	struct ursa_route_cache {
		unsigned int gen;
		uint32_t qpn;
		union ibv_gid dgid;
	} route;
	/* Where the direct path last placed data (transport/shm.c): an
	 * rkey and the distance from its remote addresses to our mapping
	 * of them. ursa_req_direct reads them before any check, to ask for
	 * the target's cache line while the checks run; only a prefetch
	 * uses them, never a load or a store, so a stale or torn pair costs
	 * a wasted prefetch and nothing else. */
	atomic_uint dhint_rkey;
	atomic_uintptr_t dhint_delta;
	/* The same idea for SENDs through the slots (transport/shm.c): the
	 * next request slot of the QP's last channel, prefetched when a WR
	 * enters the ring (core/qp.c). Only ever prefetched. */
	_Atomic(void *) shm_hint;

	pthread_mutex_t state_lock; /* modify_qp and engine state changes */
	atomic_int state;	   /* enum ibv_qp_state */
	struct ibv_qp_attr attr;   /* current attributes */
	struct ibv_qp_cap cap;
	bool sq_sig_all;
	bool ex_api;		   /* created with SEND_OPS_FLAGS */
	uint64_t send_ops_flags;
	bool sqd_notify_pending;

	pthread_mutex_t sq_lock;
	struct ursa_ring sq;	   /* of struct ursa_send_wqe */
	/* ibv_wr_* builder state (between wr_start and wr_complete) */
	uint32_t wr_pending;	   /* WQEs written but not yet published */
	int wr_err;

	pthread_mutex_t rq_lock;
	struct ursa_rq rq;

	/* same-host transport (transport/shm.c) */
	int listen_fd;		   /* abstract socket "\0ursa/qp/<qpn>" */
	void *listen_watch;
	struct ursa_chan *chans;   /* channels this QP sends on */
	struct ursa_rc *rc;	   /* RoCEv2 protocol state (engine/rc.h) */
	/* Set, never cleared, the first time RoCEv2 holds an ACK or a
	 * request back for this QP (engine/rc_ack.c): until then a pass need not
	 * call ursa_rc_acks for it (a same-host QP never does). */
	atomic_bool rc_held;
	uint32_t pub_slot;	   /* 1 + QP word in the published table */
	void *pub_mem;

	struct ursa_qp_counters cnt;
};

static inline struct ursa_ctx *to_uctx(struct ibv_context *c)
{
	return container_of(c, struct ursa_ctx, vctx.context);
}
static inline struct ursa_channel *to_uch(struct ibv_comp_channel *c)
{
	return container_of(c, struct ursa_channel, ibv);
}
static inline struct ursa_pd *to_upd(struct ibv_pd *p)
{
	return container_of(p, struct ursa_pd, ibv);
}
static inline struct ursa_mr *to_umr(struct ibv_mr *m)
{
	return container_of(m, struct ursa_mr, ibv);
}
static inline struct ursa_mw *to_umw(struct ibv_mw *m)
{
	return container_of(m, struct ursa_mw, ibv);
}
static inline struct ursa_cq *to_ucq(struct ibv_cq *c)
{
	return container_of((struct ibv_cq_ex *)c, struct ursa_cq, ex);
}
static inline struct ursa_cq *to_ucq_ex(struct ibv_cq_ex *c)
{
	return container_of(c, struct ursa_cq, ex);
}
static inline struct ursa_srq *to_usrq(struct ibv_srq *s)
{
	return container_of(s, struct ursa_srq, ibv);
}
static inline struct ursa_qp *to_uqp(struct ibv_qp *q)
{
	return container_of((struct ibv_qp_ex *)q, struct ursa_qp, ex);
}
static inline struct ursa_qp *to_uqp_ex(struct ibv_qp_ex *q)
{
	return container_of(q, struct ursa_qp, ex);
}
static inline struct ursa_ah *to_uah(struct ibv_ah *a)
{
	return container_of(a, struct ursa_ah, ibv);
}
static inline int qp_state(struct ursa_qp *qp)
{
	return atomic_load_explicit(&qp->state, memory_order_acquire);
}

struct ursa_engine;
/* engine.c: in a fork child, close the sockets of an inherited engine. */

/* device.c */
struct ursa_device *ursa_device_get(void);
int ursa_device_refresh_gids(struct ursa_device *dev);
void ursa_device_attr(struct ursa_device *dev, struct ibv_device_attr *a);
void ursa_port_attr(struct ursa_device *dev, struct ibv_port_attr *a);
int ursa_mtu_bytes(enum ibv_mtu m);

/* evq.c */
int ursa_evq_init(struct ursa_evq *q, bool nonblock);
/* free_item releases items still queued (NULL: not owned). */
void ursa_evq_fini(struct ursa_evq *q, void (*free_item)(void *));
int ursa_evq_push(struct ursa_evq *q, void *item);
/* Pops one item; blocks unless the fd is non-blocking. 0 or -errno.
 * taken (NULL: none) sees the item before the queue's lock is let go,
 * so that a destroy that drops the object's items (ursa_evq_drop) and
 * then waits for what was handed out cannot miss it. */
int ursa_evq_pop(struct ursa_evq *q, void **item, void (*taken)(void *));
/* Drops queued items equal to item; returns how many. */
int ursa_evq_drop(struct ursa_evq *q, void *item);
void ursa_async_event(struct ursa_ctx *ctx, enum ibv_event_type type,
		      void *obj);
/* ibv_get_async_event's pop, counting the event against its object */
int ursa_async_pop(struct ursa_ctx *ctx, struct ibv_async_event **ev);
/* ibv_ack_async_event: the event's object counts it acknowledged */
void ursa_async_acked(const struct ibv_async_event *ev);
/* A destroy verb's part: the object's (a QP's, CQ's or SRQ's) async
 * events not yet read are dropped, and the call waits until each one
 * read has been acknowledged. */
void ursa_async_forget_qp(struct ursa_qp *qp);
void ursa_async_forget_cq(struct ursa_cq *cq);
void ursa_async_forget_srq(struct ursa_srq *srq);

/* mr.c */
int ursa_mr_reg(struct ursa_pd *pd, void *addr, size_t length, uint64_t iova,
		unsigned int access, struct ursa_mr **out);
int ursa_mr_dereg(struct ursa_mr *mr);
int ursa_mr_rereg(struct ursa_mr *mr, int flags, struct ursa_pd *pd,
		  void *addr, size_t length, unsigned int access);
/* The access flags an MR, a window or a QP may carry. */
#define URSA_ACCESS_SUPPORTED                                               \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                 \
	 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |                \
	 IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND | \
	 IBV_ACCESS_HUGETLB | IBV_ACCESS_OPTIONAL_RANGE)
int ursa_access_check(unsigned int access);

/* Result of resolving a key for an access. */
struct ursa_mem_ref {
	struct ursa_keyed *k;	   /* reference to drop */
	struct ursa_mr *mr;
	uintptr_t va;		   /* translated start */
};
enum ursa_mem_err {
	URSA_MEM_OK = 0,
	URSA_MEM_BAD_KEY = -1,	   /* unknown, invalid or deregistered key */
	URSA_MEM_BAD_PD = -2,
	URSA_MEM_BAD_BOUNDS = -3,
	URSA_MEM_BAD_ACCESS = -4,
	URSA_MEM_BAD_QP = -5,	   /* type 2 window bound to another QP */
	URSA_MEM_UNMAPPED = -6,	   /* the MR's memory was unmapped (uffd.h) */
};
/* [start, end) was unmapped under registered memory (uffd.h). */
void ursa_mr_unmapped(uintptr_t start, uintptr_t end);
int ursa_mem_local(struct ursa_pd *pd, const struct ibv_sge *sge,
		   unsigned int need, struct ursa_mem_ref *ref);

/* The address of iova in mr, through the MR's translation table. */
static inline int ursa_mr_translate(struct ursa_mr *mr, uint64_t iova,
				    uint64_t len, uintptr_t *va)
{
	uintptr_t v = mr->addr + (uintptr_t)(iova - mr->iova);

	/* The NIC's view: the page must be in the table. A zero-length
	 * access at the very end names no page and needs no lookup. */
	if (len && ursa_mtt_lookup(&mr->mtt, v) < 0)
		return URSA_MEM_BAD_BOUNDS;
	if (atomic_load_explicit(&mr->gone, memory_order_relaxed))
		return URSA_MEM_UNMAPPED;
	*va = v;
	return URSA_MEM_OK;
}

/* The checks of a local SGE against its MR (IBTA 10.6.3.1). */
static inline int ursa_mr_local_check(struct ursa_mr *mr, struct ursa_pd *pd,
				      const struct ibv_sge *sge,
				      unsigned int need, uintptr_t *va)
{
	if (atomic_load_explicit(&mr->state, memory_order_acquire) !=
	    URSA_MR_VALID)
		return URSA_MEM_BAD_KEY;
	if (mr->pd != pd)
		return URSA_MEM_BAD_PD;
	if (!ursa_in_bounds(mr->iova, mr->length, sge->addr, sge->length))
		return URSA_MEM_BAD_BOUNDS;
	if ((need & IBV_ACCESS_LOCAL_WRITE) &&
	    !(mr->access & IBV_ACCESS_LOCAL_WRITE))
		return URSA_MEM_BAD_ACCESS;
	if (atomic_load_explicit(&mr->gone, memory_order_relaxed))
		return URSA_MEM_UNMAPPED;
	/* No table walk, unlike a remote access (ursa_mr_translate): the
	 * table covers every page of the MR without a gap (mtt.c builds it
	 * so), so the bounds check has proved the entry there, and a post
	 * saves the lookup. */
	*va = mr->addr + (uintptr_t)(sge->addr - mr->iova);
	return URSA_MEM_OK;
}

/* ursa_mem_local_cached's miss: the table, and a hit becomes the cache. */
int ursa_mem_local_fill(struct ursa_qp *qp, struct ursa_mr **slot,
			const struct ibv_sge *sge, unsigned int need,
			struct ursa_mem_ref *ref);

/* ursa_mem_local through one of the QP's caches (*slot: &qp->lcache or
 * &qp->rcache): its MR when the lkey is its own (no key table, no
 * reference: ref->k NULL), else the table, and a hit becomes the cache.
 * Caller holds ctx->qp_lock. Inline: every post's SGEs go through it. */
static inline int ursa_mem_local_cached(struct ursa_qp *qp,
					struct ursa_mr **slot,
					const struct ibv_sge *sge,
					unsigned int need,
					struct ursa_mem_ref *ref)
{
	struct ursa_mr *mr = *slot;

	if (mr && mr->ibv.lkey == sge->lkey) {
		ref->k = NULL;
		ref->mr = mr;
		return ursa_mr_local_check(mr, qp->pd, sge, need, &ref->va);
	}
	return ursa_mem_local_fill(qp, slot, sge, need, ref);
}
/* Forget mr in the shortcut caches of ctx's QPs (takes ctx->qp_lock). */
void ursa_qp_lcache_drop(struct ursa_ctx *ctx, struct ursa_mr *mr);
int ursa_mem_remote(struct ursa_pd *pd, uint32_t qpn, uint32_t rkey,
		    uint64_t va, uint64_t len, unsigned int need,
		    struct ursa_mem_ref *ref);
static inline void ursa_mem_put(struct ursa_mem_ref *r)
{
	if (r->k)
		ursa_keyed_put(r->k);
	r->k = NULL;
}

int ursa_mw_alloc(struct ursa_pd *pd, enum ibv_mw_type type,
		  struct ursa_mw **out);
int ursa_mw_dealloc(struct ursa_mw *mw);
/* Bind (or unbind when bind->length == 0) a window; returns a wc status. */
enum ibv_wc_status ursa_mw_bind(struct ursa_qp *qp, struct ursa_mw *mw,
				uint32_t new_rkey,
				const struct ibv_mw_bind_info *bind);
/* Invalidate a type 2 window or MR by rkey (LOCAL_INV, SEND_WITH_INV). */
int ursa_invalidate(struct ursa_pd *pd, uint32_t qpn, uint32_t rkey);

/* cq.c */
int ursa_cq_create(struct ursa_ctx *ctx, int cqe, struct ibv_comp_channel *ch,
		   void *cq_context, struct ursa_cq **out);
int ursa_cq_destroy(struct ursa_cq *cq);
int ursa_cq_resize(struct ursa_cq *cq, int cqe);
/* Add a completion; -ENOSPC on overflow. solicited: may fire a
 * solicited-only notification. */
int ursa_cq_push(struct ursa_cq *cq, const struct ibv_wc *wc, bool solicited);
int ursa_cq_poll(struct ursa_cq *cq, int n, struct ibv_wc *wc);
void ursa_cq_clean(struct ursa_cq *cq, uint32_t qpn, bool keep_recv);
int ursa_cq_arm(struct ursa_cq *cq, int solicited_only);

/* qp.c */
int ursa_qp_create(struct ursa_ctx *ctx, struct ibv_qp_init_attr_ex *ia,
		   struct ursa_qp **out);
int ursa_qp_destroy(struct ursa_qp *qp);
int ursa_qp_modify(struct ursa_qp *qp, struct ibv_qp_attr *attr, int mask);
int ursa_qp_query(struct ursa_qp *qp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init);
/* Enter ERR (or SQE for UC/UD requester errors) and flush receives. */
void ursa_qp_to_error(struct ursa_qp *qp, bool sq_error_only);
int ursa_post_send(struct ursa_qp *qp, struct ibv_send_wr *wr,
		   struct ibv_send_wr **bad);
int ursa_post_recv(struct ursa_qp *qp, struct ibv_recv_wr *wr,
		   struct ibv_recv_wr **bad);
int ursa_srq_post_recv(struct ursa_srq *srq, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad);
/* Build a WQE from a send WR (shared by ibv_post_send and ibv_wr_*). */
int ursa_wqe_check(struct ursa_qp *qp, const struct ursa_send_wqe *w);
void ursa_sq_publish(struct ursa_qp *qp, uint32_t n);
int ursa_srq_create(struct ursa_pd *pd, struct ibv_srq_init_attr *ia,
		    struct ursa_srq **out);
int ursa_srq_destroy(struct ursa_srq *srq);
int ursa_srq_modify(struct ursa_srq *srq, struct ibv_srq_attr *attr, int mask);

/* qpstate.c: the IBTA modify-QP table (IBTA 10.3.1, 11.2.5.x). */
int ursa_qp_transition_ok(enum ibv_qp_type type, enum ibv_qp_state cur,
			  enum ibv_qp_state next, int mask);

#endif
