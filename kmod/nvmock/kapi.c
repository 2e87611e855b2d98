// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the in-kernel RM entry, in nvidia.ko's shape (../uapi/nvrm_kapi.h). Because nvmock
 * exports the driver's symbol name, it cannot be loaded next to nvidia.ko.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/export.h>
#include <linux/printk.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "nvmock.h"
#include "../uapi/nvmock.h"
#include "../uapi/nvrm_kapi.h"

/* What a caller's stack stands for here: a check that one thread uses it at a time. */
struct rm_stack {
	atomic_t users;
};

static int alloc_stack(void **sp)
{
	struct rm_stack *stack = kzalloc(sizeof(*stack), GFP_KERNEL);

	*sp = stack;
	return stack ? 0 : -ENOMEM;
}

static void free_stack(void *sp)
{
	kfree(sp);
}

static void run_op(struct nvrm_kernel_op *op)
{
	static const struct nvmock_caller kernel = { .kernel = true };

	switch (op->op) {
	case NVRM_KERNEL_OP_FREE: {
		struct nvos00_params *p = &op->params.free;

		p->status = nvmock_rm_free(&kernel, p->hRoot, p->hObjectParent, p->hObjectOld);
		break;
	}
	case NVRM_KERNEL_OP_ALLOC: {
		struct nvos21_params *p = &op->params.alloc;

		p->status = nvmock_rm_alloc(&kernel, p->hRoot, p->hObjectParent, &p->hObjectNew,
					    p->hClass, NULL, (void *)(uintptr_t)p->pAllocParms);
		break;
	}
	case NVRM_KERNEL_OP_CONTROL:
		op->params.control.status = nvmock_rm_control(&kernel, &op->params.control, true);
		break;
	default:
		/* Like the driver, an op it does not know leaves the parameters alone. */
		break;
	}
}

static void rmapi_op(void *sp, void *ops_cmd)
{
	struct rm_stack *stack = sp;

	if (!stack || !ops_cmd)
		return;
	if (atomic_inc_return(&stack->users) != 1)
		pr_err_ratelimited("an RM stack used by two threads at once\n");
	mutex_lock(&nvmock_lock);
	run_op(ops_cmd);
	mutex_unlock(&nvmock_lock);
	atomic_dec(&stack->users);
}

u32 nvidia_get_rm_ops(struct nvrm_kernel_ops *ops)
{
	const char *version = ops->version_string;

	if (!version || strcmp(version, NVMOCK_VERSION_STRING))
		return NV_ERR_GENERIC;
	memset(ops, 0, sizeof(*ops));
	ops->version_string = NVMOCK_VERSION_STRING;
	ops->alloc_stack = alloc_stack;
	ops->free_stack = free_stack;
	ops->op = rmapi_op;
	return NV_OK;
}
EXPORT_SYMBOL_GPL(nvidia_get_rm_ops);
