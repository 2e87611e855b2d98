/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The driver's in-kernel RM entry, for kernel modules only: nvidia.ko's kernel-client interface
 * (the one nvidia-modeset uses), in qpolicy's names. nvmock implements it and qgpu calls it, so
 * both use this one declaration; it sits with nvrm.h because it is the same driver's.
 *
 * Facts from NVIDIA's open kernel modules, tag 580.142 (paths relative to that repository; sizes
 * and offsets for x86_64, checked by compiling the driver's own headers):
 *
 * - nvidia_get_rm_ops() (kernel-open/nvidia/nv-modeset-interface.c) is exported GPL
 *   (NV_EXPORT_SYMBOL is EXPORT_SYMBOL_GPL, kernel-open/common/inc/nv-linux.h). The caller sets
 *   version_string; the driver strcmp()s it with its NV_VERSION_STRING. On a mismatch it writes
 *   its own version into version_string and returns NV_ERR_GENERIC; on a match it fills the
 *   whole table (version_string then points at the driver's string) and returns NV_OK.
 * - alloc_stack() may succeed with *sp == NULL: nv_kmem_cache_alloc_stack()
 *   (kernel-open/common/inc/nv-linux.h) allocates a stack only when rm_is_altstack_in_use(),
 *   which is false unless the driver is built with __use_altstack__ (the open build is not). A
 *   caller checks the return value, never sp, and passes sp back as it got it.
 * - op() is rm_kernel_rmapi_op() (src/nvidia/arch/nvalloc/unix/src/osapi.c): a switch on
 *   ops_cmd->op that calls the *Kernel entry points (src/nvidia/src/kernel/rmapi/
 *   entry_points.c), and an op it does not know leaves everything alone. The Kernel entry
 *   points run with RS_PRIV_LEVEL_KERNEL and PARAM_LOCATION_KERNEL (XlateUserModeArgsToSecInfo
 *   in entry_points.c): every pointer in the parameters is a kernel address, used in place
 *   (rmapiParamsAcquire and rmapiParamsCopyIn in src/nvidia/src/kernel/rmapi/param_copy.c).
 *   The answer is written into the same union member: status, and for ALLOC hObjectNew.
 * - The op takes RM's locks and may sleep: process context only.
 */
#ifndef _QPOLICY_NVRM_KAPI_H
#define _QPOLICY_NVRM_KAPI_H

#include <linux/stddef.h>
#include <linux/types.h>

#include "nvrm.h"

/*
 * Op codes (src/common/sdk/nvidia/inc/nvos.h) and the union member each takes
 * (nvidia_kernel_rmapi_ops_t in src/nvidia/arch/nvalloc/unix/include/nv-kernel-rmapi-ops.h).
 */
#define NVRM_KERNEL_OP_FREE			0x00	/* NV01_FREE: NVOS00 */
#define NVRM_KERNEL_OP_ALLOC_MEMORY		0x02	/* NV01_ALLOC_MEMORY: NVOS02 */
#define NVRM_KERNEL_OP_ALLOC			0x15	/* NV04_ALLOC: NVOS64, not NVOS21 */
#define NVRM_KERNEL_OP_VID_HEAP_CONTROL		0x20	/* NV04_VID_HEAP_CONTROL: NVOS32 * */
#define NVRM_KERNEL_OP_MAP_MEMORY		0x21	/* NV04_MAP_MEMORY: NVOS33 */
#define NVRM_KERNEL_OP_UNMAP_MEMORY		0x22	/* NV04_UNMAP_MEMORY: NVOS34 */
#define NVRM_KERNEL_OP_ALLOC_CONTEXT_DMA	0x27	/* NV04_ALLOC_CONTEXT_DMA: NVOS39 */
#define NVRM_KERNEL_OP_MAP_MEMORY_DMA		0x2E	/* NV04_MAP_MEMORY_DMA: NVOS46 */
#define NVRM_KERNEL_OP_UNMAP_MEMORY_DMA		0x2F	/* NV04_UNMAP_MEMORY_DMA: NVOS47 */
#define NVRM_KERNEL_OP_BIND_CONTEXT_DMA		0x31	/* NV04_BIND_CONTEXT_DMA: NVOS49 */
#define NVRM_KERNEL_OP_CONTROL			0x36	/* NV04_CONTROL: NVOS54 */
#define NVRM_KERNEL_OP_DUP_OBJECT		0x37	/* NV04_DUP_OBJECT: NVOS55 */
#define NVRM_KERNEL_OP_ADD_VBLANK_CALLBACK	0x3D	/* NV04_ADD_VBLANK_CALLBACK: NVOS61 */
#define NVRM_KERNEL_OP_SHARE			0x3E	/* NV04_SHARE: NVOS57 */

/*
 * Where each op's status lies in its member, for the ops qpolicy declares no struct for
 * (offsetof(NVOSxx_PARAMETERS, status) in nvos.h). NV04_VID_HEAP_CONTROL's member is a pointer
 * to an NVOS32, whose status is at 20.
 */
#define NVRM_NVOS02_STATUS_OFF	40
#define NVRM_NVOS32_STATUS_OFF	20
#define NVRM_NVOS33_STATUS_OFF	40
#define NVRM_NVOS34_STATUS_OFF	24
#define NVRM_NVOS39_STATUS_OFF	48
#define NVRM_NVOS46_STATUS_OFF	56
#define NVRM_NVOS47_STATUS_OFF	40
#define NVRM_NVOS49_STATUS_OFF	12
#define NVRM_NVOS55_STATUS_OFF	24
#define NVRM_NVOS57_STATUS_OFF	20
#define NVRM_NVOS61_STATUS_OFF	52

/*
 * nvidia_modeset_rm_ops_t (kernel-open/common/inc/nv-modeset-interface.h), members in the
 * driver's order; those qpolicy does not use are typed loosely.
 */
struct nvrm_kernel_ops {
	const char *version_string;	/* in: the caller's; out: the driver's */
	struct {
		u8 allow_write_combining;	/* NvBool */
	} system_info;
	int (*alloc_stack)(void **sp);
	void (*free_stack)(void *sp);
	u32 (*enumerate_gpus)(void *gpu_info);	/* nv_gpu_info_t[NV_MAX_GPUS] */
	int (*open_gpu)(u32 gpu_id, void *sp);
	void (*close_gpu)(u32 gpu_id, void *sp);
	void (*op)(void *sp, void *ops_cmd);	/* ops_cmd: a struct nvrm_kernel_op */
	int (*set_callbacks)(const void *callbacks);
};

/*
 * nvidia_kernel_rmapi_ops_t (nv-kernel-rmapi-ops.h): the op, then a union of one parameter
 * struct per op. The largest member is NVOS46 (64 bytes); 8-byte members put the union at 8.
 */
struct nvrm_kernel_op {
	u32 op;
	union {
		struct nvos00_params free;	/* NVOS00_PARAMETERS */
		struct nvos64_params alloc;	/* NVOS64_PARAMETERS */
		struct nvos54_params control;	/* NVOS54_PARAMETERS */
		u8 raw[64];			/* the members qpolicy does not declare */
	} params;
};

/*
 * NV_STATUS nvidia_get_rm_ops(nvidia_modeset_rm_ops_t *), exported GPL by nvidia.ko: NV_OK, or
 * NV_ERR_GENERIC for another version (and version_string then names the driver's).
 */
u32 nvidia_get_rm_ops(struct nvrm_kernel_ops *ops);

/*
 * Every size and offset above, and the op codes, checked against the driver's headers
 * (nvidia_modeset_rm_ops_t, nvidia_kernel_rmapi_ops_t, nvos.h).
 */
#include "nvrm_kapi_layout.h"

#endif /* _QPOLICY_NVRM_KAPI_H */
