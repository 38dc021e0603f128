// SPDX-License-Identifier: MIT
/*
 * device.c - the software device: its identity, limits, port and GID table.
 *
 * There is one device per process, created on first use and kept for the
 * process's lifetime (contexts outlive ibv_free_device_list). It looks like
 * rxe: one port, link layer Ethernet, RoCE v2 GIDs for the host's addresses,
 * an MTU that follows the network interface (IB MTU = the largest of
 * 256..4096 that fits the interface MTU minus RoCEv2 headers, so 1024 for a
 * 1500-byte Ethernet), a node GUID derived from the interface's MAC address
 * (EUI-64, as rxe does) or, without one, from /etc/machine-id.
 *
 * Environment: URSA_DEVICE_NAME (default "ursa0"), URSA_NETDEV (interface to
 * follow; default: the first non-loopback interface that is up).
 */
#include "core.h"
#include "pub.h"
#include "uffd.h"
#include "../proto/roce.h"
#include "../util/fault.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/capability.h>
#include <sys/syscall.h>

/* Headers RoCEv2 puts around a payload: IPv4 20, UDP 8, BTH 12, ICRC 4, and
 * room for the largest extension header (RETH 16 / AtomicETH 28). */
#define ROCE_OVERHEAD (20 + 8 + 12 + 28 + 4)
/* ROCE_WIDE_HDRS over UDP and IPv6 */
#define WIDE_OVERHEAD (40 + 8 + ROCE_WIDE_HDRS)

static struct ursa_device the_dev;
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;
static int dev_err;

int ursa_mtu_bytes(enum ibv_mtu m)
{
	return (m >= IBV_MTU_256 && m <= IBV_MTU_4096) ? 128 << m : 0;
}

static enum ibv_mtu mtu_from_if(int ifmtu)
{
	enum ibv_mtu m = IBV_MTU_256;

	for (enum ibv_mtu c = IBV_MTU_256; c <= IBV_MTU_4096; c++)
		if (ursa_mtu_bytes(c) + ROCE_OVERHEAD <= ifmtu)
			m = c;
	return m;
}

static int pin_lock(uintptr_t start, size_t len)
{
	/* Unmapped memory is EFAULT, as the kernel's ib_umem reports it;
	 * mlock's ENOMEM means either that or the kernel's locked-memory
	 * limit, and msync(MS_ASYNC), which checks the whole range and does
	 * nothing else to anonymous memory, tells them apart. Under
	 * AddressSanitizer, whose mlock does nothing, msync checks first. */
#ifdef __SANITIZE_ADDRESS__
	if (msync((void *)start, len, MS_ASYNC) && errno == ENOMEM)
		return -EFAULT;
#endif
	if (!mlock((void *)start, len)) {
		ursa_uffd_watch(start, len);
		return 0;
	}
	if (errno == ENOMEM && msync((void *)start, len, MS_ASYNC) &&
	    errno == ENOMEM)
		return -EFAULT;
	return -errno;
}

static void pin_unlock(uintptr_t start, size_t len)
{
	ursa_uffd_unwatch(start, len);
	munlock((void *)start, len);
}

static const struct ursa_pin_ops real_pin_ops = { pin_lock, pin_unlock };

static bool has_cap_ipc_lock(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	if (syscall(SYS_capget, &h, d))
		return false;
	return d[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32));
}

static uint64_t memlock_limit(void)
{
	struct rlimit rl;

	/* The kernel's ib_umem ignores the limit with CAP_IPC_LOCK. */
	if (has_cap_ipc_lock())
		return UINT64_MAX;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) || rl.rlim_cur == RLIM_INFINITY)
		return UINT64_MAX;
	return rl.rlim_cur;
}

static void add_gid(struct ursa_device *d, const uint8_t raw[16], int ifindex)
{
	if (d->ngids >= URSA_MAX_GIDS)
		return;
	for (int i = 0; i < d->ngids; i++)
		if (!memcmp(d->gids[i].gid.raw, raw, 16))
			return;
	memcpy(d->gids[d->ngids].gid.raw, raw, 16);
	d->gids[d->ngids].ifindex = ifindex;
	d->ngids++;
}

/* Pass 0: non-loopback IPv4, 1: non-loopback IPv6, 2: loopback. IPv4 comes
 * first because RoCE tools (perftest) prefer IPv4-mapped GIDs. */
static void scan_addrs(struct ursa_device *d, struct ifaddrs *ifa, int pass)
{
	for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
		uint8_t raw[16] = { 0 };
		bool lo;

		if (!i->ifa_addr || !(i->ifa_flags & IFF_UP))
			continue;
		lo = i->ifa_flags & IFF_LOOPBACK;
		if ((pass == 2) != lo)
			continue;
		if (i->ifa_addr->sa_family == AF_INET && pass != 1) {
			struct sockaddr_in *s = (struct sockaddr_in *)i->ifa_addr;

			raw[10] = raw[11] = 0xff;
			memcpy(raw + 12, &s->sin_addr, 4);
		} else if (i->ifa_addr->sa_family == AF_INET6 && pass != 0) {
			struct sockaddr_in6 *s =
				(struct sockaddr_in6 *)i->ifa_addr;

			memcpy(raw, &s->sin6_addr, 16);
		} else {
			continue;
		}
		add_gid(d, raw, (int)if_nametoindex(i->ifa_name));
	}
}

int ursa_device_refresh_gids(struct ursa_device *d)
{
	struct ifaddrs *ifa;

	d->ngids = 0;
	if (getifaddrs(&ifa) == 0) {
		for (int pass = 0; pass < 3; pass++)
			scan_addrs(d, ifa, pass);
		freeifaddrs(ifa);
	}
	if (d->ngids == 0) {
		/* No address at all (an empty namespace): keep one entry so
		 * that every index below gid_tbl_len stays queryable. */
		uint8_t raw[16] = { [10] = 0xff, [11] = 0xff, 127, 0, 0, 1 };

		add_gid(d, raw, 0);
	}
	return 0;
}

/* Pick the interface whose MTU and MAC the device follows. */
static void follow_netdev(struct ursa_device *d)
{
	const char *want = *ursa_cfg()->netdev ? ursa_cfg()->netdev : NULL;
	struct ifaddrs *ifa, *pick = NULL, *lo = NULL;
	uint8_t mac[6] = { 0 };
	int ifmtu = 1500, fd;
	struct ifreq ifr;
	bool have_mac = false;

	if (getifaddrs(&ifa))
		ifa = NULL;
	for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
		if (!(i->ifa_flags & IFF_UP))
			continue;
		if (want && strcmp(want, i->ifa_name))
			continue;
		if (i->ifa_flags & IFF_LOOPBACK) {
			if (!lo)
				lo = i;
			continue;
		}
		if (!pick)
			pick = i;
	}
	if (!pick)
		pick = lo;
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (pick && fd >= 0) {
		memset(&ifr, 0, sizeof(ifr));
		snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", pick->ifa_name);
		if (ioctl(fd, SIOCGIFMTU, &ifr) == 0)
			ifmtu = ifr.ifr_mtu;
		if (ioctl(fd, SIOCGIFHWADDR, &ifr) == 0) {
			memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
			have_mac = mac[0] | mac[1] | mac[2] | mac[3] | mac[4] |
				   mac[5];
		}
	}
	if (fd >= 0)
		close(fd);
	if (pick)
		snprintf(d->netdev, sizeof(d->netdev), "%s", pick->ifa_name);
	if (ifa)
		freeifaddrs(ifa);
	d->active_mtu = mtu_from_if(ifmtu);
	d->max_mtu = IBV_MTU_4096;
	/* ursa's wide packets: what one frame carries, in 64-byte steps */
	if (ifmtu > WIDE_OVERHEAD) {
		d->wide = MIN((uint32_t)(ifmtu - WIDE_OVERHEAD) / ROCE_WIDE_STEP *
			      ROCE_WIDE_STEP, ROCE_WIDE_MAX);
		if (d->wide <= (uint32_t)ursa_mtu_bytes(d->active_mtu))
			d->wide = 0;
	}

	uint8_t g[8];

	if (have_mac) {
		/* Modified EUI-64 from the MAC, as rxe and RoCE NICs do. */
		g[0] = mac[0] ^ 2;
		g[1] = mac[1];
		g[2] = mac[2];
		g[3] = 0xff;
		g[4] = 0xfe;
		g[5] = mac[3];
		g[6] = mac[4];
		g[7] = mac[5];
	} else {
		/* FNV-1a of the machine id: stable per host. */
		uint64_t h = 0xcbf29ce484222325ull;
		char id[128] = "ursa";
		FILE *f = fopen("/etc/machine-id", "re");

		if (f) {
			if (!fgets(id, sizeof(id), f))
				snprintf(id, sizeof(id), "ursa");
			fclose(f);
		}
		for (char *p = id; *p; p++)
			h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
		for (int i = 0; i < 8; i++)
			g[i] = (uint8_t)(h >> (56 - 8 * i));
		g[0] = (g[0] & ~1) | 2; /* locally administered, unicast */
	}
	memcpy(&d->node_guid, g, 8);
}

/* The child of fork() starts with a device of its own: no keys, no pins
 * (mlock is not inherited), no contexts, no QPs (see loop.c). */
struct ursa_hooks ursa_hooks;

static void dev_atfork_child(void)
{
	struct ursa_device *d = &the_dev;

	for (struct ursa_ctx *c = d->ctxs; c; c = c->next_ctx)
		if (c->eng)
			ursa_hooks.engine_forget(c->eng);
	d->ctxs = NULL;
	pthread_mutex_init(&d->ctx_lock, NULL);
	d->keys.slots = NULL;
	ursa_keytab_init(&d->keys, 1024);
	d->pins.segs = NULL;
	ursa_pinmap_init(&d->pins, &real_pin_ops, memlock_limit());
	/* (the parent's parked entries pin nothing here: forgotten) */
	ursa_rcache_init(&d->rcache, &d->pins);
	ursa_hooks.loop_atfork_child();
	ursa_hooks.udp_atfork_child();
	ursa_pub_atfork_child();
	ursa_uffd_atfork_child();
}

static void dev_init(void)
{
	struct ursa_device *d = &the_dev;
	const char *name = ursa_cfg()->device_name;

	if (!*name || strlen(name) >= IBV_SYSFS_NAME_MAX)
		name = "ursa0";
	d->ibdev.node_type = IBV_NODE_CA;
	d->ibdev.transport_type = IBV_TRANSPORT_IB;
	snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
	snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs0");
	snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path),
		 "/sys/class/infiniband_verbs/uverbs0");
	snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path),
		 "/sys/class/infiniband/%s", name);
	atomic_init(&d->port_state, IBV_PORT_ACTIVE);
	pthread_mutex_init(&d->ctx_lock, NULL);
	follow_netdev(d);
	ursa_device_refresh_gids(d);
	dev_err = ursa_keytab_init(&d->keys, 1024);
	ursa_pinmap_init(&d->pins, &real_pin_ops, memlock_limit());
	ursa_rcache_init(&d->rcache, &d->pins);
	pthread_atfork(NULL, NULL, dev_atfork_child);
	ursa_fault_init();
	ursa_uffd_set_handler(ursa_mr_unmapped);
}

struct ursa_device *ursa_device_get(void)
{
	pthread_once(&dev_once, dev_init);
	return dev_err ? NULL : &the_dev;
}

void ursa_device_attr(struct ursa_device *d, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", URSA_FW_VER);
	a->node_guid = d->node_guid;
	a->sys_image_guid = d->node_guid;
	a->max_mr_size = URSA_MAX_MR_SIZE;
	a->page_size_cap = 0xfffff000; /* 4 KiB and up */
	a->vendor_id = URSA_VENDOR_ID;
	/* URSA_VENDOR_PART_ID lets tests impersonate a part id that makes
	 * perftest choose its ibv_wr_* post path (4119: ConnectX-5). */
	a->vendor_part_id = (uint32_t)ursa_cfg()->vendor_part_id;
	a->hw_ver = URSA_HW_VER;
	a->max_qp = URSA_MAX_QP;
	a->max_qp_wr = URSA_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN |
			      IBV_DEVICE_SHUTDOWN_PORT |
			      IBV_DEVICE_PORT_ACTIVE_EVENT |
			      IBV_DEVICE_SYS_IMAGE_GUID |
			      IBV_DEVICE_SRQ_RESIZE |
			      IBV_DEVICE_MEM_WINDOW |
			      IBV_DEVICE_MEM_WINDOW_TYPE_2B |
			      IBV_DEVICE_MEM_MGT_EXTENSIONS |
			      IBV_DEVICE_N_NOTIFY_CQ;
	a->max_sge = URSA_MAX_SGE;
	a->max_sge_rd = URSA_MAX_SGE;
	a->max_cq = 16384;
	a->max_cqe = URSA_MAX_CQE;
	a->max_mr = 1 << 20;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = URSA_MAX_RD_ATOM;
	a->max_qp_init_rd_atom = URSA_MAX_RD_ATOM;
	a->max_res_rd_atom = URSA_MAX_RD_ATOM * URSA_MAX_QP;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_mw = 1 << 16;
	a->max_ah = 1 << 16;
	a->max_srq = 1 << 14;
	a->max_srq_wr = URSA_MAX_SRQ_WR;
	a->max_srq_sge = URSA_MAX_SGE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = 1;
}

void ursa_port_attr(struct ursa_device *d, struct ibv_port_attr *a)
{
	int st = atomic_load(&d->port_state);

	memset(a, 0, sizeof(*a));
	a->state = st;
	a->max_mtu = d->max_mtu;
	a->active_mtu = d->active_mtu;
	/* Longer than the entries in use, as on a NIC: the rest are empty
	 * (ibv_query_gid gives the zero GID, ibv_query_gid_ex ENODATA). */
	a->gid_tbl_len = URSA_MAX_GIDS;
	a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
	a->max_msg_sz = URSA_MAX_MSG_SZ;
	a->pkey_tbl_len = 1;
	a->lid = 0;	/* RoCE: no LIDs */
	a->sm_lid = 0;
	a->max_vl_num = 1;
	a->active_width = 2;	/* 4X */
	a->active_speed = 32;	/* EDR (25 Gb/s per lane) -> 100 Gb/s */
	a->phys_state = st == IBV_PORT_ACTIVE ? 5 : 3; /* LinkUp / Disabled */
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
}
