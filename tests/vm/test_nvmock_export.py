"""nvmock's export of memory to an fd of /dev/nvidiactl and import from it, as 580.142 does them
(cliresCtrlCmdOsUnixExportObjectToFd, ...ImportObjectFromFd, RmExportObject, RmImportObject):
the memory lives while any handle to it does, the fd's included, and is counted once; bad fds
and handles get the driver's answers. Also the answers of a GPU with neither dma-buf support nor
an NVLink fabric."""

from __future__ import annotations

from qpolicy.nvrm.abi import NvStatus
from tests.vm.conftest import objects
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
        parent = tenant.ask("import_from", ctl, 0xBAD)["status"]
        assert parent == NvStatus.NV_ERR_INVALID_OBJECT_PARENT
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
