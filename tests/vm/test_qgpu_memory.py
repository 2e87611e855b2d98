"""qgpu's memory gate on every path that allocates or keeps device memory, against nvmock: what
is charged is what RM allocated and still holds, as RM says, whatever the tenant writes into
its own arguments meanwhile."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.enforcers.kmod.uapi import Event
from qpolicy.nvrm.abi import PREEMPTION_MODE_CILP, NvStatus
from tests.vm.conftest import HOST_TIMED
from tests.vm.linetenant import LineTenant
from tests.vm.nvmock import DEBUGFS, objects, reset
from tests.vm.qgpu_env import (
    SYSFS,
    Cgroup,
    cgroups,
    drain,
    qgpu_loaded,
    refusal_events,
    stats_of,
)

MIB = 1 << 20
KIB_64 = 64 << 10


class MemTenant(LineTenant):
    """tests/vm/memtenant.py inside a cgroup: a client and device that live until closed."""

    def __init__(self, cg: Cgroup) -> None:
        super().__init__(cg.path, "tests.vm.memtenant", timeout=60.0)
        self.client, self.device = int(self.hello["client"]), int(self.hello["device"])

    def ask(self, *words: object) -> dict[str, Any]:  # type: ignore[override]
        return super().ask(" ".join(str(w) for w in words))

    def send(self, *words: object) -> None:
        """A command whose answer is read later (answer()): the tenant works on it meanwhile."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        return self._answer()


@contextmanager
def mem_tenants(*cgs: Cgroup) -> Iterator[list[MemTenant]]:
    tenants: list[MemTenant] = []
    try:
        for cg in cgs:
            tenants.append(MemTenant(cg))
        yield tenants
    finally:
        for tenant in tenants:
            tenant.close()


def fb_memory(gpu: int = 0) -> dict[str, int]:
    """nvmock's debugfs gpuN/memory: fb_size, fb_used, and fb_peak (the most used at once
    since the last reset)."""
    lines = (DEBUGFS / f"gpu{gpu}" / "memory").read_text().splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def fb_used(gpu: int = 0) -> int:
    """Device memory nvmock has allocated on a GPU (debugfs gpuN/memory)."""
    return fb_memory(gpu)["fb_used"]


@contextmanager
def slow_calls(pid: int, ms: int, which: str = "slow_calls") -> Iterator[None]:
    """nvmock answers the object calls (RM_ALLOC, RM_FREE, VID_HEAP_CONTROL, DUP_OBJECT) of
    process ``pid`` ``ms`` late, after the work and outside its locks (debugfs slow_calls: a
    test's delay standing in for a GSP round trip, not a model of the driver); with
    ``which="slow_kapi"``, the in-kernel RM entry's ops sent from that process's context (the
    queries qgpu's hooks make after its calls) instead."""
    (DEBUGFS / which).write_text(f"{pid} {ms}")
    try:
        yield
    finally:
        (DEBUGFS / which).write_text("0 0")


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def used(client: QgpuClient, cg: Cgroup) -> int:
    return stats_of(client, cg).mem_used


def test_rm_reports_the_size_it_rounded_to() -> None:
    """nvmock rounds as RM does (64 KiB below 2 MiB, 2 MiB from there on), writes the rounded
    size back, and answers it to GET_SURFACE_INFO and the class and parent to
    CLIENT_GET_HANDLE_INFO."""
    with cgroups(1) as (cg,), mem_tenants(cg) as (tenant,):
        small = tenant.ask("alloc", MIB + 1)
        big = tenant.ask("alloc", 3 * MIB + 1)
        assert (small["status"], small["size"]) == (NvStatus.NV_OK, MIB + KIB_64)
        assert (big["status"], big["size"]) == (NvStatus.NV_OK, 4 * MIB)
        assert tenant.ask("size", small["handle"]) == {"status": 0, "size": MIB + KIB_64}
        assert tenant.ask("size", big["handle"]) == {"status": 0, "size": 4 * MIB}


def test_rounding_is_charged_as_rm_rounded() -> None:
    """What the tenant asked for fits; what RM allocated does not: freed again and refused, and
    what is charged for the rest is RM's size."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=MIB + 32 * 1024)
        with mem_tenants(cg) as (tenant,):
            before = objects()["vidmem"]
            out = tenant.ask("alloc", MIB + 1)
            assert out["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert objects()["vidmem"] == before  # freed again through the kernel client
            assert used(client, cg) == 0 and stats_of(client, cg).oom == 1
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=4 * MIB)
        with mem_tenants(cg) as (tenant,):
            assert tenant.ask("alloc", MIB + 1)["status"] == NvStatus.NV_OK
            assert used(client, cg) == MIB + KIB_64
            assert tenant.ask("alloc", 2 * MIB + 1)["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert used(client, cg) == MIB + KIB_64
        assert used(client, cg) == 0


def test_vid_heap_control_meets_the_same_gate() -> None:
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=1 << 30)
        with mem_tenants(cg) as (tenant,):
            first = tenant.ask("vidheap", 768 * MIB)
            assert first["status"] == NvStatus.NV_OK and first["size"] == 768 * MIB
            assert used(client, cg) == 768 * MIB
            assert tenant.ask("vidheap", 512 * MIB)["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert tenant.ask("free", first["handle"])["status"] == NvStatus.NV_OK
            assert used(client, cg) == 0
            assert tenant.ask("vidheap", 512 * MIB)["status"] == NvStatus.NV_OK
            assert used(client, cg) == 512 * MIB
        assert used(client, cg) == 0


def test_every_vid_heap_function_that_allocates_meets_the_gate_before_rm() -> None:
    """ALLOC_SIZE_RANGE and ALLOC_TILED_PITCH_HEIGHT make video memory as ALLOC_SIZE does (the
    real driver's answers: tests/vm/rmcases.py vid_heap_functions). What they ask for past the
    limit is refused before RM allocates any of it (nvmock's fb_peak), and what they make is
    charged as RM rounded it."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(cg) as (tenant,):
            reset()  # fb_peak from here
            base = fb_memory()["fb_used"]
            ranged = tenant.ask("vidheap_range", 4097)
            assert ranged["status"] == NvStatus.NV_OK
            assert used(client, cg) == KIB_64
            tiled = tenant.ask("vidheap_tiled", 3, 100_000)  # 300 000 bytes, 320 KiB as rounded
            assert tiled["status"] == NvStatus.NV_OK
            assert used(client, cg) == KIB_64 + 5 * KIB_64
            assert tenant.ask("vidheap_range", 96 * MIB)["status"] == NvStatus.NV_ERR_NO_MEMORY
            refused = tenant.ask("vidheap_tiled", 1024, 96 * 1024)
            assert refused["status"] == NvStatus.NV_ERR_NO_MEMORY
            negative = tenant.ask("vidheap_tiled", 1, -1)  # a size of 2^64 - 1
            assert negative["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert fb_memory()["fb_peak"] == base + 6 * KIB_64
            assert stats_of(client, cg).oom == 3
            for handle in (ranged["handle"], tiled["handle"]):
                assert tenant.ask("free", handle)["status"] == NvStatus.NV_OK
            assert used(client, cg) == 0


def test_a_vid_heap_free_gives_the_charge_back() -> None:
    """VID_HEAP_CONTROL's FREE frees an object as RM_FREE does (measured: the object is gone
    after it): its charge goes with it, so the limit is there to use again."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(cg) as (tenant,):
            first = tenant.ask("alloc", 48 * MIB)
            assert first["status"] == NvStatus.NV_OK and used(client, cg) == 48 * MIB
            second = tenant.ask("vidheap", 16 * MIB)
            assert second["status"] == NvStatus.NV_OK and used(client, cg) == 64 * MIB
            assert tenant.ask("vidheap_free", first["handle"])["status"] == NvStatus.NV_OK
            assert tenant.ask("size", first["handle"])["status"] == NvStatus.NV_ERR_OBJECT_NOT_FOUND
            assert used(client, cg) == 16 * MIB
            assert tenant.ask("vidheap_free", second["handle"])["status"] == NvStatus.NV_OK
            assert used(client, cg) == 0
            assert tenant.ask("alloc", 64 * MIB)["status"] == NvStatus.NV_OK
        assert used(client, cg) == 0


def test_a_duplicate_keeps_the_memory_charged_to_its_owner() -> None:
    """DUP then free of the original: the memory lives, so its charge does, until the last
    handle to it goes. A duplicate in another client is charged to its holder as well."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=16 * MIB)
        with mem_tenants(cg) as (tenant,):
            orig = tenant.ask("alloc", 8 * MIB)["handle"]
            dup = tenant.ask("dup", orig)
            assert dup["status"] == NvStatus.NV_OK
            assert used(client, cg) == 8 * MIB  # one memory, one charge
            assert tenant.ask("free", orig)["status"] == NvStatus.NV_OK
            assert used(client, cg) == 8 * MIB
            assert tenant.ask("alloc", 10 * MIB)["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert tenant.ask("free", dup["handle"])["status"] == NvStatus.NV_OK
            assert used(client, cg) == 0
            assert tenant.ask("alloc", 10 * MIB)["status"] == NvStatus.NV_OK
            # Into a second client of its own: RM cannot relate the two, the holder pays too,
            # and past the limit the duplicate is refused (and freed again).
            orig = tenant.ask("alloc", 4 * MIB)["handle"]
            assert used(client, cg) == 14 * MIB
            assert tenant.ask("dup", orig, "second")["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert used(client, cg) == 14 * MIB
            assert tenant.ask("free", orig)["status"] == NvStatus.NV_OK
            dup = tenant.ask("dup", tenant.ask("alloc", 2 * MIB)["handle"], "second")
            assert dup["status"] == NvStatus.NV_OK
            assert used(client, cg) == 14 * MIB
        assert used(client, cg) == 0


def refusals(client: QgpuClient, cg: Cgroup) -> tuple[int, int]:
    """The cgroup's two refusal counters: (oom, denied)."""
    stats = stats_of(client, cg)
    return stats.oom, stats.denied


@contextmanager
def limited_and_free() -> Iterator[tuple[QgpuClient, QgpuClient, Cgroup, Cgroup]]:
    """qgpu loaded, a listener on its events, and two configured cgroups: one with a 64 MiB
    limit, one without."""
    with (
        qgpu_loaded() as client,
        QgpuClient.open() as watcher,
        cgroups(2) as (limited, free),
    ):
        watcher.subscribe_events()
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(free.id, 0, "offline", 50)
        yield client, watcher, limited, free


def test_exports_and_fabric_memory_are_refused_to_a_memory_limited_cgroup() -> None:
    """What qgpu cannot follow once it leaves a tenant's clients: refused where a limit holds,
    the driver's answer elsewhere (nvmock models export to fd; dma-buf export and fabric memory
    get the answers of a GPU without them, after the driver's argument checks). The refusals
    exist only because of the limit: the memory gate's, counted as oom and sent as OOM events
    whatever the tenant is answered, never as denied."""
    with (
        limited_and_free() as (client, watcher, limited, free),
        mem_tenants(limited, free) as (inside, outside),
    ):
        denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        handle = inside.ask("alloc", MIB)["handle"]
        assert inside.ask("export", handle)["status"] == denied
        assert inside.ask("dmabuf", -1, 1)["errno"] == 1  # EPERM
        assert inside.ask("fabric_sub")["status"] == denied
        handle = outside.ask("alloc", MIB)["handle"]
        exported = outside.ask("export", handle)
        assert exported["status"] == NvStatus.NV_OK
        outside.ask("closefd", exported["fd"])
        dmabuf = outside.ask("dmabuf", -1, 1)
        assert dmabuf == {"errno": 0, "status": NvStatus.NV_ERR_NOT_SUPPORTED}
        assert outside.ask("fabric_sub")["status"] == NvStatus.NV_ERR_NOT_SUPPORTED
        assert refusals(client, limited) == (3, 0)
        assert refusals(client, free) == (0, 0)
        assert used(client, limited) == MIB
        events = refusal_events(drain(watcher, quiet=0.5))
        assert events == [(Event.OOM, limited.id)] * 3, events


def test_plural_exports_and_imports_are_refused_to_a_memory_limited_cgroup() -> None:
    """OS_UNIX_EXPORT_OBJECTS_TO_FD and IMPORT_OBJECTS_FROM_FD, the plural controls, hold memory
    where qgpu cannot charge it just as the singular ones do (RmExportObject duplicates each
    object into RM's export client): refused to a memory-limited cgroup, so RM makes no export
    of its memory (nvmock's object count), and counted as the memory gate's (oom, OOM events).
    A cgroup without a limit exports the same way."""
    with (
        limited_and_free() as (client, watcher, limited, free),
        mem_tenants(limited, free) as (inside, outside),
    ):
        denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        handle = inside.ask("alloc", MIB)["handle"]
        ctl = inside.ask("newfd", "nvidiactl")["fd"]
        vidmem = objects()["vidmem"]
        assert inside.ask("exports", ctl, inside.device, 1, 0, 1, handle)["status"] == denied
        assert objects()["vidmem"] == vidmem  # no duplicate in RM's export client
        assert inside.ask("imports", ctl, 0, 1)["status"] == denied
        inside.ask("closefd", ctl)
        handle = outside.ask("alloc", MIB)["handle"]
        ctl = outside.ask("newfd", "nvidiactl")["fd"]
        vidmem = objects()["vidmem"]
        exported = outside.ask("exports", ctl, outside.device, 1, 0, 1, handle)
        assert exported["status"] == NvStatus.NV_OK
        assert objects()["vidmem"] == vidmem + 1
        outside.ask("closefd", ctl)
        assert refusals(client, limited) == (2, 0)
        assert refusals(client, free) == (0, 0)
        assert used(client, limited) == MIB
        events = refusal_events(drain(watcher, quiet=0.5))
        assert events == [(Event.OOM, limited.id)] * 2, events


def test_export_and_import_pass_through_for_an_unlimited_cgroup() -> None:
    """An fd export from one process and its import in another, in configured cgroups without a
    memory limit: qgpu lets both through and the memory works on the importer's side after the
    exporter has let go of it; an importer in a memory-limited cgroup is refused (the import
    would hold memory qgpu cannot charge). Nothing stays charged once the processes are gone."""
    base = fb_used()
    with qgpu_loaded() as client, cgroups(3) as (one, two, limited):
        client.set_cgroup(one.id, 0, "offline", 50)
        client.set_cgroup(two.id, 0, "offline", 50)
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(one, two, limited) as (owner, other, capped):
            handle = owner.ask("alloc", 8 * MIB)["handle"]
            assert owner.ask("write", handle, 0xC0FFEE)["value"] == 0xC0FFEE
            exported = owner.ask("export", handle)
            assert exported["status"] == NvStatus.NV_OK
            pid, fd = owner.hello["pid"], exported["fd"]
            refused = capped.ask("import", pid, fd)
            assert refused["status"] == NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert refusals(client, limited) == (1, 0)  # the memory gate's, not denied
            imported = other.ask("import", pid, fd)
            assert imported["status"] == NvStatus.NV_OK
            assert owner.ask("free", handle)["status"] == NvStatus.NV_OK
            owner.ask("closefd", fd)
            assert fb_used() == base + 8 * MIB
            assert other.ask("read", imported["handle"]) == {"status": 0, "value": 0xC0FFEE}
            assert other.ask("size", imported["handle"]) == {"status": 0, "size": 8 * MIB}
            assert used(client, limited) == 0
        assert fb_used() == base
        for cg in (one, two, limited):
            assert used(client, cg) == 0


def test_a_failed_plural_import_stops_charging_what_rm_freed_inside_it() -> None:
    """A failed IMPORT_OBJECTS_FROM_FD frees, inside RM, the caller's own object it named for an
    empty slot, with no RM_FREE (os.c's unwind; test_nvmock_export.py shows nvmock does it): qgpu
    asks RM about the handles of its copy after the call and stops charging what is gone. In a
    configured cgroup without a limit, where the plural controls pass."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50)
        with mem_tenants(cg) as (tenant,):
            first = tenant.ask("alloc", 4 * MIB)["handle"]
            second = tenant.ask("alloc", 2 * MIB)["handle"]
            own = tenant.ask("alloc", MIB)["handle"]
            assert used(client, cg) == 7 * MIB
            ctl = tenant.ask("newfd", "nvidiactl")["fd"]
            exported = tenant.ask("exports", ctl, tenant.device, 3, 0, 3, first, 0, second)
            assert exported["status"] == NvStatus.NV_OK
            # Slot 0 imported where RM picks, slot 1 empty (own named), slot 2 at own: taken.
            got = tenant.ask("imports", ctl, 0, 3, 0, 0, own, own)
            assert got["status"] == NvStatus.NV_ERR_INSERT_DUPLICATE_NAME
            assert tenant.ask("size", own)["status"] == NvStatus.NV_ERR_OBJECT_NOT_FOUND
            assert used(client, cg) == 6 * MIB
            for handle in (first, second):
                assert tenant.ask("free", handle)["status"] == NvStatus.NV_OK
            tenant.ask("closefd", ctl)
            assert used(client, cg) == 0


def test_a_control_rewritten_after_qgpus_read_is_refused_on_the_drivers_copy() -> None:
    """A memory-limited tenant's thread flips an RM_CONTROL between a query qgpu lets through and
    an export to an fd (refused to it: the export would hold memory past the limit) while the
    call is on its way. qgpu's probe on rm_ioctl compares the driver's copy with the one qgpu
    read: whatever reached RM rewritten is refused there, so no export is ever made."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(cg) as (tenant,):
            handle = tenant.ask("alloc", 8 * MIB)["handle"]
            fd = tenant.ask("newfd", "nvidiactl")["fd"]
            vidmem = objects()["vidmem"]
            refused = int((SYSFS / "rewrites_refused").read_text())
            # Batches until one call reached the driver rewritten (the window is short): the
            # race was run, and every batch must leave no export behind.
            for _ in range(5):
                out = tenant.ask("race_export", 2000, handle, fd)["statuses"]
                assert objects()["vidmem"] == vidmem, out
                if int((SYSFS / "rewrites_refused").read_text()) > refused:
                    break
            assert int((SYSFS / "rewrites_refused").read_text()) > refused, out
            assert int((SYSFS / "rewrites_unchecked").read_text()) == 0
            # No export: RM's export client would hold a duplicate of the memory.
            assert objects()["vidmem"] == vidmem, out
            tenant.ask("closefd", fd)
            assert used(client, cg) == 8 * MIB


def test_a_preemption_mode_rewritten_after_qgpus_read_is_never_carried_out() -> None:
    """The tenant guard lets a gated tenant's GR_SET_CTXSW_PREEMPTION_MODE through only for CILP
    (what CUDA asks); a coarser mode would let its context run on past its slice. The mode is
    in the parameter block, which RM copies in itself, after qgpu's read (rmapiParamsAcquire,
    param_copy.c), and which the driver's probe does not compare (only the request). Here a
    process flips the mode between CILP and CTA while each call is on its way: whatever the
    tenant's memory says once qgpu has read CILP, the TSG's mode (nvmock's ground truth, after
    every call) is never CTA, and both reads happened (some calls refused, some carried out)."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50)
        with mem_tenants(cg) as (tenant,):
            out = tenant.ask("race_mode", 2000)
    print(f"a flipped preemption mode: {out}")
    assert out["modes"] == {str(PREEMPTION_MODE_CILP): 2000}, out
    denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
    assert set(out["statuses"]) == {str(NvStatus.NV_OK), str(denied)}, out


def rewrites() -> dict[str, int]:
    """qgpu's counts of the rm_ioctl probes (sysfs): refused, unchecked, answers_missed."""
    names = ("rewrites_refused", "rewrites_unchecked", "answers_missed")
    return {name: int((SYSFS / name).read_text()) for name in names}


@HOST_TIMED
def test_an_allocation_renamed_around_the_drivers_copies_is_charged() -> None:
    """A memory-limited tenant's thread flips hObjectNew of its RM_ALLOC between two fresh names
    for as long as each call is in flight, objects kept: before qgpu's probe on rm_ioctl, a
    name rewritten after qgpu's read and back again after the driver's copy-out had qgpu ask
    RM about the wrong handle, and the object RM made went uncharged (CONFORMANCE.md, limit
    (1)). Now a call that reaches the driver renamed is refused there, and what RM wrote back
    is read from the driver's copy: every byte RM holds for the tenant is charged, and the
    limit holds."""
    # A quarter of the rounds fills the limit: up to half of them are refused as renamed (515
    # of 1000 in one run at a limit of 512 MiB, which then never reached it).
    limit = 256 * MIB
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=limit)
        with mem_tenants(cg) as (tenant,):
            before, counts = fb_used(), rewrites()
            out = tenant.ask("race_name", 1000)["statuses"]
            held = fb_used() - before
            after = rewrites()
            # The limit was reached, and what RM holds is what is charged.
            assert out.get(str(NvStatus.NV_ERR_NO_MEMORY), 0) > 0, out
            assert held == used(client, cg) == limit, (out, held, after)
            # The race was run: calls reached the driver renamed and were refused there.
            assert after["rewrites_refused"] > counts["rewrites_refused"], (out, after)
            assert after["rewrites_unchecked"] == after["answers_missed"] == 0, after
        assert used(client, cg) == 0


def test_what_rm_answered_is_read_from_the_drivers_copy() -> None:
    """Without the driver's RM entry (nvmock posing as a driver of another branch) qgpu believes
    the status RM wrote back. A memory-limited tenant's thread keeps writing NV_ERR_GENERIC
    over the status of its RM_ALLOCs, so that the tenant's buffer reads as a failure as soon
    as the driver copied RM's NV_OK out: qgpu takes the status from the driver's copy as RM
    left it (the kretprobe on rm_ioctl), so every allocation RM made is charged and the limit
    holds. (Read from the tenant's memory, a forged failure left its object uncharged.)"""
    limit = 128 * MIB
    (DEBUGFS / "kapi_version").write_text("575.64.05\n")
    try:
        with qgpu_loaded() as client, cgroups(1) as (cg,):
            assert (SYSFS / "rm_version").read_text() == "\n"
            client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=limit)
            with mem_tenants(cg) as (tenant,):
                before = fb_used()
                out = tenant.ask("forge_status", 400)
                held = fb_used() - before
                assert held == used(client, cg) == limit, (out, held)
                assert rewrites()["rewrites_unchecked"] == rewrites()["answers_missed"] == 0
            assert used(client, cg) == 0
    finally:
        (DEBUGFS / "kapi_version").write_text("\n")


def test_a_duplicate_without_the_rm_entry_is_refused_to_a_memory_limited_cgroup() -> None:
    """Without the driver's RM entry (nvmock posing as a driver of another branch) qgpu cannot
    ask RM whether a duplicate is of memory it tracks, so a memory-limited cgroup is refused
    every DUP_OBJECT (NV_ERR_INSUFFICIENT_PERMISSIONS) while one without a limit is not. The
    refusal exists only because of the limit: counted as oom and sent as an OOM event."""
    (DEBUGFS / "kapi_version").write_text("575.64.05\n")
    try:
        with limited_and_free() as (client, watcher, limited, free):
            assert (SYSFS / "rm_version").read_text() == "\n"
            with mem_tenants(limited, free) as (inside, outside):
                denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
                handle = inside.ask("alloc", MIB)["handle"]
                assert inside.ask("dup", handle)["status"] == denied
                assert inside.ask("dup", handle, "second")["status"] == denied
                assert used(client, limited) == MIB
                assert outside.ask("dup", outside.ask("alloc", MIB)["handle"])["status"] == 0
                assert refusals(client, limited) == (2, 0)
                assert refusals(client, free) == (0, 0)
                events = refusal_events(drain(watcher, quiet=0.5))
                assert events == [(Event.OOM, limited.id)] * 2, events
    finally:
        (DEBUGFS / "kapi_version").write_text("\n")


def test_another_files_client_is_never_charged() -> None:
    with qgpu_loaded() as client, cgroups(2) as (attacker, victim):
        client.set_cgroup(attacker.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(victim.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(attacker, victim) as (bad, good):
            assert good.ask("alloc", 2 * MIB)["status"] == NvStatus.NV_OK
            out = bad.ask("foreign", good.client, good.device)
            assert out["status"] == NvStatus.NV_ERR_INVALID_CLIENT
            assert used(client, victim) == 2 * MIB and used(client, attacker) == 0


def test_a_tenant_racing_its_own_alloc_arguments_charges_no_neighbour() -> None:
    """hRoot rewritten between qgpu's look and the driver's: nothing is charged to the
    neighbour whose client it names, and nothing allocated escapes the attacker's count."""
    with qgpu_loaded() as client, cgroups(2) as (attacker, victim):
        client.set_cgroup(attacker.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(victim.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(attacker, victim) as (bad, good):
            assert good.ask("alloc", 2 * MIB)["status"] == NvStatus.NV_OK
            out = bad.ask("race_alloc", 3000, good.client)
            # Both outcomes happened: the race was run, not avoided.
            assert out["ok"] > 0 and out["refused"] > 0, out
            assert used(client, victim) == 2 * MIB
            assert used(client, attacker) == 0
            assert bad.ask("alloc", 64 * MIB)["status"] == NvStatus.NV_OK
            assert used(client, attacker) == 64 * MIB


def test_a_tenant_racing_its_own_free_arguments_untracks_nothing() -> None:
    """A free of a second client's object whose arguments read, after the driver, as a free of
    the first client: qgpu asks RM, which still has the first client, so its memory stays
    charged and the limit still holds."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=16 * MIB)
        with mem_tenants(cg) as (tenant,):
            assert tenant.ask("alloc", 12 * MIB)["status"] == NvStatus.NV_OK
            out = tenant.ask("race_free", 2000)
            assert out["freed"] > 0, out
            assert used(client, cg) == 12 * MIB
            assert stats_of(client, cg).clients == 2
            assert tenant.ask("alloc", 8 * MIB)["status"] == NvStatus.NV_ERR_NO_MEMORY
        assert used(client, cg) == 0


def test_an_object_left_for_rm_to_name_is_refused_to_a_configured_cgroup() -> None:
    """With a zero handle RM picks one and writes it back, where a tenant thread could rewrite
    it before qgpu reads it: the object would go untracked, uncharged and unsliced. A configured
    cgroup (limited or not) is refused all three ways of making one; an unconfigured cgroup is
    not (nvmock picks the handles there, as RM does)."""
    with qgpu_loaded() as client, cgroups(3) as (limited, sliced, free):
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(sliced.id, 0, "offline", 50)
        with mem_tenants(limited, sliced, free) as tenants:
            outcomes = [tenant.ask("unnamed", MIB) for tenant in tenants]
        denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        assert outcomes[0] == outcomes[1] == {"alloc": denied, "vidheap": denied, "dup": denied}
        ok = NvStatus.NV_OK
        assert outcomes[2] == {"alloc": ok, "vidheap": ok, "dup": ok}
        # A handle rule, not the memory gate's: denied, even where a memory limit holds.
        assert refusals(client, limited) == refusals(client, sliced) == (0, 3)
        assert used(client, limited) == 0


def test_concurrent_allocations_of_a_cgroup_never_take_more_than_its_limit() -> None:
    """Four threads of one memory-limited tenant allocate at once, each call held 100 ms in the
    driver after RM made the memory (slow_calls). qgpu holds no lock across the driver's call,
    so the calls are in flight together; what each asked for is reserved against the limit
    before the call (and settled after), so RM never holds more of the tenant's memory than its
    limit, even for a moment (nvmock's fb_peak), and what is charged afterwards is exactly what
    is live."""
    limit = 8 * MIB
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=limit)
        with mem_tenants(cg) as (tenant,):
            base = fb_used()
            reset()  # fb_peak from here
            with slow_calls(tenant.hello["pid"], 100):
                churn = tenant.ask("burst", 4, 6, 6 * MIB)
                kept = tenant.ask("burst", 4, 4, MIB, "keep")
            peak = fb_memory()["fb_peak"]
            assert churn["other"] == [] and kept["other"] == []
            # Both outcomes happened: the calls did overlap.
            assert churn["ok"] > 0 and churn["refused"] > 0, churn
            assert peak - base <= limit, (peak - base) / MIB
            assert (kept["ok"], kept["refused"]) == (8, 8)
            assert used(client, cg) == limit == fb_used() - base
            assert stats_of(client, cg).oom == churn["refused"] + kept["refused"]
        assert used(client, cg) == 0


def test_an_allocation_does_not_wait_for_another_tenants_driver_call() -> None:
    """nvidia.ko keeps no lock of qgpu's across an RM_ALLOC's round trip to GSP (hundreds of µs
    to ms), so one tenant's calls must not wait for another's there. Tenant A's calls are held
    3 s in the driver (slow_calls); while A's allocation, and then A's free, is in flight,
    tenant B allocates and frees at once, and both are charged right. The same while qgpu's
    queries of RM after A's allocation are slow (2 s each, slow_kapi): B's queries do not wait
    for A's."""
    with qgpu_loaded() as client, cgroups(2) as (a, b):
        client.set_cgroup(a.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(b.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(a, b) as (slow, quick):
            base = fb_used()
            took = []
            with slow_calls(slow.hello["pid"], 3000):
                slow.send("alloc", 2 * MIB)
                wait_for(lambda: fb_used() == base + 2 * MIB)  # made, the answer held back
                start = time.monotonic()
                out = quick.ask("alloc", MIB)
                assert out["status"] == NvStatus.NV_OK
                assert quick.ask("free", out["handle"])["status"] == NvStatus.NV_OK
                took.append(time.monotonic() - start)
                held = slow.answer()
                assert held["status"] == NvStatus.NV_OK
                assert used(client, a) == 2 * MIB and used(client, b) == 0
                slow.send("free", held["handle"])
                wait_for(lambda: fb_used() == base)  # freed, the answer held back
                start = time.monotonic()
                out = quick.ask("alloc", MIB)
                assert out["status"] == NvStatus.NV_OK
                took.append(time.monotonic() - start)
                assert slow.answer()["status"] == NvStatus.NV_OK
            assert used(client, a) == 0 and used(client, b) == MIB
            with slow_calls(slow.hello["pid"], 2000, "slow_kapi"):
                slow.send("alloc", 4 * MIB)
                wait_for(lambda: fb_used() == base + 5 * MIB)  # made, qgpu asking RM
                start = time.monotonic()
                out = quick.ask("alloc", MIB)
                assert out["status"] == NvStatus.NV_OK
                took.append(time.monotonic() - start)
                assert slow.answer()["status"] == NvStatus.NV_OK
            assert max(took) < 1.0, took
            assert used(client, a) == 4 * MIB and used(client, b) == 2 * MIB


def test_a_client_freed_while_its_allocation_is_accounted_leaves_nothing_behind() -> None:
    """RM frees a client (and the memory just made in it) after qgpu's queries said that memory
    was there, but before qgpu recorded it: qgpu must not record it then, nor bring the client's
    record back. qgpu's queries from the tenant are slowed (slow_kapi, 500 ms each) and the
    client is freed 700 ms into its allocation's account."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        with mem_tenants(cg) as (tenant,):
            base, vidmem = fb_used(), objects()["vidmem"]
            with slow_calls(tenant.hello["pid"], 500, "slow_kapi"):
                out = tenant.ask("free_during_alloc", 4 * MIB, 700)
            assert out["free"] == NvStatus.NV_OK, out
            assert fb_used() == base and objects()["vidmem"] == vidmem
            stats = stats_of(client, cg)
            assert stats.clients == 1, stats  # the tenant's first client only
            assert stats.mem_used == 0 and stats.oom == 0, stats
            assert tenant.ask("alloc", 64 * MIB)["status"] == NvStatus.NV_OK


def test_a_handle_made_again_while_its_free_is_accounted_stays_charged() -> None:
    """RM frees an object and, before qgpu has recorded that free (its query of RM is slowed to
    2 s for the freeing thread alone), the tenant makes the same handle again, bigger. qgpu must
    replace the old record with the new object's size, and the free's late account must not
    drop the new object: it stays charged at its own size and the limit holds."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=16 * MIB)
        with mem_tenants(cg) as (tenant,):
            base = fb_used()
            out = tenant.ask("realloc_during_free", MIB, 8 * MIB, 2000)
            assert set(out.values()) == {NvStatus.NV_OK}, out
            assert fb_used() - base == 8 * MIB
            assert used(client, cg) == 8 * MIB
            assert tenant.ask("alloc", 9 * MIB)["status"] == NvStatus.NV_ERR_NO_MEMORY
            assert tenant.ask("alloc", 8 * MIB)["status"] == NvStatus.NV_OK
        assert used(client, cg) == 0
