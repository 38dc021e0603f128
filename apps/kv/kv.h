/* SPDX-License-Identifier: MIT */
/*
 * kv.h - ursa-kv, the case study: one key-value table, three ways to GET.
 *
 * The server keeps the whole table in one memory region registered once:
 * a header, an array of buckets, and a heap of value blocks. A client can
 * GET three ways over the same table:
 *
 *   tcp   request and response over the TCP connection (the baseline);
 *   send  two-sided verbs: the request is a SEND, the server answers with
 *         an RDMA WRITE with immediate straight from the value block into
 *         the client's response buffer;
 *   read  one-sided: the client READs the key's bucket, then the value
 *         block, from the server's memory; the server's CPU takes no part.
 *
 * PUT and DELETE always go through the server (tcp or send), which is the
 * only writer: a value is written out of place into a fresh block, then
 * the slot is switched to it. That gives linearizable GETs after an
 * acknowledged PUT on every path (the slot changes before the answer), and
 * a client that dies mid-request cannot leave the table half-written.
 *
 * One-sided readers run concurrently with the writer and no lock, so what
 * they read can be torn. Each slot carries a check word over its fields,
 * each value block a version (the slot's) and a checksum over version, key
 * and value, as Pilaf does: a reader that sees a mismatch reads again.
 * Freed blocks are reused only after a quarantine, so a retry is rare.
 */
#ifndef URSA_KV_H
#define URSA_KV_H

#include <stdint.h>
#include <stddef.h>

#define KV_MAGIC	0x7572736b76763031ull	/* "ursakv01" */
#define KV_PORT		7400
#define KV_MAX_KEY	64
#define KV_MAX_VAL	(1u << 20)
#define KV_SLOTS	8	/* per bucket: one READ of 256 bytes */

/* Table layout (in the registered region, little-endian host order). */
struct kv_slot {
	uint64_t ver;		/* even; bumped by every change of the slot */
	uint64_t khash;		/* 0: empty */
	uint64_t off;		/* value block, from the heap's start */
	uint32_t klen, vlen;
	uint64_t check;		/* kv_slot_check() of the fields above */
	uint64_t pad[2];	/* 48 -> 64 bytes: one cache line */
};

struct kv_bucket {
	struct kv_slot s[KV_SLOTS];
};

struct kv_block {
	uint64_t ver;		/* the slot's ver when written */
	uint32_t klen, vlen;
	uint64_t sum;		/* kv_sum(ver, key, value) */
	/* key, then value */
};

struct kv_table_hdr {
	uint64_t magic;
	uint64_t nbuckets;	/* a power of two */
	uint64_t buckets_off, heap_off, heap_len;
};

/* --- wire formats --------------------------------------------------------- */

enum kv_op { KV_GET = 1, KV_PUT = 2, KV_DEL = 3, KV_STATS = 4 };
enum kv_status {
	KV_OK = 0, KV_NOTFOUND = 1, KV_EINVAL = 2, KV_ENOSPC = 3,
	KV_EIO = 4,
};

/* TCP request: header, key, value (PUT). Response: kv_tresp, value. */
struct kv_treq {
	uint8_t op, pad;
	uint16_t klen;
	uint32_t vlen;
	uint64_t id;
};

struct kv_tresp {
	int32_t status;
	uint32_t vlen;
	uint64_t id;
	uint64_t sum;		/* of the value (GET), as the block holds it */
	uint64_t ver;
};

/* Verbs request (a SEND of at most sizeof(struct kv_vreq)). A PUT's value
 * stays in the client's memory: the server READs it into the new block. */
struct kv_vreq {
	uint8_t op, pad;
	uint16_t klen;
	uint32_t vlen;
	uint64_t id;
	uint64_t vaddr;		/* PUT: where the value is */
	uint32_t vkey, pad2;
	uint8_t key[KV_MAX_KEY];
};

/* Verbs response: WRITE with immediate (imm = low 32 bits of id) of this
 * header followed by the value into the client's response buffer. */
struct kv_vresp {
	int32_t status;
	uint32_t vlen;
	uint64_t id;
	uint64_t sum, ver;
};

/* Connection setup over the TCP connection, once. */
struct kv_hello {
	uint64_t magic;
	uint32_t qpn;		/* 0: no verbs (TCP only) */
	uint32_t resp_key;	/* client's response buffer */
	uint64_t resp_addr, resp_len;
	uint8_t gid[16];
};

struct kv_welcome {
	uint64_t magic;
	uint32_t qpn, table_key;	/* qpn 0: verbs refused */
	uint64_t table_addr, nbuckets, buckets_off, heap_off, heap_len;
	uint8_t gid[16];
};

/* Server statistics (KV_STATS over TCP). */
struct kv_stats {
	uint64_t gets, puts, dels, keys;
	uint64_t app_cpu_ns;	/* the server's request thread */
	uint64_t proc_cpu_ns;	/* the whole server process, ursa's engine
				 * (the software NIC) included */
};

/* --- shared helpers (kv_common.c) ---------------------------------------- */

uint64_t kv_hash(const void *key, size_t len);
uint64_t kv_sum(uint64_t ver, const void *key, size_t klen, const void *val,
		size_t vlen);
uint64_t kv_slot_check(const struct kv_slot *s);
double kv_now(void);
int kv_xio(int fd, void *p, size_t n, int out);
const char *kv_status_str(int st);

#endif
