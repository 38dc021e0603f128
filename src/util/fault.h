/* SPDX-License-Identifier: MIT */
/*
 * fault.h - a fault in application memory becomes an error, not a crash.
 *
 * Registration pins pages but leaves them where they are (design.md,
 * "Memory registration"), so an MR follows its addresses: a program that
 * unmaps memory it keeps registered leaves the MR over a hole, and a
 * peer's WRITE into it would make the owning process's engine store to an
 * unmapped address. A NIC writes into the pages it pinned instead; ursa
 * cannot keep private pages without moving them, so it does the next best
 * thing: the copies that the engine makes on a peer's behalf run inside a
 * guard, and a SIGSEGV or SIGBUS raised within one unwinds to the guard,
 * which reports -EFAULT (the request fails with a remote access error that
 * names the cause).
 *
 * Usage (sigsetjmp must run in the frame that stays live):
 *
 *	struct ursa_fault g;
 *
 *	ursa_fault_push(&g);
 *	if (sigsetjmp(g.env, 0))
 *		return -EFAULT;		(the handler popped the guard)
 *	... copies ...
 *	ursa_fault_pop(&g);
 *
 * Nothing between push and pop may take a lock or change state that the
 * unwinding would leave half done: only loads and stores of application
 * memory. The handlers are installed once, at the first device open
 * (ursa_fault_init); a fault outside a guard goes to the handler that was
 * there before (or the default action), so the program's own handlers and
 * the sanitizers' keep working. A program that installs its own SIGSEGV
 * handler after opening the device replaces ursa's: its faults behave as
 * without the guard.
 */
#ifndef URSA_FAULT_H
#define URSA_FAULT_H

#include <setjmp.h>

struct ursa_fault {
	sigjmp_buf env;
	struct ursa_fault *prev;
};

/* The innermost guard of this thread; initial-exec so that the signal
 * handler reads it without a call that could allocate. */
extern __thread struct ursa_fault *ursa_fault_top
	__attribute__((tls_model("initial-exec")));

void ursa_fault_init(void);

static inline void ursa_fault_push(struct ursa_fault *g)
{
	g->prev = ursa_fault_top;
	/* the compiler must not move the guarded stores above this one:
	 * the handler reads the pointer on this thread only */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	ursa_fault_top = g;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void ursa_fault_pop(struct ursa_fault *g)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	ursa_fault_top = g->prev;
}

#endif
