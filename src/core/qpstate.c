// SPDX-License-Identifier: MIT
/*
 * qpstate.c - which QP state transitions exist, and which attributes each
 * one requires and allows (IBTA vol. 1, 10.3.1 "QP state transitions" and
 * the modify-QP attribute tables of 11.2.5.2). Pure data and one pure
 * function, so the table itself is unit-tested.
 *
 * IBV_QP_STATE is always required and always allowed. Every state may go to
 * RESET or ERR with no other attribute.
 */
#include "core.h"

#include <errno.h>

enum { T_UD, T_UC, T_RC, T_NTYPES };

struct trans {
	int req[T_NTYPES];
	int opt[T_NTYPES];
	bool valid;
};

#define S(x) IBV_QPS_##x
#define A(x) IBV_QP_##x

static const struct trans table[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[S(RESET)] = {
		[S(INIT)] = {
			.valid = true,
			.req = {
				[T_UD] = A(PKEY_INDEX) | A(PORT) | A(QKEY),
				[T_UC] = A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS),
				[T_RC] = A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS),
			},
		},
	},
	[S(INIT)] = {
		[S(INIT)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(PKEY_INDEX) | A(PORT) | A(QKEY),
				[T_UC] = A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS),
				[T_RC] = A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS),
			},
		},
		[S(RTR)] = {
			.valid = true,
			.req = {
				[T_UC] = A(AV) | A(PATH_MTU) | A(DEST_QPN) |
					 A(RQ_PSN),
				[T_RC] = A(AV) | A(PATH_MTU) | A(DEST_QPN) |
					 A(RQ_PSN) | A(MAX_DEST_RD_ATOMIC) |
					 A(MIN_RNR_TIMER),
			},
			.opt = {
				[T_UD] = A(PKEY_INDEX) | A(QKEY),
				[T_UC] = A(ALT_PATH) | A(ACCESS_FLAGS) |
					 A(PKEY_INDEX),
				[T_RC] = A(ALT_PATH) | A(ACCESS_FLAGS) |
					 A(PKEY_INDEX),
			},
		},
	},
	[S(RTR)] = {
		[S(RTS)] = {
			.valid = true,
			.req = {
				[T_UD] = A(SQ_PSN),
				[T_UC] = A(SQ_PSN),
				[T_RC] = A(TIMEOUT) | A(RETRY_CNT) |
					 A(RNR_RETRY) | A(SQ_PSN) |
					 A(MAX_QP_RD_ATOMIC),
			},
			.opt = {
				[T_UD] = A(CUR_STATE) | A(QKEY),
				[T_UC] = A(CUR_STATE) | A(ALT_PATH) |
					 A(ACCESS_FLAGS) | A(PATH_MIG_STATE),
				[T_RC] = A(CUR_STATE) | A(ALT_PATH) |
					 A(ACCESS_FLAGS) | A(MIN_RNR_TIMER) |
					 A(PATH_MIG_STATE),
			},
		},
	},
	[S(RTS)] = {
		[S(RTS)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(CUR_STATE) | A(QKEY),
				[T_UC] = A(CUR_STATE) | A(ACCESS_FLAGS) |
					 A(ALT_PATH) | A(PATH_MIG_STATE),
				[T_RC] = A(CUR_STATE) | A(ACCESS_FLAGS) |
					 A(ALT_PATH) | A(PATH_MIG_STATE) |
					 A(MIN_RNR_TIMER),
			},
		},
		[S(SQD)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(EN_SQD_ASYNC_NOTIFY),
				[T_UC] = A(EN_SQD_ASYNC_NOTIFY),
				[T_RC] = A(EN_SQD_ASYNC_NOTIFY),
			},
		},
	},
	[S(SQD)] = {
		[S(RTS)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(CUR_STATE) | A(QKEY),
				[T_UC] = A(CUR_STATE) | A(ALT_PATH) |
					 A(ACCESS_FLAGS) | A(PATH_MIG_STATE),
				[T_RC] = A(CUR_STATE) | A(ALT_PATH) |
					 A(ACCESS_FLAGS) | A(MIN_RNR_TIMER) |
					 A(PATH_MIG_STATE),
			},
		},
		[S(SQD)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(PKEY_INDEX) | A(QKEY),
				[T_UC] = A(AV) | A(ALT_PATH) | A(ACCESS_FLAGS) |
					 A(PKEY_INDEX) | A(PATH_MIG_STATE),
				[T_RC] = A(PORT) | A(AV) | A(TIMEOUT) |
					 A(RETRY_CNT) | A(RNR_RETRY) |
					 A(MAX_QP_RD_ATOMIC) |
					 A(MAX_DEST_RD_ATOMIC) | A(ALT_PATH) |
					 A(ACCESS_FLAGS) | A(PKEY_INDEX) |
					 A(MIN_RNR_TIMER) | A(PATH_MIG_STATE),
			},
		},
	},
	[S(SQE)] = {
		[S(RTS)] = {
			.valid = true,
			.opt = {
				[T_UD] = A(CUR_STATE) | A(QKEY),
				[T_UC] = A(CUR_STATE) | A(ACCESS_FLAGS),
			},
		},
	},
};

int ursa_qp_transition_ok(enum ibv_qp_type type, enum ibv_qp_state cur,
			  enum ibv_qp_state next, int mask)
{
	const struct trans *t;
	int ti, req, opt;

	switch (type) {
	case IBV_QPT_UD: ti = T_UD; break;
	case IBV_QPT_UC: ti = T_UC; break;
	case IBV_QPT_RC: ti = T_RC; break;
	default: return -EINVAL;
	}
	if ((unsigned)cur > IBV_QPS_ERR || (unsigned)next > IBV_QPS_ERR)
		return -EINVAL;
	/* Without IBV_QP_STATE the caller passes next == cur: the table's
	 * cur -> cur entry says what may change (INIT -> INIT: the access
	 * flags, ...), as in the kernel's ib_modify_qp_is_ok. */
	if (!(mask & IBV_QP_STATE) && next != cur)
		return -EINVAL;
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		return (mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE)) ? -EINVAL : 0;
	/* RC has no SQE state: its send errors move it to ERR. */
	if (cur == IBV_QPS_SQE && ti == T_RC)
		return -EINVAL;
	t = &table[cur][next];
	if (!t->valid)
		return -EINVAL;
	req = t->req[ti] | (mask & IBV_QP_STATE);
	opt = t->opt[ti];
	if ((mask & req) != req)
		return -EINVAL;
	if (mask & ~(req | opt))
		return -EINVAL;
	return 0;
}
