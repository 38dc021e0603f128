/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the process's QPN table and the choice of transport for a
 * destination (loop.c): this process, another process of the host, or
 * another host.
 */
#ifndef URSA_LOOP_H
#define URSA_LOOP_H

#include "../core/core.h"

/* QPN registry (host-wide) and in-process delivery. */
int ursa_loop_add(struct ursa_qp *qp);
void ursa_loop_del(struct ursa_qp *qp);
bool ursa_gid_is_local(const union ibv_gid *g);
void ursa_loop_atfork_child(void);
/* Target QP for (dgid, qpn) with a reference, or NULL when unreachable. */
struct ursa_qp *ursa_loop_get(const union ibv_gid *dgid, uint32_t qpn);
/* Which transport reaches (dgid, qpn) from qp: this process (*t: the
 * target, with a reference), another process on this host, or another
 * host. cache (a requester under ctx->qp_lock): remember "another
 * process" in qp->route until this process adds a QP, so a connected
 * QP's requests skip the lookup and its lock. */
enum ursa_route { URSA_ROUTE_LOOP, URSA_ROUTE_SHM, URSA_ROUTE_UDP };
enum ursa_route ursa_loop_route(struct ursa_qp *qp, const union ibv_gid *dgid,
				uint32_t qpn, bool cache, struct ursa_qp **t);
void ursa_loop_put(struct ursa_qp *qp);

#endif
