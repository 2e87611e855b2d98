/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvidia.ko's kernel-client RM entry as qgpu uses it, declared in qgpu's names: the layout is
 * the driver's ABI (nvidia_modeset_rm_ops_t in nv-modeset-interface.h and
 * nvidia_kernel_rmapi_ops_t in nv-kernel-rmapi-ops.h of NVIDIA's open kernel modules). Only
 * the members qgpu calls are typed; the ops union is padded past the driver's largest member.
 */
#ifndef _QGPU_NVIDIA_KAPI_H
#define _QGPU_NVIDIA_KAPI_H

#include <linux/build_bug.h>
#include <linux/stddef.h>
#include <linux/types.h>

#include "../uapi/nvrm.h"

struct nvidia_rm_ops {
	const char *version_string;
	struct {
		u8 allow_write_combining;
	} system_info;
	int (*alloc_stack)(void **sp);
	void (*free_stack)(void *sp);
	u32 (*enumerate_gpus)(void *gpu_info);
	int (*open_gpu)(u32 gpu_id, void *sp);
	void (*close_gpu)(u32 gpu_id, void *sp);
	void (*op)(void *sp, void *ops_cmd);
	int (*set_callbacks)(const void *callbacks);
};

struct nvidia_rmapi_op {
	u32 op;
	union {
		struct nvos00_params free;
		struct nvos21_params alloc;
		struct nvos54_params control;
		/* The driver's union has larger members; room for them costs nothing. */
		u8 room[256];
	} params;
};

/* NV_STATUS nvidia_get_rm_ops(nvidia_modeset_rm_ops_t *), exported GPL by nvidia.ko. */
u32 nvidia_get_rm_ops(struct nvidia_rm_ops *ops);

/* Where the driver's 64-bit layout puts what qgpu calls. */
static_assert(offsetof(struct nvidia_rm_ops, alloc_stack) == 16);
static_assert(offsetof(struct nvidia_rm_ops, op) == 56);
static_assert(sizeof(struct nvidia_rm_ops) == 72);
static_assert(offsetof(struct nvidia_rmapi_op, params) == 8);

#endif /* _QGPU_NVIDIA_KAPI_H */
