/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvmock's in-kernel RM entry, for other modules (qgpu.ko), with the shape of nvidia.ko's
 * kernel-client interface (the one nvidia-modeset uses): nvidia_get_rm_ops() checks the
 * caller's version string and hands out a per-thread stack allocator and an op function that
 * runs RM API calls as a kernel-privileged client, able to act on any client's objects.
 * Because nvmock exports the driver's symbol name, it cannot be loaded next to nvidia.ko.
 *
 * The op sleeps (it takes the RM lock): call it from process context, never from a timer.
 */
#ifndef _NVMOCK_KAPI_H
#define _NVMOCK_KAPI_H

#include "../uapi/nvrm.h"
#include "../uapi/nvmock.h"

#define NVMOCK_RMAPI_OP_FREE	0x00	/* NVOS00 */
#define NVMOCK_RMAPI_OP_ALLOC	0x15	/* NVOS21; pAllocParms is a kernel pointer */
#define NVMOCK_RMAPI_OP_CONTROL	0x36	/* NVOS54; params is a kernel pointer */

struct nvmock_kernel_rmapi_op {
	__u32 op;
	union {
		struct nvos00_params free;
		struct nvos21_params alloc;
		struct nvos54_params control;
	} params;
};

/* The members in the driver's order; those nvmock does not model stay NULL. */
struct nvmock_rm_ops {
	const char *version_string;	/* in: the caller's; must equal the driver's */
	struct {
		__u8 allow_write_combining;
	} system_info;
	int (*alloc_stack)(void **sp);
	void (*free_stack)(void *sp);
	__u32 (*enumerate_gpus)(void *gpu_info);
	int (*open_gpu)(__u32 gpu_id, void *sp);
	void (*close_gpu)(__u32 gpu_id, void *sp);
	void (*op)(void *sp, void *ops_cmd);	/* a struct nvmock_kernel_rmapi_op */
	int (*set_callbacks)(const void *callbacks);
};

/* NV_OK, or NV_ERR_GENERIC for another version. */
__u32 nvidia_get_rm_ops(struct nvmock_rm_ops *ops);

#endif /* _NVMOCK_KAPI_H */
