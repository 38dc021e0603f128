/* SPDX-License-Identifier: MIT */
/*
 * keytab.h - the device's key table: lkeys and rkeys of MRs and memory windows.
 *
 * A key is 32 bits: the upper 24 bits are an index that names the object, the
 * low 8 bits a "key" byte that the owner may change (ibv_inc_rkey() on a
 * type 2 memory window, IBTA 10.6.7.2.2). Both parts are drawn at random, so a
 * key says nothing about the keys handed out before it (rxe and real NICs hand
 * out sequential indices with at most 8 random bits). An index that was freed
 * stays quarantined for the next URSA_KEY_QUARANTINE frees, so a stale key
 * held by a peer cannot reach a new registration that happens to reuse it.
 *
 * The table is open addressing on the index, guarded by a rwlock: lookups
 * (every data-path access) take it shared, registration takes it exclusive.
 * A successful lookup takes a reference on the object under the lock, so
 * deregistration can remove the key and then wait for in-flight accesses.
 */
#ifndef URSA_KEYTAB_H
#define URSA_KEYTAB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define URSA_KEY_QUARANTINE 4096u

enum ursa_key_kind {
	URSA_KEY_MR_LKEY = 1 << 0,
	URSA_KEY_MR_RKEY = 1 << 1,
	URSA_KEY_MW = 1 << 2,
};

/* Embedded at the start of every keyed object (MR, MW). */
struct ursa_keyed {
	atomic_int refs; /* in-flight accesses holding the object */
};

struct ursa_kt_slot {
	uint32_t key;	   /* full current key */
	uint8_t state;	   /* 0 empty, 1 live, 2 tombstone */
	uint8_t kind;
	uint64_t free_seq; /* for tombstones: when the index was freed */
	struct ursa_keyed *obj;
};

struct ursa_keytab {
	pthread_rwlock_t lock;
	struct ursa_kt_slot *slots;
	uint32_t cap;	/* power of two */
	uint32_t live;
	uint32_t tombs;
	uint64_t frees;	/* number of indices freed so far */
};

int ursa_keytab_init(struct ursa_keytab *kt, uint32_t cap);
void ursa_keytab_fini(struct ursa_keytab *kt);
/* Draw a fresh random key for obj; returns 0 or -errno. */
int ursa_keytab_add(struct ursa_keytab *kt, struct ursa_keyed *obj,
		    uint8_t kind, uint32_t *key);
/* Remove a key (by its index); returns 0 or -ENOENT. */
int ursa_keytab_del(struct ursa_keytab *kt, uint32_t key);
/* Change the low 8 bits of a live key (type 2 MW bind). */
int ursa_keytab_rekey(struct ursa_keytab *kt, uint32_t old_key,
		      uint32_t new_key);
/* Find the object whose current key is exactly key and whose kind is in
 * kind_mask; takes a reference (release with ursa_keyed_put). */
struct ursa_keyed *ursa_keytab_get(struct ursa_keytab *kt, uint32_t key,
				   uint8_t kind_mask, uint8_t *kind);

/* Call fn for every live key of a kind in kind_mask, under the shared lock:
 * the objects cannot be removed meanwhile (fn must not take the table's
 * lock exclusively). */
void ursa_keytab_each(struct ursa_keytab *kt, uint8_t kind_mask,
		      void (*fn)(struct ursa_keyed *obj, void *arg), void *arg);

static inline void ursa_keyed_put(struct ursa_keyed *o)
{
	/* Release: our accesses to the object's memory happen before the
	 * deregistering thread sees the count drop and frees it. */
	atomic_fetch_sub_explicit(&o->refs, 1, memory_order_release);
}

#endif
