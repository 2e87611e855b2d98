// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the in-kernel RM entry (see nvmock_kapi.h).
 */
#include <linux/export.h>
#include <linux/string.h>

#include "nvmock.h"
#include "nvmock_kapi.h"

static int rmapi_op(struct nvmock_kernel_rmapi_op *op)
{
	static const struct nvmock_caller kernel = { .kernel = true };
	int ret = 0;

	mutex_lock(&nvmock_lock);
	switch (op->op) {
	case NVMOCK_RMAPI_OP_FREE: {
		struct nvos00_params *p = &op->params.free;

		p->status = nvmock_rm_free(&kernel, p->hRoot, p->hObjectParent, p->hObjectOld);
		break;
	}
	case NVMOCK_RMAPI_OP_ALLOC: {
		struct nvos64_params *p = &op->params.alloc;

		p->status = nvmock_rm_alloc(&kernel, p->hRoot, p->hObjectParent, &p->hObjectNew,
					    p->hClass, NULL, (void *)(uintptr_t)p->pAllocParms);
		break;
	}
	case NVMOCK_RMAPI_OP_CONTROL:
		op->params.control.status = nvmock_rm_control(&kernel, &op->params.control, true);
		break;
	default:
		ret = -EOPNOTSUPP;
		break;
	}
	mutex_unlock(&nvmock_lock);
	return ret;
}

int nvmock_get_rm_ops(struct nvmock_rm_ops *ops)
{
	if (strncmp(ops->version_string, NVMOCK_VERSION_STRING, sizeof(ops->version_string)))
		return -EINVAL;
	ops->op = rmapi_op;
	return 0;
}
EXPORT_SYMBOL_GPL(nvmock_get_rm_ops);
