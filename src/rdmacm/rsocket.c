// SPDX-License-Identifier: MIT
/*
 * rsocket.c - the rsockets calls of librdmacm's ABI (RDMACM_1.0).
 *
 * Not implemented yet: rsocket() fails with ENOSYS, so no rsocket
 * descriptor ever exists and every call on one fails with EBADF, as it
 * would for a descriptor rsockets does not know. rpoll and rselect take
 * ordinary descriptors as the real ones do (rping, ucmatose and udaddy
 * import rpoll), and pass them to poll(2) and select(2). They are here
 * because programs are linked with BIND_NOW: a missing symbol would stop
 * every one of them before main.
 */
#include "cma.h"

#include <errno.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

static int none(void)
{
	errno = EBADF;
	return -1;
}

CMA_EXPORT int rsocket(int domain, int type, int protocol)
{
	(void)domain, (void)type, (void)protocol;
	errno = ENOSYS;
	return -1;
}

CMA_EXPORT int rbind(int s, const struct sockaddr *a, socklen_t l)
{
	(void)s, (void)a, (void)l;
	return none();
}

CMA_EXPORT int rlisten(int s, int backlog)
{
	(void)s, (void)backlog;
	return none();
}

CMA_EXPORT int raccept(int s, struct sockaddr *a, socklen_t *l)
{
	(void)s, (void)a, (void)l;
	return none();
}

CMA_EXPORT int rconnect(int s, const struct sockaddr *a, socklen_t l)
{
	(void)s, (void)a, (void)l;
	return none();
}

CMA_EXPORT int rshutdown(int s, int how)
{
	(void)s, (void)how;
	return none();
}

CMA_EXPORT int rclose(int s)
{
	(void)s;
	return none();
}

CMA_EXPORT ssize_t rrecv(int s, void *b, size_t n, int f)
{
	(void)s, (void)b, (void)n, (void)f;
	return none();
}

CMA_EXPORT ssize_t rrecvfrom(int s, void *b, size_t n, int f,
			     struct sockaddr *a, socklen_t *l)
{
	(void)s, (void)b, (void)n, (void)f, (void)a, (void)l;
	return none();
}

CMA_EXPORT ssize_t rrecvmsg(int s, struct msghdr *m, int f)
{
	(void)s, (void)m, (void)f;
	return none();
}

CMA_EXPORT ssize_t rsend(int s, const void *b, size_t n, int f)
{
	(void)s, (void)b, (void)n, (void)f;
	return none();
}

CMA_EXPORT ssize_t rsendto(int s, const void *b, size_t n, int f,
			   const struct sockaddr *a, socklen_t l)
{
	(void)s, (void)b, (void)n, (void)f, (void)a, (void)l;
	return none();
}

CMA_EXPORT ssize_t rsendmsg(int s, const struct msghdr *m, int f)
{
	(void)s, (void)m, (void)f;
	return none();
}

CMA_EXPORT ssize_t rread(int s, void *b, size_t n)
{
	(void)s, (void)b, (void)n;
	return none();
}

CMA_EXPORT ssize_t rreadv(int s, const struct iovec *v, int n)
{
	(void)s, (void)v, (void)n;
	return none();
}

CMA_EXPORT ssize_t rwrite(int s, const void *b, size_t n)
{
	(void)s, (void)b, (void)n;
	return none();
}

CMA_EXPORT ssize_t rwritev(int s, const struct iovec *v, int n)
{
	(void)s, (void)v, (void)n;
	return none();
}

CMA_EXPORT int rpoll(struct pollfd *fds, nfds_t n, int timeout)
{
	return poll(fds, n, timeout);
}

CMA_EXPORT int rselect(int n, fd_set *r, fd_set *w, fd_set *e,
		       struct timeval *t)
{
	return select(n, r, w, e, t);
}

CMA_EXPORT int rgetpeername(int s, struct sockaddr *a, socklen_t *l)
{
	(void)s, (void)a, (void)l;
	return none();
}

CMA_EXPORT int rgetsockname(int s, struct sockaddr *a, socklen_t *l)
{
	(void)s, (void)a, (void)l;
	return none();
}

CMA_EXPORT int rsetsockopt(int s, int lv, int o, const void *v, socklen_t l)
{
	(void)s, (void)lv, (void)o, (void)v, (void)l;
	return none();
}

CMA_EXPORT int rgetsockopt(int s, int lv, int o, void *v, socklen_t *l)
{
	(void)s, (void)lv, (void)o, (void)v, (void)l;
	return none();
}

CMA_EXPORT int rfcntl(int s, int cmd, ...)
{
	(void)s, (void)cmd;
	return none();
}

CMA_EXPORT off_t riomap(int s, void *b, size_t n, int p, int f, off_t o)
{
	(void)s, (void)b, (void)n, (void)p, (void)f, (void)o;
	return none();
}

CMA_EXPORT int riounmap(int s, void *b, size_t n)
{
	(void)s, (void)b, (void)n;
	return none();
}

CMA_EXPORT size_t riowrite(int s, const void *b, size_t n, off_t o, int f)
{
	(void)s, (void)b, (void)n, (void)o, (void)f;
	return (size_t)none();
}
