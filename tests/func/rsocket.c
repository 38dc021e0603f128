// SPDX-License-Identifier: MIT
/*
 * rsocket.c - ursa's rsockets through their API, between this process
 * and a forked server process: a stream larger than the rings with EOF
 * after rshutdown, non-blocking connect and rpoll beside an ordinary
 * descriptor, riomap/riowrite, the errno of misuse, a server that dies,
 * and connections opened and closed with nothing leaked.
 */
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness.h"

#define PORT_BASE 17480

static struct sockaddr_in lo(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons(port) };

	a.sin_addr.s_addr = htonl(0x7f000001);
	return a;
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

/* the count once the last connection's DREP has come (its socket stays
 * until then): the same in two readings 100 ms apart */
static int settled_fds(void)
{
	int n = open_fds(), m;

	for (int t = 0; t < 20; t++, n = m) {
		usleep(100000);
		if ((m = open_fds()) == n)
			break;
	}
	return n;
}

static int listener(uint16_t port)
{
	struct sockaddr_in a = lo(port);
	int s = rsocket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (s < 0)
		return -1;
	rsetsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (rbind(s, (struct sockaddr *)&a, sizeof(a)) || rlisten(s, 4)) {
		rclose(s);
		return -1;
	}
	return s;
}

static int connect_to(uint16_t port)
{
	struct sockaddr_in a = lo(port);
	int s = rsocket(AF_INET, SOCK_STREAM, 0);

	if (s >= 0 && rconnect(s, (struct sockaddr *)&a, sizeof(a))) {
		rclose(s);
		return -1;
	}
	return s;
}

static uint8_t pat(uint64_t i)
{
	return (uint8_t)(i * 131 + (i >> 11));
}

/* A server process: listens on port, says so on the pipe, runs fn on the
 * first connection and exits with its status. */
static pid_t serve(uint16_t port, int (*fn)(int s))
{
	int p[2];
	char c = 0;
	pid_t pid;

	if (pipe(p))
		return -1;
	pid = fork();
	if (pid == 0) {
		int ls = listener(port), s, r = 1;

		close(p[0]);
		if (ls >= 0) {
			c = 1;
			if (write(p[1], &c, 1) != 1)
				_exit(2);
			s = raccept(ls, NULL, NULL);
			if (s >= 0) {
				r = fn(s);
				rclose(s);
			}
			rclose(ls);
		}
		_exit(r);
	}
	close(p[1]);
	if (pid < 0 || read(p[0], &c, 1) != 1 || c != 1) {
		close(p[0]);
		return -1;
	}
	close(p[0]);
	return pid;
}

static int reap(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* reads to EOF, checks the pattern, answers with the byte count */
static int count_to_eof(int s)
{
	static uint8_t b[100000];
	uint64_t n = 0;
	ssize_t r;

	while ((r = rrecv(s, b, sizeof(b), 0)) > 0) {
		for (ssize_t i = 0; i < r; i++)
			if (b[i] != pat(n + (uint64_t)i))
				return 3;
		n += (uint64_t)r;
	}
	if (r < 0)
		return 4;
	return rsend(s, &n, sizeof(n), 0) == sizeof(n) ? 0 : 5;
}

static int test_stream_larger_than_ring_then_eof(void)
{
	const size_t total = 5u << 20;	/* five rings' worth */
	uint8_t *b = malloc(total);
	uint64_t n = 0;
	size_t off = 0, k = 1;
	pid_t pid = serve(PORT_BASE, count_to_eof);
	int s;

	REQUIRE(b && pid > 0);
	for (size_t i = 0; i < total; i++)
		b[i] = pat(i);
	s = connect_to(PORT_BASE);
	REQUIRE(s >= 0);
	/* sizes from 1 byte to 1 MiB: wrap the ring at every alignment */
	while (off < total) {
		size_t len = k < total - off ? k : total - off;

		EXPECT_EQ(rsend(s, b + off, len, 0), (ssize_t)len);
		off += len;
		k = k * 3 + 7;
		if (k > (1u << 20))
			k = 1;
	}
	EXPECT_EQ(rshutdown(s, SHUT_WR), 0);
	EXPECT_EQ(rsend(s, b, 1, 0), -1);
	EXPECT_EQ(errno, EPIPE);
	EXPECT_EQ(rrecv(s, &n, sizeof(n), MSG_WAITALL), (ssize_t)sizeof(n));
	EXPECT_EQ(n, total);
	EXPECT_EQ(rrecv(s, b, 1, 0), 0);	/* the server closed: EOF */
	EXPECT_EQ(rclose(s), 0);
	EXPECT_EQ(reap(pid), 0);
	free(b);
	return TEST_RESULT();
}

static int wait_then_send(int s)
{
	char c;

	/* one byte in, then 3 out after a pause the client polls through */
	if (rrecv(s, &c, 1, 0) != 1)
		return 3;
	usleep(200000);
	return rsend(s, "abc", 3, 0) == 3 && rrecv(s, &c, 1, 0) == 0 ? 0 : 4;
}

static int test_nonblocking_and_rpoll_with_a_pipe(void)
{
	struct sockaddr_in a = lo(PORT_BASE + 1);
	pid_t pid = serve(PORT_BASE + 1, wait_then_send);
	struct pollfd p[2];
	int s, pp[2], err = -1;
	socklen_t el = sizeof(err);
	char b[8];

	REQUIRE(pid > 0 && !pipe(pp));
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(s >= 0);
	EXPECT_EQ(rfcntl(s, F_SETFL, O_NONBLOCK), 0);
	EXPECT_TRUE(rfcntl(s, F_GETFL) & O_NONBLOCK);
	EXPECT_EQ(rconnect(s, (struct sockaddr *)&a, sizeof(a)), -1);
	EXPECT_EQ(errno, EINPROGRESS);
	p[0] = (struct pollfd){ .fd = s, .events = POLLOUT };
	EXPECT_EQ(rpoll(p, 1, 5000), 1);
	EXPECT_TRUE(p[0].revents & POLLOUT);
	EXPECT_EQ(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	EXPECT_EQ(err, 0);
	EXPECT_EQ(rrecv(s, b, sizeof(b), 0), -1);
	EXPECT_EQ(errno, EAGAIN);
	EXPECT_EQ(rsend(s, "x", 1, 0), 1);

	/* nothing readable yet: the pipe wakes rpoll, then the rsocket */
	p[0] = (struct pollfd){ .fd = s, .events = POLLIN };
	p[1] = (struct pollfd){ .fd = pp[0], .events = POLLIN };
	EXPECT_EQ(rpoll(p, 2, 50), 0);
	EXPECT_EQ(write(pp[1], "p", 1), 1);
	EXPECT_EQ(rpoll(p, 2, 1000), 1);
	EXPECT_EQ(p[1].revents, POLLIN);
	EXPECT_EQ(p[0].revents, 0);
	EXPECT_EQ(read(pp[0], b, 1), 1);
	EXPECT_EQ(rpoll(p, 2, 5000), 1);
	EXPECT_EQ(p[0].revents, POLLIN);
	EXPECT_EQ(rrecv(s, b, sizeof(b), MSG_WAITALL), 3);	/* non-blocking */
	EXPECT_EQ(memcmp(b, "abc", 3), 0);
	rclose(s);
	close(pp[0]);
	close(pp[1]);
	EXPECT_EQ(reap(pid), 0);
	return TEST_RESULT();
}

static int test_connect_refused(void)
{
	struct sockaddr_in a = lo(PORT_BASE + 9);
	int s = rsocket(AF_INET, SOCK_STREAM, 0), err = 0;
	socklen_t el = sizeof(err);
	struct pollfd p;

	REQUIRE(s >= 0);
	EXPECT_EQ(rconnect(s, (struct sockaddr *)&a, sizeof(a)), -1);
	EXPECT_EQ(errno, ECONNREFUSED);
	rclose(s);
	/* the same, non-blocking: the error comes through SO_ERROR */
	s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	REQUIRE(s >= 0);
	EXPECT_EQ(rconnect(s, (struct sockaddr *)&a, sizeof(a)), -1);
	EXPECT_EQ(errno, EINPROGRESS);
	p = (struct pollfd){ .fd = s, .events = POLLOUT };
	EXPECT_EQ(rpoll(&p, 1, 5000), 1);
	EXPECT_TRUE(p.revents & POLLERR);
	EXPECT_EQ(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	EXPECT_EQ(err, ECONNREFUSED);
	rclose(s);
	return TEST_RESULT();
}

static int test_misuse_errno(void)
{
	struct sockaddr_in a = lo(PORT_BASE + 2), got;
	socklen_t gl = sizeof(got);
	int s, ls, v = 0, pp[2];
	socklen_t vl = sizeof(v);
	char c;

	REQUIRE(!pipe(pp));
	EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
	EXPECT_EQ(errno, EAFNOSUPPORT);
	EXPECT_EQ(rsocket(AF_INET, SOCK_RAW, 0), -1);
	EXPECT_EQ(errno, EPROTONOSUPPORT);
	/* an ordinary descriptor is not an rsocket */
	EXPECT_EQ(rsend(pp[1], "x", 1, 0), -1);
	EXPECT_EQ(errno, EBADF);
	EXPECT_EQ(rrecv(-1, &c, 1, 0), -1);
	EXPECT_EQ(errno, EBADF);
	EXPECT_EQ(rclose(pp[0]), -1);
	EXPECT_EQ(errno, EBADF);

	s = rsocket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(s >= 0);
	EXPECT_EQ(rrecv(s, &c, 1, 0), -1);
	EXPECT_EQ(errno, ENOTCONN);
	EXPECT_EQ(rsend(s, &c, 1, 0), -1);
	EXPECT_EQ(errno, ENOTCONN);
	EXPECT_EQ(rgetpeername(s, (struct sockaddr *)&got, &gl), -1);
	EXPECT_EQ(errno, ENOTCONN);
	EXPECT_EQ(raccept(s, NULL, NULL), -1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(rgetsockopt(s, SOL_SOCKET, SO_PEERCRED, &v, &vl), -1);
	EXPECT_EQ(errno, ENOPROTOOPT);
	EXPECT_EQ(rsetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &v, 1), -1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(rshutdown(s, SHUT_WR), -1);
	EXPECT_EQ(errno, ENOTCONN);
	rclose(s);

	/* one listener per port on the host */
	ls = listener(PORT_BASE + 2);
	REQUIRE(ls >= 0);
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	EXPECT_EQ(rbind(s, (struct sockaddr *)&a, sizeof(a)), -1);
	EXPECT_EQ(errno, EADDRINUSE);
	rclose(s);
	/* a non-blocking listener with nobody calling */
	EXPECT_EQ(rfcntl(ls, F_SETFL, O_NONBLOCK), 0);
	EXPECT_EQ(raccept(ls, NULL, NULL), -1);
	EXPECT_EQ(errno, EAGAIN);
	gl = sizeof(got);
	EXPECT_EQ(rgetsockname(ls, (struct sockaddr *)&got, &gl), 0);
	EXPECT_EQ(gl, sizeof(got));
	EXPECT_EQ(ntohs(got.sin_port), PORT_BASE + 2);
	rclose(ls);
	close(pp[0]);
	close(pp[1]);
	return TEST_RESULT();
}

#define IOLEN (300u << 10)

/* maps a buffer, lets the client write into it, checks it after the
 * client's one-byte rsend (ordered after its riowrites); its one slot
 * is full until riounmap, and then takes another buffer, which the
 * client writes too */
static int mapped_target(int s)
{
	uint8_t *b = calloc(1, IOLEN), b2[4096] = { 0 };
	char c;

	if (!b || riomap(s, b, IOLEN, PROT_WRITE, 0, 4096) != 4096)
		return 3;
	if (riomap(s, b2, sizeof(b2), PROT_WRITE, 0, 0) != -1 || errno != ENOMEM)
		return 8;
	if (rsend(s, "m", 1, 0) != 1 || rrecv(s, &c, 1, 0) != 1)
		return 4;
	for (size_t i = 0; i < IOLEN; i++)
		if (b[i] != pat(i))
			return 5;
	if (riounmap(s, b, IOLEN) || riounmap(s, b, IOLEN) != -1 ||
	    riomap(s, b2, sizeof(b2), PROT_WRITE, 0, 0) != 0 ||
	    rsend(s, "k", 1, 0) != 1)
		return 6;
	if (rrecv(s, &c, 1, 0) != 1)
		return 9;
	for (size_t i = 0; i < sizeof(b2); i++)
		if (b2[i] != pat(i))
			return 10;
	free(b);
	return rrecv(s, &c, 1, 0) == 0 ? 0 : 7;
}

static int test_riomap_riowrite(void)
{
	uint8_t *b = malloc(IOLEN);
	int s, one = 1;
	pid_t pid;
	char c;

	REQUIRE(b);
	for (size_t i = 0; i < IOLEN; i++)
		b[i] = pat(i);
	/* the server may make one map (RDMA_IOMAPSIZE on its listener, which
	 * the accepted socket inherits); the client none, the default */
	pid = fork();
	if (pid == 0) {
		int ls = listener(PORT_BASE + 3), a, r = 1;

		if (ls >= 0 && !rsetsockopt(ls, SOL_RDMA, RDMA_IOMAPSIZE, &one,
					    sizeof(one))) {
			a = raccept(ls, NULL, NULL);
			r = a >= 0 ? mapped_target(a) : 2;
			rclose(a);
		}
		_exit(r);
	}
	REQUIRE(pid > 0);
	for (int i = 0; i < 50; i++) {
		s = connect_to(PORT_BASE + 3);
		if (s >= 0)
			break;
		usleep(50000);	/* until the child listens */
	}
	REQUIRE(s >= 0);
	EXPECT_EQ(riomap(s, b, 4096, PROT_WRITE, 0, -1), -1);
	EXPECT_EQ(errno, ENOMEM);
	EXPECT_EQ(rrecv(s, &c, 1, 0), 1);	/* the map is there */
	EXPECT_EQ(riowrite(s, b, 16, 4096 + IOLEN - 8, 0), (size_t)-1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(riowrite(s, b, 16, 0, 0), (size_t)-1);
	EXPECT_EQ(errno, EINVAL);
	for (size_t off = 0; off < IOLEN; off += 100000) {
		size_t n = IOLEN - off < 100000 ? IOLEN - off : 100000;

		EXPECT_EQ(riowrite(s, b + off, n, (off_t)(4096 + off), 0), n);
	}
	EXPECT_EQ(rsend(s, "d", 1, 0), 1);
	EXPECT_EQ(rrecv(s, &c, 1, 0), 1);
	EXPECT_EQ(c, 'k');
	/* the server's slot now holds a 4 KiB map at offset 0: the old
	 * range is gone, the new one takes writes */
	EXPECT_EQ(riowrite(s, b, 16, 4096 + 100, 0), (size_t)-1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(riowrite(s, b, 4096, 0, 0), 4096);
	EXPECT_EQ(rsend(s, "e", 1, 0), 1);
	rclose(s);
	EXPECT_EQ(reap(pid), 0);
	free(b);
	return TEST_RESULT();
}

static int hold(int s)
{
	char c;

	return rrecv(s, &c, 1, 0) == 1 ? 0 : 3;
}

static int test_server_killed(void)
{
	pid_t pid = serve(PORT_BASE + 4, hold);
	char c;
	ssize_t r;
	int s;

	REQUIRE(pid > 0);
	s = connect_to(PORT_BASE + 4);
	REQUIRE(s >= 0);
	kill(pid, SIGKILL);
	EXPECT_EQ(reap(pid), 128 + SIGKILL);
	/* the end of the stream or a reset, within the CM's peer probe */
	alarm(20);
	r = rrecv(s, &c, 1, 0);
	EXPECT_TRUE(r == 0 || (r == -1 && errno == ECONNRESET));
	rclose(s);
	return TEST_RESULT();
}

static int echo_to_eof(int s)
{
	char b[64];
	ssize_t r;

	while ((r = rrecv(s, b, sizeof(b), 0)) > 0)
		if (rsend(s, b, (size_t)r, 0) != r)
			return 3;
	return r == 0 ? 0 : 4;
}

static int test_hundred_connections_no_leak(void)
{
	int fds = -1, s;
	char b[6];

	for (int i = 0; i < 100; i++) {
		pid_t pid = serve((uint16_t)(PORT_BASE + 5), echo_to_eof);

		REQUIRE(pid > 0);
		s = connect_to(PORT_BASE + 5);
		REQUIRE(s >= 0);
		EXPECT_EQ(rsend(s, "hello", 5, 0), 5);
		EXPECT_EQ(rrecv(s, b, 5, MSG_WAITALL), 5);
		EXPECT_EQ(rclose(s), 0);
		EXPECT_EQ(reap(pid), 0);
		if (i == 9)	/* what the first ones opened once stays */
			fds = settled_fds();
	}
	EXPECT_EQ(settled_fds(), fds);
	return TEST_RESULT();
}

int main(int argc, char **argv)
{
	static const struct test tests[] = {
		TEST_ENTRY(stream_larger_than_ring_then_eof, "5 MiB in odd sizes, SHUT_WR, EOF"),
		TEST_ENTRY(nonblocking_and_rpoll_with_a_pipe, "EINPROGRESS, rpoll beside a pipe"),
		TEST_ENTRY(connect_refused, "no listener: ECONNREFUSED, SO_ERROR"),
		TEST_ENTRY(misuse_errno, "EBADF, ENOTCONN, EADDRINUSE, EAGAIN"),
		TEST_ENTRY(riomap_riowrite, "riowrite into a mapped buffer, bounds"),
		TEST_ENTRY(server_killed, "SIGKILLed peer: EOF or ECONNRESET"),
		TEST_ENTRY(hundred_connections_no_leak, "100 connections, same fds"),
	};

	return harness_main(tests, sizeof(tests) / sizeof(tests[0]), argc, argv);
}
