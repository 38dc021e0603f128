// SPDX-License-Identifier: MIT
/*
 * ursa_api.c - the ursa_* extensions declared in include/ursa/ursa.h.
 */
#include "verbs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../include/ursa/ursa.h"
#include "../transport/udp.h"
#include "../core/uffd.h"

#define EXPORT URSA_EXPORT

EXPORT int ursa_mr_info(struct ibv_mr *ibmr, struct ursa_mr_info *info)
{
	struct ursa_mr *mr;
	uint64_t bytes_huge = 0, bytes_small = 0;
	uint64_t big = 4096;

	if (!ibmr || !info)
		return -EINVAL;
	mr = to_umr(ibmr);
	memset(info, 0, sizeof(*info));
	info->addr = mr->addr;
	info->iova = mr->iova;
	info->length = mr->length;
	info->lkey = ibmr->lkey;
	info->rkey = ibmr->rkey;
	info->access = mr->access;
	info->entries = mr->mtt.n;
	info->unmapped = atomic_load(&mr->gone);
	info->huge_entries = mr->mtt.huge;
	for (uint32_t i = 0; i < mr->mtt.n; i++) {
		uint64_t sz = 1ull << mr->mtt.e[i].shift;

		if (sz > 4096) {
			bytes_huge += sz;
			big = MAX(big, sz);
		} else {
			bytes_small += sz;
		}
	}
	info->page_size = bytes_huge > bytes_small ? big : 4096;
	info->pages_4k = ((mr->addr + mr->length + 4095) / 4096) -
			 (mr->addr / 4096);
	info->pinned_bytes = mr->pin_end - mr->pin_start;
	info->shared_bytes = mr->shm.fd >= 0 ? mr->shm.len : 0;
	info->on_demand = mr->odp;
	info->cached = mr->cached;
	return 0;
}

EXPORT int ursa_mr_entry(struct ibv_mr *ibmr, uint32_t idx, uint64_t *va,
			 uint64_t *page_size)
{
	struct ursa_mr *mr;

	if (!ibmr)
		return -EINVAL;
	mr = to_umr(ibmr);
	if (idx >= mr->mtt.n)
		return -ERANGE;
	if (va)
		*va = mr->mtt.e[idx].va;
	if (page_size)
		*page_size = 1ull << mr->mtt.e[idx].shift;
	return 0;
}

EXPORT int64_t ursa_pinned_total(void)
{
	struct ursa_device *dev = ursa_device_get();

	return dev ? (int64_t)ursa_pinned_bytes(&dev->pins) : -ENODEV;
}

EXPORT void ursa_config_print(FILE *f)
{
	ursa_cfg_print(f);
}

EXPORT int ursa_unmap_watch(void)
{
	return ursa_device_get() && ursa_uffd_active();
}

EXPORT int ursa_mem_alloc(size_t len, void **out)
{
	if (!out)
		return -EINVAL;
	return ursa_shmap_alloc(len, out);
}

EXPORT int ursa_mem_free(void *p)
{
	return ursa_shmap_free(p);
}

EXPORT int ursa_rcache_stats(struct ursa_rcache_stats *st)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_rcache *rc;

	if (!st)
		return -EINVAL;
	if (!dev)
		return -ENODEV;
	rc = &dev->rcache;
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&rc->mu);
	st->hits = rc->hits;
	st->misses = rc->misses;
	st->stale = rc->stale;
	st->evictions = rc->evictions;
	st->entries = rc->n;
	st->bytes = rc->bytes;
	st->max_entries = rc->max_n;
	st->max_bytes = rc->max_bytes;
	pthread_mutex_unlock(&rc->mu);
	return 0;
}

EXPORT int64_t ursa_rcache_flush(void)
{
	struct ursa_device *dev = ursa_device_get();

	return dev ? (int64_t)ursa_rcache_drain(&dev->rcache) : -ENODEV;
}

EXPORT int ursa_qp_stats(struct ibv_qp *ibqp, struct ursa_qp_stats *st)
{
	struct ursa_qp *qp;

	if (!ibqp || !st)
		return -EINVAL;
	qp = to_uqp(ibqp);
	memset(st, 0, sizeof(*st));
	st->sends = atomic_load(&qp->cnt.sends);
	st->recvs = atomic_load(&qp->cnt.recvs);
	st->writes = atomic_load(&qp->cnt.writes);
	st->reads = atomic_load(&qp->cnt.reads);
	st->atomics = atomic_load(&qp->cnt.atomics);
	st->tx_bytes = atomic_load(&qp->cnt.tx_bytes);
	st->rx_bytes = atomic_load(&qp->cnt.rx_bytes);
	st->rnr_naks = atomic_load(&qp->cnt.rnr_naks);
	st->retries = atomic_load(&qp->cnt.retries);
	st->errors = atomic_load(&qp->cnt.errors);
	st->loop_bytes = atomic_load(&qp->cnt.loop_bytes);
	st->ring_bytes = atomic_load(&qp->cnt.ring_bytes);
	st->cma_bytes = atomic_load(&qp->cnt.cma_bytes);
	st->direct_bytes = atomic_load(&qp->cnt.direct_bytes);
	st->map_bytes = atomic_load(&qp->cnt.map_bytes);
	st->map_atomics = atomic_load(&qp->cnt.map_atomics);
	st->pkts_tx = atomic_load(&qp->cnt.pkts_tx);
	st->pkts_rx = atomic_load(&qp->cnt.pkts_rx);
	st->naks_seq = atomic_load(&qp->cnt.naks_seq);
	st->naks_inv = atomic_load(&qp->cnt.naks_inv);
	st->naks_access = atomic_load(&qp->cnt.naks_access);
	st->naks_op = atomic_load(&qp->cnt.naks_op);
	st->rnr_rcvd = atomic_load(&qp->cnt.rnr_rcvd);
	st->drops = atomic_load(&qp->cnt.drops);
	st->refused_chans = atomic_load(&qp->cnt.refused_chans);
	st->not_peer = atomic_load(&qp->cnt.not_peer);
	return 0;
}

EXPORT int ursa_engine_stats(struct ibv_context *c,
			     struct ursa_engine_stats *st)
{
	struct ursa_engine *e;

	if (!c || !st)
		return -EINVAL;
	e = to_uctx(c)->eng;
	memset(st, 0, sizeof(*st));
	if (!e)
		return -ENODEV;
	st->doorbells = atomic_load(&e->doorbells);
	st->wakeups = atomic_load(&e->wakeups);
	return 0;
}

EXPORT int ursa_port_set_state(struct ibv_context *c,
			       enum ibv_port_state state)
{
	struct ursa_device *dev;

	if (!c || (state != IBV_PORT_ACTIVE && state != IBV_PORT_DOWN))
		return -EINVAL;
	dev = to_uctx(c)->dev;
	if (atomic_exchange(&dev->port_state, state) == (int)state)
		return 0;
	pthread_mutex_lock(&dev->ctx_lock);
	for (struct ursa_ctx *x = dev->ctxs; x; x = x->next_ctx)
		ursa_async_event(x, state == IBV_PORT_ACTIVE ?
				       IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR,
				 NULL);
	pthread_mutex_unlock(&dev->ctx_lock);
	return 0;
}

EXPORT int ursa_udp_stats(struct ursa_udp_stats *st)
{
	struct ursa_udp_counters *c = &ursa_udp_cnt;

	if (!st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
#define C(f) st->f = atomic_load(&c->f)
	C(tx_pkts); C(rx_pkts); C(tx_bytes); C(rx_bytes); C(retransmits);
	C(naks_sent); C(naks_rcvd); C(rnr_naks); C(drop_short); C(drop_opcode);
	C(drop_icrc); C(drop_qpn); C(drop_src); C(drop_psn); C(drop_state);
	C(dup); C(fault_lost); C(fault_dup); C(fault_corrupt); C(fault_reorder);
	C(forwarded); C(fault_delay); C(drop_fwd); C(tx_gso); C(rx_gro);
	C(rx_ipid); C(acks_held); C(acks_alone); C(reqs_held);
	C(drop_fwd_name); C(drop_unknown); C(drop_stale);
	C(cm_rx); C(cm_tx); C(cm_orphan); C(cm_drop);
	C(rx_ce); C(cnp_sent); C(cnp_rcvd); C(cnp_cuts);
	C(ooo_held); C(sacks_sent); C(sacks_rcvd); C(sr_resent);
	C(loss_cuts); C(loss_kept); C(tx_pmtu);
#undef C
	return 0;
}

/* URSA_STATS=1 (or `ursa stats -- PROGRAM`): counters on stderr when QPs
 * go and when the process exits, for programs that cannot call ursa_*. */
void ursa_stats_qp(struct ursa_qp *qp)
{
	struct ursa_qp_stats st;

	if (!ursa_cfg()->stats)
		return;
	ursa_qp_stats(&qp->ex.qp_base, &st);
	fprintf(stderr, "ursa stats: qp 0x%06x: %" PRIu64 " sends %" PRIu64
		" recvs %" PRIu64 " writes %" PRIu64 " reads %" PRIu64
		" atomics in, %" PRIu64 " B out %" PRIu64 " B in; bytes by path: loop %"
		PRIu64 " slots %" PRIu64 " cma %" PRIu64 " direct %" PRIu64 " (mapped %" PRIu64 ", %" PRIu64 " atomics); rnr naks %" PRIu64
		", retries %" PRIu64 ", errors %" PRIu64 "; RoCEv2 packets tx %" PRIu64
		" rx %" PRIu64 ", NAKs received: PSN %" PRIu64 " invalid %" PRIu64
		" access %" PRIu64 " op %" PRIu64 " RNR %" PRIu64 ", dropped %" PRIu64
		"; refused: channels %" PRIu64 ", not the peer %" PRIu64 "\n",
		qp->ex.qp_base.qp_num, st.sends, st.recvs, st.writes, st.reads,
		st.atomics, st.tx_bytes, st.rx_bytes, st.loop_bytes,
		st.ring_bytes, st.cma_bytes, st.direct_bytes, st.map_bytes, st.map_atomics, st.rnr_naks, st.retries, st.errors,
		st.pkts_tx, st.pkts_rx, st.naks_seq, st.naks_inv, st.naks_access,
		st.naks_op, st.rnr_rcvd, st.drops, st.refused_chans, st.not_peer);
}

void ursa_stats_exit(void)
{
	struct ursa_udp_stats u;

	ursa_udp_stats(&u);
	fprintf(stderr, "ursa stats: pid %d RoCEv2: tx %" PRIu64 " pkts %" PRIu64
		" B, rx %" PRIu64 " pkts %" PRIu64 " B, retransmits %" PRIu64
		", NAKs sent %" PRIu64 " received %" PRIu64 " (RNR %" PRIu64
		"), dropped: short %" PRIu64 " opcode %" PRIu64 " ICRC %" PRIu64
		" QPN %" PRIu64 " source %" PRIu64 " PSN %" PRIu64 " stale %" PRIu64 " state %" PRIu64
		" duplicate %" PRIu64 " forward %" PRIu64 " squatted name %" PRIu64
		" unknown QPN %" PRIu64 ", forwarded %" PRIu64
		"; ACKs held %" PRIu64 " (sent alone %" PRIu64 "), requests held %"
		PRIu64 "; ECN: marked %" PRIu64 ", CNPs sent %" PRIu64
		" received %" PRIu64 " (window cuts %" PRIu64 "); selective repeat: held %"
		PRIu64 ", SACKs sent %" PRIu64 " received %" PRIu64 ", resent %" PRIu64
		"; losses: window cut %" PRIu64 ", kept %" PRIu64
		"; over the path MTU: runs %" PRIu64 "\n",
		(int)getpid(), u.tx_pkts, u.tx_bytes, u.rx_pkts, u.rx_bytes,
		u.retransmits, u.naks_sent, u.naks_rcvd, u.rnr_naks, u.drop_short,
		u.drop_opcode, u.drop_icrc, u.drop_qpn, u.drop_src, u.drop_psn,
		u.drop_stale, u.drop_state, u.dup, u.drop_fwd, u.drop_fwd_name, u.drop_unknown,
		u.forwarded, u.acks_held,
		u.acks_alone, u.reqs_held, u.rx_ce, u.cnp_sent, u.cnp_rcvd,
		u.cnp_cuts, u.ooo_held, u.sacks_sent, u.sacks_rcvd, u.sr_resent,
		u.loss_cuts, u.loss_kept, u.tx_pmtu);
}

EXPORT int ursa_fault_set(const char *spec)
{
	return ursa_udp_fault(spec && *spec ? spec : NULL);
}

EXPORT const char *ursa_vendor_err_str(uint32_t vendor_err)
{
	return ursa_why_str(vendor_err);
}

EXPORT const char *ursa_version(void)
{
	return "ursa " URSA_FW_VER;
}
