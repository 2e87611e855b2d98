"""USERD as libcuda has it on an H200, in nvmock: a 512-byte slot in video memory the process
maps through BAR1 (I/O memory, no struct page), a channel RM will not map, and a GP_GET that
the fetcher moves when it fetches an entry, not when the entry's work is done."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import DEBUGFS, ROOT, channel_rows, reset

SLOT = 0x2200  # not page-aligned: the slot is 512 bytes
CLIENT_USERD = ["--userd", "client", "--userd-offset", str(SLOT)]
SATURATE = ["--shape", "saturate", "--kernel-us", "1000", "--sync-every", "4", "--queue", "2"]
NV_ERR_INVALID_REQUEST = 0x3F


def bar1() -> dict[str, int]:
    text = (DEBUGFS / "bar1").read_text()
    assert text.strip() != "absent", "no BAR1 aperture: tools/vm/run adds an ivshmem device"
    return {k: int(v, 0) for k, v in (line.split() for line in text.splitlines())}


def io_mappings(pid: int) -> list[tuple[int, set[str]]]:
    """(size in kB, VmFlags) of each of the process's mappings of a GPU file."""
    out = []
    size = 0
    device = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        words = line.split()
        if "-" in words[0] and not words[0].endswith(":"):
            device = words[-1].startswith("/dev/nvidia") and words[-1] != "/dev/nvidiactl"
        elif words[0] == "Size:":
            size = int(words[1])
        elif words[0] == "VmFlags:" and device:
            out.append((size, set(words[1:])))
    return out


def channel_line(pid: int) -> dict[str, int]:
    for row in channel_rows():
        if row["pid"] == pid:
            return row
    raise LookupError(pid)


def test_client_userd_is_a_slot_in_video_memory_mapped_through_bar1() -> None:
    reset()
    before = bar1()
    load = Gpuload([*SATURATE, *CLIENT_USERD, "--seconds", "3"]).ready()
    try:
        mapped = io_mappings(load.pid)
        # The 2 MiB USERD object: I/O memory with no struct page, as nvidia.ko maps BAR1.
        assert any(size == 2048 and {"io", "pf"} <= flags for size, flags in mapped), mapped
        assert bar1()["avail"] <= before["avail"] - (2 << 20)
    finally:
        result = load.result()
    # Work went through GP_PUT in that slot: the engine ran it.
    assert result["kernels"] > 0 and result["busy_fraction"] > 0.5
    assert bar1()["avail"] == before["avail"]


def test_rm_refuses_to_map_a_channel_whose_userd_the_client_supplied() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.vm.userd_tenant", str(SLOT)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        hello = json.loads(proc.stdout.readline())
        assert hello["channel_map"] == NV_ERR_INVALID_REQUEST
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_gp_get_moves_when_an_entry_is_fetched_not_when_its_work_is_done() -> None:
    """One 300 ms kernel a request: while it runs, GP_GET has already caught up with GP_PUT."""
    requests = ["--shape", "requests", "--rate-hz", "2", "--kernel-us", "300000"]
    caught_up, behind = gets_while_running(requests)
    assert caught_up > 20 and behind <= caught_up // 10


def gets_while_running(shape: list[str]) -> tuple[int, int]:
    """gpuload of ``shape`` for 3 s: how many looks (every 10 ms, for 2.5 s) found its channel
    running with GP_GET caught up with GP_PUT, and how many found it behind."""
    reset()
    load = Gpuload([*shape, *CLIENT_USERD, "--seconds", "3"]).ready()
    caught_up = behind = 0
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            ch = channel_line(load.pid)
            if ch["running"] and ch["gp_put"]:
                if ch["gp_get"] == ch["gp_put"]:
                    caught_up += 1
                else:
                    behind += 1
            time.sleep(0.01)
    finally:
        result = load.result()
    assert result["kernels"] > 0
    print(f"running with GP_GET == GP_PUT: {caught_up}, behind: {behind}")
    return caught_up, behind


def test_queued_entries_are_fetched_one_at_a_time_as_their_work_starts() -> None:
    """Kernels queued behind a running one keep GP_GET behind GP_PUT: the fetcher takes the next
    entry when the work before it is done, as an H100 did with four 11 ms matmuls launched back
    to back (GP_GET moved by a kernel's two entries as each began; it reached GP_PUT only when
    the fourth began, at 74 % of the request: tools/gpu/userd_fetch.py,
    tools/gpu/results/2026-11-26-userd-fetch-16384-h100.json.xz)."""
    queued = ["--shape", "saturate", "--kernel-us", "50000", "--sync-every", "1", "--queue", "4"]
    caught_up, behind = gets_while_running(queued)
    assert behind > 20 and caught_up <= behind // 10
