"""kmod/uapi/nvrm.h and qpolicy/nvrm/abi.py describe the same ABI.

The numbers are compared by parsing the header's #defines; the struct layouts by compiling a
small C program against the header and asking the compiler for every size and offset, so a
field moved in either file fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from qpolicy.nvrm import abi

HEADER = Path(__file__).resolve().parents[2] / "kmod" / "uapi" / "nvrm.h"

# header struct -> Python layout
STRUCTS: dict[str, abi.Layout] = {
    "nvos00_params": abi.NVOS00,
    "nvos21_params": abi.NVOS21,
    "nvos64_params": abi.NVOS64,
    "nvos54_params": abi.NVOS54,
    "nvos33_params_with_fd": abi.NVOS33_WITH_FD,
    "nvos34_params": abi.NVOS34,
    "nvos55_params": abi.NVOS55,
    "nvos32_params": abi.NVOS32,
    "nv0000_handle_info_params": abi.NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS,
    "nv0000_objects_are_duplicates_params": abi.NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS,
    "nv0041_surface_info_params": abi.NV0041_CTRL_GET_SURFACE_INFO_PARAMS,
    "nv0000_export_object_to_fd_params": abi.CONTROLS[
        abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD
    ].params,
    "nv0000_import_object_from_fd_params": abi.CONTROLS[
        abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD
    ].params,
    "nv0000_export_objects_to_fd_params": abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS,
    "nv0000_import_objects_from_fd_params": abi.NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS,
    "nvrm_export_dmabuf_fd": abi.NV_IOCTL_EXPORT_TO_DMA_BUF_FD,
    "nv00f8_alloc_params": abi.NV00F8_ALLOCATION_PARAMETERS,
    "uvm_initialize_params": abi.UVM_INITIALIZE_PARAMS,
    "uvm_free_params": abi.UVM_FREE_PARAMS,
    "uvm_gpu_mapping_attributes": abi.UVM_GPU_MAPPING_ATTRIBUTES,
    "uvm_alloc_semaphore_pool_params": abi.UVM_ALLOC_SEMAPHORE_POOL_PARAMS,
    "nv0041_surface_info": abi.NV0041_CTRL_SURFACE_INFO,
    "nvrm_card_info": abi.NV_IOCTL_CARD_INFO,
    "nvrm_api_version": abi.NV_IOCTL_RM_API_VERSION,
    "nvrm_sys_params": abi.NV_IOCTL_SYS_PARAMS,
    "nvrm_register_fd": abi.NV_IOCTL_REGISTER_FD,
    "nvrm_wait_open_complete": abi.NV_IOCTL_WAIT_OPEN_COMPLETE,
    "nvrm_xfer": abi.NV_IOCTL_XFER,
    "nvrm_os_event": abi.NV_IOCTL_ALLOC_OS_EVENT,
    "nv0080_alloc_params": abi.NV0080_ALLOC_PARAMETERS,
    "nv2080_alloc_params": abi.NV2080_ALLOC_PARAMETERS,
    "nv_channel_alloc_params": abi.NV_CHANNEL_ALLOC_PARAMS,
    "nv_memory_alloc_params": abi.NV_MEMORY_ALLOCATION_PARAMS,
    "nv_ctxshare_alloc_params": abi.NV_CTXSHARE_ALLOCATION_PARAMETERS,
    "nvb0b5_alloc_params": abi.NVB0B5_ALLOCATION_PARAMETERS,
    "nv2080_ecc_unit_status": abi.NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS,
    "nv2080_ecc_status_params": abi.NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS,
    "nv0080_channellist_params": abi.CONTROLS[abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST].params,
    "nv906f_class_engineid_params": abi.CONTROLS[abi.NV906F_CTRL_GET_CLASS_ENGINEID].params,
    "nv2080_ctx_buffer_size_params": abi.CONTROLS[
        abi.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE
    ].params,
    "nva06c_gpfifo_schedule_params": abi.CONTROLS[abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE].params,
    "nva06c_timeslice_params": abi.CONTROLS[abi.NVA06C_CTRL_CMD_SET_TIMESLICE].params,
    "nva06c_preempt_params": abi.CONTROLS[abi.NVA06C_CTRL_CMD_PREEMPT].params,
    "nva06c_interleave_level_params": abi.CONTROLS[abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL].params,
    "nvc36f_work_submit_token_params": abi.CONTROLS[
        abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN
    ].params,
    "nv2080_fifo_disable_channels_params": abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS,
    "nva06c_make_realtime_params": abi.CONTROLS[abi.NVA06C_CTRL_CMD_MAKE_REALTIME].params,
    "nva06f_interleave_level_params": abi.CONTROLS[abi.NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL].params,
    "nva06f_restart_runlist_params": abi.CONTROLS[abi.NVA06F_CTRL_CMD_RESTART_RUNLIST].params,
    "nva06f_stop_channel_params": abi.CONTROLS[abi.NVA06F_CTRL_CMD_STOP_CHANNEL].params,
    "nv2080_runlist_sched_policy_params": abi.CONTROLS[
        abi.NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY
    ].params,
    "nv2080_ctxsw_preemption_mode_params": abi.CONTROLS[
        abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE
    ].params,
    "nv2080_ctxsw_stats_params": abi.CONTROLS[abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS].params,
    "nv2080_ctxsw_modes_params": abi.CONTROLS[abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES].params,
}

# The TSG alloc params: the header spells out the trailing byte and its padding (24 bytes as
# the driver copies them), the Python side stops at the last field it reads (20).
SIZE_EXCEPTIONS = {"nv_channel_group_alloc_params"}


def _defines() -> dict[str, int]:
    values: dict[str, int] = {}
    for m in re.finditer(
        r"^#define\s+(\w+)\s+(0x[0-9A-Fa-f]+|\d+)u?\b", HEADER.read_text(), re.MULTILINE
    ):
        values[m.group(1)] = int(m.group(2), 0)
    return values


def test_escapes_agree() -> None:
    defines = _defines()
    escapes = {k.removeprefix("NV_ESC_"): v for k, v in defines.items() if k.startswith("NV_ESC_")}
    assert len(escapes) >= 30
    for name, value in escapes.items():
        assert abi.Escape[name] == value, name


def test_statuses_agree() -> None:
    defines = _defines()
    statuses = {k: v for k, v in defines.items() if k == "NV_OK" or k.startswith("NV_ERR_")}
    assert len(statuses) >= 15
    for name, value in statuses.items():
        assert abi.NvStatus[name] == value, name


def test_classes_agree() -> None:
    defines = _defines()
    by_name = {name: cls for cls, (name, _) in abi.CLASSES.items()}
    header_classes = {k: v for k, v in defines.items() if k in by_name}
    assert len(header_classes) >= 15
    for name, value in header_classes.items():
        assert by_name[name] == value, name


def test_controls_and_device_numbers_agree() -> None:
    defines = _defines()
    # The import's object types carry _CTRL_CMD_ in the driver's spelling but are no commands.
    types = {k: v for k, v in defines.items() if "_IMPORT_OBJECT_TYPE_" in k}
    controls = {k: v for k, v in defines.items() if "_CTRL_CMD_" in k and k not in types}
    assert len(controls) >= 9
    assert types and all(abi.IMPORT_OBJECT_TYPE[v] == k.rsplit("_", 1)[1] for k, v in types.items())
    for name, value in controls.items():
        assert getattr(abi, name) == value, name
        assert abi.CONTROLS[value].name == name
    assert defines["NVRM_MAJOR"] == abi.NV_MAJOR
    assert defines["NVRM_CTL_MINOR"] == abi.NV_CTL_MINOR
    assert defines["NVRM_MAX_GPU_MINOR"] == abi.NV_MAX_GPU_MINOR
    assert defines["NVRM_MAX_IOCTL_SIZE"] == abi.MAX_IOCTL_SIZE
    assert defines["NV2080_DISABLE_CHANNELS_MAX"] == abi.FIFO_DISABLE_CHANNELS_MAX


def test_uvm_numbers_agree() -> None:
    defines = _defines()
    uvm = {k: v for k, v in defines.items() if k.startswith("UVM_")}
    names = ["UVM_INITIALIZE", "UVM_DEINITIALIZE", "UVM_FREE", "UVM_ALLOC_SEMAPHORE_POOL"]
    assert set(uvm) == {*names, "UVM_MAX_GPUS"}
    for name in names:
        assert abi.UVM_IOCTLS[uvm[name]] == name
    assert uvm["UVM_INITIALIZE"] == abi.UVM_INITIALIZE
    assert uvm["UVM_FREE"] == abi.UVM_FREE
    assert uvm["UVM_ALLOC_SEMAPHORE_POOL"] == abi.UVM_ALLOC_SEMAPHORE_POOL
    assert uvm["UVM_MAX_GPUS"] == abi.UVM_MAX_GPUS


def _c_field(layout_field: str, struct_fields: set[str]) -> str:
    """The C name of a Python field: spelled alike up to case and underscores (the ioctl structs
    keep the driver's snake_case), arrays flattened in Python (hClientList3 is hClientList[3])."""
    by_key = {f.replace("_", "").lower(): f for f in struct_fields}
    key = layout_field.replace("_", "").lower()
    if key in by_key:
        return by_key[key]
    m = re.fullmatch(r"(\w*?)(\d+)", key)
    assert m and m.group(1) in by_key, layout_field
    return f"{by_key[m.group(1)]}[{m.group(2)}]"


def _struct_fields(text: str, struct: str) -> set[str]:
    body = re.search(r"struct " + struct + r" \{(.*?)\n\};", text, re.DOTALL)
    assert body, struct
    return set(re.findall(r"(\w+)(?:\[\w+\])?;", body.group(1)))


def test_struct_layouts_agree(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is needed to check the header's layouts")
    text = HEADER.read_text()
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        f'#include "{HEADER}"',
        "int main(void) {",
    ]
    expected: dict[str, int] = {}
    for struct, layout in STRUCTS.items():
        fields = _struct_fields(text, struct)
        key = f"{struct}.sizeof"
        lines.append(f'printf("{key} %zu\\n", sizeof(struct {struct}));')
        expected[key] = layout.size
        for name, offset, _ in layout.fields:
            c_name = _c_field(name, fields)
            key = f"{struct}.{name}"
            lines.append(f'printf("{key} %zu\\n", offsetof(struct {struct}, {c_name}));')
            expected[key] = offset
    lines.append("return 0; }")
    source = tmp_path / "layouts.c"
    source.write_text("\n".join(lines))
    binary = tmp_path / "layouts"
    subprocess.run([cc, "-Wall", "-Werror", "-o", str(binary), str(source)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert got == expected
    assert len(expected) > 200  # the disable-channels lists alone are 128 offsets


def test_every_header_struct_is_compared() -> None:
    structs = set(re.findall(r"^struct (\w+) \{", HEADER.read_text(), re.MULTILINE))
    left_out = structs - set(STRUCTS) - SIZE_EXCEPTIONS - {"nv_memory_desc_params"}
    assert not left_out


def test_the_tenant_guard_covers_the_scheduling_controls() -> None:
    """qgpu's list of controls a gated tenant may not steer with (its case labels) is
    abi.SCHEDULING_CONTROLS."""
    track = HEADER.parents[1] / "qgpu" / "track.c"
    body = re.search(
        r"bool qgpu_scheduling_control\(u32 cmd\)\n\{(.*?)\n\}", track.read_text(), re.DOTALL
    )
    assert body
    defines = _defines()
    guarded = {defines[name] for name in re.findall(r"case (\w+):", body.group(1))}
    assert guarded == abi.SCHEDULING_CONTROLS
