"""Finding libcuda and the entry points that launch GPU work, for the probe's uprobes.

Kernel launches issue no ioctl on Volta and later (usermode doorbell), so activity is counted
where CUDA enters the driver library. A uprobe is on the library file itself (its inode), so one
attached to the host's libcuda also counts processes in containers that bind-mount that file,
as the NVIDIA container toolkit does.

Where a launch function starts with ``endbr64`` (libraries built for CET), the uprobe goes on the
next instruction: the kernel cannot emulate ``endbr64`` and single-steps it out of line instead,
which cost 9 us per call against 0.8 us for an emulated ``push`` on the CI VM (bench: probe).
``endbr64`` only marks a valid indirect-branch target, so every call still passes the probe.
(libcuda 580.159.04 has no endbr64: its launch functions start with ``push %rbp``.)
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

from qpolicy.errors import ValidationError

# cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel(MultiDevice), cuGraphLaunch, each
# also as the per-thread-default-stream _ptsz variant.
LAUNCH_SYMBOLS = re.compile(
    r"^(cuLaunchKernel(Ex)?|cuLaunchCooperativeKernel(MultiDevice)?|cuGraphLaunch)(_ptsz)?$"
)
# What a thread waits for its GPU work in: cuCtxSynchronize (cudaDeviceSynchronize,
# torch.cuda.synchronize), cuStreamSynchronize (a stream's, and .item() / .cpu() after their
# copy), cuEventSynchronize; the _v2 and _ptsz variants where libcuda has them.
SYNC_SYMBOLS = re.compile(
    r"^(cuCtxSynchronize(_v2)?|cuStreamSynchronize(_ptsz)?|cuEventSynchronize)$"
)
# Copies that return when done (cudaMemcpy, and the classic kernel<<<...>>>; cudaMemcpy(..., D2H)
# loop): on the legacy default stream a thread inside one waits for the work before the copy
# too. Not the *Async copies, which return at once; the _ptds variants are the per-thread
# default stream's (cuda.h, __CUDA_API_PTDS).
COPY_SYMBOLS = re.compile(
    r"^cuMemcpy(DtoH|HtoD|DtoD|Peer|2D|2DUnaligned|3D|3DPeer|AtoH|HtoA|DtoA|AtoD|AtoA)?"
    r"(_v2)?(_ptds)?$"
)
# What a thread polls its GPU work with instead (cudaStreamQuery, torch.cuda.Stream.query(),
# cudaEventQuery): an answer CUDA_ERROR_NOT_READY is work still on the GPU.
QUERY_SYMBOLS = re.compile(r"^(cuStreamQuery(_ptsz)?|cuEventQuery)$")
COMMON_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",  # GPU operator / device plugin hosts
    "/usr/local/cuda/compat/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
)


def _ldconfig_paths() -> list[str]:
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    entries = []
    for line in out.splitlines():
        name, sep, target = line.strip().partition(" => ")
        if sep and name.startswith("libcuda.so"):
            # The 64-bit libcuda.so.1 first: what the loader gives a CUDA program here.
            entries.append(("x86-64" not in name, name.split()[0] != "libcuda.so.1", target))
    return [target.strip() for *_, target in sorted(entries)]


ENDBR64 = bytes.fromhex("f30f1efa")
_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
PT_LOAD = 1


def file_offset(path: Path, vaddr: int) -> int | None:
    """Where virtual address ``vaddr`` of an ELF64 little-endian file lies in the file."""
    with path.open("rb") as elf:
        header = elf.read(_ELF_HEADER.size)
        if len(header) < _ELF_HEADER.size or header[:6] != b"\x7fELF\x02\x01":
            return None
        fields = _ELF_HEADER.unpack(header)
        phoff, phentsize, phnum = fields[5], fields[9], fields[10]
        for index in range(phnum):
            elf.seek(phoff + index * phentsize)
            raw = elf.read(_PROGRAM_HEADER.size)
            if len(raw) < _PROGRAM_HEADER.size:
                return None
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = (
                _PROGRAM_HEADER.unpack(raw)
            )
            if p_type == PT_LOAD and p_vaddr <= vaddr < p_vaddr + p_filesz:
                return int(vaddr - p_vaddr + p_offset)
    return None


def probe_address(path: Path, vaddr: int) -> int:
    """The address to put a function's uprobe on: past a leading endbr64, else its start."""
    offset = file_offset(path, vaddr)
    if offset is None:
        return vaddr
    with path.open("rb") as elf:
        elf.seek(offset)
        first = elf.read(len(ENDBR64))
    return vaddr + len(ENDBR64) if first == ENDBR64 else vaddr


def find_libcuda(spec: str | Path | None) -> Path | None:
    """The library to probe: None disables, "auto" searches, anything else is a path."""
    if spec is None:
        return None
    if str(spec) != "auto":
        path = Path(spec)
        if not path.is_file():
            raise ValidationError(f"libcuda {str(path)!r} is not a file")
        return path.resolve()
    for candidate in (*_ldconfig_paths(), *COMMON_PATHS):
        path = Path(candidate)
        if path.is_file():
            return path.resolve()
    return None
