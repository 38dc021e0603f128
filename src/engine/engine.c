// SPDX-License-Identifier: MIT
/*
 * engine.c - one progress thread per context.
 *
 * The thread runs the responder side of channels other processes opened to
 * our QPs, then the send queues of our QPs. When it finds no work it spins
 * for URSA_SPIN_US microseconds (default 20: an answer that comes back
 * within a round trip is picked up without a wake-up), or longer while its
 * idle gaps are short (see spin_adapt), then sleeps in
 * epoll_wait on its doorbell eventfd and the transport's sockets, with a
 * timeout for the earliest RNR or ACK-timeout retry. The machines this runs
 * on may have two cores: a thread that spun forever would starve the
 * application.
 *
 * Doorbell protocol (Dekker-style, both sides use seq_cst):
 *   poster:  publish work (release) ; fence ; if (ctl->sleeping) write(efd)
 *   engine:  ctl->sleeping = 1 ; fence ; recheck all queues ; epoll_wait
 * Either the engine's recheck sees the new work, or the poster sees
 * sleeping == 1 and writes the eventfd: work is never left unnoticed, and a
 * poster makes a system call only when the engine actually sleeps. The
 * "sleeping" flag lives in a shared page (ctl) so that peers in other
 * processes follow the same protocol with their requests.
 */
#include "engine.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../transport/shm.h"
#include "../transport/udp.h"

/* An application thread that polls (ibv_poll_cq) holds the context's lock
 * most of the time, doing the engine's work itself. The engine then does not
 * queue for the lock: every wait would cost the application a futex wake on
 * its critical path, and the engine's pass would take the packets the
 * application is about to read. It takes the lock only if it is free, and
 * otherwise looks again after URSA_ENG_APP_POLL_NS. An application's pass in
 * progress counts too: one that sends a RoCEv2 window lasts longer than
 * URSA_ENG_APP_POLL_NS (each sendmmsg carries its packets through the whole
 * veth path), and a 1 MiB WRITE stream had the engine queue for the lock, and
 * the application wake it, 2000 times a second. */

static bool lock_unless_app(struct ursa_engine *e, uint64_t now)
{
	if (atomic_load_explicit(&e->app_in_pass, memory_order_relaxed) ||
	    now - atomic_load_explicit(&e->app_pass_ns, memory_order_relaxed) <
	    URSA_ENG_APP_POLL_NS)
		return ursa_mutex_trylock(&e->ctx->qp_lock);
	ursa_mutex_lock(&e->ctx->qp_lock);
	return true;
}

static bool any_pending(struct ursa_engine *e, uint64_t now,
			uint64_t *deadline)
{
	struct ursa_ctx *ctx = e->ctx;
	bool p;

	if (!lock_unless_app(e, now)) {
		/* (what the application's pass leaves, we see soon) */
		*deadline = MIN(*deadline,
				now + MAX(URSA_ENG_APP_POLL_NS, e->quiet_cur));
		return false;
	}
	p = ursa_shm_serve_pending(&e->shm);
	/* (a datagram waiting on the RoCEv2 socket wakes epoll_wait) */
	for (struct ursa_qp *qp = ctx->qps; qp && !p; qp = qp->next)
		p = ursa_req_pending(qp, now, deadline) ||
		    ursa_rc_acks(qp, &now, deadline, true) > 0;
	ursa_mutex_unlock(&ctx->qp_lock);
	return p;
}

/* Serve channels and run send queues; caller holds ctx->qp_lock. engine:
 * the engine's own thread (not an application's, see ursa_udp_poll). */
__thread struct ursa_ctx *ursa_pass_ctx;

static int pass(struct ursa_ctx *ctx, uint64_t *now, uint64_t *deadline,
		bool engine)
{
	int work = 0;

	ursa_pass_ctx = ctx;
	/* (The transports complete a QP's own requests before they deliver
	 * a peer's request that its answer preceded: ursa_shm_serve and
	 * rc_rx in engine/rc_recv.c; docs/design.md "Completion order".) */
	work += ursa_shm_serve(&ctx->eng->shm) + ursa_udp_poll();
	/* (an idle QP costs two loads: a poll of an empty CQ runs this) */
	for (struct ursa_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (ursa_ring_ready(&qp->sq))
			work += ursa_req_process_lazy(qp, now, deadline);
		if (atomic_load_explicit(&qp->rc_held, memory_order_relaxed))
			work += ursa_rc_acks(qp, now, deadline, engine);
	}
	ursa_pass_ctx = NULL;
	return work;
}

/* A timer set on an application's thread that is earlier than the sleeping
 * engine's wake-up time would be missed: wake it to re-arm. seq_cst pairs
 * with the engine storing sleep_until before its last check. Not while the
 * engine sleeps only because an application thread polls: that thread
 * runs the timers, and the engine looks again within its quiet time (a
 * 1 MiB WRITE stream rang 10 000 doorbells a second for its RTO). */
static void rearm(struct ursa_engine *e, uint64_t deadline)
{
	uint64_t one = 1;

	if (atomic_load_explicit(&e->quiet_sleep, memory_order_relaxed))
		return;
	if (deadline < atomic_load(&e->sleep_until) &&
	    write(e->efd, &one, sizeof(one)) < 0)
		ursa_err("doorbell: %s", strerror(errno));
}

static __thread unsigned int app_passes;

int ursa_engine_progress(struct ursa_ctx *ctx, bool polling)
{
	struct ursa_engine *e = ctx->eng;
	uint64_t deadline = UINT64_MAX, now;
	int work;

	if (!e || !ursa_mutex_trylock(&ctx->qp_lock))
		return -EBUSY;
	now = 0;	/* (read when the pass needs it) */
	/* (a hint for lock_unless_app: relaxed, written by the holder) */
	atomic_store_explicit(&e->app_in_pass, true, memory_order_relaxed);
	work = pass(ctx, &now, &deadline, false);
	atomic_store_explicit(&e->app_in_pass, false, memory_order_relaxed);
	ursa_mutex_unlock(&ctx->qp_lock);
	/* The time stamps below say "an application thread polls" to the
	 * engine and to peers, who compare them at microseconds (50 µs,
	 * 20 µs): a thread that polls an idle CQ in a loop refreshes them
	 * every 8th pass and reads no clock in the others. */
	if (!now && (work > 0 || !(++app_passes & 7)))
		now = ursa_now_ns();
	if (!now)
		goto out;
	/* (a poll of an armed CQ is the drain before the thread blocks:
	 * not a poller the engine may leave the sockets to) */
	if (polling)
		atomic_store_explicit(&e->app_pass_ns, now,
				      memory_order_relaxed);
	/* (peers read it: written when it moved by a microsecond or more,
	 * so that a thread polling in a loop does not take the line back
	 * from them at every poll) */
	if (polling && !e->forked &&	/* (a fork child's ctl is the parent's) */
	    now - atomic_load_explicit(&e->ctl->app_poll_ns,
				       memory_order_relaxed) >= 1000)
		atomic_store_explicit(&e->ctl->app_poll_ns, now,
				      memory_order_relaxed);
	if (work > 0)
		atomic_store_explicit(&e->active_ns, now, memory_order_relaxed);
out:
	atomic_fetch_add_explicit(&e->inline_passes, 1, memory_order_relaxed);
	rearm(e, deadline);
	return work;
}

/*
 * An application thread armed a CQ: it is about to block, so it no longer
 * counts as a poller. A poster that skipped our doorbell because it had
 * polled (shm.c ring_peer) may have left a request that no pass would
 * serve before the engine's own wake-up, up to 2 ms later: the engine is
 * rung for it here. The store to app_poll_ns and the look at the rings
 * are ordered by a seq_cst fence that pairs with the poster's, between its
 * req_tail store and its load of app_poll_ns: either the poster sees the
 * 0 and rings, or we see its request.
 */
void ursa_engine_app_blocks(struct ursa_ctx *ctx)
{
	struct ursa_engine *e = ctx->eng;
	bool pending = true;

	if (!e || e->forked)
		return;
	if (atomic_load_explicit(&e->ctl->app_poll_ns, memory_order_relaxed))
		atomic_store_explicit(&e->ctl->app_poll_ns, 0,
				      memory_order_relaxed);
	/* An engine that left the sockets to this thread's polls (its
	 * quiet time) must watch them again now, not when its quiet time
	 * is up: an event-driven server that drained its CQ and went back
	 * to epoll_wait left the next request in the socket for up to
	 * URSA_QUIET_US (the tail of ursa-kv's SEND GET between hosts). */
	atomic_store_explicit(&e->app_pass_ns, 0, memory_order_relaxed);
	if (atomic_load_explicit(&e->quiet_sleep, memory_order_relaxed))
		ursa_engine_kick(e);
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&e->ctl->sleeping, memory_order_relaxed))
		return;	/* (an awake engine looks at the rings again) */
	/* The served channels change under the lock; when another pass
	 * holds it, ring rather than wait. */
	if (ursa_mutex_trylock(&ctx->qp_lock)) {
		pending = ursa_shm_serve_pending(&e->shm);
		ursa_mutex_unlock(&ctx->qp_lock);
	}
	if (pending)
		ursa_engine_kick(e);
}

int ursa_engine_progress_qp(struct ursa_qp *qp)
{
	struct ursa_ctx *ctx = qp->ctx;
	struct ursa_engine *e = ctx->eng;
	uint64_t deadline = UINT64_MAX, now = 0;
	int work;

	if (!e || !ursa_mutex_trylock(&ctx->qp_lock))
		return -EBUSY;
	ursa_pass_ctx = ctx;
	atomic_store_explicit(&e->app_in_pass, true, memory_order_relaxed);
	work = ursa_req_process_lazy(qp, &now, &deadline);
	atomic_store_explicit(&e->app_in_pass, false, memory_order_relaxed);
	ursa_pass_ctx = NULL;
	ursa_mutex_unlock(&ctx->qp_lock);
	/* (no clock read: nothing that waits on a timer was started) */
	if (work > 0 && now)
		atomic_store_explicit(&e->active_ns, now, memory_order_relaxed);
	rearm(e, deadline);
	return work;
}

/* Wait up to timeout_ns (UINT64_MAX: no limit) and handle what came.
 * Returns whether anything but RoCEv2 readiness came (a doorbell, a
 * same-host channel); *udp (if not NULL) tells whether RoCEv2 readiness
 * came. */
static bool handle_events(struct ursa_engine *e, uint64_t timeout_ns,
			  bool *udp)
{
	static atomic_bool no_pwait2;
	struct epoll_event ev[32];
	bool other = false, chan = false;
	int n = -1;

	if (timeout_ns != UINT64_MAX && timeout_ns % 1000000 &&
	    !atomic_load_explicit(&no_pwait2, memory_order_relaxed)) {
		/* epoll_pwait2 (Linux 5.11): a timeout finer than 1 ms */
		struct timespec ts = { (time_t)(timeout_ns / 1000000000ull),
				       (long)(timeout_ns % 1000000000ull) };

		n = epoll_pwait2(e->epfd, ev, 32, &ts, NULL);
		if (n < 0 && errno == ENOSYS) {
			atomic_store_explicit(&no_pwait2, true,
					      memory_order_relaxed);
			n = epoll_wait(e->epfd, ev, 32,
				       (int)MIN((timeout_ns + 999999) / 1000000,
						(uint64_t)INT32_MAX));
		}
	} else {
		n = epoll_wait(e->epfd, ev, 32, timeout_ns == UINT64_MAX ? -1 :
			       (int)MIN(timeout_ns / 1000000, (uint64_t)INT32_MAX));
	}
	/* RoCEv2 readiness: the next pass receives. A doorbell is read here,
	 * without the context's lock (an application thread that rang it
	 * is likely in a pass, holding it); the channels' events take it. */
	for (int i = 0; i < n; i++) {
		struct ursa_watch *w = ev[i].data.ptr;

		if (w->kind == URSA_W_DOORBELL) {
			uint64_t v;

			if (read(e->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				ursa_err("engine doorbell read: %s",
					 strerror(errno));
			other = true;
		} else if (w->kind == URSA_W_UDP) {
			ursa_udp_wake();
			if (udp)
				*udp = true;
		} else {
			chan = true;
		}
	}
	if (!chan)
		return other;
	ursa_mutex_lock(&e->ctx->qp_lock);
	for (int i = 0; i < n; i++) {
		struct ursa_watch *w = ev[i].data.ptr;

		if (w->kind != URSA_W_UDP && w->kind != URSA_W_DOORBELL)
			ursa_shm_event(&e->shm, w, ev[i].events);
	}
	ursa_mutex_unlock(&e->ctx->qp_lock);
	return true;
}

/* While there was work in the last URSA_ENG_RECENT_NS, a sleeping engine
 * wakes at least every URSA_ENG_TICK_NS. Then a timer an application's pass
 * sets (an ACK timeout, at least 1 ms ahead) is usually later than the
 * engine's wake-up and needs no doorbell: a ping-pong no longer wakes the
 * engine once per message. An engine idle for longer sleeps until something
 * happens. */
static uint64_t tick(struct ursa_engine *e, uint64_t now, uint64_t deadline)
{
	uint64_t a = atomic_load_explicit(&e->active_ns, memory_order_relaxed);

	if (now - a < URSA_ENG_RECENT_NS && deadline > now + URSA_ENG_TICK_NS)
		return now + URSA_ENG_TICK_NS;
	return deadline;
}

static struct ursa_watch doorbell_watch = { URSA_W_DOORBELL, NULL, NULL };
static struct ursa_watch udp_watch = { URSA_W_UDP, (void *)1, NULL };

/*
 * The spin adapts to the gaps between bursts of work: a gap that a spin a
 * little longer than the last one would have bridged sets the next spin to
 * 1.5 times it, up to URSA_SPIN_MAX_US (default 300); a longer gap puts it
 * back to URSA_SPIN_US. A stream of RoCEv2 messages (each one waits for
 * its ACK before the next starts: tens of microseconds on the receiver
 * with nothing to do) otherwise put the receiving engine to sleep once or
 * twice per message, and every wake-up costs the sender's send call a
 * cross-core wake and the receiver the scheduler's latency (docs/design.md
 * "Queues, rings and the engine"). An idle or
 * sporadic engine keeps the short one.
 */
static uint64_t spin_adapt(const struct ursa_engine *e, uint64_t gap)
{
	if (gap >= e->spin_max_ns)
		return e->spin_ns;
	return MIN(e->spin_max_ns, MAX(e->spin_ns, gap + gap / 2));
}

/*
 * The engine sleeps until work comes, its earliest timer (deadline) or
 * the stop. While an application thread polls, it reads the RoCEv2
 * sockets and runs the timers: the engine sleeps without the sockets
 * and looks again every quiet time (the timers its passes set ring no
 * doorbell meanwhile: rearm).
 */
static void engine_sleep(struct ursa_engine *e, uint64_t deadline)
{
	bool was_quiet = false;
	uint64_t now;

	/* (quiet time off: try again after a while) */
	if (!e->quiet_cur && e->quiet_ns &&
	    ursa_now_ns() - e->quiet_off > URSA_ENG_RECENT_NS)
		e->quiet_cur = e->quiet_ns;
	for (;;) {
		uint64_t until, app;
		bool quiet, other, udp = false;

		now = ursa_now_ns();
		app = atomic_load_explicit(&e->app_pass_ns,
					   memory_order_relaxed);
		quiet = e->quiet_cur && ursa_udp_live() &&
			now - app < e->quiet_cur;
		if (was_quiet && !quiet) {
			/* It stopped polling: watch the sockets
			 * again and run a pass, which also learns
			 * those timers. Packets already waiting
			 * had waited for us (the application had
			 * stopped polling, as perftest's WRITE
			 * latency test does while it spins on
			 * memory): halve the quiet time, down to
			 * none. */
			ursa_udp_engine_watch(&e->udp, true);
			handle_events(e, 0, &udp);
			if (udp) {
				e->quiet_cur /= 2;
				if (e->quiet_cur < 2000) {
					e->quiet_cur = 0;
					e->quiet_off = now;
				}
			}
			break;
		}
		ursa_udp_engine_watch(&e->udp, !quiet);
		deadline = tick(e, now, deadline);
		until = deadline;
		if (quiet && until > now + e->quiet_cur)
			until = now + e->quiet_cur;
		atomic_store(&e->sleep_until, until);
		atomic_store(&e->ctl->wake_by, until);
		atomic_store_explicit(&e->quiet_sleep, quiet,
				      memory_order_relaxed);
		other = handle_events(e, until == UINT64_MAX ?
				      UINT64_MAX : until > now ?
				      until - now : 0, NULL);
		atomic_store_explicit(&e->quiet_sleep, false,
				      memory_order_relaxed);
		atomic_fetch_add(&e->wakeups, 1);
		now = ursa_now_ns();
		/* A quiet time that ends with the application
		 * still polling grows it back, up to
		 * URSA_QUIET_US. */
		if (was_quiet && quiet)
			e->quiet_cur = MIN(e->quiet_ns,
					   e->quiet_cur * 2);
		was_quiet = quiet;
		if (other || !quiet || now >= deadline ||
		    atomic_load(&e->stop))
			break;
	}
}

static void *engine_main(void *arg)
{
	struct ursa_engine *e = arg;
	struct ursa_ctx *ctx = e->ctx;
	uint64_t idle_since = 0, idle_start = 0, last_events = 0;
	uint64_t spin = e->spin_ns;
	bool woke = false;

	atomic_store_explicit(&e->started, 1, memory_order_release);
	while (!atomic_load_explicit(&e->stop, memory_order_acquire)) {
		uint64_t now, deadline = UINT64_MAX;
		int work = 0;

		now = ursa_now_ns();
		if (lock_unless_app(e, now)) {
			/* Only the engine frees closed channels: it alone
			 * may hold events that still name them. */
			ursa_shm_reap(&e->shm);
			work += pass(ctx, &now, &deadline, true);
			ursa_mutex_unlock(&ctx->qp_lock);
		}
		if (now - last_events > URSA_ENG_EVENT_POLL_NS) {
			/* connection requests and peer deaths, even when
			 * the engine never gets to sleep */
			handle_events(e, 0, NULL);
			last_events = now;
		}
		if (work) {
			atomic_store_explicit(&e->active_ns, now,
					      memory_order_relaxed);
			if (idle_start)
				spin = spin_adapt(e, now - idle_start);
			idle_since = idle_start = 0;
			woke = false;
			continue;
		}
		if (!idle_since)
			idle_since = now;
		if (!idle_start)
			idle_start = now;	/* (kept across a sleep) */
		/* Spin a while before sleeping, but not when woken for
		 * nothing, nor while an application thread polls (it does
		 * the work itself; a spinning engine only takes its CPU). */
		if (!woke && now - idle_since < spin && deadline > now &&
		    now - atomic_load_explicit(&e->app_pass_ns,
					       memory_order_relaxed) > e->spin_ns) {
			ursa_cpu_relax();
			continue;
		}
		deadline = tick(e, now, deadline);
		atomic_store(&e->sleep_until, deadline);
		atomic_store(&e->ctl->wake_by, deadline);
		atomic_store(&e->ctl->sleeping, 1);
		atomic_thread_fence(memory_order_seq_cst);
		if (!any_pending(e, ursa_now_ns(), &deadline) &&
		    !atomic_load(&e->stop)) {
			engine_sleep(e, deadline);
			last_events = ursa_now_ns();
		}
		atomic_store(&e->ctl->sleeping, 0);
		atomic_store(&e->sleep_until, 0);
		idle_since = 0;
		woke = true;
	}
	return NULL;
}

void ursa_engine_kick(struct ursa_engine *e)
{
	uint64_t one = 1;

	/* Pairs with the engine's fence between "sleeping = 1" and its
	 * recheck: our WQE store is ordered before this load. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&e->ctl->sleeping, memory_order_relaxed)) {
		atomic_fetch_add_explicit(&e->doorbells, 1,
					  memory_order_relaxed);
		if (write(e->efd, &one, sizeof(one)) < 0)
			ursa_err("doorbell: %s", strerror(errno));
	}
}

int ursa_engine_start(struct ursa_ctx *ctx)
{
	struct ursa_engine *e = calloc(1, sizeof(*e));
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &doorbell_watch };
	int ret = -ENOMEM;

	if (!e)
		return -ENOMEM;
	e->ctx = ctx;
	e->efd = e->epfd = e->ctl_fd = -1;
	e->quiet_ns = (uint64_t)ursa_cfg()->quiet_us * 1000;
	e->quiet_cur = e->quiet_ns;
	e->spin_ns = (uint64_t)ursa_cfg()->spin_us * 1000;
	e->spin_max_ns = (uint64_t)ursa_cfg()->spin_max_us * 1000;
	e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	e->udp = (struct ursa_udp_watch){ .epfd = e->epfd, .tag = &udp_watch };
	if (e->efd < 0 || e->epfd < 0) {
		ret = -errno;
		goto err;
	}
	/* Peers read the page; only this process writes it. */
	e->ctl_fd = ursa_memfd_shared("ursa-ctl", 4096, true, (void **)&e->ctl);
	if (e->ctl_fd < 0) {
		ret = e->ctl_fd;
		goto err;
	}
	e->ctl->magic = 0x5552534cu;
	e->ctl->version = 2;
	e->ctl->pid = getpid();
	if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->efd, &ev)) {
		ret = -errno;
		goto err;
	}
	e->shm.epfd = e->epfd;
	e->shm.ctl_fd = e->ctl_fd;
	e->shm.efd = e->efd;
	ctx->eng = e;
	ctx->shm = &e->shm;
	ret = -pthread_create(&e->thr, NULL, engine_main, e);
	if (ret) {
		ctx->eng = NULL;
		ctx->shm = NULL;
		goto err;
	}
	/* Return once the thread runs: its start-up (the C library's, a
	 * sanitizer's) allocates, and a fork() meanwhile would give the child
	 * an allocator lock held by a thread it does not have. Under
	 * AddressSanitizer that hung the child's own first engine thread
	 * (test fork, about 1 run in 40 under load). */
	while (!atomic_load_explicit(&e->started, memory_order_acquire))
		sched_yield();
	return 0;
err:
	if (e->ctl)
		munmap(e->ctl, 4096);
	if (e->ctl_fd >= 0)
		close(e->ctl_fd);
	if (e->epfd >= 0)
		close(e->epfd);
	if (e->efd >= 0)
		close(e->efd);
	free(e);
	return ret;
}

__attribute__((constructor)) static void engine_hooks(void)
{
	ursa_hooks.post_direct = ursa_req_direct;
	ursa_hooks.progress_qp = ursa_engine_progress_qp;
	ursa_hooks.kick = ursa_engine_kick;
	ursa_hooks.engine_forget = ursa_engine_forget;
	/* the same-host transport's requests, served on our passes */
	ursa_shm_up.execute = ursa_resp_execute;
	ursa_shm_up.run_sq = ursa_req_process_lazy;
}

void ursa_engine_forget(struct ursa_engine *e)
{
	ursa_shm_engine_forget(&e->shm);
	/* the child must not take doorbells meant for the parent's engine */
	close(e->epfd);
	e->epfd = e->udp.epfd = -1;
	e->forked = true;
}

void ursa_engine_stop(struct ursa_ctx *ctx)
{
	struct ursa_engine *e = ctx->eng;
	uint64_t one = 1;

	if (!e)
		return;
	if (e->forked) {
		ctx->eng = NULL;
		ctx->shm = NULL;
		/* inherited through fork: the thread lives in the parent;
		 * release only our copies of its descriptors */
		munmap(e->ctl, 4096);
		close(e->ctl_fd);
		close(e->efd);
		return;
	}
	atomic_store_explicit(&e->stop, 1, memory_order_release);
	if (write(e->efd, &one, sizeof(one)) < 0)
		ursa_err("engine stop: %s", strerror(errno));
	pthread_join(e->thr, NULL);
	ursa_shm_engine_fini(&e->shm);
	munmap(e->ctl, 4096);
	close(e->ctl_fd);
	close(e->epfd);
	close(e->efd);
	free(e);
	ctx->eng = NULL;
	ctx->shm = NULL;
}
