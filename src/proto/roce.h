/* SPDX-License-Identifier: MIT */
/*
 * roce.h - RoCEv2 wire format: InfiniBand transport headers (IBTA vol. 1,
 * chapter 9), the opcode table, the ICRC (IBTA 7.8 with the RoCEv2 masks of
 * annex A17) and 24-bit PSN arithmetic.
 *
 * Pure functions over byte buffers: no I/O, no allocation, no global state,
 * so they are unit-tested against published packets and fuzzed. Everything
 * a parser reads is bounds-checked against the length it was given; a packet
 * that does not fit its opcode's layout is rejected, never read past.
 */
#ifndef URSA_PROTO_ROCE_H
#define URSA_PROTO_ROCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define ROCE_UDP_PORT 4791
#define ROCE_BTH_LEN 12
#define ROCE_ICRC_LEN 4
#define ROCE_DEFAULT_PKEY 0xffff

/* Opcode: bits 7-5 transport, bits 4-0 operation (IBTA table 35). */
enum {
	ROCE_RC = 0x00, ROCE_UC = 0x20, ROCE_UD = 0x60,
	ROCE_CNP = 0x80,	/* congestion notification (annex A17) */
};
enum {
	OP_SEND_FIRST = 0x00, OP_SEND_MIDDLE = 0x01, OP_SEND_LAST = 0x02,
	OP_SEND_LAST_IMM = 0x03, OP_SEND_ONLY = 0x04, OP_SEND_ONLY_IMM = 0x05,
	OP_WRITE_FIRST = 0x06, OP_WRITE_MIDDLE = 0x07, OP_WRITE_LAST = 0x08,
	OP_WRITE_LAST_IMM = 0x09, OP_WRITE_ONLY = 0x0a, OP_WRITE_ONLY_IMM = 0x0b,
	OP_READ_REQ = 0x0c, OP_READ_RESP_FIRST = 0x0d, OP_READ_RESP_MIDDLE = 0x0e,
	OP_READ_RESP_LAST = 0x0f, OP_READ_RESP_ONLY = 0x10, OP_ACK = 0x11,
	OP_ATOMIC_ACK = 0x12, OP_CMP_SWAP = 0x13, OP_FETCH_ADD = 0x14,
	OP_SEND_LAST_INV = 0x16, OP_SEND_ONLY_INV = 0x17,
	OP_CNP = 0x01,		/* with ROCE_CNP: opcode 0x81 */
};

/* Which headers follow the BTH, and what the opcode means. */
enum {
	H_RETH = 1 << 0, H_AETH = 1 << 1, H_ATMETH = 1 << 2, H_ATMACK = 1 << 3,
	H_IMM = 1 << 4, H_IETH = 1 << 5, H_DETH = 1 << 6,
	/* properties */
	P_PAYLOAD = 1 << 8, P_FIRST = 1 << 9, P_MIDDLE = 1 << 10,
	P_LAST = 1 << 11, P_REQ = 1 << 12, P_RESP = 1 << 13,
	P_SEND = 1 << 14, P_WRITE = 1 << 15, P_READ = 1 << 16,
	P_ATOMIC = 1 << 17,
	/* a CNP: BTH (BECN set, P_Key 0xffff, DestQP the QP to slow down,
	 * PSN 0), then 16 reserved bytes (H_CNPRSV), no payload */
	P_CNP = 1 << 18, H_CNPRSV = 1 << 19,
};

/* Flags of an opcode, 0 if the opcode is unknown or not valid. */
uint32_t roce_opcode_flags(uint8_t opcode);
/* Header length from BTH up to the payload, or 0 if unknown. */
unsigned roce_hdr_len(uint8_t opcode);

/* The BTH (IBTA 9.2) as roce_build writes it; for a sender that builds a
 * message's middle packets (a BTH, then the payload) itself. */
static inline void roce_bth_put(uint8_t *b, uint8_t opcode, bool se, bool mig,
				uint8_t pad, uint16_t pkey, uint32_t dqpn,
				bool ackreq, uint32_t psn)
{
	b[0] = opcode;
	b[1] = (uint8_t)((se ? 0x80 : 0) | (mig ? 0x40 : 0) | pad << 4);
	b[2] = (uint8_t)(pkey >> 8);
	b[3] = (uint8_t)pkey;
	b[4] = 0;
	b[5] = (uint8_t)(dqpn >> 16);
	b[6] = (uint8_t)(dqpn >> 8);
	b[7] = (uint8_t)dqpn;
	b[8] = ackreq ? 0x80 : 0;
	b[9] = (uint8_t)(psn >> 16);
	b[10] = (uint8_t)(psn >> 8);
	b[11] = (uint8_t)psn;
}
const char *roce_opcode_name(uint8_t opcode);

/*
 * Selective repeat, ursa's extension between ursa peers. A requester that
 * can resend single packets sets ROCE_BTH4_SR, a reserved bit of the BTH's
 * fifth byte (resv6a, IBTA 9.2: ignored by receivers, and masked in the
 * ICRC with FECN and BECN, so rxe and NICs take such packets as they are).
 * A responder that holds out-of-order packets for such a requester answers
 * a gap with a PSN-sequence NAK carrying a SACK after its AETH (with the
 * bit set too): a 4-byte header (the number of bits, 16 bits, then zero)
 * and the bitmap, padded to whole 32-bit words, bit i (byte i / 8, bit
 * i % 8) telling whether PSN nak.psn + 1 + i arrived. Never sent to a
 * requester that did not set the bit.
 */
#define ROCE_BTH4_SR 0x01
/*
 * Wide packets, ursa's other extension, on the same byte: with the SR bit,
 * bits 1-5 say how large a request payload the packet's sender takes, in
 * steps of 64 bytes above 1024 (0: the path MTU only). A responder's
 * answers carry it, and a requester that has seen it sends its WRITEs and
 * SENDs in packets of up to that size (at most what its own link carries)
 * where the IBTA path MTU would cut them at 1024 bytes: a 1500-byte link
 * carries 1408, and the per-packet costs of the path, most of a RoCEv2
 * stream's CPU, fall by a quarter. A READ request's code is the size the
 * requester wants its responses cut at. Never sent by, nor to, a peer that
 * did not set the SR bit (rxe, NICs).
 */
#define ROCE_BTH4_WIDE_SHIFT 1
#define ROCE_WIDE_BASE 1024u
#define ROCE_WIDE_STEP 64u
#define ROCE_WIDE_MAX (ROCE_WIDE_BASE + 31 * ROCE_WIDE_STEP)
/* A WRITE or SEND request's longest headers (BTH, RETH and ImmDt: WRITE
 * Only with Immediate) and ICRC: a wide packet's UDP payload past its own */
#define ROCE_WIDE_HDRS (12 + 16 + 4 + 4)
static inline uint32_t roce_wide_bytes(uint8_t code)
{
	return code ? ROCE_WIDE_BASE + (code & 31u) * ROCE_WIDE_STEP : 0;
}
static inline uint8_t roce_wide_code(uint32_t bytes)
{
	if (bytes <= ROCE_WIDE_BASE)
		return 0;
	bytes = bytes > ROCE_WIDE_MAX ? ROCE_WIDE_MAX : bytes;
	return (uint8_t)((bytes - ROCE_WIDE_BASE) / ROCE_WIDE_STEP);
}
#define ROCE_SACK_MAX_BITS 2048
static inline unsigned roce_sack_len(unsigned nbits)
{
	return 4 + (nbits + 31) / 32 * 4;
}

/* AETH syndrome (IBTA 9.3.5, table 42). */
enum {
	AETH_ACK = 0x00, AETH_RNR = 0x20, AETH_NAK = 0x60,
	AETH_NAK_PSN = 0x60, AETH_NAK_INV = 0x61, AETH_NAK_ACCESS = 0x62,
	AETH_NAK_OP = 0x63,
	AETH_TYPE_MASK = 0x60,
	AETH_CREDIT_INVALID = 0x1f,
};

/* A parsed (or to-be-built) packet. */
struct roce_pkt {
	uint8_t opcode;
	bool se, mig, ackreq;
	bool becn;		/* BTH byte 4 bit 6 (set in CNPs) */
	bool sr;		/* BTH byte 4 ROCE_BTH4_SR (ursa's extension) */
	uint8_t wide;		/* with sr: BTH byte 4 bits 1-5 (roce_wide_bytes) */
	uint8_t padcnt;
	uint16_t pkey;
	uint32_t dqpn;		/* 24 bits */
	uint32_t psn;		/* 24 bits */
	/* RETH / AtomicETH */
	uint64_t va;
	uint32_t rkey;
	uint32_t dmalen;
	uint64_t swap_add, compare;
	/* AETH */
	uint8_t syndrome;
	uint32_t msn;
	/* AtomicAckETH */
	uint64_t orig;
	/* DETH */
	uint32_t qkey, sqpn;
	/* ImmDt (network order, opaque) or IETH (rkey) */
	uint32_t imm;
	/* payload, excluding pad */
	const uint8_t *payload;
	uint32_t paylen;
};

/*
 * Parse a transport packet: buf holds everything from the BTH to the end of
 * the ICRC (a UDP datagram's payload). Returns 0, or -EBADMSG for anything
 * malformed: too short for the opcode's headers, unknown opcode, TVer not
 * 0, pad larger than the payload. The ICRC is not checked here.
 */
int roce_parse(const uint8_t *buf, size_t len, struct roce_pkt *p);

/*
 * The SACK of a NAK (see ROCE_BTH4_SR): its bitmap and number of bits, or
 * -EBADMSG when p is not a NAK with a well-formed SACK.
 */
int roce_sack_parse(const struct roce_pkt *p, const uint8_t **bits,
		    unsigned *nbits);
/*
 * Build headers, payload and pad into buf (cap bytes); the ICRC's 4 bytes
 * are reserved but not written. Returns the length including the ICRC, or
 * -ENOSPC / -EINVAL.
 */
int roce_build(uint8_t *buf, size_t cap, const struct roce_pkt *p,
	       const void *payload, uint32_t paylen);

/* CRC-32 (reflected 0xEDB88320), raw register form: no pre/post inversion. */
uint32_t roce_crc32_raw(uint32_t reg, const uint8_t *p, size_t n);
/* The same by tables only (the tests compare the two). */
uint32_t roce_crc32_raw_table(uint32_t reg, const uint8_t *p, size_t n);
/* Four bytes by one table step, once any call above has returned */
uint32_t roce_crc32_4(uint32_t reg, const uint8_t p[4]);
void roce_crc32_wide(bool on);	/* tests: 256-bit method off/on */
/* memcpy(dst, src, n) and roce_crc32_raw(reg, dst, n) in one pass */
uint32_t roce_crc32_copy(uint32_t reg, void *dst, const void *src, size_t n);

/*
 * ICRC of a RoCEv2 packet (IBTA 7.8.1, annex A17.3.3): CRC-32 over 8 bytes
 * of 0xff, the IP header (20 bytes IPv4 or 40 IPv6) and UDP header with
 * their variant fields set to all ones, the BTH with byte 4 set to 0xff, and
 * the rest of the packet up to the ICRC. ip is the IP header, udp the 8-byte
 * UDP header, ib everything from the BTH on (ib_len excludes the ICRC).
 * The value is sent least-significant byte first (roce_icrc_put).
 */
uint32_t roce_icrc(const uint8_t *ip, size_t ip_len, const uint8_t *udp,
		   const uint8_t *ib, size_t ib_len);
/* roce_icrc of a packet whose payload is gathered in as its ICRC is
 * computed, in one pass: the pieces src[0..nsrc) are copied to ib +
 * pay_off, one after the other (never past ib_len), and the ICRC covers
 * ib[0..ib_len) as it then stands (headers before pay_off, pad after the
 * pieces, as built). */
uint32_t roce_icrc_fill(const uint8_t *ip, size_t ip_len, const uint8_t *udp,
			uint8_t *ib, size_t ib_len, size_t pay_off,
			const struct iovec *src, unsigned int nsrc);
/*
 * The ICRC in two parts, for packets that share their addresses, ports and
 * length (a stream's middle packets, a GSO run): roce_icrc_pfx is the
 * register after the masked IP and UDP headers, which only those determine
 * (IPv4 ID as given, 0 for roce_icrc's value); roce_icrc_fill_from goes on
 * from it over ib as roce_icrc_fill does (pay_off = ib_len, no pieces: the
 * plain ICRC, ib untouched).
 */
uint32_t roce_icrc_pfx(const uint8_t *ip, size_t ip_len, const uint8_t *udp);
uint32_t roce_icrc_fill_from(uint32_t pfx, uint8_t *ib, size_t ib_len,
			     size_t pay_off, const struct iovec *src,
			     unsigned int nsrc);
void roce_icrc_put(uint8_t *dst, uint32_t icrc);
uint32_t roce_icrc_get(const uint8_t *src);

/*
 * The IPv4 identification field is not masked (A17.3.3), so the ICRC of a
 * packet depends on it. CRC-32 is linear over GF(2): the ICRC with ID id is
 * the ICRC with ID 0 xor this delta, the CRC from a zero register of the ID
 * bytes and the zero bytes after them (ib_len as for roce_icrc). UDP
 * segmentation offload gives segment k of a batch the ID k; the sender fixes
 * each segment's ICRC with this, the receiver checks candidates with it.
 */
uint32_t roce_icrc_v4_id_delta(size_t ib_len, uint16_t id);

/*
 * A receiver cannot see the IPv4 ID (a UDP socket hides it), and senders
 * choose it freely: rxe a different one for every packet, NICs a
 * counter. Linearity turns the question round: x = (ICRC with ID 0) xor
 * (received ICRC) must be the delta of some ID, and the deltas of the 16
 * ID bits span a 16-dimensional space of 32-bit values. The solver keeps
 * them in echelon form for one length (16 CRC passes to build); a solve
 * is 16 steps. It recovers the ID of a good packet and refuses x outside
 * the span: the ICRC still catches all but 2^-16 of damaged packets
 * (2^-32 with a known ID); the UDP checksum, when the sender sets one,
 * and the link's CRC cover them as well.
 */
struct roce_id_solver {
	size_t ib_len;
	uint8_t n;			/* independent rows */
	uint32_t row[16];		/* leading bits distinct, descending */
	uint16_t id[16];		/* the ID each row is the delta of */
};
void roce_id_solver_init(struct roce_id_solver *s, size_t ib_len);
/* 0 and *id, or -EBADMSG: no ID gives this ICRC (a damaged packet) */
int roce_id_solve(const struct roce_id_solver *s, uint32_t x, uint16_t *id);

/* 24-bit PSN arithmetic (IBTA 9.7.1: half the space behind is the past). */
static inline uint32_t psn_add(uint32_t psn, uint32_t n)
{
	return (psn + n) & 0xffffff;
}

/* > 0 if a is after b, < 0 if before, 0 if equal. */
static inline int32_t psn_cmp(uint32_t a, uint32_t b)
{
	return (int32_t)((a - b) << 8);
}

#endif
