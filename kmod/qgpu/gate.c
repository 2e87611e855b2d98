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
 * qgpu_obj_lock serializes the tenant calls whose outcome qgpu learns from RM afterwards
 * (RM_ALLOC, RM_FREE, RM_DUP_OBJECT, RM_VID_HEAP_CONTROL): between the driver's answer and RM's
 * account of it no other such call can add or remove objects. It is taken before qgpu_lock and
 * is held across the driver's ioctl, which takes RM's own API lock for these calls anyway.
 */
#include <linux/lockdep.h>
#include <linux/slab.h>

#include "qgpu.h"

/* Serializes tenant calls that add or remove RM objects, with what qgpu learns of them. */
DEFINE_MUTEX(qgpu_obj_lock);

struct qgpu_mem {
	u32 refs;			/* tracked objects that reference it */
	struct qgpu_cg *cg;		/* charged to, while refs > 0 */
	u64 bytes;			/* > 0 */
};

/*
 * Classes whose allocation takes device memory: NV01_MEMORY_LOCAL_USER (what VID_HEAP_CONTROL's
 * ALLOC_SIZE also makes) and NV_MEMORY_FABRIC (memoryfabricConstruct in src/nvidia/src/kernel/
 * mem_mgr/mem_fabric.c allocates the physical memory it exports).
 */
bool qgpu_mem_class(u32 hclass)
{
	return hclass == NV01_MEMORY_LOCAL_USER || hclass == NV_MEMORY_FABRIC;
}

/**
 * qgpu_gate_fits() - whether @bytes more fit under @cg's memory limit
 * @cg: the cgroup to charge
 * @bytes: the size
 *
 * Context: qgpu_lock held.
 * Return: true when @cg has no limit or @bytes fit under it.
 */
bool qgpu_gate_fits(const struct qgpu_cg *cg, u64 bytes)
{
	lockdep_assert_held(&qgpu_lock);
	return !cg->mem_limit || (bytes <= cg->mem_limit && cg->mem_used <= cg->mem_limit - bytes);
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
