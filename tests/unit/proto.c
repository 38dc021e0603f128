// SPDX-License-Identifier: MIT
/*
 * proto.c (unit) - RoCEv2 wire format: the ICRC against published packets
 * (a ConnectX-4 Lx capture and scapy's test vectors, reproduced in
 * docs/rocev2.md 3.5), header round trips, the parser's refusals, PSNs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../src/proto/roce.h"

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;

	while (*s && n < cap) {
		unsigned v;

		while (*s == ' ' || *s == '\n')
			s++;
		if (!*s || sscanf(s, "%2x", &v) != 1)
			break;
		out[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}

/* Check the ICRC of a full Ethernet frame (IPv4 or IPv6, no VLAN). */
static int icrc_ok(const char *hex, uint32_t want_wire_le)
{
	uint8_t f[512];
	size_t n = unhex(hex, f, sizeof(f));
	const uint8_t *ip = f + 14;
	size_t iplen = (ip[0] >> 4) == 4 ? 20 : 40;
	const uint8_t *udp = ip + iplen, *ib = udp + 8;
	size_t iblen = n - 14 - iplen - 8 - 4;
	uint32_t c = roce_icrc(ip, iplen, udp, ib, iblen);

	EXPECT_EQ(c, want_wire_le);
	EXPECT_EQ(roce_icrc_get(ib + iblen), c);
	return c == want_wire_le;
}

/* The ICRC with an IPv4 ID is the ICRC with ID 0 xor a delta (captured
 * packets carry non-zero IDs), for any length and ID. */
static int test_icrc_v4_id_delta(void)
{
	uint8_t f[512], ip[20];
	size_t n = unhex("e41d2dab2bc27cfe90643b32080045c2003c718c400040119161"
			 "0a0011010a001201000012b700280000" "8100ffff40000118"
			 "00000000" "00000000000000000000000000000000" "82fd002a",
			 f, sizeof(f));
	size_t iblen = n - 14 - 20 - 8 - 4;
	uint8_t pkt[1200], udp[8] = { 0xc0, 0x00, 0x12, 0xb7 };

	memcpy(ip, f + 14, 20);
	ip[4] = ip[5] = 0;
	EXPECT_EQ(roce_icrc(ip, 20, f + 34, f + 42, iblen) ^
		  roce_icrc_v4_id_delta(iblen, 0x718c), 0x2a00fd82u);
	for (uint32_t i = 0; i < sizeof(pkt); i++)
		pkt[i] = (uint8_t)(i * 7 + 1);
	for (uint16_t id = 1; id < 200; id += 37) {
		size_t len = 12 + id * 5u;
		uint32_t c0, c;

		memset(ip, 0, sizeof(ip));
		ip[0] = 0x45;
		ip[6] = 0x40;
		ip[9] = 17;
		c0 = roce_icrc(ip, 20, udp, pkt, len);
		ip[4] = (uint8_t)(id >> 8);
		ip[5] = (uint8_t)id;
		c = roce_icrc(ip, 20, udp, pkt, len);
		EXPECT_TRUE(c != c0);
		EXPECT_EQ(c0 ^ roce_icrc_v4_id_delta(len, id), c);
	}
	return TEST_RESULT();
}

/* Any IPv4 ID, as rxe and NICs choose them: the solver recovers it from
 * the ICRC alone, for every length, and refuses damaged packets but for
 * about 2^-16 of them. */
static int test_icrc_v4_id_solve(void)
{
	static uint8_t pkt[4200];
	uint8_t ip[20] = { 0x45, [6] = 0x40, [8] = 64, [9] = 17 };
	uint8_t udp[8] = { 0xd4, 0x31, 0x12, 0xb7 };
	struct roce_id_solver s;
	uint32_t seed = 12345;
	int wrong = 0, taken = 0, solved = 0;

	for (size_t i = 0; i < sizeof(pkt); i++)
		pkt[i] = (uint8_t)(i * 131 + (i >> 3));
	for (size_t len = 12; len < sizeof(pkt); len += 97) {
		roce_id_solver_init(&s, len);
		EXPECT_EQ(s.n, 16);	/* the 16 ID bits are independent */
		ip[4] = ip[5] = 0;
		uint32_t c0 = roce_icrc(ip, 20, udp, pkt, len);

		for (int k = 0; k < 20; k++) {
			uint16_t id, got = 0;

			seed = seed * 1103515245u + 12345u;
			id = (uint16_t)(seed >> 8);
			ip[4] = (uint8_t)(id >> 8);
			ip[5] = (uint8_t)id;
			if (roce_id_solve(&s, c0 ^ roce_icrc(ip, 20, udp, pkt, len),
					  &got) || got != id)
				wrong++;
			else
				solved++;
			/* the same ICRC over a packet with one bit flipped */
			pkt[seed % len] ^= (uint8_t)(1u << (seed >> 29));
			taken += !roce_id_solve(&s, c0 ^ roce_icrc(ip, 20, udp,
								   pkt, len), &got);
			pkt[seed % len] ^= (uint8_t)(1u << (seed >> 29));
		}
	}
	EXPECT_EQ(wrong, 0);
	EXPECT_TRUE(solved > 800);
	/* ~860 damaged packets: about 0.013 expected to pass */
	EXPECT_TRUE(taken <= 2);
	return TEST_RESULT();
}

/* Every length and offset: the carry-less multiplication paths (those
 * the CPU has: 128-bit, then 256-bit) and the 4-byte step agree with the
 * tables. */
static int test_crc_methods_agree(void)
{
	static uint8_t buf[4200 + 16];
	uint32_t bad[2] = { 0, 0 };

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131 + (i >> 5));
	for (int wide = 0; wide < 2; wide++) {
		roce_crc32_wide(wide);
		for (size_t off = 0; off < 16; off += 3)
			for (size_t n = 0; n <= 4200; n += (n < 600 ? 1 : 37)) {
				uint32_t reg = (uint32_t)(n * 2654435761u);

				if (roce_crc32_raw(reg, buf + off, n) !=
				    roce_crc32_raw_table(reg, buf + off, n))
					bad[wide]++;
			}
	}
	for (size_t off = 0; off + 4 <= sizeof(buf); off += 7) {
		uint32_t reg = (uint32_t)(off * 2654435761u);

		if (roce_crc32_4(reg, buf + off) !=
		    roce_crc32_raw_table(reg, buf + off, 4))
			bad[0]++;
	}
	EXPECT_EQ(bad[0], 0);
	EXPECT_EQ(bad[1], 0);
	return TEST_RESULT();
}

/* The copy that computes the CRC on the way: the same register as the
 * tables, the same bytes as memcpy, nothing written past the end. */
static int test_crc_copy(void)
{
	static uint8_t src[4200 + 16], dst[4200 + 64];
	uint32_t bad_crc = 0, bad_copy = 0, bad_guard = 0;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 7 + (i >> 7));
	for (int wide = 0; wide < 2; wide++) {
		roce_crc32_wide(wide);
		for (size_t off = 0; off < 16; off += 5)
			for (size_t n = 0; n <= 4200; n += (n < 300 ? 1 : 41)) {
				uint32_t reg = (uint32_t)(n * 2246822519u);

				memset(dst, 0xa5, sizeof(dst));
				if (roce_crc32_copy(reg, dst + 3, src + off, n) !=
				    roce_crc32_raw_table(reg, src + off, n))
					bad_crc++;
				if (memcmp(dst + 3, src + off, n))
					bad_copy++;
				if (dst[2] != 0xa5 || dst[3 + n] != 0xa5)
					bad_guard++;
			}
	}
	EXPECT_EQ(bad_crc, 0);
	EXPECT_EQ(bad_copy, 0);
	EXPECT_EQ(bad_guard, 0);
	return TEST_RESULT();
}

static int test_icrc_published_vectors(void)
{
	/* (a) RoCEv2 CNP captured from a ConnectX-4 Lx */
	icrc_ok("e41d2dab2bc27cfe90643b32080045c2003c718c400040119161"
		"0a0011010a001201000012b700280000" "8100ffff40000118"
		"00000000" "00000000000000000000000000000000" "82fd002a",
		0x2a00fd82);
	/* (b) UC SEND_ONLY over IPv4 (scapy) */
	icrc_ok("248a07a8fa22248a07a8fa2208004501004004784000" "4011b4d5"
		"c0a80007c0a80007c00012b7002caca2" "2460ffff000000d300cf1710"
		"4630818be28935d90e9a95505401be885e500000" "78f353f3",
		0xf353f378);
	/* self-made RC SEND_ONLY "hello" and RC ACK (docs/rocev2.md) */
	icrc_ok("020000000002020000000001" "0800" "4500003400014000401126b60a0000010a000002"
		"c00012b700200000" "0430ffff00000011" "80000064" "68656c6c6f000000" "55638a30",
		0x308a6355);
	icrc_ok("020000000002020000000001" "0800" "4500003000014000401126ba0a0000010a000002"
		"c00012b7001c0000" "1100ffff00000012" "00000064" "1f000001" "76eae82b",
		0x2be8ea76);
	return TEST_RESULT();
}

/* The ICRC gathered in (roce_icrc_fill): the same as roce_icrc over the
 * packet it leaves, whatever the pieces; a piece past the end is cut. */
static int test_icrc_fill(void)
{
	static uint8_t src[3100], a[1100], b[1100];
	uint8_t ip[20] = { 0x45, 0, 0x04, 0x30, 0, 0, 0x40, 0, 64, 17, 0, 0,
			   10, 0, 0, 1, 10, 0, 0, 2 };
	uint8_t udp[8] = { 0xc0, 0x00, 0x12, 0xb7, 0x04, 0x1c, 0, 0 };
	const size_t hdr = 28, ib_len = 1056;	/* BTH+RETH, 1024 B, pad 4 */
	uint32_t bad = 0;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 13 + 7);
	for (size_t cut = 1; cut < 1024; cut += 97) {
		struct iovec v[3] = { { src, cut }, { src + 1500, 3 },
				      { src + 2000, 1021 - cut } };

		memset(a, 0x5a, sizeof(a));
		for (size_t i = 0; i < hdr; i++)
			a[i] = (uint8_t)(0x80 + i);
		memset(a + hdr + 1024, 0, 4);	/* pad */
		memcpy(b, a, sizeof(b));
		memcpy(b + hdr, src, cut);
		memcpy(b + hdr + cut, src + 1500, 3);
		memcpy(b + hdr + cut + 3, src + 2000, 1021 - cut);
		if (roce_icrc_fill(ip, 20, udp, a, ib_len, hdr, v, 3) !=
		    roce_icrc(ip, 20, udp, b, ib_len) || memcmp(a, b, sizeof(a)))
			bad++;
	}
	EXPECT_EQ(bad, 0);
	{
		/* one piece longer than the room: cut at ib_len */
		struct iovec v = { src, 2000 };

		memset(a, 0x5a, sizeof(a));
		memcpy(b, a, sizeof(b));
		memcpy(b + hdr, src, ib_len - hdr);
		EXPECT_EQ(roce_icrc_fill(ip, 20, udp, a, ib_len, hdr, &v, 1),
			  roce_icrc(ip, 20, udp, b, ib_len));
		EXPECT_EQ(memcmp(a, b, sizeof(a)), 0);
	}
	return TEST_RESULT();
}

/* The ICRC in two parts (roce_icrc_pfx, roce_icrc_fill_from): the same
 * value as in one, IPv4 (with an ID) and IPv6, every header length, with
 * and without pieces gathered in; the BTH's masked byte still masked. */
static int test_icrc_pfx(void)
{
	static uint8_t src[1100], a[1100], b[1100];
	uint8_t ip4[20] = { 0x45, 0x1c, 0x04, 0x30, 0x12, 0x34, 0x40, 0, 64, 17,
			    0xab, 0xcd, 10, 0, 0, 1, 10, 0, 0, 2 };
	uint8_t ip6[40] = { 0x6e, 0x21, 0x23, 0x45, 0x04, 0x1c, 17, 3 };
	uint8_t udp[8] = { 0xc0, 0x00, 0x12, 0xb7, 0x04, 0x1c, 0x77, 0x88 };
	uint32_t bad = 0;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 31 + 3);
	for (size_t i = 8; i < 40; i++)
		ip6[i] = (uint8_t)(i * 7);
	for (int v6 = 0; v6 < 2; v6++) {
		const uint8_t *ip = v6 ? ip6 : ip4;
		size_t hl = v6 ? 40 : 20;
		uint32_t pfx = roce_icrc_pfx(ip, hl, udp);

		for (size_t hdr = 12; hdr <= 44; hdr += 4) {
			struct iovec v = { src, 1024 };
			size_t ib_len = hdr + 1024;

			for (size_t i = 0; i < hdr; i++)
				a[i] = (uint8_t)(0x40 + i * 3);
			memcpy(b, a, hdr);
			memcpy(b + hdr, src, 1024);
			if (roce_icrc_fill_from(pfx, a, ib_len, hdr, &v, 1) !=
			    roce_icrc(ip, hl, udp, b, ib_len) ||
			    memcmp(a, b, ib_len))
				bad++;
			if (roce_icrc_fill_from(pfx, b, ib_len, ib_len, NULL, 0) !=
			    roce_icrc(ip, hl, udp, b, ib_len))
				bad++;
			b[4] ^= 0xc0;	/* FECN, BECN: masked */
			if (roce_icrc_fill_from(pfx, b, ib_len, ib_len, NULL, 0) !=
			    roce_icrc(ip, hl, udp, a, ib_len))
				bad++;
			b[5] ^= 1;	/* the QPN: covered */
			if (roce_icrc_fill_from(pfx, b, ib_len, ib_len, NULL, 0) ==
			    roce_icrc(ip, hl, udp, a, ib_len))
				bad++;
		}
	}
	EXPECT_EQ(bad, 0);
	EXPECT_EQ(roce_icrc_pfx(ip4, 24, udp), 0);	/* no such IP header */
	return TEST_RESULT();
}

static int test_icrc_ipv6_vector(void)
{
	/* (c) the UC SEND_ONLY of (b) over IPv6: 2022::1023 -> 2023::1024,
	 * traffic class 226, flow label 0x1face, hop limit 255 */
	uint8_t ip[40] = { 0 }, udp[8], ib[64];
	size_t iblen = unhex("2460ffff000000d300cf1710"
			     "4630818be28935d90e9a95505401be885e500000", ib, sizeof(ib));
	uint32_t vtf = 6u << 28 | 226u << 20 | 0x1face;

	ip[0] = (uint8_t)(vtf >> 24);
	ip[1] = (uint8_t)(vtf >> 16);
	ip[2] = (uint8_t)(vtf >> 8);
	ip[3] = (uint8_t)vtf;
	ip[4] = 0;
	ip[5] = 44;	/* payload length */
	ip[6] = 17;
	ip[7] = 255;
	unhex("20220000000000000000000000001023", ip + 8, 16);
	unhex("20230000000000000000000000001024", ip + 24, 16);
	unhex("c00012b7002c0000", udp, 8);
	EXPECT_EQ(roce_icrc(ip, 40, udp, ib, iblen), 0x3b745b3e);
	/* the variant fields do not matter: hop limit and class change */
	ip[7] = 1;
	ip[1] = 0;
	EXPECT_EQ(roce_icrc(ip, 40, udp, ib, iblen), 0x3b745b3e);
	/* an invariant one does: the address */
	ip[39] ^= 1;
	EXPECT_NE(roce_icrc(ip, 40, udp, ib, iblen), 0x3b745b3e);
	return TEST_RESULT();
}

static int test_roundtrip_all_opcodes(void)
{
	uint8_t buf[4200], data[1027];
	int ops = 0;

	for (unsigned i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7);
	for (int op = 0; op < 256; op++) {
		uint32_t f = roce_opcode_flags((uint8_t)op);
		struct roce_pkt p = { 0 }, q;
		uint32_t len = (f & P_PAYLOAD) ? (uint32_t)(op % 5 == 0 ? 0 : 1027 - op % 4) : 0;
		int n;

		if (!f)
			continue;
		ops++;
		p.opcode = (uint8_t)op;
		p.se = op & 1;
		p.ackreq = op & 2;
		p.pkey = 0xffff;
		p.dqpn = 0xabcdef;
		p.psn = 0xfffffe;
		p.va = 0x1122334455667788ull;
		p.rkey = 0xdeadbeef;
		p.dmalen = 4096;
		p.swap_add = 5;
		p.compare = 6;
		p.syndrome = 0x1f;
		p.msn = 0x123456;
		p.orig = 77;
		p.qkey = 0x11111111;
		p.sqpn = 0x654321;
		p.imm = 0xcafef00d;
		n = roce_build(buf, sizeof(buf), &p, data, len);
		REQUIRE(n > 0);
		EXPECT_EQ(n % 4, 0);
		EXPECT_EQ(roce_parse(buf, (size_t)n, &q), 0);
		EXPECT_EQ(q.opcode, op);
		EXPECT_EQ(q.dqpn, 0xabcdef);
		EXPECT_EQ(q.psn, 0xfffffe);
		EXPECT_EQ(q.paylen, len);
		if (len)
			EXPECT_TRUE(!memcmp(q.payload, data, len));
		if (f & (H_RETH | H_ATMETH)) {
			EXPECT_EQ(q.va, p.va);
			EXPECT_EQ(q.rkey, p.rkey);
		}
		if (f & H_AETH)
			EXPECT_EQ(q.msn, 0x123456);
		if (f & H_DETH)
			EXPECT_EQ(q.sqpn, 0x654321);
		if (f & (H_IMM | H_IETH))
			EXPECT_EQ(q.imm, 0xcafef00d);
		/* every truncation is refused, never read past */
		for (int cut = 0; cut < n; cut++) {
			uint8_t *t = malloc((size_t)cut + 1);

			memcpy(t, buf, (size_t)cut);
			if (roce_parse(t, (size_t)cut, &q) == 0 &&
			    (cut < (int)roce_hdr_len((uint8_t)op) + 4))
				harness_fail(__FILE__, __LINE__, "truncated", "op %x len %d accepted", op, cut);
			free(t);
		}
	}
	EXPECT_EQ(ops, 23 + 12 + 2 + 1);	/* RC, UC, UD, CNP */
	return TEST_RESULT();
}

static int test_parse_refuses(void)
{
	uint8_t buf[64] = { 0 };
	struct roce_pkt p;

	/* unknown opcode, RD, UC READ */
	buf[0] = 0x15;
	EXPECT_EQ(roce_parse(buf, 40, &p), -EBADMSG);
	buf[0] = 0x44;
	EXPECT_EQ(roce_parse(buf, 40, &p), -EBADMSG);
	buf[0] = 0x2c;
	EXPECT_EQ(roce_parse(buf, 40, &p), -EBADMSG);
	/* TVer != 0 */
	buf[0] = 0x04;
	buf[1] = 0x01;
	EXPECT_EQ(roce_parse(buf, 20, &p), -EBADMSG);
	/* pad larger than the payload */
	buf[1] = 0x30;
	EXPECT_EQ(roce_parse(buf, 12 + 2 + 4, &p), -EBADMSG);
	EXPECT_EQ(roce_parse(buf, 12 + 3 + 4, &p), -EBADMSG); /* not word aligned */
	EXPECT_EQ(roce_parse(buf, 12 + 4 + 4, &p), 0);
	EXPECT_EQ(p.paylen, 1);
	/* an ACK carries no payload */
	buf[0] = 0x11;
	buf[1] = 0;
	EXPECT_EQ(roce_parse(buf, 16 + 4, &p), 0);
	EXPECT_EQ(roce_parse(buf, 16 + 4 + 4, &p), -EBADMSG);
	EXPECT_EQ(roce_parse(buf, 3, &p), -EBADMSG);
	return TEST_RESULT();
}

static int test_psn_arithmetic(void)
{
	EXPECT_EQ(psn_add(0xffffff, 1), 0);
	EXPECT_EQ(psn_add(0xfffff0, 0x20), 0x10);
	EXPECT_TRUE(psn_cmp(0, 0xffffff) > 0);	/* 0 comes after 0xffffff */
	EXPECT_TRUE(psn_cmp(0xffffff, 0) < 0);
	EXPECT_TRUE(psn_cmp(5, 5) == 0);
	EXPECT_TRUE(psn_cmp(0x7fffff, 0) > 0);	/* half the space ahead */
	EXPECT_TRUE(psn_cmp(0x800001, 0) < 0);	/* beyond half: behind */
	return TEST_RESULT();
}

/* A CNP as roce_build makes it is the one a ConnectX-4 Lx sent (the
 * capture of test_icrc_published_vectors, its IB transport part), and
 * parses back as a CNP for its QP with BECN set. */
static int test_cnp(void)
{
	uint8_t want[64], buf[64];
	size_t n = unhex("8100ffff40000118" "00000000"
			 "00000000000000000000000000000000", want, sizeof(want));
	struct roce_pkt p = { .opcode = ROCE_CNP | OP_CNP, .pkey = 0xffff,
			      .dqpn = 0x118, .becn = true }, q;
	int b = roce_build(buf, sizeof(buf), &p, NULL, 0);

	REQUIRE(b == (int)n + ROCE_ICRC_LEN);
	EXPECT_TRUE(!memcmp(buf, want, n));
	EXPECT_EQ(roce_parse(buf, (size_t)b, &q), 0);
	EXPECT_EQ(roce_opcode_flags(q.opcode) & P_CNP, P_CNP);
	EXPECT_EQ(q.dqpn, 0x118);
	EXPECT_TRUE(q.becn);
	EXPECT_EQ(strcmp(roce_opcode_name(q.opcode), "CNP"), 0);
	/* no other operation of the CNP transport */
	EXPECT_EQ(roce_opcode_flags(ROCE_CNP | OP_SEND_ONLY), 0);
	return TEST_RESULT();
}

/* A NAK with a SACK (selective repeat between ursa peers): built, parsed
 * back bit for bit; the SR bit of a request leaves the ICRC as it was; a
 * SACK whose length disagrees with its count, one without the SR bit, and
 * a payload on a plain ACK are refused. */
static int test_sack(void)
{
	uint8_t buf[512], bits[8] = { 0x05, 0, 0, 0x80 };	/* PSN +1, +3, +32 */
	uint8_t sack[4 + 8] = { 0, 32 };
	struct roce_pkt p = { .opcode = ROCE_RC | OP_ACK, .pkey = 0xffff,
			      .dqpn = 0x12, .psn = 0x100, .sr = true,
			      .syndrome = AETH_NAK_PSN, .msn = 7 }, q;
	const uint8_t *got;
	unsigned n;
	int b;

	memcpy(sack + 4, bits, 4);
	EXPECT_EQ(roce_sack_len(32), 8u);
	b = roce_build(buf, sizeof(buf), &p, sack, roce_sack_len(32));
	REQUIRE(b == ROCE_BTH_LEN + 4 + 8 + ROCE_ICRC_LEN);
	EXPECT_EQ(buf[4], ROCE_BTH4_SR);
	REQUIRE(roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_TRUE(q.sr);
	EXPECT_EQ(q.psn, 0x100u);
	REQUIRE(roce_sack_parse(&q, &got, &n) == 0);
	EXPECT_EQ(n, 32u);
	EXPECT_TRUE(!memcmp(got, bits, 4));
	/* a count that needs more words than the packet has */
	buf[ROCE_BTH_LEN + 4 + 1] = 33;
	REQUIRE(roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_EQ(roce_sack_parse(&q, &got, &n), -EBADMSG);
	/* without the SR bit a body on an ACK is malformed */
	buf[4] = 0;
	EXPECT_EQ(roce_parse(buf, (size_t)b, &q), -EBADMSG);
	/* a plain ACK (no SACK) parses, and has none */
	p.sr = false;
	b = roce_build(buf, sizeof(buf), &p, NULL, 0);
	REQUIRE(b > 0 && roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_EQ(roce_sack_parse(&q, &got, &n), -EBADMSG);
	/* byte 4 is masked in the ICRC: the SR bit changes no ICRC */
	{
		uint8_t ip[20] = { 0x45 }, udp[8] = { 0 }, w[64];
		struct roce_pkt r = { .opcode = ROCE_RC | OP_WRITE_ONLY,
				      .pkey = 0xffff, .dqpn = 3, .psn = 9,
				      .dmalen = 4 };
		uint32_t c0, c1;

		b = roce_build(w, sizeof(w), &r, "abcd", 4);
		REQUIRE(b > 0);
		c0 = roce_icrc(ip, 20, udp, w, (size_t)b - 4);
		w[4] |= ROCE_BTH4_SR;
		c1 = roce_icrc(ip, 20, udp, w, (size_t)b - 4);
		EXPECT_EQ(c0, c1);
		REQUIRE(roce_parse(w, (size_t)b, &q) == 0);
		EXPECT_TRUE(q.sr);
	}
	return TEST_RESULT();
}

/* Wide packets (ursa's extension on the SR bit's byte): the code says
 * bytes in 64-byte steps above 1024, an ACK carries it and parses it back,
 * it goes only with the SR bit, and it changes no ICRC (byte 4 is masked). */
static int test_wide(void)
{
	uint8_t buf[64], ip[20] = { 0x45 }, udp[8] = { 0 };
	struct roce_pkt p = { .opcode = ROCE_RC | OP_ACK, .pkey = 0xffff,
			      .dqpn = 0x12, .psn = 0x100, .sr = true,
			      .syndrome = AETH_ACK | AETH_CREDIT_INVALID }, q;
	uint32_t c0, c1;
	int b;

	EXPECT_EQ(roce_wide_code(1024), 0);
	EXPECT_EQ(roce_wide_code(1408), 6);
	EXPECT_EQ(roce_wide_bytes(6), 1408u);
	EXPECT_EQ(roce_wide_bytes(0), 0u);
	EXPECT_EQ(roce_wide_code(100000), 31);	/* (at most what 5 bits say) */
	EXPECT_EQ(roce_wide_bytes(31), ROCE_WIDE_MAX);
	p.wide = roce_wide_code(1408);
	b = roce_build(buf, sizeof(buf), &p, NULL, 0);
	REQUIRE(b == ROCE_BTH_LEN + 4 + ROCE_ICRC_LEN);
	EXPECT_EQ(buf[4], ROCE_BTH4_SR | 6 << ROCE_BTH4_WIDE_SHIFT);
	REQUIRE(roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_TRUE(q.sr);
	EXPECT_EQ(q.wide, 6);
	EXPECT_EQ(roce_wide_bytes(q.wide), 1408u);
	c0 = roce_icrc(ip, 20, udp, buf, (size_t)b - 4);
	buf[4] = 0;
	c1 = roce_icrc(ip, 20, udp, buf, (size_t)b - 4);
	EXPECT_EQ(c0, c1);
	REQUIRE(roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_EQ(q.wide, 0);
	/* the bits mean nothing without the SR bit (a NIC's reserved bits) */
	buf[4] = 6 << ROCE_BTH4_WIDE_SHIFT;
	REQUIRE(roce_parse(buf, (size_t)b, &q) == 0);
	EXPECT_TRUE(!q.sr);
	EXPECT_EQ(q.wide, 0);
	return TEST_RESULT();
}

static const struct test tests[] = {
	TEST_ENTRY(icrc_published_vectors, "ICRC of captured and published packets"),
	TEST_ENTRY(icrc_v4_id_solve, "any IPv4 ID recovered from the ICRC, damage refused"),
	TEST_ENTRY(crc_methods_agree, "CRC-32 by PCLMULQDQ and by tables agree"),
	TEST_ENTRY(crc_copy, "CRC-32 while copying: same register, same bytes"),
	TEST_ENTRY(icrc_fill, "ICRC with the payload gathered in: as roce_icrc"),
	TEST_ENTRY(icrc_pfx, "ICRC in two parts, pseudo-headers first: as in one"),
	TEST_ENTRY(icrc_v4_id_delta, "ICRC with an IPv4 ID: ID 0 xor a linear delta"),
	TEST_ENTRY(icrc_ipv6_vector, "ICRC over IPv6 with the variant-field masks"),
	TEST_ENTRY(roundtrip_all_opcodes, "every opcode builds, parses, refuses truncation"),
	TEST_ENTRY(parse_refuses, "malformed packets are refused"),
	TEST_ENTRY(psn_arithmetic, "24-bit PSN wrap"),
	TEST_ENTRY(cnp, "a CNP as NICs send it, built and parsed"),
	TEST_ENTRY(sack, "a NAK with a SACK built and parsed, malformed ones refused"),
	TEST_ENTRY(wide, "wide packets' size code: built, parsed, only with SR, not in the ICRC"),
};

int main(int argc, char **argv)
{
	return harness_main(tests, (int)(sizeof(tests) / sizeof(tests[0])), argc, argv);
}
