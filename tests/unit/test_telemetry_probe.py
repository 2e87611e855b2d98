"""What the probe does without loading anything: counter decoding, the C text it would load,
its device filter, libcuda lookup and the privilege check."""

import re
import struct
from pathlib import Path

import pytest

from qpolicy.errors import ValidationError
from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Node
from qpolicy.telemetry import probe as probe_module
from qpolicy.telemetry import wire
from qpolicy.telemetry.btf import Member
from qpolicy.telemetry.devices import DeviceFilter, char_majors
from qpolicy.telemetry.libcuda import (
    COPY_SYMBOLS,
    ENDBR64,
    LAUNCH_SYMBOLS,
    QUERY_SYMBOLS,
    SYNC_SYMBOLS,
    find_libcuda,
    probe_address,
)
from qpolicy.telemetry.probe import (
    CgroupCounters,
    NvProbe,
    ProbeError,
    build_counters,
    ioctl_name,
    render_source,
)

CTL = wire.NODE_CODES[Node.CTL]
GPU = wire.NODE_CODES[Node.GPU]
UVM = wire.NODE_CODES[Node.UVM]
OFFSETS = {
    "task_struct.files": Member(1824, 8),
    "files_struct.fdt": Member(32, 8),
    "fdtable.max_fds": Member(0, 4),
    "fdtable.fd": Member(8, 8),
    "file.f_inode": Member(32, 8),
    "inode.i_mode": Member(0, 2),
    "inode.i_rdev": Member(76, 4),
    "task_struct.signal": Member(1848, 8),
    "signal_struct.live": Member(4, 4),
}


def test_counters_from_map_rows() -> None:
    counters = build_counters(
        ioctls=[
            (7, CTL, abi.Escape.RM_ALLOC, True, 3),
            (7, GPU, abi.Escape.RM_ALLOC, True, 2),  # same escape on another node: one name
            (7, CTL, 0x99, True, 1),
            (7, CTL, 0x5401, False, 4),
            (7, UVM, 27, False, 5),
            (8, UVM, 0x30000001, False, 1),
        ],
        controls=[(7, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, 6), (7, 0x12345678, 1)],
        allocs=[(7, 0xA06C, 3), (7, 0x1234, 2)],
        latency=[(7, 0, 1), (7, 3, 10), (8, 1, 1)],
        stats=[
            (7, 15, 123456, 2, 9, 40, 6, 11),
            (8, 1, 999, 0, 0, 0, 0, 0),
            (9, 0, 0, 0, 0, 5, 0, 0),
        ],
    )
    assert set(counters) == {7, 8, 9}
    seven = counters[7]
    assert seven == CgroupCounters(
        cgroup=7,
        ioctls=15,
        escapes={
            "RM_ALLOC": 5,
            "escape 0x99": 1,
            "ioctl 0x5401": 4,
            "UVM_REGISTER_CHANNEL": 5,
        },
        controls={"NVA06C_CTRL_CMD_SET_TIMESLICE": 6, "ctrl 0x12345678": 1},
        allocs={"KEPLER_CHANNEL_GROUP_A": 3, "class 0x1234": 2},
        latency_log2=(1, 0, 0, 10),
        latency_sum_ns=123456,
        opens=2,
        mmaps=9,
        launches=40,
        waits=6,
        polls=11,
    )
    assert counters[8].escapes == {"UVM_INITIALIZE": 1}
    assert counters[8].latency_log2 == (0, 1)
    assert counters[9] == CgroupCounters(9, launches=5)


def test_ioctl_names_are_the_decoders() -> None:
    assert ioctl_name(Node.CTL, 0x2A, True) == "RM_CONTROL"
    assert ioctl_name(Node.GPU, 0xC8, True) == "CARD_INFO"
    assert ioctl_name(Node.CTL, 0xEE, True) == "escape 0xee"
    assert ioctl_name(Node.UVM, 75, False) == "UVM_MM_INITIALIZE"
    assert ioctl_name(Node.MODESET, 0xC0104629, False) == "ioctl 0xc0104629"


@pytest.mark.parametrize("output", ["ringbuf", "perf"])
@pytest.mark.parametrize("group_dead", ["tracepoint", "task"])
def test_rendered_source_has_every_placeholder_filled(output: str, group_dead: str) -> None:
    text = render_source(
        OFFSETS,
        openat2=True,
        open_=False,
        group_dead=group_dead,  # type: ignore[arg-type]
        output=output,  # type: ignore[arg-type]
        buffer_pages=128,
    )
    assert not re.findall(r"\bQP_[A-Z0-9_]*[A-Z0-9]\b", text)
    assert "task + 1824" in text and "inode + 76" in text and "signal + 4" in text
    assert "#if 1\nTRACEPOINT_PROBE(syscalls, sys_enter_openat2)" in text
    assert "#if 0\nTRACEPOINT_PROBE(syscalls, sys_enter_open)" in text
    if output == "ringbuf":
        assert "BPF_RINGBUF_OUTPUT(events, 128);" in text
        assert "events.ringbuf_output(ev, size, 0)" in text
    else:
        assert "BPF_PERF_OUTPUT(events);" in text
        assert "events.perf_submit(ctx, ev, size)" in text
    dead = "args->group_dead" if group_dead == "tracepoint" else "signal_group_dead()"
    assert f"if (!({dead}))" in text


def test_a_member_of_another_width_is_refused() -> None:
    offsets = {**OFFSETS, "inode.i_rdev": Member(76, 8)}
    with pytest.raises(ProbeError, match=r"inode\.i_rdev is 8 bytes, the probe reads 4"):
        render_source(offsets, openat2=True, open_=True, group_dead="task", output="perf")


def test_an_unfilled_placeholder_is_refused() -> None:
    with pytest.raises(ProbeError, match="QP_NEW_THING"):
        render_source(
            OFFSETS,
            openat2=True,
            open_=True,
            group_dead="task",
            output="perf",
            source="int x = QP_NEW_THING;",
        )


@pytest.mark.parametrize(
    ("caps", "allowed"),
    [
        (0, False),
        (1 << probe_module.CAP_SYS_ADMIN, True),
        (1 << probe_module.CAP_BPF, False),
        ((1 << probe_module.CAP_BPF) | (1 << probe_module.CAP_PERFMON), True),
    ],
)
def test_privileges(caps: int, allowed: bool) -> None:
    status = f"Name:\tqpolicy\nCapEff:\t{caps:016x}\n"
    if allowed:
        probe_module._check_privileges(status)
    else:
        with pytest.raises(ProbeError, match="needs root"):
            probe_module._check_privileges(status)


def test_a_probe_that_is_not_started_says_so() -> None:
    with pytest.raises(ProbeError, match="not started"):
        NvProbe(DeviceFilter.parse(["1:7=ctl"])).counters()
    with pytest.raises(ProbeError, match="power of two"):
        NvProbe(buffer_pages=3)


PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
237 nvidia-caps
240 nvidia-uvm

Block devices:
  7 loop
240 nvidia-uvm-block-that-is-not
"""


def test_default_filter_is_this_machines_nvidia_nodes() -> None:
    assert char_majors(PROC_DEVICES)["nvidia-uvm"] == 240
    nvidia = DeviceFilter.nvidia(PROC_DEVICES)
    assert nvidia.node_of(195, 255) is Node.CTL
    assert nvidia.node_of(195, 0) is Node.GPU
    assert nvidia.node_of(195, 7) is Node.GPU
    assert nvidia.node_of(195, 254) is Node.MODESET
    assert nvidia.node_of(240, 0) is Node.UVM
    assert nvidia.node_of(240, 1) is Node.UVM  # nvidia-uvm-tools
    assert nvidia.node_of(237, 1) is Node.CAPS
    assert nvidia.node_of(1, 7) is Node.OTHER
    assert len(nvidia.exact) == 256
    without_uvm = DeviceFilter.nvidia("Character devices:\n195 nvidia-frontend\n")
    assert without_uvm.majors == {}


def test_test_only_filter() -> None:
    parsed = DeviceFilter.parse(["1:7=ctl", "1:5=nvidia-uvm", "10:*=gpu", "0x1:0x3=GPU"])
    assert parsed.node_of(1, 7) is Node.CTL
    assert parsed.node_of(1, 5) is Node.UVM
    assert parsed.node_of(10, 200) is Node.GPU
    assert parsed.node_of(1, 3) is Node.GPU
    assert parsed.describe() == "1:3=nvidia, 1:5=nvidia-uvm, 1:7=nvidiactl, 10:*=nvidia"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1:7", "expected MAJOR:MINOR=NODE"),
        ("1=ctl", "expected MAJOR:MINOR=NODE"),
        ("1:7=disk", "expected MAJOR:MINOR=NODE"),
        ("x:7=ctl", "'x' is not a device number"),
        ("1:2000000=ctl", "out of range"),
    ],
)
def test_bad_device_specs(spec: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DeviceFilter.parse([spec])


def test_launch_symbols() -> None:
    wanted = [
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuLaunchCooperativeKernelMultiDevice",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
    ]
    assert all(LAUNCH_SYMBOLS.match(name) for name in wanted)
    for other in ("cuLaunchHostFunc", "cuGraphLaunchX", "cuMemAlloc", "xcuLaunchKernel"):
        assert not LAUNCH_SYMBOLS.match(other)


def test_wait_symbols_are_the_calls_that_return_when_the_gpu_work_is_done() -> None:
    """Names as cuda.h gives them (the _v2 and per-thread default stream _ptsz / _ptds
    variants): what waits is probed; what returns at once (Async copies, a host function) is
    not; a query is probed apart (its answer says whether the work is done)."""
    waits = {
        SYNC_SYMBOLS: ["cuCtxSynchronize", "cuCtxSynchronize_v2", "cuStreamSynchronize",
                       "cuStreamSynchronize_ptsz", "cuEventSynchronize"],
        COPY_SYMBOLS: ["cuMemcpy", "cuMemcpy_ptds", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds",
                       "cuMemcpyHtoD_v2", "cuMemcpyDtoD_v2", "cuMemcpyPeer", "cuMemcpy2D_v2",
                       "cuMemcpy2DUnaligned_v2_ptds", "cuMemcpy3D_v2", "cuMemcpy3DPeer",
                       "cuMemcpyAtoH_v2"],
        QUERY_SYMBOLS: ["cuStreamQuery", "cuStreamQuery_ptsz", "cuEventQuery"],
    }  # fmt: skip
    for pattern, names in waits.items():
        assert [n for n in names if not pattern.match(n)] == []
    others = ["cuMemcpyAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz",
              "cuMemcpyBatchAsync", "cuMemcpy3DPeerAsync", "cuMemAlloc_v2", "cuStreamWaitEvent",
              "cuEventRecord", "cuLaunchHostFunc", "cuCtxSynchronizeX"]  # fmt: skip
    for pattern in waits:
        assert [n for n in others if pattern.match(n)] == []


def test_find_libcuda(tmp_path: Path) -> None:
    assert find_libcuda(None) is None
    library = tmp_path / "libcuda.so.1"
    library.write_bytes(b"\x7fELF")
    assert find_libcuda(str(library)) == library
    with pytest.raises(ValidationError, match="is not a file"):
        find_libcuda(tmp_path / "missing.so")
    auto = find_libcuda("auto")
    assert auto is None or auto.name.startswith("libcuda.so")


def test_launch_uprobes_step_over_endbr64(tmp_path: Path) -> None:
    # A minimal ELF64: one PT_LOAD mapping file offset 0x100 at address 0x2000.
    header = struct.pack(
        "<16sHHIQQQIHHHHHH",
        b"\x7fELF\x02\x01\x01" + bytes(9),
        3,
        62,
        1,
        0,
        64,
        0,
        0,
        64,
        56,
        1,
        0,
        0,
        0,
    )
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0x100, 0x2000, 0x2000, 0x40, 0x40, 0x1000)
    code = (ENDBR64 + b"\x55" + bytes(11)) + (b"\x55" + bytes(15))
    library = tmp_path / "libcuda.so.1"
    library.write_bytes((header + segment).ljust(0x100, b"\0") + code.ljust(0x40, b"\0"))
    assert probe_address(library, 0x2000) == 0x2004  # endbr64: probe the push after it
    assert probe_address(library, 0x2010) == 0x2010  # starts with push
    assert probe_address(library, 0x9000) == 0x9000  # outside every segment: as given
    not_elf = tmp_path / "not-elf"
    not_elf.write_bytes(b"hello")
    assert probe_address(not_elf, 0x2000) == 0x2000
