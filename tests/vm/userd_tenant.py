"""A process holding one channel made the way libcuda makes them on an H200, driven from stdin.

Its USERD is a 512-byte slot at a chosen offset in a 2 MiB video memory object of its own
(hUserdMemory[0], userdOffset[0]), which it maps through the GPU file (BAR1 under nvmock) unless
told not to; the channel itself is never mapped (RM refuses). The channel waits for
GPFIFO_SCHEDULE, which never comes, so the engine never fetches: GP_PUT and GP_GET are what the
test writes. Commands, one a line, each answered with a JSON line: ``put N`` and ``get N``
write GP_PUT and GP_GET, ``unmap`` sends RM_UNMAP_MEMORY for the mapping, ``free`` frees the
memory object, ``quit`` ends.

With ``--overwritten-map`` the memory is not mapped at start; ``map`` maps it (after ``unmap``
and munmap of the mapping before, if any) for a new GPU fd with RM_MAP_MEMORY, whose answer
this process overwrites with another fd and another address while the driver copies it out
(OverwrittenMap), and mmaps the new fd: the answer as the call returned it (``unmap`` names
the address RM answered). ``--renumbered-map`` likewise, but the
answer is left alone and the fd's number is made to name another GPU file during the copy-out
(dup2); the file RM mapped is then mmapped through another fd of it.

    python -m tests.vm.userd_tenant OFFSET [--no-map | --overwritten-map | --renumbered-map]
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import sys
import threading

from qpolicy.nvrm import abi
from tests.vm.memtenant import raw_ioctl
from tests.vm.rmclient import NVOS33_FD, Rm, channel_params, ioctl, memory_params, tsg_params

DEVICE_PARAMS = bytes(56)
USERD_MEM = 2 << 20
DELAY_CHANNEL_SCHEDULING = 0x40
HUSERD_OFF = 32  # hUserdMemory[0] in NV_CHANNEL_ALLOC_PARAMS
USERD_OFFSET_OFF = 64  # userdOffset[0]
GP_GET = 0x88
GP_PUT = 0x8C
NVOS34 = struct.Struct("<IIIIQII")
STATUS_OFF = 24  # NVOS34.status
MAP_LINEAR_OFF = 32  # NVOS33_FD.pLinearAddress
MAP_FD_OFF = 48  # NVOS33_FD.fd
UNANSWERED = 0xFFFFFFFF


def unmap(rm: Rm, client: int, device: int, memory: int, linear: int) -> int:
    arg = bytearray(NVOS34.pack(client, device, memory, 0, linear, 0, 0))
    ioctl(rm.ctl, abi.Escape.RM_UNMAP_MEMORY, arg)
    return int(struct.unpack_from("<I", arg, STATUS_OFF)[0])


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.memmove.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_DONTNEED = 4
SYS_USERFAULTFD = 323
UFFD_API = 0xAA
# PAGEFAULT_FLAG_WP, MINOR_SHMEM, WP_HUGETLBFS_SHMEM (include/uapi/linux/userfaultfd.h)
UFFD_FEATURES = 1 << 0 | 1 << 10 | 1 << 12
UFFDIO_API = 0xC018AA3F  # _IOWR(0xAA, 0x3F, struct uffdio_api)
UFFDIO_REGISTER = 0xC020AA00  # _IOWR(0xAA, 0x00, struct uffdio_register)
UFFDIO_WRITEPROTECT = 0xC018AA06  # _IOWR(0xAA, 0x06, struct uffdio_writeprotect)
UFFDIO_CONTINUE = 0xC020AA07  # _IOWR(0xAA, 0x07, struct uffdio_continue)
UFFDIO_REGISTER_MODE_WP = 1 << 1
UFFDIO_REGISTER_MODE_MINOR = 1 << 2
UFFDIO_WRITEPROTECT_MODE_WP = 1 << 0
UFFD_EVENT_PAGEFAULT = 0x12
UFFD_PAGEFAULT_FLAG_WP = 1 << 1
UFFD_PAGEFAULT_FLAG_MINOR = 1 << 2
UFFD_MSG = struct.Struct("<BBHIQQQ")  # event, pad, pad, pad, flags, address, ptid


class OverwrittenMap:
    """RM_MAP_MEMORY of one memory object for a new GPU fd, whose answer the tenant overwrites
    with a decoy fd (another GPU fd of this process, never mapped) and a decoy pLinearAddress
    (past the mapping) right after the driver copied it out, before anyone reads it back.

    The request lies across a page boundary of shared memory under userfaultfd: its first
    bytes on the first page, its fd on the second, which is write-protected. Reads pass
    (qgpu's and the driver's copies of the request). The driver's copy-out stops at the
    second page; this process's fault handler then takes the first page out of its page table
    and lifts the protection, and the copy-out writes RM's fd. The first read of the answer
    after that, whoever's (a read back by qgpu's hook, else this process's), stops at the first
    page, and the handler stores the decoy over the fd before it lets it go on. No race is
    left to chance: a Poker process storing the decoy lost that window to the hook's read back
    in every call tried.
    """

    def __init__(self, rm: Rm, client: int, device: int, memory: int, renumber: bool) -> None:
        self.rm, self.client, self.device, self.memory = rm, client, device, memory
        self.decoy = rm.open_gpu()
        # Renumber: at the copy-out the decoy's file is dup2()ed over the fd RM mapped (whose
        # file the tenant keeps by another fd), and the answer is left as RM wrote it.
        self.renumber = renumber
        self.target = -1
        self.pages = mmap.mmap(-1, 2 * mmap.PAGESIZE)  # shared: shmem, for minor faults
        self.pages[:] = bytes(2 * mmap.PAGESIZE)  # present: write protection needs a page
        self.first = ctypes.addressof(ctypes.c_char.from_buffer(self.pages))
        self.second = self.first + mmap.PAGESIZE
        self.at = mmap.PAGESIZE - 32  # hClient to length on the first page, the rest after
        self.buf = (ctypes.c_char * NVOS33_FD.size).from_buffer(self.pages, self.at)
        self.uffd = self._userfaultfd()
        self.faults: list[str] = []
        self.linear = 0  # RM's pLinearAddress, kept before the decoy's goes over it
        self.thread = threading.Thread(target=self._handle, daemon=True)
        self.thread.start()

    def _uffd_ioctl(self, request: int, arg: ctypes.Array[ctypes.c_char]) -> None:
        if LIBC.ioctl(self.uffd, ctypes.c_ulong(request), arg) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def _userfaultfd(self) -> int:
        # Kernel faults too (no UFFD_USER_MODE_ONLY): the accesses are the driver's and qgpu's.
        fd = int(LIBC.syscall(SYS_USERFAULTFD, os.O_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.uffd = fd
        api = ctypes.create_string_buffer(struct.pack("<QQQ", UFFD_API, UFFD_FEATURES, 0), 24)
        self._uffd_ioctl(UFFDIO_API, api)
        mode = UFFDIO_REGISTER_MODE_WP | UFFDIO_REGISTER_MODE_MINOR
        register = struct.pack("<QQQQ", self.first, 2 * mmap.PAGESIZE, mode, 0)
        self._uffd_ioctl(UFFDIO_REGISTER, ctypes.create_string_buffer(register, 32))
        return fd

    def _protect(self, on: bool) -> None:
        mode = UFFDIO_WRITEPROTECT_MODE_WP if on else 0
        arg = struct.pack("<QQQ", self.second, mmap.PAGESIZE, mode)
        self._uffd_ioctl(UFFDIO_WRITEPROTECT, ctypes.create_string_buffer(arg, 24))

    def _handle(self) -> None:
        while True:
            msg = UFFD_MSG.unpack(os.read(self.uffd, UFFD_MSG.size))
            if msg[0] != UFFD_EVENT_PAGEFAULT:
                continue
            if msg[4] & UFFD_PAGEFAULT_FLAG_WP and self.renumber:
                # The copy-out: RM looked the fd up already, and whoever looks it up from now
                # on finds the decoy's file.
                self.faults.append("copy-out")
                os.dup2(self.decoy, self.target)
                self._protect(False)
            elif msg[4] & UFFD_PAGEFAULT_FLAG_WP:
                # The copy-out, at the second page: the next read of the first page stops.
                self.faults.append("copy-out")
                if LIBC.madvise(self.first, mmap.PAGESIZE, MADV_DONTNEED):
                    raise OSError(ctypes.get_errno(), "madvise")
                self._protect(False)
            elif msg[4] & UFFD_PAGEFAULT_FLAG_MINOR:
                # The answer is read back: RM's fd and address are overwritten first.
                self.faults.append("read-back")
                (self.linear,) = struct.unpack_from("<Q", self.buf, MAP_LINEAR_OFF)
                struct.pack_into("<Q", self.buf, MAP_LINEAR_OFF, self.linear + USERD_MEM)
                struct.pack_into("<i", self.buf, MAP_FD_OFF, self.decoy)
                arg = struct.pack("<QQQq", self.first, mmap.PAGESIZE, 0, 0)
                self._uffd_ioctl(UFFDIO_CONTINUE, ctypes.create_string_buffer(arg, 32))

    def run(self) -> tuple[int, int, dict[str, object]]:
        """The new fd RM mapped (renumbered: another fd of its file), the pLinearAddress RM
        answered, and what the call answered as read back."""
        target = self.target = self.rm.open_gpu()
        kept = os.dup(target) if self.renumber else target
        NVOS33_FD.pack_into(
            self.buf, 0, self.client, self.device, self.memory, 0, 0, USERD_MEM, 0,
            UNANSWERED, 0, target, 0,
        )  # fmt: skip
        del self.faults[:]
        self.linear = 0
        self._protect(True)
        raw_ioctl(self.rm.ctl, abi.Escape.RM_MAP_MEMORY, self.buf)
        # Read through libc, the GIL let go: a fault here waits on the handler thread.
        answer = ctypes.create_string_buffer(NVOS33_FD.size)
        LIBC.memmove(answer, ctypes.addressof(self.buf), NVOS33_FD.size)
        fields = NVOS33_FD.unpack(answer.raw)
        if kept != target:
            self.rm.fds.append(kept)
        linear = self.linear or int(fields[6])
        return kept, linear, {
            "status": fields[7], "fd": fields[9], "target": target, "decoy": self.decoy,
            "kept": kept, "faults": list(self.faults), "linear": fields[6], "rm_linear": linear,
        }  # fmt: skip


def main(argv: list[str]) -> int:
    offset = int(argv[0], 0)
    rm = Rm(0)
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, DEVICE_PARAMS)
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
    memory = rm.new(client, device, 0x40, memory_params(USERD_MEM))
    view: mmap.mmap | None = None
    linear = 0
    race = None
    if "--overwritten-map" in argv or "--renumbered-map" in argv:
        race = OverwrittenMap(rm, client, device, memory, "--renumbered-map" in argv)
    target = -1
    if "--no-map" not in argv and race is None:
        target = rm.open_gpu()
        status, linear = rm.map_memory(client, device, memory, USERD_MEM, target)
        assert status == abi.NvStatus.NV_OK, status
        view = mmap.mmap(target, USERD_MEM, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    params = bytearray(channel_params(0x100000000, 512, DELAY_CHANNEL_SCHEDULING))
    struct.pack_into("<I", params, HUSERD_OFF, memory)
    struct.pack_into("<Q", params, USERD_OFFSET_OFF, offset)
    channel = rm.new(client, tsg, 0xC86F, bytes(params))
    channel_map = rm.map_memory(client, subdevice, channel, 4096, rm.open_gpu())[0]
    print(
        json.dumps(
            {"pid": os.getpid(), "client": client, "channel": channel, "channel_map": channel_map}
        ),
        flush=True,
    )
    for line in sys.stdin:
        words = line.split()
        out: dict[str, int] = {}
        if words[0] in ("put", "get") and view is not None:
            where = offset + (GP_PUT if words[0] == "put" else GP_GET)
            struct.pack_into("<I", view, where, int(words[1]))
        elif words == ["map"] and race is not None:
            if view is not None:
                view.close()
                unmap(rm, client, device, memory, linear)
                rm.fds.remove(target)
                os.close(target)
            target, linear, race_out = race.run()
            view = mmap.mmap(target, USERD_MEM, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            print(json.dumps(race_out), flush=True)
            continue
        elif words == ["unmap"]:
            out["status"] = unmap(rm, client, device, memory, linear)
        elif words == ["free"]:
            out["status"] = rm.free(client, device, memory)
        elif words == ["quit"]:
            break
        else:
            raise ValueError(line)
        print(json.dumps(out), flush=True)
    rm.free(client, client, client)
    rm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
