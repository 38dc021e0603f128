/* SPDX-License-Identifier: MIT */
/*
 * cma.h - ursa's librdmacm: the objects shared by its files.
 *
 * cma.c is the API (ids, event channels, the calls of <rdma/rdma_cma.h>),
 * cm.c the IB CM protocol under it (a thread that owns the ids' sockets,
 * runs the connection state machine and retransmits), addr.c address and
 * route resolution, rdma_getaddrinfo and the endpoint calls. One mutex
 * (cma_lock) guards every id, channel and event: connection management
 * is not a data path.
 */
#ifndef URSA_RDMACM_CMA_H
#define URSA_RDMACM_CMA_H

#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdbool.h>
#include <stdint.h>

#include "../proto/cm.h"

#define CMA_EXPORT __attribute__((visibility("default")))

/* The id's place in a connection (rdma_cm's states, IBTA 12.9's beneath) */
enum cma_state {
	CS_IDLE, CS_BOUND, CS_ADDR, CS_ROUTE, CS_LISTEN,
	CS_REQ_SENT,		/* active: REQ out, waiting for REP */
	CS_REP_RCVD,		/* active: REP in, app owns the QP (RTU owed) */
	CS_REQ_RCVD,		/* passive: CONNECT_REQUEST given to the app */
	CS_REP_SENT,		/* passive: REP out, waiting for RTU */
	CS_SIDR_SENT,		/* active UD: SIDR_REQ out */
	CS_ESTABLISHED,
	CS_DREQ_SENT,		/* rdma_disconnect: DREQ out, waiting for DREP */
	CS_DREQ_RCVD,		/* DREQ in: DISCONNECTED given, DREP owed */
	CS_DISCONNECTED,	/* done (timewait has no wire state here) */
};

struct cma_chan {
	struct rdma_event_channel ch;	/* fd: eventfd, one count an event */
	struct cma_event *head, *tail;
	bool own;			/* a sync id's private channel */
	/* Threads inside rdma_get_cm_event; a channel destroyed while
	 * there are some is freed by the last one out (dead). */
	int waiters;
	bool dead;
};

struct cma_event {
	struct rdma_cm_event ev;
	struct cma_event *next;
	struct cma_id *owner;		/* whose counts it moves */
	uint8_t priv[CM_PRIV_MAX];
};

struct cma_id {
	struct rdma_cm_id id;		/* first: the app holds &id */
	struct cma_chan *chan;
	struct cma_id *next;		/* every live id (cma_ids) */
	enum cma_state state;
	bool sync, destroying, afonly, reuse;
	int backlog, pending;		/* listeners: requests not yet taken */
	unsigned reported, acked;	/* events handed out / acknowledged */

	/* the port it holds (service ID socket) and its connection */
	int sfd;			/* "ursa/cm/s/<sid>", -1 if unbound */
	uint16_t port;			/* host order */
	int cfd;			/* "ursa/cm/c/<comm id>", -1 if none */
	uint32_t lcid, rcid;		/* local and remote comm IDs */
	uint64_t tid, rguid;
	uint8_t sgid_index;
	uint32_t rqpn;			/* peer's QPN */
	uint32_t psn;			/* ours: what we receive first */
	uint32_t rpsn;			/* theirs: what we send first */
	uint8_t resp_res, init_depth;	/* negotiated, as this side applies */
	uint8_t retry, rnr_retry, mtu, ack_timeout, tos;
	bool tos_set, ack_timeout_set, srq;
	struct cma_id *listener;	/* a passive id's listener */
	struct ibv_sa_path_rec path;

	/* the message retransmitted until answered (REQ, REP, DREQ, SIDR_REQ) */
	uint8_t out[CM_MAD_LEN];
	int out_left;			/* sends left, 0: nothing owed */
	uint64_t out_due;		/* ns */
	unsigned out_ms;
	int sid_retries;		/* REJ "invalid service ID" taken again */

	/* rdma_create_ep (passive): the QP each request gets */
	struct ibv_qp_init_attr *ep_qp_attr;
	struct ibv_pd *ep_pd;
};

extern pthread_mutex_t cma_lock;
extern pthread_cond_t cma_cond;		/* acks and sync completions */
extern struct cma_id *cma_ids;

/* cma.c */
void cma_queue(struct cma_id *id, enum rdma_cm_event_type t, int status,
	       const struct cm_msg *m, struct cma_event **out);
struct ibv_context *cma_ctx(void);
struct ibv_pd *cma_default_pd(void);
void cma_set_dev(struct cma_id *id);
int cma_modify_qp_rtr_rts(struct cma_id *id);
int cma_qp_to_error(struct cma_id *id);
int cma_errno(int neg);
int cma_own_channel(struct cma_id *id);

/* rsocket.c: its descriptor table across fork() (cma.c) */
void rs_fork_prepare(void);
void rs_fork_parent(void);
void rs_fork_child(void);

/* cm.c: the protocol. Called with cma_lock held unless said otherwise. */
int cm_start(void);			/* the thread, once */
void cm_fork_child(void);		/* forget the parent's thread */
void cm_wake(void);
int cm_bind_port(struct cma_id *id, uint16_t port);	/* 0: ephemeral */
int cm_new_comm_id(struct cma_id *id);
void cm_close(struct cma_id *id);
int cm_send_req(struct cma_id *id, const struct rdma_conn_param *p);
int cm_send_rep(struct cma_id *id, const struct rdma_conn_param *p);
int cm_send_rtu(struct cma_id *id);
int cm_send_rej(struct cma_id *id, const void *priv, uint8_t len,
		uint16_t reason);
int cm_send_dreq(struct cma_id *id);
int cm_send_drep(struct cma_id *id);
int cm_send_sidr_req(struct cma_id *id, const struct rdma_conn_param *p);
int cm_send_sidr_rep(struct cma_id *id, const struct rdma_conn_param *p,
		     uint8_t status, const void *priv, uint8_t len);
uint64_t cm_node_guid(void);
void cm_fill_ud(struct cma_id *id, struct rdma_ud_param *ud,
		const union ibv_gid *dgid, uint32_t qpn, uint32_t qkey);

/* addr.c */
bool addr_is_loopback(const struct sockaddr *sa);
int addr_gid(const struct sockaddr *sa, union ibv_gid *g);
int addr_port_of(const struct sockaddr *sa);
void addr_set_port(struct sockaddr *sa, uint16_t port);
socklen_t addr_len(const struct sockaddr *sa);
int addr_local_gid_index(const union ibv_gid *g);
int addr_resolve(struct cma_id *id, const struct sockaddr *src,
		 const struct sockaddr *dst);
void addr_route(struct cma_id *id);
void addr_from_gid(struct sockaddr_storage *ss, const uint8_t g[16],
		   uint16_t port);

#endif
