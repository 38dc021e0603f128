// SPDX-License-Identifier: MIT
/*
 * sysfs_preload.c - libursa-preload.so: shows ursa's device where programs
 * look for an RDMA device outside libibverbs.
 *
 * UCX, Open MPI, pyverbs' tests and others do not ask libibverbs everything:
 * they stat /dev/infiniband/uverbs0, read /sys/class/infiniband/<dev>/ports/
 * 1/gid_attrs/ndevs/<i>, list /sys/class/infiniband. A machine without an
 * RDMA kernel stack has none of these, and without root nothing can be
 * created under /sys or /dev. So this small library, loaded first (ursa run
 * puts it in LD_PRELOAD; ursa setup in /etc/ld.so.preload), interposes the
 * libc calls that take a path and sends those three trees to a real
 * directory that ursa's libibverbs writes (ursa_sysfs_export):
 *
 *   /sys/class/infiniband[/...]         -> ROOT/sys/class/infiniband[/...]
 *   /sys/class/infiniband_verbs[/...]   -> ROOT/sys/class/infiniband_verbs...
 *   /dev/infiniband                     -> ROOT/dev/infiniband (a listing)
 *   /dev/infiniband/<node>              -> /dev/null, for the nodes ROOT has
 *
 * A device node is a character device that opens read-write: /dev/null is
 * one, so stat() says S_ISCHR and open(O_RDWR) works; nothing is ever read
 * from it. ROOT is $URSA_SYSROOT, or one per user and network namespace
 * (the GID table is the namespace's addresses): $XDG_RUNTIME_DIR/ursa/
 * sysfs-<netns inode>, or /tmp/ursa-<uid>/sysfs-<netns inode>, the parent
 * a directory of the user's own, mode 0700, checked before use. The tree is
 * written once per process, at the first redirected call, by the libibverbs
 * the process has; if that is not ursa's (no ursa_sysfs_export), nothing is
 * redirected.
 *
 * What it cannot do (docs/design.md, "The device outside libibverbs"):
 * static binaries and raw system calls bypass it; a relative path that
 * walks into these trees from a working directory above them, or one with
 * "//" or "..", is not recognised; a listing of /sys/class does not show
 * "infiniband". It depends on libc and libdl only and allocates nothing.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* The trees redirected, and whether entries below map to /dev/null. */
static const struct {
	const char *prefix;
	size_t len;
	bool node;
} trees[] = {
	{ "/sys/class/infiniband", 21, false },
	{ "/sys/class/infiniband_verbs", 27, false },
	{ "/dev/infiniband", 15, true },
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char root[PATH_MAX / 2];	/* "" when nothing is redirected */
/* Set on the thread that writes the tree: its own calls go through. */
static __thread bool in_setup;

static bool own_private_dir(const char *d)
{
	struct stat st;

	if (mkdir(d, 0700) && errno != EEXIST)
		return false;
	return !lstat(d, &st) && S_ISDIR(st.st_mode) &&
	       st.st_uid == getuid() && !(st.st_mode & 077);
}

/* ROOT as described above; "" if no safe place exists. */
static void pick_root(void)
{
	const char *env = getenv("URSA_SYSROOT");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char base[PATH_MAX / 4];
	struct stat ns;

	if (env && env[0] == '/' && strlen(env) < sizeof(root)) {
		snprintf(root, sizeof(root), "%s", env);
		return;
	}
	if (stat("/proc/self/ns/net", &ns))
		ns.st_ino = 0;
	if (xdg && xdg[0] == '/' && strlen(xdg) < sizeof(base) - 8) {
		snprintf(base, sizeof(base), "%s/ursa", xdg);
		if (own_private_dir(base))
			goto found;
	}
	snprintf(base, sizeof(base), "/tmp/ursa-%u", (unsigned)getuid());
	if (!own_private_dir(base))
		return;
found:
	snprintf(root, sizeof(root), "%s/sysfs-%lu", base,
		 (unsigned long)ns.st_ino);
}

static void setup(void)
{
	int (*export)(const char *);
	void *h;

	in_setup = true;
	pick_root();
	if (!root[0])
		goto out;
	/* The process's own libibverbs if it is loaded, else the one the
	 * library path finds (ursa's, under ursa run or ursa setup). */
	h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	export = h ? (int (*)(const char *))dlsym(h, "ursa_sysfs_export") :
		     NULL;
	if (!export || export(root) < 0)
		root[0] = '\0';
	/* The library stays loaded: a program that uses verbs keeps it. */
out:
	in_setup = false;
}

/* The path to use for p: p itself, or its place under ROOT (in buf). */
static const char *redirect(const char *p, char *buf, size_t len)
{
	if (!p || p[0] != '/' || in_setup)
		return p;
	for (size_t i = 0; i < sizeof(trees) / sizeof(trees[0]); i++) {
		const char *rest = p + trees[i].len;
		struct stat st;

		if (strncmp(p, trees[i].prefix, trees[i].len) ||
		    (*rest && *rest != '/'))
			continue;
		pthread_once(&once, setup);
		if (!root[0])
			return p;
		if ((size_t)snprintf(buf, len, "%s%s", root, p) >= len)
			return p;
		if (trees[i].node && rest[0] == '/' && !strchr(rest + 1, '/')) {
			/* A device node: /dev/null, if the tree has it (as
			 * a symbolic link to /dev/null). */
			int (*real_lstat)(const char *, struct stat *) =
				dlsym(RTLD_NEXT, "lstat");

			if (real_lstat && !real_lstat(buf, &st) &&
			    S_ISLNK(st.st_mode))
				return "/dev/null";
		}
		return buf;
	}
	return p;
}

/* Each wrapper looks up the next definition once; the error value for
 * a libc without it: -1 for an int or ssize_t, NULL for a pointer. */
#define ERR_int -1
#define ERR_ssize_t -1
#define ERR_ptr NULL
#define NEXT_E(ret, err, name, ...)                                       \
	static ret (*next_##name)(__VA_ARGS__);                           \
	if (!next_##name)                                                 \
		next_##name = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name); \
	if (!next_##name) {                                               \
		errno = ENOSYS;                                           \
		return err;                                               \
	}
#define NEXT(ret, name, ...) NEXT_E(ret, ERR_int, name, __VA_ARGS__)

#define PATHBUF char buf_[PATH_MAX]; const char *rp_ = redirect(path, buf_, sizeof(buf_))

/* open(2) and its fortified and 64-bit forms: the mode is there only when
 * O_CREAT or O_TMPFILE asks for it. */
static bool wants_mode(int flags)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

#define OPEN_WRAPPER(name)                                                \
	EXPORT int name(const char *path, int flags, ...);                \
	EXPORT int name(const char *path, int flags, ...)                 \
	{                                                                 \
		mode_t mode = 0;                                          \
		NEXT(int, name, const char *, int, ...)                   \
		if (wants_mode(flags)) {                                  \
			va_list ap;                                       \
			va_start(ap, flags);                              \
			mode = (mode_t)va_arg(ap, int);                   \
			va_end(ap);                                       \
		}                                                         \
		PATHBUF;                                                  \
		return next_##name(rp_, flags, mode);                     \
	}
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                              \
	EXPORT int name(int dirfd, const char *path, int flags, ...);     \
	EXPORT int name(int dirfd, const char *path, int flags, ...)      \
	{                                                                 \
		mode_t mode = 0;                                          \
		NEXT(int, name, int, const char *, int, ...)              \
		if (wants_mode(flags)) {                                  \
			va_list ap;                                       \
			va_start(ap, flags);                              \
			mode = (mode_t)va_arg(ap, int);                   \
			va_end(ap);                                       \
		}                                                         \
		PATHBUF;                                                  \
		return next_##name(dirfd, rp_, flags, mode);              \
	}
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

/* Wrappers whose path is the first argument: name, return type, the
 * remaining parameters' types and names. */
#define PATH1(ret, name, T2, a2)                                          \
	EXPORT ret name(const char *path, T2 a2);                         \
	EXPORT ret name(const char *path, T2 a2)                          \
	{                                                                 \
		NEXT(ret, name, const char *, T2)                         \
		PATHBUF;                                                  \
		return next_##name(rp_, a2);                              \
	}
#define PATH1_3(ret, name, T2, a2, T3, a3)                                \
	EXPORT ret name(const char *path, T2 a2, T3 a3);                  \
	EXPORT ret name(const char *path, T2 a2, T3 a3)                   \
	{                                                                 \
		NEXT(ret, name, const char *, T2, T3)                     \
		PATHBUF;                                                  \
		return next_##name(rp_, a2, a3);                          \
	}
/* ... and those whose path is the second, after a directory fd or a
 * version number (the pre-2.33 __xstat family). */
#define PATH2_3(ret, name, T1, a1, T3, a3)                                \
	EXPORT ret name(T1 a1, const char *path, T3 a3);                  \
	EXPORT ret name(T1 a1, const char *path, T3 a3)                   \
	{                                                                 \
		NEXT(ret, name, T1, const char *, T3)                     \
		PATHBUF;                                                  \
		return next_##name(a1, rp_, a3);                          \
	}
#define PATH2_4(ret, name, T1, a1, T3, a3, T4, a4)                        \
	EXPORT ret name(T1 a1, const char *path, T3 a3, T4 a4);           \
	EXPORT ret name(T1 a1, const char *path, T3 a3, T4 a4)            \
	{                                                                 \
		NEXT(ret, name, T1, const char *, T3, T4)                 \
		PATHBUF;                                                  \
		return next_##name(a1, rp_, a3, a4);                      \
	}

PATH1(int, __open_2, int, flags)
PATH1(int, __open64_2, int, flags)
PATH2_3(int, __openat_2, int, dirfd, int, flags)
PATH2_3(int, __openat64_2, int, dirfd, int, flags)
PATH1(int, stat, struct stat *, st)
PATH1(int, lstat, struct stat *, st)
PATH1(int, stat64, struct stat64 *, st)
PATH1(int, lstat64, struct stat64 *, st)
PATH2_4(int, fstatat, int, dirfd, struct stat *, st, int, flags)
PATH2_4(int, fstatat64, int, dirfd, struct stat64 *, st, int, flags)
PATH2_3(int, __xstat, int, ver, struct stat *, st)
PATH2_3(int, __lxstat, int, ver, struct stat *, st)
PATH2_3(int, __xstat64, int, ver, struct stat64 *, st)
PATH2_3(int, __lxstat64, int, ver, struct stat64 *, st)
PATH1(int, access, int, mode)
PATH1(int, euidaccess, int, mode)
PATH1(int, eaccess, int, mode)
PATH2_4(int, faccessat, int, dirfd, int, mode, int, flags)
PATH1_3(ssize_t, readlink, char *, out, size_t, len)
PATH2_4(ssize_t, readlinkat, int, dirfd, char *, out, size_t, len)

#define FOPEN(name)                                                       \
	EXPORT FILE *name(const char *path, const char *mode);            \
	EXPORT FILE *name(const char *path, const char *mode)             \
	{                                                                 \
		NEXT_E(FILE *, ERR_ptr, name, const char *, const char *) \
		PATHBUF;                                                  \
		return next_##name(rp_, mode);                            \
	}
#define FREOPEN(name)                                                     \
	EXPORT FILE *name(const char *path, const char *mode, FILE *f);   \
	EXPORT FILE *name(const char *path, const char *mode, FILE *f)    \
	{                                                                 \
		NEXT_E(FILE *, ERR_ptr, name, const char *, const char *, \
		       FILE *)                                            \
		PATHBUF;                                                  \
		return next_##name(rp_, mode, f);                         \
	}
FOPEN(fopen)
FOPEN(fopen64)
FREOPEN(freopen)
FREOPEN(freopen64)

EXPORT int chdir(const char *path);
EXPORT int chdir(const char *path)
{
	NEXT(int, chdir, const char *)
	PATHBUF;
	return next_chdir(rp_);
}

/* ls -l asks for extended attributes (ACLs, security labels). */
PATH1_3(ssize_t, listxattr, char *, list, size_t, len)
PATH1_3(ssize_t, llistxattr, char *, list, size_t, len)

#define GETXATTR(name)                                                    \
	EXPORT ssize_t name(const char *path, const char *key, void *v,   \
			    size_t len);                                  \
	EXPORT ssize_t name(const char *path, const char *key, void *v,   \
			    size_t len)                                   \
	{                                                                 \
		NEXT(ssize_t, name, const char *, const char *, void *,   \
		     size_t)                                              \
		PATHBUF;                                                  \
		return next_##name(rp_, key, v, len);                     \
	}
GETXATTR(getxattr)
GETXATTR(lgetxattr)

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask,
		 struct statx *st);
EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask,
		 struct statx *st)
{
	NEXT(int, statx, int, const char *, int, unsigned int, struct statx *)
	PATHBUF;
	return next_statx(dirfd, rp_, flags, mask, st);
}

EXPORT DIR *opendir(const char *path);
EXPORT DIR *opendir(const char *path)
{
	NEXT_E(DIR *, ERR_ptr, opendir, const char *)
	PATHBUF;
	return next_opendir(rp_);
}

typedef int (*scan_filter)(const struct dirent *);
typedef int (*scan_cmp)(const struct dirent **, const struct dirent **);
EXPORT int scandir(const char *path, struct dirent ***list, scan_filter f,
		   scan_cmp c);
EXPORT int scandir(const char *path, struct dirent ***list, scan_filter f,
		   scan_cmp c)
{
	NEXT(int, scandir, const char *, struct dirent ***, scan_filter,
	     scan_cmp)
	PATHBUF;
	return next_scandir(rp_, list, f, c);
}

typedef int (*scan_filter64)(const struct dirent64 *);
typedef int (*scan_cmp64)(const struct dirent64 **, const struct dirent64 **);
EXPORT int scandir64(const char *path, struct dirent64 ***list,
		     scan_filter64 f, scan_cmp64 c);
EXPORT int scandir64(const char *path, struct dirent64 ***list,
		     scan_filter64 f, scan_cmp64 c)
{
	NEXT(int, scandir64, const char *, struct dirent64 ***, scan_filter64,
	     scan_cmp64)
	PATHBUF;
	return next_scandir64(rp_, list, f, c);
}

/* realpath answers in the redirected view: the same path a real sysfs
 * would give for a directory that is not a symbolic link. res is the
 * resolved form of ROOT + path (resolved by real_realpath); strip ROOT's. */
static char *unredirect(char *res, const char *rp,
			char *(*real_realpath)(const char *, char *))
{
	char rroot[PATH_MAX];
	size_t n;

	if (!res || !strcmp(rp, "/dev/null") || !real_realpath(root, rroot))
		return res;
	n = strlen(rroot);
	if (!strncmp(res, rroot, n) && res[n] == '/')
		memmove(res, res + n, strlen(res + n) + 1);
	return res;
}

EXPORT char *realpath(const char *path, char *resolved);
EXPORT char *realpath(const char *path, char *resolved)
{
	NEXT_E(char *, ERR_ptr, realpath, const char *, char *)
	PATHBUF;
	if (rp_ == path)
		return next_realpath(path, resolved);
	return unredirect(next_realpath(rp_, resolved), rp_, next_realpath);
}

EXPORT char *canonicalize_file_name(const char *path);
EXPORT char *canonicalize_file_name(const char *path)
{
	NEXT_E(char *, ERR_ptr, canonicalize_file_name, const char *)
	PATHBUF;
	if (rp_ == path)
		return next_canonicalize_file_name(path);
	{
		NEXT_E(char *, ERR_ptr, realpath, const char *, char *)
		return unredirect(next_canonicalize_file_name(rp_), rp_,
				  next_realpath);
	}
}
