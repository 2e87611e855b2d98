// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the memory gate. Device memory is charged to a cgroup from what RM says it allocated
 * (its size after rounding), never from what the tenant asked for or wrote back.
 *
 * A charge is a record shared by every tracked object that references the same memory: the
 * object RM_ALLOC or VID_HEAP_CONTROL made and its duplicates that RM confirms (DUP_OBJECT in the
 * same client). It stays on the cgroup it was first charged to until the last of them is gone,
 * so freeing the original while a duplicate lives moves nothing off the owner.
 *
 * No lock is held across the driver's call. A device-memory allocation is charged in two steps,
 * as memcg's try_charge and commit: before the call, under qgpu_lock, the size the tenant asked
 * for (on qgpu's one copy of the argument) is reserved against the cgroup's limit, or the call
 * refused; after it, again under qgpu_lock, the reservation is released and what RM reports it
 * allocated is charged, if it fits beside the charges and the other reservations (else RM frees
 * it again: ioctl.c). A cgroup's charges and reservations together stay within its limit, so
 * concurrent allocations of one cgroup cannot make RM hold more of its device memory than the
 * limit (plus RM's rounding of a call in flight), even between the driver's answer and qgpu's
 * settling of it.
 */
#include <linux/lockdep.h>
#include <linux/slab.h>

#include "qgpu.h"

struct qgpu_mem {
	u32 refs;			/* tracked objects that reference it */
	struct qgpu_cg *cg;		/* charged to, while refs > 0 */
	u64 bytes;			/* > 0 */
};

/**
 * qgpu_mem_class() - whether allocating an object of @hclass takes device memory
 * @hclass: an RM class
 *
 * NV01_MEMORY_LOCAL_USER (what VID_HEAP_CONTROL's allocating functions also make) and
 * NV_MEMORY_FABRIC (memoryfabricConstruct in src/nvidia/src/kernel/mem_mgr/mem_fabric.c
 * allocates the physical memory it exports).
 *
 * Context: any.
 * Return: true for the classes the memory gate charges.
 */
bool qgpu_mem_class(u32 hclass)
{
	return hclass == NV01_MEMORY_LOCAL_USER || hclass == NV_MEMORY_FABRIC;
}

/**
 * qgpu_gate_limited() - whether a caller's cgroup has a memory limit
 * @id: the caller's governing cgroup (qgpu_current_cgroup_id())
 *
 * For memory qgpu cannot charge (exports, dma-buf, managed memory): refused where a limit holds.
 *
 * Context: process context; takes qgpu_lock.
 * Return: true when @id is configured with a memory limit.
 */
bool qgpu_gate_limited(u64 id)
{
	struct qgpu_cg *cg;
	bool limited;

	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	limited = cg && cg->mem_limit;
	mutex_unlock(&qgpu_lock);
	return limited;
}

/**
 * qgpu_gate_refused() - count and announce a refusal a memory limit made
 * @id: the caller's governing cgroup
 *
 * Every refusal a memory limit makes is the memory gate's, whatever the tenant is answered
 * (NV_ERR_INSUFFICIENT_PERMISSIONS, -EPERM): counted in oom and sent as QGPU_EVENT_OOM
 * (uapi/qgpu.h).
 *
 * Context: process context; takes qgpu_lock.
 */
void qgpu_gate_refused(u64 id)
{
	struct qgpu_cg *cg;

	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	if (cg)
		cg->oom++;
	mutex_unlock(&qgpu_lock);
	qgpu_event(QGPU_EVENT_OOM, id, 0);
}

/**
 * qgpu_gate_fits() - whether @bytes more fit under @cg's memory limit
 * @cg: the cgroup to charge
 * @bytes: the size
 *
 * What @cg has charged and what it has reserved for allocations in flight both count.
 *
 * Context: qgpu_lock held.
 * Return: true when @cg has no limit or @bytes fit under it.
 */
bool qgpu_gate_fits(const struct qgpu_cg *cg, u64 bytes)
{
	u64 held = cg->mem_used + cg->mem_reserved;

	lockdep_assert_held(&qgpu_lock);
	return !cg->mem_limit || (bytes <= cg->mem_limit && held <= cg->mem_limit - bytes);
}

/**
 * qgpu_gate_reserve() - reserve @bytes under @cg's limit for an allocation about to be sent
 * @cg: the cgroup the allocation will be charged to
 * @bytes: the size asked for
 * @resv: filled with the reservation, to settle with qgpu_gate_unreserve() once RM answered
 *
 * A cgroup without a limit reserves nothing (@resv is left empty) and always fits. A cgroup
 * with a reservation is not dropped (qgpu_cg_put_if_unused()) until the reservation is settled.
 *
 * Context: qgpu_lock held.
 * Return: true if @bytes fit beside @cg's charges and reservations (and are now reserved).
 */
bool qgpu_gate_reserve(struct qgpu_cg *cg, u64 bytes, struct qgpu_resv *resv)
{
	lockdep_assert_held(&qgpu_lock);
	resv->cg = NULL;
	resv->bytes = 0;
	if (!qgpu_gate_fits(cg, bytes))
		return false;
	if (cg->mem_limit && bytes) {
		cg->mem_reserved += bytes;
		resv->cg = cg;
		resv->bytes = bytes;
	}
	return true;
}

/**
 * qgpu_gate_unreserve() - release a reservation (the allocation was answered)
 * @resv: the reservation; NULL or empty: nothing to release. Empty afterwards.
 *
 * Context: qgpu_lock held.
 */
void qgpu_gate_unreserve(struct qgpu_resv *resv)
{
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	if (!resv || !resv->cg)
		return;
	cg = resv->cg;
	cg->mem_reserved -= min(cg->mem_reserved, resv->bytes);
	resv->cg = NULL;
	resv->bytes = 0;
	qgpu_cg_put_if_unused(cg);
}

/**
 * qgpu_gate_charge() - charge @bytes of new device memory to @cg, referenced by @obj
 * @obj: the tracked memory object
 * @cg: the cgroup that owns it
 * @bytes: its size as RM allocated it
 *
 * The caller has checked the limit (qgpu_gate_fits()), or charges past it memory that RM would
 * not free. Context: qgpu_lock held.
 * Return: 0, or -ENOMEM when there was no memory for the record (the memory is then charged
 * to nothing, as any object qgpu could not record).
 */
int qgpu_gate_charge(struct qgpu_obj *obj, struct qgpu_cg *cg, u64 bytes)
{
	struct qgpu_mem *mem;

	lockdep_assert_held(&qgpu_lock);
	if (!bytes)
		return 0;
	/* Its client's cgroup governs it, should a configuration change have moved the client. */
	if (obj->client)
		cg = obj->client->cg;
	mem = kzalloc(sizeof(*mem), GFP_KERNEL);
	if (!mem)
		return -ENOMEM;
	mem->refs = 1;
	mem->cg = cg;
	mem->bytes = bytes;
	cg->mem_used += bytes;
	obj->mem = mem;
	return 0;
}

/**
 * qgpu_gate_share() - make @obj another reference to @orig's charge
 * @obj: a tracked duplicate of @orig, as RM confirmed
 * @orig: the tracked original
 *
 * Context: qgpu_lock held.
 */
void qgpu_gate_share(struct qgpu_obj *obj, const struct qgpu_obj *orig)
{
	lockdep_assert_held(&qgpu_lock);
	if (!orig->mem || obj->mem)
		return;
	obj->mem = orig->mem;
	obj->mem->refs++;
}

/**
 * qgpu_gate_put() - drop @obj's reference to its charge; the last one uncharges the cgroup
 * @obj: a tracked object being dropped
 *
 * Context: qgpu_lock held.
 */
void qgpu_gate_put(struct qgpu_obj *obj)
{
	struct qgpu_mem *mem = obj->mem;

	lockdep_assert_held(&qgpu_lock);
	if (!mem)
		return;
	obj->mem = NULL;
	if (--mem->refs)
		return;
	mem->cg->mem_used -= mem->bytes;
	qgpu_cg_put_if_unused(mem->cg);
	kfree(mem);
}

/**
 * qgpu_gate_bytes() - the size of the memory @obj references (0 for none)
 * @obj: a tracked object
 *
 * Context: qgpu_lock held.
 * Return: the bytes charged for it.
 */
u64 qgpu_gate_bytes(const struct qgpu_obj *obj)
{
	lockdep_assert_held(&qgpu_lock);
	return obj->mem ? obj->mem->bytes : 0;
}

/**
 * qgpu_gate_move() - charge the memory @obj references to @to, if @from holds the charge
 * @obj: a tracked object whose client is charged to @to from now on
 * @from: the cgroup its client was charged to
 * @to: the cgroup that governs its client now
 *
 * A charge shared by duplicates moves once: the first of them finds it on @from, the others on
 * @to already. A duplicate charged to another client's holder stays where it is.
 *
 * Context: qgpu_lock held.
 */
void qgpu_gate_move(struct qgpu_obj *obj, struct qgpu_cg *from, struct qgpu_cg *to)
{
	struct qgpu_mem *mem = obj->mem;

	lockdep_assert_held(&qgpu_lock);
	if (!mem || mem->cg != from || from == to)
		return;
	from->mem_used -= mem->bytes;
	to->mem_used += mem->bytes;
	mem->cg = to;
}
