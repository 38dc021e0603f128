/* SPDX-License-Identifier: MIT */
/*
 * kv_app.h - the ursa-kv server, client and benchmark entry points
 * (server.c, client.c, bench.c), used by main.c.
 */
#ifndef URSA_KV_APP_H
#define URSA_KV_APP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"

struct kv_server_opts {
	int port;
	uint64_t nbuckets, heap_mib;
	bool poll;
};

int kv_server(const struct kv_server_opts *o);

/* --- client ----------------------------------------------------------------- */

enum kv_path { KV_TCP, KV_SEND, KV_READ };

struct kv_client;

/* Connect (verbs: also a queue pair); NULL and errno on failure. */
struct kv_client *kvc_open(const char *host, int port, bool verbs);
void kvc_close(struct kv_client *c);
/* Operations return a kv_status (>= 0) or -errno when the connection
 * failed; they reconnect and retry once if the server restarted. GET's
 * value goes to out (cap bytes), its length to *vlen. */
int kvc_get(struct kv_client *c, enum kv_path p, const void *key,
	    uint32_t klen, void *out, uint32_t cap, uint32_t *vlen);
int kvc_put(struct kv_client *c, enum kv_path p, const void *key,
	    uint32_t klen, const void *val, uint32_t vlen);
int kvc_del(struct kv_client *c, enum kv_path p, const void *key,
	    uint32_t klen);
int kvc_stats(struct kv_client *c, struct kv_stats *st);
/* One-sided GETs that had to read again (torn or moved entries). */
uint64_t kvc_retries(const struct kv_client *c);
/* What the last failed verbs operation completed with ("" if none). */
const char *kvc_why(const struct kv_client *c);
const char *kv_path_name(enum kv_path p);
int kv_path_parse(const char *s, enum kv_path *p);

/* "host", "host:port", "[v6]:port" (main.c) */
int kv_hostport(const char *arg, char *host, size_t n, int *port);

/* --- tools (bench.c, check.c) ---------------------------------------------- */

int kv_bench(int argc, char **argv);
int kv_check(int argc, char **argv);

#endif
