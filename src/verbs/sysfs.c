// SPDX-License-Identifier: MIT
/*
 * sysfs.c (verbs) - the files a real device has under /sys/class/infiniband,
 * answered from the device itself, plus libibverbs' string and rate helpers.
 *
 * ibv_devinfo reads board_id and librdmacm probes ABI files through
 * ibv_read_sysfs_file(). ursa's device has no sysfs directory; reads under
 * its synthetic ibdev_path are answered from a table, every other path is
 * read for real with libibverbs' semantics (one trailing newline stripped,
 * length returned, or -1 with errno).
 */
#include "verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT URSA_EXPORT

EXPORT const char *ibv_get_sysfs_path(void)
{
	static char path[256];
	const char *env = getenv("SYSFS_PATH");

	if (env && getuid() == geteuid() && *env) {
		size_t n;

		snprintf(path, sizeof(path), "%s", env);
		n = strlen(path);
		while (n > 1 && path[n - 1] == '/')
			path[--n] = '\0';
		return path;
	}
	return "/sys";
}

/* ursa_sysfs_file for the GID table's files (ports/1/gids/N and
 * ports/1/gid_attrs/...), and -1 for any other name. */
static int gid_file(const struct ursa_device *dev, const char *rel,
		    char *out, size_t len)
{
	unsigned int i;

	if (sscanf(rel, "ports/1/gids/%u", &i) == 1 && i < URSA_MAX_GIDS) {
		/* An empty entry reads as the zero GID, as in the kernel. */
		static const uint8_t zero[16];
		const uint8_t *r = i < (unsigned)dev->ngids ?
					   dev->gids[i].gid.raw : zero;

		return snprintf(out, len,
				"%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
				r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
				r[8], r[9], r[10], r[11], r[12], r[13], r[14],
				r[15]);
	}
	if (sscanf(rel, "ports/1/gid_attrs/types/%u", &i) == 1 &&
	    i < (unsigned)dev->ngids)
		return snprintf(out, len, "RoCE v2");
	if (sscanf(rel, "ports/1/gid_attrs/ndevs/%u", &i) == 1 &&
	    i < (unsigned)dev->ngids) {
		char name[IF_NAMESIZE] = "";

		if (!if_indextoname((unsigned)dev->gids[i].ifindex, name))
			name[0] = '\0';
		return snprintf(out, len, "%s", name);
	}
	return -1;
}

/* The value of file rel under the device's sysfs directory, without the
 * trailing newline: its length, or -1 if a real device has no such file
 * (or, as for the attributes of an empty GID entry, cannot read it). */
int ursa_sysfs_file(const char *rel, char *out, size_t len)
{
	struct ursa_device *dev = ursa_device_get();
	const uint8_t *g = (const uint8_t *)&dev->node_guid;

	if (!strcmp(rel, "board_id"))
		return snprintf(out, len, "URSA_SOFT_RDMA");
	if (!strcmp(rel, "fw_ver"))
		return snprintf(out, len, "%s", URSA_FW_VER);
	if (!strcmp(rel, "node_type"))
		return snprintf(out, len, "1: CA");
	if (!strcmp(rel, "hca_type"))
		return snprintf(out, len, "ursa");
	if (!strcmp(rel, "hw_rev"))
		return snprintf(out, len, "%d", URSA_HW_VER);
	if (!strcmp(rel, "node_desc"))
		return snprintf(out, len, "ursa software RDMA device");
	if (!strcmp(rel, "parent") && dev->netdev[0])
		return snprintf(out, len, "%s", dev->netdev);
	if (!strcmp(rel, "node_guid") || !strcmp(rel, "sys_image_guid"))
		return snprintf(out, len, "%02x%02x:%02x%02x:%02x%02x:%02x%02x",
				g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
	if (!strcmp(rel, "ports/1/state"))
		return atomic_load(&dev->port_state) == IBV_PORT_ACTIVE ?
			       snprintf(out, len, "4: ACTIVE") :
			       snprintf(out, len, "1: DOWN");
	if (!strcmp(rel, "ports/1/phys_state"))
		return snprintf(out, len, "5: LinkUp");
	if (!strcmp(rel, "ports/1/link_layer"))
		return snprintf(out, len, "Ethernet");
	if (!strcmp(rel, "ports/1/lid") || !strcmp(rel, "ports/1/sm_lid"))
		return snprintf(out, len, "0x0");
	if (!strcmp(rel, "ports/1/lid_mask_count") ||
	    !strcmp(rel, "ports/1/sm_sl"))
		return snprintf(out, len, "0");
	if (!strcmp(rel, "ports/1/rate"))
		return snprintf(out, len, "100 Gb/sec (4X EDR)");
	if (!strcmp(rel, "ports/1/cap_mask"))
		return snprintf(out, len, "0x%08x",
				IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS);
	if (!strcmp(rel, "ports/1/pkeys/0"))
		return snprintf(out, len, "0xffff");
	return gid_file(dev, rel, out, len);
}

EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
			       size_t size)
{
	struct ursa_device *dev = ursa_device_get();
	char path[512];
	size_t dl;
	ssize_t n;
	int fd;

	if (dev) {
		dl = strlen(dev->ibdev.ibdev_path);
		if (!strncmp(dir, dev->ibdev.ibdev_path, dl) &&
		    (dir[dl] == '\0' || dir[dl] == '/')) {
			char rel[512];
			char tmp[256];
			int r;

			snprintf(rel, sizeof(rel), "%s%s%s",
				 dir[dl] ? dir + dl + 1 : "", dir[dl] ? "/" : "",
				 file);
			r = ursa_sysfs_file(rel, tmp, sizeof(tmp));
			if (r < 0) {
				errno = ENOENT;
				return -1;
			}
			if (size)
				snprintf(buf, size, "%s", tmp);
			return (int)MIN((size_t)r, size ? size - 1 : 0);
		}
	}
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = '\0';
	else if ((size_t)n < size)
		buf[n] = '\0';
	return (int)n;
}

EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};

	if ((unsigned)t < ARRAY_SIZE(s) && s[t])
		return s[t];
	return "unknown";
}

EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const n[] = {
		"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED",
		"PORT_ACTIVE", "PORT_ACTIVE_DEFER",
	};

	return (unsigned)s < ARRAY_SIZE(n) ? n[s] : "unknown";
}

EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const n[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};

	if ((unsigned)e < ARRAY_SIZE(n) && n[e])
		return n[e];
	return "unknown";
}

EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const n[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};

	if ((unsigned)s < ARRAY_SIZE(n) && n[s])
		return n[s];
	return "unknown";
}

/* Rates: multiples of 2.5 Gb/s and Mb/s, per enum ibv_rate. */
static const struct {
	enum ibv_rate r;
	int mult, mbps;
} rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 },	  { IBV_RATE_5_GBPS, 2, 5000 },
	{ IBV_RATE_10_GBPS, 4, 10000 },	  { IBV_RATE_20_GBPS, 8, 20000 },
	{ IBV_RATE_30_GBPS, 12, 30000 },  { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 },  { IBV_RATE_80_GBPS, 32, 80000 },
	{ IBV_RATE_120_GBPS, 48, 120000 }, { IBV_RATE_14_GBPS, 5, 14062 },
	{ IBV_RATE_56_GBPS, 22, 56250 },  { IBV_RATE_112_GBPS, 45, 112500 },
	{ IBV_RATE_168_GBPS, 67, 168750 }, { IBV_RATE_25_GBPS, 10, 25781 },
	{ IBV_RATE_100_GBPS, 40, 103125 }, { IBV_RATE_200_GBPS, 80, 206250 },
	{ IBV_RATE_300_GBPS, 120, 309375 }, { IBV_RATE_28_GBPS, 11, 28125 },
	{ IBV_RATE_50_GBPS, 20, 53125 },  { IBV_RATE_400_GBPS, 160, 425000 },
	{ IBV_RATE_600_GBPS, 240, 637500 }, { IBV_RATE_800_GBPS, 320, 850000 },
	{ IBV_RATE_1200_GBPS, 480, 1275000 },
};

EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < ARRAY_SIZE(rates); i++)
		if (rates[i].r == rate)
			return rates[i].mult;
	return -1;
}

EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < ARRAY_SIZE(rates); i++)
		if (rates[i].mult == mult)
			return rates[i].r;
	return IBV_RATE_MAX;
}

EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < ARRAY_SIZE(rates); i++)
		if (rates[i].r == rate)
			return rates[i].mbps;
	return -1;
}

EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < ARRAY_SIZE(rates); i++)
		if (rates[i].mbps == mbps)
			return rates[i].r;
	return IBV_RATE_MAX;
}
