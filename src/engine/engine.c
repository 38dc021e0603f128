// SPDX-License-Identifier: MIT
/*
 * engine.c - one progress thread per context.
 *
 * The thread runs the send queues of the context's QPs. When it finds no
 * work it spins for URSA_SPIN_US microseconds (default 20: a reply that
 * arrives within a round trip is picked up without a wake-up), then sleeps
 * in ppoll() on its doorbell eventfd, with a timeout for the earliest RNR or
 * ACK-timeout retry. The machines this runs on may have two cores: a thread
 * that spun forever would starve the application.
 *
 * Doorbell protocol (Dekker-style, both sides use seq_cst):
 *   poster:  publish WQE (release) ; fence ; if (sleeping) write(efd)
 *   engine:  sleeping = 1 ; fence ; recheck queues ; ppoll(efd)
 * Either the engine's recheck sees the new WQE, or the poster sees
 * sleeping == 1 and writes the eventfd: a WQE is never left unnoticed, and
 * a poster makes a system call only when the engine actually sleeps.
 */
#include "engine.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static bool any_pending(struct ursa_ctx *ctx, uint64_t now)
{
	bool p = false;

	pthread_mutex_lock(&ctx->qp_lock);
	for (struct ursa_qp *qp = ctx->qps; qp && !p; qp = qp->next)
		p = ursa_req_pending(qp, now);
	pthread_mutex_unlock(&ctx->qp_lock);
	return p;
}

static void *engine_main(void *arg)
{
	struct ursa_engine *e = arg;
	struct ursa_ctx *ctx = e->ctx;
	uint64_t idle_since = 0;

	while (!atomic_load_explicit(&e->stop, memory_order_acquire)) {
		uint64_t now = ursa_now_ns(), deadline = UINT64_MAX;
		int work = 0;

		pthread_mutex_lock(&ctx->qp_lock);
		for (struct ursa_qp *qp = ctx->qps; qp; qp = qp->next)
			work += ursa_req_process(qp, now, &deadline);
		pthread_mutex_unlock(&ctx->qp_lock);
		if (work) {
			idle_since = 0;
			continue;
		}
		if (!idle_since)
			idle_since = now;
		if (now - idle_since < e->spin_ns && deadline > now) {
			ursa_cpu_relax();
			continue;
		}
		atomic_store(&e->sleeping, 1);
		atomic_thread_fence(memory_order_seq_cst);
		if (!any_pending(ctx, ursa_now_ns()) &&
		    !atomic_load(&e->stop)) {
			struct pollfd pfd = { .fd = e->efd, .events = POLLIN };
			struct timespec ts, *tsp = NULL;

			now = ursa_now_ns();
			if (deadline != UINT64_MAX) {
				uint64_t d = deadline > now ? deadline - now : 0;

				ts.tv_sec = (time_t)(d / 1000000000ull);
				ts.tv_nsec = (long)(d % 1000000000ull);
				tsp = &ts;
			}
			if (ppoll(&pfd, 1, tsp, NULL) > 0) {
				uint64_t v;

				if (read(e->efd, &v, sizeof(v)) < 0 &&
				    errno != EAGAIN)
					ursa_err("engine doorbell read: %s",
						 strerror(errno));
			}
			atomic_fetch_add(&e->wakeups, 1);
		}
		atomic_store(&e->sleeping, 0);
		idle_since = 0;
	}
	return NULL;
}

void ursa_engine_kick(struct ursa_engine *e)
{
	uint64_t one = 1;

	/* Pairs with the engine's fence between "sleeping = 1" and its
	 * recheck: our WQE store is ordered before this load. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&e->sleeping, memory_order_relaxed)) {
		atomic_fetch_add_explicit(&e->doorbells, 1,
					  memory_order_relaxed);
		if (write(e->efd, &one, sizeof(one)) < 0)
			ursa_err("doorbell: %s", strerror(errno));
	}
}

int ursa_engine_start(struct ursa_ctx *ctx)
{
	struct ursa_engine *e = calloc(1, sizeof(*e));
	int ret;

	if (!e)
		return -ENOMEM;
	e->ctx = ctx;
	e->spin_ns = (uint64_t)ursa_env_long("URSA_SPIN_US", 20, 0, 1000000) *
		     1000ull;
	e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (e->efd < 0) {
		ret = -errno;
		free(e);
		return ret;
	}
	ctx->eng = e;
	ret = pthread_create(&e->thr, NULL, engine_main, e);
	if (ret) {
		close(e->efd);
		free(e);
		ctx->eng = NULL;
		return -ret;
	}
	return 0;
}

void ursa_engine_stop(struct ursa_ctx *ctx)
{
	struct ursa_engine *e = ctx->eng;
	uint64_t one = 1;

	if (!e)
		return;
	atomic_store_explicit(&e->stop, 1, memory_order_release);
	if (write(e->efd, &one, sizeof(one)) < 0)
		ursa_err("engine stop: %s", strerror(errno));
	pthread_join(e->thr, NULL);
	close(e->efd);
	free(e);
	ctx->eng = NULL;
}
