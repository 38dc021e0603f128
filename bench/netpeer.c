// SPDX-License-Identifier: MIT
/*
 * netpeer.c - the physical limits of a network path, for bench/hosts.sh:
 * a raw UDP ping-pong (one-way latency = half the round trip) and a TCP
 * stream (bandwidth), measured over the same path ursa's RoCEv2 uses.
 *
 *   netpeer udp-server PORT          echo datagrams back
 *   netpeer udp-client IP PORT N SIZE    -> "udp_oneway_us median p99"
 *   netpeer tcp-server PORT          swallow a stream
 *   netpeer tcp-client IP PORT MIB       -> "tcp_MBps value"
 *   netpeer tcp-accept-server PORT   accept, read to EOF (for the next)
 *   netpeer tcp-connect-client IP PORT N -> "tcp_connect_us median p99
 *                                    per_s rate" (connect, close; N times)
 *   netpeer cputime CMD [ARGS]       run CMD; its CPU time (user + system,
 *                                    children included) on stderr as
 *                                    "cpu_s value"; exits as CMD did
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	static char buf[1 << 20];
	int s, one = 1;

	if (argc >= 3 && !strcmp(argv[1], "cputime")) {
		struct rusage ru;
		int status;
		pid_t pid = fork();

		if (pid == 0) {
			execvp(argv[2], argv + 2);
			_exit(127);
		}
		if (pid < 0 || wait4(pid, &status, 0, &ru) != pid)
			return 1;
		fprintf(stderr, "cpu_s %.3f\n", (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
			(double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	if (argc < 3)
		return 2;
	sa.sin_port = htons((uint16_t)atoi(argv[argc >= 4 && strstr(argv[1], "client") ? 3 : 2]));
	if (!strcmp(argv[1], "udp-server")) {
		s = socket(AF_INET, SOCK_DGRAM, 0);
		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)))
			return 1;
		for (;;) {
			struct sockaddr_in from;
			socklen_t fl = sizeof(from);
			ssize_t n = recvfrom(s, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fl);

			if (n > 0)
				sendto(s, buf, (size_t)n, 0, (struct sockaddr *)&from, fl);
		}
	}
	if (!strcmp(argv[1], "udp-client") && argc >= 6) {
		int n = atoi(argv[4]);
		size_t size = (size_t)atoi(argv[5]);
		double *v = calloc((size_t)n, sizeof(double));

		inet_pton(AF_INET, argv[2], &sa.sin_addr);
		s = socket(AF_INET, SOCK_DGRAM, 0);
		connect(s, (struct sockaddr *)&sa, sizeof(sa));
		for (int i = -n / 10; i < n; i++) {
			double t0 = now_us();

			send(s, buf, size, 0);
			if (recv(s, buf, sizeof(buf), 0) <= 0)
				return 1;
			if (i >= 0)
				v[i] = (now_us() - t0) / 2;
		}
		qsort(v, (size_t)n, sizeof(double), cmp);
		printf("udp_oneway_us %.2f %.2f\n", v[n / 2], v[(int)(n * 0.99)]);
		return 0;
	}
	if (!strcmp(argv[1], "tcp-server")) {
		int c;

		s = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 1))
			return 1;
		c = accept(s, NULL, NULL);
		while (read(c, buf, sizeof(buf)) > 0)
			;
		write(c, "k", 1);
		return 0;
	}
	if (!strcmp(argv[1], "tcp-client") && argc >= 5) {
		size_t total = (size_t)atoi(argv[4]) << 20, sent = 0;
		double t0;

		inet_pton(AF_INET, argv[2], &sa.sin_addr);
		s = socket(AF_INET, SOCK_STREAM, 0);
		for (int i = 0; connect(s, (struct sockaddr *)&sa, sizeof(sa)); i++) {
			if (i > 50)
				return 1;
			usleep(50000);
			close(s);
			s = socket(AF_INET, SOCK_STREAM, 0);
		}
		t0 = now_us();
		while (sent < total) {
			ssize_t n = write(s, buf, sizeof(buf));

			if (n <= 0)
				return 1;
			sent += (size_t)n;
		}
		shutdown(s, SHUT_WR);
		read(s, buf, 1);
		printf("tcp_MBps %.1f\n", total / (now_us() - t0));
		return 0;
	}
	if (!strcmp(argv[1], "tcp-accept-server")) {
		/* accepts, reads to EOF, closes: the peer of tcp-connect */
		s = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 1024))
			return 1;
		for (;;) {
			int c = accept(s, NULL, NULL);

			while (c >= 0 && read(c, buf, sizeof(buf)) > 0)
				;
			if (c >= 0)
				close(c);
		}
	}
	if (!strcmp(argv[1], "tcp-connect-client") && argc >= 5) {
		/* N connections one after another: connect (the SYN/SYN-ACK,
		 * as cmtime's connect step is REQ/REP/RTU) and close */
		int n = atoi(argv[4]);
		double *v = calloc((size_t)n, sizeof(double)), t0, all;

		inet_pton(AF_INET, argv[2], &sa.sin_addr);
		all = now_us();
		for (int i = 0; i < n; i++) {
			s = socket(AF_INET, SOCK_STREAM, 0);
			t0 = now_us();
			if (connect(s, (struct sockaddr *)&sa, sizeof(sa)))
				return 1;
			v[i] = now_us() - t0;
			close(s);
		}
		all = now_us() - all;
		qsort(v, (size_t)n, sizeof(double), cmp);
		printf("tcp_connect_us %.1f %.1f per_s %.0f\n", v[n / 2],
		       v[(int)(n * 0.99)], n / all * 1e6);
		return 0;
	}
	return 2;
}
