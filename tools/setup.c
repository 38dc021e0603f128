// SPDX-License-Identifier: MIT
/*
 * setup.c - ursa setup: make ursa the RDMA device of every program on the
 * host however it is started (mpirun over ssh, a service, a shell that
 * never saw `ursa run`); ursa setup --undo takes it back.
 *
 * ursa run shows the device to one program and its children through two
 * environment variables (LD_LIBRARY_PATH, LD_PRELOAD). setup writes the
 * same two things where the dynamic loader reads them for every process:
 *
 *   /usr/local/lib/ursa-setup/       root-owned copies of libibverbs.so.1,
 *                                    the provider stand-ins and
 *                                    libursa-preload.so
 *   /etc/ld.so.conf.d/00-ursa.conf   that directory, read before the
 *                                    system's library directories (ldconfig
 *                                    then lists ursa's libibverbs.so.1 first)
 *   /etc/ld.so.preload               + that directory's libursa-preload.so
 *
 * Copies, not the build tree: what /etc/ld.so.preload names is loaded into
 * every process, set-user-ID ones included, so it must be a file no
 * ordinary user can change, and it must survive `make clean`. Run setup
 * again after rebuilding. The directory keeps a record of the preload lines
 * setup added and whether it created the file; --undo removes exactly
 * those lines (the file if setup created it), the configuration file and
 * the copies, and runs ldconfig.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "setup.h"

#define SETUP_DIR "/usr/local/lib/ursa-setup"
#define CONF "/etc/ld.so.conf.d/00-ursa.conf"
#define PRELOAD_LIST "/etc/ld.so.preload"
#define RECORD SETUP_DIR "/setup-record"
#define PRELOAD_LIB SETUP_DIR "/libursa-preload.so"
#define MAX_LIST (1 << 20)	/* the longest /etc/ld.so.preload we edit */

#ifdef __SANITIZE_ADDRESS__
extern void __asan_init(void);
#endif

const char *asan_runtime(void)
{
#ifdef __SANITIZE_ADDRESS__
	Dl_info info;

	if (dladdr((void *)__asan_init, &info) && info.dli_fname &&
	    info.dli_fname[0] == '/')
		return info.dli_fname;
#endif
	return NULL;
}

/* Write len bytes to path through a temporary file and a rename, so that
 * no process ever loads or reads a half-written file. */
static int write_atomic(const char *path, const void *buf, size_t len,
			mode_t mode)
{
	char tmp[PATH_MAX];
	int fd, err = 0;

	snprintf(tmp, sizeof(tmp), "%s.ursa-tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	for (size_t off = 0; off < len;) {
		ssize_t n = write(fd, (const char *)buf + off, len - off);

		if (n < 0) {
			err = -errno;
			break;
		}
		off += (size_t)n;
	}
	if (!err && (fchmod(fd, mode) || fsync(fd)))
		err = -errno;
	if (close(fd) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

/* The whole of a small file, NUL-terminated, in *out (free it); -ENOENT if
 * it does not exist. */
static int read_small(const char *path, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *buf;
	size_t n = 0;

	if (fd < 0)
		return -errno;
	buf = malloc(MAX_LIST + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		ssize_t r = read(fd, buf + n, MAX_LIST - n);

		if (r < 0) {
			int e = -errno;

			free(buf);
			close(fd);
			return e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == MAX_LIST) {
			free(buf);
			close(fd);
			return -EFBIG;
		}
	}
	close(fd);
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

static int copy_file(const char *src, const char *dst)
{
	char *buf;
	size_t len;
	int fd = open(src, O_RDONLY | O_CLOEXEC), err;
	struct stat st;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		err = -errno;
		close(fd);
		return err;
	}
	len = (size_t)st.st_size;
	buf = malloc(len ? len : 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (size_t off = 0; off < len;) {
		ssize_t n = read(fd, buf + off, len - off);

		if (n <= 0) {
			err = n < 0 ? -errno : -EIO;
			free(buf);
			close(fd);
			return err;
		}
		off += (size_t)n;
	}
	close(fd);
	err = write_atomic(dst, buf, len, 0755);
	free(buf);
	return err;
}

/* Copy the libraries of lib (regular files lib*.so*) into SETUP_DIR. */
static int copy_libs(const char *lib, int *count)
{
	DIR *d = opendir(lib);
	struct dirent *e;
	int err = 0;

	*count = 0;
	if (!d)
		return -errno;
	while (!err && (e = readdir(d))) {
		char src[PATH_MAX], dst[PATH_MAX];
		struct stat st;

		if (strncmp(e->d_name, "lib", 3) || !strstr(e->d_name, ".so"))
			continue;
		snprintf(src, sizeof(src), "%s/%s", lib, e->d_name);
		if (lstat(src, &st) || !S_ISREG(st.st_mode))
			continue;
		snprintf(dst, sizeof(dst), "%s/%s", SETUP_DIR, e->d_name);
		err = copy_file(src, dst);
		if (err)
			fprintf(stderr, "ursa setup: %s: %s\n", dst, strerror(-err));
		else
			(*count)++;
	}
	closedir(d);
	return err;
}

static int run_ldconfig(void)
{
	static const char *const paths[] = { "/sbin/ldconfig", "/usr/sbin/ldconfig" };
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
			execl(paths[i], "ldconfig", (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ECHILD;
}

/* Is line (len bytes, no newline) one of the entries in the record? */
static bool recorded(const char *record, const char *line, size_t len)
{
	const char *p = record;

	while (p && *p) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);

		if (n > 8 && !strncmp(p, "preload ", 8) && n - 8 == len &&
		    !strncmp(p + 8, line, len))
			return true;
		p = nl ? nl + 1 : NULL;
	}
	return false;
}

/* Does the preload list hold the line want? */
static bool has_line(const char *list, const char *want)
{
	size_t wl = strlen(want);

	for (const char *p = list; p && *p;) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);

		while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r'))
			n--;
		if (n == wl && !strncmp(p, want, n))
			return true;
		p = nl ? nl + 1 : NULL;
	}
	return false;
}

/* A kernel RDMA stack's own devices, which setup hides. Asked with a raw
 * system call: a libursa-preload.so already loaded by an earlier setup
 * would answer with ursa's tree. */
static bool kernel_rdma_present(void)
{
	return syscall(SYS_faccessat, AT_FDCWD, "/sys/class/infiniband", F_OK) == 0;
}

static int do_setup(const char *lib)
{
	char *list = NULL, record[2 * PATH_MAX + 64], *out;
	const char *asan = asan_runtime();
	size_t len = 0, rl = 0, ol = 0;
	bool created = false;
	int err, n;

	if (mkdir(SETUP_DIR, 0755) && errno != EEXIST) {
		fprintf(stderr, "ursa setup: %s: %s\n", SETUP_DIR, strerror(errno));
		return 1;
	}
	err = copy_libs(lib, &n);
	if (err || n == 0) {
		fprintf(stderr, "ursa setup: could not copy the libraries of %s\n", lib);
		return 1;
	}
	printf("ursa setup: copied %d libraries from %s to %s\n", n, lib, SETUP_DIR);

	static const char conf[] = "# written by ursa setup; ursa setup --undo removes it\n"
				   SETUP_DIR "\n";
	err = write_atomic(CONF, conf, sizeof(conf) - 1, 0644);
	if (!err)
		err = run_ldconfig();
	if (err) {
		fprintf(stderr, "ursa setup: %s or ldconfig: %s\n", CONF, strerror(-err));
		return 1;
	}
	printf("ursa setup: %s puts them before the system's (ldconfig run)\n", CONF);

	/* The preload list: the ASan runtime first in a sanitizer build (as
	 * ursa run does), then ours after what is there. What we add goes in
	 * the record, unless an earlier setup added it already. */
	err = read_small(PRELOAD_LIST, &list, &len);
	if (err == -ENOENT) {
		created = true;
		list = calloc(1, 1);
		if (!list)
			return 1;
	} else if (err) {
		fprintf(stderr, "ursa setup: %s: %s\n", PRELOAD_LIST, strerror(-err));
		return 1;
	}
	{
		char *old = NULL;
		size_t oldl;

		if (!read_small(RECORD, &old, &oldl)) {
			created |= strstr(old, "created-list\n") != NULL;
			rl = (size_t)snprintf(record, sizeof(record), "%s", old);
			free(old);
		}
	}
	out = malloc(len + 2 * PATH_MAX + 8);
	if (!out) {
		free(list);
		return 1;
	}
	if (asan && !has_line(list, asan)) {
		ol += (size_t)sprintf(out + ol, "%s\n", asan);
		rl += (size_t)snprintf(record + rl, sizeof(record) - rl, "preload %s\n", asan);
	}
	memcpy(out + ol, list, len);
	ol += len;
	if (ol && out[ol - 1] != '\n')
		out[ol++] = '\n';
	if (!has_line(list, PRELOAD_LIB)) {
		ol += (size_t)sprintf(out + ol, "%s\n", PRELOAD_LIB);
		rl += (size_t)snprintf(record + rl, sizeof(record) - rl,
				       "preload %s\n", PRELOAD_LIB);
	}
	if (created && !strstr(record, "created-list\n"))
		rl += (size_t)snprintf(record + rl, sizeof(record) - rl, "created-list\n");
	free(list);
	err = write_atomic(RECORD, record, rl, 0644);
	if (!err)
		err = write_atomic(PRELOAD_LIST, out, ol, 0644);
	free(out);
	if (err) {
		fprintf(stderr, "ursa setup: %s: %s\n", PRELOAD_LIST, strerror(-err));
		return 1;
	}
	printf("ursa setup: %s loads %s into every program\n", PRELOAD_LIST, PRELOAD_LIB);
	if (kernel_rdma_present())
		printf("ursa setup: note: this host has a kernel RDMA stack; its devices are "
		       "hidden behind ursa's until ursa setup --undo\n");
	printf("ursa setup: done: programs started any way on this host now use ursa "
	       "(undo: ursa setup --undo; after rebuilding ursa, run ursa setup again)\n");
	return 0;
}

static int do_undo(void)
{
	char *list = NULL, *record = NULL, *out;
	size_t len = 0, rlen = 0, ol = 0;
	bool created, did = false;
	DIR *d;
	int err;

	if (read_small(RECORD, &record, &rlen)) {
		/* No record (an interrupted setup): our own line only. */
		record = strdup("preload " PRELOAD_LIB "\n");
		if (!record)
			return 1;
	}
	created = strstr(record, "created-list\n") != NULL;
	err = read_small(PRELOAD_LIST, &list, &len);
	if (!err) {
		out = malloc(len + 1);
		if (!out)
			return 1;
		for (const char *p = list; *p;) {
			const char *nl = strchr(p, '\n');
			size_t n = nl ? (size_t)(nl - p) : strlen(p), t = n;

			while (t && (p[t - 1] == ' ' || p[t - 1] == '\t' || p[t - 1] == '\r'))
				t--;
			if (t && recorded(record, p, t)) {
				did = true;
			} else {
				memcpy(out + ol, p, n);
				ol += n;
				if (nl)
					out[ol++] = '\n';
			}
			p = nl ? nl + 1 : p + n;
		}
		if (did) {
			bool empty = true;

			for (size_t i = 0; i < ol; i++)
				if (out[i] != ' ' && out[i] != '\n' && out[i] != '\t')
					empty = false;
			if (created && empty)
				err = unlink(PRELOAD_LIST) ? -errno : 0;
			else
				err = write_atomic(PRELOAD_LIST, out, ol, 0644);
			if (err) {
				fprintf(stderr, "ursa setup --undo: %s: %s\n", PRELOAD_LIST,
					strerror(-err));
				free(out);
				free(list);
				free(record);
				return 1;
			}
			printf("ursa setup --undo: %s no longer loads ursa\n", PRELOAD_LIST);
		}
		free(out);
		free(list);
	}
	free(record);
	if (!unlink(CONF)) {
		did = true;
		if (run_ldconfig())
			fprintf(stderr, "ursa setup --undo: ldconfig failed\n");
		printf("ursa setup --undo: removed %s (ldconfig run)\n", CONF);
	}
	d = opendir(SETUP_DIR);
	if (d) {
		struct dirent *e;

		while ((e = readdir(d))) {
			char p[PATH_MAX];

			if (e->d_name[0] == '.' && (!e->d_name[1] ||
						    (e->d_name[1] == '.' && !e->d_name[2])))
				continue;
			snprintf(p, sizeof(p), "%s/%s", SETUP_DIR, e->d_name);
			unlink(p);
		}
		closedir(d);
		if (!rmdir(SETUP_DIR)) {
			did = true;
			printf("ursa setup --undo: removed %s\n", SETUP_DIR);
		}
	}
	if (!did)
		printf("ursa setup --undo: nothing to undo\n");
	return 0;
}

int cmd_setup(const char *lib, int argc, char **argv)
{
	bool undo = argc == 2 && !strcmp(argv[1], "--undo");

	if (argc > 2 || (argc == 2 && !undo)) {
		fprintf(stderr, "usage: ursa setup [--undo]\n");
		return 2;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "ursa setup: needs root (it writes %s and %s); without "
			"root, start programs with: ursa run -- PROG\n", PRELOAD_LIST, CONF);
		return 1;
	}
	return undo ? do_undo() : do_setup(lib);
}
