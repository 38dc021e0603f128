// SPDX-License-Identifier: MIT
/*
 * mr.c - memory registration, memory windows, and every access check.
 *
 * Registration validates the access flags (IBTA 10.6.3.1: remote write or
 * remote atomic require local write), pins the pages through the device's
 * reference-counted pin map (unless IBV_ACCESS_ON_DEMAND), builds the
 * translation table and draws an lkey and a distinct rkey. Deregistration
 * revokes both keys first, then waits for in-flight accesses that resolved a
 * key before the revocation, and only then unpins and frees.
 *
 * All data-path accesses go through ursa_mem_local() (an lkey in an SGE) and
 * ursa_mem_remote() (an rkey in a request). They check, in this order: the
 * key names a live object of the right kind, the object is valid, it belongs
 * to the QP's PD, the range lies inside it (overflow-safe), and the access
 * rights cover the operation. The result says which check refused, so error
 * messages and counters can name it.
 */
#include "core.h"
#include "pub.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096ul


int ursa_access_check(unsigned int access)
{
	if (access & ~URSA_ACCESS_SUPPORTED)
		return -EINVAL;
	/* IBTA C10-23 / 10.6.3.1: remote write and remote atomic require
	 * local write. */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return -EINVAL;
	return 0;
}

static void wait_idle(struct ursa_keyed *k)
{
	/* Acquire: pairs with ursa_keyed_put so the last accessor's reads
	 * and writes of the memory finish before we unpin and free. */
	while (atomic_load_explicit(&k->refs, memory_order_acquire) > 0)
		sched_yield();
}

/* Take the MR out of the table same-host requesters read (pub.h) and wait
 * for those that may have read it before: from then on only the target's
 * own engine reaches the MR, and it checks the state. */
static void unpublish(struct ursa_mr *mr)
{
	if (ursa_pub_mr_del(mr))
		ursa_hooks.quiesce(to_uctx(mr->pd->ibv.context));
}

/* Pin [ps, pe), once more after flushing the registration cache if the
 * parked pins are what stands in the way of RLIMIT_MEMLOCK. */
static int mr_pin(struct ursa_device *dev, uintptr_t ps, uintptr_t pe)
{
	uint64_t newly = 0;
	int ret = ursa_pin(&dev->pins, ps, pe, &newly);

	if (ret == -EDQUOT && ursa_rcache_drain(&dev->rcache))
		ret = ursa_pin(&dev->pins, ps, pe, &newly);
	if (ret == -EDQUOT) {
		ursa_err("ibv_reg_mr: pinning %llu more bytes would exceed RLIMIT_MEMLOCK (%llu bytes, %llu already pinned); raise it with 'ulimit -l' or in /etc/security/limits.conf, or register with IBV_ACCESS_ON_DEMAND",
			 (unsigned long long)newly,
			 (unsigned long long)dev->pins.limit,
			 (unsigned long long)ursa_pinned_bytes(&dev->pins));
		return -ENOMEM;
	}
	return ret == -EAGAIN ? -ENOMEM : ret;
}

/*
 * Pin the pages and build the translation table, or take both back from
 * the registration cache (rcache.h). The pages stay where they are: every
 * access goes through the process's own mapping of them, so nothing a
 * thread or the kernel writes to the buffer during registration can be
 * lost. Whether same-host requesters can map the memory is looked up
 * afresh each time (shmap.h).
 */
static int mr_map(struct ursa_mr *mr, void *addr, size_t length)
{
	struct ursa_device *dev = ursa_device_get();
	uintptr_t a = (uintptr_t)addr;
	uintptr_t ps = a & ~(PAGE - 1);
	uintptr_t pe = (a + length + PAGE - 1) & ~(PAGE - 1);
	int ret;

	mr->cached = false;
	if (mr->odp) {
		ret = ursa_mtt_build_self(&mr->mtt, ps, pe);
		if (ret)
			return ret;
	} else {
		bool build = true;

		if (!ursa_rcache_take(&dev->rcache, ps, pe, &mr->mtt)) {
			/* The parked table holds addresses, which cannot go
			 * stale; its page sizes can (the range may have been
			 * mapped again with other pages): read them again
			 * where they can be anything but 4 KiB. */
			mr->cached = true;
			build = !ursa_mtt_small_only(ps, pe);
			if (build)
				ursa_mtt_free(&mr->mtt);
		} else {
			ret = mr_pin(dev, ps, pe);
			if (ret)
				return ret;
		}
		ret = build ? ursa_mtt_build_self(&mr->mtt, ps, pe) : 0;
		if (ret) {
			ursa_unpin(&dev->pins, ps, pe);
			return ret;
		}
		mr->pin_start = ps;
		mr->pin_end = pe;
	}
	ursa_shmap_find(ps, pe, &mr->shm);
	return 0;
}

/* Undo mr_map: the pins and the table go to the registration cache. */
static void mr_unmap(struct ursa_mr *mr)
{
	struct ursa_device *dev = ursa_device_get();

	if (mr->pin_end)
		ursa_rcache_park(&dev->rcache, mr->pin_start, mr->pin_end,
				 &mr->mtt);
	mr->pin_start = mr->pin_end = 0;
	mr->shm.fd = -1;
	ursa_mtt_free(&mr->mtt);
}

static int check_range(void *addr, size_t length)
{
	uintptr_t a = (uintptr_t)addr;

	if (!length || length > URSA_MAX_MR_SIZE || a + length < a ||
	    a + length > UINTPTR_MAX - PAGE)
		return -EINVAL;
	return 0;
}

int ursa_mr_reg(struct ursa_pd *pd, void *addr, size_t length, uint64_t iova,
		unsigned int access, struct ursa_mr **out)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_mr *mr;
	int ret;

	ret = ursa_access_check(access);
	if (!ret)
		ret = check_range(addr, length);
	if (!ret && iova + length < iova)
		ret = -EINVAL;
	if (ret)
		return ret;
	if (access & IBV_ACCESS_ZERO_BASED)
		iova = 0;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->pd = pd;
	mr->iova = iova;
	mr->addr = (uintptr_t)addr;
	mr->length = length;
	mr->access = access & ~IBV_ACCESS_OPTIONAL_RANGE;
	mr->odp = access & IBV_ACCESS_ON_DEMAND;
	ret = mr_map(mr, addr, length);
	if (ret)
		goto err_free;
	ret = ursa_keytab_add(&dev->keys, &mr->lk, URSA_KEY_MR_LKEY,
			      &mr->ibv.lkey);
	if (ret)
		goto err_unmap;
	ret = ursa_keytab_add(&dev->keys, &mr->rk, URSA_KEY_MR_RKEY,
			      &mr->ibv.rkey);
	if (ret)
		goto err_lkey;
	mr->ibv.context = pd->ibv.context;
	mr->ibv.pd = &pd->ibv;
	mr->ibv.addr = addr;
	mr->ibv.length = length;
	mr->ibv.handle = mr->ibv.lkey;
	atomic_fetch_add(&pd->refs, 1);
	/* Release: the fields above are complete before the MR can be
	 * seen valid by an engine that found its key. */
	atomic_store_explicit(&mr->state, URSA_MR_VALID, memory_order_release);
	ursa_pub_mr_add(mr);
	*out = mr;
	return 0;
err_lkey:
	ursa_keytab_del(&dev->keys, mr->ibv.lkey);
err_unmap:
	mr_unmap(mr);
err_free:
	free(mr);
	return ret;
}

int ursa_mr_dereg(struct ursa_mr *mr)
{
	struct ursa_device *dev = ursa_device_get();

	/* IBTA 10.6.7.2.3: an MR with bound windows cannot be deregistered. */
	if (atomic_load(&mr->mw_binds))
		return -EBUSY;
	atomic_store(&mr->state, URSA_MR_INVALID);
	ursa_qp_lcache_drop(to_uctx(mr->pd->ibv.context), mr);
	unpublish(mr);
	ursa_keytab_del(&dev->keys, mr->ibv.lkey);
	ursa_keytab_del(&dev->keys, mr->ibv.rkey);
	wait_idle(&mr->lk);
	wait_idle(&mr->rk);
	mr_unmap(mr);
	atomic_fetch_sub(&mr->pd->refs, 1);
	free(mr);
	return 0;
}

/* The MRs over [start, end), each with a reference, for ursa_mr_unmapped:
 * collected under the key table's shared lock, handled after it. */
struct gone_walk {
	uintptr_t start, end;
	struct ursa_mr **v;
	size_t n, cap;
};

static void gone_visit(struct ursa_keyed *k, void *arg)
{
	struct gone_walk *w = arg;
	struct ursa_mr *mr = container_of(k, struct ursa_mr, lk);

	/* an on-demand MR follows the address space, as ODP does on a NIC */
	if (mr->odp || !(mr->addr < w->end && w->start < mr->addr + mr->length))
		return;
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 16;
		struct ursa_mr **v = realloc(w->v, cap * sizeof(*v));

		if (!v)
			return;
		w->v = v;
		w->cap = cap;
	}
	atomic_fetch_add_explicit(&k->refs, 1, memory_order_relaxed);
	w->v[w->n++] = mr;
}

/*
 * [start, end) is no longer mapped (uffd.h; on the watcher thread): the
 * MRs over any part of it refuse every access from now on, local and
 * remote, with URSA_MEM_UNMAPPED, and leave the table same-host
 * requesters read, so none of them reaches whatever is mapped there next.
 * A NIC would go on reaching the old pages; ursa cannot keep private
 * pages without moving them, and refusing is the nearest safe behaviour.
 */
void ursa_mr_unmapped(uintptr_t start, uintptr_t end)
{
	struct ursa_device *dev = ursa_device_get();
	struct gone_walk w = { start, end, NULL, 0, 0 };

	if (!dev)
		return;
	/* the kernel dropped the locks with the pages: whatever an MR maps
	 * there next is locked (and watched) as on a first pin */
	ursa_pin_gone(&dev->pins, start, end);
	ursa_keytab_each(&dev->keys, URSA_KEY_MR_LKEY, gone_visit, &w);
	for (size_t i = 0; i < w.n; i++) {
		if (!atomic_exchange(&w.v[i]->gone, true)) {
			ursa_info("memory under MR lkey 0x%x (%#lx+%lu) unmapped while registered: its accesses are refused",
				  w.v[i]->ibv.lkey, (unsigned long)w.v[i]->addr,
				  (unsigned long)w.v[i]->length);
			unpublish(w.v[i]);
		}
		ursa_keyed_put(&w.v[i]->lk);
	}
	free(w.v);
}

/* ursa_mr_rereg's checks, before anything changes. */
static int rereg_check(const struct ursa_mr *mr, int flags, void *addr,
		       size_t length, unsigned int access)
{
	int ret;

	if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
		      IBV_REREG_MR_CHANGE_ACCESS) || !flags)
		return -EINVAL;
	if (atomic_load(&mr->mw_binds))
		return -EBUSY;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		ret = ursa_access_check(access);
		if (ret)
			return ret;
		if ((access & IBV_ACCESS_ON_DEMAND) != (mr->odp ? IBV_ACCESS_ON_DEMAND : 0))
			return -EINVAL;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		ret = check_range(addr, length);
		if (ret)
			return ret;
	}
	return 0;
}

/* ursa_mr_rereg's new translation, the MR fenced off: the new range is
 * mapped first, so a failure leaves the old one in place. */
static int rereg_translation(struct ursa_mr *mr, void *addr, size_t length)
{
	struct ursa_mr tmp;
	int ret;

	memset(&tmp, 0, sizeof(tmp));
	tmp.odp = mr->odp;
	ret = mr_map(&tmp, addr, length);
	if (ret)
		return ret;
	mr_unmap(mr);
	mr->mtt = tmp.mtt;
	mr->pin_start = tmp.pin_start;
	mr->pin_end = tmp.pin_end;
	mr->cached = tmp.cached;
	mr->shm = tmp.shm;
	mr->addr = (uintptr_t)addr;
	atomic_store(&mr->gone, false);
	mr->iova = (uintptr_t)addr;
	mr->length = length;
	mr->ibv.addr = addr;
	mr->ibv.length = length;
	return 0;
}

int ursa_mr_rereg(struct ursa_mr *mr, int flags, struct ursa_pd *pd,
		  void *addr, size_t length, unsigned int access)
{
	int ret = rereg_check(mr, flags, addr, length, access);

	if (ret)
		return ret;
	/* Fence off accesses while the MR changes: the keys stay the same
	 * but the MR is invalid until the new translation is in place. */
	atomic_store(&mr->state, URSA_MR_INVALID);
	ursa_qp_lcache_drop(to_uctx(mr->pd->ibv.context), mr);
	unpublish(mr);
	wait_idle(&mr->lk);
	wait_idle(&mr->rk);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		ret = rereg_translation(mr, addr, length);
		if (ret) {
			/* (the old translation stands: valid again) */
			atomic_store(&mr->state, URSA_MR_VALID);
			ursa_pub_mr_add(mr);
			return ret;
		}
	}
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		atomic_fetch_sub(&mr->pd->refs, 1);
		mr->pd = pd;
		atomic_fetch_add(&pd->refs, 1);
		mr->ibv.pd = &pd->ibv;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr->access = access & ~IBV_ACCESS_OPTIONAL_RANGE;
	atomic_store_explicit(&mr->state, URSA_MR_VALID, memory_order_release);
	ursa_pub_mr_add(mr);
	return 0;
}

int ursa_mem_local(struct ursa_pd *pd, const struct ibv_sge *sge,
		   unsigned int need, struct ursa_mem_ref *ref)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_keyed *k;
	int ret;

	ref->k = NULL;
	k = ursa_keytab_get(&dev->keys, sge->lkey, URSA_KEY_MR_LKEY, NULL);
	if (!k)
		return URSA_MEM_BAD_KEY;
	ref->k = k;
	ref->mr = container_of(k, struct ursa_mr, lk);
	ret = ursa_mr_local_check(ref->mr, pd, sge, need, &ref->va);
	if (ret)
		ursa_mem_put(ref);
	return ret;
}

/*
 * The key table costs a read lock, its unlock and a reference (four locked
 * instructions with the put) per SGE: a fifth of a same-host post. The
 * requester (the post shortcut and the engine) and the responder (a SEND
 * in one piece) keep the last MR they used instead, without a reference:
 * they run under ctx->qp_lock, and deregistration and rereg mark the MR
 * invalid and then clear every cache of the context under that lock
 * before they unpin or free it. A fill happens only after the checks
 * passed under a reference, so a cached MR was valid when cached; the
 * state is checked again at every use.
 */
int ursa_mem_local_fill(struct ursa_qp *qp, struct ursa_mr **slot,
			const struct ibv_sge *sge, unsigned int need,
			struct ursa_mem_ref *ref)
{
	int ret = ursa_mem_local(qp->pd, sge, need, ref);

	if (!ret)
		*slot = ref->mr;
	return ret;
}

int ursa_mem_remote(struct ursa_pd *pd, uint32_t qpn, uint32_t rkey,
		    uint64_t va, uint64_t len, unsigned int need,
		    struct ursa_mem_ref *ref)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_keyed *k;
	uint8_t kind;
	int ret;

	ref->k = NULL;
	k = ursa_keytab_get(&dev->keys, rkey, URSA_KEY_MR_RKEY | URSA_KEY_MW,
			    &kind);
	if (!k)
		return URSA_MEM_BAD_KEY;
	ref->k = k;
	if (kind == URSA_KEY_MR_RKEY) {
		struct ursa_mr *mr = container_of(k, struct ursa_mr, rk);

		ref->mr = mr;
		if (atomic_load_explicit(&mr->state, memory_order_acquire) !=
		    URSA_MR_VALID)
			ret = URSA_MEM_BAD_KEY;
		else if (mr->pd != pd)
			ret = URSA_MEM_BAD_PD;
		else if (!ursa_in_bounds(mr->iova, mr->length, va, len))
			ret = URSA_MEM_BAD_BOUNDS;
		else if ((mr->access & need) != need)
			ret = URSA_MEM_BAD_ACCESS;
		else
			ret = ursa_mr_translate(mr, va, len, &ref->va);
	} else {
		struct ursa_mw *mw = container_of(k, struct ursa_mw, k);

		pthread_mutex_lock(&mw->lock);
		ref->mr = mw->mr;
		if (mw->state != URSA_MW_VALID || !mw->mr)
			ret = URSA_MEM_BAD_KEY;
		else if (mw->pd != pd)
			ret = URSA_MEM_BAD_PD;
		else if (mw->ibv.type == IBV_MW_TYPE_2 && mw->qpn != qpn)
			ret = URSA_MEM_BAD_QP;
		else if (!ursa_in_bounds(mw->addr, mw->length, va, len))
			ret = URSA_MEM_BAD_BOUNDS;
		else if ((mw->access & need) != need)
			ret = URSA_MEM_BAD_ACCESS;
		else
			ret = ursa_mr_translate(mw->mr, va, len, &ref->va);
		pthread_mutex_unlock(&mw->lock);
	}
	if (ret)
		ursa_mem_put(ref);
	return ret;
}

int ursa_mw_alloc(struct ursa_pd *pd, enum ibv_mw_type type,
		  struct ursa_mw **out)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_mw *mw;
	int ret;

	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)
		return -EINVAL;
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return -ENOMEM;
	pthread_mutex_init(&mw->lock, NULL);
	mw->pd = pd;
	mw->state = URSA_MW_FREE;
	ret = ursa_keytab_add(&dev->keys, &mw->k, URSA_KEY_MW, &mw->ibv.rkey);
	if (ret) {
		free(mw);
		return ret;
	}
	mw->ibv.context = pd->ibv.context;
	mw->ibv.pd = &pd->ibv;
	mw->ibv.type = type;
	mw->ibv.handle = mw->ibv.rkey;
	mw->key = mw->ibv.rkey;
	atomic_fetch_add(&pd->refs, 1);
	*out = mw;
	return 0;
}

/* Caller holds mw->lock. */
static void mw_unbind_locked(struct ursa_mw *mw, int new_state)
{
	if (mw->mr)
		atomic_fetch_sub(&mw->mr->mw_binds, 1);
	mw->mr = NULL;
	mw->addr = mw->length = 0;
	mw->access = 0;
	mw->state = new_state;
}

int ursa_mw_dealloc(struct ursa_mw *mw)
{
	struct ursa_device *dev = ursa_device_get();

	/* Keys are looked up by their current value: remove it first. */
	pthread_mutex_lock(&mw->lock);
	ursa_keytab_del(&dev->keys, mw->key);
	mw_unbind_locked(mw, URSA_MW_INVALID);
	pthread_mutex_unlock(&mw->lock);
	wait_idle(&mw->k);
	atomic_fetch_sub(&mw->pd->refs, 1);
	pthread_mutex_destroy(&mw->lock);
	free(mw);
	return 0;
}

enum ibv_wc_status ursa_mw_bind(struct ursa_qp *qp, struct ursa_mw *mw,
				uint32_t new_rkey,
				const struct ibv_mw_bind_info *b)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_mr *mr = b->mr ? to_umr(b->mr) : NULL;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	unsigned int acc = b->mw_access_flags;

	pthread_mutex_lock(&mw->lock);
	/* IBTA 10.6.7.2: checks on the window, the MR and the range. */
	if (mw->pd != qp->pd && mw->ibv.type == IBV_MW_TYPE_2)
		st = IBV_WC_MW_BIND_ERR;
	else if (mw->ibv.type == IBV_MW_TYPE_2 && mw->state == URSA_MW_VALID)
		st = IBV_WC_MW_BIND_ERR;	/* C10-72: must be free */
	else if (b->length == 0 && mw->ibv.type == IBV_MW_TYPE_1)
		; /* zero-length bind of a type 1 window: unbind */
	else if (!mr || atomic_load(&mr->state) != URSA_MR_VALID ||
		 mr->pd != mw->pd)
		st = IBV_WC_MW_BIND_ERR;
	else if (!(mr->access & IBV_ACCESS_MW_BIND))
		st = IBV_WC_MW_BIND_ERR;
	else if (acc & ~URSA_ACCESS_SUPPORTED)
		st = IBV_WC_MW_BIND_ERR;	/* an unknown flag */
	else if ((acc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
		 !(mr->access & IBV_ACCESS_LOCAL_WRITE))
		st = IBV_WC_MW_BIND_ERR;
	else if (!ursa_in_bounds(mr->iova, mr->length, b->addr, b->length))
		st = IBV_WC_MW_BIND_ERR;
	/* C10-75: the new key keeps the window's index; only the key byte
	 * may change. */
	if (st == IBV_WC_SUCCESS && new_rkey != mw->key &&
	    ursa_keytab_rekey(&dev->keys, mw->key, new_rkey))
		st = IBV_WC_MW_BIND_ERR;
	if (st == IBV_WC_SUCCESS) {
		mw_unbind_locked(mw, URSA_MW_FREE);
		mw->key = new_rkey;
		mw->ibv.rkey = new_rkey;
		if (b->length || mw->ibv.type == IBV_MW_TYPE_2) {
			mw->mr = mr;
			atomic_fetch_add(&mr->mw_binds, 1);
			mw->addr = b->addr;
			mw->length = b->length;
			/* Only the remote rights and zero-basing mean
			 * anything for a window; the rest (LOCAL_WRITE,
			 * which pyverbs passes) is ignored, as by rxe
			 * and mlx5. */
			mw->access = acc & (IBV_ACCESS_REMOTE_WRITE |
					    IBV_ACCESS_REMOTE_READ |
					    IBV_ACCESS_REMOTE_ATOMIC |
					    IBV_ACCESS_ZERO_BASED);
			mw->qpn = qp->ex.qp_base.qp_num;
			mw->state = URSA_MW_VALID;
		}
	}
	pthread_mutex_unlock(&mw->lock);
	return st;
}

int ursa_invalidate(struct ursa_pd *pd, uint32_t qpn, uint32_t rkey)
{
	struct ursa_device *dev = ursa_device_get();
	struct ursa_keyed *k;
	struct ursa_mw *mw;
	uint8_t kind;
	int ret = 0;

	k = ursa_keytab_get(&dev->keys, rkey, URSA_KEY_MW | URSA_KEY_MR_RKEY,
			    &kind);
	if (!k)
		return -EINVAL;
	if (kind != URSA_KEY_MW) {
		/* Only fast-registered MRs can be invalidated, and ursa has
		 * none: invalidating a regular MR is an invalid request. */
		ursa_keyed_put(k);
		return -EINVAL;
	}
	mw = container_of(k, struct ursa_mw, k);
	pthread_mutex_lock(&mw->lock);
	/* IBTA 10.6.7.2.5: only a valid type 2 window, in the QP's PD and
	 * bound through that QP, can be invalidated. */
	if (mw->ibv.type != IBV_MW_TYPE_2 || mw->state != URSA_MW_VALID ||
	    mw->pd != pd || mw->qpn != qpn)
		ret = -EINVAL;
	else
		mw_unbind_locked(mw, URSA_MW_FREE);
	pthread_mutex_unlock(&mw->lock);
	ursa_keyed_put(k);
	return ret;
}
