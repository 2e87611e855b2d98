"""RM calls whose answers nvmock must give as the real nvidia.ko does, as cases that run on both.

Each case makes a few calls on objects of its own (freed before it returns) and gives back what
RM answered: statuses by name, sizes as RM wrote them back, values read back; nothing that depends
on the machine (addresses, the handles RM picks, versions, the GPU's memory size). A case that
raised gives its error instead, so one refusal does not hide the other cases' answers.

``tools/gpu/rm_conformance.py`` runs them on a GPU host as root and keeps the answers
(``tools/gpu/results/*-rm-conformance-*.json``); ``tests/vm/test_nvmock_reality.py`` runs them
against nvmock and fails on any answer that differs from a kept one and that
``kmod/nvmock/CONFORMANCE.md`` does not explain. The cases are the calls qgpu and the rm enforcer
depend on: object naming, memory sizes (qgpu charges what RM allocated), duplicates (memory lives
while any handle does), VID_HEAP_CONTROL, controls, and a TSG's timeslice (the online lever).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpolicy.nvrm import abi, rmctl
from tests.vm.rmclient import (
    MEMORY_OWNER,
    Alloc,
    Rm,
    RmError,
    ioctl,
    memory_params,
    sysmem_params,
)
from tests.vm.uvmcalls import (
    MADV_DOFORK,
    PAGE,
    POOL_BYTES,
    alloc_pool,
    child_reads,
    free,
    initialize,
    libc,
    map_uvm,
    move,
    reserved,
    uvm_file,
    writes,
)

Answers = dict[str, Any]
CASES: dict[str, Callable[[Rm], Answers]] = {}

MIB = 1 << 20
DEVICE = abi.NV0080_ALLOC_PARAMETERS
COPY = abi.NVB0B5_ALLOCATION_PARAMETERS  # VERSION_0: engineType is a CE index
# Page-size choices of attr (NVOS32_ATTR_PAGE_SIZE, 24:23) and the sizes around each page size.
PAGE_SIZES = {"default": 0, "4KB": 1, "BIG": 2, "HUGE": 3}
SIZES = (1, 4096, 4097, 65536, 65537, 2 * MIB, 2 * MIB + 1, 3 * MIB)
LOCATION_PCI = 1 << 25
# RM picks client handles from 0xc1d00000 and object handles from 0xcaf00000 (resserv.h,
# rs_client.h); only that range is compared, not which handle of it.
HANDLE_RANGE = 0xFFF00000


RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"


def recordings() -> list[Path]:
    """The real driver's answers kept so far (tools/gpu/rm_conformance.py's output)."""
    return sorted(RESULTS.glob("*-rm-conformance-*.json"))


def flatten(answers: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """("case/answer/...", value) pairs; lists stay values (JSON has no tuples)."""
    if isinstance(answers, dict):
        for key, value in answers.items():
            yield from flatten(value, f"{prefix}/{key}" if prefix else str(key))
    else:
        yield prefix, answers


def differences(real: dict[str, Any], mock: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every answer path where the two disagree, a missing answer included: (real, mock)."""
    left, right = dict(flatten(real)), dict(flatten(json.loads(json.dumps(mock))))
    return {
        path: (left.get(path, "(none)"), right.get(path, "(none)"))
        for path in sorted(left.keys() | right.keys())
        if left.get(path, "(none)") != right.get(path, "(none)")
    }


def case(fn: Callable[[Rm], Answers]) -> Callable[[Rm], Answers]:
    CASES[fn.__name__] = fn
    return fn


def name(status: int) -> str:
    return abi.status_name(status)


@dataclass
class Scope:
    rm: Rm
    client: int
    device: int
    subdevice: int


@contextmanager
def scope(rm: Rm, va_mode: int = 0) -> Iterator[Scope]:
    """A client with a device (its ``vaMode``) and its subdevice, freed (with all under it) on
    the way out."""
    client = rm.new(0, 0, 0x41)
    try:
        device = rm.new(client, client, 0x80, DEVICE.pack(deviceId=rm.gpu_index, vaMode=va_mode))
        subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
        yield Scope(rm, client, device, subdevice)
    finally:
        rm.free(client, client, client)


def run(rm: Rm, only: list[str] | None = None) -> dict[str, Answers]:
    """Every case (or those named) in order: its answers, or ``{"error": ...}``."""
    out: dict[str, Answers] = {}
    for case_name, fn in CASES.items():
        if only and case_name not in only:
            continue
        try:
            out[case_name] = fn(rm)
        except (RmError, OSError) as error:
            out[case_name] = {"error": str(error)}
    return out


@case
def client_handles(rm: Rm) -> Answers:
    """A client RM names, one named by its caller, and that name asked again."""
    made: list[int] = []
    answers: Answers = {}
    try:
        picked = rm.alloc(0, 0, 0x41)
        answers["picked"] = name(picked.status)
        answers["picked_range"] = hex(picked.handle & HANDLE_RANGE)
        if picked.status == abi.NvStatus.NV_OK:
            made.append(picked.handle)
        wanted = 0xC1D0BEE0
        named = rm.alloc(wanted, 0, 0x41, handle=0)
        answers["named"] = name(named.status)
        answers["named_as_asked"] = named.handle == wanted
        if named.status == abi.NvStatus.NV_OK:
            made.append(named.handle)
            answers["named_again"] = name(rm.alloc(wanted, 0, 0x41, handle=0).status)
    finally:
        for client in made:
            rm.free(client, client, client)
    return answers


@case
def object_handles(rm: Rm) -> Answers:
    """Duplicate and invalid names, parents, classes and instances."""
    with scope(rm) as s:
        handle = rm.name()
        params = DEVICE.pack(deviceId=rm.gpu_index)
        return {
            # The GPU's one device per client: a second is refused whatever its handle.
            "second_device": name(rm.alloc(s.client, s.client, 0x80, params, handle).status),
            "device_handle_taken": name(
                rm.alloc(s.client, s.client, 0x80, params, s.device).status
            ),
            "client_handle_as_object": name(
                rm.alloc(s.client, s.device, 0x2080, struct.pack("<I", 0), s.client).status
            ),
            "subdevice_id_1": name(
                rm.alloc(s.client, s.device, 0x2080, struct.pack("<I", 1)).status
            ),
            "second_subdevice": name(
                rm.alloc(s.client, s.device, 0x2080, struct.pack("<I", 0)).status
            ),
            "device_id_31": name(
                rm.alloc(s.client, s.client, 0x80, DEVICE.pack(deviceId=31)).status
            ),
            "unknown_parent": name(rm.alloc(s.client, 0x5C0BAD00, 0x40, memory_params(MIB)).status),
            "memory_under_client": name(
                rm.alloc(s.client, s.client, 0x40, memory_params(MIB)).status
            ),
            "unknown_class": name(rm.alloc(s.client, s.device, 0x1234, b"\0" * 64).status),
            "memory_without_params": name(rm.alloc(s.client, s.device, 0x40).status),
        }


def _memory(s: Scope, cls: int, params: bytes) -> Answers:
    """Allocate, read back what RM wrote and what it reports, free."""
    result = s.rm.alloc(s.client, s.device, cls, params)
    out: Answers = {"status": name(result.status)}
    if result.status != abi.NvStatus.NV_OK:
        return out
    written = abi.NV_MEMORY_ALLOCATION_PARAMS.unpack(result.params)
    status, size = s.rm.mem_size(s.client, result.handle)
    out.update(size=written["size"], limit=written["limit"], reported=size)
    if status != abi.NvStatus.NV_OK:
        out["reported"] = name(status)
    out["free"] = name(s.rm.free(s.client, s.device, result.handle))
    return out


@case
def vidmem_sizes(rm: Rm) -> Answers:
    """Video memory of each size around a page size, with each page-size choice: the size RM
    wrote back (what qgpu charges), the limit, and GET_SURFACE_INFO's size."""
    answers: Answers = {}
    with scope(rm) as s:
        for page, bits in PAGE_SIZES.items():
            for size in SIZES:
                attr = bits << 23
                answers[f"{page} {size}"] = _memory(s, 0x40, memory_params(size, attr=attr))
    return answers


@case
def sysmem_sizes(rm: Rm) -> Answers:
    """System memory (LOCATION PCI) of each size, with each page-size choice."""
    answers: Answers = {}
    with scope(rm) as s:
        for page, bits in PAGE_SIZES.items():
            for size in SIZES:
                attr = LOCATION_PCI | bits << 23
                answers[f"{page} {size}"] = _memory(
                    s, 0x3E, memory_params(size, MEMORY_OWNER, attr)
                )
    return answers


@case
def memory_refusals(rm: Rm) -> Answers:
    """Sizes, owners and locations RM refuses."""
    with scope(rm) as s:
        return {
            "vidmem_size_0": _memory(s, 0x40, memory_params(0)),
            "vidmem_owner_0": _memory(s, 0x40, memory_params(MIB, owner=0)),
            "vidmem_owner_all_ones": _memory(s, 0x40, memory_params(MIB, owner=0xFFFFFFFF)),
            "vidmem_owner_scratch": _memory(s, 0x40, memory_params(MIB, owner=0xDEAF0001)),
            "vidmem_location_pci": _memory(s, 0x40, memory_params(MIB, attr=LOCATION_PCI)),
            "sysmem_location_vidmem": _memory(s, 0x3E, memory_params(MIB)),
            "sysmem_size_0": _memory(s, 0x3E, sysmem_params(0)),
            "sysmem_owner_0": _memory(s, 0x3E, sysmem_params(MIB, owner=0)),
            "vidmem_2_pow_41": _memory(s, 0x40, memory_params(1 << 41)),
        }


def _vidheap(s: Scope, size: int, attr: int = 0, named: bool = True) -> Answers:
    handle = s.rm.name() if named else 0
    arg = bytearray(
        abi.NVOS32.pack(
            hRoot=s.client,
            hObjectParent=s.device,
            function=abi.NVOS32_FUNCTION_ALLOC_SIZE,
            flags=abi.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED if named else 0,
            hMemory=handle,
            owner=MEMORY_OWNER,
            attr=attr,
            size=size,
        )
    )
    ioctl(s.rm.ctl, abi.Escape.RM_VID_HEAP_CONTROL, arg)
    out = abi.NVOS32.unpack(bytes(arg))
    answers: Answers = {"status": name(out["status"])}
    if out["status"] != abi.NvStatus.NV_OK:
        return answers
    answers.update(
        size=out["size"],
        limit=out["limit"],
        handle_as_asked=out["hMemory"] == handle if named else None,
        handle_range=hex(out["hMemory"] & HANDLE_RANGE),
        reported=s.rm.mem_size(s.client, out["hMemory"])[1],
        free=name(s.rm.free(s.client, s.device, out["hMemory"])),
    )
    return answers


@case
def vid_heap_control(rm: Rm) -> Answers:
    """NVOS32 ALLOC_SIZE: the same memory through the older escape (qgpu gates it too)."""
    with scope(rm) as s:
        return {
            "vidmem_4097": _vidheap(s, 4097),
            "vidmem_2mib_plus_1": _vidheap(s, 2 * MIB + 1),
            "vidmem_rm_names": _vidheap(s, MIB, named=False),
            "sysmem_4097": _vidheap(s, 4097, attr=LOCATION_PCI),
            "size_0": _vidheap(s, 0),
        }


@case
def duplicates(rm: Rm) -> Answers:
    """A duplicate in a second client keeps the memory after the original is freed."""
    answers: Answers = {}
    with scope(rm) as first, scope(rm) as second:
        memory = rm.new(first.client, first.device, 0x40, memory_params(3 * MIB))
        status, dup = rm.dup(second.client, second.device, first.client, memory)
        answers["dup"] = name(status)
        if status == abi.NvStatus.NV_OK:
            answers["dup_size"] = rm.mem_size(second.client, dup)[1]
        status, same = rm.dup(first.client, first.device, first.client, memory)
        answers["dup_same_client"] = name(status)
        if status == abi.NvStatus.NV_OK:
            params = abi.NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS.pack(
                hObject1=memory, hObject2=same
            )
            status, out = rm.control(
                first.client, first.client, abi.NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES,
                params,
            )  # fmt: skip
            answers["are_duplicates"] = name(status)
            answers["are_duplicates_answer"] = (
                abi.NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS.unpack(out)["bDuplicates"]
            )
        answers["free_original"] = name(rm.free(first.client, first.device, memory))
        if "dup_size" in answers:
            answers["dup_size_after"] = rm.mem_size(second.client, dup)[1]
        status, _ = rm.dup(second.client, second.client, first.client, first.device)
        answers["dup_device"] = name(status)
        status, _ = rm.dup(second.client, second.device, first.client, 0x5C0BAD01)
        answers["dup_unknown"] = name(status)
        if "dup_size" in answers:
            status, _ = rm.dup(second.client, 0x5C0BAD05, second.client, dup)
            answers["dup_unknown_parent"] = name(status)
    return answers


@case
def frees(rm: Rm) -> Answers:
    """Freeing what is not there, twice, and a client."""
    with scope(rm) as s:
        memory = rm.new(s.client, s.device, 0x40, memory_params(MIB))
        answers: Answers = {
            "unknown": name(rm.free(s.client, s.device, 0x5C0BAD02)),
            "memory": name(rm.free(s.client, s.device, memory)),
            "memory_again": name(rm.free(s.client, s.device, memory)),
            "unknown_client": name(rm.free(0xC1D0BAD0, 0xC1D0BAD0, 0xC1D0BAD0)),
        }
    answers["client_again"] = name(rm.free(s.client, s.client, s.client))
    return answers


@case
def controls(rm: Rm) -> Answers:
    """The NULL command, an unknown one, a wrong size, an unknown object."""
    with scope(rm) as s:
        memory = rm.new(s.client, s.device, 0x40, memory_params(MIB))
        info = struct.pack("<IIQ", 0, 0, 0)
        parent = rm.handle_info(s.client, s.subdevice, abi.HANDLE_INFO_INDEX_PARENT)
        cls = rm.handle_info(s.client, memory, abi.HANDLE_INFO_INDEX_CLASSID)
        return {
            "null": name(rm.control(s.client, s.client, 0, b"")[0]),
            "unknown_command": name(rm.control(s.client, s.device, 0x0080FFFF, b"\0" * 8)[0]),
            "surface_info_empty": name(
                rm.control(s.client, memory, abi.NV0041_CTRL_CMD_GET_SURFACE_INFO, info)[0]
            ),
            "surface_info_short": name(
                rm.control(s.client, memory, abi.NV0041_CTRL_CMD_GET_SURFACE_INFO, info[:8])[0]
            ),
            "unknown_object": name(
                rm.control(s.client, 0x5C0BAD03, abi.NV0041_CTRL_CMD_GET_SURFACE_INFO, info)[0]
            ),
            "handle_info_parent": (name(parent[0]), parent[1] == s.device),
            "handle_info_class": (name(cls[0]), hex(cls[1])),
            "handle_info_unknown": name(rm.handle_info(s.client, 0x5C0BAD04, 1)[0]),
        }


def _timeslice(s: Scope, tsg: int, cmd: int, value: int = 0) -> tuple[str, int]:
    status, out = s.rm.control(s.client, tsg, cmd, struct.pack("<Q", value))
    return name(status), int(struct.unpack("<Q", out)[0])


@case
def tsg_timeslice(rm: Rm) -> Answers:
    """A TSG of its own: its default timeslice, the short and long ones the daemon sets, zero,
    and its interleave level (the levers of issue 14, on a TSG with no channel yet)."""
    with scope(rm) as s:
        params = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(engineType=1)
        made = rm.alloc(s.client, s.device, 0xA06C, params)
        answers: Answers = {"tsg": name(made.status)}
        if made.status != abi.NvStatus.NV_OK:
            return answers
        tsg = made.handle
        get, put = abi.NVA06C_CTRL_CMD_GET_TIMESLICE, abi.NVA06C_CTRL_CMD_SET_TIMESLICE
        answers["default"] = _timeslice(s, tsg, get)
        for value in (1, 128, 8000, 1_000_000, 0):
            answers[f"set {value}"] = _timeslice(s, tsg, put, value)[0]
            answers[f"get after {value}"] = _timeslice(s, tsg, get)
        level = abi.NVA06C_CTRL_CMD_GET_INTERLEAVE_LEVEL
        status, out = rm.control(s.client, tsg, level, b"\0" * 4)
        answers["interleave"] = (name(status), int(struct.unpack("<I", out)[0]))
        for value in (0, 2, 3):
            status, _ = rm.control(
                s.client, tsg, abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, struct.pack("<I", value)
            )
            answers[f"set interleave {value}"] = name(status)
        answers["free"] = name(rm.free(s.client, s.device, tsg))
        return answers


@case
def fabric(rm: Rm) -> Answers:
    """NV_MEMORY_FABRIC under the device and under the subdevice (its parent), with the class's
    own parameters: a GPU without a fabric refuses it."""
    with scope(rm) as s:
        params = abi.NV00F8_ALLOCATION_PARAMETERS.pack(allocSize=2 * MIB, pageSize=2 * MIB)
        return {
            "under_device": name(rm.alloc(s.client, s.device, 0xF8, params).status),
            "under_subdevice": name(rm.alloc(s.client, s.subdevice, 0xF8, params).status),
        }


# NVOS32's union members (nvos.h, 580.142) other than ALLOC_SIZE, at their offsets in the
# 184-byte NVOS32_PARAMETERS: the union starts at 40, hMemory is at 44 in each allocating one.
NVOS32_FUNCTION_FREE = 3
NVOS32_FUNCTION_INFO = 5
NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT = 6
NVOS32_FUNCTION_ALLOC_SIZE_RANGE = 14
NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED = 0x1
NVOS32_ALLOC_FLAGS_USE_BEGIN_END = 0x20000
RANGE_SIZE, RANGE_LIMIT, RANGE_BEGIN, RANGE_END = 80, 104, 112, 120  # AllocSizeRange
TILED_HEIGHT, TILED_PITCH, TILED_SIZE, TILED_LIMIT = 56, 60, 88, 112  # AllocTiledPitchHeight
TILED_ATTR, TILED_FORMAT, TILED_ATTR2 = 64, 72, 144


def nvos32_call(
    rm: Rm, client: int, device: int, function: int, fields: dict[int, tuple[str, int]]
) -> tuple[int, bytes]:
    """VID_HEAP_CONTROL with ``function`` and raw union fields {offset: (format, value)}: the
    status and the argument as RM left it."""
    arg = bytearray(abi.NVOS32.pack(hRoot=client, hObjectParent=device, function=function))
    for offset, (fmt, value) in fields.items():
        struct.pack_into("<" + fmt, arg, offset, value)
    ioctl(rm.ctl, abi.Escape.RM_VID_HEAP_CONTROL, arg)
    return abi.NVOS32.unpack(bytes(arg))["status"], bytes(arg)


def _nvos32(s: Scope, function: int, fields: dict[int, tuple[str, int]]) -> tuple[int, bytes]:
    return nvos32_call(s.rm, s.client, s.device, function, fields)


def _made(s: Scope, status: int, arg: bytes, size_at: int, limit_at: int) -> Answers:
    """What an allocating function answered, and whether RM now has memory at hMemory."""
    out: Answers = {"status": name(status)}
    if status != abi.NvStatus.NV_OK:
        return out
    handle = struct.unpack_from("<I", arg, 44)[0]
    reported = s.rm.mem_size(s.client, handle)
    out.update(
        size=struct.unpack_from("<Q", arg, size_at)[0],
        limit=struct.unpack_from("<Q", arg, limit_at)[0],
        reported=reported[1] if reported[0] == abi.NvStatus.NV_OK else name(reported[0]),
        free=name(s.rm.free(s.client, s.device, handle)),
    )
    return out


@case
def vid_heap_functions(rm: Rm) -> Answers:
    """The other VID_HEAP_CONTROL functions that make or free memory: ALLOC_SIZE_RANGE and
    ALLOC_TILED_PITCH_HEIGHT allocate as ALLOC_SIZE does (a memory gate must see them), FREE
    frees an object (its charge must go), INFO reads the heap."""
    answers: Answers = {}
    provided = abi.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED
    with scope(rm) as s:
        common = {40: ("I", MEMORY_OWNER), 44: ("I", rm.name()), 52: ("I", provided)}
        status, arg = _nvos32(
            s, NVOS32_FUNCTION_ALLOC_SIZE_RANGE, {**common, RANGE_SIZE: ("Q", 4097)}
        )
        answers["size_range"] = _made(s, status, arg, RANGE_SIZE, RANGE_LIMIT)
        common[44] = ("I", rm.name())
        ranged = {
            **common,
            52: ("I", provided | NVOS32_ALLOC_FLAGS_USE_BEGIN_END),
            RANGE_SIZE: ("Q", MIB),
            RANGE_BEGIN: ("Q", 0),
            RANGE_END: ("Q", 64 * MIB - 1),
        }
        status, arg = _nvos32(s, NVOS32_FUNCTION_ALLOC_SIZE_RANGE, ranged)
        answers["size_range_begin_end"] = _made(s, status, arg, RANGE_SIZE, RANGE_LIMIT)
        common[44] = ("I", rm.name())
        tiled = {**common, TILED_HEIGHT: ("I", 3), TILED_PITCH: ("i", 100_000)}
        status, arg = _nvos32(s, NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT, tiled)
        answers["tiled_pitch_height"] = _made(s, status, arg, TILED_SIZE, TILED_LIMIT)
        memory = rm.new(s.client, s.device, 0x40, memory_params(MIB))
        freed = {40: ("I", MEMORY_OWNER), 44: ("I", memory)}
        answers["free_without_flag"] = name(_nvos32(s, NVOS32_FUNCTION_FREE, freed)[0])
        freed[48] = ("I", NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED)
        answers["free"] = name(_nvos32(s, NVOS32_FUNCTION_FREE, freed)[0])
        answers["after_free"] = name(rm.mem_size(s.client, memory)[0])
        answers["free_again"] = name(_nvos32(s, NVOS32_FUNCTION_FREE, freed)[0])
        status, arg = _nvos32(s, NVOS32_FUNCTION_INFO, {})
        answers["info"] = name(status)
        answers["info_total_nonzero"] = abi.NVOS32.unpack(arg)["total"] > 0
        answers["unknown_function"] = name(_nvos32(s, 99, {})[0])
    return answers


@case
def vid_heap_tiled_written_back(rm: Rm) -> Answers:
    """What ALLOC_TILED_PITCH_HEIGHT writes back besides the size: attr, attr2 and format, _IN_OUT
    in its table (_nvos32FunctionAllocTiledPitchHeight, rmapi_deprecated_vidheapctrl.c), for the
    default page size and a 2 MiB one (attr PAGE_SIZE HUGE)."""
    answers: Answers = {}
    provided = abi.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED
    with scope(rm) as s:
        for key, attr in (("default", 0), ("huge", PAGE_SIZES["HUGE"] << 23)):
            handle = rm.name()
            fields = {
                40: ("I", MEMORY_OWNER),
                44: ("I", handle),
                52: ("I", provided),
                TILED_HEIGHT: ("I", 4),
                TILED_PITCH: ("i", 65536),
                TILED_ATTR: ("I", attr),
            }
            status, arg = _nvos32(s, NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT, fields)
            answers[key] = {"status": name(status)}
            if status == abi.NvStatus.NV_OK:
                answers[key] |= {
                    field: hex(struct.unpack_from("<I", arg, at)[0])
                    for field, at in (
                        ("attr", TILED_ATTR),
                        ("attr2", TILED_ATTR2),
                        ("format", TILED_FORMAT),
                    )
                }
                rm.free(s.client, s.device, handle)
    return answers


def _dup_in_child(rm: Rm, client: int, memory: int) -> str:
    """RM_DUP_OBJECT of ``memory`` into a client of a forked child process: RM's status."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a client of its own, then the duplicate
        status = "error"
        try:
            os.close(read)
            child = Rm(rm.gpu_index, rm.dev)
            own = child.new(0, 0, 0x41)
            device = child.new(own, own, 0x80, DEVICE.pack(deviceId=rm.gpu_index))
            status = name(child.dup(own, device, client, memory)[0])
            child.free(own, own, own)
        finally:
            os.write(write, status.encode())
            os._exit(0)
    os.close(write)
    try:
        return os.read(read, 64).decode() or "error"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@case
def clients_not_ones_own(rm: Rm) -> Answers:
    """Calls naming a client that does not exist, and one of another open of the driver (a
    process's other file: RM ties a client to the file it was made through)."""
    answers: Answers = {}
    ghost = 0xC1D0BAD1
    with scope(rm) as s:
        answers["alloc_unknown_client"] = name(
            rm.alloc(ghost, ghost, 0x40, memory_params(MIB)).status
        )
        answers["control_unknown_client"] = name(rm.handle_info(ghost, ghost, 1)[0])
        answers["dup_into_unknown_client"] = name(rm.dup(ghost, ghost, s.client, s.device)[0])
        memory = rm.new(s.client, s.device, 0x40, memory_params(MIB))
        other = Rm(rm.gpu_index, rm.dev)
        try:
            answers["alloc_other_files_client"] = name(
                other.alloc(s.client, s.device, 0x40, memory_params(MIB)).status
            )
            answers["control_other_files_client"] = name(
                other.handle_info(s.client, memory, abi.HANDLE_INFO_INDEX_CLASSID)[0]
            )
            answers["dup_from_other_files_client"] = "n/a"
            own = other.new(0, 0, 0x41)
            own_device = other.new(own, own, 0x80, DEVICE.pack(deviceId=rm.gpu_index))
            answers["dup_from_other_files_client"] = name(
                other.dup(own, own_device, s.client, memory)[0]
            )
            answers["dup_from_other_process"] = _dup_in_child(rm, s.client, memory)
            answers["free_other_files_object"] = name(other.free(s.client, s.device, memory))
            answers["free_other_files_client"] = name(other.free(s.client, s.client, s.client))
            answers["still_there"] = name(rm.mem_size(s.client, memory)[0])
            other.free(own, own, own)
        finally:
            other.close()
    return answers


@case
def tsg_timeslice_bounds(rm: Rm) -> Answers:
    """Timeslices past what the daemon sets: does RM (GSP) refuse any?"""
    answers: Answers = {}
    with scope(rm) as s:
        params = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(engineType=1)
        tsg = rm.new(s.client, s.device, 0xA06C, params)
        get, put = abi.NVA06C_CTRL_CMD_GET_TIMESLICE, abi.NVA06C_CTRL_CMD_SET_TIMESLICE
        for value in (10**9, 10**9 + 1, 1 << 32, 1 << 63):
            answers[f"set {value}"] = _timeslice(s, tsg, put, value)[0]
            answers[f"get after {value}"] = _timeslice(s, tsg, get)
        status, _ = rm.control(s.client, tsg, put, b"\0" * 4)
        answers["set_short_params"] = name(status)
    return answers


EXPORT = abi.CONTROLS[abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD].params
IMPORT = abi.CONTROLS[abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD].params


@case
def export_import(rm: Rm) -> Answers:
    """Memory exported to a new control fd (as the user library does), the original freed, then
    imported back: the fd holds the memory in between (qgpu refuses exports to limited cgroups
    because of it). Bad fds and a second export to one fd, too."""
    answers: Answers = {}
    with scope(rm) as s:
        memory = rm.new(s.client, s.device, 0x40, memory_params(3 * MIB))
        fd = os.open(f"{rm.dev}/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        try:

            def export(handle: int, target: int) -> str:
                params = EXPORT.pack(
                    type=1, hDevice=s.device, hParent=s.device, hObject=handle, fd=target
                )
                command = abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD
                return name(rm.control(s.client, s.client, command, params)[0])

            def import_(source: int, parent: int) -> tuple[str, int]:
                params = IMPORT.pack(fd=source, type=1, hParent=parent)
                command = abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD
                status, out = rm.control(s.client, s.client, command, params)
                return name(status), IMPORT.unpack(out)["hObject"]

            answers["export_bad_fd"] = export(memory, -1)
            answers["export_gpu_fd"] = export(memory, rm.gpu)
            answers["export_unknown_object"] = export(0x5C0BAD06, fd)
            answers["import_nothing_exported"] = import_(fd, s.device)[0]
            answers["export"] = export(memory, fd)
            answers["export_again"] = export(memory, fd)
            answers["free_original"] = name(rm.free(s.client, s.device, memory))
            answers["import_unknown_parent"] = import_(fd, 0x5C0BAD07)[0]
            status, imported = import_(fd, s.device)
            answers["import"] = status
            if status == "NV_OK":
                answers["import_range"] = hex(imported & HANDLE_RANGE)
                answers["import_size"] = rm.mem_size(s.client, imported)[1]
                answers["import_again"] = import_(fd, s.device)[0]
        finally:
            os.close(fd)
    return answers


@case
def alloc_refusal_order(rm: Rm) -> Answers:
    """Requests wrong in two ways: which refusal RM gives. serverAllocResource (resserv's
    rs_server.c) copies the parameters in, refusing NULL ones of a class that requires them,
    before it looks up the client or the parent; stdmemValidateParams checks the owner before
    the heap is asked for the size; usrmodeConstruct refuses bPriv without bBar1Mapping to any
    caller, before its privilege check."""
    with scope(rm) as s:
        return {
            "vaspace_without_params": name(rm.alloc(s.client, s.device, 0x90F1).status),
            "memory_without_params_unknown_parent": name(
                rm.alloc(s.client, 0x5C0BAD08, 0x40).status
            ),
            "memory_without_params_unknown_client": name(
                rm.alloc(0xC1D0BAD1, 0xC1D0BAD1, 0x40).status
            ),
            "memory_without_params_taken_handle": name(
                rm.alloc(s.client, s.device, 0x40, None, s.subdevice).status
            ),
            "vidmem_2_pow_41_owner_0": _memory(s, 0x40, memory_params(1 << 41, owner=0)),
            "usermode_priv_without_bar1": name(
                rm.alloc(s.client, s.subdevice, 0xC661, bytes([0, 1])).status
            ),
            "usermode_priv_with_bar1": name(
                rm.alloc(s.client, s.subdevice, 0xC661, bytes([1, 1])).status
            ),
        }


@case
def duplicates_refused(rm: Rm) -> Answers:
    """CLIENT_OBJECTS_ARE_DUPLICATES on handles that are not two memory objects of the client
    (cliresCtrlCmdObjectsAreDuplicates, memGetByHandle: a handle the client does not have, one
    that is not memory), and an export of an object that is not memory."""
    answers: Answers = {}
    with scope(rm) as s:
        memory = rm.new(s.client, s.device, 0x40, memory_params(MIB))
        command = abi.NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES
        pairs = {
            "second_unknown": (memory, 0x5C0BAD09),
            "first_unknown": (0x5C0BAD0A, memory),
            "second_not_memory": (memory, s.device),
            "first_not_memory": (s.subdevice, memory),
        }
        for key, (first, second) in pairs.items():
            params = abi.NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS.pack(
                hObject1=first, hObject2=second
            )
            answers[key] = name(rm.control(s.client, s.client, command, params)[0])
        fd = os.open(f"{rm.dev}/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        try:
            params = EXPORT.pack(type=1, hDevice=s.device, hParent=s.device, hObject=s.subdevice,
                                 fd=fd)  # fmt: skip
            command = abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD
            answers["export_subdevice"] = name(rm.control(s.client, s.client, command, params)[0])
        finally:
            os.close(fd)
    return answers


def _errno(value: int) -> str:
    return errno.errorcode.get(value, str(value)) if value else "0"


@case
def uvm_pool_free(rm: Rm) -> Answers:
    """UVM_FREE of a semaphore pool (libcuda's start-up makes one and maps it) while the pool is
    mapped on the CPU, once unmapped, never mapped, and once its mapping was moved with mremap
    (nvidia-uvm's uvm_free_semaphore_pool refuses a pool still mapped; a move disables the
    mapping and takes the pool's pages off the CPU: uvm_vm_open_semaphore_pool). Not an RM
    call, and no GPU is named: the UVM file alone."""
    answers: Answers = {}
    with uvm_file() as fd:
        answers["init"] = name(initialize(fd))
        with reserved(POOL_BYTES) as pool, reserved(POOL_BYTES) as other:
            answers["alloc"] = name(alloc_pool(fd, pool))
            answers["map"] = _errno(map_uvm(fd, pool, POOL_BYTES))
            answers["free_while_mapped"] = name(free(fd, pool))
            answers["written_after_refusal"] = writes(pool, POOL_BYTES)
            libc.munmap(pool, POOL_BYTES)
            answers["free_unmapped"] = name(free(fd, pool))
            answers["free_again"] = name(free(fd, pool))
            answers["alloc_never_mapped"] = name(alloc_pool(fd, other))
            answers["free_never_mapped"] = name(free(fd, other))
        with reserved(POOL_BYTES) as pool, reserved(POOL_BYTES) as target:
            answers["alloc_to_move"] = name(alloc_pool(fd, pool))
            answers["map_to_move"] = _errno(map_uvm(fd, pool, POOL_BYTES))
            answers["moved"] = _errno(move(pool, POOL_BYTES, target))
            answers["free_after_move"] = name(free(fd, pool))
            libc.munmap(target, POOL_BYTES)
            answers["free_after_move_again"] = name(free(fd, pool))
    return answers


@case
def uvm_copies(rm: Rm) -> Answers:
    """Copies of UVM mappings: a pool's and a managed range's mapping forked with MADV_DOFORK
    (libcuda's are VM_DONTCOPY; nvidia-uvm disables the child's copy and keeps the parent's:
    uvm_vm_open_semaphore_pool(), uvm_vm_open_managed(), uvm_disable_vma()), and a pool's
    mapping split by a partial munmap (both parts disabled and the pool off the CPU)."""
    answers: Answers = {}
    with uvm_file() as fd:
        answers["init"] = name(initialize(fd))
        with reserved(POOL_BYTES) as pool:
            answers["pool"] = name(alloc_pool(fd, pool))
            answers["pool_map"] = _errno(map_uvm(fd, pool, POOL_BYTES))
            libc.madvise(pool, POOL_BYTES, MADV_DOFORK)
            ctypes.memset(pool + PAGE, 0x5A, 1)
            answers["pool_child_reads"] = child_reads(pool + PAGE)
            answers["pool_parent_reads"] = ctypes.string_at(pool + PAGE, 1).hex()
            answers["pool_free_while_parent_maps"] = name(free(fd, pool))
            libc.munmap(pool, POOL_BYTES)
            answers["pool_free_unmapped"] = name(free(fd, pool))
        size = 4 * POOL_BYTES
        with reserved(size) as managed:
            answers["managed_map"] = _errno(map_uvm(fd, managed, size))
            libc.madvise(managed, size, MADV_DOFORK)
            ctypes.memset(managed, 0x5A, PAGE)
            answers["managed_child_reads"] = child_reads(managed)
            answers["managed_parent_reads"] = ctypes.string_at(managed, 1).hex()
            libc.munmap(managed, size)
        with reserved(POOL_BYTES) as pool:
            answers["split_pool"] = name(alloc_pool(fd, pool))
            answers["split_map"] = _errno(map_uvm(fd, pool, POOL_BYTES))
            answers["split_unmap_half"] = libc.munmap(pool, POOL_BYTES // 2) == 0
            answers["split_free"] = name(free(fd, pool))
            libc.munmap(pool + POOL_BYTES // 2, POOL_BYTES // 2)
            answers["split_free_again"] = name(free(fd, pool))
    return answers


def _written_back(s: Scope, cls: int, params: bytes) -> Answers:
    """Allocate and free: RM's status and each 32-bit word of the parameters RM changed, by its
    offset ("24": 0x...), but the framebuffer offset and the address (80-87, 96-103), which
    depend on the machine."""
    result = s.rm.alloc(s.client, s.device, cls, params)
    out: Answers = {"status": name(result.status)}
    if result.status != abi.NvStatus.NV_OK:
        return out
    for at in range(0, len(params), 4):
        if 80 <= at < 88 or 96 <= at < 104:
            continue
        before, after = params[at : at + 4], result.params[at : at + 4]
        if before != after:
            out[str(at)] = f"{struct.unpack('<I', after)[0]:#x}"
    out["free"] = name(s.rm.free(s.client, s.device, result.handle))
    return out


def written_back_requests() -> Iterator[tuple[str, int, bytes]]:
    """memory_written_back's requests: (answer key, class, parameters)."""
    for page, bits in PAGE_SIZES.items():
        for size in (4096, 65537, 2 * MIB):
            attr = bits << 23
            yield f"vidmem {page} {size}", 0x40, memory_params(size, attr=attr)
            yield (
                f"sysmem {page} {size}",
                0x3E,
                memory_params(size, MEMORY_OWNER, LOCATION_PCI | attr),
            )


@case
def memory_written_back(rm: Rm) -> Answers:
    """What RM writes back into NV_MEMORY_ALLOCATION_PARAMS besides the size: attr, attr2 (the
    page size and physicality it chose: mem_utils.c, system_mem.c, video_mem.c) and any other
    word, for video and system memory, each page-size choice, three sizes."""
    with scope(rm) as s:
        return {key: _written_back(s, cls, params) for key, cls, params in written_back_requests()}


SENTINEL = 0xA5A5A5A5  # an entry's data before the call: whether RM wrote it


def _surface_info(s: Scope, memory: int, indices: list[int]) -> Answers:
    """GET_SURFACE_INFO with ``indices``: RM's status and each entry's data as hex ("-" where
    RM left it as it was)."""
    status, data = s.rm.surface_info(s.client, memory, indices, SENTINEL)
    return {
        "status": name(status),
        "data": ["-" if value == SENTINEL else f"{value:#x}" for value in data],
    }


@case
def surface_info(rm: Rm) -> Answers:
    """GET_SURFACE_INFO's other indices and its errors (memCtrlCmdGetSurfaceInfoLvm, mem_ctrl.c):
    ATTRS, COMPR_COVERAGE, PHYS_SIZE, PHYS_ATTR (the page size, CPU coherency and format bits
    of the memory's HW resource attr, where it has one) and ADDR_SPACE_TYPE of video and system
    memory, and a list with a bad index between good ones (RM stops at the first failure,
    having filled the entries before it)."""
    indices = [
        abi.SURFACE_INFO_INDEX_ATTRS,
        abi.SURFACE_INFO_INDEX_COMPR_COVERAGE,
        abi.SURFACE_INFO_INDEX_PHYS_SIZE,
        abi.SURFACE_INFO_INDEX_PHYS_ATTR,
        abi.SURFACE_INFO_INDEX_ADDR_SPACE_TYPE,
    ]
    answers: Answers = {}
    with scope(rm) as s:
        requests = {
            "vidmem 64K": (0x40, memory_params(MIB // 16)),
            "vidmem 2M": (0x40, memory_params(2 * MIB)),
            "sysmem 4K": (0x3E, memory_params(4096, MEMORY_OWNER, LOCATION_PCI)),
        }
        for key, (cls, params) in requests.items():
            memory = rm.new(s.client, s.device, cls, params)
            answers[key] = _surface_info(s, memory, indices)
            answers[f"{key} bad index"] = _surface_info(
                s,
                memory,
                [abi.SURFACE_INFO_INDEX_PHYS_SIZE_LO, 99, abi.SURFACE_INFO_INDEX_PHYS_ATTR],
            )
            rm.free(s.client, s.device, memory)
    return answers


GR, COPY2 = 1, 0xB  # NV2080_ENGINE_TYPE_GRAPHICS, _COPY2 (cl2080_notification.h)


def _tsg(s: Scope, engine: int, vaspace: int = 0) -> int:
    params = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(engineType=engine, hVASpace=vaspace)
    return s.rm.new(s.client, s.device, 0xA06C, params)


DELAY = 0x40  # NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING: kept off the runlist


def _channel(
    s: Scope, tsg: int, engine: int, share: int = 0, flags: int = DELAY, vaspace: int = 0
) -> Alloc:
    """A channel of ``tsg`` as libcuda makes one (its ring and USERD in 2 MiB of video memory of
    its own), but kept off the runlist (NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING): never run."""
    userd = s.rm.new(s.client, s.device, 0x40, memory_params(2 * MIB))
    params = abi.NV_CHANNEL_ALLOC_PARAMS.pack(
        gpFifoOffset=0x200600000,
        gpFifoEntries=1024,
        flags=flags,
        hContextShare=share,
        hVASpace=vaspace,
        hUserdMemory0=userd,
        userdOffset0=0x2000,
        engineType=engine,
    )
    return s.rm.alloc(s.client, tsg, 0xC86F, params)


def _share(s: Scope, tsg: int, vaspace: int, flags: int, subctx: int = 0) -> tuple[Answers, int]:
    """A context share under ``tsg``: (RM's status and the subctxId it wrote back, its handle)."""
    params = abi.NV_CTXSHARE_ALLOCATION_PARAMETERS.pack(
        hVASpace=vaspace, flags=flags, subctxId=subctx
    )
    made = s.rm.alloc(s.client, tsg, 0x9067, params)
    answer = abi.NV_CTXSHARE_ALLOCATION_PARAMETERS.unpack(made.params)["subctxId"]
    ok = made.status == abi.NvStatus.NV_OK
    return {"status": name(made.status), "subctxId": hex(answer) if ok else "-"}, made.handle


@case
def context_shares(rm: Rm) -> Answers:
    """The subcontext (VEID) RM gives each context share of a TSG (kctxshareInitCommon_IMPL,
    kernel_ctxshare.c): SYNC VEID 0; ASYNC, as libcuda asks, the highest free one; SPECIFIED the
    one asked for; PREFER_LOWER the lowest free from 1, with bit 31 saying whether it is below
    the GPU's lower bound; any other flags refused; a VEID taken or out of range refused; a
    freed one given again."""
    answers: Answers = {}
    with scope(rm, va_mode=2) as s:
        vaspace = rm.new(s.client, s.device, 0x90F1, bytes(56))
        tsg = _tsg(s, GR)
        first = 0
        for key, flags, subctx in (
            ("async", abi.SUBCONTEXT_ASYNC, 0),
            ("async 2", abi.SUBCONTEXT_ASYNC, 0),
            ("sync", abi.SUBCONTEXT_SYNC, 0),
            ("sync again", abi.SUBCONTEXT_SYNC, 0),
            ("specified 5", abi.SUBCONTEXT_SPECIFIED, 5),
            ("specified 5 again", abi.SUBCONTEXT_SPECIFIED, 5),
            ("specified 64", abi.SUBCONTEXT_SPECIFIED, 64),
            ("prefer lower", abi.SUBCONTEXT_PREFER_LOWER, 0),
            ("prefer lower 2", abi.SUBCONTEXT_PREFER_LOWER, 0),
            ("flags 4", 4, 0),
        ):
            answers[key], handle = _share(s, tsg, vaspace, flags, subctx)
            if key == "async":
                first = handle
        answers["free async"] = name(rm.free(s.client, tsg, first))
        answers["async after free"] = _share(s, tsg, vaspace, abi.SUBCONTEXT_ASYNC)[0]
    return answers


def _engine_id(s: Scope, channel: int, handle: int) -> Answers:
    layout = abi.CONTROLS[abi.NV906F_CTRL_GET_CLASS_ENGINEID].params
    status, out = s.rm.control(
        s.client, channel, abi.NV906F_CTRL_GET_CLASS_ENGINEID, layout.pack(hObject=handle)
    )
    if status != abi.NvStatus.NV_OK:
        return {"status": name(status)}
    got = layout.unpack(out)
    return {"status": name(status)} | {
        key: hex(got[key]) for key in ("classEngineID", "classID", "engineID")
    }


def _channel_list(s: Scope, handles: list[int], bad_pointer: bool = False) -> Answers:
    """GET_CHANNELLIST on the device: RM's status and, per handle, "a channel ID" where RM
    wrote one below 2048 (the number is the GPU's to choose), else what it wrote in hex; with
    ``bad_pointer`` the handle list is at an address no process can read."""
    sentinel = 0x5EE5EE5E
    names = ctypes.create_string_buffer(struct.pack(f"<{len(handles)}I", *handles) or b"\0")
    ids = ctypes.create_string_buffer(struct.pack(f"<{len(handles)}I", *[sentinel] * len(handles)))
    params = struct.pack(
        "<I4xQQ",
        len(handles),
        8 if bad_pointer else ctypes.addressof(names) if handles else 0,
        ctypes.addressof(ids) if handles else 0,
    )
    status, _ = s.rm.control(s.client, s.device, abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST, params)
    written = struct.unpack(f"<{len(handles)}I", ids.raw[: 4 * len(handles)])
    return {
        "status": name(status),
        "ids": ["a channel ID" if value < 2048 else hex(value) for value in written],
    }


def _ctx_size(s: Scope, handle: int) -> Answers:
    status, out = s.rm.control(
        s.client,
        s.subdevice,
        abi.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE,
        struct.pack("<I4xQ", handle, 0),
    )
    size = struct.unpack_from("<Q", out, 8)[0]
    # The size is the GPU's (its GR context's buffers): only its shape is compared.
    return {
        "status": name(status),
        "size": "4 KiB pages" if size and not size % 4096 else hex(size),
    }


@case
def channel_queries(rm: Rm) -> Answers:
    """A channel as libcuda makes one (a compute TSG, an ASYNC context share, USERD in 2 MiB of
    video memory, a compute and a copy object; kept off the runlist here), and what libcuda asks
    about it: each object's class and engine (kchannelCtrlCmdGetClassEngineid_IMPL,
    kernel_channel.c), the channel's ID (deviceCtrlCmdFifoGetChannelList_IMPL,
    kernel_fifo_ctrl.c), the GR context's size (subdeviceCtrlCmdKGrGetCtxBufferSize_IMPL,
    kernel_graphics.c), and their refusals."""
    answers: Answers = {}
    with scope(rm, va_mode=2) as s:
        vaspace = rm.new(s.client, s.device, 0x90F1, bytes(56))
        tsg = _tsg(s, GR)
        share = _share(s, tsg, vaspace, abi.SUBCONTEXT_ASYNC)[1]
        made = _channel(s, tsg, GR, share)
        answers["channel"] = name(made.status)
        if made.status != abi.NvStatus.NV_OK:
            return answers
        channel = made.handle
        compute = rm.alloc(s.client, channel, 0xCBC0, bytes(16))
        copy = rm.alloc(s.client, channel, 0xC8B5, COPY.pack(engineType=1))
        answers["compute"], answers["copy"] = name(compute.status), name(copy.status)
        engine = {
            "compute": compute.handle,
            "copy": copy.handle,
            "null": 0,
            "the client": s.client,
            "the TSG": tsg,
            "unknown": 0x5C0BAD07,
        }
        for key, handle in engine.items():
            answers[f"engine id of {key}"] = _engine_id(s, channel, handle)
        answers["channel list"] = _channel_list(s, [channel, 0x5C0BAD08, tsg])
        answers["channel list empty"] = _channel_list(s, [])
        answers["ctx size"] = _ctx_size(s, channel)
        answers["ctx size of the TSG"] = _ctx_size(s, tsg)
        answers["ctx size unknown"] = _ctx_size(s, 0x5C0BAD09)
        answers["channel list bad pointer"] = _channel_list(s, [channel], bad_pointer=True)
        answers["free"] = name(rm.free(s.client, tsg, channel))
        answers["channel list after free"] = _channel_list(s, [channel])
        answers.update(_copy_channel(s, vaspace))
    return answers


def _copy_channel(s: Scope, vaspace: int) -> Answers:
    """A channel of a copy-engine TSG as libcuda makes one (COPY2, no context share: RM makes
    the TSG's own), its copy object's engine, and its GR context, which it has none of."""
    made = _channel(s, _tsg(s, COPY2, vaspace), COPY2)
    answers: Answers = {"copy channel": name(made.status)}
    if made.status != abi.NvStatus.NV_OK:
        return answers
    copy = s.rm.alloc(s.client, made.handle, 0xC8B5, COPY.pack(engineType=2))
    answers["copy channel's copy"] = name(copy.status)
    answers["engine id of CE 2"] = _engine_id(s, made.handle, copy.handle)
    answers["ctx size of a copy channel"] = _ctx_size(s, made.handle)
    return answers


@case
def ecc_status(rm: Rm) -> Answers:
    """QUERY_ECC_STATUS, as libcuda sends it twice once its TSGs are scheduled: each unit's
    enabled, scrub-complete and supported flags ("esp", "-" where clear) and the poison and
    uncorrectable flags; the error counts are the host's and not compared. Sent to GSP
    (ROUTE_TO_PHYSICAL in g_subdevice_nvoc.c), whose code is closed: measured only."""
    with scope(rm) as s:
        status, out = rm.control(
            s.client,
            s.subdevice,
            abi.NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS,
            bytes(abi.ECC_STATUS_SIZE),
        )
        short, _ = rm.control(
            s.client, s.subdevice, abi.NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS, bytes(1456)
        )
    units = {}
    for unit in range(abi.ECC_UNIT_COUNT):
        flags = out[unit * abi.ECC_UNIT_SIZE : unit * abi.ECC_UNIT_SIZE + 3]
        units[str(unit)] = "".join(c if b else "-" for c, b in zip("esp", flags, strict=True))
    tail = abi.ECC_UNIT_COUNT * abi.ECC_UNIT_SIZE
    return {
        "status": name(status),
        "units": units,
        "fatal poison": out[tail],
        "uncorrectable": out[tail + 1],
        "short": name(short),
    }


def _there(s: Scope, handle: int) -> str:
    """Whether the client still has ``handle``: CLIENT_GET_HANDLE_INFO's status for its class."""
    return name(s.rm.handle_info(s.client, handle, abi.HANDLE_INFO_INDEX_CLASSID)[0])


def _rm_made(s: Scope, handle: int, tsg: int) -> Answers:
    """What RM made at ``handle`` (one of its own choosing): its class, and whether it is under
    ``tsg``."""
    status, cls = s.rm.handle_info(s.client, handle, abi.HANDLE_INFO_INDEX_CLASSID)
    parent = s.rm.handle_info(s.client, handle, abi.HANDLE_INFO_INDEX_PARENT)[1]
    return {"status": name(status), "class": hex(cls), "under the TSG": parent == tsg}


THREAD = 28  # NVOS04_FLAGS_GROUP_CHANNEL_THREAD (29:28)


def _context(s: Scope, vaspace: int) -> tuple[int, int, int]:
    """A TSG as libcuda makes its compute one (naming no VA space), an ASYNC context share in it
    on ``vaspace``, and a channel in that share: their handles."""
    tsg = _tsg(s, GR)
    share = _share(s, tsg, vaspace, abi.SUBCONTEXT_ASYNC)[1]
    return tsg, share, _channel(s, tsg, GR, share).handle


def _lost(s: Scope, channel: int) -> str:
    """The control qgpu and the rm enforcer ask a channel whether RM still has it working: the
    engine of the object the client's own handle names (answered by the host, no effect)."""
    layout = abi.CONTROLS[abi.NV906F_CTRL_GET_CLASS_ENGINEID].params
    cmd, params = abi.NV906F_CTRL_GET_CLASS_ENGINEID, layout.pack(hObject=s.client)
    return name(s.rm.control(s.client, channel, cmd, params)[0])


def _close(s: Scope, channels: list[int]) -> str:
    """FIFO_DISABLE_CHANNELS closing ``channels`` (never scheduled), then opening them again
    whatever it answered: the close's status."""
    cmd = abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS
    close = rmctl.disable_channels_params(s.client, channels, disable=True)
    status = s.rm.control(s.client, s.subdevice, cmd, bytes(close))[0]
    for channel in channels:
        reopen = rmctl.disable_channels_params(s.client, [channel], disable=False)
        s.rm.control(s.client, s.subdevice, cmd, bytes(reopen))
    return name(status)


@case
def legacy_context_shares(rm: Rm) -> Answers:
    """A TSG whose channels name no context share, as libcuda's copy-engine TSGs' do: on its
    first channel RM puts it in legacy mode (kchangrpapiSetLegacyMode_IMPL,
    kernel_channel_group_api.c) and makes two shares of its own in the client, under the TSG,
    at handles of its choosing: SYNC (VEID 0) and ASYNC (VEID 1), which a channel runs in by its
    NVOS04_FLAGS_GROUP_CHANNEL_THREAD; no other share fits there. Before them, the TSG itself
    took one for its graphics context (kchangrpapiConstruct_IMPL). A TSG's channels all name a
    share or none, and what a named share must be (kchannelConstruct_IMPL, kernel_channel.c).
    RM's handles are compared only by how far past one taken just before they lie."""
    answers: Answers = {}
    with scope(rm, va_mode=2) as s:
        vaspace = rm.new(s.client, s.device, 0x90F1, bytes(56))
        before = rm.alloc(s.client, s.device, 0x40, memory_params(MIB), handle=0)
        tsg = _tsg(s, COPY2, vaspace)
        first = _channel(s, tsg, COPY2)
        answers["channel"] = name(first.status)
        after = rm.alloc(s.client, s.device, 0x40, memory_params(MIB), handle=0)
        between = after.handle - before.handle - 1
        answers["RM's handles taken between"] = between
        answers["RM's handles"] = [
            _rm_made(s, before.handle + n, tsg) for n in range(1, min(between, 4) + 1)
        ]
        threads = [_channel(s, tsg, COPY2, flags=DELAY | n << THREAD) for n in (1, 2)]
        answers["channel, thread 1"] = name(threads[0].status)
        answers["channel, thread 2"] = name(threads[1].status)
        for key, flags, subctx in (
            ("sync share", abi.SUBCONTEXT_SYNC, 0),
            ("async share", abi.SUBCONTEXT_ASYNC, 0),
            ("specified 1", abi.SUBCONTEXT_SPECIFIED, 1),
            ("specified 2", abi.SUBCONTEXT_SPECIFIED, 2),
            ("prefer lower", abi.SUBCONTEXT_PREFER_LOWER, 0),
        ):
            answers[key] = _share(s, tsg, vaspace, flags, subctx)[0]
        other = _tsg(s, GR, vaspace)
        answers["other TSG's share"], share = _share(s, other, vaspace, abi.SUBCONTEXT_ASYNC)
        answers["legacy TSG, a share named"] = name(_channel(s, tsg, COPY2, share).status)
        answers["share named"] = name(_channel(s, other, GR, share).status)
        answers["then none named"] = name(_channel(s, other, GR).status)
        fresh = _tsg(s, GR, vaspace)
        answers["another TSG's share"] = name(_channel(s, fresh, GR, share).status)
        answers["a VA space as share"] = name(_channel(s, fresh, GR, vaspace).status)
        answers["unknown share"] = name(_channel(s, fresh, GR, 0x5C0BAD0A).status)
        answers["share and VA space"] = name(_channel(s, fresh, GR, share, vaspace=vaspace).status)
        answers["VA space in a TSG"] = name(_channel(s, fresh, GR, vaspace=vaspace).status)
        answers["engine not the TSG's"] = name(_channel(s, fresh, COPY2).status)
        answers["after it, a sync share"] = _share(s, fresh, vaspace, abi.SUBCONTEXT_SYNC)[0]
        shared = _tsg(s, GR, vaspace)
        _share(s, shared, vaspace, abi.SUBCONTEXT_ASYNC)
        answers["none named, a share there"] = name(_channel(s, shared, GR).status)
        device_channel = abi.NV_CHANNEL_ALLOC_PARAMS.pack(
            gpFifoEntries=1024, flags=DELAY, hContextShare=share, engineType=GR
        )
        answers["device's channel naming a share"] = name(
            rm.alloc(s.client, s.device, 0xC86F, device_channel).status
        )
        no_engine = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(engineType=0)
        answers["TSG of engine 0"] = name(rm.alloc(s.client, s.device, 0xA06C, no_engine).status)
        shares = [
            before.handle + n
            for n, made in enumerate(answers["RM's handles"], 1)
            if made["class"] == hex(0x9067)
        ]
        if first.status == abi.NvStatus.NV_OK and shares:
            answers["free RM's sync share"] = name(rm.free(s.client, tsg, shares[0]))
            answers["its channel"] = _there(s, first.handle)
            answers["thread 1's channel"] = _there(s, threads[0].handle)
            answers["a channel in it again"] = name(_channel(s, tsg, COPY2).status)
    return answers


@case
def dependents_freed(rm: Rm) -> Answers:
    """What RM does with an object's dependents when it is freed (clientUpdatePendingFreeList_IMPL,
    resserv's rs_server.c): a channel depends on the context share it runs in
    (kchannelConstruct_IMPL), a TSG and a context share on the VA space they were made on
    (kchangrpapiConstruct_IMPL, kctxshareapiConstruct_IMPL), the channels and shares of a TSG on
    the graphics context RM made for it; USERD memory is no such thing. Whether each is still
    there is asked by handle (CLIENT_GET_HANDLE_INFO): a dependent that is not below the object
    freed is only invalidated (serverFreeResourceTree's bInvalidateOnly), and keeps its handle."""
    answers: Answers = {}
    with scope(rm, va_mode=2) as s:
        kept = rm.new(s.client, s.device, 0x90F1, bytes(56))
        freed = rm.new(s.client, s.device, 0x90F1, bytes(56))
        tsg, share, channel = _context(s, kept)
        answers["free the share"] = name(rm.free(s.client, tsg, share))
        answers["its channel"] = _there(s, channel)
        answers["its TSG"] = _there(s, tsg)
        # A copy-engine TSG made on the VA space, and a share on it in a TSG that is not.
        copy_tsg = _tsg(s, COPY2, freed)
        userd = rm.new(s.client, s.device, 0x40, memory_params(2 * MIB))
        params = abi.NV_CHANNEL_ALLOC_PARAMS.pack(
            gpFifoOffset=0x200600000,
            gpFifoEntries=1024,
            flags=DELAY,
            hUserdMemory0=userd,
            userdOffset0=0x2000,
            engineType=COPY2,
        )
        copy_channel = rm.new(s.client, copy_tsg, 0xC86F, params)
        other, other_share, other_channel = _context(s, freed)
        answers["free the VA space"] = name(rm.free(s.client, s.device, freed))
        answers["the TSG made on it"] = _there(s, copy_tsg)
        answers["that TSG's channel"] = _there(s, copy_channel)
        answers["the share made on it"] = _there(s, other_share)
        answers["that share's channel"] = _there(s, other_channel)
        answers["that share's TSG"] = _there(s, other)
        answers["the channel's USERD memory"] = _there(s, userd)
        answers["the other VA space"] = _there(s, kept)
        # The graphics context RM made with a TSG, at the handle after one taken just before.
        marker = rm.alloc(s.client, s.device, 0x40, memory_params(MIB), handle=0).handle
        third, third_share, third_channel = _context(s, kept)
        grctx = marker + 1
        answers["RM's handle after the TSG's"] = _rm_made(s, grctx, third)
        answers["free the graphics context"] = name(rm.free(s.client, third, grctx))
        answers["a channel of its TSG"] = _there(s, third_channel)
        answers["a share of its TSG"] = _there(s, third_share)
        answers["the graphics context's TSG"] = _there(s, third)
        answers["a share made after"] = _share(s, third, kept, abi.SUBCONTEXT_ASYNC)[0]
    return answers


@case
def invalidated_objects(rm: Rm) -> Answers:
    """What RM answers about objects it invalidated, not freed, with one they depended on
    (serverFreeResourceTree, rs_server.c: a dependent that is not below the object freed is
    freed with bInvalidateOnly, its handle kept; dependents_freed): the control qgpu and the rm
    enforcer ask a channel, and one on a TSG (serverControl: NV_ERR_RESOURCE_LOST),
    FIFO_DISABLE_CHANNELS naming the channel alone and beside a live one (sent to GSP, whose
    answer is closed), and its free."""
    answers: Answers = {}
    with scope(rm, va_mode=2) as s:
        vaspace = rm.new(s.client, s.device, 0x90F1, bytes(56))
        freed = rm.new(s.client, s.device, 0x90F1, bytes(56))
        tsg, share, channel = _context(s, vaspace)
        live = _context(s, vaspace)[2]
        answers["free the share"] = name(rm.free(s.client, tsg, share))
        answers["its channel, asked"] = _lost(s, channel)
        answers["a live channel, asked"] = _lost(s, live)
        answers["close it"] = _close(s, [channel])
        answers["close a live one and it"] = _close(s, [live, channel])
        answers["close the live one"] = _close(s, [live])
        answers["free it"] = name(rm.free(s.client, tsg, channel))
        answers["it, freed"] = _there(s, channel)
        copy_tsg = _tsg(s, COPY2, freed)
        answers["free the VA space"] = name(rm.free(s.client, s.device, freed))
        status, _ = rm.control(s.client, copy_tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, bytes(8))
        answers["the TSG made on it, its timeslice"] = name(status)
    return answers
