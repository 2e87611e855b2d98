"""What CUDA asks of nvidia-uvm at start-up and for managed memory, on a real GPU (issue 13).

Run on a GPU machine with PyTorch and gcc (no root needed):

    python3 tools/gpu/uvm_managed.py --out uvm-managed.json

It builds tools/gpu/uvm_logger.c and runs itself again under it (LD_PRELOAD). The child starts
CUDA (PyTorch) and lists its mappings of /dev/nvidia-uvm before and after. It allocates 1 GiB
with cuMemAllocManaged, writes it with cuMemsetD8 on the GPU and frees it. The GPU's free
memory (cuMemGetInfo) is read at each step. It then asks whether the GPU can reach pageable
memory (HMM / ATS): it reads PAGEABLE_MEMORY_ACCESS and tries a cuMemsetD8 on malloc'd memory.
The JSON holds those readings and the logger's lines: every ioctl on the UVM file and every
mmap of it, in order.

With --refuse-managed ERRNO the logger answers a managed mmap as qgpu.ko does for a
memory-limited cgroup (1, EPERM, is qgpu's answer; the range is unmapped first): the JSON then
shows what cuMemAllocManaged returns, and whether the process can still run a matmul after it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GIB = 1 << 30


def uvm_maps() -> list[dict[str, Any]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "nvidia-uvm" in line:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(
                {"start": lo, "size": hi - lo, "perms": parts[1], "offset": int(parts[2], 16)}
            )
    return out


def measure() -> dict[str, Any]:
    import torch

    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "maps_before_cuda": uvm_maps()}
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["maps_after_start_up"] = uvm_maps()
    cu = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()

    def free_bytes() -> int:
        assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        return free.value

    attr = ctypes.c_int()
    # CUdevice_attribute: MANAGED_MEMORY 83, CONCURRENT_MANAGED_ACCESS 89, PAGEABLE_MEMORY_ACCESS
    # 88, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 100 (cuda.h)
    for name, number in (
        ("managed_memory", 83),
        ("pageable_memory_access", 88),
        ("concurrent_managed_access", 89),
        ("pageable_uses_host_page_tables", 100),
    ):
        status = cu.cuDeviceGetAttribute(ctypes.byref(attr), number, 0)
        res[name] = attr.value if status == 0 else f"CUresult {status}"
    res["free_before_managed"] = free_bytes()
    ptr = ctypes.c_uint64()
    res["alloc_managed"] = cu.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(GIB), 1)
    res["managed_ptr"] = ptr.value
    res["maps_after_alloc_managed"] = uvm_maps()
    res["free_after_alloc_managed"] = free_bytes()
    if res["alloc_managed"] == 0:
        res["memset_managed"] = cu.cuMemsetD8_v2(ptr, ctypes.c_ubyte(7), ctypes.c_size_t(GIB))
        cu.cuCtxSynchronize()
        res["free_after_gpu_wrote_managed"] = free_bytes()
        res["free_managed"] = cu.cuMemFree_v2(ptr)
        res["maps_after_free"] = uvm_maps()
        res["free_after_free"] = free_bytes()
    # Does the process go on after it (device memory, a kernel)?
    try:
        a = torch.randn(1024, 1024, device="cuda")
        res["matmul_after"] = float((a @ a).sum().item()) != 0.0
    except RuntimeError as error:
        res["matmul_after"] = f"error: {error}"
    buf = ctypes.create_string_buffer(256 << 20)
    aligned = (ctypes.addressof(buf) + 0xFFFFF) & ~0xFFFFF
    res["free_before_pageable"] = free_bytes()
    res["memset_pageable"] = cu.cuMemsetD8_v2(
        ctypes.c_uint64(aligned), ctypes.c_ubyte(9), ctypes.c_size_t(128 << 20)
    )
    cu.cuCtxSynchronize()
    res["free_after_gpu_wrote_pageable"] = free_bytes()
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--refuse-managed", type=int, default=0, metavar="ERRNO",
        help="answer managed mmaps with this errno, as qgpu.ko does with 1 (EPERM)",
    )  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.out.write_text(json.dumps(measure(), indent=1))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        logger = Path(tmp) / "uvm_logger.so"
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-shared",
                "-fPIC",
                "-o",
                str(logger),
                str(HERE / "uvm_logger.c"),
                "-ldl",
            ],
            check=True,
        )
        env = {**os.environ, "LD_PRELOAD": str(logger)}
        if args.refuse_managed:
            env["UVM_LOGGER_REFUSE_MANAGED"] = str(args.refuse_managed)
        child = subprocess.run(
            [sys.executable, __file__, "--child", "--out", str(args.out)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    if child.returncode:
        sys.stderr.write(child.stderr[-4000:])
        return child.returncode
    result = json.loads(args.out.read_text())
    result["refuse_managed"] = args.refuse_managed
    result["uvm_log"] = [line for line in child.stderr.splitlines() if line.startswith("UVMLOG ")]
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
