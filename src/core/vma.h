/* SPDX-License-Identifier: MIT */
/*
 * vma.h - which mapping of this process holds an address: what
 * registration asks to find memory other processes can map (shmap.c) and
 * before it reads /proc/self/smaps for page sizes (mtt.c).
 *
 * The answer comes from the PROCMAP_QUERY ioctl on /proc/self/maps (Linux
 * 6.11 and later): one mapping, looked up by the kernel, no text. Where the
 * kernel lacks it, from the text of /proc/self/maps, which the kernel
 * writes out for every mapping of the process at each read (with the path
 * of every file): that read and its parsing were half of what registering
 * 4 KiB cost (three reads per registration and deregistration, about 30 µs
 * each in a small process).
 */
#ifndef URSA_VMA_H
#define URSA_VMA_H

#include <stdbool.h>
#include <stdint.h>

struct ursa_vma_info {
	uintptr_t start, end;
	char perms[5];		/* as /proc/self/maps spells them: "rw-p" */
	uint64_t ino;		/* 0: anonymous */
	uint64_t offset;	/* file offset of start */
	char name[64];		/* path or "[heap]"; "" when anonymous */
};

/*
 * The mapping that holds addr (next: or else the first one above it);
 * 0, -ENOENT when there is none, or another negative errno. text forces
 * the /proc/self/maps text (tests compare the two ways).
 */
int ursa_vma_query(uintptr_t addr, bool next, bool text,
		   struct ursa_vma_info *out);

#endif
