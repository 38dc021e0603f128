/* SPDX-License-Identifier: MIT */
/*
 * shmap.h - registered memory that other processes of the host can map.
 *
 * Private memory (what malloc and mmap hand an application) cannot be
 * mapped by another process: a same-host requester reaches it through one
 * system call per access (process_vm_writev/readv, one copy straight
 * between the two address spaces). Memory in a memfd mapped shared can be
 * mapped by the peer: its WRITE is then a memcpy, its READ a memcpy back,
 * its atomic a locked instruction on the target's own physical memory, no
 * system call and no CPU of the target (the memory mapping of a real NIC,
 * done by the requester's CPU).
 *
 * Registration never moves pages to get there. An earlier design copied
 * the pages of an MR into a memfd and mapped it over the range; a write by
 * another thread, or by the kernel for the program (read(2), io_uring,
 * another process's process_vm_writev), between the copy and the mapping
 * landed in the old page and was lost, huge pages became 4 KiB pages, and a
 * child of fork() paid a copy. Now the application chooses: memory from
 * ursa_mem_alloc() (include/ursa/ursa.h) is such a memfd, sealed against
 * resizing, and an MR that lies inside one allocation publishes it (pub.h):
 * the owner's descriptor number, its inode and where it is mapped. A
 * requester opens /proc/<pid>/fd/<n>, checks the inode, the seals and the
 * size, maps it, and from then on needs no system call (transport/shm.c).
 *
 * Before publishing, registration asks the kernel (vma.h) that the range is
 * still mapped shared from that memfd at the place it was allocated at: an
 * application that unmapped an allocation and mapped something else there
 * gets its new memory reached by process_vm_writev, never the old memfd.
 */
#ifndef URSA_SHMAP_H
#define URSA_SHMAP_H

#include <stddef.h>
#include <stdint.h>

/* The memfd that holds an MR's memory (fd < 0: none). */
struct ursa_shmap_ref {
	int fd;			/* the owner's descriptor of the memfd */
	uint64_t ino;		/* its inode, for the requester's check */
	uint64_t start, len;	/* the owner's addresses it is mapped at */
};

/* A new allocation of len bytes (rounded up to pages), zeroed: 0 or a
 * negative errno. */
int ursa_shmap_alloc(size_t len, void **out);
/* Unmap an allocation and close its memfd: 0, or -EINVAL if p is not the
 * start of one. Peers that mapped it keep their mapping until they drop it. */
int ursa_shmap_free(void *p);
/* The allocation that holds all of [s, e) and is still mapped there:
 * *out names it, or out->fd is -1. */
void ursa_shmap_find(uintptr_t s, uintptr_t e, struct ursa_shmap_ref *out);

#endif
