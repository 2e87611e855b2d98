"""A process that talks to device files as a plan says, for the host eBPF tests.

python workload.py PLAN.json: waits for a line on stdin (the test moves it into its cgroup
first and starts several at once), runs the plan's steps, prints a JSON report on stdout.

Steps (dicts, run in order):
  {"open": PATH, "as": NAME, "via": "openat"|"open"|"openat2"}   open O_RDWR|O_CLOEXEC
  {"ioctl": NAME, "cmd": N, "arg": HEX, "inner": HEX, "inner_page_end": BOOL, "times": N}
      arg is the exact argument buffer; inner, if given, is put in its own buffer whose address
      is written at offset 16 of arg (RM_ALLOC's pAllocParms, RM_CONTROL's params); with
      inner_page_end the inner bytes end where a PROT_NONE page begins
  {"mmap": NAME}                         a private one-page mapping of the fd (failure is fine)
  {"close": NAME}
  {"launch": SYMBOL, "lib": PATH, "times": N}   call a no-argument function of a library
  {"thread": [STEPS]}                   run steps in a thread that then exits; wait for it
  {"say": TEXT}                          print TEXT on stdout (a marker the test waits for)
  {"forever": [STEPS]}                   repeat the steps until killed
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import struct
import sys
import threading
from typing import Any

PAGE = mmap.PAGESIZE
SYS_OPEN = 2
SYS_OPENAT2 = 437
AT_FDCWD = -100

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

fds: dict[str, int] = {}
errors: dict[str, int] = {}
keep: list[Any] = []  # buffers whose addresses were handed to the kernel


def do_open(step: dict[str, Any]) -> None:
    path = step["open"]
    flags = os.O_RDWR | os.O_CLOEXEC
    via = step.get("via", "openat")
    if via == "openat":
        fd = os.open(path, flags)
    elif via == "open":
        fd = libc.syscall(SYS_OPEN, path.encode(), flags, 0)
    else:
        how = struct.pack("<QQQ", flags, 0, 0)  # struct open_how
        fd = libc.syscall(SYS_OPENAT2, AT_FDCWD, path.encode(), how, len(how))
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"{via} {path}")
    fds[step.get("as", path)] = fd


def inner_address(data: bytes, page_end: bool) -> int:
    if not page_end:
        buf = ctypes.create_string_buffer(data, len(data))
        keep.append(buf)
        return ctypes.addressof(buf)
    area = mmap.mmap(-1, 2 * PAGE)
    keep.append(area)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    if libc.mprotect(base + PAGE, PAGE, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    area[PAGE - len(data) : PAGE] = data
    return base + PAGE - len(data)


def do_ioctl(step: dict[str, Any]) -> None:
    arg = bytearray(bytes.fromhex(step.get("arg", "")))
    if "inner" in step:
        address = inner_address(bytes.fromhex(step["inner"]), step.get("inner_page_end", False))
        struct.pack_into("<Q", arg, 16, address)
    fd = fds[step["ioctl"]]
    for _ in range(step.get("times", 1)):
        try:
            if arg:
                fcntl.ioctl(fd, step["cmd"], arg)
            else:
                fcntl.ioctl(fd, step["cmd"], 0)
        except OSError as error:
            name = errno.errorcode.get(error.errno or 0, str(error.errno))
            errors[name] = errors.get(name, 0) + 1


def do_mmap(step: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        mmap.mmap(fds[step["mmap"]], PAGE, flags=mmap.MAP_PRIVATE).close()


def do_launch(step: dict[str, Any]) -> None:
    function = getattr(ctypes.CDLL(step["lib"]), step["launch"])
    for _ in range(step.get("times", 1)):
        function()


def run(steps: list[dict[str, Any]]) -> None:
    for step in steps:
        if "open" in step:
            do_open(step)
        elif "ioctl" in step:
            do_ioctl(step)
        elif "mmap" in step:
            do_mmap(step)
        elif "close" in step:
            os.close(fds.pop(step["close"]))
        elif "launch" in step:
            do_launch(step)
        elif "thread" in step:
            thread = threading.Thread(target=run, args=(step["thread"],))
            thread.start()
            thread.join()
        elif "say" in step:
            print(step["say"], flush=True)
        elif "forever" in step:
            while True:
                run(step["forever"])
        else:
            raise ValueError(f"unknown step {step}")


def main() -> None:
    with open(sys.argv[1]) as handle:
        steps = json.load(handle)
    sys.stdin.readline()
    run(steps)
    print(json.dumps({"pid": os.getpid(), "fds": fds, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
