// SPDX-License-Identifier: MIT
/*
 * harness.c - runs a table of tests, each in a forked child (see harness.h).
 */
#include "harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int harness_failed;
char harness_skip_reason[256];
static char *shared_reason; /* child -> parent, in a shared mapping */

void harness_fail(const char *file, int line, const char *expr,
		  const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "    %s:%d: %s: ", file, line, expr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	harness_failed = 1;
}

static int run_one(const struct test *t, int timeout)
{
	pid_t pid;
	int st;

	fflush(stdout);
	fflush(stderr);
	shared_reason[0] = '\0';
	pid = fork();
	if (pid == 0) {
		int r;

		/* A process group per test, so that whatever the test
		 * started is killed with it (see below). */
		setpgid(0, 0);
		alarm((unsigned)timeout);
		r = t->fn();
		if (r == TEST_PASS && harness_failed)
			r = TEST_FAIL;
		if (r == TEST_SKIP)
			snprintf(shared_reason, 256, "%s", harness_skip_reason);
		fflush(stdout);
		fflush(stderr);
		exit(r);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0) {
		printf("FAIL %s: fork/wait: %s\n", t->name, strerror(errno));
		return TEST_FAIL;
	}
	/* Leftover helpers of a failed or timed-out test must not outlive
	 * it (they would hold the runner's output pipe open). */
	kill(-pid, SIGKILL);
	if (WIFSIGNALED(st)) {
		printf("FAIL %s: killed by signal %d (%s)%s\n", t->name,
		       WTERMSIG(st), strsignal(WTERMSIG(st)),
		       WTERMSIG(st) == SIGALRM ? " - timed out" : "");
		return TEST_FAIL;
	}
	switch (WEXITSTATUS(st)) {
	case TEST_PASS:
		printf("ok   %s\n", t->name);
		return TEST_PASS;
	case TEST_SKIP:
		printf("skip %s: %s\n", t->name, shared_reason);
		return TEST_SKIP;
	default:
		printf("FAIL %s (exit %d)\n", t->name, WEXITSTATUS(st));
		return TEST_FAIL;
	}
}

int harness_main(const struct test *t, int n, int argc, char **argv)
{
	int pass = 0, fail = 0, skip = 0, timeout = 60;
	const char *filter = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--list")) {
			for (int j = 0; j < n; j++)
				printf("%-32s %s\n", t[j].name, t[j].desc);
			return 0;
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			timeout = atoi(argv[++i]);
		} else {
			filter = argv[i];
		}
	}
	shared_reason = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared_reason == MAP_FAILED)
		return 1;
	for (int i = 0; i < n; i++) {
		if (filter && !strstr(t[i].name, filter))
			continue;
		switch (run_one(&t[i], timeout)) {
		case TEST_PASS: pass++; break;
		case TEST_SKIP: skip++; break;
		default: fail++; break;
		}
	}
	printf("%d passed, %d failed, %d skipped\n", pass, fail, skip);
	if (fail)
		return 1;
	return (pass == 0 && skip) ? 77 : 0;
}
