#!/usr/bin/env python3
"""The layout qgpu.ko, nvmock.ko and gpuload share with nvidia.ko, checked three ways.

kmod/uapi/nvrm.h and nvrm_kapi.h declare, in qpolicy's words, what nvidia.ko reads and writes:
argument structs, their members, escape numbers, classes, controls and status codes. A wrong
member there is silent until a real driver reads garbage, so the numbers live in one table, the
"Layout" section of kmod/nvmock/CONFORMANCE.md, and:

  layout.py nvidia --src DIR   compiles a probe against NVIDIA's own headers (an
                               open-gpu-kernel-modules checkout) and prints the table's rows: the
                               numbers come from the driver, not from qpolicy's headers;
  layout.py header             writes kmod/uapi/nvrm_layout.h and nvrm_kapi_layout.h from the
                               table: a static assertion per row; nvrm.h and nvrm_kapi.h include
                               them at their end, so a member that disagrees with the table fails
                               the build of qgpu, nvmock and gpuload;
  layout.py check              says whether those headers are what the table gives (make test runs
                               tests/unit/test_layout.py, which does this and compiles them).

An item is a C expression over qpolicy's declarations (sizeof, offsetof, a member's size or a
constant); the NVIDIA column names the same thing in the driver's headers.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UAPI = ROOT / "kmod" / "uapi"
TABLE = ROOT / "kmod" / "nvmock" / "CONFORMANCE.md"
HEADER = UAPI / "nvrm_layout.h"
KAPI_HEADER = UAPI / "nvrm_kapi_layout.h"
SECTION = "## Layout: what qgpu, nvmock and gpuload share with nvidia.ko"
TAG = "580.142"


@dataclass(frozen=True)
class Pair:
    """One of qpolicy's structs and the driver's type it stands for."""

    ours: str
    theirs: str
    header: str  # where the driver declares it, relative to the repository
    kernel: bool = False  # declared in nvrm_kapi.h (kernel code only)
    alias: dict[str, str] = field(default_factory=dict)  # our member -> the driver's path
    # members of nested unions or structs to check member by member: path -> our struct
    nested: dict[str, str] = field(default_factory=dict)


# The driver's include directories, relative to an open-gpu-kernel-modules checkout.
INCLUDES = (
    "src/common/sdk/nvidia/inc",
    "src/nvidia/arch/nvalloc/unix/include",
    "kernel-open/common/inc",
    "kernel-open/nvidia-uvm",
)
SDK = "src/common/sdk/nvidia/inc/"
UNIX = "src/nvidia/arch/nvalloc/unix/include/"
KOPEN = "kernel-open/common/inc/"
UVM = "kernel-open/nvidia-uvm/"

PAIRS: tuple[Pair, ...] = (
    Pair("uvm_initialize_params", "UVM_INITIALIZE_PARAMS", UVM + "uvm_linux_ioctl.h"),
    Pair("uvm_free_params", "UVM_FREE_PARAMS", UVM + "uvm_ioctl.h"),
    Pair("uvm_gpu_mapping_attributes", "UvmGpuMappingAttributes", UVM + "uvm_types.h"),
    Pair("uvm_alloc_semaphore_pool_params", "UVM_ALLOC_SEMAPHORE_POOL_PARAMS", UVM + "uvm_ioctl.h"),
    Pair("nvos00_params", "NVOS00_PARAMETERS", SDK + "nvos.h"),
    Pair("nvos21_params", "NVOS21_PARAMETERS", SDK + "nvos.h"),
    Pair("nvos64_params", "NVOS64_PARAMETERS", SDK + "nvos.h"),
    Pair("nvos54_params", "NVOS54_PARAMETERS", SDK + "nvos.h"),
    Pair("nvos34_params", "NVOS34_PARAMETERS", SDK + "nvos.h"),
    Pair("nvos55_params", "NVOS55_PARAMETERS", SDK + "nvos.h"),
    Pair(
        "nvos32_params",
        "NVOS32_PARAMETERS",
        SDK + "nvos.h",
        # qpolicy spells out the union's ALLOC_SIZE member flat (nvrm.h says why)
        alias={
            m: "data.AllocSize." + m
            for m in (
                "owner",
                "hMemory",
                "type",
                "flags",
                "attr",
                "format",
                "comprCovg",
                "zcullCovg",
                "partitionStride",
                "width",
                "height",
                "size",
                "alignment",
                "offset",
                "limit",
                "address",
                "rangeBegin",
                "rangeEnd",
                "attr2",
                "ctagOffset",
                "numaNode",
            )
        },
    ),
    Pair(
        "nv0000_handle_info_params",
        "NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000client.h",
    ),
    Pair(
        "nv0000_objects_are_duplicates_params",
        "NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000client.h",
    ),
    Pair(
        "nv0041_surface_info_params",
        "NV0041_CTRL_GET_SURFACE_INFO_PARAMS",
        SDK + "ctrl/ctrl0041.h",
    ),
    Pair("nv0041_surface_info", "NV0041_CTRL_SURFACE_INFO", SDK + "ctrl/ctrl0041.h"),
    Pair(
        "nv0000_export_object_to_fd_params",
        "NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000unix.h",
        alias={
            "type": "object.type",
            **{m: "object.data.rmObject." + m for m in ("hDevice", "hParent", "hObject")},
        },
    ),
    Pair(
        "nv0000_import_object_from_fd_params",
        "NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000unix.h",
        alias={
            "type": "object.type",
            **{m: "object.data.rmObject." + m for m in ("hDevice", "hParent", "hObject")},
        },
    ),
    Pair(
        "nv0000_export_objects_to_fd_params",
        "NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000unix.h",
    ),
    Pair(
        "nv0000_import_objects_from_fd_params",
        "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS",
        SDK + "ctrl/ctrl0000/ctrl0000unix.h",
    ),
    Pair("nvrm_export_dmabuf_fd", "nv_ioctl_export_to_dma_buf_fd_t", KOPEN + "nv-ioctl.h"),
    Pair(
        "nv00f8_alloc_params",
        "NV00F8_ALLOCATION_PARAMETERS",
        SDK + "class/cl00f8.h",
        alias={"mapOffset": "map.offset", "hVidMem": "map.hVidMem", "mapFlags": "map.flags"},
    ),
    Pair(
        "nvos33_params_with_fd",
        "nv_ioctl_nvos33_parameters_with_fd",
        UNIX + "nv-unix-nvos-params-wrappers.h",
        alias={
            m: "params." + m
            for m in (
                "hClient",
                "hDevice",
                "hMemory",
                "offset",
                "length",
                "pLinearAddress",
                "status",
                "flags",
            )
        },
    ),
    Pair(
        "nvrm_card_info",
        "nv_ioctl_card_info_t",
        KOPEN + "nv-ioctl.h",
        alias={
            m: "pci_info." + m
            for m in ("domain", "bus", "slot", "function", "vendor_id", "device_id")
        },
    ),
    Pair(
        "nvrm_api_version",
        "nv_ioctl_rm_api_version_t",
        KOPEN + "nv-ioctl.h",
        alias={"version": "versionString"},
    ),
    Pair("nvrm_sys_params", "nv_ioctl_sys_params_t", KOPEN + "nv-ioctl.h"),
    Pair("nvrm_register_fd", "nv_ioctl_register_fd_t", KOPEN + "nv-ioctl.h"),
    Pair(
        "nvrm_wait_open_complete",
        "nv_ioctl_wait_open_complete_t",
        KOPEN + "nv-ioctl.h",
        alias={"adapter_status": "adapterStatus"},
    ),
    Pair("nvrm_xfer", "nv_ioctl_xfer_t", KOPEN + "nv-ioctl.h"),
    Pair(
        "nvrm_os_event",
        "nv_ioctl_alloc_os_event_t",
        KOPEN + "nv-ioctl.h",
        alias={"status": "Status"},
    ),
    Pair("nv0080_alloc_params", "NV0080_ALLOC_PARAMETERS", SDK + "class/cl0080.h"),
    Pair("nv2080_alloc_params", "NV2080_ALLOC_PARAMETERS", SDK + "class/cl2080.h"),
    Pair(
        "nv_channel_group_alloc_params",
        "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
        SDK + "nvos.h",
    ),
    Pair("nv_memory_desc_params", "NV_MEMORY_DESC_PARAMS", SDK + "alloc/alloc_channel.h"),
    Pair("nv_channel_alloc_params", "NV_CHANNEL_ALLOC_PARAMS", SDK + "alloc/alloc_channel.h"),
    Pair("nv_memory_alloc_params", "NV_MEMORY_ALLOCATION_PARAMS", SDK + "nvos.h"),
    Pair("nv_ctxshare_alloc_params", "NV_CTXSHARE_ALLOCATION_PARAMETERS", SDK + "nvos.h"),
    Pair(
        "nva06c_gpfifo_schedule_params",
        "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS",
        SDK + "ctrl/ctrla06c.h",
    ),
    Pair("nva06c_timeslice_params", "NVA06C_CTRL_TIMESLICE_PARAMS", SDK + "ctrl/ctrla06c.h"),
    Pair("nva06c_preempt_params", "NVA06C_CTRL_PREEMPT_PARAMS", SDK + "ctrl/ctrla06c.h"),
    Pair(
        "nva06c_interleave_level_params",
        "NVA06C_CTRL_INTERLEAVE_LEVEL_PARAMS",
        SDK + "ctrl/ctrla06c.h",
    ),
    Pair(
        "nva06c_make_realtime_params",
        "NVA06C_CTRL_MAKE_REALTIME_PARAMS",
        SDK + "ctrl/ctrla06c.h",
    ),
    Pair(
        "nva06f_interleave_level_params",
        "NVA06F_CTRL_INTERLEAVE_LEVEL_PARAMS",
        SDK + "ctrl/ctrla06f/ctrla06fgpfifo.h",
    ),
    Pair(
        "nva06f_restart_runlist_params",
        "NVA06F_CTRL_RESTART_RUNLIST_PARAMS",
        SDK + "ctrl/ctrla06f/ctrla06fgpfifo.h",
    ),
    Pair(
        "nva06f_stop_channel_params",
        "NVA06F_CTRL_STOP_CHANNEL_PARAMS",
        SDK + "ctrl/ctrla06f/ctrla06fgpfifo.h",
    ),
    Pair(
        "nv2080_runlist_sched_policy_params",
        "NV2080_CTRL_FIFO_RUNLIST_SET_SCHED_POLICY_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080fifo.h",
    ),
    Pair(
        "nv2080_ctxsw_preemption_mode_params",
        "NV2080_CTRL_GR_SET_CTXSW_PREEMPTION_MODE_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080gr.h",
        alias={"grRouteFlags": "grRouteInfo.flags", "grRoute": "grRouteInfo.route"},
    ),
    Pair(
        "nv2080_ctxsw_stats_params",
        "NV2080_CTRL_GR_GET_CTXSW_STATS_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080gr.h",
    ),
    Pair(
        "nv2080_ctxsw_modes_params",
        "NV2080_CTRL_GR_GET_CTXSW_MODES_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080gr.h",
    ),
    Pair(
        "nvc36f_work_submit_token_params",
        "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
        SDK + "ctrl/ctrlc36f.h",
    ),
    Pair(
        "nv0080_channellist_params",
        "NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS",
        SDK + "ctrl/ctrl0080/ctrl0080fifo.h",
    ),
    Pair(
        "nv906f_class_engineid_params",
        "NV906F_CTRL_GET_CLASS_ENGINEID_PARAMS",
        SDK + "ctrl/ctrl906f.h",
    ),
    Pair(
        "nv2080_ctx_buffer_size_params",
        "NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080gr.h",
    ),
    Pair("nvb0b5_alloc_params", "NVB0B5_ALLOCATION_PARAMETERS", SDK + "class/clb0b5sw.h"),
    Pair(
        "nv2080_ecc_unit_status",
        "NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS",
        SDK + "ctrl/ctrl2080/ctrl2080gpu.h",
    ),
    Pair(
        "nv2080_ecc_status_params",
        "NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080gpu.h",
        alias={"grRouteFlags": "grRouteInfo.flags", "grRoute": "grRouteInfo.route"},
    ),
    Pair(
        "nv2080_fifo_disable_channels_params",
        "NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS",
        SDK + "ctrl/ctrl2080/ctrl2080fifo.h",
    ),
    Pair(
        "nvrm_kernel_ops",
        "nvidia_modeset_rm_ops_t",
        KOPEN + "nv-modeset-interface.h",
        kernel=True,
    ),
    Pair(
        "nvrm_kernel_op",
        "nvidia_kernel_rmapi_ops_t",
        UNIX + "nv-kernel-rmapi-ops.h",
        kernel=True,
        # the members the driver reads and writes for each op qpolicy makes
        nested={
            "params.free": "nvos00_params",
            "params.alloc": "nvos64_params",
            "params.control": "nvos54_params",
        },
    ),
)

# Our constants whose name differs from the driver's (the rest carry the driver's name).
CONSTANT_ALIAS = {
    "NV_CTXSHARE_SUBCTXID_PREFER_LOWER_SUCCESS": (
        "(1u << (0 ? NV_CTXSHARE_ALLOCATION_SUBCTXID_ASYNC_PREFER_LOWER_ALLOCATION))"
    ),
    # DRF field ranges ("6:6"): the flag is the bit at the range's low end.
    "NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING": "(1u << (0 ? NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING))",
    "NVOS04_FLAGS_GROUP_CHANNEL_RUNQUEUE": "(1u << (0 ? NVOS04_FLAGS_GROUP_CHANNEL_RUNQUEUE))",
    "NVOS04_FLAGS_GROUP_CHANNEL_THREAD_SHIFT": "(0 ? NVOS04_FLAGS_GROUP_CHANNEL_THREAD)",
    "NVOS04_FLAGS_GROUP_CHANNEL_THREAD_MASK": (
        "((1u << ((1 ? NVOS04_FLAGS_GROUP_CHANNEL_THREAD)"
        " - (0 ? NVOS04_FLAGS_GROUP_CHANNEL_THREAD) + 1)) - 1)"
    ),
    "NV2080_CTXSW_PREEMPTION_FLAG_CILP": (
        "(1u << (0 ? NV2080_CTRL_GR_SET_CTXSW_PREEMPTION_MODE_FLAGS_CILP))"
    ),
    "NV2080_CTXSW_PREEMPTION_FLAG_GFXP": (
        "(1u << (0 ? NV2080_CTRL_GR_SET_CTXSW_PREEMPTION_MODE_FLAGS_GFXP))"
    ),
    "NV2080_CTXSW_STATS_FLAG_RESET": "(1u << (0 ? NV2080_CTRL_GR_GET_CTXSW_STATS_FLAGS_RESET))",
    "NV2080_CTXSW_PREEMPTION_COMPUTE_WFI": "NV2080_CTRL_SET_CTXSW_PREEMPTION_MODE_COMPUTE_WFI",
    "NV2080_CTXSW_PREEMPTION_COMPUTE_CTA": "NV2080_CTRL_SET_CTXSW_PREEMPTION_MODE_COMPUTE_CTA",
    "NV2080_CTXSW_PREEMPTION_COMPUTE_CILP": "NV2080_CTRL_SET_CTXSW_PREEMPTION_MODE_COMPUTE_CILP",
    "NV2080_CTXSW_PREEMPTION_GFX_GFXP_POOL": "NV2080_CTRL_SET_CTXSW_PREEMPTION_MODE_GFX_GFXP_POOL",
    "NV2080_RUNLIST_SCHED_POLICY_FLAG_RESTORE": (
        "(1u << (0 ? NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY_FLAGS_RESTORE))"
    ),
    "NV2080_RUNLIST_SCHED_POLICY_DEFAULT": "NV2080_CTRL_FIFO_RUNLIST_SCHED_POLICY_DEFAULT",
    "NV2080_RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED_WDDM": (
        "NV2080_CTRL_FIFO_RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED_WDDM"
    ),
    "NVA06C_PREEMPT_MAX_TIMEOUT_US": "NVA06C_CTRL_CMD_PREEMPT_MAX_MANUAL_TIMEOUT_US",
    "NVA06C_INTERLEAVE_LEVEL_LOW": "NVA06C_CTRL_INTERLEAVE_LEVEL_LOW",
    "NVA06C_INTERLEAVE_LEVEL_MEDIUM": "NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM",
    "NVA06C_INTERLEAVE_LEVEL_HIGH": "NVA06C_CTRL_INTERLEAVE_LEVEL_HIGH",
    "NV2080_DISABLE_CHANNELS_MAX": "NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES",
    "NVRM_MAJOR": "NV_MAJOR_DEVICE_NUMBER",
    "NVRM_CTL_MINOR": "NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE",
    "NVRM_MAX_GPU_MINOR": "NV_MINOR_DEVICE_NUMBER_REGULAR_MAX",
    "NVRM_USERMODE_SIZE": "NVC361_NV_USERMODE__SIZE",
    "NVRM_GP_ENTRY_SIZE": "NVC86F_GP_ENTRY__SIZE",
    "NVRM_GP_ENTRY1_LENGTH_SHIFT": "(0 ? NVC86F_GP_ENTRY1_LENGTH)",
    "NVRM_GP_ENTRY1_LENGTH_MASK": (
        "((1u << ((1 ? NVC86F_GP_ENTRY1_LENGTH) - (0 ? NVC86F_GP_ENTRY1_LENGTH) + 1)) - 1)"
    ),
    "NV0000_EXPORT_FLAGS_EMPTY_FD": (
        "(1u << (0 ? NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_FLAGS_EMPTY_FD))"
    ),
    "NV0000_HANDLE_INFO_INDEX_PARENT": "NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO_INDEX_PARENT",
    "NV0000_HANDLE_INFO_INDEX_CLASSID": "NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO_INDEX_CLASSID",
    "NV0000_ADDR_SPACE_TYPE_SYSMEM": "NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_SYSMEM",
    "NV0000_ADDR_SPACE_TYPE_VIDMEM": "NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_VIDMEM",
    "NVOS32_ATTR_PAGE_SIZE_SHIFT": "(0 ? NVOS32_ATTR_PAGE_SIZE)",
    "NVOS32_ATTR_PAGE_SIZE_MASK": (
        "((1u << ((1 ? NVOS32_ATTR_PAGE_SIZE) - (0 ? NVOS32_ATTR_PAGE_SIZE) + 1)) - 1)"
    ),
    "NVOS32_ATTR_LOCATION_SHIFT": "(0 ? NVOS32_ATTR_LOCATION)",
    "NVOS32_ATTR_LOCATION_MASK": (
        "((1u << ((1 ? NVOS32_ATTR_LOCATION) - (0 ? NVOS32_ATTR_LOCATION) + 1)) - 1)"
    ),
    "NVOS32_ATTR_PHYSICALITY_SHIFT": "(0 ? NVOS32_ATTR_PHYSICALITY)",
    "NVOS32_ATTR_PHYSICALITY_MASK": (
        "((1u << ((1 ? NVOS32_ATTR_PHYSICALITY) - (0 ? NVOS32_ATTR_PHYSICALITY) + 1)) - 1)"
    ),
    "NVOS32_ATTR2_ZBC_SHIFT": "(0 ? NVOS32_ATTR2_ZBC)",
    "NVOS32_ATTR2_ZBC_MASK": "((1u << ((1 ? NVOS32_ATTR2_ZBC) - (0 ? NVOS32_ATTR2_ZBC) + 1)) - 1)",
    "NVOS32_ATTR2_GPU_CACHEABLE_SHIFT": "(0 ? NVOS32_ATTR2_GPU_CACHEABLE)",
    "NVOS32_ATTR2_GPU_CACHEABLE_MASK": (
        "((1u << ((1 ? NVOS32_ATTR2_GPU_CACHEABLE) - (0 ? NVOS32_ATTR2_GPU_CACHEABLE) + 1)) - 1)"
    ),
    "NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT": "(0 ? NVOS32_ATTR2_PAGE_SIZE_HUGE)",
    "NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK": (
        "((1u << ((1 ? NVOS32_ATTR2_PAGE_SIZE_HUGE) - (0 ? NVOS32_ATTR2_PAGE_SIZE_HUGE) + 1)) - 1)"
    ),
    "NVRM_USERD_GP_GET": "offsetof(Nvc36fControl, GPGet)",
    "NVRM_USERD_GP_PUT": "offsetof(Nvc36fControl, GPPut)",
    "NVRM_USERMODE_DOORBELL": "NVC361_NOTIFY_CHANNEL_PENDING",
    "NVRM_IOCTL_MAGIC": "NV_IOCTL_MAGIC",
    "NVRM_VERSION_CHECK_RELAXED": "NV_RM_API_VERSION_CMD_RELAXED",
    "NVRM_VERSION_CHECK_QUERY": "NV_RM_API_VERSION_CMD_QUERY",
    "NVRM_VERSION_CHECK_STRICT": "NV_RM_API_VERSION_CMD_STRICT",
    "NVRM_VERSION_REPLY_RECOGNIZED": "NV_RM_API_VERSION_REPLY_RECOGNIZED",
    "NVRM_KERNEL_OP_FREE": "NV01_FREE",
    "NVRM_KERNEL_OP_ALLOC_MEMORY": "NV01_ALLOC_MEMORY",
    "NVRM_KERNEL_OP_ALLOC": "NV04_ALLOC",
    "NVRM_KERNEL_OP_VID_HEAP_CONTROL": "NV04_VID_HEAP_CONTROL",
    "NVRM_KERNEL_OP_MAP_MEMORY": "NV04_MAP_MEMORY",
    "NVRM_KERNEL_OP_UNMAP_MEMORY": "NV04_UNMAP_MEMORY",
    "NVRM_KERNEL_OP_ALLOC_CONTEXT_DMA": "NV04_ALLOC_CONTEXT_DMA",
    "NVRM_KERNEL_OP_MAP_MEMORY_DMA": "NV04_MAP_MEMORY_DMA",
    "NVRM_KERNEL_OP_UNMAP_MEMORY_DMA": "NV04_UNMAP_MEMORY_DMA",
    "NVRM_KERNEL_OP_BIND_CONTEXT_DMA": "NV04_BIND_CONTEXT_DMA",
    "NVRM_KERNEL_OP_CONTROL": "NV04_CONTROL",
    "NVRM_KERNEL_OP_DUP_OBJECT": "NV04_DUP_OBJECT",
    "NVRM_KERNEL_OP_ADD_VBLANK_CALLBACK": "NV04_ADD_VBLANK_CALLBACK",
    "NVRM_KERNEL_OP_SHARE": "NV04_SHARE",
    "NVRM_NVOS02_STATUS_OFF": "offsetof(NVOS02_PARAMETERS, status)",
    "NVRM_NVOS32_STATUS_OFF": "offsetof(NVOS32_PARAMETERS, status)",
    "NVRM_NVOS32_RANGE_SIZE_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocSizeRange.size)",
    "NVRM_NVOS32_RANGE_OFFSET_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocSizeRange.offset)",
    "NVRM_NVOS32_RANGE_LIMIT_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocSizeRange.limit)",
    "NVRM_NVOS32_RANGE_ATTR2_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocSizeRange.attr2)",
    "NVRM_NVOS32_TILED_HEIGHT_OFF": (
        "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.height)"
    ),
    "NVRM_NVOS32_TILED_PITCH_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.pitch)",
    "NVRM_NVOS32_TILED_ATTR_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.attr)",
    "NVRM_NVOS32_TILED_STRIDE_OFF": (
        "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.partitionStride)"
    ),
    "NVRM_NVOS32_TILED_WIDTH_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.width)",
    "NVRM_NVOS32_TILED_FORMAT_OFF": (
        "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.format)"
    ),
    "NVRM_NVOS32_TILED_ALIGNMENT_OFF": (
        "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.alignment)"
    ),
    "NVRM_NVOS32_TILED_ATTR2_OFF": "offsetof(NVOS32_PARAMETERS, data.AllocTiledPitchHeight.attr2)",
    "NVRM_NVOS32_FREE_FLAGS_OFF": "offsetof(NVOS32_PARAMETERS, data.Free.flags)",
    "NVRM_NVOS33_STATUS_OFF": "offsetof(NVOS33_PARAMETERS, status)",
    "NVRM_NVOS34_STATUS_OFF": "offsetof(NVOS34_PARAMETERS, status)",
    "NVRM_NVOS39_STATUS_OFF": "offsetof(NVOS39_PARAMETERS, status)",
    "NVRM_NVOS46_STATUS_OFF": "offsetof(NVOS46_PARAMETERS, status)",
    "NVRM_NVOS47_STATUS_OFF": "offsetof(NVOS47_PARAMETERS, status)",
    "NVRM_NVOS49_STATUS_OFF": "offsetof(NVOS49_PARAMETERS, status)",
    "NVRM_NVOS55_STATUS_OFF": "offsetof(NVOS55_PARAMETERS, status)",
    "NVRM_NVOS57_STATUS_OFF": "offsetof(NVOS57_PARAMETERS, status)",
    "NVRM_NVOS61_STATUS_OFF": "offsetof(NVOS61_PARAMETERS, status)",
}

# Our constants that the driver defines in headers the probe cannot include (they pull in RM's
# internals): the value is read from the #define in that file.
CONSTANT_GREP = {
    "NVRM_MAX_IOCTL_SIZE": ("kernel-open/common/inc/nv.h", "NV_ABSOLUTE_MAX_IOCTL_SIZE"),
    "NVRM_CLIENT_HANDLE_BASE": (
        "src/nvidia/inc/libraries/resserv/resserv.h",
        "RS_CLIENT_HANDLE_BASE",
    ),
    "NVRM_OBJECT_HANDLE_BASE": (
        "src/nvidia/inc/libraries/resserv/rs_client.h",
        "RS_UNIQUE_HANDLE_BASE",
    ),
    "NVRM_USERD_SIZE": (
        "src/common/inc/swref/published/maxwell/gm107/dev_ram.h",
        "NV_RAMUSERD_CHAN_SIZE",
    ),
    "NVRM_PTE_KIND_GENERIC_MEMORY": (
        "src/common/inc/swref/published/hopper/gh100/dev_mmu.h",
        "NV_MMU_PTE_KIND_GENERIC_MEMORY",
    ),
}

# Our constants that are not the driver's layout: behaviour, covered by the behaviour tables.
NOT_LAYOUT = {
    "NVRM_DEFAULT_TIMESLICE_US": (
        "a TSG's default timeslice: kfifoChannelGroupGetDefaultTimeslice_GV100"
    ),
}

# Headers the probe includes, in an order that compiles.
PROBE_HEADERS = (
    "nvtypes.h",
    "nvstatus.h",
    "nvos.h",
    "nv_escape.h",
    "nv-ioctl-numbers.h",
    "nv-ioctl.h",
    "nv-ioctl-numa.h",
    "nv-chardev-numbers.h",
    "nv-unix-nvos-params-wrappers.h",
    "nv-kernel-rmapi-ops.h",
    "nv-modeset-interface.h",
    "class/cl0000.h",
    "class/cl0001.h",
    "class/cl0041.h",
    "class/cl003e.h",
    "class/cl0040.h",
    "class/cl0080.h",
    "class/cl0090.h",
    "class/cl2080.h",
    "class/cl9067.h",
    "class/cl90f1.h",
    "class/cla06c.h",
    "class/clc56f.h",
    "class/clc86f.h",
    "class/clc36f.h",
    "class/clc361.h",
    "class/clc661.h",
    "class/clc8b5.h",
    "class/clcbc0.h",
    "class/clb0b5sw.h",
    "alloc/alloc_channel.h",
    "ctrl/ctrl0080/ctrl0080fifo.h",
    "ctrl/ctrl906f.h",
    "ctrl/ctrl2080/ctrl2080gpu.h",
    "ctrl/ctrla06c.h",
    "ctrl/ctrla06f/ctrla06fgpfifo.h",
    "ctrl/ctrl2080/ctrl2080fifo.h",
    "ctrl/ctrl2080/ctrl2080gr.h",
    "ctrl/ctrlc36f.h",
    "ctrl/ctrl0000/ctrl0000client.h",
    "ctrl/ctrl0000/ctrl0000unix.h",
    "ctrl/ctrl0041.h",
    "class/cl00f8.h",
    "uvm_ioctl.h",
    "uvm_linux_ioctl.h",
)


# ---------------------------------------------------------------------------------------------
# Reading qpolicy's headers


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def struct_members(header_text: str, name: str) -> list[str]:
    """The top-level member names of ``struct name`` in one of qpolicy's headers."""
    text = _strip_comments(header_text)
    match = re.search(r"\bstruct\s+" + re.escape(name) + r"\s*\{", text)
    if match is None:
        raise LookupError(f"struct {name} is not declared")
    depth, start, members = 0, match.end(), []
    statement = ""
    for ch in text[start:]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                break
            depth -= 1
        if ch == ";" and depth == 0:
            members.append(_member_name(statement))
            statement = ""
        else:
            statement += ch
    return members


def _member_name(statement: str) -> str:
    pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", statement)
    if pointer:
        return str(pointer.group(1))
    tail = statement.rsplit("}", 1)[-1]
    tail = re.sub(r"\[[^\]]*\]", "", tail)
    return str(re.findall(r"\w+", tail)[-1])


def declared_structs(header_text: str) -> list[str]:
    return re.findall(r"^struct\s+(\w+)\s*\{", _strip_comments(header_text), flags=re.M)


def declared_constants(header_text: str) -> list[str]:
    names = re.findall(r"^#define\s+(\w+)\s+\S", _strip_comments(header_text), flags=re.M)
    return [n for n in names if not n.startswith("_")]


def skipped(member: str) -> bool:
    """Padding and qpolicy's own filler: nothing in the driver corresponds."""
    return member.startswith("pad") or member in ("raw", "rest")


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Row:
    item: str  # a C expression over qpolicy's declarations
    value: int
    nvidia: str  # the same thing in the driver's words
    source: str
    kernel: bool  # needs nvrm_kapi.h

    def markdown(self) -> str:
        scope = "kernel" if self.kernel else "uapi"
        value = str(self.value) if "(" in self.item or self.value < 256 else f"0x{self.value:X}"
        return f"| `{self.item}` | {value} | `{self.nvidia}` | {self.source} | {scope} |"


def member_size(struct: str, member: str) -> str:
    return f"sizeof_field(struct {struct}, {member})"


def wanted_rows(uapi: Path = UAPI) -> list[tuple[str, str, str, bool]]:
    """(item, NVIDIA expression, source, kernel) for everything qpolicy shares with the driver."""
    nvrm = (uapi / "nvrm.h").read_text()
    kapi = (uapi / "nvrm_kapi.h").read_text()
    rows: list[tuple[str, str, str, bool]] = []
    for pair in PAIRS:
        text = kapi if pair.kernel else nvrm
        rows.append(
            (f"sizeof(struct {pair.ours})", f"sizeof({pair.theirs})", pair.header, pair.kernel)
        )
        for member in struct_members(text, pair.ours):
            if skipped(member):
                continue
            theirs = pair.alias.get(member, member)
            rows.append(
                (
                    f"offsetof(struct {pair.ours}, {member})",
                    f"offsetof({pair.theirs}, {theirs})",
                    pair.header,
                    pair.kernel,
                )
            )
            rows.append(
                (
                    member_size(pair.ours, member),
                    f"sizeof((({pair.theirs} *)0)->{theirs})",
                    pair.header,
                    pair.kernel,
                )
            )
        for path, struct in pair.nested.items():
            rows.append(
                (
                    member_size(pair.ours, path),
                    f"sizeof((({pair.theirs} *)0)->{path})",
                    pair.header,
                    True,
                )
            )
            for member in struct_members(nvrm, struct):
                if skipped(member):
                    continue
                rows.append(
                    (
                        f"offsetof(struct {pair.ours}, {path}.{member})",
                        f"offsetof({pair.theirs}, {path}.{member})",
                        pair.header,
                        pair.kernel,
                    )
                )
    for kernel, text in ((False, nvrm), (True, kapi)):
        for name in declared_constants(text):
            if name in NOT_LAYOUT or name in CONSTANT_GREP:
                continue
            theirs = CONSTANT_ALIAS.get(name, name)
            rows.append((name, theirs, "", kernel))
    return rows


def grepped_rows(src: Path) -> list[Row]:
    """The CONSTANT_GREP constants, read from the driver's #defines."""
    rows = []
    kapi = declared_constants((UAPI / "nvrm_kapi.h").read_text())
    for ours, (path, theirs) in CONSTANT_GREP.items():
        text = (src / path).read_text()
        match = re.search(rf"^#define\s+{theirs}\s+\(?\s*(0x[0-9a-fA-F]+|\d+)", text, flags=re.M)
        if match is None:
            raise LookupError(f"{path} does not define {theirs}")
        rows.append(Row(ours, int(match.group(1), 0), theirs, path, ours in kapi))
    return rows


def parse_table(text: str) -> list[Row]:
    """The rows of the Layout section of CONFORMANCE.md."""
    try:
        section = text.split(SECTION, 1)[1]
    except IndexError:
        raise LookupError(f"{TABLE.name} has no section {SECTION!r}") from None
    section = section.split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`") or cells[0] == "`item`":
            continue
        item, value, nvidia, source, scope = cells
        rows.append(
            Row(item.strip("`"), int(value, 0), nvidia.strip("`"), source, scope == "kernel")
        )
    return rows


def replace_table(text: str, table: str) -> str:
    """CONFORMANCE.md with the Layout section's table replaced (its prose kept)."""
    head, section = text.split(SECTION, 1)
    rest = ""
    if "\n## " in section:
        section, rest = section.split("\n## ", 1)
        rest = "\n## " + rest
    prose = section.split("\n| item |", 1)[0].rstrip("\n")
    return head + SECTION + prose + "\n\n" + table + "\n" + rest


def render_headers(rows: list[Row]) -> dict[Path, str]:
    """nvrm_layout.h (what nvrm.h declares) and nvrm_kapi_layout.h (nvrm_kapi.h's)."""
    return {
        HEADER: _render(
            [r for r in rows if not r.kernel],
            "nvrm.h",
            "_QPOLICY_NVRM_LAYOUT_H",
            [
                "#ifdef __KERNEL__",
                "#include <linux/stddef.h>",
                "#else",
                "#include <stddef.h>",
                "#ifndef sizeof_field",
                "#define sizeof_field(TYPE, MEMBER) sizeof((((TYPE *)0)->MEMBER))",
                "#endif",
                "#endif",
            ],
        ),
        KAPI_HEADER: _render(
            [r for r in rows if r.kernel],
            "nvrm_kapi.h",
            "_QPOLICY_NVRM_KAPI_LAYOUT_H",
            ["#include <linux/stddef.h>"],
        ),
    }


def _render(rows: list[Row], includer: str, guard: str, includes: list[str]) -> str:
    lines = [
        "/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */",
        "/*",
        " * GENERATED by tools/kmod/layout.py from the Layout section of"
        " kmod/nvmock/CONFORMANCE.md;",
        f" * do not edit. {includer} includes it at its end: every size, offset and constant"
        " it shares",
        f" * with nvidia.ko must be what the driver's own headers give at tag {TAG}, or the build",
        " * fails here.",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        *includes,
        "",
        *[_assertion(r) for r in rows],
        "",
        f"#endif /* {guard} */",
        "",
    ]
    return "\n".join(lines)


def _assertion(row: Row) -> str:
    """One row as a static assertion, in lines of at most 100 columns (checkpatch)."""
    head = f"_Static_assert({row.item} == {row.value},"
    message = f'"{row.nvidia}");'
    if len(head) + 1 + len(message) <= 100:
        return f"{head} {message}"
    indent = "\t       "  # under the opening parenthesis, as kernel style aligns
    if 8 + 7 + len(message) > 100:
        message = f'"{row.source.rsplit("/", 1)[-1]}");'
    if len(head) > 100:
        tail = f"== {row.value}, {message}"
        if 15 + len(tail) > 100:
            tail = f'== {row.value}, "{row.source.rsplit("/", 1)[-1]}");'
        return f"_Static_assert({row.item}\n{indent}{tail}"
    return f"{head}\n{indent}{message}"


# ---------------------------------------------------------------------------------------------
# Asking NVIDIA's headers


def probe_driver(
    src: Path, wanted: list[tuple[str, str, str, bool]]
) -> tuple[list[Row], list[str]]:
    """Compile each NVIDIA expression against the driver's headers; rows, and what has no match."""
    missing: list[str] = []
    pending = list(wanted)
    while True:
        program = _probe_program(pending)
        with tempfile.TemporaryDirectory() as tmp:
            exe = Path(tmp) / "probe"
            c_file = Path(tmp) / "probe.c"
            c_file.write_text(program)
            args = ["gcc", "-std=gnu11", "-w", "-DNV_LINUX", "-DNVCPU_X86_64", "-DNV_UNIX"]
            args += [f"-I{src / inc}" for inc in INCLUDES]
            result = subprocess.run(
                [*args, "-o", str(exe), str(c_file)], capture_output=True, text=True
            )
            if result.returncode == 0:
                out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
                break
        bad = {i for i in _failing_lines(result.stderr) if 0 <= i < len(pending)}
        if not bad:
            raise RuntimeError("the probe does not compile:\n" + result.stderr[-4000:])
        for index in sorted(bad, reverse=True):
            missing.append(pending[index][0])
            del pending[index]
    values = [int(v, 0) for v in out.split()]
    rows = []
    for (item, theirs, source, kernel), value in zip(pending, values, strict=True):
        rows.append(Row(item, value, theirs, source or _constant_source(src, theirs), kernel))
    return rows, missing


FIRST_LINE = 64  # the probe's line of its first expression (the includes come before)


def _probe_program(wanted: list[tuple[str, str, str, bool]]) -> str:
    head = ["#include <stddef.h>", "#include <stdio.h>"]
    head += [f'#include "{h}"' for h in PROBE_HEADERS]
    head += ["int main(void)", "{"]
    assert len(head) < FIRST_LINE
    head += ["\t;"] * (FIRST_LINE - 1 - len(head))
    body = [f'\tprintf("%llu\\n", (unsigned long long)({theirs}));' for _, theirs, _, _ in wanted]
    return "\n".join(head + body + ["\treturn 0;", "}", ""])


def _failing_lines(stderr: str) -> set[int]:
    lines = set()
    for match in re.finditer(r"probe\.c:(\d+):\d+: (?:error|note: in expansion)", stderr):
        lines.add(int(match.group(1)) - FIRST_LINE)
    return lines


def _constant_source(src: Path, name: str) -> str:
    """The header that defines ``name`` (the first of a #define, a status code or a typedef)."""
    found = re.search(r"\b(?:NV|Nv)\w+", name)
    bare = found.group(0) if found else name
    for pattern in (rf"#define\s+{bare}\b", rf"NV_STATUS_CODE\(\s*{bare}\b", rf"\}}\s*{bare}\b"):
        for inc in INCLUDES:
            result = subprocess.run(
                ["grep", "-rlE", pattern, str(src / inc)], capture_output=True, text=True
            )
            hits = sorted(result.stdout.split())
            if hits:
                return str(Path(hits[0]).relative_to(src))
    return "?"


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    nvidia = sub.add_parser("nvidia", help="the table's rows from NVIDIA's headers")
    nvidia.add_argument("--src", type=Path, required=True, help="an open-gpu-kernel-modules tree")
    nvidia.add_argument("--write", action="store_true", help="replace the table in CONFORMANCE.md")
    sub.add_parser("header", help="write the layout headers from the table")
    sub.add_parser("check", help="exit 1 if the layout headers are not what the table gives")
    args = parser.parse_args(argv)

    if args.cmd == "nvidia":
        rows, missing = probe_driver(args.src, wanted_rows())
        rows += grepped_rows(args.src)
        table = "\n".join(
            ["| item | value | NVIDIA " + TAG + " | header | scope |", "|---|---|---|---|---|"]
            + [row.markdown() for row in rows]
        )
        if args.write:
            TABLE.write_text(replace_table(TABLE.read_text(), table))
        else:
            print(table)
        for item in missing:
            print(f"layout: no counterpart in the driver's headers: {item}", file=sys.stderr)
        return 1 if missing else 0
    headers = render_headers(parse_table(TABLE.read_text()))
    if args.cmd == "header":
        for path, text in headers.items():
            path.write_text(text)
        return 0
    stale = [p for p, text in headers.items() if not p.exists() or p.read_text() != text]
    for path in stale:
        print(
            f"layout: {path.relative_to(ROOT)} is stale: run tools/kmod/layout.py header",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
