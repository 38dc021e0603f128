// SPDX-License-Identifier: MIT
/*
 * uffd.c - the userfaultfd behind uffd.h: opened at the first watched
 * range, read by one watcher thread that hands each unmapped, moved or
 * removed range to the handler. URSA_UFFD=0 turns it off.
 */
#include "uffd.h"
#include "../util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1	/* (Linux 5.11) */
#endif

static pthread_mutex_t uffd_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int ufd = -1;	/* -1 not tried yet, -2 unavailable */
static ursa_uffd_gone_fn gone;

void ursa_uffd_set_handler(ursa_uffd_gone_fn fn)
{
	gone = fn;
}

static void handle(int fd, const struct uffd_msg *m)
{
	switch (m->event) {
	case UFFD_EVENT_UNMAP:
	case UFFD_EVENT_REMOVE:
		gone((uintptr_t)m->arg.remove.start, (uintptr_t)m->arg.remove.end);
		break;
	case UFFD_EVENT_REMAP:
		/* the pages moved: the MRs over the old addresses lose them */
		gone((uintptr_t)m->arg.remap.from,
		     (uintptr_t)(m->arg.remap.from + m->arg.remap.len));
		break;
	case UFFD_EVENT_PAGEFAULT: {
		/* Never asked for (nothing is write-protected); should one
		 * come, release the page rather than leave a thread stuck. */
		struct uffdio_writeprotect wp = {
			.range = { m->arg.pagefault.address & ~4095ull, 4096 },
			.mode = 0,
		};

		ioctl(fd, UFFDIO_WRITEPROTECT, &wp);
		break;
	}
	}
}

static void *watcher(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct uffd_msg m[16];

	for (;;) {
		ssize_t n = read(fd, m, sizeof(m));

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			break;
		for (size_t i = 0; i < (size_t)n / sizeof(m[0]); i++)
			handle(fd, &m[i]);
	}
	return NULL;
}

/* Under uffd_mu: the descriptor and its thread, or -2. */
static int open_locked(void)
{
	struct uffdio_api api = {
		.api = UFFD_API,
		.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP |
			    UFFD_FEATURE_EVENT_REMOVE,
	};
	sigset_t all, old;
	pthread_attr_t at;
	pthread_t t;
	int fd;

	if (!ursa_cfg()->uffd)
		return -2;
	fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	if (fd < 0) {
		ursa_info("userfaultfd unavailable (%s): an MR follows its addresses when its memory is unmapped",
			  strerror(errno));
		return -2;
	}
	if (ioctl(fd, UFFDIO_API, &api)) {
		ursa_info("userfaultfd without unmap events (%s)", strerror(errno));
		close(fd);
		return -2;
	}
	/* The watcher takes no signal meant for the program. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 64 << 10);
	if (pthread_create(&t, &at, watcher, (void *)(intptr_t)fd)) {
		close(fd);
		fd = -2;
	} else {
		pthread_setname_np(t, "ursa-uffd");
	}
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return fd;
}

static int get_fd(void)
{
	int fd = atomic_load_explicit(&ufd, memory_order_acquire);

	if (fd != -1)
		return fd;
	if (!gone)
		return -2;	/* (no device yet: nothing to watch for) */
	pthread_mutex_lock(&uffd_mu);
	fd = atomic_load_explicit(&ufd, memory_order_relaxed);
	if (fd == -1) {
		fd = open_locked();
		atomic_store_explicit(&ufd, fd, memory_order_release);
	}
	pthread_mutex_unlock(&uffd_mu);
	return fd;
}

bool ursa_uffd_active(void)
{
	return get_fd() >= 0;
}

bool ursa_uffd_watch(uintptr_t start, size_t len)
{
	struct uffdio_register r = {
		.range = { start, len },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};
	int fd = get_fd();

	/* EINVAL: a mapping in the range that cannot be registered (a
	 * private file mapping, for one): not watched */
	return fd >= 0 && !ioctl(fd, UFFDIO_REGISTER, &r);
}

void ursa_uffd_unwatch(uintptr_t start, size_t len)
{
	struct uffdio_range r = { start, len };
	int fd = atomic_load_explicit(&ufd, memory_order_acquire);

	/* (a range no longer mapped, or never watched, is fine) */
	if (fd >= 0)
		ioctl(fd, UFFDIO_UNREGISTER, &r);
}

void ursa_uffd_atfork_child(void)
{
	int fd = atomic_load_explicit(&ufd, memory_order_relaxed);

	/* the parent's descriptor registers ranges of the parent's memory:
	 * never use it here */
	if (fd >= 0)
		close(fd);
	atomic_store_explicit(&ufd, -1, memory_order_relaxed);
	pthread_mutex_init(&uffd_mu, NULL);
}
