// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the in-kernel RM entry, in nvidia.ko's shape (../uapi/nvrm_kapi.h). Because nvmock
 * exports the driver's symbol name, it cannot be loaded next to nvidia.ko.
 *
 * What it follows, in NVIDIA's open kernel modules at tag 580.142:
 * - nvidia_get_rm_ops: kernel-open/nvidia/nv-modeset-interface.c.
 * - the stack calls: nv_kmem_cache_alloc_stack/free_stack in kernel-open/common/inc/nv-linux.h
 *   (no alternate stack in the open build: a NULL stack and success).
 * - op: rm_kernel_rmapi_op in src/nvidia/arch/nvalloc/unix/src/osapi.c, and the *Kernel entry
 *   points it calls in src/nvidia/src/kernel/rmapi/entry_points.c, which treat every pointer as
 *   a kernel address and run as RS_PRIV_LEVEL_KERNEL.
 * Where nvmock answers differently from the driver, the comment says so; kmod/nvmock/
 * CONFORMANCE.md lists all of it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/export.h>
#include <linux/printk.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nvmock.h"
#include "../uapi/nvmock.h"
#include "../uapi/nvrm_kapi.h"

/* RS_ACCESS_MASK (src/common/sdk/nvidia/inc/rs_access.h): one 32-bit limb. */
typedef u32 nvmock_rs_access_mask;

struct nvmock_kapi_stats nvmock_kapi;

static void record(u32 op, u32 what, u64 rights, u32 params_size, u32 flags, u32 status)
{
	struct nvmock_kapi_ring *ring = op == NVRM_KERNEL_OP_CONTROL ? &nvmock_kapi.controls_log :
					&nvmock_kapi.objects;
	struct nvmock_kapi_record *r = &ring->r[ring->next++ % NVMOCK_KAPI_LOG];

	r->op = op;
	r->what = what;
	r->rights = rights;
	r->params_size = params_size;
	r->flags = flags;
	r->status = status;
	if (status != NV_OK)
		nvmock_kapi.failed++;
	/* qgpu asks whether what a tenant freed is gone: "no" is the answer it hopes for. */
	if (op == NVRM_KERNEL_OP_CONTROL && what == NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO &&
	    (status == NV_ERR_OBJECT_NOT_FOUND || status == NV_ERR_INVALID_CLIENT))
		nvmock_kapi.absent++;
}

/* The open driver has no alternate stack: success, and no stack. */
static int alloc_stack(void **sp)
{
	*sp = NULL;
	return 0;
}

static void free_stack(void *sp)
{
}

static const struct nvmock_caller kernel = { .kernel = true };

/*
 * NV04_ALLOC: _nv04AllocWithAccess(pArgs, bUserModeArgs = false) in entry_points.c, reading
 * NVOS64.
 */
static void op_alloc(struct nvos64_params *p)
{
	u32 hnew = p->hObjectNew;
	nvmock_rs_access_mask rights;
	u32 status;

	nvmock_kapi.allocs++;
	/* Not the driver's: a test asked for this allocation to fail, as RM can when short. */
	if (nvmock_kapi.fail_armed && p->hClass == nvmock_kapi.fail_class) {
		nvmock_kapi.fail_armed = false;
		status = NV_ERR_INSUFFICIENT_RESOURCES;
		goto out;
	}
	/*
	 * flags: only FINN_SERIALIZED means anything (RMAPI_ALLOC_FLAGS_SERIALIZED): the driver
	 * then deserializes pAllocParms. nvmock does not model FINN serialization.
	 */
	if (p->flags & NVOS64_FLAGS_FINN_SERIALIZED) {
		status = NV_ERR_NOT_SUPPORTED;
		goto out;
	}
	/*
	 * pRightsRequested: when not NULL, serverAllocApiCopyIn (src/nvidia/src/kernel/rmapi/
	 * alloc_free.c) copies an RS_ACCESS_MASK from it with rmapiParamsCopyIn, which for a kernel
	 * caller is a plain memcpy (bRsAccessEnabled is set in serverConstruct,
	 * src/nvidia/src/libraries/resserv/src/rs_server.c). A pointer that is not readable kernel
	 * memory makes nvidia.ko fault; nvmock refuses it instead, loudly, so a test sees it. A
	 * readable mask is accepted and not modelled further (nvmock keeps no per-object rights).
	 */
	if (p->pRightsRequested &&
	    copy_from_kernel_nofault(&rights, (const void *)(uintptr_t)p->pRightsRequested,
				     sizeof(rights))) {
		nvmock_kapi.bad_rights++;
		pr_err_ratelimited("kernel ALLOC of class 0x%x: pRightsRequested 0x%llx is no kernel address (nvidia.ko would fault here)\n",
				   p->hClass, p->pRightsRequested);
		status = NV_ERR_INVALID_POINTER;
		goto out;
	}
	/*
	 * A client's handle is taken from hRoot (serverAllocClient, rs_server.c; the driver is
	 * built with RS_COMPATABILITY_MODE, src/nvidia/Makefile) and handed back in hObjectNew
	 * (_rmAlloc, alloc_free.c), and written into its optional NvHandle parameter:
	 * nvmock_rm_alloc does it all.
	 *
	 * pAllocParms is a kernel address, read in place for as many bytes as the class takes
	 * (rmapiGetClassAllocParamSize, src/nvidia/src/kernel/rmapi/resource_desc.c):
	 * paramsSize is not read.
	 */
	status = nvmock_rm_alloc(&kernel, p->hRoot, p->hObjectParent, &hnew, p->hClass, NULL,
				 (void *)(uintptr_t)p->pAllocParms);
	if (status == NV_OK)
		p->hObjectNew = hnew;
out:
	p->status = status;
	record(NVRM_KERNEL_OP_ALLOC, p->hClass, p->pRightsRequested, p->paramsSize, p->flags,
	       status);
}

/* NV01_FREE: _nv01Free in entry_points.c, which reads hRoot and hObjectOld only. */
static void op_free(struct nvos00_params *p)
{
	nvmock_kapi.frees++;
	p->status = nvmock_rm_free(&kernel, p->hRoot, p->hObjectParent, p->hObjectOld);
	record(NVRM_KERNEL_OP_FREE, p->hObjectOld, 0, 0, 0, p->status);
}

/* NV04_CONTROL: _nv04ControlWithSecInfo in entry_points.c; params is a kernel address. */
static void op_control(struct nvos54_params *p)
{
	nvmock_kapi.controls++;
	/*
	 * Not the driver's: a test asked for this control to fail, as one that goes to GSP can
	 * (NV_ERR_INVALID_STATE is among SET_TIMESLICE's documented answers, ctrla06c.h).
	 */
	if (nvmock_kapi.fail_controls && p->cmd == nvmock_kapi.fail_cmd) {
		nvmock_kapi.fail_controls--;
		if (nvmock_kapi.fail_acted)
			nvmock_rm_control(&kernel, p, true);
		p->status = NV_ERR_INVALID_STATE;
	} else {
		p->status = nvmock_rm_control(&kernel, p, true);
	}
	record(NVRM_KERNEL_OP_CONTROL, p->cmd, 0, p->paramsSize, p->flags, p->status);
}

/* The ops rm_kernel_rmapi_op runs that nvmock does not model, and where their status is. */
static int unmodelled_status_off(u32 op)
{
	switch (op) {
	case NVRM_KERNEL_OP_ALLOC_MEMORY:
		return NVRM_NVOS02_STATUS_OFF;
	case NVRM_KERNEL_OP_MAP_MEMORY:
		return NVRM_NVOS33_STATUS_OFF;
	case NVRM_KERNEL_OP_UNMAP_MEMORY:
		return NVRM_NVOS34_STATUS_OFF;
	case NVRM_KERNEL_OP_ALLOC_CONTEXT_DMA:
		return NVRM_NVOS39_STATUS_OFF;
	case NVRM_KERNEL_OP_MAP_MEMORY_DMA:
		return NVRM_NVOS46_STATUS_OFF;
	case NVRM_KERNEL_OP_UNMAP_MEMORY_DMA:
		return NVRM_NVOS47_STATUS_OFF;
	case NVRM_KERNEL_OP_BIND_CONTEXT_DMA:
		return NVRM_NVOS49_STATUS_OFF;
	case NVRM_KERNEL_OP_DUP_OBJECT:
		return NVRM_NVOS55_STATUS_OFF;
	case NVRM_KERNEL_OP_SHARE:
		return NVRM_NVOS57_STATUS_OFF;
	case NVRM_KERNEL_OP_ADD_VBLANK_CALLBACK:
		return NVRM_NVOS61_STATUS_OFF;
	default:
		return -1;
	}
}

static void run_op(struct nvrm_kernel_op *op)
{
	u8 *member = (u8 *)&op->params;
	u32 *nvos32;
	int off;

	switch (op->op) {
	case NVRM_KERNEL_OP_FREE:
		op_free(&op->params.free);
		return;
	case NVRM_KERNEL_OP_ALLOC:
		op_alloc(&op->params.alloc);
		return;
	case NVRM_KERNEL_OP_CONTROL:
		op_control(&op->params.control);
		return;
	case NVRM_KERNEL_OP_VID_HEAP_CONTROL:
		/* The member is a pointer to an NVOS32, which the driver uses in place. */
		nvmock_kapi.not_modelled++;
		memcpy(&nvos32, member, sizeof(nvos32));
		if (nvos32)
			nvos32[NVRM_NVOS32_STATUS_OFF / 4] = NV_ERR_NOT_SUPPORTED;
		record(op->op, 0, 0, 0, 0, NV_ERR_NOT_SUPPORTED);
		return;
	}
	off = unmodelled_status_off(op->op);
	if (off >= 0) {
		/* The driver would run these; nvmock answers that it cannot. */
		nvmock_kapi.not_modelled++;
		*(u32 *)(member + off) = NV_ERR_NOT_SUPPORTED;
		record(op->op, 0, 0, 0, 0, NV_ERR_NOT_SUPPORTED);
		return;
	}
	/* Like the driver's switch, an op it does not know leaves the parameters alone. */
	nvmock_kapi.unknown++;
}

/* The stack is not looked at, as in the open driver (NV_ENTER_RM_RUNTIME ignores it). */
/*
 * A test's delay (debugfs slow_kapi), not the driver's behaviour: the ops a thread group's
 * context sends (a hook's queries run in the tenant's) answer late, outside nvmock_lock.
 */
struct nvmock_slow nvmock_slow_kapi;

static void rmapi_op(void *sp, void *ops_cmd)
{
	mutex_lock(&nvmock_lock);
	run_op(ops_cmd);
	mutex_unlock(&nvmock_lock);
	nvmock_slow_wait(&nvmock_slow_kapi);
}

u32 nvidia_get_rm_ops(struct nvrm_kernel_ops *ops)
{
	/*
	 * The driver strcmp()s the caller's version with its own; on a mismatch it answers its
	 * version in version_string. (A NULL version_string would oops nvidia.ko; nvmock refuses.)
	 */
	const char *mine = READ_ONCE(nvmock_kapi.answer_version[0]) ?
			   nvmock_kapi.answer_version : NVMOCK_VERSION_STRING;

	if (!ops->version_string || strcmp(ops->version_string, mine)) {
		ops->version_string = mine;
		return NV_ERR_GENERIC;
	}
	/*
	 * The whole table, as the driver fills it, except enumerate_gpus, open_gpu, close_gpu and
	 * set_callbacks, which nvmock does not model and leaves NULL.
	 */
	memset(ops, 0, sizeof(*ops));
	ops->version_string = mine;
	/*
	 * nvidia_get_rm_ops (kernel-open/nvidia/nv-modeset-interface.c) sets it where
	 * NV_ALLOW_WRITE_COMBINING(FRAMEBUFFER) holds: on x86_64, wherever PAT is enabled
	 * (nv-linux.h), as on the GPU hosts; nvmock maps its BAR1 write-combined too (bar1.c).
	 */
	ops->system_info.allow_write_combining = true;
	ops->alloc_stack = alloc_stack;
	ops->free_stack = free_stack;
	ops->op = rmapi_op;
	return NV_OK;
}
EXPORT_SYMBOL_GPL(nvidia_get_rm_ops);
