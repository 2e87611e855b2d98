"""Many uprobes as one BPF link (``BPF_TRACE_UPROBE_MULTI``, Linux 6.6 and later).

The probe puts a uprobe on each of libcuda's launch, wait, copy and query functions: 100 perf
events on the H200 hosts' libcuda 580.159.04. The kernel took about 125 ms to tear down each, one
after the other (by the timings, a synchronisation per uprobe as it is unregistered), so a daemon
took 12-13 s to exit, killed or stopped, and 0.9 s without them (tools/gpu/probe_teardown.py, an
H200, call 22B): the next daemon starts only after, and a pod the killed one had closed stays
closed meanwhile. A uprobe-multi link holds all of a program's uprobes in one file and goes in one
step: 6 links took 1.2-1.3 s with the rest of the probe (call 22D).

bcc 0.26 cannot make such links, so they are made here: the program is loaded again through bcc's
loader with the expected attach type the kernel asks of it, and the link comes from the
``BPF_LINK_CREATE`` command (``union bpf_attr``'s ``link_create.uprobe_multi``,
include/uapi/linux/bpf.h). Where the kernel refuses (older than 6.6, or a policy), the caller
falls back to one perf event per uprobe.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Sequence
from typing import Any

#: ``enum bpf_cmd`` and ``enum bpf_attach_type`` (include/uapi/linux/bpf.h, Linux 6.6).
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48
#: ``link_create.uprobe_multi.flags``: the program runs as the functions return.
BPF_F_UPROBE_MULTI_RETURN = 1
#: ``enum bpf_prog_type``: uprobe programs are kprobe programs.
BPF_PROG_TYPE_KPROBE = 2
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280}.get(platform.machine())
# link_create: prog_fd, target_fd, attach_type, flags (u32 each), then uprobe_multi: path,
# offsets, ref_ctr_offsets, cookies (u64 pointers), cnt, flags, pid (u32). 64 bytes with padding.
_LINK_CREATE = struct.Struct("=IIIIQQQQIII4x")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class UprobeMultiError(OSError):
    """The kernel (or bcc) would not make a uprobe-multi link."""


def load_program(bpf: Any, name: bytes) -> int:
    """Load ``bpf``'s function ``name`` again as a kprobe-type program with the expected attach
    type of a uprobe-multi link; its fd (the caller closes it). Not through ``bpf.load_func``,
    whose cache would hand the same program to a perf-event attach, which the kernel refuses for
    this attach type."""
    from bcc.libbcc import lib  # bcc is imported only when a probe is loaded

    module = bpf.module
    start = lib.bpf_function_start(module, name)
    if not start:
        raise UprobeMultiError(0, f"no BPF function {name.decode()}")
    fd = lib.bcc_func_load(
        module,
        BPF_PROG_TYPE_KPROBE,
        name,
        start,
        lib.bpf_function_size(module, name),
        lib.bpf_module_license(module),
        lib.bpf_module_kern_version(module),
        0,
        None,
        0,
        None,
        BPF_TRACE_UPROBE_MULTI,
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise UprobeMultiError(err, f"cannot load {name.decode()}: {os.strerror(err)}")
    return int(fd)


def link(program: int, path: str, offsets: Sequence[int], *, returns: bool) -> int:
    """A link running ``program`` at each of ``offsets`` (file offsets in ``path``) in every
    process, or as each of those functions returns (``returns``); its fd. Closing it detaches
    all of them."""
    if _SYS_BPF is None:
        raise UprobeMultiError(0, f"no bpf(2) number known for {platform.machine()}")
    if not offsets:
        raise UprobeMultiError(0, "no offsets")
    encoded = ctypes.create_string_buffer(os.fsencode(path))
    table = (ctypes.c_uint64 * len(offsets))(*offsets)
    attr = ctypes.create_string_buffer(
        _LINK_CREATE.pack(
            program,
            0,
            BPF_TRACE_UPROBE_MULTI,
            0,
            ctypes.addressof(encoded),
            ctypes.addressof(table),
            0,
            0,
            len(offsets),
            BPF_F_UPROBE_MULTI_RETURN if returns else 0,
            0,
        ),
        _LINK_CREATE.size,
    )
    fd = _libc.syscall(_SYS_BPF, BPF_LINK_CREATE, attr, _LINK_CREATE.size)
    if fd < 0:
        err = ctypes.get_errno()
        raise UprobeMultiError(err, f"BPF_LINK_CREATE uprobe_multi: {os.strerror(err)}")
    return int(fd)
