/* SPDX-License-Identifier: MIT */
/*
 * limits.h - every limit and built-in constant that sizes ursa, in one
 * place.
 *
 * The device's limits are what ibv_query_device advertises
 * (docs/design.md, "Limits"); the rest size the queues, tables and timers
 * of the transports, the engine and the connection manager. Each line
 * says in a few words what it bounds; the reasoning stays next to the
 * code it shapes, named after the constant. What a user may change at run
 * time is in config.c's table (URSA_* variables), not here.
 */
#ifndef URSA_LIMITS_H
#define URSA_LIMITS_H

/* --- the device (core; advertised by query_device) ----------------------- */
#define URSA_MAX_SGE 32
#define URSA_MAX_INLINE 256
#define URSA_MAX_QP_WR 16384
#define URSA_MAX_CQE 262144
#define URSA_MAX_QP 65536
/* READs and atomics outstanding per QP, either way: rxe's 128, so that
 * perftest, which gives each side the other's count, runs against it */
#define URSA_MAX_RD_ATOM 128
#define URSA_MAX_SRQ_WR 16384
#define URSA_MAX_MR_SIZE (1ull << 40)
#define URSA_MAX_MSG_SZ (1u << 31)
#define URSA_MAX_GIDS 32

/* --- the table published to same-host peers (core/pub.h) ---------------- */
#define URSA_PUB_QPS 4096u
#define URSA_PUB_MRS 4096u	/* power of two */
#define URSA_PUB_PROBE 8u	/* slots a key may be placed from its hash */

/* --- processes of one host (transport/shm.c) ----------------------------- */
#define URSA_SHM_SLOTS 4	/* requests in flight per channel */
#define URSA_SHM_INLINE 8192	/* payload bytes a slot carries */
#define URSA_DMAPS 16		/* peers' memfds a channel keeps mapped */
/* what one other user may hold of a process's channels: handshakes not
 * finished, and channels in all; a hello must come within HELLO_NS */
#define URSA_SHM_FOREIGN_PENDING 16
#define URSA_SHM_FOREIGN_CHANS 256
#define URSA_SHM_HELLO_NS 2000000000ull
/* a peer's engine waking this soon needs no doorbell (ring_peer) */
#define URSA_SHM_RING_SOON_NS 20000ull

/* --- RoCEv2 (transport/udp.c) -------------------------------------------- */
/* packets in flight per QP: this much payload, 256 to 2048 packets of the
 * path MTU, at least 16 after losses (window_max) */
#define URSA_UDP_WINDOW_BYTES (2u << 20)
#define URSA_UDP_WINDOW 256
#define URSA_UDP_WINDOW_INIT 32	/* a new QP's window, in slow start */
/* slow start ends when a round trip takes this much over the least */
#define URSA_SS_EXIT_DELAY_NS 500000ull
#define URSA_UDP_WINDOW_MAX 2048
#define URSA_UDP_WINDOW_MIN 16
#define URSA_UDP_ACKREQ_EVERY 64  /* packets between AckReq bits */
/* selective repeat (engine/rc_sr.c): out-of-order packets a responder
 * holds (one SACK bit each), and a SACK at least every this many */
#define URSA_SR_SLOTS 2048
#define URSA_SR_SACK_EVERY 8
/* READ pieces a requester asks for ahead of the first one not yet whole
 * (selective repeat: the holes are asked for alone meanwhile); each is a
 * READ the responder remembers (URSA_UDP_RRES) for the asks into it */
#define URSA_READ_AHEAD 8
#define URSA_TLP_MIN_NS 100000ull	/* tail loss probe: at least this quiet */
#define URSA_UDP_PIPE 32	/* messages in flight per QP before the newest */
#define URSA_UDP_MAX_PKT (4096 + 128)
#define URSA_UDP_GRO_BUF 65536	/* a receive may hold a coalesced run */
/* atomic results saved and READs remembered, for duplicates */
#define URSA_UDP_ARES URSA_MAX_RD_ATOM
#define URSA_UDP_RRES URSA_MAX_RD_ATOM
#define URSA_UDP_FWD_OUT 16	/* connections kept to other processes */
#define URSA_UDP_FWD_NAMES 8	/* names tried for a forwarding socket */
/* QPN owner look-ups that find nothing: at most this many per window */
#define URSA_UDP_LOOKUP_BUDGET 500
#define URSA_UDP_LOOKUP_WINDOW_NS 100000000ull
#define URSA_UDP_REBIND_NS 1000000000ull  /* port held: ask again after */
#define URSA_UDP_UNOWNED_NS 1000000000ull /* unowned QPN: ask again after */
#define URSA_UDP_TXB 64		/* packets a thread's send batch holds */
#define URSA_GSO_SEGS 64	/* segments of one GSO send */
#define URSA_GSO_MAX_BYTES 65000
#define URSA_UDP_DELAYQ 256	/* packets the delay fault holds back */
#define URSA_PMTU_HOLD_NS 10000000000ull /* a narrow path remembered (udp.c) */
#define URSA_PMTU_MEMOS 4	/* narrow paths a send batch remembers */
#define URSA_UDP_ACK_WAKE_SLACK_NS 1000000ull /* a held ACK's wake-up */
#define URSA_UDP_HOLD_NS 200000ull /* a request held for our ACK, at most */
/* a responder sends a QP's requester at most one CNP this often (DCQCN's
 * notification point: one per flow per 50 us) */
#define URSA_CNP_GAP_NS 50000ull

/* --- the progress engine (engine/engine.c) -------------------------------- */
#define URSA_ENG_EVENT_POLL_NS 200000ull /* a busy engine looks at sockets */
#define URSA_ENG_TICK_NS 1000000ull	  /* a recently busy engine wakes */
#define URSA_ENG_RECENT_NS 100000000ull	  /* ... while busy this recently */
#define URSA_ENG_APP_POLL_NS 50000ull	  /* leave the lock to a poller */
#define URSA_DRAIN_MS 100	/* a UD/UC QP's posted sends, at its destroy */

/* --- connection management (transport/gsi.c, rdmacm/cm.c) ------------------ */
#define URSA_GSI_PEND_MAX 512	   /* MADs waiting for a full owner queue */
#define URSA_GSI_PEND_WAIT_MS 1000 /* ... each at most this long */
#define URSA_CM_RESPONSE_TIMEOUT 20 /* CMA_CM_RESPONSE_TIMEOUT: 4096 ms */
#define URSA_CM_LIFETIME 16	   /* CMA_IBOE_PACKET_LIFETIME */
#define URSA_CM_MAX_RETRIES 15	   /* CMA_MAX_CM_RETRIES */
#define URSA_CM_MRA_TIMEOUT 24	   /* CMA_CM_MRA_SETTING */
#define URSA_CM_ACK_DELAY 15	   /* our local CA ACK delay, as rxe's */
#define URSA_CM_SID_RETRIES 10	   /* a REQ refused for an unknown SID */
#define URSA_CM_SID_RETRY_MS 20
#define URSA_CM_PROBE_MS 1000	   /* liveness knock on a same-host peer */

#endif
