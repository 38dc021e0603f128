// SPDX-License-Identifier: MIT
/*
 * sysroot.c - the device's sysfs directory and device node, written out as
 * a real tree for libursa-preload.so (src/preload/sysfs_preload.c).
 *
 * ursa_sysfs_export(root) writes, under root, what a kernel with rxe loaded
 * shows: sys/class/infiniband/<dev>/ (identity files, ports/1/ with state,
 * rate, link layer, the GID table with gid_attrs/types and ndevs, pkeys),
 * device/net/<interface> (a link to the interface the port follows),
 * sys/class/infiniband_verbs/ (abi_version, uverbs0/ibdev, dev) and
 * dev/infiniband/uverbs0 (a symbolic link to /dev/null, which the preload
 * library hands out as the node). The contents are those
 * ibv_read_sysfs_file answers for the device (sysfs.c), one per file with
 * the kernel's trailing newline.
 *
 * root is a symbolic link to a generation directory named after a hash of
 * the contents, so that a process whose device looks different (a GID
 * came or went) builds a new generation beside the old one and swaps the
 * link with one rename: readers see the old tree or the new one, never
 * half of either, and processes that agree write nothing.
 */
#include "verbs.h"

#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT URSA_EXPORT

/* The uverbs char device's number on a kernel with one RDMA device. */
#define UVERBS_DEV "231:192"

struct entry {
	char rel[96];
	char val[64];
};

struct tree {
	struct entry e[16 + 3 * URSA_MAX_GIDS + 8];
	int n;
};

static void add(struct tree *t, const char *val, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void add(struct tree *t, const char *val, const char *fmt, ...)
{
	va_list ap;

	if (t->n >= (int)ARRAY_SIZE(t->e))
		return;
	va_start(ap, fmt);
	vsnprintf(t->e[t->n].rel, sizeof(t->e[t->n].rel), fmt, ap);
	va_end(ap);
	snprintf(t->e[t->n].val, sizeof(t->e[t->n].val), "%s", val);
	t->n++;
}

/* A device file, as ibv_read_sysfs_file answers it; skipped if it has no
 * value (a GID attribute of an empty entry). */
static void add_dev(struct tree *t, const char *name, const char *rel)
{
	char v[64];

	if (ursa_sysfs_file(rel, v, sizeof(v)) < 0)
		return;
	add(t, v, "sys/class/infiniband/%s/%s", name, rel);
}

static void build(struct tree *t, struct ursa_device *dev)
{
	static const char *const files[] = {
		"node_type", "node_guid", "sys_image_guid", "fw_ver",
		"hw_rev", "hca_type", "board_id", "node_desc", "parent",
		"ports/1/state", "ports/1/phys_state", "ports/1/link_layer",
		"ports/1/lid", "ports/1/sm_lid", "ports/1/lid_mask_count",
		"ports/1/sm_sl", "ports/1/rate", "ports/1/cap_mask",
		"ports/1/pkeys/0",
	};
	const char *name = dev->ibdev.name;
	char rel[64];

	t->n = 0;
	for (size_t i = 0; i < ARRAY_SIZE(files); i++)
		add_dev(t, name, files[i]);
	for (int i = 0; i < URSA_MAX_GIDS; i++) {
		snprintf(rel, sizeof(rel), "ports/1/gids/%d", i);
		add_dev(t, name, rel);
		snprintf(rel, sizeof(rel), "ports/1/gid_attrs/types/%d", i);
		add_dev(t, name, rel);
		snprintf(rel, sizeof(rel), "ports/1/gid_attrs/ndevs/%d", i);
		add_dev(t, name, rel);
	}
	/* The layout's version: a generation of another layout (files this
	 * code no longer writes, or not yet) has another name. */
	add(t, "2", ".ursa-layout");
	add(t, "6", "sys/class/infiniband_verbs/abi_version");
	add(t, name, "sys/class/infiniband_verbs/%s/ibdev", dev->ibdev.dev_name);
	add(t, "1", "sys/class/infiniband_verbs/%s/abi_version",
	    dev->ibdev.dev_name);
	add(t, UVERBS_DEV, "sys/class/infiniband_verbs/%s/dev",
	    dev->ibdev.dev_name);
}

static uint64_t hash_tree(const struct tree *t)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (int i = 0; i < t->n; i++) {
		for (const char *p = t->e[i].rel; *p; p++)
			h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
		h = (h ^ 0xff) * 0x100000001b3ull;
		for (const char *p = t->e[i].val; *p; p++)
			h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
		h = (h ^ 0xfe) * 0x100000001b3ull;
	}
	return h;
}

/* snprintf into a PATH_MAX buffer; -ENAMETOOLONG if it does not fit. */
static int pathf(char *buf, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int pathf(char *buf, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, PATH_MAX, fmt, ap);
	va_end(ap);
	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* mkdir -p for the directories above dir/rel's last component. */
static int make_parents(const char *dir, const char *rel)
{
	char p[PATH_MAX];
	size_t dl = strlen(dir);

	if (pathf(p, "%s/%s", dir, rel))
		return -ENAMETOOLONG;
	for (char *s = p + dl + 1; (s = strchr(s, '/')); s++) {
		*s = '\0';
		if (mkdir(p, 0755) && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	return 0;
}

static int write_file(const char *dir, const struct entry *e)
{
	char p[PATH_MAX];
	size_t len = strlen(e->val);
	int fd, r = 0;

	if (make_parents(dir, e->rel) || pathf(p, "%s/%s", dir, e->rel))
		return -EIO;
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
	if (fd < 0)
		return -errno;
	if (write(fd, e->val, len) != (ssize_t)len || write(fd, "\n", 1) != 1)
		r = -EIO;
	close(fd);
	return r;
}

static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char p[PATH_MAX];

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (pathf(p, "%s/%s", dir, de->d_name))
			continue;
		if (de->d_type == DT_DIR)
			remove_tree(p);
		else
			unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* Build generation dir gen (named by hash) from t, via a private name. */
static int write_gen(const char *gen, const struct tree *t,
		     struct ursa_device *dev)
{
	char tmp[PATH_MAX], p[PATH_MAX];
	int r = 0;

	if (pathf(tmp, "%s.tmp%d", gen, (int)getpid()))
		return -ENAMETOOLONG;
	remove_tree(tmp);
	if (mkdir(tmp, 0755))
		return -errno;
	for (int i = 0; i < t->n && !r; i++)
		r = write_file(tmp, &t->e[i]);
	if (!r) {
		r = pathf(p, "dev/infiniband/%s", dev->ibdev.dev_name);
		if (!r)
			r = make_parents(tmp, p);
		if (!r)
			r = pathf(p, "%s/dev/infiniband/%s", tmp,
				  dev->ibdev.dev_name);
		if (!r && symlink("/dev/null", p))
			r = -errno;
	}
	/* device/net/<if>: the network interface of the device, where
	 * programs (pyverbs' tests) look for the addresses to use. */
	if (!r && dev->netdev[0]) {
		char to[64];

		r = pathf(p, "sys/class/infiniband/%s/device/net/%s",
			  dev->ibdev.name, dev->netdev);
		if (!r)
			r = make_parents(tmp, p);
		if (!r)
			r = pathf(p, "%s/sys/class/infiniband/%s/device/net/%s",
				  tmp, dev->ibdev.name, dev->netdev);
		snprintf(to, sizeof(to), "/sys/class/net/%s", dev->netdev);
		if (!r && symlink(to, p))
			r = -errno;
	}
	/* Another process may have built the same generation meanwhile:
	 * then its copy stands. */
	if (!r && rename(tmp, gen) && errno != EEXIST && errno != ENOTEMPTY)
		r = -errno;
	remove_tree(tmp);
	return r;
}

EXPORT int ursa_sysfs_export(const char *root)
{
	struct ursa_device *dev = ursa_device_get();
	char gen[PATH_MAX], cur[PATH_MAX], lnk[PATH_MAX];
	const char *base;
	struct tree *t;
	struct stat st;
	ssize_t n;
	int r;

	if (!dev)
		return -ENODEV;
	if (!root || root[0] != '/' || strlen(root) > PATH_MAX - 64)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	build(t, dev);
	r = 0;
	if (pathf(gen, "%s.%016llx", root, (unsigned long long)hash_tree(t))) {
		r = -ENAMETOOLONG;
		goto out;
	}
	base = strrchr(gen, '/') + 1;
	n = readlink(root, cur, sizeof(cur) - 1);
	if (n >= 0)
		cur[n] = '\0';
	else
		cur[0] = '\0';
	if (n >= 0 && !strcmp(cur, base) && !stat(gen, &st))
		goto out;	/* the tree stands as this process sees it */
	if (stat(gen, &st))
		r = write_gen(gen, t, dev);
	if (r)
		goto out;
	if (pathf(lnk, "%s.lnk%d", root, (int)getpid()))
		goto out;
	unlink(lnk);
	if (symlink(base, lnk) || rename(lnk, root)) {
		r = -errno;
		unlink(lnk);
		goto out;
	}
	/* The generation the link named before is no longer reachable. */
	if (cur[0] && strcmp(cur, base) && !strchr(cur, '/')) {
		if (!pathf(lnk, "%.*s%s", (int)(strrchr(root, '/') + 1 - root),
			   root, cur))
			remove_tree(lnk);
	}
out:
	free(t);
	return r;
}
