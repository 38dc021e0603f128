// SPDX-License-Identifier: MIT
/*
 * fault.c - the SIGSEGV/SIGBUS handler behind fault.h's guards.
 *
 * A fault on a thread inside a guard unwinds to the guard; any other fault
 * is handed to whatever handled the signal before ursa (the program's own
 * handler, a sanitizer's, or the default action, which then runs as if
 * ursa had never been there: the faulting instruction is executed again
 * with the old disposition in place).
 */
#include "fault.h"
#include "util.h"

#include <pthread.h>
#include <signal.h>

__thread struct ursa_fault *ursa_fault_top __attribute__((tls_model("initial-exec")));

static struct sigaction old_segv, old_bus;

static void pass_on(int sig, siginfo_t *si, void *uc)
{
	struct sigaction *old = sig == SIGBUS ? &old_bus : &old_segv;

	if (old->sa_flags & SA_SIGINFO) {
		old->sa_sigaction(sig, si, uc);
		return;
	}
	if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
		old->sa_handler(sig);
		return;
	}
	/* The default action: put it back; a fault recurs when we return
	 * (and now kills, with a core that points at the instruction), a
	 * signal sent by kill() is sent again. */
	sigaction(sig, old, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	struct ursa_fault *g = ursa_fault_top;

	/* si_code > 0: raised by the kernel for this thread's own access
	 * (SEGV_MAPERR, SEGV_ACCERR, BUS_ADRERR...), not sent by kill() */
	if (g && si->si_code > 0) {
		ursa_fault_top = g->prev;
		/* SA_NODEFER: the signal is not blocked in the handler, so
		 * leaving it without restoring the mask is safe */
		siglongjmp(g->env, 1);
	}
	pass_on(sig, si, uc);
}

static void install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &old_segv))
		ursa_err("SIGSEGV handler not installed: a peer's access to unmapped registered memory would crash");
	sigaction(SIGBUS, &sa, &old_bus);
}

void ursa_fault_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, install);
}
