/* SPDX-License-Identifier: MIT */
/*
 * uffd.h - hearing of registered memory that the program unmaps.
 *
 * A NIC's MR keeps the pages it pinned: after munmap, mremap or a new
 * mapping at the address, the MR still names the old pages, and nothing
 * the program maps there later can be reached through the old keys. ursa's
 * MR names addresses (design.md, "Memory registration"), so it must learn
 * that the memory under it went away, or a peer holding the rkey would
 * read and write whatever is mapped there next.
 *
 * It learns from the kernel: every pinned range is registered with a
 * userfaultfd (write-protect mode, with nothing ever write-protected, so
 * that no page fault is ever delivered to it) that asks for the unmap,
 * remap and remove events. The kernel holds the thread that unmaps until a
 * watcher thread has read the event, so by the time munmap() returns, the
 * MRs over the range refuse every access (mr.c, ursa_mr_unmapped). No root
 * is needed (UFFD_USER_MODE_ONLY). Where the kernel or a seccomp profile
 * refuses userfaultfd, or the mapping cannot be registered (a private file
 * mapping), the range is not watched and an MR follows its addresses as
 * before; an access that then faults is still caught (util/fault.h).
 */
#ifndef URSA_UFFD_H
#define URSA_UFFD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Called on the watcher thread for [start, end) gone from the mapping. */
typedef void (*ursa_uffd_gone_fn)(uintptr_t start, uintptr_t end);

void ursa_uffd_set_handler(ursa_uffd_gone_fn fn);
/* Watch [start, start + len) (page aligned); true if the kernel took it. */
bool ursa_uffd_watch(uintptr_t start, size_t len);
void ursa_uffd_unwatch(uintptr_t start, size_t len);
/* Is the watcher running (userfaultfd available to this process)? */
bool ursa_uffd_active(void);
/* In a child of fork(): the descriptor belongs to the parent's memory and
 * the watcher thread did not come along; start afresh on demand. */
void ursa_uffd_atfork_child(void);

#endif
