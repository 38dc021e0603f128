// SPDX-License-Identifier: MIT
/*
 * main.c - the ursa-kv command line:
 *
 *   ursa-kv server [--port P] [--buckets N] [--heap MIB] [--poll]
 *   ursa-kv client HOST[:PORT] get|put|del KEY [VALUE] [--path tcp|send|read]
 *   ursa-kv bench  HOST[:PORT] [options]     (bench.c)
 *   ursa-kv check  HOST[:PORT] [options]     (check.c)
 *
 * Exit status of client: 0 done, 1 not found, 2 refused or failed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_app.h"

static int usage(void)
{
	fprintf(stderr,
		"usage: ursa-kv server [--port P] [--buckets N] [--heap MIB] [--poll]\n"
		"       ursa-kv client HOST[:PORT] get|put|del KEY [VALUE] [--path tcp|send|read]\n"
		"       ursa-kv bench HOST[:PORT] [--clients N] [--size B] [--keys N] [--seconds S]\n"
		"                     [--out FILE.md] [--redis-port P --redis-pid PID]\n"
		"       ursa-kv check HOST[:PORT] [--workers N] [--seconds S]\n");
	return 2;
}

static int server_main(int argc, char **argv)
{
	struct kv_server_opts o = { .port = KV_PORT, .nbuckets = 1 << 16, .heap_mib = 256 };

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--port") && i + 1 < argc)
			o.port = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--buckets") && i + 1 < argc)
			o.nbuckets = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--heap") && i + 1 < argc)
			o.heap_mib = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--poll"))
			o.poll = true;
		else
			return usage();
	}
	if (o.port <= 0 || o.port > 65535 || !o.nbuckets ||
	    (o.nbuckets & (o.nbuckets - 1)) || o.heap_mib < 2 || o.heap_mib > (1 << 20)) {
		fprintf(stderr, "ursa-kv: --buckets must be a power of two, --heap at least 2 (MiB)\n");
		return 2;
	}
	return kv_server(&o);
}

/* "host", "host:port", "[v6]:port" or a bare IPv6 address */
int kv_hostport(const char *arg, char *host, size_t n, int *port)
{
	const char *colon = strrchr(arg, ':');

	*port = KV_PORT;
	if (arg[0] == '[') {
		const char *end = strchr(arg, ']');

		if (!end || (size_t)(end - arg) > n)
			return -EINVAL;
		snprintf(host, n, "%.*s", (int)(end - arg - 1), arg + 1);
		if (end[1] == ':')
			*port = atoi(end + 2);
	} else if (colon && strchr(arg, ':') == colon) {
		snprintf(host, n, "%.*s", (int)(colon - arg), arg);
		*port = atoi(colon + 1);
	} else {
		snprintf(host, n, "%s", arg);
	}
	return *port > 0 && *port < 65536 ? 0 : -EINVAL;
}

static int client_main(int argc, char **argv)
{
	enum kv_path p = KV_TCP;
	const char *args[4];
	int na = 0, port, st;
	char host[256];
	struct kv_client *c;
	static char val[KV_MAX_VAL];
	uint32_t vlen = 0;

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--path") && i + 1 < argc) {
			if (kv_path_parse(argv[++i], &p))
				return usage();
		} else if (na < 4) {
			args[na++] = argv[i];
		} else {
			return usage();
		}
	}
	if (na < 3 || (!strcmp(args[1], "put") ? na != 4 : na != 3))
		return usage();
	if (kv_hostport(args[0], host, sizeof(host), &port))
		return usage();
	c = kvc_open(host, port, p != KV_TCP);
	if (!c) {
		fprintf(stderr, "ursa-kv: cannot connect to %s port %d: %s\n", host, port,
			strerror(errno));
		return 2;
	}
	if (!strcmp(args[1], "get")) {
		st = kvc_get(c, p, args[2], (uint32_t)strlen(args[2]), val, sizeof(val), &vlen);
		if (st == KV_OK)
			fwrite(val, 1, vlen, stdout), putchar('\n');
	} else if (!strcmp(args[1], "put")) {
		st = kvc_put(c, p, args[2], (uint32_t)strlen(args[2]), args[3],
			     (uint32_t)strlen(args[3]));
	} else if (!strcmp(args[1], "del")) {
		st = kvc_del(c, p, args[2], (uint32_t)strlen(args[2]));
	} else {
		kvc_close(c);
		return usage();
	}
	kvc_close(c);
	if (st != KV_OK)
		fprintf(stderr, "ursa-kv: %s %s: %s\n", args[1], args[2], kv_status_str(st));
	return st == KV_OK ? 0 : st == KV_NOTFOUND ? 1 : 2;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	if (!strcmp(argv[1], "server"))
		return server_main(argc - 2, argv + 2);
	if (!strcmp(argv[1], "client"))
		return client_main(argc - 2, argv + 2);
	if (!strcmp(argv[1], "bench"))
		return kv_bench(argc - 2, argv + 2);
	if (!strcmp(argv[1], "check"))
		return kv_check(argc - 2, argv + 2);
	return usage();
}
