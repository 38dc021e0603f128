// SPDX-License-Identifier: MIT
/*
 * cm.c - the CM MAD codec (src/proto/cm.c): every message builds and
 * parses back to itself, fields land at the IBTA offsets, rdma_cm's
 * header round-trips, bad headers are refused, orphans get the kernel's
 * answers.
 */
#include "../harness.h"
#include "../../src/proto/cm.h"

static int test_req_offsets_and_roundtrip(void)
{
	struct cm_msg m = { .attr = CM_REQ, .tid = 0x1122334455667788ull,
			    .local_id = 0xa1b2c3d4, .sid = 0x0000000001061c06ull,
			    .guid = 0x0102030405060708ull, .qpn = 0xabcdef,
			    .resp_res = 4, .init_depth = 3, .remote_cm_timeout = 20,
			    .local_cm_timeout = 20, .psn = 0x123456, .retry = 7,
			    .rnr_retry = 6, .pkey = 0xffff, .mtu = 3,
			    .max_cm_retries = 15, .hop_limit = 64, .tclass = 0x28,
			    .ack_timeout = 14, .flow_label = 0xabcde };
	struct cm_msg p;
	uint8_t mad[CM_MAD_LEN];
	uint8_t *b = mad + CM_HDR_LEN;

	m.priv_len = 5;
	memcpy(m.priv, "abcde", 5);
	REQUIRE(!cm_build(mad, &m));
	EXPECT_EQ(mad[1], 0x07);
	EXPECT_EQ(mad[2], 2);
	EXPECT_EQ(mad[3], 0x03);
	EXPECT_EQ(mad[16] << 8 | mad[17], 0x0010);
	EXPECT_EQ(b[8 + 6], 0x1c);	/* SID at body 8 (rping's 7174) */
	EXPECT_EQ(b[8 + 7], 0x06);
	EXPECT_EQ(b[32] << 16 | b[33] << 8 | b[34], 0xabcdef);
	EXPECT_EQ(b[35], 4);
	EXPECT_EQ(b[43] >> 3, 20);
	EXPECT_EQ(b[47] & 7, 7);
	EXPECT_EQ(b[50] >> 4, 3);
	EXPECT_EQ(b[52], 0xff);	/* routed: LIDs 0xFFFF */
	EXPECT_EQ(b[92], 0x28);
	EXPECT_TRUE(!memcmp(b + 140, "abcde", 5));
	REQUIRE(!cm_parse(mad, sizeof(mad), &p));
	EXPECT_EQ(p.tid, m.tid);
	EXPECT_EQ(p.local_id, m.local_id);
	EXPECT_EQ(p.sid, m.sid);
	EXPECT_EQ(p.guid, m.guid);
	EXPECT_EQ(p.qpn, m.qpn);
	EXPECT_EQ(p.psn, m.psn);
	EXPECT_EQ(p.resp_res, 4);
	EXPECT_EQ(p.init_depth, 3);
	EXPECT_EQ(p.rnr_retry, 6);
	EXPECT_EQ(p.mtu, 3);
	EXPECT_EQ(p.max_cm_retries, 15);
	EXPECT_EQ(p.ack_timeout, 14);
	EXPECT_EQ(p.flow_label, 0xabcde);
	EXPECT_EQ(p.priv_len, CM_REQ_PRIV);
	/* too much private data is refused */
	m.priv_len = CM_REQ_PRIV + 1;
	EXPECT_EQ(cm_build(mad, &m), -EINVAL);
	return TEST_PASS;
}

static int test_every_message_roundtrips(void)
{
	static const uint16_t attrs[] = { CM_REP, CM_RTU, CM_REJ, CM_MRA,
					  CM_DREQ, CM_DREP, CM_SIDR_REQ,
					  CM_SIDR_REP };

	for (unsigned i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
		struct cm_msg m = { .attr = attrs[i], .local_id = 0x11223344,
				    .remote_id = 0x55667788, .qpn = 0x123456,
				    .reason = 28, .status = 2, .sid = 0x1110001,
				    .qkey = CM_UDP_QKEY, .msg = CM_MSG_REP,
				    .psn = 0x654321, .rnr_retry = 5 }, p;
		uint8_t mad[CM_MAD_LEN];

		m.priv_len = (uint8_t)cm_priv_room(m.attr);
		memset(m.priv, 0x5a, m.priv_len);
		REQUIRE(!cm_build(mad, &m));
		REQUIRE(!cm_parse(mad, sizeof(mad), &p));
		EXPECT_EQ(p.attr, m.attr);
		EXPECT_EQ(p.local_id, m.local_id);
		if (m.attr != CM_SIDR_REQ && m.attr != CM_SIDR_REP)
			EXPECT_EQ(p.remote_id, m.remote_id);
		if (m.attr == CM_REJ)
			EXPECT_EQ(p.reason, 28);
		if (m.attr == CM_REP || m.attr == CM_DREQ || m.attr == CM_SIDR_REP)
			EXPECT_EQ(p.qpn, m.qpn);
		if (m.attr == CM_SIDR_REP) {
			EXPECT_EQ(p.status, 2);
			EXPECT_EQ(p.qkey, CM_UDP_QKEY);
		}
		EXPECT_EQ(p.priv_len, m.priv_len);
		EXPECT_TRUE(!memcmp(p.priv, m.priv, m.priv_len));
	}
	return TEST_PASS;
}

static int test_bad_headers_refused(void)
{
	struct cm_msg m = { .attr = CM_RTU }, p;
	uint8_t mad[CM_MAD_LEN];

	REQUIRE(!cm_build(mad, &m));
	EXPECT_EQ(cm_parse(mad, CM_MAD_LEN - 1, &p), -EBADMSG);
	mad[2] = 1;			/* class version */
	EXPECT_EQ(cm_parse(mad, CM_MAD_LEN, &p), -EBADMSG);
	mad[2] = 2;
	mad[3] = 0x01;			/* Get, not Send */
	EXPECT_EQ(cm_parse(mad, CM_MAD_LEN, &p), -EBADMSG);
	mad[3] = 0x03;
	mad[17] = 0x30;			/* no such attribute */
	EXPECT_EQ(cm_parse(mad, CM_MAD_LEN, &p), -EBADMSG);
	/* a REJ's ARI length beyond 72 bytes */
	m.attr = CM_REJ;
	REQUIRE(!cm_build(mad, &m));
	mad[CM_HDR_LEN + 9] = 0x7f << 1;
	EXPECT_EQ(cm_parse(mad, CM_MAD_LEN, &p), -EBADMSG);
	return TEST_PASS;
}

static int test_cma_header_and_routes(void)
{
	struct cma_hdr h = { .ipver = 4, .port = 0xbeef }, g;
	uint8_t b[CMA_HDR_LEN];
	struct cm_msg req = { .attr = CM_REQ, .local_id = 7, .sid = 0x1060001 },
		      rep = { .attr = CM_REP, .remote_id = 9 }, r;
	uint8_t mad[CM_MAD_LEN];
	uint64_t key;
	bool by_sid;
	struct sockaddr_un sa;
	socklen_t sl;

	h.src[10] = h.src[11] = h.dst[10] = h.dst[11] = 0xff;
	h.src[15] = 1;
	h.dst[15] = 2;
	cma_hdr_put(b, &h);
	EXPECT_EQ(b[1], 0x40);
	EXPECT_EQ(b[19], 1);		/* IPv4 at the end of the 16 */
	EXPECT_EQ(b[4], 0);		/* not ::ffff:-mapped */
	REQUIRE(!cma_hdr_get(b, &g));
	EXPECT_EQ(g.ipver, 4);
	EXPECT_EQ(g.port, 0xbeef);
	EXPECT_TRUE(!memcmp(g.src, h.src, 16) && !memcmp(g.dst, h.dst, 16));
	b[0] = 1;			/* cma version */
	EXPECT_EQ(cma_hdr_get(b, &g), -EBADMSG);
	REQUIRE(!cm_build(mad, &req));
	REQUIRE(!cm_parse(mad, CM_MAD_LEN, &r));
	cm_route(&r, &key, &by_sid);
	EXPECT_TRUE(by_sid);
	EXPECT_EQ(key, 0x1060001);
	sl = cm_route_addr(&sa, key, by_sid);
	EXPECT_EQ(sa.sun_path[0], 0);		/* abstract */
	EXPECT_TRUE(!strcmp(sa.sun_path + 1, "ursa/cm/s/0000000001060001"));
	EXPECT_EQ(sl, offsetof(struct sockaddr_un, sun_path) + 1 + 26);
	REQUIRE(!cm_build(mad, &rep));
	REQUIRE(!cm_parse(mad, CM_MAD_LEN, &r));
	cm_route(&r, &key, &by_sid);
	EXPECT_TRUE(!by_sid);
	EXPECT_EQ(key, 9);
	/* no listener: REJ 8 naming the requester; REP: REJ 2; DREQ: DREP */
	EXPECT_TRUE(cm_orphan_reply(&req, &r));
	EXPECT_EQ(r.attr, CM_REJ);
	EXPECT_EQ(r.reason, CM_REJ_INVALID_SID);
	EXPECT_EQ(r.remote_id, 7);
	EXPECT_EQ(r.local_id, 0);
	EXPECT_TRUE(cm_orphan_reply(&rep, &r));
	EXPECT_EQ(r.reason, CM_REJ_INVALID_COMM_ID);
	rep.attr = CM_DREQ;
	EXPECT_TRUE(cm_orphan_reply(&rep, &r));
	EXPECT_EQ(r.attr, CM_DREP);
	rep.attr = CM_RTU;
	EXPECT_TRUE(!cm_orphan_reply(&rep, &r));
	return TEST_PASS;
}

int main(int argc, char **argv)
{
	static const struct test tests[] = {
		TEST_ENTRY(req_offsets_and_roundtrip, "REQ fields at IBTA offsets"),
		TEST_ENTRY(every_message_roundtrips, "build/parse for each message"),
		TEST_ENTRY(bad_headers_refused, "short, wrong class version/method/attr"),
		TEST_ENTRY(cma_header_and_routes, "rdma_cm header, routing, orphans"),
	};

	return harness_main(tests, sizeof(tests) / sizeof(tests[0]), argc, argv);
}
