// SPDX-License-Identifier: MIT
/*
 * roce.c - RoCEv2 headers, opcode table, ICRC (see roce.h).
 */
#include "roce.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define REQ_SEND (P_REQ | P_SEND | P_PAYLOAD)
#define REQ_WRITE (P_REQ | P_WRITE | P_PAYLOAD)
#define RESP_READ (P_RESP | P_READ | P_PAYLOAD)
#define ONLY (P_FIRST | P_LAST)

/* Operations shared by RC and UC (IBTA table 35), by low 5 bits. */
static const uint32_t ops[32] = {
	[OP_SEND_FIRST] = REQ_SEND | P_FIRST,
	[OP_SEND_MIDDLE] = REQ_SEND | P_MIDDLE,
	[OP_SEND_LAST] = REQ_SEND | P_LAST,
	[OP_SEND_LAST_IMM] = REQ_SEND | P_LAST | H_IMM,
	[OP_SEND_ONLY] = REQ_SEND | ONLY,
	[OP_SEND_ONLY_IMM] = REQ_SEND | ONLY | H_IMM,
	[OP_WRITE_FIRST] = REQ_WRITE | P_FIRST | H_RETH,
	[OP_WRITE_MIDDLE] = REQ_WRITE | P_MIDDLE,
	[OP_WRITE_LAST] = REQ_WRITE | P_LAST,
	[OP_WRITE_LAST_IMM] = REQ_WRITE | P_LAST | H_IMM,
	[OP_WRITE_ONLY] = REQ_WRITE | ONLY | H_RETH,
	[OP_WRITE_ONLY_IMM] = REQ_WRITE | ONLY | H_RETH | H_IMM,
	[OP_READ_REQ] = P_REQ | P_READ | ONLY | H_RETH,
	[OP_READ_RESP_FIRST] = RESP_READ | P_FIRST | H_AETH,
	[OP_READ_RESP_MIDDLE] = RESP_READ | P_MIDDLE,
	[OP_READ_RESP_LAST] = RESP_READ | P_LAST | H_AETH,
	[OP_READ_RESP_ONLY] = RESP_READ | ONLY | H_AETH,
	[OP_ACK] = P_RESP | ONLY | H_AETH,
	[OP_ATOMIC_ACK] = P_RESP | P_ATOMIC | ONLY | H_AETH | H_ATMACK,
	[OP_CMP_SWAP] = P_REQ | P_ATOMIC | ONLY | H_ATMETH,
	[OP_FETCH_ADD] = P_REQ | P_ATOMIC | ONLY | H_ATMETH,
	[OP_SEND_LAST_INV] = REQ_SEND | P_LAST | H_IETH,
	[OP_SEND_ONLY_INV] = REQ_SEND | ONLY | H_IETH,
};

uint32_t roce_opcode_flags(uint8_t opcode)
{
	uint8_t t = opcode & 0xe0, o = opcode & 0x1f;

	switch (t) {
	case ROCE_RC:
		return ops[o];
	case ROCE_UC:
		/* UC: SEND and RDMA WRITE only */
		return o <= OP_WRITE_ONLY_IMM ? ops[o] : 0;
	case ROCE_UD:
		if (o == OP_SEND_ONLY || o == OP_SEND_ONLY_IMM)
			return ops[o] | H_DETH;
		return 0;
	case ROCE_CNP:
		return o == OP_CNP ? P_CNP | H_CNPRSV : 0;
	}
	return 0;
}

unsigned roce_hdr_len(uint8_t opcode)
{
	uint32_t f = roce_opcode_flags(opcode);
	unsigned n = ROCE_BTH_LEN;

	if (!f)
		return 0;
	if (f & H_DETH) n += 8;
	if (f & H_RETH) n += 16;
	if (f & H_ATMETH) n += 28;
	if (f & H_AETH) n += 4;
	if (f & H_ATMACK) n += 8;
	if (f & H_IMM) n += 4;
	if (f & H_IETH) n += 4;
	if (f & H_CNPRSV) n += 16;
	return n;
}

const char *roce_opcode_name(uint8_t opcode)
{
	static const char *const names[32] = {
		"SEND_FIRST", "SEND_MIDDLE", "SEND_LAST", "SEND_LAST_IMM",
		"SEND_ONLY", "SEND_ONLY_IMM", "WRITE_FIRST", "WRITE_MIDDLE",
		"WRITE_LAST", "WRITE_LAST_IMM", "WRITE_ONLY", "WRITE_ONLY_IMM",
		"READ_REQUEST", "READ_RESPONSE_FIRST", "READ_RESPONSE_MIDDLE",
		"READ_RESPONSE_LAST", "READ_RESPONSE_ONLY", "ACKNOWLEDGE",
		"ATOMIC_ACKNOWLEDGE", "COMPARE_SWAP", "FETCH_ADD", NULL,
		"SEND_LAST_INV", "SEND_ONLY_INV",
	};

	if (!roce_opcode_flags(opcode))
		return "unknown";
	if ((opcode & 0xe0) == ROCE_CNP)
		return "CNP";
	return names[opcode & 0x1f] ? names[opcode & 0x1f] : "unknown";
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get24(const uint8_t *p) { return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]; }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | get24(p + 1); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }
static void put24(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 16); p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 24); put24(p + 1, v); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

int roce_parse(const uint8_t *buf, size_t len, struct roce_pkt *p)
{
	uint32_t f;
	unsigned hl;
	const uint8_t *h;
	size_t body;

	memset(p, 0, sizeof(*p));
	if (len < ROCE_BTH_LEN + ROCE_ICRC_LEN)
		return -EBADMSG;
	p->opcode = buf[0];
	f = roce_opcode_flags(p->opcode);
	hl = roce_hdr_len(p->opcode);
	if (!f || len < hl + ROCE_ICRC_LEN)
		return -EBADMSG;
	if (buf[1] & 0x0f)		/* TVer must be 0 (IBTA C9-5) */
		return -EBADMSG;
	p->se = buf[1] & 0x80;
	p->mig = buf[1] & 0x40;
	p->padcnt = (buf[1] >> 4) & 3;
	p->pkey = get16(buf + 2);
	p->dqpn = get24(buf + 5);
	p->ackreq = buf[8] & 0x80;
	p->becn = buf[4] & 0x40;
	p->sr = buf[4] & ROCE_BTH4_SR;
	p->wide = p->sr ? (buf[4] >> ROCE_BTH4_WIDE_SHIFT) & 31 : 0;
	p->psn = get24(buf + 9);
	h = buf + ROCE_BTH_LEN;
	if (f & H_DETH) {
		p->qkey = get32(h);
		p->sqpn = get24(h + 5);
		h += 8;
	}
	if (f & H_RETH) {
		p->va = get64(h);
		p->rkey = get32(h + 8);
		p->dmalen = get32(h + 12);
		h += 16;
	}
	if (f & H_ATMETH) {
		p->va = get64(h);
		p->rkey = get32(h + 8);
		p->swap_add = get64(h + 12);
		p->compare = get64(h + 20);
		h += 28;
	}
	if (f & H_AETH) {
		p->syndrome = h[0];
		p->msn = get24(h + 1);
		h += 4;
	}
	if (f & H_ATMACK) {
		p->orig = get64(h);
		h += 8;
	}
	if (f & (H_IMM | H_IETH)) {
		/* ImmDt stays in network order (opaque to ursa, delivered as
		 * is); IETH is an rkey, a number. */
		if (f & H_IMM)
			memcpy(&p->imm, h, 4);
		else
			p->imm = get32(h);
		h += 4;
	}
	body = len - hl - ROCE_ICRC_LEN;
	/* Payload plus pad is a whole number of 4-byte words (IBTA 9.2.4:
	 * PadCnt pads to a multiple of 4); headers are too. */
	if (body & 3)
		return -EBADMSG;
	if (!(f & P_PAYLOAD)) {
		if (body && (p->opcode & 0x1f) == OP_ACK && p->sr &&
		    !p->padcnt && body <= roce_sack_len(ROCE_SACK_MAX_BITS)) {
			p->payload = h;	/* a SACK (roce_sack_parse) */
			p->paylen = (uint32_t)body;
			return 0;
		}
		if (body || p->padcnt)
			return -EBADMSG;
		return 0;
	}
	if (p->padcnt > body)
		return -EBADMSG;
	p->payload = h;
	p->paylen = (uint32_t)(body - p->padcnt);
	return 0;
}

int roce_sack_parse(const struct roce_pkt *p, const uint8_t **bits,
		    unsigned *nbits)
{
	unsigned n;

	if ((p->opcode & 0x1f) != OP_ACK || !p->sr ||
	    p->syndrome != AETH_NAK_PSN || p->paylen < 4 || !p->payload)
		return -EBADMSG;
	n = (unsigned)p->payload[0] << 8 | p->payload[1];
	if (n > ROCE_SACK_MAX_BITS || p->payload[2] || p->payload[3] ||
	    p->paylen != roce_sack_len(n))
		return -EBADMSG;
	*bits = p->payload + 4;
	*nbits = n;
	return 0;
}

int roce_build(uint8_t *buf, size_t cap, const struct roce_pkt *p,
	       const void *payload, uint32_t paylen)
{
	uint32_t f = roce_opcode_flags(p->opcode);
	unsigned hl = roce_hdr_len(p->opcode);
	uint8_t pad = (uint8_t)((4 - (paylen & 3)) & 3);
	uint8_t *h;

	bool sack = (p->opcode & 0x1f) == OP_ACK && p->sr;

	if (!f || (!(f & P_PAYLOAD) && paylen && !(sack && !(paylen & 3))))
		return -EINVAL;
	if (!(f & P_PAYLOAD))
		pad = 0;
	if ((size_t)hl + paylen + pad + ROCE_ICRC_LEN > cap)
		return -ENOSPC;
	roce_bth_put(buf, p->opcode, p->se, p->mig, pad, p->pkey, p->dqpn,
		     p->ackreq, p->psn);
	if (p->becn)
		buf[4] = 0x40;
	if (p->sr)
		buf[4] |= (uint8_t)(ROCE_BTH4_SR |
				    (p->wide & 31) << ROCE_BTH4_WIDE_SHIFT);
	h = buf + ROCE_BTH_LEN;
	if (f & H_DETH) {
		put32(h, p->qkey);
		h[4] = 0;
		put24(h + 5, p->sqpn);
		h += 8;
	}
	if (f & H_RETH) {
		put64(h, p->va);
		put32(h + 8, p->rkey);
		put32(h + 12, p->dmalen);
		h += 16;
	}
	if (f & H_ATMETH) {
		put64(h, p->va);
		put32(h + 8, p->rkey);
		put64(h + 12, p->swap_add);
		put64(h + 20, p->compare);
		h += 28;
	}
	if (f & H_AETH) {
		h[0] = p->syndrome;
		put24(h + 1, p->msn);
		h += 4;
	}
	if (f & H_ATMACK) {
		put64(h, p->orig);
		h += 8;
	}
	if (f & H_IMM) {
		memcpy(h, &p->imm, 4);
		h += 4;
	} else if (f & H_IETH) {
		put32(h, p->imm);
		h += 4;
	}
	if (f & H_CNPRSV) {
		memset(h, 0, 16);
		h += 16;
	}
	if (paylen && payload != h)	/* (else built in place) */
		memcpy(h, payload, paylen);
	memset(h + paylen, 0, pad);	/* pad bytes are zero (rxe) */
	return (int)(hl + paylen + pad + ROCE_ICRC_LEN);
}

/* Slicing-by-8 (eight bytes per step through eight tables): the ICRC is
 * computed for every packet sent and received. */
static uint32_t crc_t[8][256];
static atomic_bool crc_ready;	/* crc_init is done (crc_ensure) */

#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
static void clmul_init(void);
#endif

static void crc_init(void)
{
#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
	clmul_init();
#endif
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
		crc_t[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_t[t][i] = (crc_t[t - 1][i] >> 8) ^
				      crc_t[0][crc_t[t - 1][i] & 0xff];
	atomic_store_explicit(&crc_ready, true, memory_order_release);
}

static uint32_t crc_table(uint32_t reg, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint32_t lo = reg ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
				     (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
		uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 |
			      (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;

		reg = crc_t[7][lo & 0xff] ^ crc_t[6][(lo >> 8) & 0xff] ^
		      crc_t[5][(lo >> 16) & 0xff] ^ crc_t[4][lo >> 24] ^
		      crc_t[3][hi & 0xff] ^ crc_t[2][(hi >> 8) & 0xff] ^
		      crc_t[1][(hi >> 16) & 0xff] ^ crc_t[0][hi >> 24];
		p += 8;
		n -= 8;
	}
	if (n >= 4) {	/* (a BTH is 12 bytes: four lookups at once) */
		uint32_t lo = reg ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
				     (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);

		reg = crc_t[3][lo & 0xff] ^ crc_t[2][(lo >> 8) & 0xff] ^
		      crc_t[1][(lo >> 16) & 0xff] ^ crc_t[0][lo >> 24];
		p += 4;
		n -= 4;
	}
	while (n--)
		reg = crc_t[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
	return reg;
}

#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
#include <immintrin.h>

/*
 * Carry-less multiplication (PCLMULQDQ), the folding method of Intel's
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" for the
 * reflected CRC-32 polynomial: four 128-bit lanes are folded forward 64
 * bytes at a time (constants x^(4*128+32) and x^(4*128-32) mod P, bit-
 * reflected), merged into one, reduced to 64 and then 32 bits, and a
 * Barrett reduction gives the register. n >= 64 and a multiple of 16;
 * the unit tests compare it with the tables on every length and offset.
 */
#define FOLD(x, k, next)                                                   \
	do {                                                               \
		__m128i h = _mm_clmulepi64_si128(x, k, 0x11);              \
		x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), h), \
				  next);                                   \
	} while (0)
#define K3K4 _mm_set_epi64x(0x0ccaa009ell, 0x1751997d0ll)  /* 128 bits apart */

/* The 16-byte blocks left after the wide loop, then 128 -> 32 bits. */
__attribute__((target("pclmul,sse4.1"), always_inline))
static inline uint32_t crc_clmul_tail(__m128i x1, const uint8_t *p, size_t n)
{
	const __m128i k3k4 = K3K4;
	const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124ll);
	const __m128i poly = _mm_set_epi64x(0x1f7011641ll, 0x1db710641ll);
	const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
	__m128i t;

	while (n >= 16) {
		FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
		p += 16;
		n -= 16;
	}
	/* 128 -> 64 bits (this also appends 32 zero bits) */
	t = _mm_clmulepi64_si128(k3k4, x1, 0x01);
	x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
	/* 64 -> 32 */
	t = _mm_srli_si128(x1, 4);
	x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00);
	x1 = _mm_xor_si128(x1, t);
	/* Barrett reduction */
	t = x1;
	x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
	x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x00);
	x1 = _mm_xor_si128(x1, t);
	return (uint32_t)_mm_extract_epi32(x1, 1);
}

__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t reg, const uint8_t *p, size_t n)
{
	const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596ll, 0x154442bd4ll);
	const __m128i k3k4 = K3K4;
	__m128i x1 = _mm_loadu_si128((const __m128i *)p);
	__m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
	__m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
	__m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));

	x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)reg));
	p += 64;
	n -= 64;
	while (n >= 64) {
		FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
		FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
		FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
		FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
		p += 64;
		n -= 64;
	}
	FOLD(x1, k3k4, x2);
	FOLD(x1, k3k4, x3);
	FOLD(x1, k3k4, x4);
	return crc_clmul_tail(x1, p, n);
}

/* The eight 128-bit lanes of the wide loop's four registers, in the
 * order of their bytes (y1's two, then y2's, ...), folded into one as a
 * tree: y1 onto y3 and y2 onto y4 (64 bytes apart) at once, the two
 * results onto each other (32 bytes), then the last two lanes (16). Four
 * dependent folds instead of seven one after another: the merge had been
 * as long as the loop for a 1 KiB packet. The constants are x^(8d+32)
 * and x^(8d-32) mod P, bit-reflected, for the distance of d bytes. */
__attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq"), always_inline))
static inline __m256i fold256(__m256i y, __m256i k, __m256i next)
{
	__m256i h = _mm256_clmulepi64_epi128(y, k, 0x11);

	return _mm256_xor_si256(_mm256_xor_si256(
		_mm256_clmulepi64_epi128(y, k, 0x00), h), next);
}

__attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq"), always_inline))
static inline __m128i lanes_merge(__m256i y1, __m256i y2, __m256i y3, __m256i y4)
{
	const __m256i k64 = _mm256_set_epi64x(0x1c6e41596ll, 0x154442bd4ll,
					      0x1c6e41596ll, 0x154442bd4ll);
	const __m256i k32 = _mm256_set_epi64x(0x15a546366ll, 0x0f1da05aall,
					      0x15a546366ll, 0x0f1da05aall);
	const __m128i k3k4 = K3K4;
	__m256i y = fold256(fold256(y1, k64, y3), k32, fold256(y2, k64, y4));
	__m128i x1 = _mm256_castsi256_si128(y);

	FOLD(x1, k3k4, _mm256_extracti128_si256(y, 1));
	return x1;
}

/*
 * The same with 256-bit VPCLMULQDQ (AVX2 registers, two 128-bit lanes
 * each): four registers fold 128 bytes at a time (x^(8*128+32) and
 * x^(8*128-32) mod P), then their eight lanes merge as above. It does
 * twice the work per instruction at the same rate: 1 KiB in about 175
 * cycles against 285 here (Zen 3), the largest single cost of a RoCEv2
 * packet on both sides. n >= 128 and a multiple of 16.
 *
 * With dst, it also stores what it reads there (dst and p do not
 * overlap): the copy rides along with the folding, which the multiplier
 * bounds, not the loads and stores, so the sender builds a packet and
 * computes its ICRC in one pass over the MR.
 */
__attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq"), always_inline))
static inline uint32_t vclmul(uint32_t reg, uint8_t *dst, const uint8_t *p,
			      size_t n)
{
	const __m256i kk = _mm256_set_epi64x(0x14a7fe880ll, 0x1e88ef372ll,
					     0x14a7fe880ll, 0x1e88ef372ll);
	__m256i y1, y2, y3, y4;
	size_t o = 0;

	/* (four named registers, not an array: an array went to memory) */
#define LOAD(y, i)                                                         \
	do {                                                               \
		y = _mm256_loadu_si256((const __m256i *)(p + o + 32 * i)); \
		if (dst)                                                   \
			_mm256_storeu_si256((__m256i *)(dst + o + 32 * i), y); \
	} while (0)
#define FOLD256(y, i)                                                      \
	do {                                                               \
		__m256i d;                                                 \
		LOAD(d, i);                                                \
		y = fold256(y, kk, d);                                     \
	} while (0)
	LOAD(y1, 0);
	LOAD(y2, 1);
	LOAD(y3, 2);
	LOAD(y4, 3);
	y1 = _mm256_xor_si256(y1, _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)reg)));
	for (o = 128; n - o >= 128; o += 128) {
		FOLD256(y1, 0);
		FOLD256(y2, 1);
		FOLD256(y3, 2);
		FOLD256(y4, 3);
	}
#undef FOLD256
#undef LOAD
	if (dst) {
		/* the last 16-byte blocks: copied, then folded from the copy */
		memcpy(dst + o, p + o, n - o);
		p = dst;
	}
	return crc_clmul_tail(lanes_merge(y1, y2, y3, y4), p + o, n - o);
}

__attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq")))
static uint32_t crc_vclmul(uint32_t reg, const uint8_t *p, size_t n)
{
	return vclmul(reg, NULL, p, n);
}

__attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq")))
static uint32_t crc_vclmul_copy(uint32_t reg, uint8_t *dst, const uint8_t *p,
				size_t n)
{
	return vclmul(reg, dst, p, n);
}
#undef FOLD
#undef K3K4

static bool have_clmul, have_vclmul;

static void clmul_init(void)
{
	have_clmul = __builtin_cpu_supports("pclmul") &&
		     __builtin_cpu_supports("sse4.1");
	have_vclmul = have_clmul && __builtin_cpu_supports("avx2") &&
		      __builtin_cpu_supports("vpclmulqdq");
}
#endif

static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* The tables and the CPU's methods, ready: pthread_once once, then one
 * load (a packet makes three or four calls). The acquire pairs with
 * crc_init's release store: the tables it wrote are seen. */
static inline void crc_ensure(void)
{
	if (!atomic_load_explicit(&crc_ready, memory_order_acquire))
		pthread_once(&crc_once, crc_init);
}

uint32_t roce_crc32_raw(uint32_t reg, const uint8_t *p, size_t n)
{
	crc_ensure();
#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
	if (n >= 64 && have_clmul) {
		size_t k = n & ~(size_t)15;

		reg = k >= 128 && have_vclmul ? crc_vclmul(reg, p, k) :
						crc_clmul(reg, p, k);
		p += k;
		n -= k;
	}
#endif
	return crc_table(reg, p, n);
}

uint32_t roce_crc32_copy(uint32_t reg, void *dst, const void *src, size_t n)
{
	crc_ensure();
#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
	if (n >= 128 && have_vclmul) {
		size_t k = n & ~(size_t)15;

		reg = crc_vclmul_copy(reg, dst, src, k);
		dst = (uint8_t *)dst + k;
		src = (const uint8_t *)src + k;
		n -= k;
	}
#endif
	if (!n)		/* (a whole MTU of payload ends here) */
		return reg;
	memcpy(dst, src, n);
	return roce_crc32_raw(reg, dst, n);
}

/* For the tests: the 128-bit method for every length (off), or back to
 * the best one the CPU has (on). */
void roce_crc32_wide(bool on)
{
	roce_crc32_raw(0, NULL, 0);	/* CPU features read */
#if defined(__x86_64__) && !defined(URSA_NO_CLMUL)
	have_vclmul = on && __builtin_cpu_supports("avx2") &&
		      __builtin_cpu_supports("vpclmulqdq");
#else
	(void)on;
#endif
}

/* Four bytes (a BTH's last word) by one table step; the tables are ready
 * once any other roce_crc32_* call has returned. */
uint32_t roce_crc32_4(uint32_t reg, const uint8_t p[4])
{
	return crc_table(reg, p, 4);
}

/* For the tests: the table method alone. */
uint32_t roce_crc32_raw_table(uint32_t reg, const uint8_t *p, size_t n)
{
	roce_crc32_raw(0, NULL, 0);	/* tables ready */
	return crc_table(reg, p, n);
}

/* The IP and UDP headers as the ICRC covers them: variant fields ones. */
static void icrc_mask_ip_udp(uint8_t *hdr, const uint8_t *ip, size_t ip_len,
			     const uint8_t *udp)
{
	memcpy(hdr, ip, ip_len);
	if (ip_len == 20) {
		hdr[1] = 0xff;			/* TOS */
		hdr[8] = 0xff;			/* TTL */
		hdr[10] = hdr[11] = 0xff;	/* header checksum */
	} else {
		hdr[0] |= 0x0f;			/* traffic class, flow label */
		hdr[1] = hdr[2] = hdr[3] = 0xff;
		hdr[7] = 0xff;			/* hop limit */
	}
	memcpy(hdr + ip_len, udp, 8);
	hdr[ip_len + 6] = hdr[ip_len + 7] = 0xff;	/* UDP checksum */
}

/*
 * The ICRC covers 8 bytes of ones (the LRH a RoCEv2 packet lacks), the IP
 * and UDP headers and the BTH with their variant fields masked to ones,
 * then the rest of the packet. The masked headers are assembled in one
 * block behind leading zeros, so that the carry-less method takes them
 * too (it wants multiples of 16 bytes, at least 64; the tables took 40 of
 * the 140 ns of a 1 KiB packet's ICRC here): a CRC whose register starts
 * at zero is unchanged by leading zero bytes, and a start value of ones
 * is the same as a zero start with the first four bytes inverted (those
 * are LRH bytes: ones, inverted to zeros). icrc_pre builds the block up
 * to the BTH and returns its length (64 - 12 for IPv4, 80 - 12 for IPv6).
 */
static size_t icrc_pre(uint8_t blk[80], const uint8_t *ip, size_t ip_len,
		       const uint8_t *udp)
{
	size_t lead = ip_len == 20 ? 16 : 12;

	memset(blk, 0, lead + 4);
	memset(blk + lead + 4, 0xff, 4);
	icrc_mask_ip_udp(blk + lead + 8, ip, ip_len, udp);
	return lead + 8 + ip_len + 8;
}

static uint32_t icrc_start(const uint8_t *ip, size_t ip_len,
			   const uint8_t *udp, const uint8_t *bth)
{
	/* IPv4: 16 + 8 + 20 + 8 + 12 = 64; IPv6: 12 + 8 + 40 + 8 + 12 = 80 */
	uint8_t blk[80];
	size_t n = icrc_pre(blk, ip, ip_len, udp);

	memcpy(blk + n, bth, ROCE_BTH_LEN);
	blk[n + 4] = 0xff;			/* FECN, BECN, reserved */
	return roce_crc32_raw(0, blk, n + ROCE_BTH_LEN);
}

/* The ICRC from the register after the BTH on: the headers after it, the
 * pieces gathered in, the pad. */
static uint32_t icrc_rest(uint32_t reg, uint8_t *ib, size_t ib_len,
			  size_t pay_off, const struct iovec *src,
			  unsigned int nsrc)
{
	uint8_t *at = ib + pay_off;

	reg = roce_crc32_raw(reg, ib + ROCE_BTH_LEN, pay_off - ROCE_BTH_LEN);
	for (unsigned int i = 0; i < nsrc; i++) {
		size_t n = src[i].iov_len;

		if (n > (size_t)(ib + ib_len - at))
			n = (size_t)(ib + ib_len - at);	/* (never past ib_len) */
		reg = roce_crc32_copy(reg, at, src[i].iov_base, n);
		at += n;
	}
	return ~roce_crc32_raw(reg, at, (size_t)(ib + ib_len - at));
}

uint32_t roce_icrc_pfx(const uint8_t *ip, size_t ip_len, const uint8_t *udp)
{
	uint8_t blk[80];

	if (ip_len != 20 && ip_len != 40)
		return 0;
	return roce_crc32_raw(0, blk, icrc_pre(blk, ip, ip_len, udp));
}

uint32_t roce_icrc_fill_from(uint32_t pfx, uint8_t *ib, size_t ib_len,
			     size_t pay_off, const struct iovec *src,
			     unsigned int nsrc)
{
	uint8_t bth[ROCE_BTH_LEN];

	if (ib_len < ROCE_BTH_LEN || pay_off < ROCE_BTH_LEN || pay_off > ib_len)
		return 0;
	memcpy(bth, ib, ROCE_BTH_LEN);
	bth[4] = 0xff;			/* FECN, BECN, reserved */
	return icrc_rest(roce_crc32_raw(pfx, bth, ROCE_BTH_LEN), ib, ib_len,
			 pay_off, src, nsrc);
}

uint32_t roce_icrc(const uint8_t *ip, size_t ip_len, const uint8_t *udp,
		   const uint8_t *ib, size_t ib_len)
{
	return roce_icrc_fill(ip, ip_len, udp, (uint8_t *)ib, ib_len, ib_len,
			      NULL, 0);
}

uint32_t roce_icrc_fill(const uint8_t *ip, size_t ip_len, const uint8_t *udp,
			uint8_t *ib, size_t ib_len, size_t pay_off,
			const struct iovec *src, unsigned int nsrc)
{
	if ((ip_len != 20 && ip_len != 40) || ib_len < ROCE_BTH_LEN ||
	    pay_off < ROCE_BTH_LEN || pay_off > ib_len)
		return 0;
	return icrc_rest(icrc_start(ip, ip_len, udp, ib), ib, ib_len, pay_off,
			 src, nsrc);
}

uint32_t roce_icrc_v4_id_delta(size_t ib_len, uint16_t id)
{
	static const uint8_t zeros[512];
	uint8_t b[2] = { (uint8_t)(id >> 8), (uint8_t)id };
	/* after the ID: 14 more IPv4 header bytes, the UDP header, the rest */
	size_t n = 14 + 8 + ib_len;
	uint32_t reg = roce_crc32_raw(0, b, 2);

	while (n) {
		size_t k = n < sizeof(zeros) ? n : sizeof(zeros);

		reg = roce_crc32_raw(reg, zeros, k);
		n -= k;
	}
	return reg;
}

void roce_id_solver_init(struct roce_id_solver *s, size_t ib_len)
{
	s->ib_len = ib_len;
	s->n = 0;
	for (int b = 0; b < 16; b++) {
		uint32_t v = roce_icrc_v4_id_delta(ib_len, (uint16_t)(1u << b));
		uint16_t id = (uint16_t)(1u << b);

		/* reduce by the rows so far (leading bits descending) */
		for (int i = 0; i < s->n; i++)
			if (v & (0x80000000u >> __builtin_clz(s->row[i]))) {
				v ^= s->row[i];
				id ^= s->id[i];
			}
		if (!v)
			continue;	/* dependent: an ambiguous ID bit */
		/* insert, keeping the leading bits in descending order; a
		 * row's leading bit is set in no later row's reduction */
		int at = s->n;

		while (at > 0 && __builtin_clz(s->row[at - 1]) > __builtin_clz(v)) {
			s->row[at] = s->row[at - 1];
			s->id[at] = s->id[at - 1];
			at--;
		}
		s->row[at] = v;
		s->id[at] = id;
		s->n++;
	}
}

int roce_id_solve(const struct roce_id_solver *s, uint32_t x, uint16_t *id)
{
	uint16_t r = 0;

	for (int i = 0; i < s->n; i++)
		if (x & (0x80000000u >> __builtin_clz(s->row[i]))) {
			x ^= s->row[i];
			r ^= s->id[i];
		}
	if (x)
		return -EBADMSG;
	*id = r;
	return 0;
}

void roce_icrc_put(uint8_t *dst, uint32_t icrc)
{
	/* least significant byte first (IBTA 7.8.1; rocev2.md 3.3) */
	dst[0] = (uint8_t)icrc;
	dst[1] = (uint8_t)(icrc >> 8);
	dst[2] = (uint8_t)(icrc >> 16);
	dst[3] = (uint8_t)(icrc >> 24);
}

uint32_t roce_icrc_get(const uint8_t *src)
{
	return (uint32_t)src[0] | (uint32_t)src[1] << 8 |
	       (uint32_t)src[2] << 16 | (uint32_t)src[3] << 24;
}
