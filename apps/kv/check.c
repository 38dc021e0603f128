// SPDX-License-Identifier: MIT
/*
 * check.c - `ursa-kv check`: correctness against a running server, used by
 * the tests (tests/scripts/kv.sh). Prints one "ok"/"FAIL" line per check
 * and exits non-zero on any failure.
 *
 *   basic     every value size through every write path, read back through
 *             every GET path; DELETE; not-found on every path
 *   bad       keys too long or empty, oversized values, a GET into a buffer
 *             too small, malformed TCP requests (the server answers and
 *             drops that connection, and keeps serving others)
 *   stress    N worker processes PUT, GET and DELETE their own keys and GET
 *             each other's, by random paths and sizes, for S seconds. A
 *             value carries (writer, sequence, key) and a pattern drawn
 *             from them, so a torn value is caught; a writer's own GET
 *             must return exactly its last acknowledged PUT (or not-found
 *             after its DELETE); a reader must never see a writer's
 *             sequence go backwards (linearizable GET). One hot key is
 *             written by all and read by all, to race one-sided readers
 *             against the writer.
 *   --kill    during stress, one more process PUTs large values by SEND
 *             and is killed with SIGKILL; the table must stay whole.
 *   --restart-probe   connect, PUT and GET, print "ready", wait for a line
 *             on stdin (the script restarts the server meanwhile), then
 *             PUT and GET again on the same client: it must reconnect.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <netdb.h>

#include "kv_app.h"

static int fails;
static int run_id;		/* keys of this run: a server may outlive runs */
static char host[256];
static int port;

#define OK(cond, ...)                                                  \
	do {                                                           \
		if (cond) {                                            \
			printf("ok   ");                               \
		} else {                                               \
			printf("FAIL ");                               \
			fails++;                                       \
		}                                                      \
		printf(__VA_ARGS__);                                   \
		printf("\n");                                          \
		fflush(stdout);                                        \
	} while (0)

static const uint32_t sizes[] = { 0, 1, 7, 8, 63, 64, 100, 1000, 4096, 4097,
				  65536, 300000, KV_MAX_VAL };

/* --- self-checking values ------------------------------------------------- */

struct vhdr {
	uint32_t magic, writer;
	uint64_t seq, khash;
};
#define VMAGIC 0x6b76636bu

static uint8_t pat(uint32_t w, uint64_t seq, uint32_t i)
{
	uint64_t x = (seq * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)w << 40) ^ i;

	x ^= x >> 29;
	return (uint8_t)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static uint32_t make_val(uint8_t *v, uint32_t len, uint32_t w, uint64_t seq,
			 const char *key)
{
	struct vhdr h = { VMAGIC, w, seq, kv_hash(key, strlen(key)) };

	if (len < sizeof(h))
		len = sizeof(h);
	memcpy(v, &h, sizeof(h));
	for (uint32_t i = sizeof(h); i < len; i++)
		v[i] = pat(w, seq, i);
	return len;
}

/* 0 if v is a whole value of key; fills writer and seq */
static int check_val(const uint8_t *v, uint32_t len, const char *key,
		     uint32_t *w, uint64_t *seq)
{
	struct vhdr h;

	if (len < sizeof(h))
		return -1;
	memcpy(&h, v, sizeof(h));
	if (h.magic != VMAGIC || h.khash != kv_hash(key, strlen(key)))
		return -1;
	for (uint32_t i = sizeof(h); i < len; i++)
		if (v[i] != pat(h.writer, h.seq, i))
			return -1;
	*w = h.writer;
	*seq = h.seq;
	return 0;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* --- basic and bad --------------------------------------------------------- */

static void basic(struct kv_client *c)
{
	static uint8_t v[KV_MAX_VAL], out[KV_MAX_VAL];
	enum kv_path wp[] = { KV_TCP, KV_SEND };
	int bad = 0, n = 0;

	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (int w = 0; w < 2; w++) {
			char key[32];

			snprintf(key, sizeof(key), "basic-%u-%d", sizes[s], w);
			for (uint32_t i = 0; i < sizes[s]; i++)
				v[i] = (uint8_t)(i * 31 + s + (unsigned)w);
			if (kvc_put(c, wp[w], key, (uint32_t)strlen(key), v, sizes[s]) != KV_OK) {
				printf("     put %s by %s failed\n", key, kv_path_name(wp[w]));
				bad++;
				continue;
			}
			for (int p = KV_TCP; p <= KV_READ; p++) {
				uint32_t len = 12345;
				int st = kvc_get(c, (enum kv_path)p, key, (uint32_t)strlen(key),
						 out, sizeof(out), &len);

				n++;
				if (st != KV_OK || len != sizes[s] || memcmp(out, v, len)) {
					printf("     get %s by %s: %s, %u bytes\n", key,
					       kv_path_name((enum kv_path)p), kv_status_str(st), len);
					bad++;
				}
			}
		}
	}
	OK(!bad, "basic: %d GETs of %zu sizes (0 B to 1 MiB) written by TCP and SEND, read by TCP, SEND and READ",
	   n, sizeof(sizes) / sizeof(sizes[0]));

	/* overwrite, delete, not found everywhere */
	bad = 0;
	for (int w = 0; w < 2; w++) {
		const char *key = "basic-del";
		uint32_t len;

		kvc_put(c, wp[w], key, 9, "one", 3);
		kvc_put(c, wp[w], key, 9, "second", 6);
		for (int p = KV_TCP; p <= KV_READ; p++)
			if (kvc_get(c, (enum kv_path)p, key, 9, out, sizeof(out), &len) != KV_OK ||
			    len != 6 || memcmp(out, "second", 6))
				bad++;
		if (kvc_del(c, wp[w], key, 9) != KV_OK)
			bad++;
		for (int p = KV_TCP; p <= KV_READ; p++)
			if (kvc_get(c, (enum kv_path)p, key, 9, out, sizeof(out), &len) != KV_NOTFOUND)
				bad++;
		if (kvc_del(c, wp[w], key, 9) != KV_NOTFOUND)
			bad++;
	}
	OK(!bad, "basic: overwrite, DELETE, then not found on every path");
}

/* A raw TCP request: the answer's status, or -1 if the connection closed
 * without one. */
static int raw_tcp(const void *msg, size_t len, bool expect_close)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
	struct kv_hello h = { .magic = KV_MAGIC };
	struct kv_welcome w;
	struct kv_tresp r;
	char ps[16], x;
	int fd, st = -1;

	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(host, ps, &hints, &ai))
		return -2;
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
		freeaddrinfo(ai);
		return -2;
	}
	freeaddrinfo(ai);
	if (!kv_xio(fd, &h, sizeof(h), 1) && !kv_xio(fd, &w, sizeof(w), 0) &&
	    !kv_xio(fd, (void *)msg, len, 1) && !kv_xio(fd, &r, sizeof(r), 0))
		st = r.status;
	if (expect_close && recv(fd, &x, 1, 0) != 0)
		st = -3;	/* should have been closed */
	close(fd);
	return st;
}

static void bad_requests(struct kv_client *c)
{
	static uint8_t out[KV_MAX_VAL + 1];
	char longkey[KV_MAX_KEY + 2];
	uint32_t len;
	struct kv_treq q;

	memset(longkey, 'k', sizeof(longkey));
	for (int p = KV_TCP; p <= KV_READ; p++)
		OK(kvc_get(c, (enum kv_path)p, longkey, KV_MAX_KEY + 1, out, sizeof(out), &len) ==
			   KV_EINVAL &&
		   kvc_get(c, (enum kv_path)p, "", 0, out, sizeof(out), &len) == KV_EINVAL,
		   "bad: %s GET of a %d-byte or empty key is refused", kv_path_name((enum kv_path)p),
		   KV_MAX_KEY + 1);
	OK(kvc_put(c, KV_SEND, "big", 3, out, KV_MAX_VAL + 1) == KV_EINVAL &&
	   kvc_put(c, KV_READ, "x", 1, "y", 1) == -EOPNOTSUPP,
	   "bad: PUT over 1 MiB, or one-sided, is refused");
	kvc_put(c, KV_TCP, "small-buf", 9, out, 4096);
	for (int p = KV_TCP; p <= KV_READ; p++)
		OK(kvc_get(c, (enum kv_path)p, "small-buf", 9, out, 100, &len) == KV_EINVAL &&
		   kvc_get(c, (enum kv_path)p, "small-buf", 9, out, sizeof(out), &len) == KV_OK &&
		   len == 4096,
		   "bad: %s GET into a 100-byte buffer of a 4 KiB value is refused, the next GET works",
		   kv_path_name((enum kv_path)p));

	/* malformed requests straight on the wire */
	memset(&q, 0, sizeof(q));
	q.op = KV_GET;
	q.klen = 0;
	OK(raw_tcp(&q, sizeof(q), true) == KV_EINVAL, "bad: TCP GET with an empty key: refused, connection closed");
	q.op = KV_PUT;
	q.klen = 1;
	q.vlen = 0xfffffff0u;
	OK(raw_tcp(&q, sizeof(q), true) == KV_EINVAL, "bad: TCP PUT claiming a 4 GiB value: refused, connection closed");
	q.op = 99;
	q.vlen = 0;
	{
		uint8_t m[sizeof(q) + 1];

		memcpy(m, &q, sizeof(q));
		m[sizeof(q)] = 'k';
		OK(raw_tcp(m, sizeof(m), true) == KV_EINVAL, "bad: TCP unknown operation: refused, connection closed");
	}
	OK(kvc_get(c, KV_READ, "small-buf", 9, out, sizeof(out), &len) == KV_OK &&
	   kvc_get(c, KV_SEND, "small-buf", 9, out, sizeof(out), &len) == KV_OK &&
	   kvc_get(c, KV_TCP, "small-buf", 9, out, sizeof(out), &len) == KV_OK,
	   "bad: the server still serves the other clients");
}

/* --- stress ------------------------------------------------------------------ */

#define OWN 16
#define WORKERS_MAX 16

struct wres {
	uint64_t ops, gets, torn, stale, errors, retries;
	char first[256];	/* what the first failure was */
};

#define NOTE(res, ...)                                                 \
	do {                                                           \
		if (!(res).first[0]) {                                 \
			snprintf((res).first, sizeof((res).first), __VA_ARGS__); \
			note_why((res).first, sizeof((res).first));    \
		}                                                      \
	} while (0)

static struct kv_client *cur;	/* the worker's client, for NOTE */

static void note_why(char *s, size_t n)
{
	size_t l = strlen(s);

	if (cur && kvc_why(cur)[0] && l + 3 < n)
		snprintf(s + l, n - l, " [%s]", kvc_why(cur));
}

static uint32_t pick_size(uint64_t *r)
{
	uint64_t x = rnd(r) % 100;

	if (x < 60)
		return (uint32_t)(rnd(r) % 256);
	if (x < 95)
		return (uint32_t)(rnd(r) % 65536);
	return (uint32_t)(rnd(r) % KV_MAX_VAL);
}

static void worker(int w, int nworkers, double secs, int fd)
{
	static uint8_t v[KV_MAX_VAL], out[KV_MAX_VAL];
	uint64_t acked[OWN] = { 0 }, seq = 1, r = 0x9e3779b97f4a7c15ull * (uint64_t)(w + 1);
	uint64_t seen[WORKERS_MAX][OWN] = { { 0 } };
	bool live[OWN] = { false };
	struct wres res = { 0 };
	struct kv_client *c = kvc_open(host, port, true);
	double t0 = kv_now();

	cur = c;
	if (!c) {
		res.errors++;
		NOTE(res, "connect: %s", strerror(errno));
		goto out;
	}
	while (kv_now() - t0 < secs) {
		uint64_t op = rnd(&r) % 10;
		int k = (int)(rnd(&r) % OWN);
		enum kv_path wp = rnd(&r) & 1 ? KV_SEND : KV_TCP;
		enum kv_path gp = (enum kv_path)(rnd(&r) % 3);
		char key[32];
		uint32_t len, ww;
		uint64_t s;
		int st;

		res.ops++;
		if (op < 3) {		/* PUT own */
			snprintf(key, sizeof(key), "r%d-w%d-%d", run_id, w, k);
			len = make_val(v, pick_size(&r), (uint32_t)w, seq, key);
			st = kvc_put(c, wp, key, (uint32_t)strlen(key), v, len);
			if (st != KV_OK) {
				res.errors++;
				NOTE(res, "PUT %s by %s: %s", key, kv_path_name(wp), kv_status_str(st));
				continue;
			}
			acked[k] = seq++;
			live[k] = true;
		} else if (op < 4) {	/* DELETE own */
			snprintf(key, sizeof(key), "r%d-w%d-%d", run_id, w, k);
			st = kvc_del(c, wp, key, (uint32_t)strlen(key));
			if (st != (live[k] ? KV_OK : KV_NOTFOUND)) {
				res.errors++;
				NOTE(res, "DELETE %s by %s: %s", key, kv_path_name(wp), kv_status_str(st));
			}
			live[k] = false;
		} else if (op < 6) {	/* GET own: exactly the last PUT */
			snprintf(key, sizeof(key), "r%d-w%d-%d", run_id, w, k);
			res.gets++;
			st = kvc_get(c, gp, key, (uint32_t)strlen(key), out, sizeof(out), &len);
			if (!live[k]) {
				if (st != KV_NOTFOUND && st != KV_OK) {
					res.errors++;
					NOTE(res, "GET %s by %s after DELETE: %s", key,
					     kv_path_name(gp), kv_status_str(st));
				} else if (st != KV_NOTFOUND) {
					res.stale++;
					NOTE(res, "GET %s by %s after DELETE: %s", key,
					     kv_path_name(gp), kv_status_str(st));
				}
			} else if (st != KV_OK) {
				res.errors++;
				NOTE(res, "GET %s by %s: %s", key, kv_path_name(gp), kv_status_str(st));
			} else if (check_val(out, len, key, &ww, &s)) {
				res.torn++;
				NOTE(res, "GET %s by %s: torn", key, kv_path_name(gp));
			} else if (ww != (uint32_t)w || s != acked[k]) {
				res.stale++;
				NOTE(res, "GET %s by %s: sequence %llu, acknowledged %llu", key,
				     kv_path_name(gp), (unsigned long long)s,
				     (unsigned long long)acked[k]);
			}
		} else if (op == 9) {	/* the hot key everyone writes */
			snprintf(key, sizeof(key), "r%d-hot", run_id);
			if (rnd(&r) & 1) {
				len = make_val(v, pick_size(&r), (uint32_t)w, seq++, key);
				st = kvc_put(c, wp, key, (uint32_t)strlen(key), v, len);
				if (st != KV_OK) {
					res.errors++;
					NOTE(res, "PUT %s by %s: %s", key, kv_path_name(wp),
					     kv_status_str(st));
				}
				continue;
			}
			res.gets++;
			st = kvc_get(c, gp, key, (uint32_t)strlen(key), out, sizeof(out), &len);
			if (st == KV_OK && check_val(out, len, key, &ww, &s)) {
				res.torn++;
				NOTE(res, "GET %s by %s: torn", key, kv_path_name(gp));
			} else if (st != KV_OK && st != KV_NOTFOUND) {
				res.errors++;
				NOTE(res, "GET %s by %s: %s", key, kv_path_name(gp), kv_status_str(st));
			}
		} else {		/* GET another's: whole, never older */
			int o = (int)(rnd(&r) % (uint64_t)nworkers);

			snprintf(key, sizeof(key), "r%d-w%d-%d", run_id, o, k);
			res.gets++;
			st = kvc_get(c, gp, key, (uint32_t)strlen(key), out, sizeof(out), &len);
			if (st == KV_NOTFOUND)
				continue;
			if (st != KV_OK) {
				res.errors++;
				NOTE(res, "GET %s by %s: %s", key, kv_path_name(gp), kv_status_str(st));
			} else if (check_val(out, len, key, &ww, &s) || ww != (uint32_t)o) {
				res.torn++;
				NOTE(res, "GET %s by %s: torn", key, kv_path_name(gp));
			} else {
				if (s < seen[o][k]) {
					res.stale++;
					NOTE(res, "GET %s by %s: sequence %llu after %llu", key,
					     kv_path_name(gp), (unsigned long long)s,
					     (unsigned long long)seen[o][k]);
				}
				seen[o][k] = s;
			}
		}
	}
	res.retries = kvc_retries(c);
	kvc_close(c);
out:
	if (write(fd, &res, sizeof(res)) != sizeof(res))
		_exit(3);
	_exit(0);
}

/* PUT large values by SEND until killed */
static void victim(void)
{
	static uint8_t v[KV_MAX_VAL];
	struct kv_client *c = kvc_open(host, port, true);
	uint64_t seq = 1;

	if (!c)
		_exit(2);
	for (;;) {
		char key[32];

		snprintf(key, sizeof(key), "victim-%d", (int)(seq % 4));
		kvc_put(c, KV_SEND, key, (uint32_t)strlen(key), v,
			make_val(v, KV_MAX_VAL - (uint32_t)(seq % 1000), 99, seq, key));
		seq++;
	}
}

static void stress(int nworkers, double secs, bool kill_one)
{
	int pfd[2];
	pid_t pids[WORKERS_MAX], vpid = -1;
	struct wres sum = { 0 };
	int died = 0;
	char first[256] = "";

	if (pipe(pfd))
		return;
	for (int w = 0; w < nworkers; w++) {
		pids[w] = fork();
		if (pids[w] == 0) {
			close(pfd[0]);
			worker(w, nworkers, secs, pfd[1]);
		}
	}
	if (kill_one) {
		vpid = fork();
		if (vpid == 0)
			victim();
		usleep((useconds_t)(secs * 1e6 / 3));
		kill(vpid, SIGKILL);
		waitpid(vpid, NULL, 0);
	}
	close(pfd[1]);
	for (int w = 0; w < nworkers; w++) {
		struct wres r;
		int status;

		if (read(pfd[0], &r, sizeof(r)) == sizeof(r)) {
			sum.ops += r.ops;
			sum.gets += r.gets;
			sum.torn += r.torn;
			sum.stale += r.stale;
			sum.errors += r.errors;
			sum.retries += r.retries;
			if (!first[0] && r.first[0])
				memcpy(first, r.first, sizeof(first));
		}
		waitpid(pids[w], &status, 0);
		died += !WIFEXITED(status) || WEXITSTATUS(status);
	}
	close(pfd[0]);
	OK(!died && !sum.torn && !sum.stale && !sum.errors && sum.gets > 0,
	   "stress: %d processes, %.0f s: %" PRIu64 " operations (%" PRIu64 " GETs), torn %" PRIu64
	   ", stale %" PRIu64 ", errors %" PRIu64 ", one-sided re-reads %" PRIu64,
	   nworkers, secs, sum.ops, sum.gets, sum.torn, sum.stale, sum.errors, sum.retries);
	if (first[0])
		printf("     first failure: %s\n", first);
	if (kill_one) {
		static uint8_t out[KV_MAX_VAL];
		struct kv_client *c = kvc_open(host, port, true);
		int bad = !c, seen = 0;

		for (int k = 0; c && k < 4; k++) {
			char key[32];
			uint32_t len, ww;
			uint64_t s;

			snprintf(key, sizeof(key), "victim-%d", k);
			for (int p = KV_TCP; p <= KV_READ; p++) {
				int st = kvc_get(c, (enum kv_path)p, key, (uint32_t)strlen(key),
						 out, sizeof(out), &len);

				if (st == KV_OK) {
					seen++;
					bad += check_val(out, len, key, &ww, &s) != 0;
				} else if (st != KV_NOTFOUND) {
					bad++;
				}
			}
		}
		kvc_close(c);
		OK(!bad && seen > 0, "client killed mid-PUT: its %d values read back whole on every path",
		   seen);
	}
}

static int restart_probe(void)
{
	struct kv_client *c = kvc_open(host, port, true);
	uint8_t out[64];
	uint32_t len;
	char line[16];
	int ok1, ok2 = 0;

	if (!c) {
		OK(0, "restart: connect");
		return 1;
	}
	ok1 = kvc_put(c, KV_SEND, "r", 1, "before", 6) == KV_OK &&
	      kvc_get(c, KV_READ, "r", 1, out, sizeof(out), &len) == KV_OK;
	printf("ready\n");
	fflush(stdout);
	if (fgets(line, sizeof(line), stdin)) {
		/* a new server: an empty table, reached by reconnecting */
		ok2 = kvc_get(c, KV_READ, "r", 1, out, sizeof(out), &len) == KV_NOTFOUND &&
		      kvc_put(c, KV_SEND, "r", 1, "after", 5) == KV_OK &&
		      kvc_get(c, KV_READ, "r", 1, out, sizeof(out), &len) == KV_OK &&
		      len == 5 && !memcmp(out, "after", 5);
	}
	kvc_close(c);
	OK(ok1 && ok2, "restart: the client reconnected to the restarted server and carried on");
	return fails ? 1 : 0;
}

int kv_check(int argc, char **argv)
{
	int workers = 4;
	double secs = 5;
	bool kill_one = false, probe = false;
	struct kv_client *c;

	if (argc < 1 || kv_hostport(argv[0], host, sizeof(host), &port)) {
		fprintf(stderr, "usage: ursa-kv check HOST[:PORT] [--workers N] [--seconds S] [--kill] [--restart-probe]\n");
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			workers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--kill"))
			kill_one = true;
		else if (!strcmp(argv[i], "--restart-probe"))
			probe = true;
		else
			return 2;
	}
	if (workers < 1 || workers > WORKERS_MAX)
		workers = 4;
	setvbuf(stdout, NULL, _IOLBF, 0);
	run_id = (int)getpid();
	if (probe)
		return restart_probe();
	c = kvc_open(host, port, true);
	if (!c) {
		OK(0, "connect to %s port %d: %s", host, port, strerror(errno));
		return 1;
	}
	basic(c);
	bad_requests(c);
	kvc_close(c);
	stress(workers, secs, kill_one);
	printf("%d failed\n", fails);
	return fails ? 1 : 0;
}
