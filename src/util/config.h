/* SPDX-License-Identifier: MIT */
/*
 * config.h - every URSA_* environment variable, read once.
 *
 * The variables are parsed together, the first time anything asks
 * (ursa_cfg), into one struct; config.c's table is their one
 * documentation (name, default, bounds, meaning) and `ursa config`
 * prints the effective values from it. A value out of bounds or not a
 * number is ignored with one log line naming the bounds. Programs that
 * change the environment after ursa started are not followed: tests set
 * variables before the first device open.
 *
 * (URSA_SYSROOT alone is read elsewhere: by libursa-preload.so, which is
 * preloaded into programs before ursa's libibverbs is even loaded; it is
 * in the table for `ursa config`.)
 */
#ifndef URSA_CONFIG_H
#define URSA_CONFIG_H

#include <stdio.h>

struct ursa_config {
	/* the device */
	const char *device_name;	/* URSA_DEVICE_NAME */
	const char *netdev;		/* URSA_NETDEV */
	long vendor_part_id;		/* URSA_VENDOR_PART_ID */
	long log;			/* URSA_LOG */
	long stats;			/* URSA_STATS */
	/* the engine */
	long spin_us, spin_max_us, quiet_us;
	/* processes of one host */
	long cma, direct, map, ring_app_us, ring_wake_us;
	/* registration */
	long rcache, rcache_entries, rcache_mb, uffd;
	/* RoCEv2 */
	long udp_port, gso, gro, ecn, sr, wide, ack_delay_us, rto_us;
	const char *fault, *pcap;
	/* connection manager (librdmacm) */
	long cm_timeout_ms, cm_retries, cm_trace;
	/* the sysfs stand-in (read by libursa-preload.so) */
	const char *sysroot;
};

/* The effective configuration (parsed at the first call). Exported for
 * ursa's librdmacm, which reads its own variables here too. */
__attribute__((visibility("default")))
const struct ursa_config *ursa_cfg(void);
/* Print every variable: name, effective value, default, meaning. */
void ursa_cfg_print(FILE *f);

#endif
