/* SPDX-License-Identifier: MIT */
/*
 * pub.h - what a process publishes to same-host requesters so that they can
 * place RDMA WRITE and READ data themselves ("direct" path, transport/shm.c).
 *
 * One memfd per process, shared read-only with every requester that opened
 * a channel to one of its QPs. It holds:
 *  - one word per served QP: QPN, PD handle, "accepts requests" and the
 *    QP's remote access flags;
 *  - one entry per MR: rkey, PD handle, access flags, iova, length and the
 *    process address of the iova, under a per-entry sequence lock.
 * A requester that finds the rkey, a matching PD, the rights and the bounds
 * in here copies straight into (or out of) the target process, without
 * waking the target: by memcpy (and atomics by locked instructions) when the
 * MR's pages are in a memfd it can map (shmap.h), by process_vm_writev/readv
 * otherwise. Anything it cannot
 * prove from the table goes the ordinary way (the target's engine and its
 * responder), which makes the table an optimisation that can only say "yes"
 * to what the responder would also allow, never a second set of rules.
 *
 * Deregistration: the owner removes the entry, then waits for requesters
 * that may have read it before (ursa_shm_quiesce: each requester raises a
 * flag in its channel before reading the table and lowers it after its copy;
 * a Dekker pair of seq_cst stores and loads).
 *
 * Trust: a requester that can use process_vm_writev on the target can
 * ptrace it, so a malicious one could write anywhere anyway; the table adds
 * no power. The requester still bounds every index and length it reads from
 * the table, and a table from a broken peer can only make it write into
 * that peer.
 */
#ifndef URSA_PUB_H
#define URSA_PUB_H

#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../util/limits.h"

#define URSA_PUB_MAGIC 0x55505532u /* "UPU2" */

/* QP word: qpn (24 bits) | flags << 24 | pd << 32. */
#define URSA_PUBQ_ACCEPT (1u << 0)	/* RTR, RTS, SQD or SQE */
#define URSA_PUBQ_WRITE (1u << 1)	/* qp_access_flags remote write */
#define URSA_PUBQ_READ (1u << 2)	/* remote read, and max_dest_rd_atomic > 0 */
#define URSA_PUBQ_ATOMIC (1u << 3)	/* remote atomic, and max_dest_rd_atomic > 0 */

struct ursa_pub_mr {
	atomic_uint seq;	/* odd while the owner rewrites the entry */
	uint32_t rkey;		/* 0: free */
	uint32_t pd;
	uint32_t access;
	uint64_t iova, length, addr;
	/* The memfd that holds the MR's whole pages (shmap.h), mapped at
	 * map_start for map_len bytes; map_len 0: none. */
	int32_t map_fd;
	uint32_t pad;
	uint64_t map_ino, map_start, map_len;
};

struct ursa_pubmem {
	uint32_t magic, nqp, nmr;
	atomic_uint gen;	/* bumped at every MR removal: requesters then
				 * drop the mappings nothing names any more */
	/* Held by one of the owner's threads (a robust, process-shared
	 * mutex): when that thread or the process dies, the kernel marks
	 * its futex word (FUTEX_OWNER_DIED) before the process's sockets
	 * close. A requester reads the word and takes the direct path only
	 * while the owner lives: a WRITE into a dead process's pages must
	 * not complete with success. The owner takes it back if only the
	 * thread had died (ursa_pub_mr_add, ursa_pub_qp_slot). */
	pthread_mutex_t life;
	_Atomic uint64_t qp[URSA_PUB_QPS];
	struct ursa_pub_mr mr[URSA_PUB_MRS];
};

struct ursa_mr;
struct ursa_qp;

/* Owner side. All calls are cheap no-ops when publishing is off or full. */
int ursa_pub_fd(void);			/* the memfd (created on demand) */
void ursa_pub_mr_add(struct ursa_mr *mr);
bool ursa_pub_mr_del(struct ursa_mr *mr);	/* true if it was published */
int ursa_pub_qp_slot(struct ursa_qp *qp); /* slot index, or -errno */
void ursa_pub_qp_update(struct ursa_qp *qp);
void ursa_pub_qp_free(struct ursa_qp *qp);
void ursa_pub_atfork_child(void);

/* Requester side: map a peer's table (checked), find an rkey. */
const struct ursa_pubmem *ursa_pub_map(int fd);
void ursa_pub_unmap(const struct ursa_pubmem *m);

/* glibc: a mutex's futex word is its first int (bits/struct_mutex.h); the
 * kernel's robust-futex protocol gives the word's meaning: the holder's
 * TID, FUTEX_OWNER_DIED once the holder died. Inline: the direct path
 * reads it before every copy. */
_Static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0,
	       "pthread_mutex_t starts with its futex word");

static inline bool ursa_pub_alive(const struct ursa_pubmem *m)
{
	uint32_t w = __atomic_load_n((const uint32_t *)(const void *)&m->life,
				     __ATOMIC_RELAXED);

	return (w & FUTEX_TID_MASK) && !(w & FUTEX_OWNER_DIED);
}

/* *out: a consistent copy of rkey's entry; *where: its index in mr[],
 * *seq: its sequence number when copied (for ursa_pub_same). */
bool ursa_pub_find(const struct ursa_pubmem *m, uint32_t rkey,
		   struct ursa_pub_mr *out, uint32_t *where, unsigned int *seq);

/* Whether mr[where] still holds what was copied at seq: a writer moves seq
 * twice per rewrite and never back, so an equal seq is an unchanged entry.
 * Acquire: the caller's later uses follow the check. */
static inline bool ursa_pub_same(const struct ursa_pubmem *m, uint32_t where,
				 unsigned int seq)
{
	return atomic_load_explicit((atomic_uint *)&m->mr[where].seq,
				    memory_order_acquire) == seq;
}

#endif
