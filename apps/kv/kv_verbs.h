/* SPDX-License-Identifier: MIT */
/*
 * kv_verbs.h - the verbs steps the ursa-kv server and client share
 * (kv_common.c) and the server's table (kv_table.c).
 */
#ifndef URSA_KV_VERBS_H
#define URSA_KV_VERBS_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "kv.h"

struct kv_ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int gid_index;
	union ibv_gid gid;
	enum ibv_mtu mtu;
};

/* Open the device, find the GID of the local address, allocate a PD. */
int kv_ep_open(struct kv_ep *e, const struct sockaddr_storage *local);
void kv_ep_close(struct kv_ep *e);
struct ibv_qp *kv_qp_create(struct kv_ep *e, struct ibv_cq *cq, uint32_t depth);
/* INIT -> RTR -> RTS towards (qpn, gid); 0 or -errno. */
int kv_qp_connect(struct kv_ep *e, struct ibv_qp *qp, uint32_t qpn,
		  const uint8_t gid[16]);

/* --- the server's table (kv_table.c) -------------------------------------- */

#define KV_MIN_CLASS 6		/* blocks of 64 bytes ... */
#define KV_MAX_CLASS 21		/* ... to 2 MiB (a 1 MiB value and its header) */
#define KV_CLASSES (KV_MAX_CLASS + 1)

/* Freed blocks wait here before they can be reused (time order). */
struct kv_quarantine {
	struct { uint64_t off; uint8_t cls; double t; } *v;
	size_t head, n, cap;
};

struct kv_table {
	uint8_t *base;		/* the registered region */
	size_t len;
	struct kv_table_hdr *hdr;
	struct kv_bucket *b;
	uint8_t *heap;
	uint64_t heap_len;	/* a multiple of 2 MiB */
	/* buddy allocator: free lists linked through the free blocks,
	 * and per 64-byte unit the class of the free block starting there */
	uint64_t head[KV_CLASSES];	/* offset + 1; 0: empty */
	uint8_t *free_cls;
	struct kv_quarantine q;
	uint64_t nkeys;
};

int kv_table_init(struct kv_table *t, uint64_t nbuckets, uint64_t heap_len);
void kv_table_free(struct kv_table *t);
/* The live slot of key, or NULL. */
struct kv_slot *kv_table_find(struct kv_table *t, const void *key, uint32_t klen);
/* A block for key and a value of vlen bytes: its offset, or -ENOSPC. The
 * value goes at kv_table_val(t, off, klen) before kv_table_install. */
int64_t kv_table_alloc(struct kv_table *t, uint32_t klen, uint32_t vlen);
void kv_table_release(struct kv_table *t, uint64_t off, uint32_t klen,
		      uint32_t vlen);
uint8_t *kv_table_val(struct kv_table *t, uint64_t off, uint32_t klen);
/* Write the block's header and key, then switch key's slot to it.
 * KV_OK or KV_ENOSPC (bucket full; the block is released). */
int kv_table_install(struct kv_table *t, const void *key, uint32_t klen,
		     uint64_t off, uint32_t vlen);
int kv_table_del(struct kv_table *t, const void *key, uint32_t klen);

#endif
