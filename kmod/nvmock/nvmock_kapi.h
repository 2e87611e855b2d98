/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvmock's in-kernel RM entry, for other modules (qgpu.ko), modelled on nvidia.ko's kernel-client
 * interface: nvidia_get_rm_ops() hands out an op function that runs RM API calls as a
 * kernel-privileged client, able to act on any client's objects. The caller names the driver
 * version it was built for; a mismatch is refused.
 *
 * The op sleeps (it takes the RM lock): call it from process context, never from a timer.
 */
#ifndef _NVMOCK_KAPI_H
#define _NVMOCK_KAPI_H

#include "../uapi/nvrm.h"
#include "../uapi/nvmock.h"

#define NVMOCK_RMAPI_OP_FREE	0x00	/* NVOS00 */
#define NVMOCK_RMAPI_OP_ALLOC	0x15	/* NVOS64; pAllocParms is a kernel pointer */
#define NVMOCK_RMAPI_OP_CONTROL	0x36	/* NVOS54; params is a kernel pointer */

struct nvmock_kernel_rmapi_op {
	__u32 op;
	union {
		struct nvos00_params free;
		struct nvos64_params alloc;
		struct nvos54_params control;
	} params;
};

struct nvmock_rm_ops {
	char version_string[64];	/* in: the caller's; must equal the driver's */
	int (*op)(struct nvmock_kernel_rmapi_op *op);	/* 0, or -EOPNOTSUPP for an unknown op */
};

int nvmock_get_rm_ops(struct nvmock_rm_ops *ops);

#endif /* _NVMOCK_KAPI_H */
