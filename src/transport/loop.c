// SPDX-License-Identifier: MIT
/*
 * loop.c - the in-process transport: QPN allocation and delivery to QPs of
 * the same process (any context).
 *
 * QPNs are 24-bit, drawn at random; 0 and 1 are reserved by IBTA for
 * SMI/GSI. They are unique on the host: a QPN is taken only when its
 * abstract socket name could be bound (transport/shm.c), which is also how
 * other processes find the QP. A requester resolves (destination GID,
 * destination QPN): the GID must be one of this host's GIDs, and the QPN
 * must name a live QP. The lookup takes a reference that keeps the target
 * QP alive while the responder executes; ursa_qp_destroy removes the QP from
 * the table and then waits for the references to drain.
 */
#include "shm.h"
#include "udp.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBUCKETS 4096

struct bucket_ent {
	struct ursa_qp *qp;
	struct bucket_ent *next;
};

static pthread_rwlock_t tab_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct bucket_ent *buckets[NBUCKETS];
/* Moves at every QP added here (under tab_lock): a peer found elsewhere
 * stays elsewhere until it does (ursa_loop_route). */
static atomic_uint tab_gen = 1;

static struct bucket_ent **bucket(uint32_t qpn)
{
	return &buckets[(qpn * 2654435761u) >> 20 & (NBUCKETS - 1)];
}

static struct ursa_qp *find_locked(uint32_t qpn)
{
	for (struct bucket_ent *e = *bucket(qpn); e; e = e->next)
		if (e->qp->ex.qp_base.qp_num == qpn)
			return e->qp;
	return NULL;
}

int ursa_loop_add(struct ursa_qp *qp)
{
	struct bucket_ent *e = malloc(sizeof(*e));

	if (!e)
		return -ENOMEM;
	pthread_rwlock_wrlock(&tab_lock);
	for (int tries = 0;; tries++) {
		uint32_t qpn = (uint32_t)ursa_rand64() & 0xffffff;
		int ret;

		if (qpn < 2 || find_locked(qpn))
			continue;
		/* Host-wide uniqueness: the QPN's socket name is free. */
		ret = ursa_shm_listen(qp, qpn);
		if (ret == -EADDRINUSE && tries < 1000)
			continue;
		if (ret) {
			pthread_rwlock_unlock(&tab_lock);
			free(e);
			return ret;
		}
		qp->ex.qp_base.qp_num = qpn;
		break;
	}
	e->qp = qp;
	e->next = *bucket(qp->ex.qp_base.qp_num);
	*bucket(qp->ex.qp_base.qp_num) = e;
	atomic_fetch_add_explicit(&tab_gen, 1, memory_order_relaxed);
	pthread_rwlock_unlock(&tab_lock);
	return 0;
}

void ursa_loop_del(struct ursa_qp *qp)
{
	struct bucket_ent **pp, *e = NULL;

	pthread_rwlock_wrlock(&tab_lock);
	for (pp = bucket(qp->ex.qp_base.qp_num); *pp; pp = &(*pp)->next)
		if ((*pp)->qp == qp) {
			e = *pp;
			*pp = e->next;
			break;
		}
	pthread_rwlock_unlock(&tab_lock);
	free(e);
	/* Acquire: pairs with ursa_loop_put's release, so the responder's
	 * last touch of the QP happens before the caller frees it. */
	while (atomic_load_explicit(&qp->refs, memory_order_acquire) > 0)
		sched_yield();
}

bool ursa_gid_is_local(const union ibv_gid *g)
{
	struct ursa_device *dev = ursa_device_get();

	for (int i = 0; i < dev->ngids; i++)
		if (!memcmp(dev->gids[i].gid.raw, g->raw, 16))
			return true;
	return false;
}

/* This process's QP qpn, with a reference, or NULL. */
static struct ursa_qp *get_ref(uint32_t qpn)
{
	struct ursa_qp *qp;

	pthread_rwlock_rdlock(&tab_lock);
	qp = find_locked(qpn & 0xffffff);
	if (qp)
		atomic_fetch_add_explicit(&qp->refs, 1, memory_order_relaxed);
	pthread_rwlock_unlock(&tab_lock);
	return qp;
}

struct ursa_qp *ursa_loop_get(const union ibv_gid *dgid, uint32_t qpn)
{
	return ursa_gid_is_local(dgid) ? get_ref(qpn) : NULL;
}

enum ursa_route ursa_loop_route(struct ursa_qp *qp, const union ibv_gid *dgid,
			       uint32_t qpn, bool cache, struct ursa_qp **t)
{
	unsigned int g = atomic_load_explicit(&tab_gen, memory_order_relaxed);
	struct ursa_route_cache *rc = &qp->route;

	*t = NULL;
	qpn &= 0xffffff;
	/* (a generation read before a concurrent add may miss a QP created
	 * at the same time as this request: either order is one the
	 * application could have seen) */
	if (cache && rc->gen == g && rc->qpn == qpn &&
	    !memcmp(rc->dgid.raw, dgid->raw, 16))
		return URSA_ROUTE_SHM;
	if (!ursa_gid_is_local(dgid))
		return URSA_ROUTE_UDP;
	if ((*t = get_ref(qpn)))
		return URSA_ROUTE_LOOP;
	if (cache) {
		rc->gen = g;
		rc->qpn = qpn;
		rc->dgid = *dgid;
	}
	return URSA_ROUTE_SHM;
}

/*
 * fork(): the child inherits copies of the parent's QPs, channels and
 * sockets, but no engine thread serves them. The child must neither
 * deliver to the copies (they are the parent's QPs) nor keep the parent's
 * sockets open (a dead parent's QPNs would stay taken), so it drops every
 * inherited registration. Memory of the copies is left alone: freeing
 * objects another thread was using at fork time is not safe.
 */
__attribute__((constructor)) static void loop_hooks(void)
{
	ursa_hooks.qp_add = ursa_loop_add;
	ursa_hooks.qp_del = ursa_loop_del;
	ursa_hooks.loop_atfork_child = ursa_loop_atfork_child;
}

void ursa_loop_atfork_child(void)
{
	for (unsigned b = 0; b < NBUCKETS; b++) {
		while (buckets[b]) {
			struct bucket_ent *e = buckets[b];

			buckets[b] = e->next;
			ursa_hooks.rc_qp_forget(e->qp);
			if (e->qp->listen_fd >= 0)
				close(e->qp->listen_fd);
			for (struct ursa_chan *c = e->qp->chans; c; c = c->next)
				if (c->sock >= 0)
					close(c->sock);
			free(e);
		}
	}
	pthread_rwlock_init(&tab_lock, NULL);
}

void ursa_loop_put(struct ursa_qp *qp)
{
	atomic_fetch_sub_explicit(&qp->refs, 1, memory_order_release);
}
