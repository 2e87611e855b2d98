"""nvmock's export of memory to an fd of /dev/nvidiactl and import from it, as 580.142 does them
(cliresCtrlCmdOsUnixExportObjectToFd, ...ImportObjectFromFd, their plural ...ObjectsToFd and
...ObjectsFromFd, RmExportObject, RmImportObject): the memory lives while any handle to it does,
the fd's included, and is counted once; bad fds, handles and slot ranges get the driver's
answers. Also the answers of a GPU with neither dma-buf support nor an NVLink fabric."""

from __future__ import annotations

from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import objects
from tests.vm.qgpu_env import cgroups
from tests.vm.test_qgpu_memory import fb_used, mem_tenants

MIB = 1 << 20
PATTERN = 0x5EED_0000_C0FF_EE01


def test_memory_lives_through_an_import_in_another_process() -> None:
    base = fb_used()
    with cgroups(2) as cgs, mem_tenants(*cgs) as (owner, other):
        handle = owner.ask("alloc", 8 * MIB)["handle"]
        assert owner.ask("write", handle, PATTERN) == {"status": 0, "value": PATTERN}
        exported = owner.ask("export", handle)
        assert exported["status"] == NvStatus.NV_OK
        assert fb_used() == base + 8 * MIB  # one memory, however many handles
        imported = other.ask("import", owner.hello["pid"], exported["fd"])
        assert imported["status"] == NvStatus.NV_OK and imported["handle"]
        # The owner lets go of everything: its handle and the fd.
        assert owner.ask("free", handle)["status"] == NvStatus.NV_OK
        owner.ask("closefd", exported["fd"])
        assert fb_used() == base + 8 * MIB
        assert objects()["vidmem"] == 1
        assert other.ask("size", imported["handle"]) == {"status": 0, "size": 8 * MIB}
        assert other.ask("read", imported["handle"]) == {"status": 0, "value": PATTERN}
        # The last handle takes the memory with it.
        assert other.ask("free", imported["handle"])["status"] == NvStatus.NV_OK
        assert fb_used() == base
        assert objects()["vidmem"] == 0


def test_the_fd_alone_holds_the_memory_until_it_is_closed() -> None:
    base = fb_used()
    with cgroups(1) as cgs, mem_tenants(*cgs) as (owner,):
        before = objects()
        handle = owner.ask("alloc", 4 * MIB)["handle"]
        exported = owner.ask("export", handle)
        assert exported["status"] == NvStatus.NV_OK
        assert owner.ask("free", handle)["status"] == NvStatus.NV_OK
        assert fb_used() == base + 4 * MIB
        # RM's export client holds it: a client with a device and subdevice of its own.
        held = objects()
        assert (held["clients"], held["devices"], held["vidmem"]) == (
            before["clients"] + 1,
            before["devices"] + 1,
            1,
        )
        # Imported back into the owner's client, after the original is gone.
        imported = owner.ask("import_from", exported["fd"])
        assert imported["status"] == NvStatus.NV_OK
        owner.ask("closefd", exported["fd"])
        assert fb_used() == base + 4 * MIB
        assert objects()["clients"] == before["clients"]  # the export client went with the fd
        assert owner.ask("free", imported["handle"])["status"] == NvStatus.NV_OK
        assert fb_used() == base
        assert objects() == before


def test_bad_fds_and_handles_get_the_drivers_answers() -> None:
    bad = NvStatus.NV_ERR_INVALID_PARAMETER
    with cgroups(1) as cgs, mem_tenants(*cgs) as (tenant,):
        handle = tenant.ask("alloc", MIB)["handle"]
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        gpu = tenant.ask("newfd", "nvidia0")["fd"]
        null = tenant.ask("newfd", "null")["fd"]
        before = objects()
        assert tenant.ask("export_to", handle, -1)["status"] == bad
        assert tenant.ask("export_to", 0xBAD, ctl)["status"] == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert tenant.ask("export_to", handle, gpu)["status"] == bad
        assert tenant.ask("export_to", handle, null)["status"] == bad
        assert tenant.ask("export_to", handle, 999)["status"] == bad  # not open
        assert tenant.ask("export_to", handle, ctl, handle)["status"] == bad  # not a device
        missing = tenant.ask("export_to", handle, ctl, 0xBAD)["status"]
        assert missing == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert tenant.ask("import_from", -1)["status"] == bad
        assert tenant.ask("import_from", ctl)["status"] == bad  # nothing exported to it
        assert tenant.ask("import_from", gpu)["status"] == bad
        assert tenant.ask("import_from", null)["status"] == bad
        assert objects() == before  # a refused export leaves no duplicate behind
        assert tenant.ask("export_to", handle, ctl)["status"] == NvStatus.NV_OK
        assert tenant.ask("export_to", handle, ctl)["status"] == NvStatus.NV_ERR_STATE_IN_USE
        # RmImportObject duplicates into the parent: serverCopyResource's clientGetResourceRef.
        parent = tenant.ask("import_from", ctl, 0xBAD)["status"]
        assert parent == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        for fd in (ctl, gpu, null):
            tenant.ask("closefd", fd)
        assert objects() == before


def test_dma_buf_and_fabric_get_the_answers_of_a_gpu_without_them() -> None:
    with cgroups(1) as cgs, mem_tenants(*cgs) as (tenant,):
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        # nv_dma_buf_export's argument checks, then nv_dma_buf_create without dma-buf support.
        assert tenant.ask("dmabuf") == {"errno": 0, "status": NvStatus.NV_ERR_INVALID_ARGUMENT}
        assert tenant.ask("dmabuf", -2, 1)["status"] == NvStatus.NV_ERR_INVALID_ARGUMENT
        assert tenant.ask("dmabuf", -1, 1) == {"errno": 0, "status": NvStatus.NV_ERR_NOT_SUPPORTED}
        # nv_dma_buf_reuse: an fd that is no dma-buf.
        assert tenant.ask("dmabuf", ctl, 1)["status"] == NvStatus.NV_ERR_OPERATING_SYSTEM
        tenant.ask("closefd", ctl)
        # NV_MEMORY_FABRIC: a subdevice's class; no fabric VA space on this GPU.
        assert tenant.ask("fabric")["status"] == NvStatus.NV_ERR_INVALID_OBJECT_PARENT
        assert tenant.ask("fabric_sub")["status"] == NvStatus.NV_ERR_NOT_SUPPORTED


# The plural pair (cliresCtrlCmdOsUnixExportObjectsToFd, ...ImportObjectsFromFd in os.c):
# handles exported into slots [index, index + numObjects) of a control fd set up for maxObjects,
# imported back slot by slot with each one's memory kind.
VIDMEM, SYSMEM, NONE = 1, 2, 0


def test_several_objects_go_through_one_fd_to_another_process() -> None:
    base = fb_used()
    with cgroups(2) as cgs, mem_tenants(*cgs) as (owner, other):
        before = objects()
        big = owner.ask("alloc", 4 * MIB)["handle"]
        small = owner.ask("alloc", 2 * MIB)["handle"]
        sysmem = owner.ask("sysalloc", 64 * 1024)["handle"]
        assert owner.ask("write", big, PATTERN)["status"] == NvStatus.NV_OK
        ctl = owner.ask("newfd", "nvidiactl")["fd"]
        # Slots 0..2 of 5 in one call; slot 4 in a second (maxObjects is the first call's).
        first = owner.ask("exports", ctl, owner.device, 5, 0, 3, big, sysmem, small)
        assert first["status"] == NvStatus.NV_OK
        assert owner.ask("exports", ctl, owner.device, 1, 4, 1, big)["status"] == NvStatus.NV_OK
        assert fb_used() == base + 6 * MIB  # each memory once, however many handles
        # The owner lets go of its handles and of the fd: the other's copy of it holds them.
        got = other.ask("imports_remote", owner.hello["pid"], ctl, 0, 5)
        for handle in (big, small, sysmem):
            assert owner.ask("free", handle)["status"] == NvStatus.NV_OK
        owner.ask("closefd", ctl)
        assert got["status"] == NvStatus.NV_OK
        assert got["types"] == [VIDMEM, SYSMEM, VIDMEM, NONE, VIDMEM]
        handles = got["handles"]
        assert handles[3] == 0 and len(set(handles)) == 5
        assert fb_used() == base + 6 * MIB
        assert objects()["clients"] == before["clients"]  # the export client went with the fd
        assert other.ask("size", handles[0]) == {"status": 0, "size": 4 * MIB}
        assert other.ask("read", handles[4]) == {"status": 0, "value": PATTERN}
        # Each memory goes with its last handle.
        assert other.ask("free", handles[0])["status"] == NvStatus.NV_OK
        assert fb_used() == base + 6 * MIB
        assert other.ask("free", handles[4])["status"] == NvStatus.NV_OK
        assert fb_used() == base + 2 * MIB
        assert other.ask("free", handles[2])["status"] == NvStatus.NV_OK
        assert other.ask("free", handles[1])["status"] == NvStatus.NV_OK
        assert fb_used() == base
        assert objects() == before


def test_a_slot_exported_again_lets_go_of_what_it_held() -> None:
    base = fb_used()
    with cgroups(1) as cgs, mem_tenants(*cgs) as (owner,):
        first = owner.ask("alloc", 4 * MIB)["handle"]
        second = owner.ask("alloc", 2 * MIB)["handle"]
        ctl = owner.ask("newfd", "nvidiactl")["fd"]
        assert owner.ask("exports", ctl, owner.device, 2, 0, 1, first)["status"] == NvStatus.NV_OK
        assert owner.ask("free", first)["status"] == NvStatus.NV_OK
        assert fb_used() == base + 6 * MIB  # the fd holds the first
        assert owner.ask("exports", ctl, 0, 0, 0, 1, second)["status"] == NvStatus.NV_OK
        assert fb_used() == base + 2 * MIB  # overwritten: the first is gone
        assert owner.ask("exports", ctl, 0, 0, 0, 1)["status"] == NvStatus.NV_OK  # a 0 handle
        got = owner.ask("imports", ctl, 0, 2)
        assert (got["status"], got["types"]) == (NvStatus.NV_OK, [NONE, NONE])
        assert owner.ask("free", second)["status"] == NvStatus.NV_OK
        assert fb_used() == base
        owner.ask("closefd", ctl)


def test_bad_plural_exports_get_the_drivers_answers() -> None:
    bad, out_of_range = NvStatus.NV_ERR_INVALID_PARAMETER, NvStatus.NV_ERR_OUT_OF_RANGE
    with cgroups(1) as cgs, mem_tenants(*cgs) as (tenant,):
        dev = tenant.device
        mem = tenant.ask("alloc", MIB)["handle"]
        other_dev = tenant.ask("device", 1)["handle"]
        other_mem = tenant.ask("alloc_under", other_dev, MIB)["handle"]
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        gpu = tenant.ask("newfd", "nvidia0")["fd"]
        null = tenant.ask("newfd", "null")["fd"]
        before = objects()

        def exports(*words: object) -> int:
            return int(tenant.ask("exports", *words)["status"])

        def empty(fd: int) -> bool:
            """Whether the fd holds no export: the plural import refuses it."""
            return tenant.ask("imports", fd, 0, 0)["status"] == bad

        # Not a control fd (fd -1 included: a new fd is the user library's).
        for fd in (-1, gpu, null, 999):
            assert exports(fd, dev, 1, 0, 1, mem) == bad
        assert exports(ctl, dev, 0, 0, 1, mem) == bad  # no slots
        assert exports(ctl, mem, 1, 0, 1, mem) == bad  # hDevice not a device
        assert exports(ctl, 0xBAD, 1, 0, 1, mem) == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert exports(ctl, dev, 1000, 0, 513) == bad  # more than 512 at once
        assert exports(ctl, dev, 4, 3, 2, mem, mem) == out_of_range
        assert exports(ctl, dev, 4, 0, 2, mem, 0xBAD) == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert exports(ctl, dev, 4, 0, 2, mem, other_mem) == bad  # another device's
        assert exports(ctl, 0, 4, 0, 1, mem) == bad  # the fd has no device, the object has
        # Each refusal set the fd up and gave its slots back, and left no duplicate behind.
        assert empty(ctl)
        assert objects() == before
        # An fd set up by the singular export has one slot, and the singular export's device.
        assert tenant.ask("export_to", mem, ctl)["status"] == NvStatus.NV_OK
        assert exports(ctl, dev, 4, 0, 2, mem, mem) == out_of_range
        assert exports(ctl, dev, 4, 0, 1, other_mem) == bad
        assert exports(ctl, 0, 4, 0, 1, mem) == NvStatus.NV_OK  # hDevice of a set fd unread
        assert tenant.ask("export_to", mem, ctl)["status"] == NvStatus.NV_ERR_STATE_IN_USE
        assert tenant.ask("import_from", ctl)["status"] == NvStatus.NV_OK  # slot 0
        tenant.ask("closefd", ctl)
        # A plural export's fd is the singular import's too, and no singular export's.
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        assert exports(ctl, 0, 2, 0, 0) == NvStatus.NV_OK  # an fd set up, no object
        assert tenant.ask("import_from", ctl)["status"] == bad  # slot 0 is empty
        assert tenant.ask("export_to", mem, ctl)["status"] == NvStatus.NV_ERR_STATE_IN_USE
        for fd in (ctl, gpu, null):
            tenant.ask("closefd", fd)


def test_bad_plural_imports_get_the_drivers_answers() -> None:
    bad, out_of_range = NvStatus.NV_ERR_INVALID_PARAMETER, NvStatus.NV_ERR_OUT_OF_RANGE
    with cgroups(1) as cgs, mem_tenants(*cgs) as (tenant,):
        mem = tenant.ask("alloc", MIB)["handle"]
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        fresh = tenant.ask("newfd", "nvidiactl")["fd"]
        gpu = tenant.ask("newfd", "nvidia0")["fd"]
        assert tenant.ask("exports", ctl, tenant.device, 200, 0, 1, mem)["status"] == 0
        before = objects()
        for fd in (-1, gpu, fresh, 999):
            assert tenant.ask("imports", fd, 0, 1)["status"] == bad
        assert tenant.ask("imports", ctl, 0, 129)["status"] == bad  # more than 128 at once
        assert tenant.ask("imports", ctl, 100, 101)["status"] == out_of_range
        parent = tenant.ask("imports", ctl, 0, 1, 0xBAD)["status"]
        assert parent == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert objects() == before
        for fd in (ctl, fresh, gpu):
            tenant.ask("closefd", fd)


def test_a_failed_import_frees_the_handles_before_the_failing_slot() -> None:
    """os.c's unwind frees objects[j] for every j before the failing slot that is not 0: what it
    imported, and also what the caller named for a slot with nothing in it, its own object."""
    base = fb_used()
    with cgroups(1) as cgs, mem_tenants(*cgs) as (tenant,):
        first = tenant.ask("alloc", 4 * MIB)["handle"]
        second = tenant.ask("alloc", 2 * MIB)["handle"]
        own = tenant.ask("alloc", MIB)["handle"]
        ctl = tenant.ask("newfd", "nvidiactl")["fd"]
        exported = tenant.ask("exports", ctl, tenant.device, 3, 0, 3, first, 0, second)
        assert exported["status"] == NvStatus.NV_OK
        vidmem = objects()["vidmem"]
        # Slot 0 imported at a handle RM picks, slot 1 empty (own named), slot 2 at own: taken.
        got = tenant.ask("imports", ctl, 0, 3, 0, 0, own, own)
        assert got["status"] == NvStatus.NV_ERR_INSERT_DUPLICATE_NAME
        assert objects()["vidmem"] == vidmem - 1  # the import of slot 0 undone, own freed
        assert tenant.ask("size", own)["status"] == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert fb_used() == base + 6 * MIB
        for handle in (first, second):
            assert tenant.ask("free", handle)["status"] == NvStatus.NV_OK
        tenant.ask("closefd", ctl)
        assert fb_used() == base
