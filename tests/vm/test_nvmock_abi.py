"""nvmock speaks the RM ABI: escapes, sizes, nodes, objects, statuses, as nvidia.ko does."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time

import pytest

from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.abi import Escape, NvStatus
from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import nvmock_param
from tests.vm.rmclient import (
    CARD,
    NVOS54,
    SYSMEM_ATTR,
    VERSION,
    Rm,
    channel_params,
    ioctl,
    memory_params,
    offset_of,
    sysmem_params,
    tsg_params,
)
from tests.vm.tenant import preemption_mode

# A load that keeps nvmock's engine running (test_nvmock_engine.py's), with 64 ms of work in
# flight so that it stays running while the process waits for a CPU: with 8 ms, a CI run once
# took the idle time for one of three controls meant to find the engine busy.
ENGINE_BUSY = ["--shape", "saturate", "--kernel-us", "1000", "--sync-every", "4", "--queue", "16"]


@pytest.fixture
def rm() -> Rm:
    client = Rm()
    yield client
    client.close()


def test_version_check_answers_like_the_driver(rm: Rm) -> None:
    arg = bytearray(VERSION.pack(0, 0, b"580.159.04"))
    ioctl(rm.ctl, Escape.CHECK_VERSION_STR, arg)
    assert VERSION.unpack(arg)[1] == 1
    wrong = bytearray(VERSION.pack(0, 0, b"535.1.1"))
    with pytest.raises(OSError) as error:
        ioctl(rm.ctl, Escape.CHECK_VERSION_STR, wrong)
    assert error.value.errno == errno.EINVAL
    # Even a failed check is copied back: the driver says which version it is.
    assert VERSION.unpack(wrong)[2].rstrip(b"\0") == b"580.159.04"


def test_card_info_lists_each_gpu_with_its_minor(rm: Rm) -> None:
    arg = bytearray(CARD.size * 32)
    ioctl(rm.ctl, Escape.CARD_INFO, arg)
    cards = [CARD.unpack_from(arg, i * CARD.size) for i in range(32)]
    valid = [card for card in cards if card[0]]
    assert [card[13] for card in valid] == [0, 1]
    assert all(card[5] == 0x10DE for card in valid)


@pytest.mark.parametrize(
    ("nr", "size"),
    [(0x2B, 40), (0x2A, 31), (0x29, 0), (0x77, 8), (0xC8, 71), (0xD4, 3)],
)
def test_unknown_escapes_and_wrong_sizes_are_einval(rm: Rm, nr: int, size: int) -> None:
    with pytest.raises(OSError) as error:
        ioctl(rm.ctl, nr, bytearray(size))
    assert error.value.errno == errno.EINVAL


def test_control_only_escapes_are_refused_on_a_gpu_node(rm: Rm) -> None:
    with pytest.raises(OSError) as error:
        ioctl(rm.gpu, Escape.RM_ALLOC, bytearray(48))
    assert error.value.errno == errno.EINVAL


def test_the_object_tree_of_a_cuda_process_and_its_statuses(rm: Rm) -> None:
    client = rm.new(0, 0, 0x41)
    assert client & 0xFFF00000 == 0xC1D00000
    device = rm.new(
        client,
        client,
        0x80,
        struct.pack("<IIIIII QQQII", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        handle=0x5C000002,
    )
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0), handle=0x5C000003)
    assert rm.new(client, subdevice, 0xC661, handle=0x5C000005) == 0x5C000005
    sysmem = rm.alloc(client, device, 0x3E, sysmem_params(1 << 20), handle=0x5C000010)
    assert sysmem.status == NvStatus.NV_OK and offset_of(sysmem.params) >= 1 << 32
    tsg = rm.new(client, device, 0xA06C, tsg_params(), handle=0x5C000015)
    # Wrong parent, duplicate handle, missing required parameters, unknown class.
    assert (
        rm.alloc(client, client, 0xA06C, tsg_params()).status
        == NvStatus.NV_ERR_INVALID_OBJECT_PARENT
    )
    # A handle in use (resserv's clientValidateNewResourceHandle), and the client's own: RM's
    # serverAllocResourceUnderLock refuses that first, as a parent (measured: rmcases.py).
    assert (
        rm.alloc(client, device, 0xA06C, tsg_params(), handle=tsg).status
        == NvStatus.NV_ERR_INSERT_DUPLICATE_NAME
    )
    assert (
        rm.alloc(client, device, 0xA06C, tsg_params(), handle=client).status
        == NvStatus.NV_ERR_INVALID_OBJECT_PARENT
    )
    # A device instance that does not exist (deviceConstruct).
    assert (
        rm.alloc(client, client, 0x80, struct.pack("<I", 7).ljust(56, b"\0")).status
        == NvStatus.NV_ERR_INVALID_CLASS
    )
    assert rm.alloc(client, device, 0xA06C, None).status == NvStatus.NV_ERR_INVALID_ARGUMENT
    assert rm.alloc(client, device, 0xCB33, None).status == NvStatus.NV_ERR_INVALID_CLASS
    # A client that does not exist: resserv's client lookup (measured: rmcases.py).
    unknown = rm.alloc(0xC1DFFFFF, device, 0xA06C, tsg_params()).status
    assert unknown == NvStatus.NV_ERR_INVALID_OBJECT_HANDLE
    assert rm.free(client, client, client) == NvStatus.NV_OK


def test_device_memory_runs_out_with_the_drivers_status(rm: Rm) -> None:
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000002)
    big = rm.alloc(client, device, 0x40, memory_params(100 << 30))
    assert big.status == NvStatus.NV_OK
    too_much = rm.alloc(client, device, 0x40, memory_params(50 << 30))
    assert too_much.status == NvStatus.NV_ERR_NO_MEMORY
    assert rm.free(client, device, big.handle) == NvStatus.NV_OK
    assert rm.alloc(client, device, 0x40, memory_params(50 << 30)).status == NvStatus.NV_OK
    rm.free(client, client, client)


def test_gpu_addresses_are_the_lowest_free_range_and_freed_ones_are_reused(rm: Rm) -> None:
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000003)

    def sysmem(size: int) -> tuple[int, int]:
        result = rm.alloc(client, device, 0x3E, sysmem_params(size))
        assert result.status == NvStatus.NV_OK
        return result.handle, offset_of(result.params)

    (_, va_a), (b, va_b), (_, va_c) = sysmem(1 << 20), sysmem(100), sysmem(1 << 20)
    # In order, 64 KiB aligned, not overlapping.
    assert va_a >= 1 << 32 and va_b == va_a + (1 << 20) and va_c == va_b + (64 << 10)
    assert rm.free(client, device, b) == NvStatus.NV_OK
    # A range too big for the hole goes past the last one; one that fits takes the hole.
    _, va_big = sysmem(128 << 10)
    assert va_big == va_c + (1 << 20)
    _, va_small = sysmem(64 << 10)
    assert va_small == va_b
    # Allocating and freeing 64 GiB a hundred times stays where it started: a bump pointer
    # would pass the 40 bits a GPFIFO entry carries after sixteen.
    seen = set()
    for _ in range(100):
        handle, va = sysmem(64 << 30)
        seen.add(va)
        assert rm.free(client, device, handle) == NvStatus.NV_OK
    assert len(seen) == 1 and seen.pop() + (64 << 30) <= 1 << 40
    # A range that cannot fit below 40 bits is refused with the driver's status.
    assert rm.alloc(client, device, 0x3E, sysmem_params(1 << 40)).status == (
        NvStatus.NV_ERR_NO_MEMORY
    )
    assert rm.free(client, client, client) == NvStatus.NV_OK


@pytest.mark.parametrize("cls", [0x3E, 0x40])
def test_memory_needs_an_owner_rm_accepts(rm: Rm, cls: int) -> None:
    """stdmemValidateParams (standard_mem.c): after a size of 0, an owner of 0, ~0 or RM's
    scratch range is NV_ERR_INVALID_OWNER; the real driver answered that to ioctlbench's owner
    of 0 (580.159.04, H100, 2026-11-26). Nothing is left allocated by a refusal."""
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000003)
    attr = SYSMEM_ATTR if cls == 0x3E else 0
    assert rm.alloc(client, device, cls, memory_params(0, owner=0, attr=attr)).status == (
        NvStatus.NV_ERR_INVALID_ARGUMENT
    )
    for owner in (0, 0xFFFFFFFF, 0xDEAF0000, 0xDEAF0003):
        result = rm.alloc(client, device, cls, memory_params(1 << 20, owner=owner, attr=attr))
        assert result.status == NvStatus.NV_ERR_INVALID_OWNER, hex(owner)
    for owner in (client, 0xDEAEFFFF, 0xDEAF0004, 1):
        result = rm.alloc(client, device, cls, memory_params(1 << 20, owner=owner, attr=attr))
        assert result.status == NvStatus.NV_OK, hex(owner)
        assert rm.free(client, device, result.handle) == NvStatus.NV_OK
    assert rm.free(client, client, client) == NvStatus.NV_OK


def test_memory_must_say_its_own_location(rm: Rm) -> None:
    """sysmemConstruct (system_mem.c) and vidmemConstruct (video_mem.c), after
    stdmemValidateParams: ALLOC_FLAGS_VIRTUAL, or a LOCATION other than the class's, is
    NV_ERR_INVALID_ARGUMENT; the real driver answered that to ioctlbench's owner-named system
    memory with attr 0 (LOCATION VIDMEM; 580.159.04, H100, 2026-11-26). An owner of 0 is
    refused first."""
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000003)
    assert rm.alloc(client, device, 0x3E, memory_params(1 << 20)).status == (
        NvStatus.NV_ERR_INVALID_ARGUMENT
    )
    assert rm.alloc(client, device, 0x3E, memory_params(1 << 20, owner=0)).status == (
        NvStatus.NV_ERR_INVALID_OWNER
    )
    virtual = bytearray(sysmem_params(1 << 20))
    struct.pack_into("<I", virtual, 8, 0x00080000)  # NVOS32_ALLOC_FLAGS_VIRTUAL
    assert rm.alloc(client, device, 0x3E, bytes(virtual)).status == (
        NvStatus.NV_ERR_INVALID_ARGUMENT
    )
    # Video memory: LOCATION VIDMEM (0) only, and not virtual either.
    assert rm.alloc(client, device, 0x40, sysmem_params(1 << 20)).status == (
        NvStatus.NV_ERR_INVALID_ARGUMENT
    )
    virtual = bytearray(memory_params(1 << 20))
    struct.pack_into("<I", virtual, 8, 0x00080000)
    assert rm.alloc(client, device, 0x40, bytes(virtual)).status == (
        NvStatus.NV_ERR_INVALID_ARGUMENT
    )
    for params, cls in ((sysmem_params(1 << 20), 0x3E), (memory_params(1 << 20), 0x40)):
        result = rm.alloc(client, device, cls, params)
        assert result.status == NvStatus.NV_OK
        assert rm.free(client, device, result.handle) == NvStatus.NV_OK
    assert rm.free(client, client, client) == NvStatus.NV_OK


def test_a_device_needs_its_gpu_file_open() -> None:
    ctl = os.open("/dev/nvidiactl", os.O_RDWR)
    try:
        rm = Rm.__new__(Rm)
        rm.ctl, rm.fds = ctl, []
        client = rm.new(0, 0, 0x41)
        assert rm.alloc(client, client, 0x80).status == NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        rm.free(client, client, client)
    finally:
        os.close(ctl)


def test_closing_the_control_file_frees_its_clients() -> None:
    from tests.vm.nvmock import objects

    rm = Rm()
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000002)
    rm.new(client, device, 0xA06C, tsg_params(), handle=0x5C000015)
    assert objects()["tsgs"] == 1
    rm.close()
    assert objects()["tsgs"] == 0 and objects()["clients"] == 0


def test_controls_unknown_to_the_object_are_not_supported(rm: Rm) -> None:
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000002)
    tsg = rm.new(client, device, 0xA06C, tsg_params(), handle=0x5C000015)
    status, _ = rm.control(client, device, 0xA06C0103, bytes(8))
    assert status == NvStatus.NV_ERR_NOT_SUPPORTED
    status, _ = rm.control(client, tsg, 0xA06C0103, bytes(4))
    assert status == NvStatus.NV_ERR_INVALID_ARGUMENT
    status, _ = rm.control(client, tsg, 0xA06C0103, struct.pack("<Q", 500))
    assert status == NvStatus.NV_OK
    status, out = rm.control(client, tsg, 0xA06C0104, bytes(8))
    assert status == NvStatus.NV_OK and struct.unpack("<Q", out)[0] == 500
    assert rm.control(client, tsg, 0, b"")[0] == NvStatus.NV_OK  # the NULL command
    rm.free(client, client, client)


def test_controls_at_raised_irql_or_bypassing_locks_are_refused(rm: Rm) -> None:
    """NVOS54 flags IRQL_RAISED (1) and LOCK_BYPASS (2) are for a short list of commands
    (rmapi_specific.c in 580.142), none of them nvmock's; FINN-serialized (4) is not modelled."""
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80)
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    params = ctypes.create_string_buffer(struct.pack("<Q", 500), 8)
    answers = {}
    for flags in (0, 1, 2, 4):
        arg = bytearray(NVOS54.pack(client, tsg, 0xA06C0103, flags, ctypes.addressof(params), 8, 0))
        ioctl(rm.ctl, Escape.RM_CONTROL, arg)
        answers[flags] = NVOS54.unpack(arg)[6]
    assert answers == {
        0: NvStatus.NV_OK,
        1: NvStatus.NV_ERR_INVALID_ARGUMENT,
        2: NvStatus.NV_ERR_INVALID_ARGUMENT,
        4: NvStatus.NV_ERR_NOT_SUPPORTED,
    }
    rm.free(client, client, client)


def test_a_client_is_named_by_hroot(rm: Rm) -> None:
    """RM takes a new client's handle from hRoot (serverAllocClient), hands it back in
    hObjectNew and in the optional NvHandle parameter; hObjectNew going in is not read."""
    first = rm.alloc(0xC1D0BEEF, 0, 0x41, bytes(4), handle=0x1234)
    assert first.status == NvStatus.NV_OK and first.handle == 0xC1D0BEEF
    assert struct.unpack("<I", first.params)[0] == 0xC1D0BEEF
    assert rm.alloc(0xC1D0BEEF, 0, 0x41).status == NvStatus.NV_ERR_INSERT_DUPLICATE_NAME
    picked = rm.alloc(0, 0, 0x41, handle=0x1234)
    assert picked.status == NvStatus.NV_OK and picked.handle >> 20 == 0xC1D
    for handle in (first.handle, picked.handle):
        assert rm.free(handle, handle, handle) == NvStatus.NV_OK


def test_a_channels_userd_must_name_memory_of_its_client(rm: Rm) -> None:
    """kchannelCreateUserdMemDesc_GV100 (580.142, arch/volta/kernel_channel_gv100.c) takes
    hUserdMemory[0] through serverutilGetResourceRefWithType(classId(Memory)): a handle the
    client does not have, or one that is not memory, is NV_ERR_OBJECT_NOT_FOUND. A slot in video
    memory of the client's is accepted, as libcuda's at 0x2000 of a 2 MiB object."""
    client = rm.new(0, 0, 0x41)
    try:
        device = rm.new(client, client, 0x80, bytes(56))
        subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
        tsg = rm.new(client, device, 0xA06C, tsg_params())
        memory = rm.new(client, device, 0x40, memory_params(2 << 20))

        def channel(userd: int) -> int:
            params = bytearray(channel_params(0x100000000))
            struct.pack_into("<I", params, 32, userd)  # hUserdMemory[0]
            struct.pack_into("<Q", params, 64, 0x2000)  # userdOffset[0]
            return rm.alloc(client, tsg, 0xC86F, bytes(params)).status

        assert channel(0x5C0BAD0B) == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert channel(subdevice) == NvStatus.NV_ERR_OBJECT_NOT_FOUND
        assert channel(memory) == NvStatus.NV_OK
    finally:
        rm.free(client, client, client)


def test_a_contexts_compute_preemption_mode_is_one_whichever_handle_sets_it(rm: Rm) -> None:
    """Measured on an H200 (tools/gpu/preemption_modes.py, call 32A): CTA set through one compute
    channel of a TSG, or through the TSG's handle, is read back on each of its compute channels;
    GR_GET_CTXSW_MODES answers a TSG's handle NV_ERR_INVALID_CHANNEL. CILP before any set."""
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, bytes(56))
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    channels = [
        rm.new(client, tsg, 0xC86F, channel_params(0x100000000 + 0x10000 * i)) for i in (0, 1)
    ]
    for channel in channels:
        rm.new(client, channel, 0xCBC0)

    def set_mode(handle: int, mode: int) -> int:
        params = struct.pack("<IIIIIIQ", abi.PREEMPTION_MODE_FLAG_CILP, handle, 0, mode, 0, 0, 0)
        return rm.control(
            client, subdevice, abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE, params
        )[0]

    def modes() -> list[int]:
        out = []
        for channel in channels:
            params = struct.pack("<I", channel).ljust(24, b"\0")
            status, raw = rm.control(
                client, subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, params
            )
            assert status == NvStatus.NV_OK
            out.append(struct.unpack_from("<I", raw, 16)[0])
        return out

    cta, cilp = abi.PREEMPTION_MODE_CTA, abi.PREEMPTION_MODE_CILP
    assert modes() == [cilp, cilp]
    assert set_mode(channels[0], cta) == NvStatus.NV_OK
    assert modes() == [cta, cta]
    assert set_mode(tsg, cilp) == NvStatus.NV_OK
    assert modes() == [cilp, cilp]
    params = struct.pack("<I", tsg).ljust(24, b"\0")
    status = rm.control(client, subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, params)[0]
    assert status == NvStatus.NV_ERR_INVALID_CHANNEL


def context_of(rm: Rm) -> tuple[int, int, int, int]:
    """A client, its subdevice, a TSG and a compute channel in it."""
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, bytes(56))
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    channel = rm.new(client, tsg, 0xC86F, channel_params(0x100000000))
    rm.new(client, channel, 0xCBC0)
    return client, subdevice, tsg, channel


# What nvmock's GSP controls take on an idle GPU, at gsp_pct 100: the H200's
# (tools/gpu/control_times.py, calls 33A and 34A; nvmock's control.c).
GSP_IDLE_US = {
    "SET_TIMESLICE": 280,
    "GR_GET_CTXSW_MODES": 240,
    "GR_SET_CTXSW_PREEMPTION_MODE": 370,
    "GR_GET_CTXSW_STATS": 290,
    "FIFO_DISABLE_CHANNELS close": 477,
    "FIFO_DISABLE_CHANNELS open": 370,
}


def gsp_controls(client: int, subdevice: int, tsg: int, channel: int) -> dict[str, tuple]:
    """Each control nvmock times as GSP's, with GET_TIMESLICE (the host's) beside them; each
    leaves the context as it was (the close is followed by its open)."""
    return {
        "GET_TIMESLICE": (tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, bytes(8)),
        "SET_TIMESLICE": (tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, struct.pack("<Q", 1024)),
        "GR_GET_CTXSW_MODES": (
            subdevice,
            abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES,
            struct.pack("<I", channel).ljust(24, b"\0"),
        ),
        "GR_SET_CTXSW_PREEMPTION_MODE": (
            subdevice,
            abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
            preemption_mode(channel, abi.PREEMPTION_MODE_CILP),
        ),
        "GR_GET_CTXSW_STATS": (
            subdevice,
            abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS,
            struct.pack("<I", tsg).ljust(32, b"\0"),
        ),
        "FIFO_DISABLE_CHANNELS close": (
            subdevice,
            abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
            bytes(rmctl.disable_channels_params(client, [channel], disable=True)),
        ),
        "FIFO_DISABLE_CHANNELS open": (
            subdevice,
            abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
            bytes(rmctl.disable_channels_params(client, [channel], disable=False)),
        ),
    }  # fmt: skip


def timed(rm: Rm, client: int, control: tuple) -> float:
    """Seconds ``control`` took, which RM answered NV_OK."""
    start = time.perf_counter()
    assert rm.control(client, *control)[0] == NvStatus.NV_OK, control
    return time.perf_counter() - start


def test_the_controls_gsp_answers_take_the_h200s_time_at_gsp_pct_100(rm: Rm) -> None:
    """On an idle H200 SET_TIMESLICE took 260-302 us, GR_GET_CTXSW_MODES 231-267,
    GR_SET_CTXSW_PREEMPTION_MODE 361-377, GR_GET_CTXSW_STATS 290, FIFO_DISABLE_CHANNELS 476-477
    a close and 368-375 an open, and GET_TIMESLICE, the host's, 6-14 us. nvmock spins through
    each time, as RM polls GSP for the answer; until 2026-12-03 it slept (fsleep), and in the
    VM a 300 us control took over 1 ms."""
    client, subdevice, tsg, channel = context_of(rm)
    controls = gsp_controls(client, subdevice, tsg, channel)
    took: dict[str, list[float]] = {name: [] for name in controls}
    for _ in range(40):
        for name, control in controls.items():
            took[name].append(timed(rm, client, control) * 1e6)
    p50 = {name: sorted(times)[len(times) // 2] for name, times in took.items()}
    print("p50 us", {name: round(us) for name, us in p50.items()})
    # The VM's own ioctl path (GET_TIMESLICE's time) comes on top.
    host = p50["GET_TIMESLICE"]
    assert host < 250
    for name, us in GSP_IDLE_US.items():
        assert us <= p50[name] <= 1.5 * us + host + 100, name


def test_a_control_gsp_answers_takes_longer_while_the_engine_runs(rm: Rm) -> None:
    """Beside an 8192 trainer the H200's SET_TIMESLICE took 447-456 us against 260-302 idle
    (GR_SET_CTXSW_PREEMPTION_MODE 560-661 against 361-377): nvmock takes the busy time where a
    TSG is on its engine. At 200 times the H200's, so that the VM's noise is small beside it:
    56 ms idle, 90 ms busy."""
    client, subdevice, tsg, channel = context_of(rm)
    set_timeslice = gsp_controls(client, subdevice, tsg, channel)["SET_TIMESLICE"]
    with nvmock_param("gsp_pct", 20_000):
        idle = [timed(rm, client, set_timeslice) for _ in range(3)]
        load = Gpuload([*ENGINE_BUSY, "--seconds", "4"]).ready()
        try:
            time.sleep(1)
            busy = [timed(rm, client, set_timeslice) for _ in range(3)]
        finally:
            load.result()
    print("idle", [round(s, 3) for s in idle], "busy", [round(s, 3) for s in busy])
    # Between the two: a sleep in the VM overshoots by up to two jiffies and the VM's own path.
    assert min(idle) >= 0.056 and max(idle) < 0.085
    assert min(busy) >= 0.0855


def test_the_controls_gsp_answers_queue_the_others(rm: Rm) -> None:
    """RM holds its locks across the RPC: on an H200 another client's GET_TIMESLICE waited out
    each GSP control of the queue study (tools/gpu/control_times.py, calls 34A-B). At 500 times
    the H200's (SET_TIMESLICE 140 ms), one sent 20 ms into a SET_TIMESLICE waits for it, and
    each control takes its own time."""
    client, subdevice, tsg, channel = context_of(rm)
    controls = gsp_controls(client, subdevice, tsg, channel)
    other = Rm()
    try:
        other_client, _, other_tsg, _ = context_of(other)
        with nvmock_param("gsp_pct", 50_000):
            took = {name: timed(rm, client, control) for name, control in controls.items()}
            waited: list[float] = []

            def get_beside() -> None:
                time.sleep(0.02)
                params = (other_tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, bytes(8))
                waited.append(timed(other, other_client, params))

            beside = threading.Thread(target=get_beside)
            beside.start()
            timed(rm, client, controls["SET_TIMESLICE"])
            beside.join()
        print("took", {name: round(s, 3) for name, s in took.items()}, "waited", waited)
        for name, us in GSP_IDLE_US.items():
            assert took[name] >= 500 * us / 1e6 * 0.99, name
        assert took["GET_TIMESLICE"] < 0.05
        assert waited[0] >= 0.1
    finally:
        other.close()


def nice_controls(subdevice: int, tsg: int, channel: int) -> dict[str, tuple]:
    interleaved = struct.pack("<II", 0, abi.RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED)
    return {
        "MAKE_REALTIME on": (tsg, abi.NVA06C_CTRL_CMD_MAKE_REALTIME, bytes([1])),
        "MAKE_REALTIME off": (tsg, abi.NVA06C_CTRL_CMD_MAKE_REALTIME, bytes([0])),
        "RESTART_RUNLIST": (channel, abi.NVA06F_CTRL_CMD_RESTART_RUNLIST, bytes([1, 0])),
        "FIFO_RUNLIST_SET_SCHED_POLICY": (
            subdevice,
            abi.NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY,
            interleaved,
        ),
    }


CAP_SYS_NICE = 23


def drop_capability(cap: int) -> None:
    """Drop ``cap`` from this process's effective and permitted sets (capget/capset, version 3:
    two 32-bit words per set)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    word, bit = divmod(cap, 32)
    for field in (0, 1):  # effective, permitted
        data[word * 3 + field] &= ~(1 << bit) & 0xFFFFFFFF
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def test_the_nice_controls_gsp_carries_out_answer_as_the_gpus_did(rm: Rm) -> None:
    """MAKE_REALTIME, RESTART_RUNLIST and FIFO_RUNLIST_SET_SCHED_POLICY (RS_ACCESS_NICE, then
    GSP's): NV_OK from root on an H100 and an H200 (the doctor; control_times.py --extra, call
    34C); refused by the host without CAP_SYS_NICE (nice_allowed()). Until 2026-12-03 nvmock
    answered NV_ERR_NOT_SUPPORTED, which no GPU did."""
    client, subdevice, tsg, channel = context_of(rm)
    for name, control in nice_controls(subdevice, tsg, channel).items():
        assert rm.control(client, *control)[0] == NvStatus.NV_OK, name
    # A child that drops CAP_SYS_NICE, on a client of its own.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        statuses: list[int] = []
        try:
            drop_capability(CAP_SYS_NICE)
            child = Rm()
            c_client, c_subdevice, c_tsg, c_channel = context_of(child)
            controls = nice_controls(c_subdevice, c_tsg, c_channel).values()
            statuses = [child.control(c_client, *control)[0] for control in controls]
        finally:
            os.write(write, struct.pack(f"<{len(statuses)}I", *statuses))
            os._exit(0)
    os.close(write)
    got = os.read(read, 64)
    os.waitpid(pid, 0)
    os.close(read)
    assert (
        struct.unpack(f"<{len(got) // 4}I", got) == (NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS,) * 4
    )
