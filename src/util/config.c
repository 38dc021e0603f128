// SPDX-License-Identifier: MIT
/*
 * config.c - the table of URSA_* variables behind config.h: each one's
 * place in struct ursa_config, its default, its bounds and what it does.
 * This table is the reference; the README points here (`ursa config`).
 */
#include "config.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>

enum kind { NUM, FLAG, STR };

struct var {
	const char *name;
	enum kind kind;
	size_t off;
	long def, min, max;	/* NUM; FLAG: def only (0 or 1) */
	const char *def_str;	/* STR */
	const char *doc;
};

#define N(f, nm, d, lo, hi, doc) \
	{ nm, NUM, offsetof(struct ursa_config, f), d, lo, hi, NULL, doc }
#define F(f, nm, d, doc) \
	{ nm, FLAG, offsetof(struct ursa_config, f), d, 0, 1, NULL, doc }
#define S(f, nm, d, doc) \
	{ nm, STR, offsetof(struct ursa_config, f), 0, 0, 0, d, doc }

static const struct var vars[] = {
	S(device_name, "URSA_DEVICE_NAME", "ursa0",
	  "the device's name (ibv_get_device_name, sysfs)"),
	S(netdev, "URSA_NETDEV", "",
	  "interface whose MTU and MAC the port follows (default: the first non-loopback interface that is up)"),
	N(vendor_part_id, "URSA_VENDOR_PART_ID", 0x5552, 0, 0xffffff,
	  "vendor_part_id reported (4119 = ConnectX-5 makes perftest use its ibv_wr_* path)"),
	N(log, "URSA_LOG", 0, 0, 9, "0 errors only, 1 info, 2 debug"),
	F(stats, "URSA_STATS", 0, "print each QP's counters when it is destroyed and at exit"),
	N(spin_us, "URSA_SPIN_US", 20, 0, 1000000,
	  "how long an idle engine spins before sleeping (us)"),
	N(spin_max_us, "URSA_SPIN_MAX_US", 300, 0, 1000000,
	  "the longest an engine's spin grows to while work keeps arriving just after it sleeps (us)"),
	N(quiet_us, "URSA_QUIET_US", 1000, 0, 1000000,
	  "how long the engine leaves RoCEv2 receiving to a polling application thread (us; 0: never)"),
	F(cma, "URSA_CMA", 1, "cross-memory attach between processes (0: the shared-memory slots)"),
	F(direct, "URSA_DIRECT", 1, "requesters place same-host WRITE/READ data themselves"),
	F(map, "URSA_MAP", 1, "requesters map the target's ursa_mem_alloc memory"),
	N(ring_app_us, "URSA_RING_APP_US", 50, 0, 1000000,
	  "no doorbell when the target's application polled this recently (us; 0: always ring)"),
	N(ring_wake_us, "URSA_RING_WAKE_US", 2000, 0, 100000000,
	  "... and its engine wakes within this (us)"),
	F(rcache, "URSA_RCACHE", 1, "the registration cache"),
	N(rcache_entries, "URSA_RCACHE_ENTRIES", 256, 0, 1 << 20,
	  "registrations the cache keeps"),
	N(rcache_mb, "URSA_RCACHE_MB", 256, 0, 1 << 30,
	  "bytes the cache keeps pinned (MiB; at most half of RLIMIT_MEMLOCK)"),
	F(uffd, "URSA_UFFD", 1,
	  "watch registered memory for unmaps (userfaultfd; 0: an MR follows its addresses)"),
	N(udp_port, "URSA_UDP_PORT", 4791, 1, 65535, "RoCEv2 UDP port"),
	F(gso, "URSA_GSO", 1, "UDP segmentation offload when sending RoCEv2"),
	F(gro, "URSA_GRO", 1, "UDP receive offload (GRO) for RoCEv2"),
	F(ecn, "URSA_ECN", 1,
	  "RoCEv2 packets ECN-capable; congestion marks answered with CNPs, CNPs slow the sender"),
	F(sr, "URSA_SR", 1,
	  "selective repeat between ursa peers: lost RoCEv2 packets resent alone, the rest held"),
	F(wide, "URSA_WIDE", 1,
	  "between ursa peers, WRITEs and SENDs in packets as large as the link carries (1408 bytes at MTU 1500) instead of the path MTU's"),
	N(ack_delay_us, "URSA_ACK_DELAY_US", 50, 0, 500,
	  "how long a RoCEv2 responder may hold an ACK to send it with its next packet (us)"),
	N(rto_us, "URSA_RTO_US", 1000, 10, 10000000,
	  "floor of the early retransmission timer (us)"),
	S(fault, "URSA_FAULT", "",
	  "inject faults on transmit: loss=P,dup=P,reorder=P,corrupt=P,seed=N (percent)"),
	S(pcap, "URSA_PCAP", "", "capture RoCEv2 traffic into this file"),
	N(cm_timeout_ms, "URSA_CM_TIMEOUT_MS", 0, 0, 3600000,
	  "CM retransmission interval (ms; 0: from the path, as rdma_cm)"),
	N(cm_retries, "URSA_CM_RETRIES", 15, 0, 15, "CM retransmissions"),
	F(cm_trace, "URSA_CM_TRACE", 0, "print every CM message sent and received"),
	S(sysroot, "URSA_SYSROOT", "",
	  "where libursa-preload.so builds the device's sysfs tree (default: one per user and network namespace)"),
};

static struct ursa_config cfg;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void parse(void)
{
	for (size_t i = 0; i < ARRAY_SIZE(vars); i++) {
		const struct var *v = &vars[i];
		char *at = (char *)&cfg + v->off;
		const char *s = getenv(v->name);

		if (v->kind == STR) {
			*(const char **)(void *)at = s && *s ? s : v->def_str;
		} else if (v->kind == FLAG && s && *s &&
			   (!strcmp(s, "0") || !strcmp(s, "1"))) {
			*(long *)(void *)at = *s == '1';
		} else if (v->kind == FLAG && s && *s && v->def == 0) {
			/* an off-by-default switch: set means on */
			*(long *)(void *)at = 1;
		} else {
			*(long *)(void *)at = ursa_env_long(v->name, v->def,
							    v->min, v->max);
		}
	}
}

const struct ursa_config *ursa_cfg(void)
{
	pthread_once(&once, parse);
	return &cfg;
}

void ursa_cfg_print(FILE *f)
{
	const struct ursa_config *c = ursa_cfg();

	for (size_t i = 0; i < ARRAY_SIZE(vars); i++) {
		const struct var *v = &vars[i];
		const char *at = (const char *)c + v->off;
		bool set = getenv(v->name) != NULL;

		if (v->kind == STR) {
			const char *s = *(const char *const *)(const void *)at;

			fprintf(f, "%-20s %s%s\n", v->name, *s ? s : "(unset)",
				set ? "  (set)" : "");
		} else {
			fprintf(f, "%-20s %-12ld%s", v->name,
				*(const long *)(const void *)at, set ? "  (set)" : "");
			if (v->kind == NUM)
				fprintf(f, "  default %ld, %ld..%ld", v->def,
					v->min, v->max);
			else
				fprintf(f, "  default %ld", v->def);
			fputc('\n', f);
		}
		fprintf(f, "    %s\n", v->doc);
	}
}
