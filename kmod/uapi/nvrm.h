/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The subset of the NVIDIA Resource Manager user ABI that qpolicy's kernel code (nvmock.ko,
 * qgpu.ko) and tools (gpuload) speak: escape numbers, argument layouts, classes, controls and
 * status codes, for x86_64. Written from the project's ABI fact sheet (open-gpu-kernel-modules
 * 595.45.04) and the H200 trace; qpolicy/nvrm/abi.py is the Python mirror and
 * tests/unit/test_uapi.py keeps the two in agreement. What the driver defines too is checked
 * against its 580.142 headers by nvrm_layout.h, included at the end (the Layout section of
 * kmod/nvmock/CONFORMANCE.md).
 *
 * Every ioctl on /dev/nvidiactl and /dev/nvidiaN is _IOWR('F', nr, size); the driver looks at the
 * NR and the size only. RM escapes return 0 once dispatched and put RM's answer in a status field.
 */
#ifndef _UAPI_QPOLICY_NVRM_H
#define _UAPI_QPOLICY_NVRM_H

#include <linux/types.h>

#define NVRM_MAJOR		195
#define NVRM_CTL_MINOR		255
#define NVRM_MAX_GPU_MINOR	247
#define NVRM_IOCTL_MAGIC	'F'
#define NVRM_MAX_IOCTL_SIZE	16384

/* Escapes (the NR of the ioctl number). */
#define NV_ESC_RM_ALLOC_MEMORY			0x27
#define NV_ESC_RM_ALLOC_OBJECT			0x28
#define NV_ESC_RM_FREE				0x29
#define NV_ESC_RM_CONTROL			0x2A
#define NV_ESC_RM_ALLOC				0x2B
#define NV_ESC_RM_DUP_OBJECT			0x34
#define NV_ESC_RM_SHARE				0x35
#define NV_ESC_RM_I2C_ACCESS			0x39
#define NV_ESC_RM_IDLE_CHANNELS			0x41
#define NV_ESC_RM_VID_HEAP_CONTROL		0x4A
#define NV_ESC_RM_ACCESS_REGISTRY		0x4D
#define NV_ESC_RM_MAP_MEMORY			0x4E
#define NV_ESC_RM_UNMAP_MEMORY			0x4F
#define NV_ESC_RM_GET_EVENT_DATA		0x52
#define NV_ESC_RM_ALLOC_CONTEXT_DMA2		0x54
#define NV_ESC_RM_MAP_MEMORY_DMA		0x57
#define NV_ESC_RM_UNMAP_MEMORY_DMA		0x58
#define NV_ESC_RM_BIND_CONTEXT_DMA		0x59
#define NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO	0x5E
#define NV_ESC_CARD_INFO			0xC8
#define NV_ESC_REGISTER_FD			0xC9
#define NV_ESC_ALLOC_OS_EVENT			0xCE
#define NV_ESC_FREE_OS_EVENT			0xCF
#define NV_ESC_STATUS_CODE			0xD1
#define NV_ESC_CHECK_VERSION_STR		0xD2
#define NV_ESC_IOCTL_XFER_CMD			0xD3
#define NV_ESC_ATTACH_GPUS_TO_FD		0xD4
#define NV_ESC_QUERY_DEVICE_INTR		0xD5
#define NV_ESC_SYS_PARAMS			0xD6
#define NV_ESC_NUMA_INFO			0xD7
#define NV_ESC_SET_NUMA_STATUS			0xD8
#define NV_ESC_EXPORT_TO_DMABUF_FD		0xD9
#define NV_ESC_WAIT_OPEN_COMPLETE		0xDA

/* RM status codes (nvstatuscodes.h). */
#define NV_OK					0x00
#define NV_ERR_ILLEGAL_ACTION			0x16
#define NV_ERR_IN_USE				0x17
#define NV_ERR_INSERT_DUPLICATE_NAME		0x19
#define NV_ERR_INSUFFICIENT_RESOURCES		0x1A
#define NV_ERR_INSUFFICIENT_PERMISSIONS		0x1B
#define NV_ERR_INVALID_ADDRESS			0x1E
#define NV_ERR_INVALID_ARGUMENT			0x1F
#define NV_ERR_INVALID_CHANNEL			0x21
#define NV_ERR_INVALID_CLASS			0x22
#define NV_ERR_INVALID_CLIENT			0x23
#define NV_ERR_INVALID_COMMAND			0x24
#define NV_ERR_INVALID_DEVICE			0x26
#define NV_ERR_INVALID_OBJECT			0x31
#define NV_ERR_INVALID_OBJECT_HANDLE		0x33
#define NV_ERR_INVALID_OBJECT_NEW		0x34
#define NV_ERR_INVALID_OBJECT_OLD		0x35
#define NV_ERR_INVALID_OBJECT_PARENT		0x36
#define NV_ERR_INVALID_OWNER			0x39
#define NV_ERR_INVALID_PARAM_STRUCT		0x3A
#define NV_ERR_INVALID_PARAMETER		0x3B
#define NV_ERR_INVALID_POINTER			0x3D
#define NV_ERR_INVALID_REQUEST			0x3F
#define NV_ERR_INVALID_STATE			0x40
#define NV_ERR_NO_MEMORY			0x51
#define NV_ERR_NOT_SUPPORTED			0x56
#define NV_ERR_OBJECT_NOT_FOUND			0x57
#define NV_ERR_OPERATING_SYSTEM			0x59
#define NV_ERR_OUT_OF_RANGE			0x5B
#define NV_ERR_STATE_IN_USE			0x63
#define NV_ERR_UVM_ADDRESS_IN_USE		0x68
#define NV_ERR_RESOURCE_LOST			0x6E
#define NV_ERR_GENERIC				0xFFFF

/* Classes. */
#define NV01_ROOT			0x0000
#define NV01_ROOT_NON_PRIV		0x0001
#define NV01_ROOT_CLIENT		0x0041
#define NV01_MEMORY_SYSTEM		0x003E
#define NV01_MEMORY_LOCAL_USER		0x0040
#define NV01_DEVICE_0			0x0080
#define NV20_SUBDEVICE_0		0x2080
#define KERNEL_GRAPHICS_CONTEXT		0x0090
#define FERMI_CONTEXT_SHARE_A		0x9067
#define FERMI_VASPACE_A			0x90F1
#define KEPLER_CHANNEL_GROUP_A		0xA06C
#define AMPERE_CHANNEL_GPFIFO_A		0xC56F
#define HOPPER_CHANNEL_GPFIFO_A		0xC86F
#define HOPPER_USERMODE_A		0xC661
#define HOPPER_DMA_COPY_A		0xC8B5
#define HOPPER_COMPUTE_A		0xCBC0

/* Handles RM hands out when the caller asks for one (hObjectNew == 0). */
#define NVRM_CLIENT_HANDLE_BASE		0xC1D00000u
#define NVRM_OBJECT_HANDLE_BASE		0xCAF00000u

/* Control commands: class << 16 | category << 8 | index. */
#define NVA06C_CTRL_CMD_GPFIFO_SCHEDULE		0xA06C0101u
#define NVA06C_CTRL_CMD_SET_TIMESLICE		0xA06C0103u
#define NVA06C_CTRL_CMD_GET_TIMESLICE		0xA06C0104u
#define NVA06C_CTRL_CMD_PREEMPT			0xA06C0105u
#define NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL	0xA06C0107u
#define NVA06C_CTRL_CMD_GET_INTERLEAVE_LEVEL	0xA06C0108u
#define NVA06F_CTRL_CMD_GPFIFO_SCHEDULE		0xA06F0103u
#define NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN	0xC36F0108u
#define NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS	0x2080110Bu
/*
 * Scheduling levers beyond the timeslice (580.142: ctrla06c.h, ctrla06f/ctrla06fgpfifo.h,
 * ctrl2080/ctrl2080fifo.h, ctrl2080/ctrl2080gr.h under src/common/sdk/nvidia/inc/ctrl/).
 */
#define NVA06C_CTRL_CMD_MAKE_REALTIME		0xA06C0110u
#define NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL	0xA06F0109u
#define NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL	0xA06F0110u
#define NVA06F_CTRL_CMD_RESTART_RUNLIST		0xA06F0111u
#define NVA06F_CTRL_CMD_STOP_CHANNEL		0xA06F0112u
#define NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY	0x20801115u
#define NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE	0x20801210u
#define NV2080_CTRL_CMD_GR_GET_CTXSW_STATS	0x20801215u
#define NV2080_CTRL_CMD_GR_GET_CTXSW_MODES	0x20801235u

#define NVA06C_INTERLEAVE_LEVEL_HIGH		2
#define NV2080_DISABLE_CHANNELS_MAX		64
#define NVA06C_PREEMPT_MAX_TIMEOUT_US		1000000
#define NVRM_DEFAULT_TIMESLICE_US		1024

/* NVOS00: RM_FREE (16). */
struct nvos00_params {
	__u32 hRoot;
	__u32 hObjectParent;
	__u32 hObjectOld;
	__u32 status;
};

/* NVOS21: RM_ALLOC as sent with a 32-byte argument. */
struct nvos21_params {
	__u32 hRoot;
	__u32 hObjectParent;
	__u32 hObjectNew;
	__u32 hClass;
	__u64 pAllocParms;
	__u32 paramsSize;
	__u32 status;
};

/* NVOS64: RM_ALLOC as libcuda sends it (48). The first five fields match NVOS21. */
struct nvos64_params {
	__u32 hRoot;
	__u32 hObjectParent;
	__u32 hObjectNew;
	__u32 hClass;
	__u64 pAllocParms;
	__u64 pRightsRequested;
	__u32 paramsSize;
	__u32 flags;
	__u32 status;
	__u32 pad;
};

/* NVOS64.flags: the allocation parameters are FINN-serialized (nvos.h). */
#define NVOS64_FLAGS_FINN_SERIALIZED	0x00000001u

/* NVOS54: RM_CONTROL (32). */
struct nvos54_params {
	__u32 hClient;
	__u32 hObject;
	__u32 cmd;
	__u32 flags;
	__u64 params;
	__u32 paramsSize;
	__u32 status;
};

/* NVOS54.flags (nvos.h). */
#define NVOS54_FLAGS_IRQL_RAISED	0x00000001u
#define NVOS54_FLAGS_LOCK_BYPASS	0x00000002u
#define NVOS54_FLAGS_FINN_SERIALIZED	0x00000004u

/* NVOS33 with the fd to attach the mapping to: RM_MAP_MEMORY (56). */
struct nvos33_params_with_fd {
	__u32 hClient;
	__u32 hDevice;
	__u32 hMemory;
	__u32 pad;
	__u64 offset;
	__u64 length;
	__u64 pLinearAddress;
	__u32 status;
	__u32 flags;
	__s32 fd;
	__u32 pad2;
};

/* NVOS34: RM_UNMAP_MEMORY (32), the mapping RM_MAP_MEMORY made, by its pLinearAddress. */
struct nvos34_params {
	__u32 hClient;
	__u32 hDevice;
	__u32 hMemory;
	__u32 pad;
	__u64 pLinearAddress;
	__u32 status;
	__u32 flags;
};

/* NV_ESC_CARD_INFO: an array of these (72 each). */
struct nvrm_card_info {
	__u8 valid;
	__u8 pad0[3];
	__u32 domain;
	__u8 bus;
	__u8 slot;
	__u8 function;
	__u8 pad1;
	__u16 vendor_id;
	__u16 device_id;
	__u32 gpu_id;
	__u16 interrupt_line;
	__u8 pad2[2];
	__u64 reg_address;
	__u64 reg_size;
	__u64 fb_address;
	__u64 fb_size;
	__u32 minor_number;
	char dev_name[10];
	__u8 pad3[2];
};

/* NV_ESC_CHECK_VERSION_STR (72). */
struct nvrm_api_version {
	__u32 cmd;
	__u32 reply;
	char version[64];
};

#define NVRM_VERSION_CHECK_STRICT	0
#define NVRM_VERSION_CHECK_RELAXED	'1'
#define NVRM_VERSION_CHECK_QUERY	'2'
#define NVRM_VERSION_REPLY_RECOGNIZED	1

struct nvrm_sys_params {
	__u64 memblock_size;
};

struct nvrm_register_fd {
	__s32 ctl_fd;
};

struct nvrm_wait_open_complete {
	__s32 rc;
	__u32 adapter_status;
};

struct nvrm_xfer {
	__u32 cmd;
	__u32 size;
	__u64 ptr;
};

struct nvrm_os_event {
	__u32 hClient;
	__u32 hDevice;
	__u32 fd;
	__u32 status;
};

/* Allocation parameters. */
struct nv0080_alloc_params {
	__u32 deviceId;
	__u32 hClientShare;
	__u32 hTargetClient;
	__u32 hTargetDevice;
	__u32 flags;
	__u32 pad;
	__u64 vaSpaceSize;
	__u64 vaStartInternal;
	__u64 vaLimitInternal;
	__u32 vaMode;
	__u32 pad2;
};

struct nv2080_alloc_params {
	__u32 subDeviceId;
};

#define NV2080_MAX_SUBDEVICES	8	/* cl2080.h: NV_MAX_SUBDEVICES (nvlimits.h) */

struct nv_channel_group_alloc_params {
	__u32 hObjectError;
	__u32 hObjectEccError;
	__u32 hVASpace;
	__u32 engineType;
	__u8 bIsCallingContextVgpuPlugin;
	__u8 pad[3];
};

struct nv_memory_desc_params {
	__u64 base;
	__u64 size;
	__u32 addressSpace;
	__u32 cacheAttrib;
};

struct nv_channel_alloc_params {
	__u32 hObjectError;
	__u32 hObjectBuffer;
	__u64 gpFifoOffset;
	__u32 gpFifoEntries;
	__u32 flags;
	__u32 hContextShare;
	__u32 hVASpace;
	__u32 hUserdMemory[8];
	__u64 userdOffset[8];
	__u32 engineType;
	__u32 cid;
	__u32 subDeviceId;
	__u32 hObjectEccError;
	struct nv_memory_desc_params instanceMem;
	struct nv_memory_desc_params userdMem;
	struct nv_memory_desc_params ramfcMem;
	struct nv_memory_desc_params mthdbufMem;
	__u32 hPhysChannelGroup;
	__u32 internalFlags;
	struct nv_memory_desc_params errorNotifierMem;
	struct nv_memory_desc_params eccErrorNotifierMem;
	__u32 ProcessID;
	__u32 SubProcessID;
	__u32 encryptIv[3];
	__u32 decryptIv[3];
	__u32 hmacNonce[8];
	__u32 tpcConfigID;
	__u32 pad;
};

/* NVOS04 channel flag: not scheduled until GPFIFO_SCHEDULE(bEnable=1). */
#define NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING	0x00000040u
/*
 * NVOS04_FLAGS_GROUP_CHANNEL_THREAD 29:28: which of the context shares RM makes for a TSG in
 * legacy mode a channel without one runs in (0: the SYNC one, else the ASYNC one).
 */
#define NVOS04_FLAGS_GROUP_CHANNEL_THREAD_SHIFT	28
#define NVOS04_FLAGS_GROUP_CHANNEL_THREAD_MASK	0x3u
/* NVOS04_FLAGS_GROUP_CHANNEL_RUNQUEUE 4:4: runqueue 1 (libcuda's odd compute channels). */
#define NVOS04_FLAGS_GROUP_CHANNEL_RUNQUEUE	0x00000010u

struct nv_memory_alloc_params {
	__u32 owner;
	__u32 type;
	__u32 flags;
	__u32 width;
	__u32 height;
	__s32 pitch;
	__u32 attr;
	__u32 attr2;
	__u32 format;
	__u32 comprCovg;
	__u32 zcullCovg;
	__u32 pad;
	__u64 rangeLo;
	__u64 rangeHi;
	__u64 size;
	__u64 alignment;
	__u64 offset;
	__u64 limit;
	__u64 address;
	__u32 ctagOffset;
	__u32 hVASpace;
	__u32 internalflags;
	__u32 tag;
	__s32 numaNode;
	__u32 pad2;
};

struct nv_ctxshare_alloc_params {
	__u32 hVASpace;
	__u32 flags;
	__u32 subctxId;
};

/* NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT (1:0), compared whole by RM, and subctxId's bit 31. */
#define NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_SYNC			0
#define NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC			1
#define NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_SPECIFIED		2
#define NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC_PREFER_LOWER	3
#define NV_CTXSHARE_SUBCTXID_PREFER_LOWER_SUCCESS			0x80000000u

/* NV2080_ENGINE_TYPE_* (cl2080_notification.h): GR, and the copy engines COPY0 + n. */
#define NV2080_ENGINE_TYPE_GRAPHICS	1
#define NV2080_ENGINE_TYPE_COPY0	9
#define NV2080_ENGINE_TYPE_COPY9	18
/* Past the last engine type: a valid one lies strictly between NULL (0) and this. */
#define NV2080_ENGINE_TYPE_LAST		0x54

/* NVB0B5_ALLOCATION_PARAMETERS (8): a copy object's engine, a CE index (VERSION_0) or type. */
#define NVB0B5_ALLOCATION_PARAMETERS_VERSION_0	0
#define NVB0B5_ALLOCATION_PARAMETERS_VERSION_1	1
struct nvb0b5_alloc_params {
	__u32 version;
	__u32 engineType;
};

/* Control parameters. */
struct nva06c_gpfifo_schedule_params {
	__u8 bEnable;
	__u8 bSkipSubmit;
	__u8 bSkipEnable;
};

struct nva06c_timeslice_params {
	__u64 timesliceUs;
};

struct nva06c_preempt_params {
	__u8 bWait;
	__u8 bManualTimeout;
	__u8 pad[2];
	__u32 timeoutUs;
};

struct nva06c_interleave_level_params {
	__u32 tsgInterleaveLevel;
};

/* NVA06C_CTRL_MAKE_REALTIME_PARAMS */
struct nva06c_make_realtime_params {
	__u8 bRealtime;
};

/* NVA06F_CTRL_INTERLEAVE_LEVEL_PARAMS */
struct nva06f_interleave_level_params {
	__u32 channelInterleaveLevel;
};

/* NVA06F_CTRL_RESTART_RUNLIST_PARAMS */
struct nva06f_restart_runlist_params {
	__u8 bForceRestart;
	__u8 bBypassWait;
};

/* NVA06F_CTRL_STOP_CHANNEL_PARAMS */
struct nva06f_stop_channel_params {
	__u8 bImmediate;
};

/* NV2080_CTRL_FIFO_RUNLIST_SET_SCHED_POLICY_PARAMS */
struct nv2080_runlist_sched_policy_params {
	__u32 flags;
	__u32 schedPolicy;
};

#define NV2080_RUNLIST_SCHED_POLICY_FLAG_RESTORE		0x1
#define NV2080_RUNLIST_SCHED_POLICY_DEFAULT			0
#define NV2080_RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED_WDDM	2

/*
 * NV2080_CTRL_GR_SET_CTXSW_PREEMPTION_MODE_PARAMS; grRouteInfo (NV2080_CTRL_GR_ROUTE_INFO:
 * flags, then an 8-byte-aligned route) is spelled out as its two fields.
 */
struct nv2080_ctxsw_preemption_mode_params {
	__u32 flags;
	__u32 hChannel;
	__u32 gfxpPreemptMode;
	__u32 cilpPreemptMode;
	__u32 grRouteFlags;
	__u32 pad;
	__u64 grRoute;
};

/* Its flags say which of the two modes the call sets; compute modes WFI, CTA, CILP. */
#define NV2080_CTXSW_PREEMPTION_FLAG_CILP	0x1
#define NV2080_CTXSW_PREEMPTION_FLAG_GFXP	0x2
#define NV2080_CTXSW_PREEMPTION_COMPUTE_WFI	0
#define NV2080_CTXSW_PREEMPTION_COMPUTE_CTA	1
#define NV2080_CTXSW_PREEMPTION_COMPUTE_CILP	2
#define NV2080_CTXSW_PREEMPTION_GFX_GFXP_POOL	2

/*
 * NV2080_CTRL_GR_GET_CTXSW_STATS_PARAMS: how often GR saved and restored a TSG's context, the
 * saves by kind (wait-for-idle, CTA, CILP, GfxP). hChannel names the TSG.
 */
struct nv2080_ctxsw_stats_params {
	__u32 hChannel;
	__u32 flags;
	__u32 saveCnt;
	__u32 restoreCnt;
	__u32 wfiSaveCnt;
	__u32 ctaSaveCnt;
	__u32 cilpSaveCnt;
	__u32 gfxpSaveCnt;
};

#define NV2080_CTXSW_STATS_FLAG_RESET	0x1

/*
 * NV2080_CTRL_GR_GET_CTXSW_MODES_PARAMS: the context switch modes of hChannel's context, its
 * compute preemption mode among them (the NV2080_CTXSW_PREEMPTION_COMPUTE_* values).
 */
struct nv2080_ctxsw_modes_params {
	__u32 hChannel;
	__u32 zcullMode;
	__u32 pmMode;
	__u32 smpcMode;
	__u32 cilpPreemptMode;
	__u32 gfxpPreemptMode;
};

struct nvc36f_work_submit_token_params {
	__u32 workSubmitToken;
};

/*
 * What libcuda asks after each channel and engine object (the H200 trace): the channels' IDs
 * (two embedded lists of numChannels words), an object's class and engine, and the size of a
 * channel's GR context.
 */
#define NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST			0x0080170du
#define NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL	0xffffffffu
#define NV906F_CTRL_GET_CLASS_ENGINEID				0x906f0101u
#define NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE			0x20801218u

/*
 * QUERY_ECC_STATUS, which libcuda sends twice once its TSGs are scheduled: per unit whether ECC
 * is enabled, scrubbed and supported, and its error counts; then the GPU's poison and
 * uncorrectable-error flags.
 */
#define NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS	0x2080012fu
#define NV2080_CTRL_GPU_ECC_UNIT_COUNT		0x24

/* NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS (40): each count a QUERY_ECC_EXCEPTION_STATUS */
struct nv2080_ecc_unit_status {
	__u8 enabled;
	__u8 scrubComplete;
	__u8 supported;
	__u8 pad[5];
	__u64 dbe;
	__u64 dbeNonResettable;
	__u64 sbe;
	__u64 sbeNonResettable;
};

/* NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS (1464) */
struct nv2080_ecc_status_params {
	struct nv2080_ecc_unit_status units[NV2080_CTRL_GPU_ECC_UNIT_COUNT];
	__u8 bFatalPoisonError;
	__u8 uncorrectableError;
	__u8 pad[2];
	__u32 flags;
	__u32 grRouteFlags;	/* grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO */
	__u32 pad1;
	__u64 grRoute;
};

/* NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS (24) */
struct nv0080_channellist_params {
	__u32 numChannels;
	__u32 pad;
	__u64 pChannelHandleList;
	__u64 pChannelList;
};

/* NV906F_CTRL_GET_CLASS_ENGINEID_PARAMS (16) */
struct nv906f_class_engineid_params {
	__u32 hObject;
	__u32 classEngineID;
	__u32 classID;
	__u32 engineID;
};

/* NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS (16) */
struct nv2080_ctx_buffer_size_params {
	__u32 hChannel;
	__u32 pad;
	__u64 totalBufferSize;
};

struct nv2080_fifo_disable_channels_params {
	__u8 bDisable;
	__u8 pad0[3];
	__u32 numChannels;
	__u8 bOnlyDisableScheduling;
	__u8 bRewindGpPut;
	__u8 pad1[6];
	__u64 pRunlistPreemptEvent;
	__u32 hClientList[NV2080_DISABLE_CHANNELS_MAX];
	__u32 hChannelList[NV2080_DISABLE_CHANNELS_MAX];
};

/* Work submission (Volta+): the channel's USERD and the usermode doorbell. */
#define NVRM_USERD_SIZE			512
#define NVRM_USERD_GP_GET		0x88
#define NVRM_USERD_GP_PUT		0x8C
#define NVRM_USERMODE_SIZE		0x10000
#define NVRM_USERMODE_DOORBELL		0x90
#define NVRM_GP_ENTRY_SIZE		8
/* GPFIFO entry: word 0 holds address bits 31:2; word 1 the high address (7:0), length (30:10). */
#define NVRM_GP_ENTRY1_LENGTH_SHIFT	10
#define NVRM_GP_ENTRY1_LENGTH_MASK	0x1FFFFF

/*
 * Memory: what qgpu gates and the kernel-client queries it asks RM (580.142; headers under
 * src/common/sdk/nvidia/inc/).
 */
/* class00f8.h; its parameters are NV00F8_ALLOCATION_PARAMETERS */
#define NV_MEMORY_FABRIC		0x00F8

/* NVOS55: RM_DUP_OBJECT (28; nvos.h). hObject is in/out: 0 asks RM for a handle. */
struct nvos55_params {
	__u32 hClient;
	__u32 hParent;
	__u32 hObject;
	__u32 hClientSrc;
	__u32 hObjectSrc;
	__u32 flags;
	__u32 status;
};

/*
 * NVOS32: RM_VID_HEAP_CONTROL (184; nvos.h), with the ALLOC_SIZE member of its union only (the
 * union is 144 bytes), spelled out flat. _nvos32FunctionAllocSize (src/nvidia/interface/deprecated/
 * rmapi_deprecated_vidheapctrl.c) turns ALLOC_SIZE into an RM_ALLOC of NV01_MEMORY_LOCAL_USER
 * (attr LOCATION VIDMEM), NV01_MEMORY_SYSTEM or NV50_MEMORY_VIRTUAL (ALLOC_FLAGS_VIRTUAL), under
 * hObjectParent, at hMemory when MEMORY_HANDLE_PROVIDED is set (else RM picks it), and copies
 * size, offset, limit and attr back (_rmVidHeapControlAllocCommon).
 */
struct nvos32_params {
	__u32 hRoot;
	__u32 hObjectParent;
	__u32 function;
	__u32 hVASpace;
	__s16 ivcHeapNumber;
	__u16 pad;
	__u32 status;
	__u64 total;
	__u64 free;
	/* data.AllocSize */
	__u32 owner;
	__u32 hMemory;
	__u32 type;
	__u32 flags;
	__u32 attr;
	__u32 format;
	__u32 comprCovg;
	__u32 zcullCovg;
	__u32 partitionStride;
	__u32 width;
	__u32 height;
	__u32 pad1;
	__u64 size;
	__u64 alignment;
	__u64 offset;
	__u64 limit;
	__u64 address;
	__u64 rangeBegin;
	__u64 rangeEnd;
	__u32 attr2;
	__u32 ctagOffset;
	__s32 numaNode;
	__u32 pad2;
	__u8 rest[24];			/* the union's larger members */
};

#define NVOS32_FUNCTION_ALLOC_SIZE			2
#define NVOS32_FUNCTION_FREE				3
#define NVOS32_FUNCTION_INFO				5
#define NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT	6
#define NVOS32_FUNCTION_ALLOC_SIZE_RANGE		14
#define NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED	0x00000001u

/*
 * The union's other members that make or free memory, by their offsets in NVOS32 (nvos.h):
 * owner, hMemory, type and flags sit where ALLOC_SIZE has them in ALLOC_SIZE_RANGE and
 * ALLOC_TILED_PITCH_HEIGHT; FREE has hMemory there too, then its own flags. RM makes
 * ALLOC_SIZE_RANGE's memory as ALLOC_SIZE's (_nvos32FunctionAllocSizeRange) and
 * ALLOC_TILED_PITCH_HEIGHT's with size = height * pitch (_nvos32FunctionAllocTiledPitchHeight),
 * and FREE frees hMemory (_nvos32FunctionFree), all in src/nvidia/interface/deprecated/
 * rmapi_deprecated_vidheapctrl.c.
 */
#define NVRM_NVOS32_RANGE_SIZE_OFF	80	/* data.AllocSizeRange.size */
#define NVRM_NVOS32_RANGE_OFFSET_OFF	96	/* data.AllocSizeRange.offset */
#define NVRM_NVOS32_RANGE_LIMIT_OFF	104	/* data.AllocSizeRange.limit */
#define NVRM_NVOS32_RANGE_ATTR2_OFF	136	/* data.AllocSizeRange.attr2 */
#define NVRM_NVOS32_TILED_HEIGHT_OFF	56	/* data.AllocTiledPitchHeight.height */
#define NVRM_NVOS32_TILED_PITCH_OFF	60	/* data.AllocTiledPitchHeight.pitch (signed) */
#define NVRM_NVOS32_TILED_ATTR_OFF	64	/* data.AllocTiledPitchHeight.attr */
#define NVRM_NVOS32_TILED_STRIDE_OFF	84	/* data.AllocTiledPitchHeight.partitionStride */
#define NVRM_NVOS32_TILED_WIDTH_OFF	68	/* data.AllocTiledPitchHeight.width */
#define NVRM_NVOS32_TILED_FORMAT_OFF	72	/* data.AllocTiledPitchHeight.format */
#define NVRM_NVOS32_TILED_ALIGNMENT_OFF	96	/* data.AllocTiledPitchHeight.alignment */
#define NVRM_NVOS32_TILED_ATTR2_OFF	144	/* data.AllocTiledPitchHeight.attr2 */
#define NVRM_NVOS32_FREE_FLAGS_OFF	48	/* data.Free.flags */
#define NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED	0x00004000u
#define NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED		0x00008000u
#define NVOS32_ALLOC_FLAGS_VIRTUAL			0x00080000u
#define NVOS32_ALLOC_FLAGS_KERNEL_MAPPING_MAP		0x02000000u
#define NVOS32_ATTR_PAGE_SIZE_SHIFT			23	/* NVOS32_ATTR_PAGE_SIZE 24:23 */
#define NVOS32_ATTR_PAGE_SIZE_MASK			0x3u
#define NVOS32_ATTR_PAGE_SIZE_DEFAULT			0
#define NVOS32_ATTR_PAGE_SIZE_4KB			1
#define NVOS32_ATTR_PAGE_SIZE_BIG			2
#define NVOS32_ATTR_PAGE_SIZE_HUGE			3
#define NVOS32_ATTR_LOCATION_SHIFT			25	/* NVOS32_ATTR_LOCATION 26:25 */
#define NVOS32_ATTR_LOCATION_MASK			0x3u
#define NVOS32_ATTR_LOCATION_VIDMEM			0
#define NVOS32_ATTR_LOCATION_PCI			1
#define NVOS32_ATTR_PHYSICALITY_SHIFT			27	/* NVOS32_ATTR_PHYSICALITY 28:27 */
#define NVOS32_ATTR_PHYSICALITY_MASK			0x3u
#define NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS		1
#define NVOS32_ATTR_PHYSICALITY_CONTIGUOUS		2
#define NVOS32_ATTR2_ZBC_SHIFT				0	/* NVOS32_ATTR2_ZBC 1:0 */
#define NVOS32_ATTR2_ZBC_MASK				0x3u
#define NVOS32_ATTR2_ZBC_PREFER_NO_ZBC			1
#define NVOS32_ATTR2_GPU_CACHEABLE_SHIFT		2	/* ATTR2_GPU_CACHEABLE 3:2 */
#define NVOS32_ATTR2_GPU_CACHEABLE_MASK			0x3u
#define NVOS32_ATTR2_GPU_CACHEABLE_DEFAULT		0
#define NVOS32_ATTR2_GPU_CACHEABLE_YES			1
#define NVOS32_ATTR2_GPU_CACHEABLE_NO			2
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT		20	/* ATTR2_PAGE_SIZE_HUGE 21:20 */
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK		0x3u
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB			1
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB		2
/* The PTE kind of uncompressed pitch memory, which RM answers in format (Hopper's dev_mmu.h). */
#define NVRM_PTE_KIND_GENERIC_MEMORY			0x6u

/*
 * Client controls, sent to the client itself (ctrl/ctrl0000/ctrl0000client.h,
 * ctrl0000unix.h); cliresCtrlCmdClientGetHandleInfo in src/nvidia/src/kernel/rmapi/
 * client_resource.c answers GET_HANDLE_INFO host-side.
 */
#define NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO		0x00000D02u
#define NV0000_HANDLE_INFO_INDEX_PARENT			1
#define NV0000_HANDLE_INFO_INDEX_CLASSID		2
#define NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES	0x00000D07u
#define NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD	0x00003D05u
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD	0x00003D06u
#define NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD	0x00003D0Bu
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD	0x00003D0Cu

/* NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS (16): data is an NvHandle or an NvU64. */
struct nv0000_handle_info_params {
	__u32 hObject;
	__u32 index;
	__u64 data;
};

/* NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS (12) */
struct nv0000_objects_are_duplicates_params {
	__u32 hObject1;
	__u32 hObject2;
	__u8 bDuplicates;
	__u8 pad[3];
};

/*
 * A memory object's size as RM allocated it (ctrl/ctrl0041.h; memCtrlCmdGetSurfaceInfoLvm in
 * src/nvidia/src/kernel/gpu/mem_mgr/mem_ctrl.c answers memdescGetSize host-side).
 */
#define NV0041_CTRL_CMD_GET_SURFACE_INFO		0x00410110u
#define NV0041_CTRL_SURFACE_INFO_INDEX_ATTRS		1
#define NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_LO	2
#define NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_HI	3
#define NV0041_CTRL_SURFACE_INFO_INDEX_COMPR_COVERAGE	5
#define NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE	7
#define NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_ATTR	8
#define NV0041_CTRL_SURFACE_INFO_INDEX_ADDR_SPACE_TYPE	9
#define NV0000_ADDR_SPACE_TYPE_SYSMEM			1
#define NV0000_ADDR_SPACE_TYPE_VIDMEM			2

/* NV0041_CTRL_GET_SURFACE_INFO_PARAMS (16): a list of NV0041_CTRL_SURFACE_INFO by pointer. */
struct nv0041_surface_info_params {
	__u32 surfaceInfoListSize;
	__u32 pad;
	__u64 surfaceInfoList;
};

/* NVXXXX_CTRL_XXX_INFO */
struct nv0041_surface_info {
	__u32 index;
	__u32 data;
};

/* Every number above that the driver also defines, checked against its headers. */
/*
 * Export of an RM object to an fd of /dev/nvidiactl and import from it (ctrl0000unix.h;
 * cliresCtrlCmdOsUnixExportObjectToFd and ...ImportObjectFromFd in src/nvidia/arch/nvalloc/unix/
 * src/os.c). The driver's NV0000_CTRL_OS_UNIX_EXPORT_OBJECT (a type and a union holding one
 * struct rmObject) is spelled flat.
 */
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_NONE	0
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM	1
#define NV0000_EXPORT_FLAGS_EMPTY_FD			0x1u	/* FLAGS_EMPTY_FD 0:0 */

/* NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS (24) */
struct nv0000_export_object_to_fd_params {
	__u32 type;
	__u32 hDevice;
	__u32 hParent;
	__u32 hObject;
	__s32 fd;
	__u32 flags;
};

/* NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS (20): hObject is in/out (0: RM picks). */
struct nv0000_import_object_from_fd_params {
	__s32 fd;
	__u32 type;
	__u32 hDevice;
	__u32 hParent;
	__u32 hObject;
};

/*
 * The plural pair (ctrl0000unix.h; cliresCtrlCmdOsUnixExportObjectsToFd and
 * ...ImportObjectsFromFd in src/nvidia/arch/nvalloc/unix/src/os.c): up to 512 handles exported
 * into the slots [index, index + numObjects) of an fd set up for maxObjects, up to 128 imported
 * from it, each import's memory kind answered in objectTypes.
 */
#define NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE		64
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS	512
#define NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS	128
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE		0
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM	1
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM	2

/* NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS (2128) */
struct nv0000_export_objects_to_fd_params {
	__s32 fd;
	__u32 hDevice;
	__u16 maxObjects;
	__u8 metadata[NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE];
	__u8 pad[2];
	__u32 objects[NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	__u16 numObjects;
	__u16 index;
};

/* NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS (652): objects are in/out (0: RM picks). */
struct nv0000_import_objects_from_fd_params {
	__s32 fd;
	__u32 hParent;
	__u32 objects[NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	__u8 objectTypes[NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	__u16 numObjects;
	__u16 index;
};

/* NV_ESC_EXPORT_TO_DMABUF_FD's argument, nv_ioctl_export_to_dma_buf_fd_t (2608; nv-ioctl.h). */
#define NV_DMABUF_EXPORT_MAX_HANDLES			128
#define NV_DMABUF_EXPORT_MAPPING_TYPE_DEFAULT		0
#define NV_DMABUF_EXPORT_MAPPING_TYPE_FORCE_PCIE	1

struct nvrm_export_dmabuf_fd {
	__s32 fd;
	__u32 hClient;
	__u32 totalObjects;
	__u32 numObjects;
	__u32 index;
	__u32 pad0;
	__u64 totalSize;
	__u8 mappingType;
	__u8 bAllowMmap;
	__u8 pad1[2];
	__u32 handles[NV_DMABUF_EXPORT_MAX_HANDLES];
	__u64 offsets[NV_DMABUF_EXPORT_MAX_HANDLES];
	__u64 sizes[NV_DMABUF_EXPORT_MAX_HANDLES];
	__u32 status;
	__u32 pad2;
};

/* NV00F8_ALLOCATION_PARAMETERS (48; class/cl00f8.h): NV_MEMORY_FABRIC's, under a subdevice. */
struct nv00f8_alloc_params {
	__u64 alignment;
	__u64 allocSize;
	__u64 pageSize;
	__u32 allocFlags;
	__u32 pad;
	__u64 mapOffset;
	__u32 hVidMem;
	__u32 mapFlags;
};

/*
 * nvidia-uvm.ko's ioctls on /dev/nvidia-uvm (kernel-open/nvidia-uvm/uvm_ioctl.h and
 * uvm_linux_ioctl.h): on Linux the command is the bare number (UVM_IOCTL_BASE(i) is i), and the
 * driver copies the whole struct in and back, its answer in rmStatus (UVM_ROUTE_CMD_* in
 * uvm_api.h). What CUDA sends at start-up and for managed memory was measured on an H100
 * (BENCHMARKS.md, 2026-11-27, eleventh session).
 */
#define UVM_INITIALIZE				0x30000001
#define UVM_DEINITIALIZE			0x30000002
#define UVM_FREE				34
#define UVM_ALLOC_SEMAPHORE_POOL		68
#define UVM_MAX_GPUS				256

/* UVM_INITIALIZE_PARAMS (16): the first ioctl on a UVM file. */
struct uvm_initialize_params {
	__u64 flags;
	__u32 rmStatus;
	__u32 pad;
};

/* UVM_FREE_PARAMS (24): frees a range made by an ioctl (a semaphore pool here). */
struct uvm_free_params {
	__u64 base;
	__u64 length;
	__u32 rmStatus;
	__u32 pad;
};

/* UvmGpuMappingAttributes (36; uvm_types.h). */
struct uvm_gpu_mapping_attributes {
	__u8 gpuUuid[16];
	__u32 gpuMappingType;
	__u32 gpuCachingType;
	__u32 gpuFormatType;
	__u32 gpuElementBits;
	__u32 gpuCompressionType;
};

/* UVM_ALLOC_SEMAPHORE_POOL_PARAMS (9248): a range the caller then maps with mmap. */
struct uvm_alloc_semaphore_pool_params {
	__u64 base;
	__u64 length;
	struct uvm_gpu_mapping_attributes perGpuAttributes[UVM_MAX_GPUS];
	__u64 gpuAttributesCount;
	__u32 rmStatus;
	__u32 pad;
};

#include "nvrm_layout.h"

#endif /* _UAPI_QPOLICY_NVRM_H */
