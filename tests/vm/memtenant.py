"""A tenant for the memory-gate tests: run inside a cgroup, it keeps one RM client with a device
and answers commands from stdin, one JSON object per line (its first line is its handles).

    alloc BYTES             RM_ALLOC of device memory: status, handle and size as written back
    vidheap BYTES           the same through VID_HEAP_CONTROL (ALLOC_SIZE, video memory)
    unnamed BYTES           RM_ALLOC, VID_HEAP_CONTROL and RM_DUP_OBJECT (of the RM_ALLOC's
                            memory, or of the device if refused) each leaving the new handle
                            to RM: their statuses, and each success freed
    fabric                  RM_ALLOC of NV_MEMORY_FABRIC
    dup HANDLE [second]     RM_DUP_OBJECT of HANDLE, into this client (or a second one of its own)
    free HANDLE [second]    RM_FREE of HANDLE (in the second client)
    size HANDLE             the size RM reports for it (GET_SURFACE_INFO)
    export HANDLE           OS_UNIX_EXPORT_OBJECT_TO_FD of it
    dmabuf                  NV_ESC_EXPORT_TO_DMABUF_FD: the errno (0: the driver took it)
    foreign CLIENT DEVICE   RM_ALLOC of 1 MiB naming another process's client
    race_alloc N CLIENT     N allocations of 1 MiB, each named and freed, while a thread flips
                            hRoot between this client and CLIENT (another process's)
    race_free N             N objects of a second client allocated and freed while a thread
                            flips (hRoot, hObjectParent, hObjectOld) between (second, second,
                            object) and (first, first, 0): what a forged free of the first
                            client looks like after the driver freed the object
    quit
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading

from qpolicy.nvrm import abi
from tests.vm.rmclient import NVOS00, NVOS64, Rm, ioctl, memory_params

DEVICE_PARAMS = struct.pack("<IIIIII QQQII", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
MIB = 1 << 20


class Flipper:
    """A thread that keeps rewriting part of a buffer the driver is reading: a, b, a, b..."""

    def __init__(self, buf: ctypes.Array[ctypes.c_char], offset: int, a: bytes, b: bytes) -> None:
        self.buf, self.offset = buf, offset
        self.values = (a, b)
        self.size = len(a)
        self.running = True
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        address = ctypes.addressof(self.buf) + self.offset
        a, b = self.values
        while self.running:
            ctypes.memmove(address, a, self.size)
            ctypes.memmove(address, b, self.size)

    def __enter__(self) -> Flipper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def raw_ioctl(fd: int, nr: int, buf: ctypes.Array[ctypes.c_char]) -> None:
    """The ioctl on the buffer in place (fcntl.ioctl would copy a bytearray first), the GIL
    released meanwhile so that a Flipper runs."""
    request = abi.iowr(abi.NV_IOCTL_MAGIC, nr, len(buf))
    if LIBC.ioctl(fd, request, ctypes.addressof(buf)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Tenant:
    def __init__(self) -> None:
        self.rm = Rm(0)
        self.client = self.rm.new(0, 0, 0x41)
        self.device = self.rm.new(self.client, self.client, 0x80, DEVICE_PARAMS)
        self.second = 0
        self.second_device = 0

    def hello(self) -> dict[str, object]:
        return {"pid": os.getpid(), "client": self.client, "device": self.device}

    def second_client(self) -> tuple[int, int]:
        if not self.second:
            self.second = self.rm.new(0, 0, 0x41)
            self.second_device = self.rm.new(self.second, self.second, 0x80, DEVICE_PARAMS)
        return self.second, self.second_device

    def alloc(
        self, size: int, cls: int = 0x40, client: int = 0, device: int = 0
    ) -> dict[str, object]:
        result = self.rm.alloc(
            client or self.client, device or self.device, cls, memory_params(size)
        )
        written = struct.unpack_from("<Q", result.params, 64)[0] if result.params else 0
        return {"status": result.status, "handle": result.handle, "size": written}

    def vidheap(self, size: int, named: bool = True) -> dict[str, object]:
        arg = bytearray(
            abi.NVOS32.pack(
                hRoot=self.client,
                hObjectParent=self.device,
                function=abi.NVOS32_FUNCTION_ALLOC_SIZE,
                flags=abi.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED if named else 0,
                hMemory=self.rm.name() if named else 0,
                size=size,
            )
        )
        ioctl(self.rm.ctl, abi.Escape.RM_VID_HEAP_CONTROL, arg)
        out = abi.NVOS32.unpack(bytes(arg))
        return {"status": out["status"], "handle": out["hMemory"], "size": out["size"]}

    def dup(self, handle: int, second: bool) -> dict[str, object]:
        client, device = self.second_client() if second else (self.client, self.device)
        status, new = self.rm.dup(client, device, self.client, handle)
        return {"status": status, "handle": new}

    def export(self, handle: int) -> dict[str, object]:
        params = abi.CONTROLS[abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD].params.pack(
            type=1, hDevice=self.device, hParent=self.device, hObject=handle, fd=-1
        )
        status, _ = self.rm.control(
            self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, params
        )
        return {"status": status}

    def dmabuf(self) -> dict[str, object]:
        buf = ctypes.create_string_buffer(2608)
        struct.pack_into("<iI", buf, 0, -1, self.client)
        try:
            raw_ioctl(self.rm.gpu, abi.Escape.EXPORT_TO_DMABUF_FD, buf)
        except OSError as error:
            return {"errno": error.errno}
        return {"errno": 0}

    def race_alloc(self, rounds: int, other: int) -> dict[str, object]:
        params = ctypes.create_string_buffer(memory_params(MIB), 128)
        buf = ctypes.create_string_buffer(NVOS64.size)
        ok = refused = 0
        own, theirs = struct.pack("<I", self.client), struct.pack("<I", other)
        with Flipper(buf, 0, own, theirs):
            for _ in range(rounds):
                struct.pack_into(
                    "<IIIQQIIII", buf, 4, self.device, self.rm.name(), 0x40,
                    ctypes.addressof(params), 0, 128, 0, 0, 0,
                )  # fmt: skip
                raw_ioctl(self.rm.ctl, abi.Escape.RM_ALLOC, buf)
                status, handle = (
                    struct.unpack_from("<I", buf, 40)[0],
                    struct.unpack_from("<I", buf, 8)[0],
                )
                if status == abi.NvStatus.NV_OK:
                    ok += 1
                    # Freed without a race: it is this client's if anyone's.
                    self.rm.free(self.client, self.client, handle)
                else:
                    refused += 1
        return {"ok": ok, "refused": refused}

    def unnamed(self, size: int) -> dict[str, object]:
        alloc = self.rm.alloc(self.client, self.device, 0x40, memory_params(size), handle=0)
        heap = self.vidheap(size, named=False)
        source = alloc.handle if alloc.status == abi.NvStatus.NV_OK else self.device
        dup, copy = self.rm.dup(self.client, self.device, self.client, source, handle=0)
        for status, handle in ((alloc.status, alloc.handle), (heap["status"], heap["handle"])):
            if status == abi.NvStatus.NV_OK:
                self.rm.free(self.client, self.device, int(str(handle)))
        if dup == abi.NvStatus.NV_OK:
            self.rm.free(self.client, self.device, copy)
        return {"alloc": alloc.status, "vidheap": heap["status"], "dup": dup}

    def race_free(self, rounds: int) -> dict[str, object]:
        second, device = self.second_client()
        buf = ctypes.create_string_buffer(NVOS00.size)
        forged = struct.pack("<III", self.client, self.client, 0)
        freed = 0
        for _ in range(rounds):
            handle = self.rm.new(second, device, 0x3E, memory_params(4096))
            real = struct.pack("<III", second, second, handle)
            struct.pack_into("<12sI", buf, 0, real, 0)
            with Flipper(buf, 0, real, forged):
                raw_ioctl(self.rm.ctl, abi.Escape.RM_FREE, buf)
            if struct.unpack_from("<I", buf, 12)[0] == abi.NvStatus.NV_OK:
                freed += 1
            # Whichever the driver saw, the object goes now (if it is still there).
            self.rm.free(second, second, handle)
        return {"freed": freed}

    def command(self, words: list[str]) -> dict[str, object]:
        verb, args = words[0], [int(w, 0) for w in words[1:] if w != "second"]
        second = "second" in words
        if verb == "alloc":
            return self.alloc(args[0])
        if verb == "vidheap":
            return self.vidheap(args[0])
        if verb == "unnamed":
            return self.unnamed(args[0])
        if verb == "fabric":
            return self.alloc(MIB, cls=abi.NV_MEMORY_FABRIC)
        if verb == "dup":
            return self.dup(args[0], second)
        if verb == "free":
            client = self.second_client()[0] if second else self.client
            return {"status": self.rm.free(client, client, args[0])}
        if verb == "size":
            status, size = self.rm.mem_size(self.client, args[0])
            return {"status": status, "size": size}
        if verb == "export":
            return self.export(args[0])
        if verb == "dmabuf":
            return self.dmabuf()
        if verb == "foreign":
            return self.alloc(MIB, client=args[0], device=args[1])
        if verb == "race_alloc":
            return self.race_alloc(args[0], args[1])
        if verb == "race_free":
            return self.race_free(args[0])
        raise ValueError(words)


def main() -> int:
    tenant = Tenant()
    print(json.dumps(tenant.hello()), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            break
        print(json.dumps(tenant.command(words)), flush=True)
    if tenant.second:
        tenant.rm.free(tenant.second, tenant.second, tenant.second)
    tenant.rm.free(tenant.client, tenant.client, tenant.client)
    tenant.rm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
