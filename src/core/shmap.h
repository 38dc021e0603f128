/* SPDX-License-Identifier: MIT */
/*
 * shmap.h - registered memory that other processes of the host can map.
 *
 * Private anonymous memory (what malloc and mmap hand an application) cannot
 * be mapped by another process: a same-host requester could only reach it
 * through a system call per transfer (process_vm_writev), about 1.7 us even
 * for 8 bytes. So when an MR allows remote access, registration moves the
 * whole pages inside it into a memfd, without changing their addresses or
 * contents: the pages are written into a new memfd, which is then mapped
 * shared over the same range (one mmap with MAP_FIXED replaces the old
 * pages). The owner publishes the memfd's descriptor number and inode with
 * the MR (pub.h); a requester opens /proc/<pid>/fd/<n>, checks the inode,
 * maps it, and from then on a WRITE is a memcpy, a READ a memcpy back, an
 * atomic a locked instruction on the same physical memory as the target's.
 * That is the memory mapping of a real NIC (it reaches application memory
 * without the CPU of the target), done by the requester's CPU.
 *
 * Rules that keep this invisible to the application:
 *  - only pages that lie wholly inside the MR move (the bytes of a partial
 *    first or last page may belong to other objects; the direct path
 *    reaches those by process_vm_writev as before);
 *  - only private anonymous memory that is readable and writable, and
 *    only when no other MR pins any of the pages (their data may be in
 *    flight); anything else (files, hugetlbfs, the stack, shared memory)
 *    stays as it is;
 *  - a region is reference-counted by the MRs whose pages overlap it; when
 *    the last one goes, the pages move back into private anonymous memory
 *    (again without changing addresses or contents), so a freed buffer has
 *    the ordinary semantics malloc expects (MADV_DONTNEED zeroes it);
 *  - before reusing or restoring a region, /proc/self/maps must still show
 *    the memfd at that place: an application that unmapped the buffer and
 *    mapped something else there keeps its new memory.
 *  - a child of fork() gets private copies of every region, as of any
 *    other memory (at the cost of copying the parent's registered memory
 *    in the child).
 *  - pages move only while no other thread can write them: a write between
 *    the copy and the mmap that replaces the pages would be lost (in a
 *    program whose other threads allocate memory, such as UCX's, that
 *    corrupted malloc's own records). So a move first stops the threads the
 *    library runs (ursa_shmap_set_world: the engines park), then counts
 *    the process's threads: with any thread besides the caller and those,
 *    nothing moves (the MR is reached by process_vm_writev instead). A
 *    region whose last MR goes while other threads run stays shared until
 *    a later registration, deregistration or fork finds the process quiet.
 * What the application can observe: registration and deregistration copy
 * the pages (about 0.8 ms per MiB each way on the development VM, where
 * allocating pages is slow); writes the kernel makes into the buffer on
 * the program's behalf while it registers (asynchronous I/O) may be lost;
 * while registered,
 * MADV_DONTNEED on the buffer no longer zeroes it (on a real NIC it
 * detaches the pages from the NIC's, which breaks RDMA too). URSA_MAP=0
 * turns all of this off.
 */
#ifndef URSA_SHMAP_H
#define URSA_SHMAP_H

#include <stdbool.h>
#include <stdint.h>

struct ursa_pinmap;

/* The region an MR's pages were moved into (fd < 0: none). */
struct ursa_shmap_ref {
	int fd;			/* the owner's descriptor of the memfd */
	uint64_t ino;		/* its inode, for the requester's check */
	uint64_t start, len;	/* the owner's addresses it is mapped at */
};

/* An MR over the pages [ps, pe) (page aligned) of the buffer [a, a+len) is
 * being registered: move its whole pages into a region when share is set
 * and the rules allow, and take a reference on every region the pages
 * overlap. Call before pinning. Never fails: *out says what was done. */
void ursa_shmap_reg(uintptr_t a, uint64_t len, uintptr_t ps, uintptr_t pe,
		    bool share, struct ursa_pinmap *pins,
		    struct ursa_shmap_ref *out);
/* The MR over [ps, pe) is gone: drop its references; a region nobody
 * references goes back to private anonymous memory. */
void ursa_shmap_unreg(uintptr_t ps, uintptr_t pe);
/* How to stop the library's own threads around a move: stop() parks them
 * and returns how many it parked (or a negative errno: then nothing
 * moves), start() lets them go. Set by the engine when it starts one. */
void ursa_shmap_set_world(int (*stop)(void), void (*start)(void));
bool ursa_shmap_enabled(void);
/* In the child of fork(): every region becomes private memory again. */
void ursa_shmap_atfork_child(void);

#endif
