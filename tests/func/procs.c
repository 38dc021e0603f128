// SPDX-License-Identifier: MIT
/*
 * procs.c (functional) - RDMA between processes of one host, as real
 * programs use it: each process opens the device, creates its QP and MR,
 * the two exchange (QPN, address, rkey) over a socket, connect, and move
 * data. The target process of one-sided operations makes no verbs call.
 */
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <ursa/ursa.h>

#include "common.h"

struct xinfo {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	uint64_t value;
};

static int xsend(int fd, const struct xinfo *x)
{
	return write(fd, x, sizeof(*x)) == (ssize_t)sizeof(*x) ? 0 : -1;
}

static int xrecv(int fd, struct xinfo *x)
{
	size_t got = 0;

	while (got < sizeof(*x)) {
		ssize_t n = read(fd, (char *)x + got, sizeof(*x) - got);

		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

/* One side: device, PD, CQ, QP and a registered buffer. */
struct end {
	struct fx f;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	size_t len;
	struct ibv_comp_channel *ch;
};

static int end_open(struct end *e, enum ibv_qp_type t, size_t len, bool channel)
{
	memset(e, 0, sizeof(*e));
	e->f.ctx = open_dev();
	if (!e->f.ctx)
		return -1;
	e->f.pd = ibv_alloc_pd(e->f.ctx);
	if (channel)
		e->ch = ibv_create_comp_channel(e->f.ctx);
	e->f.cq = ibv_create_cq(e->f.ctx, 256, NULL, e->ch, 0);
	e->len = len;
	/* memory same-host requesters can map (shmap.h), or with
	 * PROCS_PRIVATE private memory */
	if (getenv("PROCS_PRIVATE")) {
		e->buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (e->buf == MAP_FAILED)
			e->buf = NULL;
	} else if (ursa_mem_alloc(len, (void **)&e->buf)) {
		e->buf = NULL;
	}
	if (!e->f.pd || !e->f.cq || !e->buf)
		return -1;
	memset(e->buf, 0, len);
	{
		/* PROCS_MR_SKIP=n: the MR leaves n bytes out at each end, so
		 * that its first and last pages are partial */
		const char *sk = getenv("PROCS_MR_SKIP");
		size_t skip = sk ? strtoul(sk, NULL, 0) : 0;

		if (2 * skip >= len)
			return -1;
		e->mr = ibv_reg_mr(e->f.pd, e->buf + skip, len - 2 * skip,
				   ALL_REMOTE);
	}
	e->qp = make_qp(&e->f, t, NULL, NULL, NULL);
	return (e->mr && e->qp) ? 0 : -1;
}

static void end_close(struct end *e)
{
	if (e->qp)
		ibv_destroy_qp(e->qp);
	if (e->mr)
		ibv_dereg_mr(e->mr);
	fx_close(&e->f);
	if (e->ch)
		ibv_destroy_comp_channel(e->ch);
	if (e->buf && ursa_mem_free(e->buf))
		munmap(e->buf, e->len);
}

static void info_of(struct end *e, struct xinfo *x)
{
	memset(x, 0, sizeof(*x));
	x->qpn = e->qp->qp_num;
	x->rkey = e->mr->rkey;
	x->addr = (uintptr_t)e->mr->addr;
}

/* The 8 bytes at p as CMD_GET returns them. */
static uint64_t word(const char *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

static uint64_t sum(const char *p, size_t n)
{
	uint64_t s = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		s = (s ^ (uint8_t)p[i]) * 1099511628211ull;
	return s;
}

/*
 * Start a helper process running one of the roles below; the parent gets
 * its end of a socket pair. Helpers are fork()ed and then exec()ed afresh
 * (this binary with --child ROLE), so that they do not inherit the state of
 * a process that already runs ursa threads; they die with their parent.
 */
static pid_t spawn_role(const char *role, const char *a1, const char *a2,
			const char *a3, int *sock)
{
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -1;
	pid = fork();
	if (pid == 0) {
		char fd[16];

		close(sv[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		snprintf(fd, sizeof(fd), "%d", sv[1]);
		execl("/proc/self/exe", "func_procs", "--child", role, fd,
		      a1, a2, a3, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	*sock = sv[0];
	return pid;
}

static int reap(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/*
 * A passive target: registers memory, connects, then only answers
 * commands on the socket: 'sum' (checksum of a range), 'get' (a 64-bit
 * word), 'quit'. It never calls a verb after connecting; it sleeps in
 * read() on the socket while the initiator works on its memory.
 */
enum { CMD_SUM = 1, CMD_GET, CMD_QUIT, CMD_FILL, CMD_RECV, CMD_POLL,
       CMD_DEREG, CMD_REG, CMD_REREG_ACCESS, CMD_UNMAP };

struct target_arg {
	enum ibv_qp_type type;
	size_t len;
	int seccomp_no_cma;
};

static int deny_cma_open(bool open_too)
{
	/* Make process_vm_readv/writev fail with EPERM, as container
	 * seccomp profiles do; with open_too, opening files too (the
	 * requester then cannot open the target's memfds). */
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 3, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
			 open_too ? SYS_openat : SYS_process_vm_writev, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
	};
	struct sock_fprog prog = { (unsigned short)(sizeof(f) / sizeof(f[0])), f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -1;
	/* every thread: ursa's progress thread may carry out the WQE */
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
			    SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

static int deny_cma(void)
{
	return deny_cma_open(false);
}

static int target_main(int sock, void *varg)
{
	struct target_arg *a = varg;
	struct end e;
	struct xinfo me, peer, cmd, reply;

	if (a->seccomp_no_cma && deny_cma())
		return 10;
	if (end_open(&e, a->type, a->len, false))
		return 11;
	info_of(&e, &me);
	if (xsend(sock, &me) || xrecv(sock, &peer))
		return 12;
	if (a->type == IBV_QPT_UD ? to_rts(e.qp, 0, 0) :
	    to_rts(e.qp, peer.qpn, ALL_REMOTE))
		return 13;
	if (xsend(sock, &me))	/* "ready" */
		return 14;
	while (!xrecv(sock, &cmd)) {
		memset(&reply, 0, sizeof(reply));
		switch (cmd.qpn) {
		case CMD_SUM:
			reply.value = sum(e.buf + cmd.addr, cmd.value);
			break;
		case CMD_GET:
			memcpy(&reply.value, e.buf + cmd.addr, 8);
			break;
		case CMD_FILL:
			memset(e.buf + cmd.addr, (int)cmd.rkey, cmd.value);
			break;
		case CMD_RECV: {
			/* post a receive of value bytes at addr */
			if (post_recv1(e.qp, e.buf + cmd.addr, (uint32_t)cmd.value,
				       e.mr->lkey, 77))
				reply.value = (uint64_t)-1;
			break;
		}
		case CMD_POLL: {
			struct ibv_wc wc;

			if (wait_wc(e.f.cq, &wc, 5000) != 1)
				reply.value = (uint64_t)-1;
			else
				reply.value = ((uint64_t)wc.status << 32) | wc.byte_len;
			reply.rkey = wc.wc_flags;
			break;
		}
		case CMD_DEREG:
			/* deregister, then at once write a pattern over the
			 * range: no WRITE may land after ibv_dereg_mr */
			reply.value = (uint64_t)ibv_dereg_mr(e.mr);
			e.mr = NULL;
			memset(e.buf + cmd.addr, (int)cmd.rkey, cmd.value);
			break;
		case CMD_REG: {
			/* a new MR over [addr, addr + value) of the buffer
			 * (after CMD_DEREG): its rkey and address */
			struct ibv_mr *mr = ibv_reg_mr(e.f.pd, e.buf + cmd.addr,
						       cmd.value, ALL_REMOTE);

			if (!mr)
				return 17;
			e.mr = mr;
			reply.rkey = mr->rkey;
			reply.addr = (uintptr_t)mr->addr;
			break;
		}
		case CMD_REREG_ACCESS:
			/* the same MR and keys, with the rights in value */
			reply.value = (uint64_t)ibv_rereg_mr(e.mr,
					IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
					(int)cmd.value);
			break;
		case CMD_UNMAP:
			/* unmap [addr, addr + value) of the registered buffer
			 * behind the MR's back; rkey 'N': map new memory there,
			 * full of 'N' */
			reply.value = (uint64_t)munmap(e.buf + cmd.addr, cmd.value);
			if (cmd.rkey == 'N' &&
			    mmap(e.buf + cmd.addr, cmd.value, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
			    e.buf + cmd.addr)
				memset(e.buf + cmd.addr, 'N', cmd.value);
			break;
		case CMD_QUIT:
			end_close(&e);
			return 0;
		}
		if (xsend(sock, &reply))
			return 15;
	}
	return 16;
}

static uint64_t cmd(int sock, uint32_t c, uint64_t addr, uint64_t value,
		    uint32_t extra)
{
	struct xinfo x = { c, extra, addr, value }, r;

	if (xsend(sock, &x) || xrecv(sock, &r))
		return (uint64_t)-2;
	return r.value;
}

/* Connect a local end to a freshly spawned target. */
static pid_t start_target(struct target_arg *a, struct end *me, int *sock,
			  struct xinfo *peer)
{
	struct xinfo mine, ready;
	char t[16], l[24], sc[8];
	pid_t pid;

	snprintf(t, sizeof(t), "%d", (int)a->type);
	snprintf(l, sizeof(l), "%zu", a->len);
	snprintf(sc, sizeof(sc), "%d", a->seccomp_no_cma);
	pid = spawn_role("target", t, l, sc, sock);

	if (pid < 0)
		return -1;
	info_of(me, &mine);
	if (xrecv(*sock, peer) || xsend(*sock, &mine))
		return -1;
	if (a->type == IBV_QPT_UD ? to_rts(me->qp, 0, 0) :
	    to_rts(me->qp, peer->qpn, ALL_REMOTE))
		return -1;
	if (xrecv(*sock, &ready))
		return -1;
	return pid;
}

static int one_op(struct end *e, enum ibv_wr_opcode op, size_t off,
		  uint32_t len, uint64_t raddr, uint32_t rkey,
		  enum ibv_wc_status want)
{
	struct ibv_wc wc;

	if (post_send1(e->qp, op, e->buf + off, len, e->mr->lkey, raddr, rkey, 1))
		return -1;
	if (wait_wc(e->f.cq, &wc, 10000) != 1)
		return -2;
	if (wc.status != want) {
		fprintf(stderr, "    op %d: %s (%s)\n", op,
			ibv_wc_status_str(wc.status),
			ursa_vendor_err_str(wc.vendor_err));
		return -3;
	}
	return 0;
}

/* Which path carries WRITE and READ: the requester itself (direct, the
 * default: by memcpy in the target's pages it maps, or by cross-memory
 * attach), the target's engine by cross-memory attach, or the slots. The
 * target's buffer is page aligned: all of it is mapped unless URSA_MAP=0. */
enum xfer_mode {
	M_DIRECT,		/* default: mapped */
	M_NO_MAP,		/* URSA_MAP=0: direct by process_vm_* */
	M_TARGET_SECCOMP,	/* the target may not use CMA: direct still works */
	M_NO_CMA,		/* URSA_CMA=0: mapped, SEND by slots */
	M_NO_CMA_NO_MAP,	/* and URSA_MAP=0: slots only */
	M_NO_DIRECT,		/* URSA_DIRECT=0: the target's engine copies */
	M_REQ_SECCOMP,		/* the requester loses CMA after connecting */
	M_REQ_SECCOMP_NO_MAP,	/* the same with URSA_MAP=0 */
	M_REQ_NO_OPEN,		/* before any WRITE, the requester loses CMA
				 * and may not open files: no mapping */
};

static int run_write_read(enum xfer_mode mode)
{
	struct target_arg ta = { IBV_QPT_RC, 8 << 20, mode == M_TARGET_SECCOMP };
	struct end me;
	struct xinfo peer;
	struct ursa_qp_stats st;
	int sock;
	pid_t pid;
	size_t big = 3 << 20;
	uint64_t small = 100 + 64, sendsz = 1 << 20, mine = 2 * big + small;

	if (mode == M_NO_CMA || mode == M_NO_CMA_NO_MAP)
		setenv("URSA_CMA", "0", 1);
	if (mode == M_NO_MAP || mode == M_NO_CMA_NO_MAP ||
	    mode == M_REQ_SECCOMP_NO_MAP)
		setenv("URSA_MAP", "0", 1);
	if (mode == M_NO_DIRECT)
		setenv("URSA_DIRECT", "0", 1);
	REQUIRE(end_open(&me, IBV_QPT_RC, 8 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	for (size_t i = 0; i < big; i++)
		me.buf[i] = (char)(i * 13 + 5);
	if (mode == M_REQ_NO_OPEN)
		REQUIRE(deny_cma_open(true) == 0);
	/* small WRITE and big WRITE */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 100, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 0, 100, 0), sum(me.buf, 100));
	if (mode == M_REQ_SECCOMP || mode == M_REQ_SECCOMP_NO_MAP)
		REQUIRE(deny_cma() == 0);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, (uint32_t)big, peer.addr + 4096,
			 peer.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 4096, big, 0), sum(me.buf, big));
	/* READ it back, small and big */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_READ, 4 << 20, 64, peer.addr + 4096,
			 peer.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_TRUE(!memcmp(me.buf + (4 << 20), me.buf, 64));
	memset(me.buf + (4 << 20), 0, big);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_READ, 4 << 20, (uint32_t)big,
			 peer.addr + 4096, peer.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_TRUE(!memcmp(me.buf + (4 << 20), me.buf, big));
	/* SEND into a receive the target posted (never direct) */
	EXPECT_EQ(cmd(sock, CMD_RECV, 6 << 20, 2 << 20, 0), 0);
	EXPECT_EQ(one_op(&me, IBV_WR_SEND, 0, (uint32_t)sendsz, 0, 0,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_POLL, 0, 0, 0), sendsz);
	EXPECT_EQ(cmd(sock, CMD_SUM, 6 << 20, sendsz, 0), sum(me.buf, sendsz));
	/* which path carried the bytes */
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	switch (mode) {
	case M_DIRECT:
	case M_REQ_SECCOMP:	/* mapped: no system call to refuse */
		EXPECT_EQ(st.direct_bytes, mine);
		EXPECT_EQ(st.map_bytes, mine);
		EXPECT_EQ(st.cma_bytes, sendsz);
		EXPECT_EQ(st.ring_bytes, 0);
		break;
	case M_NO_MAP:
		EXPECT_EQ(st.direct_bytes, mine);
		EXPECT_EQ(st.map_bytes, 0);
		EXPECT_EQ(st.cma_bytes, sendsz);
		EXPECT_EQ(st.ring_bytes, 0);
		break;
	case M_TARGET_SECCOMP:
	case M_NO_CMA:
		EXPECT_EQ(st.direct_bytes, mine);
		EXPECT_EQ(st.map_bytes, mine);
		EXPECT_EQ(st.cma_bytes, 0);
		EXPECT_EQ(st.ring_bytes, sendsz);
		break;
	case M_NO_CMA_NO_MAP:
		EXPECT_EQ(st.direct_bytes, 0);
		EXPECT_EQ(st.cma_bytes, 0);
		EXPECT_EQ(st.ring_bytes, mine + sendsz);
		break;
	case M_NO_DIRECT:
	case M_REQ_NO_OPEN:	/* the target's engine, which may use CMA */
		EXPECT_EQ(st.direct_bytes, 0);
		EXPECT_EQ(st.map_bytes, 0);
		EXPECT_EQ(st.cma_bytes, 2 * big + sendsz);
		EXPECT_EQ(st.ring_bytes, small);
		break;
	case M_REQ_SECCOMP_NO_MAP:
		/* the first WRITE went direct; the refusal sent the rest
		 * through the target's engine, which may still use CMA */
		EXPECT_EQ(st.direct_bytes, 100);
		EXPECT_EQ(st.map_bytes, 0);
		EXPECT_EQ(st.cma_bytes, 2 * big + sendsz);
		EXPECT_EQ(st.ring_bytes, 64);
		break;
	}
	EXPECT_EQ(st.loop_bytes, 0);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/*
 * ibv_post_send's shortcut (ursa_req_direct): an inline WRITE needs no
 * lkey; unsignaled WRs leave no completion; a list of WRITE, WRITE, READ
 * and fetch-and-add in one call runs in order and completes in order, with
 * the READ's data and the atomic's original value in place.
 */
static int test_post_shortcut(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct ursa_qp_stats st;
	struct end me;
	struct xinfo peer;
	struct ibv_send_wr wr[4], *bad;
	struct ibv_sge sg[4], isg;
	struct ibv_wc wc[4];
	char inl[40];
	uint64_t before, orig;
	int sock, n = 0;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	/* inline: from a buffer of no MR, with no lkey */
	for (size_t i = 0; i < sizeof(inl); i++)
		inl[i] = (char)(i * 7 + 1);
	isg = (struct ibv_sge){ (uintptr_t)inl, sizeof(inl), 0 };
	memset(wr, 0, sizeof(wr));
	wr[0].wr_id = 1;
	wr[0].sg_list = &isg;
	wr[0].num_sge = 1;
	wr[0].opcode = IBV_WR_RDMA_WRITE;
	wr[0].send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	wr[0].wr.rdma.remote_addr = peer.addr + 256;
	wr[0].wr.rdma.rkey = peer.rkey;
	REQUIRE(ibv_post_send(me.qp, &wr[0], &bad) == 0);
	memset(inl, 0, sizeof(inl));	/* inline: the buffer is free at once */
	REQUIRE(wait_wc(me.f.cq, wc, 5000) == 1);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc[0].wr_id, 1);
	for (size_t i = 0; i < sizeof(inl); i++)
		inl[i] = (char)(i * 7 + 1);
	EXPECT_EQ(cmd(sock, CMD_SUM, 256, sizeof(inl), 0), sum(inl, sizeof(inl)));
	/* WRITE, WRITE unsignaled; READ of what they wrote; fetch-and-add */
	for (int i = 0; i < 128; i++)
		me.buf[i] = (char)(i * 3 + 2);
	before = (uint64_t)cmd(sock, CMD_GET, 1024, 0, 0);
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < 4; i++) {
		wr[i].wr_id = 10 + (uint64_t)i;
		wr[i].sg_list = &sg[i];
		wr[i].num_sge = 1;
		wr[i].next = i < 3 ? &wr[i + 1] : NULL;
		wr[i].wr.rdma.rkey = peer.rkey;
	}
	sg[0] = (struct ibv_sge){ (uintptr_t)me.buf, 64, me.mr->lkey };
	sg[1] = (struct ibv_sge){ (uintptr_t)me.buf + 64, 64, me.mr->lkey };
	sg[2] = (struct ibv_sge){ (uintptr_t)me.buf + 4096, 128, me.mr->lkey };
	sg[3] = (struct ibv_sge){ (uintptr_t)me.buf + 8192, 8, me.mr->lkey };
	wr[0].opcode = wr[1].opcode = IBV_WR_RDMA_WRITE;
	wr[0].wr.rdma.remote_addr = peer.addr + 512;
	wr[1].wr.rdma.remote_addr = peer.addr + 576;
	wr[2].opcode = IBV_WR_RDMA_READ;
	wr[2].send_flags = IBV_SEND_SIGNALED;
	wr[2].wr.rdma.remote_addr = peer.addr + 512;
	wr[3].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr[3].send_flags = IBV_SEND_SIGNALED;
	wr[3].wr.atomic.remote_addr = peer.addr + 1024;
	wr[3].wr.atomic.rkey = peer.rkey;
	wr[3].wr.atomic.compare_add = 5;
	REQUIRE(ibv_post_send(me.qp, &wr[0], &bad) == 0);
	while (n < 2) {
		int got = wait_wc(me.f.cq, wc + n, 5000);

		REQUIRE(got == 1);
		n += got;
	}
	EXPECT_EQ(wc[0].wr_id, 12);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
	EXPECT_EQ(wc[0].byte_len, 128);
	EXPECT_EQ(wc[1].wr_id, 13);
	EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc[1].opcode, IBV_WC_FETCH_ADD);
	EXPECT_EQ(ibv_poll_cq(me.f.cq, 4, wc), 0);	/* nothing for 10, 11 */
	EXPECT_TRUE(!memcmp(me.buf + 4096, me.buf, 128));
	memcpy(&orig, me.buf + 8192, 8);
	EXPECT_EQ(orig, before);
	EXPECT_EQ((uint64_t)cmd(sock, CMD_GET, 1024, 0, 0), before + 5);
	/* all of it went the direct way, none through the target */
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	EXPECT_EQ(st.direct_bytes, sizeof(inl) + 128 + 128);
	EXPECT_EQ(st.map_atomics, 1);
	EXPECT_EQ(st.ring_bytes + st.cma_bytes, 0);
	/* The shortcut caches the last local MR: rereg and dereg must reach
	 * that cache. A WRITE from a second MR, the MR moved to another
	 * buffer (same lkey), a WRITE from there; then deregistered, a WRITE
	 * with its lkey is refused. */
	{
		char *b1 = calloc(1, 4096), *b2 = calloc(1, 4096);
		struct ibv_mr *m2;
		uint32_t lk;

		REQUIRE(b1 && b2);
		memset(b1, 0x11, 64);
		memset(b2, 0x22, 64);
		m2 = ibv_reg_mr(me.f.pd, b1, 4096, IBV_ACCESS_LOCAL_WRITE);
		REQUIRE(m2);
		lk = m2->lkey;
		REQUIRE(post_send1(me.qp, IBV_WR_RDMA_WRITE, b1, 64, lk,
				   peer.addr + 2048, peer.rkey, 20) == 0);
		REQUIRE(wait_wc(me.f.cq, wc, 5000) == 1);
		EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
		EXPECT_EQ(cmd(sock, CMD_SUM, 2048, 64, 0), sum(b1, 64));
		REQUIRE(ibv_rereg_mr(m2, IBV_REREG_MR_CHANGE_TRANSLATION, NULL,
				     b2, 4096, 0) == 0);
		REQUIRE(post_send1(me.qp, IBV_WR_RDMA_WRITE, b2, 64, lk,
				   peer.addr + 2048, peer.rkey, 21) == 0);
		REQUIRE(wait_wc(me.f.cq, wc, 5000) == 1);
		EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
		EXPECT_EQ(cmd(sock, CMD_SUM, 2048, 64, 0), sum(b2, 64));
		EXPECT_EQ(ibv_dereg_mr(m2), 0);
		/* two SGEs, the first with the dead lkey */
		sg[0] = (struct ibv_sge){ (uintptr_t)b2, 32, lk };
		sg[1] = (struct ibv_sge){ (uintptr_t)me.buf, 32, me.mr->lkey };
		memset(wr, 0, sizeof(wr));
		wr[0].wr_id = 22;
		wr[0].sg_list = sg;
		wr[0].num_sge = 2;
		wr[0].opcode = IBV_WR_RDMA_WRITE;
		wr[0].send_flags = IBV_SEND_SIGNALED;
		wr[0].wr.rdma.remote_addr = peer.addr + 2048;
		wr[0].wr.rdma.rkey = peer.rkey;
		REQUIRE(ibv_post_send(me.qp, &wr[0], &bad) == 0);
		REQUIRE(wait_wc(me.f.cq, wc, 5000) == 1);
		EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
		EXPECT_EQ(wc[0].wr_id, 22);
		free(b1);
		free(b2);
	}
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/*
 * Two threads post WRITEs on one QP at once: one takes the post shortcut
 * while the other, refused its trylock, goes through the ring, and back.
 * Every WRITE completes once, with success, and every byte lands.
 */
#define MT_N 3000
struct mt_arg {
	struct end *e;
	struct xinfo *peer;
	int t;
	atomic_long *posted, *polled;
	int err;
};

static void *mt_poster(void *p)
{
	struct mt_arg *a = p;

	for (int i = 0; i < MT_N; i++) {
		size_t k = (size_t)a->t * MT_N + (size_t)i;
		int r;

		/* keep the CQ from overrunning: at most 200 unpolled */
		while (atomic_load(a->posted) - atomic_load(a->polled) >= 200)
			sched_yield();
		atomic_fetch_add(a->posted, 1);
		while ((r = post_send1(a->e->qp, IBV_WR_RDMA_WRITE,
				       a->e->buf + (512 << 10) + k * 8, 8,
				       a->e->mr->lkey, a->peer->addr + k * 8,
				       a->peer->rkey, k)) == ENOMEM)
			sched_yield();	/* the ring is full: wait */
		if (r) {
			a->err = r;
			return NULL;
		}
	}
	return NULL;
}

static int test_post_two_threads(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct end me;
	struct xinfo peer;
	struct mt_arg args[2];
	pthread_t th[2];
	atomic_long posted = 0, polled = 0;
	static uint8_t seen[2 * MT_N];
	int sock, bad_status = 0, dup = 0;
	long long t0;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	for (size_t k = 0; k < 2 * MT_N; k++) {
		uint64_t v = k * 0x9e3779b97f4a7c15ull;

		memcpy(me.buf + (512 << 10) + k * 8, &v, 8);
	}
	memset(seen, 0, sizeof(seen));
	for (int t = 0; t < 2; t++) {
		args[t] = (struct mt_arg){ &me, &peer, t, &posted, &polled, 0 };
		REQUIRE(pthread_create(&th[t], NULL, mt_poster, &args[t]) == 0);
	}
	t0 = now_ms();
	while (atomic_load(&polled) < 2 * MT_N && now_ms() - t0 < 20000) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(me.f.cq, 16, wc);

		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS ||
			    wc[i].wr_id >= 2 * MT_N)
				bad_status++;
			else if (seen[wc[i].wr_id]++)
				dup++;
		}
		atomic_fetch_add(&polled, n);
	}
	for (int t = 0; t < 2; t++) {
		pthread_join(th[t], NULL);
		EXPECT_EQ(args[t].err, 0);
	}
	EXPECT_EQ(atomic_load(&polled), 2 * MT_N);
	EXPECT_EQ(bad_status, 0);
	EXPECT_EQ(dup, 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 0, 2 * MT_N * 8, 0),
		  sum(me.buf + (512 << 10), 2 * MT_N * 8));
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* One test per mode (the harness runs functions without arguments). */
#define MODE_TEST(name, mode) \
	static int test_##name(void) { return run_write_read(mode); }

MODE_TEST(rc_write_read_send, M_DIRECT)
MODE_TEST(no_cma_seccomp_fallback, M_TARGET_SECCOMP)
MODE_TEST(no_cma_env_fallback, M_NO_CMA)
MODE_TEST(no_direct_env, M_NO_DIRECT)
MODE_TEST(requester_seccomp, M_REQ_SECCOMP)
MODE_TEST(no_map_env, M_NO_MAP)
MODE_TEST(no_cma_no_map, M_NO_CMA_NO_MAP)
MODE_TEST(requester_seccomp_no_map, M_REQ_SECCOMP_NO_MAP)
MODE_TEST(requester_no_open, M_REQ_NO_OPEN)

/*
 * A target unmaps a page of its registered private memory (and maps new
 * memory there, or not); a requester in another process then WRITEs,
 * READs and adds there. The target's watcher (core/uffd.h) has taken the
 * MR out of the table requesters read, so no requester reaches the new
 * page by cross-memory attach; the target's engine refuses:
 * REM_ACCESS_ERR naming the hole, through the slots (URSA_CMA=0
 * URSA_MAP=0) as by default. The target lives and the rest of its memory
 * is as it was.
 */
static int run_unmapped(bool slots, bool remap)
{
	struct target_arg ta = { IBV_QPT_RC, 64 << 10, 0 };
	const enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
					   IBV_WR_ATOMIC_FETCH_AND_ADD };
	int sock;
	pid_t pid;

	setenv("PROCS_PRIVATE", "1", 1);
	if (slots) {
		setenv("URSA_CMA", "0", 1);
		setenv("URSA_MAP", "0", 1);
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		struct end me;
		struct xinfo peer;
		struct ibv_wc wc;
		struct ibv_sge sg;
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sg, .num_sge = 1,
					  .opcode = ops[i],
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		REQUIRE(end_open(&me, IBV_QPT_RC, 64 << 10, false) == 0);
		pid = start_target(&ta, &me, &sock, &peer);
		REQUIRE(pid > 0);
		EXPECT_EQ(cmd(sock, CMD_FILL, 0, 64 << 10, 'T'), 0);
		EXPECT_EQ(cmd(sock, CMD_UNMAP, 8192, 4096, remap ? 'N' : 0), 0);
		usleep(20000);	/* (the watcher runs just after munmap) */
		memset(me.buf, 'R', 64);
		sg = (struct ibv_sge){ (uintptr_t)me.buf, 64, me.mr->lkey };
		if (ops[i] == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			sg.length = 8;
			wr.wr.atomic.remote_addr = peer.addr + 8192 + 64;
			wr.wr.atomic.rkey = peer.rkey;
			wr.wr.atomic.compare_add = 1;
		} else {
			wr.wr.rdma.remote_addr = peer.addr + 8192 + 64;
			wr.wr.rdma.rkey = peer.rkey;
		}
		REQUIRE(ibv_post_send(me.qp, &wr, &bad) == 0);
		REQUIRE(wait_wc(me.f.cq, &wc, 10000) == 1);
		EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
		if (!strstr(ursa_vendor_err_str(wc.vendor_err), "no longer mapped"))
			harness_fail(__FILE__, __LINE__, "vendor_err", "'%s'",
				     ursa_vendor_err_str(wc.vendor_err));
		EXPECT_EQ(me.buf[0], 'R');
		if (remap)
			EXPECT_EQ(cmd(sock, CMD_GET, 8192 + 64, 0, 0),
				  0x4e4e4e4e4e4e4e4eull);
		/* alive, and the rest of its memory as it was */
		EXPECT_EQ(cmd(sock, CMD_GET, 4096, 0, 0), 0x5454545454545454ull);
		EXPECT_EQ(cmd(sock, CMD_GET, 12288, 0, 0), 0x5454545454545454ull);
		cmd(sock, CMD_QUIT, 0, 0, 0);
		EXPECT_EQ(reap(pid), 0);
		close(sock);
		end_close(&me);
	}
	return TEST_RESULT();
}

static int test_unmapped_slots(void)
{
	return run_unmapped(true, false);
}

static int test_unmapped_cma(void)
{
	if (!ursa_unmap_watch())
		SKIP("userfaultfd refused here: unmaps are not watched");
	return run_unmapped(false, false) || run_unmapped(false, true);
}

/*
 * An MR with partial first and last pages (PROCS_MR_SKIP) inside memory
 * from ursa_mem_alloc: the requester maps the whole allocation, so every
 * byte of the MR is reached by plain stores, and only the MR's bounds
 * (not the pages') limit what it may write.
 */
static int test_partial_pages(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	const size_t skip = 100;
	struct end me;
	struct xinfo peer;
	struct ursa_qp_stats st;
	int sock;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	setenv("PROCS_MR_SKIP", "100", 1);
	pid = start_target(&ta, &me, &sock, &peer);
	unsetenv("PROCS_MR_SKIP");
	REQUIRE(pid > 0);
	for (size_t i = 0; i < (64 << 10); i++)
		me.buf[i] = (char)(i * 7 + 3);
	/* MR offset 0, 50 B: the partial first page */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 50, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, skip, 50, 0), sum(me.buf, 50));
	/* MR offset 4000 (process page 1), 8 KiB: whole pages */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8192, peer.addr + 4000,
			 peer.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, skip + 4000, 8192, 0), sum(me.buf, 8192));
	/* MR offset 3900, 200 B: across the edge of the first whole page */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 16384, 200, peer.addr + 3900,
			 peer.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, skip + 3900, 200, 0), sum(me.buf + 16384, 200));
	/* the last byte of the MR, in the partial last page */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 1,
			 peer.addr + (1 << 20) - 2 * skip - 1, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, (1 << 20) - skip - 1, 1, 0), sum(me.buf, 1));
	/* one byte past it: refused by the target's responder */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 2,
			 peer.addr + (1 << 20) - 2 * skip - 1, peer.rkey,
			 IBV_WC_REM_ACCESS_ERR), 0);
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	EXPECT_EQ(st.map_bytes, 8192 + 50 + 200 + 1);
	EXPECT_EQ(st.direct_bytes, 8192 + 50 + 200 + 1);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* How many mappings of registration memfds (shmap.h) this process has. */
static int ursa_mr_mappings(void)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:ursa-mem ") != NULL;
	fclose(f);
	return n;
}

/*
 * A requester maps the target's MRs and keeps the mappings; when the
 * target deregisters one, the requester drops its mapping at its next
 * mapped access (the table's generation moved) instead of keeping the
 * freed MR's pages alive for the life of the channel.
 */
static int test_dmap_pruned(void)
{
	struct target_arg ta = { IBV_QPT_RC, 8 << 20, 0 };
	struct end me;
	struct xinfo peer, c = { CMD_REG, 0, 4 << 20, 4 << 20 }, r;
	struct ursa_qp_stats st;
	int sock, base;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	base = ursa_mr_mappings();	/* our own MR's region */
	memset(me.buf, 'a', 4096);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 4096, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(ursa_mr_mappings(), base + 1);
	/* the target deregisters it and registers the upper half anew */
	EXPECT_EQ(cmd(sock, CMD_DEREG, 0, 0, 0), 0);
	REQUIRE(xsend(sock, &c) == 0 && xrecv(sock, &r) == 0);
	REQUIRE(r.addr == peer.addr + (4 << 20));
	memset(me.buf, 'b', 4096);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 4096, r.addr, r.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 4 << 20, 4096, 0), sum(me.buf, 4096));
	/* the new region mapped, the old one gone */
	EXPECT_EQ(ursa_mr_mappings(), base + 1);
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	EXPECT_EQ(st.map_bytes, 2 * 4096);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/*
 * The direct path keeps the entry it used last (shm.c, dlast) and checks
 * only its seq and the table's gen on the next WRITE: a rereg that keeps
 * the keys but changes the rights must still be seen. Same rights again:
 * the WRITE still goes direct; write right withdrawn: refused, the
 * target's memory untouched.
 */
static int test_direct_follows_rereg(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct end me;
	struct xinfo peer;
	struct ursa_qp_stats st;
	int sock;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	memcpy(me.buf, "12345678", 8);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_REREG_ACCESS, 0, ALL_REMOTE, 0), 0);
	memcpy(me.buf, "abcdefgh", 8);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_GET, 0, 0, 0), word("abcdefgh"));
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	EXPECT_EQ(st.map_bytes, 16);
	EXPECT_EQ(cmd(sock, CMD_REREG_ACCESS, 0, IBV_ACCESS_LOCAL_WRITE |
		      IBV_ACCESS_REMOTE_READ, 0), 0);
	memcpy(me.buf, "ZZZZZZZZ", 8);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8, peer.addr, peer.rkey,
			 IBV_WC_REM_ACCESS_ERR), 0);
	EXPECT_EQ(cmd(sock, CMD_GET, 0, 0, 0), word("abcdefgh"));
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* The /proc/self/maps line holding address a: its inode and whether the
 * mapping is shared and named ursa-mr; 0 if found. */
static int maps_at(uintptr_t a, unsigned long long *ino, bool *ursa_shared)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int ret = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long lo, hi, off, in;
		char perms[8];

		if (sscanf(line, "%llx-%llx %7s %llx %*s %llu", &lo, &hi, perms,
			   &off, &in) != 5 || a < lo || a >= hi)
			continue;
		*ino = in;
		*ursa_shared = perms[3] == 's' && strstr(line, "ursa-mem");
		ret = 0;
		break;
	}
	fclose(f);
	return ret;
}

/*
 * Registration leaves pages where they are: private memory stays private
 * (same addresses, contents, inode 0) and is not shared with peers; memory
 * from ursa_mem_alloc is published whole. While registered, private pages
 * are locked, so MADV_DONTNEED is refused and nothing diverges; after the
 * last MR (and the registration cache) lets go, it zeroes them as usual.
 * An allocation unmapped behind ursa's back and replaced by private memory
 * is never published again.
 */
static int test_reg_leaves_pages(void)
{
	size_t pg = 4096, len = 6 * pg;
	unsigned long long ino;
	bool sh;
	struct fx f;
	struct ibv_mr *mr1, *mr2;
	struct ursa_mr_info in;
	char *s = NULL;
	char *b = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	REQUIRE(b != MAP_FAILED);
	for (size_t i = 0; i < len; i++)
		b[i] = (char)(i * 7 + 1);
	REQUIRE(fx_open(&f, 16) == 0);
	mr1 = ibv_reg_mr(f.pd, b + 100, 5 * pg, ALL_REMOTE);
	REQUIRE(mr1);
	EXPECT_EQ(maps_at((uintptr_t)b + pg, &ino, &sh), 0);
	EXPECT_TRUE(!sh && ino == 0);
	EXPECT_EQ(ursa_mr_info(mr1, &in), 0);
	EXPECT_EQ(in.shared_bytes, 0);
	EXPECT_EQ(in.pinned_bytes, 6 * pg);
	for (size_t i = 0; i < len; i++)
		if (b[i] != (char)(i * 7 + 1)) {
			EXPECT_TRUE(!"contents changed by registration");
			break;
		}
#ifndef __SANITIZE_ADDRESS__	/* (whose mlock does nothing) */
	/* pinned: the kernel refuses to drop the pages */
	EXPECT_EQ(madvise(b + pg, pg, MADV_DONTNEED), -1);
	EXPECT_EQ(errno, EINVAL);
	EXPECT_EQ(b[pg + 5], (char)((pg + 5) * 7 + 1));
#endif
	EXPECT_EQ(ibv_dereg_mr(mr1), 0);
	EXPECT_TRUE(ursa_rcache_flush() >= 0);
	EXPECT_EQ(madvise(b + pg, pg, MADV_DONTNEED), 0);
	EXPECT_EQ(b[pg + 5], 0);

	/* ursa_mem_alloc: published whole, whatever part the MR covers */
	REQUIRE(ursa_mem_alloc(len, (void **)&s) == 0);
	EXPECT_EQ(((uintptr_t)s) & (pg - 1), 0);
	EXPECT_EQ(s[len - 1], 0);
	mr2 = ibv_reg_mr(f.pd, s + 100, 2 * pg, ALL_REMOTE);
	REQUIRE(mr2);
	EXPECT_EQ(ursa_mr_info(mr2, &in), 0);
	EXPECT_EQ(in.shared_bytes, len);
	EXPECT_EQ(maps_at((uintptr_t)s, &ino, &sh), 0);
	EXPECT_TRUE(sh && ino != 0);
	EXPECT_EQ(ibv_dereg_mr(mr2), 0);
	/* replaced by private memory at the same address: not published */
	REQUIRE(mmap(s, len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == s);
	mr2 = ibv_reg_mr(f.pd, s + 100, 2 * pg, ALL_REMOTE);
	REQUIRE(mr2);
	EXPECT_EQ(ursa_mr_info(mr2, &in), 0);
	EXPECT_EQ(in.shared_bytes, 0);
	EXPECT_EQ(ibv_dereg_mr(mr2), 0);
	EXPECT_EQ(ursa_mem_free(s), 0);
	EXPECT_EQ(ursa_mem_free(s), -EINVAL);
	fx_close(&f);
	munmap(b, len);
	return TEST_RESULT();
}

/*
 * The registration cache is never stale: a range deregistered, then
 * unmapped and mapped again at the same address with other contents and
 * other page sizes, registers as a hit whose table describes the new pages
 * and whose WRITEs carry the new contents; a range unmapped for good is
 * refused (EFAULT) and counted stale, not served from the cache.
 */
static int test_rcache_never_stale(void)
{
	size_t len = 4 << 20, al = 2 << 20;
	struct ursa_rcache_stats rs;
	struct ursa_mr_info in;
	struct ibv_qp *q1, *q2;
	struct ibv_mr *mr, *dst;
	struct ibv_wc wc;
	struct fx f;
	char *base, *a, *out = aligned_alloc(4096, len);
	uint64_t stale0;

	REQUIRE(out && fx_open(&f, 16) == 0);
	q1 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	q2 = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(q1 && q2 && connect_pair(q1, q2, ALL_REMOTE) == 0);
	dst = ibv_reg_mr(f.pd, out, len, ALL_REMOTE);
	base = mmap(NULL, len + al, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(dst && base != MAP_FAILED);
	a = (char *)(((uintptr_t)base + al - 1) & ~(uintptr_t)(al - 1));
	madvise(a, len, MADV_HUGEPAGE);
	memset(a, 'o', len);
	mr = ibv_reg_mr(f.pd, a, len, ALL_REMOTE);
	REQUIRE(mr);
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	/* the same addresses, new memory: 4 KiB pages, new contents */
	REQUIRE(mmap(a, len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == a);
	madvise(a, len, MADV_NOHUGEPAGE);
	memset(a, 'n', len);
	mr = ibv_reg_mr(f.pd, a, len, ALL_REMOTE);
	REQUIRE(mr);
	EXPECT_EQ(ursa_mr_info(mr, &in), 0);
	EXPECT_EQ(in.cached, 1);
	EXPECT_EQ(in.huge_entries, 0);
	EXPECT_EQ(in.entries, len / 4096);
	EXPECT_EQ(in.pinned_bytes, len);
	REQUIRE(post_send1(q1, IBV_WR_RDMA_WRITE, a, (uint32_t)len, mr->lkey,
			   (uintptr_t)out, dst->rkey, 1) == 0);
	REQUIRE(wait_wc(f.cq, &wc, 10000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_TRUE(out[0] == 'n' && out[len - 1] == 'n');
	EXPECT_EQ(ibv_dereg_mr(mr), 0);
	/* unmapped for good: refused, and the entry counted stale */
	EXPECT_EQ(ursa_rcache_stats(&rs), 0);
	stale0 = rs.stale;
	munmap(base, len + al);
	errno = 0;
	EXPECT_TRUE(ibv_reg_mr(f.pd, a, len, ALL_REMOTE) == NULL);
	EXPECT_EQ(errno, EFAULT);
	EXPECT_EQ(ursa_rcache_stats(&rs), 0);
	EXPECT_EQ(rs.stale, stale0 + 1);
	ibv_destroy_qp(q1);
	ibv_destroy_qp(q2);
	ibv_dereg_mr(dst);
	fx_close(&f);
	free(out);
	return TEST_RESULT();
}

/*
 * Writers that check every write they made is still there: a thread that
 * stores to every page of a buffer in turn (with malloc and free on the
 * way, as threads of real programs do: UCX's async thread's lost heap
 * writes once showed as "free(): invalid next size"), and stores that the
 * kernel makes for it (read(2) from a pipe into the page, and the same
 * READ through io_uring, completed by the kernel), while other
 * threads register, re-register and deregister overlapping ranges.
 */
struct pager {
	volatile uint64_t *b;
	size_t pages;
	atomic_int stop, rounds;
	uint64_t lost, kernel_writes, uring_writes;
	bool no_uring;
};

/* A one-entry io_uring, by the raw system calls (no liburing): the kernel
 * writes into the page from its own context when the READ completes. */
struct uring {
	int fd;
	unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
};

static int uring_open(struct uring *u)
{
	struct io_uring_params p;
	char *sq, *cq;

	memset(&p, 0, sizeof(p));
	u->fd = (int)syscall(__NR_io_uring_setup, 1, &p);
	if (u->fd < 0)
		return -1;
	sq = mmap(NULL, p.sq_off.array + p.sq_entries * sizeof(unsigned),
		  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
		  IORING_OFF_SQ_RING);
	cq = mmap(NULL, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe),
		  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
		  IORING_OFF_CQ_RING);
	u->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe),
		       PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
		       IORING_OFF_SQES);
	if (sq == MAP_FAILED || cq == MAP_FAILED || u->sqes == MAP_FAILED) {
		close(u->fd);
		return -1;
	}
	u->sq_tail = (unsigned *)(void *)(sq + p.sq_off.tail);
	u->sq_mask = (unsigned *)(void *)(sq + p.sq_off.ring_mask);
	u->sq_array = (unsigned *)(void *)(sq + p.sq_off.array);
	u->cq_head = (unsigned *)(void *)(cq + p.cq_off.head);
	u->cq_tail = (unsigned *)(void *)(cq + p.cq_off.tail);
	u->cq_mask = (unsigned *)(void *)(cq + p.cq_off.ring_mask);
	u->cqes = (struct io_uring_cqe *)(void *)(cq + p.cq_off.cqes);
	return 0;
}

/* read(fd, dst, 8) through the ring; 8 when it completed whole. */
static int uring_read8(struct uring *u, int fd, volatile uint64_t *dst)
{
	unsigned t = *u->sq_tail, h, i = t & *u->sq_mask;
	struct io_uring_sqe *e = &u->sqes[i];
	int res;

	memset(e, 0, sizeof(*e));
	e->opcode = IORING_OP_READ;
	e->fd = fd;
	e->addr = (uintptr_t)dst;
	e->len = 8;
	e->off = (uint64_t)-1;
	u->sq_array[i] = i;
	__atomic_store_n(u->sq_tail, t + 1, __ATOMIC_RELEASE);
	if (syscall(__NR_io_uring_enter, u->fd, 1, 1, IORING_ENTER_GETEVENTS,
		    NULL, 0) < 0)
		return -1;
	h = *u->cq_head;
	if (h == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE))
		return -1;
	res = u->cqes[h & *u->cq_mask].res;
	__atomic_store_n(u->cq_head, h + 1, __ATOMIC_RELEASE);
	return res;
}

static void *pager_main(void *arg)
{
	struct pager *p = arg;
	uint64_t seq = 0, *last = calloc(p->pages, sizeof(*last));
	struct uring u = { .fd = -1 };
	int pfd[2];

	if (!last || pipe(pfd)) {
		free(last);
		p->lost = ~0ull;
		return NULL;
	}
	p->no_uring = uring_open(&u) != 0;
	while (!atomic_load(&p->stop)) {
		for (size_t i = 0; i < p->pages; i++) {
			volatile uint64_t *w = p->b + i * 512;
			void *junk = malloc(64 + i % 512);

			if (*w != last[i])
				p->lost++;
			last[i] = ++seq;
			if (i % 3 == 0 && write(pfd[1], &seq, 8) == 8 &&
			    read(pfd[0], (void *)w, 8) == 8)
				p->kernel_writes++;
			else if (i % 3 == 1 && !p->no_uring &&
				 write(pfd[1], &seq, 8) == 8 &&
				 uring_read8(&u, pfd[0], w) == 8)
				p->uring_writes++;
			else
				*w = seq;
			free(junk);
		}
		atomic_fetch_add(&p->rounds, 1);
	}
	close(pfd[0]);
	close(pfd[1]);
	if (!p->no_uring)
		close(u.fd);
	free(last);
	return NULL;
}

struct registrar {
	struct ibv_pd *pd;
	char *b;
	size_t len;
	unsigned seed;
	atomic_int *stop;
	int fails;
	atomic_int ops;
};

/* A random range of the buffer, not page aligned half of the time. */
static void pick(struct registrar *r, char **a, size_t *n)
{
	size_t off = (size_t)rand_r(&r->seed) % r->len;

	if (rand_r(&r->seed) & 1)
		off &= ~(size_t)4095;
	*a = r->b + off;
	*n = 1 + (size_t)rand_r(&r->seed) % (r->len - off);
}

static void *registrar_main(void *arg)
{
	struct registrar *r = arg;

	while (!atomic_load(r->stop)) {
		struct ibv_mr *mr;
		char *a;
		size_t n;

		pick(r, &a, &n);
		mr = ibv_reg_mr(r->pd, a, n, ALL_REMOTE);
		if (!mr) {
			r->fails++;
			continue;
		}
		if (rand_r(&r->seed) % 3 == 0) {
			pick(r, &a, &n);
			r->fails += ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION,
						 NULL, a, n, 0) != 0;
		}
		r->fails += ibv_dereg_mr(mr) != 0;
		r->ops++;
	}
	return NULL;
}

enum hammer_kind { H_ANON, H_THP, H_MEMFD, H_URSA_MEM, H_STACK, H_FILE_SHARED,
		   H_FILE_PRIVATE, H_HUGETLB, H_FORK_COW, H_KINDS };
static const char *hammer_name[] = { "anonymous", "THP", "memfd shared",
				     "ursa_mem_alloc", "stack", "file shared",
				     "file private", "hugetlbfs",
				     "anonymous, shared with a forked child" };

/*
 * Another process writing the buffer by cross-memory attach
 * (process_vm_writev: the kernel's copy, as a same-host peer's WRITE), to
 * word 8 of every page, checking its previous write there each time with
 * process_vm_readv. Exits with the number of writes it found lost (at
 * most 250), 251 when cross-memory attach is not permitted. Stops once
 * stop_fd is readable.
 */
static int cma_writer(pid_t target, volatile uint64_t *b, size_t pages,
		      int stop_fd)
{
	uint64_t seq = 0, lost = 0, *last = calloc(pages, sizeof(*last));
	struct pollfd pf = { stop_fd, POLLIN, 0 };

	if (!last)
		return 251;
	do {
		for (size_t i = 0; i < pages; i++) {
			uint64_t v;
			struct iovec l = { &v, 8 };
			struct iovec r = { (void *)(b + i * 512 + 8), 8 };

			if (process_vm_readv(target, &l, 1, &r, 1, 0) != 8)
				return seq ? 250 : 251;
			lost += v != last[i];
			v = last[i] = ++seq;
			if (process_vm_writev(target, &l, 1, &r, 1, 0) != 8)
				return 250;
		}
	} while (poll(&pf, 1, 0) == 0);
	return lost > 250 ? 250 : (int)lost;
}

static int hammer(struct fx *f, enum hammer_kind k, volatile uint64_t *b,
		  size_t len)
{
	struct pager p = { .b = b, .pages = len / 4096 };
	struct registrar r[2];
	atomic_int stop = 0;
	pthread_t t, rt[2];
	int ok = 1, sp[2], st = 0;
	pid_t cma;

	REQUIRE(pipe(sp) == 0);
	cma = fork();
	REQUIRE(cma >= 0);
	if (cma == 0) {
		close(sp[1]);
		_exit(cma_writer(getppid(), b, p.pages, sp[0]));
	}
	close(sp[0]);
	REQUIRE(pthread_create(&t, NULL, pager_main, &p) == 0);
	while (atomic_load(&p.rounds) < 1)
		sched_yield();
	for (int i = 0; i < 2; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].pd = f->pd;
		r[i].b = (char *)b;
		r[i].len = len;
		r[i].seed = 17u * (unsigned)i + (unsigned)k;
		r[i].stop = &stop;
		REQUIRE(pthread_create(&rt[i], NULL, registrar_main, &r[i]) == 0);
	}
	/* rounds of the pager, not time: each is a full pass over the pages
	 * during registrations */
	while (atomic_load(&p.rounds) < 40 || atomic_load(&r[0].ops) < 50 ||
	       atomic_load(&r[1].ops) < 50)
		usleep(1000);
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(rt[i], NULL);
	atomic_store(&p.stop, 1);
	pthread_join(t, NULL);
	close(sp[1]);
	waitpid(cma, &st, 0);
	st = WIFEXITED(st) ? WEXITSTATUS(st) : 252;
	if (st == 251)
		printf("    %s: cross-memory attach not permitted: no CMA writer\n",
		       hammer_name[k]);
	if (p.no_uring)
		printf("    %s: io_uring not permitted: no io_uring writes\n",
		       hammer_name[k]);
	printf("    %s: %llu writes by read(2), %llu by io_uring; %llu lost\n",
	       hammer_name[k], (unsigned long long)p.kernel_writes,
	       (unsigned long long)p.uring_writes, (unsigned long long)p.lost);
	if (p.lost || r[0].fails || r[1].fails || (st && st != 251) ||
	    !p.kernel_writes || (!p.no_uring && !p.uring_writes)) {
		fprintf(stderr, "    %s: %llu writes lost, CMA writer %d, %d+%d failed of %d+%d registrations, %llu read(2) and %llu io_uring writes\n",
			hammer_name[k], (unsigned long long)p.lost, st, r[0].fails, r[1].fails,
			atomic_load(&r[0].ops), atomic_load(&r[1].ops),
			(unsigned long long)p.kernel_writes,
			(unsigned long long)p.uring_writes);
		ok = 0;
	}
	return ok;
}

static void *stack_hammer(void *arg)
{
	struct fx *f = arg;
	uint64_t buf[16 * 512] __attribute__((aligned(4096)));

	memset(buf, 0, sizeof(buf));
	return hammer(f, H_STACK, buf, sizeof(buf)) ? f : NULL;
}

/* vm.nr_hugepages: set it to n (n >= 0, where permitted); returns the
 * value before, or -1. */
static long nr_hugepages(long n)
{
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", n < 0 ? "r" : "w");
	long v = -1;

	if (!f)
		return -1;
	if (n < 0 ? fscanf(f, "%ld", &v) != 1 : fprintf(f, "%ld\n", n) < 0)
		v = -1;
	fclose(f);
	return n < 0 ? v : n;
}

static int test_reg_hammer(void)
{
	size_t len = 4 << 20;
	struct fx f;
	void *res;

	REQUIRE(fx_open(&f, 16) == 0);
	for (int k = H_ANON; k < H_KINDS; k++) {
		void *base = MAP_FAILED, *m = NULL;
		pid_t child = -1;
		long hp_was = -1;
		int fd = -1;

		if (k == H_ANON || k == H_THP || k == H_FORK_COW) {
			base = mmap(NULL, len + (2 << 20), PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			REQUIRE(base != MAP_FAILED);
			m = (void *)(((uintptr_t)base + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
			madvise(m, len, k == H_THP ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
			memset(m, 0, len);
		} else if (k == H_MEMFD) {
			fd = memfd_create("hammer", MFD_CLOEXEC);
			REQUIRE(fd >= 0 && ftruncate(fd, (off_t)len) == 0);
			m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			REQUIRE(m != MAP_FAILED);
		} else if (k == H_URSA_MEM) {
			REQUIRE(ursa_mem_alloc(len, &m) == 0);
		} else if (k == H_FILE_SHARED || k == H_FILE_PRIVATE) {
			/* a file on the build's file system (not tmpfs, when
			 * the tree is on a disk) */
			char path[] = "hammer.XXXXXX";

			fd = mkstemp(path);
			REQUIRE(fd >= 0 && unlink(path) == 0 &&
				ftruncate(fd, (off_t)len) == 0);
			m = mmap(NULL, len, PROT_READ | PROT_WRITE,
				 k == H_FILE_SHARED ? MAP_SHARED : MAP_PRIVATE, fd, 0);
			REQUIRE(m != MAP_FAILED);
		} else if (k == H_HUGETLB) {
			/* as root, reserve the two huge pages it needs for the
			 * test's duration */
			hp_was = nr_hugepages(-1);
			if (hp_was == 0)
				nr_hugepages(4);
			m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE |
				 MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
			if (m == MAP_FAILED) {
				if (hp_was == 0)
					nr_hugepages(0);
				printf("    hugetlbfs: no huge pages reserved (vm.nr_hugepages): not run\n");
				continue;
			}
			memset(m, 0, len);
		}
		if (k == H_FORK_COW) {
			/* the child shares every page copy-on-write: the
			 * writers' stores during registration break the sharing */
			child = fork();
			REQUIRE(child >= 0);
			if (child == 0) {
				pause();
				_exit(0);
			}
		}
		if (k == H_STACK) {
			pthread_t t;

			REQUIRE(pthread_create(&t, NULL, stack_hammer, &f) == 0);
			pthread_join(t, &res);
			EXPECT_TRUE(res == &f);
			continue;
		}
		if (k == H_THP) {
			struct ibv_mr *mr = ibv_reg_mr(f.pd, m, len, ALL_REMOTE);
			struct ursa_mr_info in;

			/* (THP may be off or the pages not yet collapsed: then
			 * only the loss check means anything) */
			REQUIRE(mr && ursa_mr_info(mr, &in) == 0);
			printf("    THP buffer: %u of %u entries huge\n", in.huge_entries,
			       in.entries);
			ibv_dereg_mr(mr);
		}
		EXPECT_TRUE(hammer(&f, (enum hammer_kind)k, m, len));
		if (child > 0) {
			kill(child, SIGKILL);
			waitpid(child, NULL, 0);
		}
		if (k == H_URSA_MEM)
			ursa_mem_free(m);
		else if (base == MAP_FAILED)
			munmap(m, len);
		else
			munmap(base, len + (2 << 20));
		if (k == H_HUGETLB && hp_was == 0)
			nr_hugepages(0);
		if (fd >= 0)
			close(fd);
	}
	fx_close(&f);
	return TEST_RESULT();
}

struct writer {
	struct end *e;
	struct xinfo *peer;
	atomic_int stop;
	int ok, status;
};

/* WRITE 256 KiB at a time until a WRITE fails; the status of the failure. */
static void *writer_main(void *arg)
{
	struct writer *w = arg;
	struct ibv_wc wc;

	while (!atomic_load(&w->stop)) {
		if (post_send1(w->e->qp, IBV_WR_RDMA_WRITE, w->e->buf, 256 << 10,
			       w->e->mr->lkey, w->peer->addr, w->peer->rkey, 1) ||
		    wait_wc(w->e->f.cq, &wc, 10000) != 1) {
			w->status = -1;
			break;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			w->status = (int)wc.status;
			break;
		}
		w->ok++;
	}
	return NULL;
}

static int test_dereg_during_writes(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct writer w = { 0 };
	struct ursa_qp_stats st;
	struct end me;
	struct xinfo peer;
	pthread_t th;
	uint64_t want;
	char pat[256 << 10];
	int sock;
	pid_t pid;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	memset(me.buf, 'W', 256 << 10);
	memset(pat, 'D', sizeof(pat));
	want = sum(pat, sizeof(pat));
	w.e = &me;
	w.peer = &peer;
	REQUIRE(pthread_create(&th, NULL, writer_main, &w) == 0);
	while (w.ok < 20 && !w.status)
		usleep(1000);
	/* Deregistered while WRITEs stream in: the pattern written right
	 * after ibv_dereg_mr returns must survive. */
	EXPECT_EQ(cmd(sock, CMD_DEREG, 0, 256 << 10, 'D'), 0);
	usleep(50000);
	atomic_store(&w.stop, 1);
	pthread_join(th, NULL);
	EXPECT_TRUE(w.ok >= 20);
	EXPECT_EQ(w.status, IBV_WC_REM_ACCESS_ERR);
	EXPECT_EQ(cmd(sock, CMD_SUM, 0, 256 << 10, 0), want);
	EXPECT_EQ(ursa_qp_stats(me.qp, &st), 0);
	EXPECT_TRUE(st.direct_bytes >= 20ull * (256 << 10));
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

static int test_target_checks(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct end me;
	struct xinfo peer;
	int sock;
	pid_t pid;
	uint64_t before;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	cmd(sock, CMD_FILL, 0, 1 << 20, 'T');
	before = cmd(sock, CMD_SUM, 0, 1 << 20, 0);
	memset(me.buf, 'X', 1 << 20);
	/* one byte past the end of the peer's MR: refused, untouched */
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 64 << 10,
			 peer.addr + (1 << 20) - (32 << 10) + 1, peer.rkey,
			 IBV_WC_REM_ACCESS_ERR), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 0, 1 << 20, 0), before);
	EXPECT_EQ(ibv_query_qp(me.qp, &qa, IBV_QP_STATE, &qi), 0);
	EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	/* a guessed rkey on a fresh pair */
	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = start_target(&ta, &me, &sock, &peer);
	REQUIRE(pid > 0);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_READ, 0, 64, peer.addr,
			 peer.rkey ^ 0x5a5a00, IBV_WC_REM_ACCESS_ERR), 0);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	/* Wild addresses with the rkey the last direct WRITE used: the post
	 * asks for the line at (address + that WRITE's distance) before its
	 * checks (req.c), a hint that must never fault; the checks refuse. */
	for (int i = 0; i < 3; i++) {
		static const uint64_t wild[3] = { 0, 0xfffffffffffff000ull,
						  0x0000800000000000ull };
		struct ursa_qp_stats st;

		REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
		pid = start_target(&ta, &me, &sock, &peer);
		REQUIRE(pid > 0);
		cmd(sock, CMD_FILL, 0, 1 << 20, 'T');
		before = cmd(sock, CMD_SUM, 0, 1 << 20, 0);
		memset(me.buf, 'T', 8);
		EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8, peer.addr + 64,
				 peer.rkey, IBV_WC_SUCCESS), 0);
		REQUIRE(ursa_qp_stats(me.qp, &st) == 0);
		EXPECT_EQ(st.map_bytes, 8);	/* it went the mapped way */
		EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 8, wild[i],
				 peer.rkey, IBV_WC_REM_ACCESS_ERR), 0);
		EXPECT_EQ(cmd(sock, CMD_SUM, 0, 1 << 20, 0), before);
		cmd(sock, CMD_QUIT, 0, 0, 0);
		EXPECT_EQ(reap(pid), 0);
		end_close(&me);
	}
	return TEST_RESULT();
}

/* Two processes add to one counter in a third: the sum is exact. */
struct adder_arg {
	struct xinfo target;
	int iters;
	int mapped;	/* -1: any path; else whether every atomic is mapped */
};

static int adder_main(int sock, void *varg)
{
	struct adder_arg *a = varg;
	struct end e;
	struct xinfo me;

	if (end_open(&e, IBV_QPT_RC, 4096, false))
		return 20;
	info_of(&e, &me);
	if (xsend(sock, &me) || xrecv(sock, &a->target))
		return 21;
	if (to_rts(e.qp, a->target.qpn, ALL_REMOTE))
		return 22;
	for (int i = 0; i < a->iters; i++) {
		struct ibv_sge s = { (uintptr_t)e.buf, 8, e.mr->lkey };
		struct ibv_send_wr wr = { .sg_list = &s, .num_sge = 1,
			.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
			.send_flags = IBV_SEND_SIGNALED }, *bad;
		struct ibv_wc wc;

		wr.wr.atomic.remote_addr = a->target.addr;
		wr.wr.atomic.rkey = a->target.rkey;
		wr.wr.atomic.compare_add = 1;
		if (ibv_post_send(e.qp, &wr, &bad))
			return 23;
		if (wait_wc(e.f.cq, &wc, 10000) != 1)
			return 24;
		if (wc.status) {
			fprintf(stderr, "    adder %d: atomic %d: %s (%s)\n",
				(int)getpid(), i, ibv_wc_status_str(wc.status),
				ursa_vendor_err_str(wc.vendor_err));
			return 25;
		}
	}
	if (a->mapped >= 0) {
		struct ursa_qp_stats st;

		if (ursa_qp_stats(e.qp, &st) ||
		    st.map_atomics != (a->mapped ? (uint64_t)a->iters : 0)) {
			fprintf(stderr, "    adder %d: %llu atomics mapped\n",
				(int)getpid(), (unsigned long long)st.map_atomics);
			return 26;
		}
	}
	end_close(&e);
	return 0;
}

/*
 * Two adders, 1000 fetch-and-adds each, on one counter of this process,
 * which only sleeps. A counter in memory from ursa_mem_alloc is mapped by
 * the adders (shmap.h): the first adder is told not to map (URSA_MAP=0) and
 * goes through this process's engine, the second adds in the mapping
 * itself; the sum is exact only if both paths are atomic against each
 * other. A counter in private memory (malloc) cannot be mapped: both
 * adders go through the engine.
 */
static int run_atomics(bool own_page)
{
	struct fx f;
	struct ibv_mr *mr;
	void *page = NULL;
	uint64_t *counter = own_page ?
		(ursa_mem_alloc(4096, &page) ? MAP_FAILED : page) :
		aligned_alloc(64, 64);
	struct ibv_qp *tq[2];
	pid_t pids[2];
	int socks[2];

	REQUIRE(counter != MAP_FAILED && counter);
	*counter = 0;
	REQUIRE(fx_open(&f, 16) == 0);
	mr = ibv_reg_mr(f.pd, counter, own_page ? 4096 : 64, ALL_REMOTE);
	REQUIRE(mr);
	for (int i = 0; i < 2; i++) {
		struct xinfo peer, mine;

		tq[i] = make_qp(&f, IBV_QPT_RC, NULL, NULL, NULL);
		REQUIRE(tq[i]);
		if (own_page && i == 0)
			setenv("URSA_MAP", "0", 1);
		pids[i] = spawn_role("adder", "1000",
				     own_page && i == 1 ? "1" : "0", NULL,
				     &socks[i]);
		unsetenv("URSA_MAP");
		REQUIRE(pids[i] > 0);
		REQUIRE(xrecv(socks[i], &peer) == 0);
		REQUIRE(to_rts(tq[i], peer.qpn, ALL_REMOTE) == 0);
		mine.qpn = tq[i]->qp_num;
		mine.addr = (uintptr_t)counter;
		mine.rkey = mr->rkey;
		REQUIRE(xsend(socks[i], &mine) == 0);
	}
	/* This process only sleeps: its engine serves the adders that do
	 * not map the counter. */
	for (int i = 0; i < 2; i++)
		EXPECT_EQ(reap(pids[i]), 0);
	EXPECT_EQ(*counter, 2000);
	ibv_destroy_qp(tq[0]);
	ibv_destroy_qp(tq[1]);
	ibv_dereg_mr(mr);
	fx_close(&f);
	if (own_page)
		ursa_mem_free(counter);
	else
		free(counter);
	return TEST_RESULT();
}

static int test_atomics_three_processes(void)
{
	return run_atomics(false);
}

static int test_atomics_mapped_and_engine(void)
{
	return run_atomics(true);
}

/* The target spins on the last byte of its buffer, as perftest's latency
 * test does: it must never see a torn message. */
static int spinner_main(int sock, void *varg)
{
	struct end e;
	struct xinfo me, peer, go;
	size_t len = 256 << 10;
	int torn = 0;

	(void)varg;
	if (end_open(&e, IBV_QPT_RC, len, false))
		return 30;
	info_of(&e, &me);
	if (xsend(sock, &me) || xrecv(sock, &peer) ||
	    to_rts(e.qp, peer.qpn, ALL_REMOTE) || xsend(sock, &me))
		return 31;
	for (int r = 1; r <= 60; r++) {
		size_t n = r % 2 ? 4000 : len; /* slot path and CMA path */
		volatile char *b = e.buf;

		while (b[n - 1] != (char)r)
			;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		for (size_t i = 0; i < n; i++)
			if (b[i] != (char)r) {
				torn++;
				break;
			}
		go.value = (uint64_t)torn;
		if (xsend(sock, &go))
			return 32;
	}
	end_close(&e);
	return torn ? 33 : 0;
}

static int test_last_byte_last_processes(void)
{
	struct end me;
	struct xinfo peer, mine, ready, ack;
	int sock;
	pid_t pid;
	size_t len = 256 << 10;

	REQUIRE(end_open(&me, IBV_QPT_RC, len, false) == 0);
	pid = spawn_role("spinner", NULL, NULL, NULL, &sock);
	REQUIRE(pid > 0);
	info_of(&me, &mine);
	REQUIRE(xrecv(sock, &peer) == 0 && xsend(sock, &mine) == 0);
	REQUIRE(to_rts(me.qp, peer.qpn, ALL_REMOTE) == 0);
	REQUIRE(xrecv(sock, &ready) == 0);
	for (int r = 1; r <= 60; r++) {
		size_t n = r % 2 ? 4000 : len;

		memset(me.buf, r, n);
		REQUIRE(one_op(&me, IBV_WR_RDMA_WRITE, 0, (uint32_t)n, peer.addr,
			       peer.rkey, IBV_WC_SUCCESS) == 0);
		REQUIRE(xrecv(sock, &ack) == 0);
		EXPECT_EQ(ack.value, 0);
	}
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* A waiter's end: an RC QP with a completion channel, connected to the
 * peer whose info comes over sock. 0, or the child's exit code. */
static int waiter_open(struct end *e, int sock, struct xinfo *me)
{
	struct xinfo peer;

	if (end_open(e, IBV_QPT_RC, 1 << 20, true))
		return 40;
	info_of(e, me);
	if (xsend(sock, me) || xrecv(sock, &peer) ||
	    to_rts(e->qp, peer.qpn, ALL_REMOTE))
		return 41;
	return 0;
}

/*
 * A process blocked in ibv_get_cq_event wakes for a SEND and for a WRITE
 * with immediate from another process (role "waiter").
 *
 * Role "poll_waiter" (test skipped_doorbell_bounded): the doorbell a
 * poster skips (transport/shm.c ring_peer). While the target's application
 * polls, a SEND rings no doorbell, and the target's next poll serves it.
 * This waiter polls (its CQ not armed), then arms it, tells the requester
 * to go and at once blocks in ibv_get_cq_event: the SEND arrives soon
 * after its last poll, and the arm must have withdrawn the poller. Round 0
 * only connects (the first SEND opens the channel, which wakes the engine
 * by itself); round 1 first idles 200 ms, so that its engine's next
 * wake-up is far (its next timer, tens of milliseconds away, or none);
 * round 2 follows at once (the engine wakes by itself within a
 * millisecond). Each answer tells how long the event took (addr, ns).
 */
static int waiter_main(int sock, void *varg)
{
	bool poll_first = varg != NULL;
	struct end e;
	struct xinfo me, rep;
	struct ibv_cq *cq;
	void *cctx;
	struct ibv_wc wc;
	int ret;

	if ((ret = waiter_open(&e, sock, &me)))
		return ret;
	for (int i = 0; i < (poll_first ? 3 : 2); i++) {
		struct timespec a, b;

		if (post_recv1(e.qp, e.buf, 4096, e.mr->lkey, (uint64_t)i))
			return 42;
		if (poll_first && i == 1)
			usleep(200000);
		for (long long t0 = now_ms(); poll_first && now_ms() - t0 < 5;)
			if (ibv_poll_cq(e.f.cq, 1, &wc) != 0)
				return 47;	/* nothing was sent yet */
		if (ibv_req_notify_cq(e.f.cq, 0))
			return 42;
		clock_gettime(CLOCK_MONOTONIC, &a);
		if (xsend(sock, &me))	/* armed: go ahead */
			return 43;
		if (ibv_get_cq_event(e.ch, &cq, &cctx))
			return 44;
		clock_gettime(CLOCK_MONOTONIC, &b);
		ibv_ack_cq_events(cq, 1);
		if (ibv_poll_cq(cq, 1, &wc) != 1 || wc.status)
			return 45;
		memset(&rep, 0, sizeof(rep));
		rep.value = wc.opcode;
		rep.rkey = wc.wc_flags & IBV_WC_WITH_IMM ? be32toh(wc.imm_data) : 0;
		rep.addr = (uint64_t)((b.tv_sec - a.tv_sec) * 1000000000ll +
				      (b.tv_nsec - a.tv_nsec));
		if (xsend(sock, &rep))
			return 46;
	}
	end_close(&e);
	return 0;
}

static int test_channel_wakeup_across_processes(void)
{
	struct end me;
	struct xinfo peer, mine, armed, rep;
	int sock;
	pid_t pid;
	struct ibv_sge s;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;

	REQUIRE(end_open(&me, IBV_QPT_RC, 1 << 20, false) == 0);
	pid = spawn_role("waiter", NULL, NULL, NULL, &sock);
	REQUIRE(pid > 0);
	info_of(&me, &mine);
	REQUIRE(xrecv(sock, &peer) == 0 && xsend(sock, &mine) == 0);
	REQUIRE(to_rts(me.qp, peer.qpn, ALL_REMOTE) == 0);
	/* 1: SEND */
	REQUIRE(xrecv(sock, &armed) == 0);
	usleep(50000); /* let the waiter block */
	REQUIRE(one_op(&me, IBV_WR_SEND, 0, 16, 0, 0, IBV_WC_SUCCESS) == 0);
	REQUIRE(xrecv(sock, &rep) == 0);
	EXPECT_EQ(rep.value, IBV_WC_RECV);
	/* 2: WRITE with immediate */
	REQUIRE(xrecv(sock, &armed) == 0);
	usleep(50000);
	s = (struct ibv_sge){ (uintptr_t)me.buf, 64, me.mr->lkey };
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(1234);
	wr.wr.rdma.remote_addr = peer.addr + 8192;
	wr.wr.rdma.rkey = peer.rkey;
	REQUIRE(ibv_post_send(me.qp, &wr, &bad) == 0);
	REQUIRE(wait_wc(me.f.cq, &wc, 5000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	REQUIRE(xrecv(sock, &rep) == 0);
	EXPECT_EQ(rep.value, IBV_WC_RECV_RDMA_WITH_IMM);
	EXPECT_EQ(rep.rkey, 1234);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* The requester of skipped_doorbell_bounded, in a process of its own (the
 * skip window is read once per process): at each "go" from the waiter, a
 * SEND at once; reports each SEND's status. */
static int poll_sender_main(int sock, void *varg)
{
	struct end e;
	struct xinfo me, peer, go, rep;

	(void)varg;
	if (end_open(&e, IBV_QPT_RC, 1 << 20, false))
		return 50;
	info_of(&e, &me);
	if (xsend(sock, &me) || xrecv(sock, &peer) ||
	    to_rts(e.qp, peer.qpn, ALL_REMOTE))
		return 51;
	for (int i = 0; i < 3; i++) {
		if (xrecv(sock, &go))
			return 52;
		memset(&rep, 0, sizeof(rep));
		rep.value = (uint64_t)one_op(&e, IBV_WR_SEND, 0, 16, 0, 0,
					     IBV_WC_SUCCESS);
		if (xsend(sock, &rep))
			return 53;
	}
	end_close(&e);
	return 0;
}

/* xrecv with a deadline: -1 when nothing came in ms milliseconds */
static int xrecv_within(int fd, struct xinfo *x, int ms)
{
	struct pollfd pf = { fd, POLLIN, 0 };

	return poll(&pf, 1, ms) == 1 ? xrecv(fd, x) : -1;
}

/* Both ends are children with URSA_RING_APP_US=5000 and
 * URSA_RING_WAKE_US=10 s: the SEND reliably comes within the window after
 * the waiter's last poll, however this machine schedules the relay, and a
 * poller's ring would be skipped whatever the engine's next timer. A
 * liveness test: a build whose arm does not withdraw the poller passed it
 * too (events after 0.1-1.1 ms: the engine woke by itself soon); that
 * fix is measured by bench/kv.sh (SEND GET p99 1077 -> 84 µs). */
static int test_skipped_doorbell_bounded(void)
{
	struct xinfo w, snd, go, rep, st;
	int ws, ss;
	pid_t wp, sp;

	setenv("URSA_RING_APP_US", "5000", 1);
	setenv("URSA_RING_WAKE_US", "10000000", 1);
	wp = spawn_role("poll_waiter", NULL, NULL, NULL, &ws);
	sp = spawn_role("poll_sender", NULL, NULL, NULL, &ss);
	unsetenv("URSA_RING_APP_US");
	unsetenv("URSA_RING_WAKE_US");
	REQUIRE(wp > 0 && sp > 0);
	REQUIRE(xrecv(ws, &w) == 0 && xrecv(ss, &snd) == 0);
	REQUIRE(xsend(ws, &snd) == 0 && xsend(ss, &w) == 0);
	for (int i = 0; i < 3; i++) {
		REQUIRE(xrecv_within(ws, &go, 5000) == 0);
		REQUIRE(xsend(ss, &go) == 0);
		REQUIRE(xrecv_within(ss, &st, 15000) == 0);
		EXPECT_EQ(st.value, 0);		/* the SEND succeeded */
		if (xrecv_within(ws, &rep, 3000)) {
			kill(wp, SIGKILL);
			kill(sp, SIGKILL);
			reap(wp);
			reap(sp);
			REQUIRE(!"the waiter's event came within 3 s");
		}
		EXPECT_EQ(rep.value, IBV_WC_RECV);
		/* Rung (or served by the arm), so bounded by scheduling. */
		EXPECT_TRUE(rep.addr < 30000000ull);
		if (getenv("SHOWLAT") || rep.addr >= 30000000ull)
			fprintf(stderr, "    round %d: event after %.1f ms\n", i,
				rep.addr / 1e6);
	}
	EXPECT_EQ(reap(wp), 0);
	EXPECT_EQ(reap(sp), 0);
	close(ws);
	close(ss);
	return TEST_RESULT();
}

/* SIGKILL the target: the survivor gets RETRY_EXC_ERR within the bound
 * its timeout and retry count set, and its other QPs keep working. */
static int test_peer_death(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct end a, b;
	struct xinfo pa, pb;
	int sa, sb;
	pid_t victim, other;
	struct ibv_qp_attr attr = { .timeout = 12, .retry_cnt = 3 };
	struct ursa_qp_stats st;
	uint64_t direct;
	struct ibv_wc wc;
	long long t0, dt;
	char name[64];
	FILE *f;
	char line[512];
	int found = 0;

	REQUIRE(end_open(&a, IBV_QPT_RC, 1 << 20, false) == 0);
	REQUIRE(end_open(&b, IBV_QPT_RC, 1 << 20, false) == 0);
	victim = start_target(&ta, &a, &sa, &pa);
	other = start_target(&ta, &b, &sb, &pb);
	REQUIRE(victim > 0 && other > 0);
	/* bad flow on the way: modify without IBV_QP_STATE is refused */
	REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT) == EINVAL);
	EXPECT_EQ(one_op(&a, IBV_WR_RDMA_WRITE, 0, 64, pa.addr, pa.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_EQ(ursa_qp_stats(a.qp, &st), 0);
	direct = st.direct_bytes;
	kill(victim, SIGKILL);
	EXPECT_EQ(reap(victim), 128 + SIGKILL);
	/* No direct copy into the dead process's pages, which this process
	 * still maps, even before our engine sees its sockets close. */
	t0 = now_ms();
	REQUIRE(post_send1(a.qp, IBV_WR_RDMA_WRITE, a.buf, 64, a.mr->lkey, pa.addr,
			   pa.rkey, 9) == 0);
	REQUIRE(wait_wc(a.f.cq, &wc, 10000) == 1);
	dt = now_ms() - t0;
	EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
	/* to_rts uses timeout 14 (67 ms) and retry_cnt 7: 8 x 67 = 537 ms */
	EXPECT_TRUE(dt >= 400 && dt < 3000);
	EXPECT_EQ(ursa_qp_stats(a.qp, &st), 0);
	EXPECT_EQ(st.direct_bytes, direct);
	/* the other QP still works */
	EXPECT_EQ(one_op(&b, IBV_WR_RDMA_WRITE, 0, 64, pb.addr, pb.rkey, IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sb, CMD_SUM, 0, 64, 0), sum(b.buf, 64));
	/* the dead process's QP socket is gone with it */
	snprintf(name, sizeof(name), "@ursa/qp/%06x", pa.qpn);
	f = fopen("/proc/net/unix", "r");
	while (f && fgets(line, sizeof(line), f))
		found |= strstr(line, name) != NULL;
	if (f)
		fclose(f);
	EXPECT_TRUE(!found);
	cmd(sb, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(other), 0);
	end_close(&a);
	end_close(&b);
	return TEST_RESULT();
}

/* The next SEND's slot is prefetched from a hint that the last SEND left
 * (shm.c). After the peer dies and the QP is reset and connected to
 * another process, that hint names the old channel's memory, which the
 * engine unmaps: the next post must still work (a prefetch never faults;
 * a build that loads from the hint instead dies here). */
static int test_stale_send_hint(void)
{
	struct target_arg ta = { IBV_QPT_RC, 1 << 20, 0 };
	struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
	struct end a;
	struct xinfo pa, pb;
	int sa, sb;
	pid_t victim, other;

	REQUIRE(end_open(&a, IBV_QPT_RC, 1 << 20, false) == 0);
	victim = start_target(&ta, &a, &sa, &pa);
	REQUIRE(victim > 0);
	EXPECT_EQ(cmd(sa, CMD_RECV, 0, 64, 0), 0);
	EXPECT_EQ(one_op(&a, IBV_WR_SEND, 0, 8, 0, 0, IBV_WC_SUCCESS), 0);
	kill(victim, SIGKILL);
	EXPECT_EQ(reap(victim), 128 + SIGKILL);
	close(sa);
	REQUIRE(ibv_modify_qp(a.qp, &reset, IBV_QP_STATE) == 0);
	usleep(200000);	/* the engine reaps the closed channel */
	other = start_target(&ta, &a, &sb, &pb);
	REQUIRE(other > 0);
	for (int i = 0; i < 3; i++) {
		EXPECT_EQ(cmd(sb, CMD_RECV, 0, 64, 0), 0);
		EXPECT_EQ(one_op(&a, IBV_WR_SEND, 0, 8, 0, 0, IBV_WC_SUCCESS), 0);
	}
	cmd(sb, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(other), 0);
	end_close(&a);
	return TEST_RESULT();
}

/* A UD end here and a UD target process, with wr ready to SEND len bytes
 * of me->buf (through s) to the target's QP. Returns the target's pid or
 * -1. */
static pid_t ud_target(struct end *me, int *sock, struct ibv_ah **ah,
		       struct ibv_send_wr *wr, struct ibv_sge *s, uint32_t len)
{
	struct target_arg ta = { IBV_QPT_UD, 1 << 20, 0 };
	struct ibv_ah_attr av;
	struct xinfo peer;
	pid_t pid;

	if (end_open(me, IBV_QPT_UD, 1 << 20, false))
		return -1;
	pid = start_target(&ta, me, sock, &peer);
	if (pid < 0)
		return -1;
	fill_av(me->f.ctx, &av);
	*ah = ibv_create_ah(me->f.pd, &av);
	if (!*ah)
		return -1;
	*s = (struct ibv_sge){ (uintptr_t)me->buf, len, me->mr->lkey };
	memset(wr, 0, sizeof(*wr));
	wr->sg_list = s;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_SEND;
	wr->wr.ud.ah = *ah;
	wr->wr.ud.remote_qpn = peer.qpn;
	wr->wr.ud.remote_qkey = 0x11111111;
	return pid;
}

static int test_ud_uc_across_processes(void)
{
	struct target_arg tc = { IBV_QPT_UC, 1 << 20, 0 };
	struct end me;
	struct xinfo peer;
	int sock;
	pid_t pid;
	struct ibv_ah *ah;
	struct ibv_sge s;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	pid = ud_target(&me, &sock, &ah, &wr, &s, 512);
	REQUIRE(pid > 0);
	EXPECT_EQ(cmd(sock, CMD_RECV, 0, 40 + 512, 0), 0);
	memset(me.buf, 'u', 512);
	wr.send_flags = IBV_SEND_SIGNALED;
	REQUIRE(ibv_post_send(me.qp, &wr, &bad) == 0);
	REQUIRE(wait_wc(me.f.cq, &wc, 5000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(cmd(sock, CMD_POLL, 0, 0, 0), (uint64_t)(40 + 512));
	EXPECT_EQ(cmd(sock, CMD_SUM, 40, 512, 0), sum(me.buf, 512));
	/* to a QPN that does not exist: UD never knows */
	wr.wr.ud.remote_qpn ^= 0x800000;
	REQUIRE(ibv_post_send(me.qp, &wr, &bad) == 0);
	REQUIRE(wait_wc(me.f.cq, &wc, 5000) == 1);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	ibv_destroy_ah(ah);
	end_close(&me);

	REQUIRE(end_open(&me, IBV_QPT_UC, 1 << 20, false) == 0);
	pid = start_target(&tc, &me, &sock, &peer);
	REQUIRE(pid > 0);
	memset(me.buf, 'c', 100000);
	EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 0, 100000, peer.addr, peer.rkey,
			 IBV_WC_SUCCESS), 0);
	EXPECT_EQ(cmd(sock, CMD_SUM, 0, 100000, 0), sum(me.buf, 100000));
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	end_close(&me);
	return TEST_RESULT();
}

/* UD sends posted right before ibv_destroy_qp still arrive, as from a NIC
 * that put them on the wire at the post (libfabric's rxd sends its last
 * ACKs and closes; its peer waited for them forever). */
static int test_ud_posted_then_destroyed(void)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_ah *ah;
	struct ibv_sge s;
	struct end me;
	int sock, n = 32;
	pid_t pid;

	pid = ud_target(&me, &sock, &ah, &wr, &s, 256);
	REQUIRE(pid > 0);
	for (int i = 0; i < n; i++)
		REQUIRE(cmd(sock, CMD_RECV, (uint64_t)i * 1024, 40 + 256, 0) == 0);
	memset(me.buf, 'd', 256);
	for (int i = 0; i < n; i++) {
		wr.send_flags = i == n - 1 ? IBV_SEND_SIGNALED : 0;
		REQUIRE(ibv_post_send(me.qp, &wr, &bad) == 0);
	}
	/* no poll: the QP goes at once */
	EXPECT_EQ(ibv_destroy_qp(me.qp), 0);
	me.qp = NULL;
	int got = 0;

	while (got < n && cmd(sock, CMD_POLL, 0, 0, 0) == (uint64_t)(40 + 256))
		got++;
	EXPECT_EQ(got, n);
	cmd(sock, CMD_QUIT, 0, 0, 0);
	EXPECT_EQ(reap(pid), 0);
	ibv_destroy_ah(ah);
	end_close(&me);
	return TEST_RESULT();
}

static int test_qpn_unique_across_processes(void)
{
	struct fx f;
	struct ibv_qp *qps[300];
	int p[2];
	pid_t pid;
	uint32_t mine[300], theirs[300];

	REQUIRE(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		struct fx cf;
		struct ibv_qp *cq[300];
		uint32_t n[300];

		if (fx_open(&cf, 4))
			_exit(1);
		for (int i = 0; i < 300; i++) {
			cq[i] = make_qp(&cf, IBV_QPT_UD, NULL, NULL, NULL);
			if (!cq[i])
				_exit(2);
			n[i] = cq[i]->qp_num;
		}
		if (write(p[1], n, sizeof(n)) != (ssize_t)sizeof(n))
			_exit(3);
		sleep(1); /* keep them alive while the parent compares */
		_exit(0);
	}
	close(p[1]);
	REQUIRE(fx_open(&f, 4) == 0);
	for (int i = 0; i < 300; i++) {
		qps[i] = make_qp(&f, IBV_QPT_UD, NULL, NULL, NULL);
		REQUIRE(qps[i]);
		mine[i] = qps[i]->qp_num;
	}
	REQUIRE(read(p[0], theirs, sizeof(theirs)) == (ssize_t)sizeof(theirs));
	for (int i = 0; i < 300; i++)
		for (int j = 0; j < 300; j++)
			if (mine[i] == theirs[j])
				harness_fail(__FILE__, __LINE__, "unique", "QPN %06x twice", mine[i]);
	EXPECT_EQ(reap(pid), 0);
	for (int i = 0; i < 300; i++)
		ibv_destroy_qp(qps[i]);
	fx_close(&f);
	return TEST_RESULT();
}

/* fork(): the child opens the device anew and works; the parent's
 * resources stay usable in the parent; the child's copy of the parent's
 * registered private memory is its own. */
static int test_fork(void)
{
	struct end me;
	struct ibv_qp *loopq;
	int p[2], opened;
	pid_t pid;
	struct xinfo x;

	setenv("PROCS_PRIVATE", "1", 1);
	opened = end_open(&me, IBV_QPT_RC, 1 << 20, false);
	unsetenv("PROCS_PRIVATE");
	REQUIRE(opened == 0);
	loopq = make_qp(&me.f, IBV_QPT_RC, NULL, NULL, NULL);
	REQUIRE(loopq);
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, p) == 0);
	pid = fork();
	if (pid == 0) {
		struct end c;
		struct xinfo parent, mine;

		close(p[0]);
		if (end_open(&c, IBV_QPT_RC, 1 << 20, false))
			_exit(50);
		info_of(&c, &mine);
		if (xrecv(p[1], &parent) || xsend(p[1], &mine) ||
		    to_rts(c.qp, parent.qpn, ALL_REMOTE))
			_exit(51);
		memset(c.buf, 'k', 4096);
		{
			int r = one_op(&c, IBV_WR_RDMA_WRITE, 0, 4096, parent.addr,
				       parent.rkey, IBV_WC_SUCCESS);

			if (r) {
				fprintf(stderr, "    child: WRITE to the parent: %s\n",
					r == -1 ? "post failed" : r == -2 ?
					"no completion in 10 s" : "bad status");
				_exit(52);
			}
		}
		end_close(&c);
		/* its copy of the parent's registered buffer is its own:
		 * this must not show in the parent */
		memset(me.buf + 65536, 'c', 4096);
		_exit(0);
	}
	close(p[1]);
	info_of(&me, &x);
	REQUIRE(xsend(p[0], &x) == 0 && xrecv(p[0], &x) == 0);
	REQUIRE(to_rts(me.qp, x.qpn, ALL_REMOTE) == 0);
	EXPECT_EQ(reap(pid), 0);
	EXPECT_EQ(me.buf[0], 'k');
	EXPECT_EQ(me.buf[4095], 'k');
	EXPECT_EQ(me.buf[65536], 0);
	/* the parent's own resources still work: loopback between its QPs */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };

		REQUIRE(ibv_modify_qp(me.qp, &a, IBV_QP_STATE) == 0);
		REQUIRE(connect_pair(me.qp, loopq, ALL_REMOTE) == 0);
		memset(me.buf + 8192, 'p', 100);
		EXPECT_EQ(one_op(&me, IBV_WR_RDMA_WRITE, 8192, 100,
				 (uintptr_t)me.buf + 16384, me.mr->rkey,
				 IBV_WC_SUCCESS), 0);
		EXPECT_EQ(me.buf[16384 + 99], 'p');
	}
	ibv_destroy_qp(loopq);
	end_close(&me);
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(rc_write_read_send, "RC WRITE/READ/SEND between processes"),
	TEST_ENTRY(no_cma_seccomp_fallback, "seccomp denies CMA: shared-memory fallback"),
	TEST_ENTRY(no_cma_env_fallback, "URSA_CMA=0: shared-memory path"),
	TEST_ENTRY(no_direct_env, "URSA_DIRECT=0: the target's engine copies"),
	TEST_ENTRY(requester_seccomp, "CMA refused to the requester mid-way: mapped MRs need none"),
	TEST_ENTRY(no_map_env, "URSA_MAP=0: direct by cross-memory attach"),
	TEST_ENTRY(no_cma_no_map, "URSA_CMA=0 URSA_MAP=0: shared-memory slots"),
	TEST_ENTRY(requester_seccomp_no_map, "URSA_MAP=0, CMA refused mid-way: it falls back"),
	TEST_ENTRY(requester_no_open, "the target's memfds cannot be opened, nor CMA used: the target's engine"),
	TEST_ENTRY(direct_follows_rereg, "a rereg'd MR's new rights reach the direct path"),
	TEST_ENTRY(dmap_pruned, "a requester drops its mapping of an MR the target deregistered"),
	TEST_ENTRY(partial_pages, "partial first and last pages: mapped inside, CMA at the edges"),
	TEST_ENTRY(unmapped_slots, "target unmaps registered memory: its engine refuses, lives"),
	TEST_ENTRY(unmapped_cma, "target unmaps registered memory, maps anew: never reached"),
	TEST_ENTRY(reg_leaves_pages, "registration leaves pages in place; ursa_mem_alloc memory is shared"),
	TEST_ENTRY(rcache_never_stale, "the registration cache follows memory mapped anew; gone memory is refused"),
	TEST_ENTRY(reg_hammer, "writes by threads and the kernel during reg/rereg/dereg: none lost"),
	TEST_ENTRY(dereg_during_writes, "no direct WRITE lands after ibv_dereg_mr returns"),
	TEST_ENTRY(target_checks, "the target's checks hold for other processes"),
	TEST_ENTRY(atomics_three_processes, "two processes add to a third's counter"),
	TEST_ENTRY(last_byte_last_processes, "spinning target never sees a torn WRITE"),
	TEST_ENTRY(channel_wakeup_across_processes, "ibv_get_cq_event wakes for SEND and WRITE_IMM"),
	TEST_ENTRY(skipped_doorbell_bounded, "a SEND right after the target stops polling: its event comes"),
	TEST_ENTRY(peer_death, "SIGKILLed peer: RETRY_EXC_ERR, others unaffected"),
	TEST_ENTRY(stale_send_hint, "a SEND after the peer died and the QP was reconnected (stale prefetch hint)"),
	TEST_ENTRY(ud_uc_across_processes, "UD and UC between processes"),
	TEST_ENTRY(ud_posted_then_destroyed, "UD sends posted right before destroy_qp arrive"),
	TEST_ENTRY(qpn_unique_across_processes, "QPNs unique on the host"),
	TEST_ENTRY(atomics_mapped_and_engine, "atomics in a mapped MR and through the target's engine, one counter"),
	TEST_ENTRY(fork, "fork: child opens anew, parent keeps working"),
	TEST_ENTRY(post_shortcut, "inline, unsignaled, and a WR list on the post shortcut"),
	TEST_ENTRY(post_two_threads, "two threads post on one QP: shortcut and ring at once"),
};

/* Helper processes: func_procs --child ROLE FD [ARGS] */
static int child_main(int argc, char **argv)
{
	int sock = atoi(argv[3]);

	if (!strcmp(argv[2], "target") && argc >= 7) {
		struct target_arg a = { (enum ibv_qp_type)atoi(argv[4]),
					(size_t)strtoull(argv[5], NULL, 0),
					atoi(argv[6]) };

		return target_main(sock, &a);
	}
	if (!strcmp(argv[2], "adder") && argc >= 5) {
		struct adder_arg a = { .iters = atoi(argv[4]),
				       .mapped = argc >= 6 ? atoi(argv[5]) : -1 };

		return adder_main(sock, &a);
	}
	if (!strcmp(argv[2], "spinner"))
		return spinner_main(sock, NULL);
	if (!strcmp(argv[2], "waiter"))
		return waiter_main(sock, NULL);
	if (!strcmp(argv[2], "poll_waiter"))
		return waiter_main(sock, argv[2]);
	if (!strcmp(argv[2], "poll_sender"))
		return poll_sender_main(sock, NULL);
	return 99;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "--child"))
		return child_main(argc, argv);
	return harness_main(tests, (int)(sizeof(tests) / sizeof(tests[0])), argc, argv);
}
