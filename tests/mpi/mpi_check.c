// SPDX-License-Identifier: MIT
/*
 * mpi_check.c - an MPI program that checks what it moves: ping-pong,
 * bandwidth, one-sided MPI_Put and MPI_Get, and a collective. Built with
 * both Open MPI's and MPICH's mpicc; tests/scripts/frameworks.sh runs it over
 * ursa (UCX's rc_verbs and ud_verbs), bench/mpi.sh times it.
 *
 *   mpi_check [check|lat|bw] [SIZE] [ITERS]
 *
 * check (default): every rank pairs with rank ^ 1 (an even number of ranks)
 *   - ping-pong of 1 B .. 4 MiB, each message a pattern of (size, round,
 *     sender) checked byte for byte on arrival;
 *   - a window of 4 MiB per rank: every rank MPI_Puts a pattern into its
 *     partner's window and MPI_Gets its partner's own pattern back, under
 *     fences, and checks both;
 *   - MPI_Allreduce of 1 Mi doubles and MPI_Bcast of 1 MiB from each
 *     root, checked against the values each rank can compute itself.
 *   Prints "ok <what>" lines, or "FAIL <what>" and aborts with status 1.
 * lat SIZE ITERS: rank 0 and 1 ping-pong; prints "lat SIZE <us one way>".
 * bw SIZE ITERS: rank 0 sends ITERS messages in windows of 16 to rank 1;
 *   prints "bw SIZE <MB/s>" (10^6 bytes).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

static void fail(const char *what, long a, long b)
{
	fprintf(stderr, "FAIL rank %d: %s (%ld, %ld)\n", rank, what, a, b);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pat(size_t i, size_t size, int round, int from)
{
	return (unsigned char)(i * 131 + size * 7 + (size_t)round * 13 +
			       (size_t)from * 101 + 1);
}

static void fill(unsigned char *b, size_t n, int round, int from)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(i, n, round, from);
}

static void verify(const unsigned char *b, size_t n, int round, int from,
		   const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != pat(i, n, round, from))
			fail(what, (long)n, (long)i);
}

static void say(const char *what)
{
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("ok   %s (%d ranks)\n", what, nranks);
	fflush(stdout);
}

static void check_pingpong(void)
{
	const size_t max = 4 << 20;
	unsigned char *s = malloc(max), *r = malloc(max);
	int peer = rank ^ 1;

	if (!s || !r)
		fail("malloc", 0, 0);
	for (size_t n = 1; n <= max; n *= 4) {
		for (int round = 0; round < 3; round++) {
			memset(r, 0, n);
			if (rank & 1) {
				MPI_Recv(r, (int)n, MPI_BYTE, peer, round,
					 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				verify(r, n, round, peer, "ping payload");
				fill(s, n, round, rank);
				MPI_Send(s, (int)n, MPI_BYTE, peer, round,
					 MPI_COMM_WORLD);
			} else {
				fill(s, n, round, rank);
				MPI_Send(s, (int)n, MPI_BYTE, peer, round,
					 MPI_COMM_WORLD);
				MPI_Recv(r, (int)n, MPI_BYTE, peer, round,
					 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				verify(r, n, round, peer, "pong payload");
			}
		}
	}
	free(s);
	free(r);
	say("ping-pong 1 B .. 4 MiB, every byte checked");
}

static void check_rma(void)
{
	const size_t n = 4 << 20;
	unsigned char *win_mem, *mine = malloc(n), *got = malloc(n);
	int peer = rank ^ 1;
	MPI_Win win;

	if (!mine || !got)
		fail("malloc", 0, 0);
	MPI_Win_allocate((MPI_Aint)n, 1, MPI_INFO_NULL, MPI_COMM_WORLD,
			 &win_mem, &win);
	/* Put: my pattern into the partner's window. */
	memset(win_mem, 0, n);
	fill(mine, n, 50, rank);
	MPI_Win_fence(0, win);
	MPI_Put(mine, (int)n, MPI_BYTE, peer, 0, (int)n, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	verify(win_mem, n, 50, peer, "MPI_Put landed");
	/* Get: the partner rewrites its window with its own pattern. */
	fill(win_mem, n, 60, rank);
	memset(got, 0, n);
	MPI_Win_fence(0, win);
	MPI_Get(got, (int)n, MPI_BYTE, peer, 0, (int)n, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	verify(got, n, 60, peer, "MPI_Get brought back");
	MPI_Win_free(&win);
	free(mine);
	free(got);
	say("MPI_Put and MPI_Get of 4 MiB, checked");
}

static void check_collectives(void)
{
	const int nd = 1 << 20;
	const size_t nb = 1 << 20;
	double *in = malloc(nd * sizeof(double)), *out = malloc(nd * sizeof(double));
	unsigned char *b = malloc(nb);
	double want_base = 0;

	if (!in || !out || !b)
		fail("malloc", 0, 0);
	for (int i = 0; i < nd; i++)
		in[i] = (double)(rank + 1) * (i % 1000);
	MPI_Allreduce(in, out, nd, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	for (int r = 0; r < nranks; r++)
		want_base += r + 1;
	for (int i = 0; i < nd; i++)
		if (out[i] != want_base * (i % 1000))
			fail("MPI_Allreduce sum", i, (long)out[i]);
	for (int root = 0; root < nranks; root++) {
		if (rank == root)
			fill(b, nb, 70, root);
		else
			memset(b, 0, nb);
		MPI_Bcast(b, (int)nb, MPI_BYTE, root, MPI_COMM_WORLD);
		verify(b, nb, 70, root, "MPI_Bcast payload");
	}
	free(in);
	free(out);
	free(b);
	say("MPI_Allreduce of 1 Mi doubles and MPI_Bcast of 1 MiB from every root, checked");
}

static void lat(size_t n, int iters)
{
	unsigned char *b = calloc(1, n ? n : 1);
	double t0 = 0;

	for (int i = -iters / 10; i < iters; i++) {
		if (i == 0)
			t0 = MPI_Wtime();
		if (rank == 0) {
			MPI_Send(b, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(b, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD,
				 MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(b, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD,
				 MPI_STATUS_IGNORE);
			MPI_Send(b, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
		}
	}
	if (rank == 0)
		printf("lat %zu %.3f\n", n, (MPI_Wtime() - t0) * 1e6 / iters / 2);
	free(b);
}

static void bw(size_t n, int iters)
{
	enum { WIN = 16 };
	unsigned char *b = calloc(WIN, n);
	MPI_Request rq[WIN];
	MPI_Status st[WIN];
	double t0 = 0;
	char ack;

	for (int i = -2; i < iters / WIN; i++) {
		if (i == 0)
			t0 = MPI_Wtime();
		for (int w = 0; w < WIN; w++) {
			if (rank == 0)
				MPI_Isend(b + w * n, (int)n, MPI_BYTE, 1, w,
					  MPI_COMM_WORLD, &rq[w]);
			else if (rank == 1)
				MPI_Irecv(b + w * n, (int)n, MPI_BYTE, 0, w,
					  MPI_COMM_WORLD, &rq[w]);
		}
		if (rank <= 1)
			MPI_Waitall(WIN, rq, st);
		if (rank == 1)
			MPI_Send(&ack, 1, MPI_BYTE, 0, 99, MPI_COMM_WORLD);
		else if (rank == 0)
			MPI_Recv(&ack, 1, MPI_BYTE, 1, 99, MPI_COMM_WORLD,
				 MPI_STATUS_IGNORE);
	}
	if (rank == 0)
		printf("bw %zu %.1f\n", n, (double)n * (iters / WIN) * WIN /
					    (MPI_Wtime() - t0) / 1e6);
	free(b);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "check";

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (!strcmp(mode, "check")) {
		if (nranks % 2)
			fail("needs an even number of ranks", nranks, 0);
		check_pingpong();
		check_rma();
		check_collectives();
	} else if (nranks < 2) {
		fail("needs two ranks", nranks, 0);
	} else if (!strcmp(mode, "lat")) {
		lat(argc > 2 ? strtoul(argv[2], NULL, 0) : 8,
		    argc > 3 ? atoi(argv[3]) : 10000);
	} else if (!strcmp(mode, "bw")) {
		bw(argc > 2 ? strtoul(argv[2], NULL, 0) : 1 << 20,
		   argc > 3 ? atoi(argv[3]) : 1024);
	} else {
		fail("unknown mode", 0, 0);
	}
	MPI_Finalize();
	return 0;
}
