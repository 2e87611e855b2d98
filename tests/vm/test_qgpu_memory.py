"""qgpu's memory gate on every path that allocates or keeps device memory, against nvmock: what
is charged is what RM allocated and still holds, as RM says, whatever the tenant writes into
its own arguments meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.nvrm.abi import NvStatus
from tests.vm.conftest import DEBUGFS, objects
from tests.vm.linetenant import LineTenant
from tests.vm.qgpu_env import Cgroup, cgroups, qgpu_loaded, stats_of

MIB = 1 << 20
KIB_64 = 64 << 10


class MemTenant(LineTenant):
    """tests/vm/memtenant.py inside a cgroup: a client and device that live until closed."""

    def __init__(self, cg: Cgroup) -> None:
        super().__init__(cg.path, "tests.vm.memtenant", timeout=60.0)
        self.client, self.device = int(self.hello["client"]), int(self.hello["device"])

    def ask(self, *words: object) -> dict[str, Any]:  # type: ignore[override]
        return super().ask(" ".join(str(w) for w in words))


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


def fb_used(gpu: int = 0) -> int:
    """Device memory nvmock has allocated on a GPU (debugfs gpuN/memory)."""
    lines = (DEBUGFS / f"gpu{gpu}" / "memory").read_text().splitlines()
    return int(dict(line.split() for line in lines)["fb_used"])


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


def test_exports_and_fabric_memory_are_refused_to_a_memory_limited_cgroup() -> None:
    """What qgpu cannot follow once it leaves a tenant's clients: refused where a limit holds,
    the driver's answer elsewhere (nvmock models export to fd; dma-buf export and fabric memory
    get the answers of a GPU without them, after the driver's argument checks)."""
    with qgpu_loaded() as client, cgroups(2) as (limited, free):
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(free.id, 0, "offline", 50)
        with mem_tenants(limited, free) as (inside, outside):
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
            assert stats_of(client, limited).denied == 3
            assert used(client, limited) == MIB


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
            assert stats_of(client, limited).denied == 1
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
        assert stats_of(client, limited).denied == 3 and stats_of(client, sliced).denied == 3
        assert used(client, limited) == 0
