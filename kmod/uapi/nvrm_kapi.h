/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The driver's in-kernel RM entry, for kernel modules only: nvidia.ko's kernel-client interface
 * (the one nvidia-modeset uses), in qpolicy's names. The layout is the driver's ABI
 * (nvidia_modeset_rm_ops_t in nv-modeset-interface.h and nvidia_kernel_rmapi_ops_t in
 * nv-kernel-rmapi-ops.h of NVIDIA's open kernel modules). nvmock implements it and qgpu calls
 * it, so both use this one declaration; it sits with nvrm.h because it is the same driver's.
 *
 * nvidia_get_rm_ops() checks the caller's version string and hands out a per-thread stack
 * allocator and an op function that runs RM API calls as a kernel-privileged client, able to
 * act on any client's objects. The op sleeps (it takes the RM lock): process context only.
 */
#ifndef _QPOLICY_NVRM_KAPI_H
#define _QPOLICY_NVRM_KAPI_H

#include <linux/build_bug.h>
#include <linux/stddef.h>
#include <linux/types.h>

#include "nvrm.h"

#define NVRM_KERNEL_OP_FREE	0x00	/* NVOS00 */
#define NVRM_KERNEL_OP_ALLOC	0x15	/* NVOS21; pAllocParms is a kernel pointer */
#define NVRM_KERNEL_OP_CONTROL	0x36	/* NVOS54; params is a kernel pointer */

/* The members in the driver's order; those qpolicy does not use are typed loosely. */
struct nvrm_kernel_ops {
	const char *version_string;	/* in: the caller's; must equal the driver's */
	struct {
		u8 allow_write_combining;
	} system_info;
	int (*alloc_stack)(void **sp);
	void (*free_stack)(void *sp);
	u32 (*enumerate_gpus)(void *gpu_info);
	int (*open_gpu)(u32 gpu_id, void *sp);
	void (*close_gpu)(u32 gpu_id, void *sp);
	void (*op)(void *sp, void *ops_cmd);	/* ops_cmd: a struct nvrm_kernel_op */
	int (*set_callbacks)(const void *callbacks);
};

struct nvrm_kernel_op {
	u32 op;
	union {
		struct nvos00_params free;
		struct nvos21_params alloc;
		struct nvos54_params control;
		/* The driver's union has larger members; room for them costs nothing. */
		u8 room[256];
	} params;
};

/*
 * NV_STATUS nvidia_get_rm_ops(nvidia_modeset_rm_ops_t *), exported GPL by nvidia.ko: NV_OK, or
 * NV_ERR_GENERIC for another version.
 */
u32 nvidia_get_rm_ops(struct nvrm_kernel_ops *ops);

/* Where the driver's 64-bit layout puts what qpolicy uses. */
static_assert(offsetof(struct nvrm_kernel_ops, alloc_stack) == 16);
static_assert(offsetof(struct nvrm_kernel_ops, op) == 56);
static_assert(sizeof(struct nvrm_kernel_ops) == 72);
static_assert(offsetof(struct nvrm_kernel_op, params) == 8);

#endif /* _QPOLICY_NVRM_KAPI_H */
