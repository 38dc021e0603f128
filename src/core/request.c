// SPDX-License-Identifier: MIT
/*
 * request.c - the pure helpers of the transport-neutral request
 * (request.h): the names of the refusal codes, IBTA's RNR timer and ACK
 * timeout encodings, and scatter/gather slices and copies. The engine and
 * the same-host transport both use them; they touch nothing but their
 * arguments (and, for a copy, the memory the lists name).
 */
#include "request.h"

#include <stdio.h>
#include <string.h>

static const uint32_t rnr_us100[32] = {
	/* IBTA table 45, in units of 10 us; 0 means 655.36 ms. */
	65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
	16384, 24576, 32768, 49152,
};

const char *ursa_why_str(uint32_t code)
{
	static const char *const local[] = {
		[URSA_WHY_NONE] = "no error recorded",
		[URSA_WHY_KEY] = "key unknown, invalid or deregistered",
		[URSA_WHY_PD] = "key belongs to another protection domain",
		[URSA_WHY_BOUNDS] = "range outside the registered region",
		[URSA_WHY_ACCESS] = "access rights of the region do not permit the operation",
		[URSA_WHY_MW_QP] = "memory window is bound to another QP",
		[URSA_WHY_QP_ACCESS] = "QP access flags do not permit the operation",
		[URSA_WHY_ALIGN] = "atomic address not 8-byte aligned",
		[URSA_WHY_NO_RECV] = "no receive WQE posted",
		[URSA_WHY_RECV_SHORT] = "message longer than the receive buffers",
		[URSA_WHY_INVALIDATE] = "rkey to invalidate is not a valid type 2 window of this QP",
		[URSA_WHY_UNSUPPORTED] = "operation not supported by the QP type",
		[URSA_WHY_OPCODE] = "unknown opcode",
		[URSA_WHY_NOT_READY] = "no answer: target QP missing, not ready, or of another type",
		[URSA_WHY_QKEY] = "Q_Key mismatch",
		[URSA_WHY_UD_MTU] = "UD message longer than the path MTU",
		[URSA_WHY_UNREACHABLE] = "no answer: destination GID or QPN unreachable",
		[URSA_WHY_MSG_LEN] = "message longer than 2^31 bytes",
		[URSA_WHY_ATOMIC_LEN] = "atomic result buffer is not 8 bytes",
		[URSA_WHY_BIND] = "memory window bind refused",
		[URSA_WHY_LOCAL_INV] = "local invalidate refused",
		[URSA_WHY_FLUSH] = "flushed: the QP is in the error state",
		[URSA_WHY_PEER_MEM] = "the requester's memory could not be read or written (peer gone or access denied)",
		[URSA_WHY_PEER_DEAD] = "no answer: the peer process is gone",
		[URSA_WHY_RD_ATOMIC] = "responder has no READ/atomic resources (max_dest_rd_atomic 0)",
		[URSA_WHY_NOT_PEER] = "dropped: the request came from a QP that is not the target's connected peer",
		[URSA_WHY_UNMAPPED] = "registered memory is no longer mapped (unmapped or remapped while registered)",
	};
	static __thread char buf[160];
	uint32_t c = code & ~(uint32_t)URSA_WHY_REMOTE;
	const char *s = c < ARRAY_SIZE(local) && local[c] ? local[c] : "unknown";

	if (code & URSA_WHY_REMOTE) {
		snprintf(buf, sizeof(buf), "remote: %s", s);
		return buf;
	}
	return s;
}

uint64_t ursa_rnr_timer_ns(uint8_t code)
{
	return (uint64_t)rnr_us100[code & 31] * 10000ull;
}

uint64_t ursa_ack_timeout_ns(uint8_t code)
{
	/* 4.096 us * 2^timeout; 0 means "infinite" (IBTA 9.7.6.1.3). */
	if (!code)
		return UINT64_MAX;
	return 4096ull << MIN(code, 31);
}

uint32_t ursa_sg_slice(const struct ursa_sg *sg, uint32_t n, uint64_t off,
		       uint64_t len, struct ursa_sg *out)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < n && len; i++) {
		if (off >= sg[i].len) {
			off -= sg[i].len;
			continue;
		}
		out[k].va = sg[i].va + off;
		out[k].len = MIN(sg[i].len - off, len);
		len -= out[k].len;
		off = 0;
		k++;
	}
	return k;
}

void ursa_sg_copy(const struct ursa_sg *dst, uint32_t ndst,
		  const struct ursa_sg *src, uint32_t nsrc, uint64_t len)
{
	uint32_t di = 0, si = 0;
	uint64_t doff = 0, soff = 0;

	while (len && di < ndst && si < nsrc) {
		uint64_t d = dst[di].len - doff, s = src[si].len - soff;
		uint64_t n = MIN(MIN(d, s), len);
		uint8_t *dp = (uint8_t *)dst[di].va + doff;
		const uint8_t *sp = (const uint8_t *)src[si].va + soff;

		if (n == len)
			ursa_copy_ordered(dp, sp, n);	/* the last piece */
		else if (n)
			memcpy(dp, sp, n);
		len -= n;
		doff += n;
		soff += n;
		if (doff == dst[di].len) {
			di++;
			doff = 0;
		}
		if (soff == src[si].len) {
			si++;
			soff = 0;
		}
	}
}
