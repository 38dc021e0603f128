// SPDX-License-Identifier: MIT
/*
 * cm.c - ursa's librdmacm through its API, with both ends in this process
 * (and another process where the test is about processes): private data
 * and rejects, a port nobody listens on, ports unique across processes,
 * a hundred connections with nothing leaked (descriptors, QPNs, CM
 * sockets, heap), and CM MADs that are
 * malformed or for nobody, which are dropped or answered and counted.
 */
#include <dirent.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness.h"
#include "ursa/ursa.h"

static struct sockaddr_in lo(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons(port) };

	a.sin_addr.s_addr = htonl(0x7f000001);
	return a;
}

/* The next event on ch within ms, its type checked; NULL if none came. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch,
					int want, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;

	if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &e))
		return NULL;
	if ((int)e->event != want) {
		fprintf(stderr, "  event %s (status %d), wanted %s\n",
			rdma_event_str(e->event), e->status,
			rdma_event_str((enum rdma_cm_event_type)want));
		rdma_ack_cm_event(e);
		return NULL;
	}
	return e;
}

static int expect_event(struct rdma_event_channel *ch, int want)
{
	struct rdma_cm_event *e = next_event(ch, want, 5000);

	if (!e)
		return -1;
	rdma_ack_cm_event(e);
	return 0;
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

struct side {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
};

/* A client id resolved to 127.0.0.1:port with a QP */
static int client(struct side *c, uint16_t port, bool qp)
{
	struct sockaddr_in a = lo(port);
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
					       .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };

	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&a, 2000) ||
	    expect_event(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(c->id, 2000) ||
	    expect_event(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED))
		return -1;
	return qp ? rdma_create_qp(c->id, NULL, &qa) : 0;
}

static int listener(struct side *s, uint16_t port)
{
	struct sockaddr_in a = lo(port);

	s->ch = rdma_create_event_channel();
	if (!s->ch || rdma_create_id(s->ch, &s->id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(s->id, (struct sockaddr *)&a) || rdma_listen(s->id, 8))
		return -1;
	return 0;
}

static void side_done(struct side *s)
{
	if (s->id) {
		rdma_destroy_qp(s->id);
		rdma_destroy_id(s->id);
	}
	if (s->ch)
		rdma_destroy_event_channel(s->ch);
	memset(s, 0, sizeof(*s));
}

static int test_reject_private_data(void)
{
	struct side s = { 0 }, c = { 0 };
	struct rdma_conn_param p = { .private_data = "hello", .private_data_len = 6,
				     .retry_count = 7 };
	struct rdma_cm_event *e;

	REQUIRE(!listener(&s, 7301));
	REQUIRE(!client(&c, 7301, true));
	REQUIRE(!rdma_connect(c.id, &p));
	e = next_event(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 5000);
	REQUIRE(e);
	EXPECT_TRUE(e->listen_id == s.id);
	/* rdma_cm's REQ carries 56 bytes for the app (92 - the 36 of its header) */
	EXPECT_EQ(e->param.conn.private_data_len, 56);
	EXPECT_TRUE(!memcmp(e->param.conn.private_data, "hello", 6));
	EXPECT_EQ(rdma_get_dst_port(e->id), rdma_get_src_port(c.id));
	EXPECT_EQ(rdma_reject(e->id, "no", 3), 0);
	{
		struct rdma_cm_id *child = e->id;

		rdma_ack_cm_event(e);
		e = next_event(c.ch, RDMA_CM_EVENT_REJECTED, 5000);
		REQUIRE(e);
		EXPECT_EQ(e->status, 28);	/* consumer defined */
		EXPECT_TRUE(e->param.conn.private_data &&
			    !memcmp(e->param.conn.private_data, "no", 3));
		rdma_ack_cm_event(e);
		rdma_destroy_id(child);
	}
	side_done(&c);
	side_done(&s);
	return TEST_PASS;
}

static int test_closed_port_rejected(void)
{
	struct side c = { 0 };
	struct rdma_cm_event *e;

	REQUIRE(!client(&c, 7302, true));
	REQUIRE(!rdma_connect(c.id, NULL));
	e = next_event(c.ch, RDMA_CM_EVENT_REJECTED, 5000);
	REQUIRE(e);
	EXPECT_EQ(e->status, 8);	/* invalid service ID, as the kernel */
	rdma_ack_cm_event(e);
	side_done(&c);
	return TEST_PASS;
}

/* A port is one listener's across the processes of a host */
static int test_port_unique_across_processes(void)
{
	int go[2], done[2];
	char b;
	pid_t pid;
	struct side s = { 0 };
	struct sockaddr_in a = lo(7303);
	struct rdma_cm_id *id;

	REQUIRE(!pipe(go) && !pipe(done));
	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		int r = listener(&s, 7303);

		b = r ? 'n' : 'y';
		if (write(go[1], &b, 1) != 1 || read(done[0], &b, 1) != 1)
			_exit(2);
		_exit(r ? 1 : 0);
	}
	REQUIRE(read(go[0], &b, 1) == 1 && b == 'y');
	REQUIRE(!rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP));
	errno = 0;
	EXPECT_EQ(rdma_bind_addr(id, (struct sockaddr *)&a), -1);
	EXPECT_EQ(errno, EADDRINUSE);
	/* another port space is another namespace of ports */
	rdma_destroy_id(id);
	REQUIRE(!rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP));
	EXPECT_EQ(rdma_bind_addr(id, (struct sockaddr *)&a), 0);
	rdma_destroy_id(id);
	b = 'x';
	EXPECT_EQ(write(done[1], &b, 1), 1);
	{
		int st;

		waitpid(pid, &st, 0);
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	/* the owner is gone: the port is free again */
	REQUIRE(!rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP));
	EXPECT_EQ(rdma_bind_addr(id, (struct sockaddr *)&a), 0);
	rdma_destroy_id(id);
	return TEST_PASS;
}

/* One connection through every step, torn down by the client */
static int one_connection(struct side *s, uint16_t port)
{
	struct side c = { 0 };
	struct rdma_cm_event *e;
	struct rdma_cm_id *child;
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
					       .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	int r = -1;

	if (client(&c, port, true) || rdma_connect(c.id, NULL))
		goto out;
	e = next_event(s->ch, RDMA_CM_EVENT_CONNECT_REQUEST, 5000);
	if (!e)
		goto out;
	child = e->id;
	rdma_ack_cm_event(e);
	if (rdma_create_qp(child, NULL, &qa) || rdma_accept(child, NULL) ||
	    expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED) ||
	    expect_event(s->ch, RDMA_CM_EVENT_ESTABLISHED) ||
	    rdma_disconnect(c.id) ||
	    expect_event(s->ch, RDMA_CM_EVENT_DISCONNECTED) ||
	    rdma_disconnect(child) ||
	    expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED)) {
		rdma_destroy_qp(child);
		rdma_destroy_id(child);
		goto out;
	}
	rdma_destroy_qp(child);
	rdma_destroy_id(child);
	r = 0;
out:
	side_done(&c);
	return r;
}

/* Names in /proc/net/unix that start with prefix: QPs ("@ursa/qp/", one
 * per live QPN of the namespace) and CM connections ("@ursa/cm/c/") */
static int unix_names(const char *prefix)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];
	int n = 0;

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, prefix) != NULL;
	if (f)
		fclose(f);
	return n;
}

static int test_hundred_connections_no_leak(void)
{
	struct side s = { 0 };
	int fds, qpns, conns;
	size_t heap;

	REQUIRE(!listener(&s, 7304));
	REQUIRE(!one_connection(&s, 7304));	/* (the device opens once) */
	fds = open_fds();
	qpns = unix_names("@ursa/qp/");
	conns = unix_names("@ursa/cm/c/");
	heap = mallinfo2().uordblks;
	for (int i = 0; i < 100; i++)
		if (one_connection(&s, 7304)) {
			harness_fail(__FILE__, __LINE__, "one_connection",
				     "connection %d failed", i);
			break;
		}
	EXPECT_EQ(open_fds(), fds);
	EXPECT_EQ(unix_names("@ursa/qp/"), qpns);	/* every QPN given back */
	EXPECT_EQ(unix_names("@ursa/cm/c/"), conns);
	/* (a few allocations may stay cached; 100 leaked connections
	 * would be far more: ids, events, QPs of kilobytes each) */
	EXPECT_TRUE(mallinfo2().uordblks < heap + 32 * 1024);
	side_done(&s);
	return TEST_PASS;
}

/* A MAD built by hand: header of class 0x07 version cv, attribute attr */
static void mad(uint8_t *m, uint8_t cv, uint16_t attr, uint32_t remote)
{
	memset(m, 0, 256);
	m[0] = 1;
	m[1] = 0x07;
	m[2] = cv;
	m[3] = 0x03;
	m[16] = (uint8_t)(attr >> 8);
	m[17] = (uint8_t)attr;
	m[24] = 0x12;			/* LocalCommID: some peer's */
	m[28] = (uint8_t)(remote >> 24);
	m[29] = (uint8_t)(remote >> 16);
	m[30] = (uint8_t)(remote >> 8);
	m[31] = (uint8_t)remote;
}

static int test_bad_mads_dropped_and_counted(void)
{
	struct side s = { 0 };
	struct ursa_udp_stats a, b;
	union ibv_gid g;
	uint8_t m[256];

	/* (an open device: this process has the RoCEv2 port) */
	REQUIRE(!listener(&s, 7305));
	memset(&g, 0, sizeof(g));
	g.raw[10] = g.raw[11] = 0xff;
	g.raw[12] = 127;
	g.raw[15] = 1;
	REQUIRE(!ursa_udp_stats(&a));
	mad(m, 1, 0x0010, 0);		/* class version 1: no such agent */
	EXPECT_EQ(ursa_cm_send(&g, &g, 0, m), 0);
	mad(m, 2, 0x0099, 0);		/* unknown attribute */
	EXPECT_EQ(ursa_cm_send(&g, &g, 0, m), 0);
	mad(m, 2, 0x0014, 0xdeadbeef);	/* RTU for a connection nobody has */
	EXPECT_EQ(ursa_cm_send(&g, &g, 0, m), 0);
	mad(m, 2, 0x0015, 0xdeadbeef);	/* DREQ for one: answered, DREP */
	EXPECT_EQ(ursa_cm_send(&g, &g, 0, m), 0);
	for (int i = 0; i < 100; i++) {
		ursa_udp_stats(&b);
		if (b.cm_drop - a.cm_drop >= 4 && b.cm_orphan > a.cm_orphan)
			break;
		usleep(10000);
	}
	/* the three, and the DREP that answered the DREQ: it came back to
	 * this host, for a comm ID nobody has */
	EXPECT_EQ(b.cm_drop - a.cm_drop, 4);
	EXPECT_TRUE(b.cm_orphan - a.cm_orphan >= 1);
	/* and the listener still works */
	EXPECT_EQ(one_connection(&s, 7305), 0);
	side_done(&s);
	return TEST_PASS;
}

static int test_sync_errno(void)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a = lo(7306);
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 2, .max_recv_wr = 2,
					       .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct sockaddr_storage bad = { .ss_family = AF_UNIX };

	/* a synchronous id (no channel): each call waits for its event */
	REQUIRE(!rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP));
	errno = 0;
	EXPECT_EQ(rdma_bind_addr(id, (struct sockaddr *)&bad), -1);
	EXPECT_EQ(errno, EAFNOSUPPORT);
	EXPECT_EQ(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000), 0);
	EXPECT_TRUE(id->verbs != NULL);
	EXPECT_EQ(rdma_resolve_route(id, 2000), 0);
	EXPECT_EQ(id->route.num_paths, 1);
	REQUIRE(!rdma_create_qp(id, NULL, &qa));
	errno = 0;
	EXPECT_EQ(rdma_connect(id, NULL), -1);	/* nobody on 7306 */
	EXPECT_EQ(errno, ECONNREFUSED);
	errno = 0;
	EXPECT_EQ(rdma_accept(id, NULL), -1);	/* not a request */
	EXPECT_EQ(errno, EINVAL);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return TEST_PASS;
}

static atomic_int waiter_out;

static void *cm_waiter(void *arg)
{
	struct rdma_cm_event *e;

	if (!rdma_get_cm_event(arg, &e))
		rdma_ack_cm_event(e);
	atomic_store(&waiter_out, 1);
	return NULL;
}

/*
 * rping's teardown: its event thread waits in rdma_get_cm_event while the
 * main thread destroys the id (dropping an event not yet read) and the
 * channel, then exits. As with the kernel's rdma_cm, the waiting thread
 * stays blocked and touches nothing freed, even when the count of the
 * dropped event wakes it after the channel is gone (modelled here by a
 * write to a duplicate of the channel's eventfd; the client crashed on
 * the freed channel about one run in a few hundred).
 */
static int test_channel_destroyed_under_waiter(void)
{
	struct sockaddr_in a = lo(7307);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	uint64_t one = 1;
	pthread_t t;
	int fd2;

	REQUIRE(ch && !rdma_create_id(ch, &id, NULL, RDMA_PS_TCP));
	REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0);
	usleep(100000);			/* ADDR_RESOLVED queued, not read */
	EXPECT_EQ(rdma_destroy_id(id), 0);
	fd2 = dup(ch->fd);
	REQUIRE(fd2 >= 0);
	REQUIRE(pthread_create(&t, NULL, cm_waiter, ch) == 0);
	pthread_detach(t);
	usleep(100000);			/* it took the stale count, waits */
	EXPECT_EQ(atomic_load(&waiter_out), 0);
	rdma_destroy_event_channel(ch);
	REQUIRE(write(fd2, &one, sizeof(one)) == sizeof(one));
	usleep(100000);
	/* still blocked, as in a read of the kernel's closed rdma_cm file */
	EXPECT_EQ(atomic_load(&waiter_out), 0);
	close(fd2);
	return TEST_RESULT();
}

int main(int argc, char **argv)
{
	static const struct test tests[] = {
		TEST_ENTRY(reject_private_data, "REJ 28 with the listener's private data"),
		TEST_ENTRY(closed_port_rejected, "no listener: REJECTED status 8"),
		TEST_ENTRY(port_unique_across_processes, "EADDRINUSE from another process"),
		TEST_ENTRY(hundred_connections_no_leak, "100 connect/disconnect: same fds, QPNs, heap"),
		TEST_ENTRY(bad_mads_dropped_and_counted, "malformed and orphan MADs"),
		TEST_ENTRY(sync_errno, "synchronous ids, librdmacm's errno"),
		TEST_ENTRY(channel_destroyed_under_waiter, "rdma_get_cm_event waiting while its channel goes"),
	};

	return harness_main(tests, sizeof(tests) / sizeof(tests[0]), argc, argv);
}
