/* SPDX-License-Identifier: MIT */
/*
 * cm.h - the InfiniBand Communication Manager's messages (IBTA vol. 1,
 * chapter 12) as rdma_cm sends them on RoCEv2: MADs of class 0x07 on QP1,
 * with rdma_cm's 36-byte header at the front of a REQ's or SIDR_REQ's
 * private data.
 *
 * Pure code like roce.h: a MAD (256 bytes) is parsed into a struct cm_msg
 * or built from one; nothing else. The layouts are those of IBTA tables
 * 106-120 (docs: ../shared/docs/rdma-cm.md section 2). The parser checks
 * the MAD header (base version 1, class 0x07, class version 2, method
 * Send), takes only the fields of the message's attribute and returns
 * -EBADMSG for anything else.
 *
 * Also here: how a received MAD is routed to the process that owns its
 * destination (cm_route), and the message that carries it there over an
 * abstract UNIX socket (struct cm_fwd), because both libibverbs' receive
 * path and librdmacm use them.
 */
#ifndef URSA_PROTO_CM_H
#define URSA_PROTO_CM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#define CM_MAD_LEN 256
#define CM_HDR_LEN 24			/* common MAD header */
#define CM_QP1_QKEY 0x80010000u		/* IB_QP1_QKEY */
#define CM_UDP_QKEY 0x01234567u		/* RDMA_UDP_QKEY */
#define CM_CLASS 0x07
#define CM_CLASS_VERSION 2
#define CM_METHOD_SEND 0x03
#define CMA_HDR_LEN 36			/* rdma_cm's header in REQ private data */

enum cm_attr {
	CM_REQ = 0x0010, CM_MRA = 0x0011, CM_REJ = 0x0012, CM_REP = 0x0013,
	CM_RTU = 0x0014, CM_DREQ = 0x0015, CM_DREP = 0x0016,
	CM_SIDR_REQ = 0x0017, CM_SIDR_REP = 0x0018,
};

/* Private data room per message (IBTA 12.6; ib_cm_data_size) */
enum {
	CM_REQ_PRIV = 92, CM_MRA_PRIV = 222, CM_REJ_PRIV = 148,
	CM_REP_PRIV = 196, CM_RTU_PRIV = 224, CM_DREQ_PRIV = 220,
	CM_DREP_PRIV = 224, CM_SIDR_REQ_PRIV = 216, CM_SIDR_REP_PRIV = 136,
	CM_PRIV_MAX = 224,
};

/* REJ reasons (IBTA table 112) and SIDR_REP status (table 120) used here */
enum {
	CM_REJ_INVALID_COMM_ID = 2, CM_REJ_TIMEOUT = 4,
	CM_REJ_INVALID_SID = 8, CM_REJ_STALE_CONN = 10,
	CM_REJ_CONSUMER = 28, CM_REJ_VENDOR_OPTION = 35,
};
enum { CM_SIDR_OK = 0, CM_SIDR_UNSUPPORTED = 1, CM_SIDR_REJECT = 2 };
/* MessageRejected / MessageMRAed */
enum { CM_MSG_REQ = 0, CM_MSG_REP = 1, CM_MSG_OTHER = 2 };

/*
 * One CM message, decoded. Which fields mean something depends on attr;
 * the builder writes those of attr and zeroes the rest of the MAD.
 */
struct cm_msg {
	uint16_t attr;
	uint64_t tid;
	uint32_t attr_mod;		/* ECE options (REQ, REP) */
	uint32_t local_id, remote_id;	/* comm IDs; SIDR: local_id = RequestID */
	uint64_t sid;			/* REQ, SIDR_REQ, SIDR_REP */
	uint64_t guid;			/* local CA GUID (REQ, REP) */
	uint32_t qkey;			/* REQ (0), SIDR_REP */
	uint32_t qpn;			/* REQ, REP, SIDR_REP; DREQ: remote QPN */
	uint32_t psn;			/* starting PSN (REQ, REP) */
	uint32_t vendor_id;		/* ECE (REQ, REP) */
	uint8_t resp_res, init_depth;
	uint8_t remote_cm_timeout, local_cm_timeout, max_cm_retries;
	uint8_t transport;		/* 0 RC, 1 UC */
	uint8_t flow_ctl, retry, rnr_retry, mtu, srq;
	uint8_t target_ack_delay;	/* REP */
	uint16_t pkey;
	uint8_t sgid[16], dgid[16];	/* REQ primary path: local, remote */
	uint32_t flow_label;
	uint8_t tclass, hop_limit, sl, subnet_local, ack_timeout;
	uint8_t msg;			/* REJ: MessageRejected, MRA: MRAed */
	uint16_t reason;		/* REJ */
	uint8_t service_timeout;	/* MRA */
	uint8_t status;			/* SIDR_REP */
	uint8_t ari_len;		/* REJ ARI, SIDR_REP AddInfo */
	uint8_t ari[72];
	uint8_t priv_len;		/* room taken, at most the message's */
	uint8_t priv[CM_PRIV_MAX];
};

/* Parse a 256-byte MAD. 0, or -EBADMSG (bad header, unknown attribute). */
int cm_parse(const uint8_t *mad, size_t len, struct cm_msg *m);
/* Build m into mad (256 bytes). 0, or -EINVAL (private data too long,
 * unknown attribute). */
int cm_build(uint8_t mad[CM_MAD_LEN], const struct cm_msg *m);
/* The private data room of a message type (0 for unknown ones). */
unsigned cm_priv_room(uint16_t attr);

/*
 * rdma_cm's header (cma.c struct cma_hdr): version 0, IP version, the
 * active side's port, source and destination addresses (IPv4 in the last
 * four bytes of the 16, after 12 zero bytes; IPv6 as is).
 */
struct cma_hdr {
	uint8_t ipver;			/* 4 or 6 */
	uint16_t port;
	uint8_t src[16], dst[16];
};
void cma_hdr_put(uint8_t p[CMA_HDR_LEN], const struct cma_hdr *h);
/* 0, or -EBADMSG (version not 0, IP version neither 4 nor 6) */
int cma_hdr_get(const uint8_t p[CMA_HDR_LEN], struct cma_hdr *h);

/* Service ID of an rdma_cm port space and port: (ps << 16) + port. */
static inline uint64_t cm_sid(uint16_t ps, uint16_t port)
{
	return ((uint64_t)ps << 16) | port;
}

/*
 * Where a received CM message goes: REQ and SIDR_REQ to the owner of the
 * service ID (*key = the SID, *by_sid), everything else to the owner of
 * the comm ID it names as ours (*key = RemoteCommID, or a SIDR_REP's
 * RequestID).
 */
void cm_route(const struct cm_msg *m, uint64_t *key, bool *by_sid);
/* The abstract socket address of a route's owner: "ursa/cm/s/<sid>" or
 * "ursa/cm/c/<comm id>" after the leading NUL. Returns its length. */
socklen_t cm_route_addr(struct sockaddr_un *sa, uint64_t key, bool by_sid);

/*
 * What should answer a message nobody owns (IBTA 12.6 and the kernel's
 * cm.c): a REQ gets REJ "invalid service ID", a SIDR_REQ a SIDR_REP
 * "unsupported", a REP REJ "invalid comm ID", a DREQ a DREP (12.9.8.4:
 * DREQ for an unknown connection). Fills *out and returns true, or false
 * when nothing answers (the message is dropped).
 */
bool cm_orphan_reply(const struct cm_msg *in, struct cm_msg *out);

/*
 * A received CM MAD on its way from the process whose RoCEv2 socket took
 * it to the process that owns its destination (an abstract datagram
 * socket named by cm_route_name). Addresses are GIDs as they were on the
 * wire; the receiver trusts nothing in it beyond what a packet from that
 * address could claim.
 */
#define CM_FWD_MAGIC 0x7572636du	/* "urcm" */
struct cm_fwd {
	uint32_t magic;
	uint16_t sport;			/* UDP source port of the packet */
	uint8_t tclass, hop;
	uint8_t src[16], dst[16];
	uint8_t mad[CM_MAD_LEN];
};

/*
 * `ursa cm` asks the owner of a CM socket what it holds: a datagram of
 * the 4-byte query magic, answered (to the asker's own address, and only
 * if it is the owner's user or root) with a struct cm_info.
 */
#define CM_QUERY_MAGIC 0x75726371u	/* "urcq" */
#define CM_INFO_MAGIC 0x75726369u	/* "urci" */
struct cm_info {
	uint32_t magic;
	int32_t pid;
	uint32_t local_id, remote_id;	/* comm IDs (0: none yet) */
	uint32_t qpn, rqpn;		/* the id's QP, the peer's */
	uint16_t ps, port;		/* port space, port (host order) */
	char state[16];
	uint8_t src[16], dst[16];	/* GIDs (a listener: its bound one) */
	uint32_t mads_rx, mads_tx;	/* the owner process's CM: taken, sent */
	uint32_t refused;		/* MADs from untrusted users dropped */
};

/* IB CM time encoding 4.096 us * 2^t, in ms as the kernel rounds it */
static inline unsigned cm_ms(unsigned t)
{
	return 1u << (t > 8 ? (t > 31 ? 23 : t - 8) : 0);
}

#endif
