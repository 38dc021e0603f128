// SPDX-License-Identifier: MIT
/*
 * shm_attack.c - an attacker of ursa's same-host transport, for
 * tests/scripts/isolation.sh. It speaks the channel handshake
 * (src/transport/shm.h) on its own, without ursa's library, as a process of
 * another user (or the same) that knows no key would:
 *
 *   shm_attack list                 the QPNs whose sockets this host shows
 *   shm_attack forge QPN SRC        hello to QPN claiming to be QP SRC (not
 *                                   ours): must be refused
 *   shm_attack own QPN              hello from a QPN we own: may be welcomed,
 *                                   but must not hand us the MR table, nor a
 *                                   control page we can write or resize
 *   shm_attack unsealed QPN         hello with a channel memfd we could
 *                                   truncate: must be refused
 *   shm_attack hold QPN N           open N connections and hold them
 *                                   (prints how many the target accepted)
 *   shm_attack squat PID N          bind the RoCEv2 forwarding names of
 *                                   processes PID..PID+N-1 ("@ursa/udp/<pid>")
 *                                   before they exist, and wait
 *
 * Prints "ok ..." or "FAIL ..." lines; exits 1 on a FAIL, 2 on bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../src/transport/shm.h"

#define CHAN_BYTES (1u << 20)	/* larger than the rings: accepted */

static int failures;

static void ok(const char *what)
{
	printf("ok   %s\n", what);
}

static void bad(const char *what, const char *why)
{
	printf("FAIL %s: %s\n", what, why);
	failures++;
}

static socklen_t qp_name(struct sockaddr_un *sa, uint32_t qpn)
{
	int n;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "ursa/qp/%06x",
		     qpn & 0xffffff);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int connect_qp(uint32_t qpn)
{
	struct sockaddr_un sa;
	socklen_t len = qp_name(&sa, qpn);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (s < 0 || connect(s, (struct sockaddr *)&sa, len)) {
		if (s >= 0)
			close(s);
		return -1;
	}
	return s;
}

/* A listening socket on a QPN name of our own: what makes us its owner. */
static int listen_own(uint32_t *qpn)
{
	for (int i = 0; i < 64; i++) {
		struct sockaddr_un sa;
		socklen_t len;
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

		*qpn = 0xa00000u + (uint32_t)(getpid() & 0xffff) * 16 + (uint32_t)i;
		len = qp_name(&sa, *qpn);
		if (s >= 0 && !bind(s, (struct sockaddr *)&sa, len) && !listen(s, 4))
			return s;
		if (s >= 0)
			close(s);
	}
	return -1;
}

static int chan_memfd(bool sealed)
{
	int fd = memfd_create("attack-chan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint32_t *p;

	if (fd < 0 || ftruncate(fd, CHAN_BYTES))
		return -1;
	p = mmap(NULL, CHAN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -1;
	p[0] = URSA_SHM_MAGIC;
	p[1] = URSA_SHM_VERSION;
	munmap(p, CHAN_BYTES);
	if (sealed)
		fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	return fd;
}

static int send_hello(int s, uint32_t src, uint32_t dst, uint32_t type, bool sealed)
{
	struct ursa_shm_hello h = { URSA_SHM_MAGIC, URSA_SHM_VERSION, src, dst,
				    type, 0, 0, 0 };
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct iovec iov = { &h, sizeof(h) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	int fds[3], ctl = -1;
	void *p;
	ssize_t n;

	/* our "control page", sealed as a real engine's */
	ctl = memfd_create("attack-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ctl < 0 || ftruncate(ctl, 4096))
		return -1;
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ctl, 0);
	if (p != MAP_FAILED)
		fcntl(ctl, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE);
	fds[0] = chan_memfd(sealed);
	fds[1] = ctl;
	fds[2] = eventfd(0, EFD_CLOEXEC);
	memset(cbuf, 0, sizeof(cbuf));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(3 * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, sizeof(fds));
	n = sendmsg(s, &mh, MSG_NOSIGNAL);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	return n == (ssize_t)sizeof(h) ? 0 : -1;
}

/* The welcome and its descriptors; 0 if the target closed instead. */
static ssize_t recv_welcome(int s, struct ursa_shm_welcome *wl, int *fds, int *nfds)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = { wl, sizeof(*wl) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct pollfd pf = { s, POLLIN, 0 };
	ssize_t n;

	*nfds = 0;
	if (poll(&pf, 1, 5000) != 1)
		return -1;
	n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n > 0 && cm;
	     cm = CMSG_NXTHDR(&mh, cm)) {
		int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

		for (int i = 0; i < cnt && *nfds < 4; i++)
			fds[(*nfds)++] = ((int *)CMSG_DATA(cm))[i];
	}
	return n;
}

/* Is this descriptor writable or resizable by us? */
static bool can_change(int fd, size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	char b = 0;

	if (p != MAP_FAILED) {
		munmap(p, size);
		return true;
	}
	return ftruncate(fd, 0) == 0 || ftruncate(fd, (off_t)size * 2) == 0 ||
	       pwrite(fd, &b, 1, 0) == 1;
}

static int cmd_list(void)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];

	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "@ursa/qp/");
		unsigned int q;

		if (p && sscanf(p + 9, "%6x", &q) == 1 && strstr(line, " 00010000 "))
			printf("%06x\n", q);	/* listening sockets only */
	}
	fclose(f);
	return 0;
}

static void attack_forge(uint32_t qpn, uint32_t src)
{
	struct ursa_shm_welcome wl;
	int fds[4], nfds;
	bool welcomed = false, reached = false;
	char what[96];

	snprintf(what, sizeof(what), "hello to qp %06x forging source qp %06x", qpn, src);
	/* every QP type in turn: the forgery must fail with the right one */
	for (int type = 2; type <= 4; type++) {	/* RC, UC, UD */
		int s = connect_qp(qpn);
		ssize_t n;

		if (s < 0)
			continue;
		reached = true;
		if (!send_hello(s, src, qpn, (uint32_t)type, true)) {
			n = recv_welcome(s, &wl, fds, &nfds);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			welcomed |= n == (ssize_t)sizeof(wl) && wl.status == 0;
		}
		close(s);
	}
	if (!reached)
		bad(what, "cannot connect");
	else if (welcomed)
		bad(what, "welcomed");
	else
		ok(what);
}

static void attack_own(uint32_t qpn)
{
	struct ursa_shm_welcome wl;
	uint32_t mine;
	int l = listen_own(&mine), s = connect_qp(qpn), fds[4], nfds;
	char what[96];
	ssize_t n;

	snprintf(what, sizeof(what), "hello to qp %06x from our own qp %06x", qpn, mine);
	if (l < 0 || s < 0) {
		bad(what, "no socket");
		return;
	}
	for (int type = 2; type <= 4; type++) {	/* RC, UC, UD */
		if (type > 2) {
			close(s);
			s = connect_qp(qpn);
		}
		if (s < 0 || send_hello(s, mine, qpn, (uint32_t)type, true))
			continue;
		n = recv_welcome(s, &wl, fds, &nfds);
		if (n != (ssize_t)sizeof(wl) || wl.status) {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			continue;
		}
		/* Welcomed (the QP's type): what did it hand us? */
		if (nfds > 2)
			bad(what, "the target's MR table came with the welcome");
		else if (nfds < 1 || can_change(fds[0], 4096))
			bad(what, "the control page is writable or resizable");
		else
			ok(what);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		close(s);
		close(l);
		return;
	}
	printf("ok   %s: refused for every QP type\n", what);
	close(s);
	close(l);
}

static void attack_unsealed(uint32_t qpn)
{
	struct ursa_shm_welcome wl;
	uint32_t mine;
	int l = listen_own(&mine), fds[4], nfds;
	char what[96];
	bool welcomed = false;

	snprintf(what, sizeof(what), "hello to qp %06x with a channel we can truncate", qpn);
	for (int type = 2; type <= 4; type++) {
		int s = connect_qp(qpn);
		ssize_t n;

		if (s < 0 || send_hello(s, mine, qpn, (uint32_t)type, false)) {
			if (s >= 0)
				close(s);
			continue;
		}
		n = recv_welcome(s, &wl, fds, &nfds);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		welcomed |= n == (ssize_t)sizeof(wl) && wl.status == 0;
		close(s);
	}
	if (welcomed)
		bad(what, "welcomed");
	else
		ok(what);
	if (l >= 0)
		close(l);
}

static void attack_hold(uint32_t qpn, int n)
{
	int held = 0;

	for (int i = 0; i < n; i++) {
		int s = connect_qp(qpn);

		if (s < 0)
			break;
		held++;
	}
	printf("held %d\n", held);
	fflush(stdout);
	pause();
}

static void attack_squat(int first, int n)
{
	int held = 0;

	for (int p = first; p < first + n; p++) {
		struct sockaddr_un sa;
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), k;

		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		k = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "ursa/udp/%d", p);
		if (s >= 0 && !bind(s, (struct sockaddr *)&sa,
				    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
						(size_t)k)) && !listen(s, 64))
			held++;
	}
	printf("squatting %d names\n", held);
	fflush(stdout);
	pause();
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "list"))
		return cmd_list();
	if (argc < 3)
		goto usage;
	uint32_t qpn = (uint32_t)strtoul(argv[2], NULL, 16);

	if (!strcmp(argv[1], "forge") && argc == 4)
		attack_forge(qpn, (uint32_t)strtoul(argv[3], NULL, 16));
	else if (!strcmp(argv[1], "own") && argc == 3)
		attack_own(qpn);
	else if (!strcmp(argv[1], "unsealed") && argc == 3)
		attack_unsealed(qpn);
	else if (!strcmp(argv[1], "hold") && argc == 4)
		attack_hold(qpn, atoi(argv[3]));
	else if (!strcmp(argv[1], "squat") && argc == 4)
		attack_squat(atoi(argv[2]), atoi(argv[3]));
	else
		goto usage;
	return failures ? 1 : 0;
usage:
	fprintf(stderr, "usage: shm_attack list | forge QPN SRC | own QPN | unsealed QPN | hold QPN N | squat PID N\n");
	return 2;
}
