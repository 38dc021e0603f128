// SPDX-License-Identifier: MIT
/*
 * refuse.c - call every entry point of a provider stand-in and check that
 * it refuses as its symbol list says (tests/scripts/providers.sh).
 *
 *   usage: refuse <lib.so.1> <lib.syms>
 *
 * Each entry is looked up at its own version (dlvsym), so a symbol bound to
 * the wrong node, or a second version that aliases the first, fails. The
 * stand-ins take no arguments, so they are called with none. Prints one
 * line per failure and "checked N" at the end; exits 1 on any failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

int main(int argc, char **argv)
{
	char line[256], name[200], kind[16];
	int bad = 0, n = 0;
	void *h;
	FILE *f;

	if (argc != 3)
		return 2;
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	f = fopen(argv[2], "r");
	if (!h || !f) {
		fprintf(stderr, "refuse: %s\n", h ? strerror(errno) : dlerror());
		return 2;
	}
	while (fgets(line, sizeof(line), f)) {
		char *ver;
		void *fn;
		int ok;

		if (line[0] == '#' || sscanf(line, "%199s %15s", name, kind) != 2)
			continue;
		ver = strchr(name, '@');
		if (!ver)
			continue;
		*ver++ = '\0';
		if (*ver == '@')
			ver++;
		fn = dlvsym(h, name, ver);
		if (!fn) {
			printf("%s@%s: not found\n", name, ver);
			bad = 1;
			continue;
		}
		errno = 0;
		if (!strcmp(kind, "ptr"))
			ok = ((void *(*)(void))fn)() == NULL && errno == EOPNOTSUPP;
		else if (!strcmp(kind, "int"))
			ok = ((int (*)(void))fn)() == EOPNOTSUPP;
		else if (!strcmp(kind, "bool"))
			ok = ((bool (*)(void))fn)() == false;
		else if (!strcmp(kind, "ssize"))
			ok = ((ssize_t (*)(void))fn)() == -1 && errno == EOPNOTSUPP;
		else if (!strcmp(kind, "void"))
			ok = (((void (*)(void))fn)(), 1);
		else
			ok = 0;
		if (!ok) {
			printf("%s@%s (%s): did not refuse\n", name, ver, kind);
			bad = 1;
		}
		n++;
	}
	printf("checked %d\n", n);
	return bad;
}
