// SPDX-License-Identifier: MIT
/*
 * pub.c - the table a process publishes for same-host requesters: its MRs'
 * rkeys and its served QPs' states (design in pub.h).
 *
 * The owner writes under one mutex; readers are other processes and take no
 * lock: QP words are single 64-bit atomics, MR entries are read under their
 * sequence lock and thrown away if it moved.
 */
#include "pub.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

static pthread_mutex_t pub_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ursa_pubmem *pub;	/* ours, or NULL */
static int pub_memfd = -1;
static bool pub_failed;

static bool pub_enabled(void)
{
	/* Requesters that may not use cross-memory attach can still use
	 * the MRs whose pages they can map. */
	return ursa_cfg()->direct;
}

static void life_init(pthread_mutex_t *l)
{
	pthread_mutexattr_t a;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(l, &a);
	pthread_mutexattr_destroy(&a);
	pthread_mutex_lock(l);
}

/* Called with pub_lock held. */
static struct ursa_pubmem *pub_get(void)
{
	void *p;
	int fd;

	if (pub || pub_failed)
		return pub;
	pub_failed = true;	/* until it worked */
	if (!pub_enabled())
		return NULL;
	/* Its size never changes (a peer that mapped it cannot be made to
	 * fault by a shrink), and only this process writes it: a peer that
	 * was sent the descriptor cannot forge an entry that redirects
	 * another peer's WRITE. */
	fd = ursa_memfd_shared("ursa-pub", sizeof(*pub), true, &p);
	if (fd < 0)
		return NULL;
	pub = p;
	pub->magic = URSA_PUB_MAGIC;
	pub->nqp = URSA_PUB_QPS;
	pub->nmr = URSA_PUB_MRS;
	life_init(&pub->life);
	pub_memfd = fd;
	pub_failed = false;
	return pub;
}

/* Called with pub_lock held: hold the life mutex again if the thread that
 * held it has exited (the process lives: it is calling us). */
static void life_hold(struct ursa_pubmem *m)
{
	if (m && pthread_mutex_trylock(&m->life) == EOWNERDEAD)
		pthread_mutex_consistent(&m->life);
}

int ursa_pub_fd(void)
{
	int fd;

	pthread_mutex_lock(&pub_lock);
	fd = pub_get() ? pub_memfd : -ENOSYS;
	pthread_mutex_unlock(&pub_lock);
	return fd;
}

static uint32_t mr_hash(uint32_t rkey)
{
	return (rkey * 0x9e3779b1u) >> 20;	/* 12 bits: URSA_PUB_MRS */
}

/* Sequence-lock writer: readers that overlap see an odd or a changed seq. */
static void ent_write(struct ursa_pub_mr *e, const struct ursa_pub_mr *v)
{
	unsigned int s = atomic_load_explicit(&e->seq, memory_order_relaxed);

	atomic_store_explicit(&e->seq, s + 1, memory_order_relaxed);
	/* Orders the odd seq before the field stores (a reader that sees
	 * any new field also sees the odd seq or a later one). */
	atomic_thread_fence(memory_order_release);
	__atomic_store_n(&e->rkey, v->rkey, __ATOMIC_RELAXED);
	__atomic_store_n(&e->pd, v->pd, __ATOMIC_RELAXED);
	__atomic_store_n(&e->access, v->access, __ATOMIC_RELAXED);
	__atomic_store_n(&e->iova, v->iova, __ATOMIC_RELAXED);
	__atomic_store_n(&e->length, v->length, __ATOMIC_RELAXED);
	__atomic_store_n(&e->addr, v->addr, __ATOMIC_RELAXED);
	__atomic_store_n(&e->map_fd, v->map_fd, __ATOMIC_RELAXED);
	__atomic_store_n(&e->map_ino, v->map_ino, __ATOMIC_RELAXED);
	__atomic_store_n(&e->map_start, v->map_start, __ATOMIC_RELAXED);
	__atomic_store_n(&e->map_len, v->map_len, __ATOMIC_RELAXED);
	/* seq_cst: the even seq (and, on removal, rkey 0) is ordered before
	 * the owner's later loads of the requesters' busy flags (the Dekker
	 * pair with direct_xfer in shm.c). */
	atomic_store_explicit(&e->seq, s + 2, memory_order_seq_cst);
}

void ursa_pub_mr_add(struct ursa_mr *mr)
{
	struct ursa_pub_mr v = { 0 };
	struct ursa_pubmem *m;

	if (!(mr->access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC)))
		return;
	pthread_mutex_lock(&pub_lock);
	m = pub_get();
	life_hold(m);
	if (m && !mr->pub_idx) {
		uint32_t h = mr_hash(mr->ibv.rkey);

		for (uint32_t i = 0; i < URSA_PUB_PROBE; i++) {
			uint32_t k = (h + i) & (URSA_PUB_MRS - 1);

			if (m->mr[k].rkey)
				continue;
			v.rkey = mr->ibv.rkey;
			v.pd = mr->pd->ibv.handle;
			v.access = mr->access;
			v.iova = mr->iova;
			v.length = mr->length;
			v.addr = mr->addr;
			if (mr->shm.fd >= 0) {
				v.map_fd = mr->shm.fd;
				v.map_ino = mr->shm.ino;
				v.map_start = mr->shm.start;
				v.map_len = mr->shm.len;
			}
			ent_write(&m->mr[k], &v);
			mr->pub_idx = k + 1;
			mr->pub_mem = m;
			break;
		}
		/* A crowded neighbourhood: the MR is reached through the
		 * target's engine only. */
	}
	pthread_mutex_unlock(&pub_lock);
}

bool ursa_pub_mr_del(struct ursa_mr *mr)
{
	struct ursa_pub_mr v = { 0 };
	bool was = false;

	pthread_mutex_lock(&pub_lock);
	/* After fork the child's MRs point into the parent's table. */
	if (mr->pub_idx && mr->pub_mem == pub && pub) {
		ent_write(&pub->mr[mr->pub_idx - 1], &v);
		atomic_fetch_add_explicit(&pub->gen, 1, memory_order_release);
		was = true;
	}
	mr->pub_idx = 0;
	mr->pub_mem = NULL;
	pthread_mutex_unlock(&pub_lock);
	return was;
}

static uint64_t qp_word(struct ursa_qp *qp)
{
	int st = atomic_load_explicit(&qp->state, memory_order_acquire);
	unsigned int acc = qp->attr.qp_access_flags;
	uint32_t f = 0;

	if (st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
	    st == IBV_QPS_SQE)
		f |= URSA_PUBQ_ACCEPT;
	if (acc & IBV_ACCESS_REMOTE_WRITE)
		f |= URSA_PUBQ_WRITE;
	/* IBTA 9.7.5.1.1: READs need responder resources too */
	if ((acc & IBV_ACCESS_REMOTE_READ) && qp->attr.max_dest_rd_atomic)
		f |= URSA_PUBQ_READ;
	if ((acc & IBV_ACCESS_REMOTE_ATOMIC) && qp->attr.max_dest_rd_atomic)
		f |= URSA_PUBQ_ATOMIC;
	return (qp->ex.qp_base.qp_num & 0xffffffu) | (uint64_t)f << 24 |
	       (uint64_t)qp->pd->ibv.handle << 32;
}

int ursa_pub_qp_slot(struct ursa_qp *qp)
{
	struct ursa_pubmem *m;
	int ret = -ENOSPC;

	pthread_mutex_lock(&pub_lock);
	m = pub_get();
	life_hold(m);
	if (!m) {
		ret = -ENOSYS;
	} else if (qp->pub_slot && qp->pub_mem == m) {
		ret = (int)qp->pub_slot - 1;
	} else {
		for (uint32_t i = 0; i < URSA_PUB_QPS; i++) {
			if (atomic_load_explicit(&m->qp[i], memory_order_relaxed))
				continue;
			qp->pub_slot = i + 1;
			qp->pub_mem = m;
			atomic_store_explicit(&m->qp[i], qp_word(qp),
					      memory_order_release);
			ret = (int)i;
			break;
		}
	}
	pthread_mutex_unlock(&pub_lock);
	return ret;
}

void ursa_pub_qp_update(struct ursa_qp *qp)
{
	pthread_mutex_lock(&pub_lock);
	if (qp->pub_slot && qp->pub_mem == pub && pub)
		atomic_store_explicit(&pub->qp[qp->pub_slot - 1], qp_word(qp),
				      memory_order_release);
	pthread_mutex_unlock(&pub_lock);
}

void ursa_pub_qp_free(struct ursa_qp *qp)
{
	pthread_mutex_lock(&pub_lock);
	if (qp->pub_slot && qp->pub_mem == pub && pub)
		atomic_store_explicit(&pub->qp[qp->pub_slot - 1], 0,
				      memory_order_release);
	qp->pub_slot = 0;
	qp->pub_mem = NULL;
	pthread_mutex_unlock(&pub_lock);
}

void ursa_pub_atfork_child(void)
{
	/* The mapping is the parent's table, shared: the child must not
	 * write into it. It starts a table of its own on demand. */
	pthread_mutex_init(&pub_lock, NULL);
	if (pub)
		munmap(pub, sizeof(*pub));
	if (pub_memfd >= 0)
		close(pub_memfd);
	pub = NULL;
	pub_memfd = -1;
	pub_failed = false;
}

/* --- requester side -------------------------------------------------------- */

const struct ursa_pubmem *ursa_pub_map(int fd)
{
	struct ursa_pubmem *m;

	/* The peer chose the object: it must be at least as large as what we
	 * read and sealed against shrinking, or it could SIGBUS us, and
	 * sealed against writes by anyone but its owner, or a third process
	 * holding it could have forged what we are about to follow. (An
	 * owner that lies can only hurt itself: the entries name its own
	 * memory.) */
	m = ursa_memfd_map_peer(fd, sizeof(*m), F_SEAL_FUTURE_WRITE, false);
	if (!m)
		return NULL;
	if (m->magic != URSA_PUB_MAGIC || m->nqp != URSA_PUB_QPS ||
	    m->nmr != URSA_PUB_MRS) {
		munmap(m, sizeof(*m));
		return NULL;
	}
	return m;
}

void ursa_pub_unmap(const struct ursa_pubmem *m)
{
	if (m)
		munmap((void *)m, sizeof(*m));
}

bool ursa_pub_find(const struct ursa_pubmem *m, uint32_t rkey,
		   struct ursa_pub_mr *out, uint32_t *where, unsigned int *seq)
{
	uint32_t h = mr_hash(rkey);

	if (!rkey)
		return false;
	for (uint32_t i = 0; i < URSA_PUB_PROBE; i++) {
		uint32_t at = (h + i) & (URSA_PUB_MRS - 1);
		const struct ursa_pub_mr *e = &m->mr[at];
		unsigned int s1, s2;

		s1 = atomic_load_explicit((atomic_uint *)&e->seq,
					  memory_order_acquire);
		if (s1 & 1)
			return false;	/* being rewritten: go the slow way */
		out->rkey = __atomic_load_n(&e->rkey, __ATOMIC_RELAXED);
		out->pd = __atomic_load_n(&e->pd, __ATOMIC_RELAXED);
		out->access = __atomic_load_n(&e->access, __ATOMIC_RELAXED);
		out->iova = __atomic_load_n(&e->iova, __ATOMIC_RELAXED);
		out->length = __atomic_load_n(&e->length, __ATOMIC_RELAXED);
		out->addr = __atomic_load_n(&e->addr, __ATOMIC_RELAXED);
		out->map_fd = __atomic_load_n(&e->map_fd, __ATOMIC_RELAXED);
		out->map_ino = __atomic_load_n(&e->map_ino, __ATOMIC_RELAXED);
		out->map_start = __atomic_load_n(&e->map_start, __ATOMIC_RELAXED);
		out->map_len = __atomic_load_n(&e->map_len, __ATOMIC_RELAXED);
		/* Orders the field loads before the second seq load. */
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit((atomic_uint *)&e->seq,
					  memory_order_relaxed);
		if (s1 != s2)
			return false;
		if (out->rkey == rkey) {
			*where = at;
			*seq = s1;
			return true;
		}
	}
	return false;
}
