// SPDX-License-Identifier: MIT
/*
 * bench.c - `ursa-kv bench`: the case study's table, measured against a
 * running server (and, when given, a running redis-server) in one run.
 *
 * For each GET path (tcp, send, read): latency p50 and p99 with one
 * client, throughput with one and with N client processes, and the
 * server's CPU time per GET, read from the server (KV_STATS) before and
 * after: its request thread alone, and its whole process, which includes
 * ursa's engine thread: the software NIC, which serves one-sided READs
 * in the server process (on real hardware that work is the NIC's).
 *
 * Redis: redis-benchmark GETs of the same value size against the given
 * port, its CPU per GET from /proc/PID/stat of redis-server.
 *
 * Prints a table and, with --out, writes it as Markdown. Asserts nothing:
 * the figures are for people (docs/kv.md); --seconds 0.3 makes it a smoke
 * run.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_app.h"

struct row {
	const char *name;
	double p50, p99;	/* us */
	double tput1, tputn;	/* GETs/s */
	double app_us, proc_us;	/* server CPU per GET */
	bool ok;
};

static char host[256];
static int port;
static uint32_t vsize = 64;
static int nkeys = 1000;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void key_of(int i, char *k, size_t n)
{
	snprintf(k, n, "bench-%d", i);
}

/* GETs for secs seconds on one client; latencies into lat (cap n). */
static uint64_t run_gets(struct kv_client *c, enum kv_path p, double secs,
			 double *lat, size_t n, size_t *nlat)
{
	static uint8_t out[KV_MAX_VAL];
	double t0 = kv_now(), t;
	uint64_t done = 0;
	uint32_t seed = 1;

	*nlat = 0;
	while ((t = kv_now()) - t0 < secs) {
		char key[32];
		uint32_t len;
		int st;

		seed = seed * 1103515245 + 12345;
		key_of((int)(seed >> 8) % nkeys, key, sizeof(key));
		st = kvc_get(c, p, key, (uint32_t)strlen(key), out, sizeof(out), &len);
		if (st != KV_OK)
			return done;
		if (*nlat < n)
			lat[(*nlat)++] = (kv_now() - t) * 1e6;
		done++;
	}
	return done;
}

static int server_stats(struct kv_stats *st)
{
	struct kv_client *c = kvc_open(host, port, false);
	int ret;

	if (!c)
		return -errno;
	ret = kvc_stats(c, st);
	kvc_close(c);
	return ret;
}

/* N processes, each its own client, GETting for secs: total GETs/s. */
static double run_many(enum kv_path p, int n, double secs)
{
	int pfd[2];
	uint64_t total = 0;
	double t0 = kv_now();

	if (pipe(pfd))
		return 0;
	for (int i = 0; i < n; i++) {
		if (fork() == 0) {
			struct kv_client *c = kvc_open(host, port, p != KV_TCP);
			uint64_t done = 0;
			size_t nl;
			double dummy;

			close(pfd[0]);
			if (c)
				done = run_gets(c, p, secs, &dummy, 0, &nl);
			kvc_close(c);
			if (write(pfd[1], &done, sizeof(done)) != sizeof(done))
				_exit(1);
			_exit(0);
		}
	}
	close(pfd[1]);
	for (int i = 0; i < n; i++) {
		uint64_t d;

		if (read(pfd[0], &d, sizeof(d)) == sizeof(d))
			total += d;
	}
	close(pfd[0]);
	while (wait(NULL) > 0)
		;
	return (double)total / (kv_now() - t0);
}

static void measure(struct row *r, enum kv_path p, int nclients, double secs)
{
	static double lat[1 << 20];
	struct kv_client *c = kvc_open(host, port, p != KV_TCP);
	struct kv_stats a, b;
	size_t nl;
	uint64_t done;
	double t0;

	r->name = kv_path_name(p);
	if (!c) {
		fprintf(stderr, "ursa-kv bench: %s: cannot connect: %s\n", r->name,
			strerror(errno));
		return;
	}
	/* warm up, then latency and one-client throughput together */
	run_gets(c, p, secs / 10, lat, 0, &nl);
	if (server_stats(&a))
		goto out;
	t0 = kv_now();
	done = run_gets(c, p, secs, lat, sizeof(lat) / sizeof(lat[0]), &nl);
	r->tput1 = (double)done / (kv_now() - t0);
	if (server_stats(&b) || !nl)
		goto out;
	qsort(lat, nl, sizeof(lat[0]), cmp_d);
	r->p50 = lat[nl / 2];
	r->p99 = lat[nl * 99 / 100];
	/* the stats calls themselves are two TCP requests: negligible */
	r->app_us = (double)(b.app_cpu_ns - a.app_cpu_ns) / 1e3 / (double)done;
	r->proc_us = (double)(b.proc_cpu_ns - a.proc_cpu_ns) / 1e3 / (double)done;
	r->tputn = run_many(p, nclients, secs);
	r->ok = true;
out:
	kvc_close(c);
}

/* --- redis ----------------------------------------------------------------- */

static double proc_cpu_s(int pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut, st;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	p = fgets(buf, sizeof(buf), f);
	fclose(f);
	if (!p || !(p = strrchr(buf, ')')))
		return -1;
	/* fields after the name: state is 3rd, utime 14th, stime 15th */
	if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
		   &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* redis-benchmark --csv: "test","rps","avg","min","p50","p95","p99","max" */
static int redis_run(int rport, int clients, int n, double *rps, double *p50,
		     double *p99)
{
	char cmd[512], line[512];
	FILE *f;
	int got = -1;

	snprintf(cmd, sizeof(cmd),
		 "redis-benchmark -h 127.0.0.1 -p %d -t get -n %d -c %d -d %u -r %d --csv 2>/dev/null",
		 rport, n, clients, vsize, nkeys);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		double v[7];

		if (strncmp(line, "\"GET\"", 5))
			continue;
		if (sscanf(line, "\"GET\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\",\"%lf\"",
			   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) == 7) {
			*rps = v[0];
			*p50 = v[3] * 1000;
			*p99 = v[5] * 1000;
			got = 0;
		}
	}
	pclose(f);
	return got;
}

static void measure_redis(struct row *r, int rport, int rpid, int nclients,
			  double secs)
{
	double rps = 0, p50 = 0, p99 = 0, c0, c1;
	char cmd[256];
	int n;

	r->name = "redis";
	/* fill the keys redis-benchmark will GET (key:000000000042 style) */
	snprintf(cmd, sizeof(cmd),
		 "redis-benchmark -h 127.0.0.1 -p %d -t set -n %d -r %d -d %u -q >/dev/null 2>&1",
		 rport, nkeys * 4, nkeys, vsize);
	if (system(cmd))
		return;
	/* size the run to about secs at a first guess of 20k GETs/s */
	n = (int)(secs * 20000);
	n = n < 1000 ? 1000 : n;
	c0 = proc_cpu_s(rpid);
	if (redis_run(rport, 1, n, &rps, &p50, &p99))
		return;
	c1 = proc_cpu_s(rpid);
	r->p50 = p50;
	r->p99 = p99;
	r->tput1 = rps;
	if (c0 >= 0 && c1 >= 0)
		r->app_us = r->proc_us = (c1 - c0) * 1e6 / n;
	if (!redis_run(rport, nclients, n, &rps, &p50, &p99))
		r->tputn = rps;
	r->ok = true;
}

static void print_table(FILE *f, const struct row *rows, int n, int nclients,
			bool md)
{
	const struct row *tcp = NULL;

	for (int i = 0; i < n; i++)
		if (rows[i].ok && !strcmp(rows[i].name, "tcp"))
			tcp = &rows[i];
	if (md) {
		fprintf(f, "| GET path | p50 (µs) | p99 (µs) | GETs/s, 1 client | GETs/s, %d clients "
			"| server CPU/GET, request thread (µs) | server CPU/GET, process (µs) "
			"| tcp p50 / this p50 |\n|---|---|---|---|---|---|---|---|\n", nclients);
	} else {
		fprintf(f, "%-6s %9s %9s %12s %12s %12s %12s %9s\n", "GET", "p50 us", "p99 us",
			"GET/s 1cl", "GET/s Ncl", "srv app us", "srv proc us", "p50/tcp");
	}
	for (int i = 0; i < n; i++) {
		const struct row *r = &rows[i];
		double ratio = tcp && r->p50 > 0 ? tcp->p50 / r->p50 : 0;

		if (!r->ok) {
			fprintf(f, md ? "| %s | not measured | | | | | | |\n" : "%-6s not measured\n",
				r->name);
			continue;
		}
		fprintf(f, md ? "| %s | %.1f | %.1f | %.0f | %.0f | %.2f | %.2f | %.2fx |\n" :
				"%-6s %9.1f %9.1f %12.0f %12.0f %12.2f %12.2f %8.2fx\n",
			r->name, r->p50, r->p99, r->tput1, r->tputn, r->app_us, r->proc_us, ratio);
	}
}

int kv_bench(int argc, char **argv)
{
	int nclients = 4, rport = 0, rpid = 0;
	double secs = 3;
	const char *out = NULL;
	struct row rows[4] = { { 0 } };
	struct kv_client *c;
	static uint8_t v[KV_MAX_VAL];

	if (argc < 1 || kv_hostport(argv[0], host, sizeof(host), &port))
		goto usage;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--clients") && i + 1 < argc)
			nclients = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			vsize = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--keys") && i + 1 < argc)
			nkeys = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out = argv[++i];
		else if (!strcmp(argv[i], "--redis-port") && i + 1 < argc)
			rport = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--redis-pid") && i + 1 < argc)
			rpid = atoi(argv[++i]);
		else
			goto usage;
	}
	if (nclients < 1 || nclients > 64 || vsize > KV_MAX_VAL || nkeys < 1 || secs <= 0)
		goto usage;
	/* the keys, written once through the server */
	c = kvc_open(host, port, false);
	if (!c) {
		fprintf(stderr, "ursa-kv bench: cannot connect to %s port %d: %s\n", host, port,
			strerror(errno));
		return 1;
	}
	memset(v, 'v', vsize);
	for (int i = 0; i < nkeys; i++) {
		char key[32];

		key_of(i, key, sizeof(key));
		if (kvc_put(c, KV_TCP, key, (uint32_t)strlen(key), v, vsize) != KV_OK) {
			fprintf(stderr, "ursa-kv bench: PUT %s failed\n", key);
			kvc_close(c);
			return 1;
		}
	}
	kvc_close(c);
	printf("ursa-kv bench: %d keys of %u bytes, %.1f s per measurement, %d clients for the "
	       "N-client column\n", nkeys, vsize, secs, nclients);
	for (int p = KV_TCP; p <= KV_READ; p++) {
		fprintf(stderr, "  measuring %s ...\n", kv_path_name((enum kv_path)p));
		measure(&rows[p], (enum kv_path)p, nclients, secs);
	}
	rows[3].name = "redis";
	if (rport && rpid) {
		fprintf(stderr, "  measuring redis ...\n");
		measure_redis(&rows[3], rport, rpid, nclients, secs);
	}
	print_table(stdout, rows, rport ? 4 : 3, nclients, false);
	if (out) {
		FILE *f = fopen(out, "w");

		if (!f) {
			fprintf(stderr, "ursa-kv bench: %s: %s\n", out, strerror(errno));
			return 1;
		}
		fprintf(f, "%d keys of %u bytes; %.1f s per measurement; %d clients in the "
			"N-client column.\n\n", nkeys, vsize, secs, nclients);
		print_table(f, rows, rport ? 4 : 3, nclients, true);
		fclose(f);
	}
	return rows[0].ok && rows[1].ok && rows[2].ok ? 0 : 1;
usage:
	fprintf(stderr, "usage: ursa-kv bench HOST[:PORT] [--clients N] [--size B] [--keys N] "
		"[--seconds S] [--out FILE.md] [--redis-port P --redis-pid PID]\n");
	return 2;
}
