"""The NVIDIA RM user ABI that qpolicy reads, in one place.

Facts from NVIDIA's open-gpu-kernel-modules (580.142; 595.45.04 agrees) for x86_64 (LP64), with
their sources in docs/driver-abi.md, and what the H200 trace shows (docs/gpu-measurements.md §1).
``kmod/uapi/`` mirrors the subset the kernel module needs; a test keeps the two in agreement.

Two kinds of numbers live here: *escapes* (the ioctl number's NR field; the size field picks the
struct) and, inside RM_CONTROL, *control commands* (class << 16 | category << 8 | index).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, StrEnum

# -- ioctl encoding (include/uapi/asm-generic/ioctl.h) ---------------------------------------------

IOC_NRBITS = 8
IOC_TYPEBITS = 8
IOC_SIZEBITS = 14
IOC_NRSHIFT = 0
IOC_TYPESHIFT = IOC_NRSHIFT + IOC_NRBITS
IOC_SIZESHIFT = IOC_TYPESHIFT + IOC_TYPEBITS
IOC_DIRSHIFT = IOC_SIZESHIFT + IOC_SIZEBITS
IOC_WRITE = 1
IOC_READ = 2


def ioc_nr(cmd: int) -> int:
    return (cmd >> IOC_NRSHIFT) & ((1 << IOC_NRBITS) - 1)


def ioc_type(cmd: int) -> int:
    return (cmd >> IOC_TYPESHIFT) & ((1 << IOC_TYPEBITS) - 1)


def ioc_size(cmd: int) -> int:
    return (cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)


def ioc_dir(cmd: int) -> int:
    return (cmd >> IOC_DIRSHIFT) & 0x3


def iowr(type_: int, nr: int, size: int) -> int:
    """``_IOWR(type, nr, size)``: how libcuda builds every RM request."""
    return (
        ((IOC_READ | IOC_WRITE) << IOC_DIRSHIFT)
        | (size << IOC_SIZESHIFT)
        | (type_ << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
    )


# -- device nodes --------------------------------------------------------------------------------

NV_IOCTL_MAGIC = ord("F")
NV_MAJOR = 195  # /dev/nvidia0..247, /dev/nvidia-modeset (254), /dev/nvidiactl (255)
NV_CTL_MINOR = 255
NV_MODESET_MINOR = 254
NV_MAX_GPU_MINOR = 247
UVM_DEVICE_NAME = "nvidia-uvm"  # dynamic major, looked up in /proc/devices


class Node(StrEnum):
    """Which NVIDIA device file an fd refers to."""

    CTL = "nvidiactl"
    GPU = "nvidia"
    UVM = "nvidia-uvm"
    MODESET = "nvidia-modeset"
    CAPS = "nvidia-caps"
    OTHER = "other"

    @classmethod
    def of_path(cls, path: str) -> Node:
        name = path.rsplit("/", 1)[-1]
        if name == "nvidiactl":
            return cls.CTL
        if name in ("nvidia-uvm", "nvidia-uvm-tools"):
            return cls.UVM
        if name == "nvidia-modeset":
            return cls.MODESET
        if name.startswith("nvidia-cap") or "/nvidia-caps" in path:
            return cls.CAPS
        if name.startswith("nvidia") and name[6:].isdigit():
            return cls.GPU
        return cls.OTHER

    @classmethod
    def of_device(cls, major: int, minor: int, uvm_major: int | None) -> Node:
        if major == NV_MAJOR:
            if minor == NV_CTL_MINOR:
                return cls.CTL
            if minor == NV_MODESET_MINOR:
                return cls.MODESET
            return cls.GPU if minor <= NV_MAX_GPU_MINOR else cls.OTHER
        if uvm_major is not None and major == uvm_major:
            return cls.UVM
        return cls.OTHER


# -- escapes (NR of an _IOWR('F', nr, size) request) -----------------------------------------------


class Escape(IntEnum):
    RM_ALLOC_MEMORY = 0x27
    RM_ALLOC_OBJECT = 0x28
    RM_FREE = 0x29
    RM_CONTROL = 0x2A
    RM_ALLOC = 0x2B
    RM_DUP_OBJECT = 0x34
    RM_SHARE = 0x35
    RM_I2C_ACCESS = 0x39
    RM_IDLE_CHANNELS = 0x41
    RM_VID_HEAP_CONTROL = 0x4A
    RM_ACCESS_REGISTRY = 0x4D
    RM_MAP_MEMORY = 0x4E
    RM_UNMAP_MEMORY = 0x4F
    RM_GET_EVENT_DATA = 0x52
    RM_ALLOC_CONTEXT_DMA2 = 0x54
    RM_MAP_MEMORY_DMA = 0x57
    RM_UNMAP_MEMORY_DMA = 0x58
    RM_BIND_CONTEXT_DMA = 0x59
    RM_UPDATE_DEVICE_MAPPING_INFO = 0x5E
    RM_LOCKLESS_DIAGNOSTIC = 0x5F
    CARD_INFO = 0xC8
    REGISTER_FD = 0xC9
    ALLOC_OS_EVENT = 0xCE
    FREE_OS_EVENT = 0xCF
    STATUS_CODE = 0xD1
    CHECK_VERSION_STR = 0xD2
    IOCTL_XFER_CMD = 0xD3
    ATTACH_GPUS_TO_FD = 0xD4
    QUERY_DEVICE_INTR = 0xD5
    SYS_PARAMS = 0xD6
    NUMA_INFO = 0xD7
    SET_NUMA_STATUS = 0xD8
    EXPORT_TO_DMABUF_FD = 0xD9
    WAIT_OPEN_COMPLETE = 0xDA


# Exact argument sizes the driver accepts per escape (RmValidateIoctl / nv_validate_ioctls). Array
# escapes take any non-zero multiple of their element size.
ESCAPE_SIZES: dict[Escape, tuple[int, ...]] = {
    Escape.RM_ALLOC_MEMORY: (56,),
    Escape.RM_ALLOC_OBJECT: (20,),
    Escape.RM_FREE: (16,),
    Escape.RM_CONTROL: (32,),
    Escape.RM_ALLOC: (32, 48),
    Escape.RM_DUP_OBJECT: (28,),
    Escape.RM_SHARE: (24,),
    Escape.RM_I2C_ACCESS: (32,),
    Escape.RM_IDLE_CHANNELS: (56,),
    Escape.RM_VID_HEAP_CONTROL: (184,),
    Escape.RM_ACCESS_REGISTRY: (72,),
    Escape.RM_MAP_MEMORY: (56,),
    Escape.RM_UNMAP_MEMORY: (32,),
    Escape.RM_GET_EVENT_DATA: (16,),
    Escape.RM_ALLOC_CONTEXT_DMA2: (56,),
    Escape.RM_MAP_MEMORY_DMA: (64,),
    Escape.RM_UNMAP_MEMORY_DMA: (48,),
    Escape.RM_BIND_CONTEXT_DMA: (16,),
    Escape.RM_UPDATE_DEVICE_MAPPING_INFO: (40,),
    Escape.REGISTER_FD: (4,),
    Escape.ALLOC_OS_EVENT: (16,),
    Escape.FREE_OS_EVENT: (16,),
    Escape.STATUS_CODE: (12,),
    Escape.CHECK_VERSION_STR: (72,),
    Escape.IOCTL_XFER_CMD: (16,),
    Escape.QUERY_DEVICE_INTR: (8,),
    Escape.SYS_PARAMS: (8,),
    Escape.NUMA_INFO: (560,),
    Escape.SET_NUMA_STATUS: (4,),
    Escape.EXPORT_TO_DMABUF_FD: (2608,),
    Escape.WAIT_OPEN_COMPLETE: (8,),
}
ESCAPE_ARRAY_ELEMENT: dict[Escape, int] = {Escape.CARD_INFO: 72, Escape.ATTACH_GPUS_TO_FD: 4}

NVOS21_SIZE = 32  # RM_ALLOC, the older struct
NVOS64_SIZE = 48  # RM_ALLOC as libcuda sends it (cmd 0xc030462b)
MAX_IOCTL_SIZE = 16384  # NV_ABSOLUTE_MAX_IOCTL_SIZE, also the XFER limit


def escape_size_ok(escape: Escape, size: int) -> bool:
    if escape in ESCAPE_ARRAY_ELEMENT:
        element = ESCAPE_ARRAY_ELEMENT[escape]
        return size > 0 and size % element == 0
    return size in ESCAPE_SIZES.get(escape, ())


# -- struct layouts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """A C struct as (field, offset, struct format) triples; little endian, no implicit padding."""

    name: str
    size: int
    fields: tuple[tuple[str, int, str], ...]

    def unpack(self, data: bytes) -> dict[str, int]:
        """The fields that lie entirely inside ``data`` (a capture may hold only a prefix)."""
        values: dict[str, int] = {}
        for name, offset, fmt in self.fields:
            end = offset + struct.calcsize(fmt)
            if end <= len(data):
                values[name] = struct.unpack_from("<" + fmt, data, offset)[0]
        return values

    def pack(self, **values: int) -> bytes:
        out = bytearray(self.size)
        for name, offset, fmt in self.fields:
            if name in values:
                struct.pack_into("<" + fmt, out, offset, values[name])
        unknown = set(values) - {name for name, _, _ in self.fields}
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        return bytes(out)


NVOS00 = Layout(  # RM_FREE
    "NVOS00_PARAMETERS",
    16,
    (("hRoot", 0, "I"), ("hObjectParent", 4, "I"), ("hObjectOld", 8, "I"), ("status", 12, "I")),
)
NVOS21 = Layout(  # RM_ALLOC, 32 bytes
    "NVOS21_PARAMETERS",
    32,
    (
        ("hRoot", 0, "I"),
        ("hObjectParent", 4, "I"),
        ("hObjectNew", 8, "I"),
        ("hClass", 12, "I"),
        ("pAllocParms", 16, "Q"),
        ("paramsSize", 24, "I"),
        ("status", 28, "I"),
    ),
)
NVOS64 = Layout(  # RM_ALLOC, 48 bytes
    "NVOS64_PARAMETERS",
    48,
    (
        ("hRoot", 0, "I"),
        ("hObjectParent", 4, "I"),
        ("hObjectNew", 8, "I"),
        ("hClass", 12, "I"),
        ("pAllocParms", 16, "Q"),
        ("pRightsRequested", 24, "Q"),
        ("paramsSize", 32, "I"),
        ("flags", 36, "I"),
        ("status", 40, "I"),
    ),
)
NVOS54 = Layout(  # RM_CONTROL
    "NVOS54_PARAMETERS",
    32,
    (
        ("hClient", 0, "I"),
        ("hObject", 4, "I"),
        ("cmd", 8, "I"),
        ("flags", 12, "I"),
        ("params", 16, "Q"),
        ("paramsSize", 24, "I"),
        ("status", 28, "I"),
    ),
)
NVOS02_WITH_FD = Layout(  # RM_ALLOC_MEMORY (nvidiaN only)
    "nv_ioctl_nvos02_parameters_with_fd",
    56,
    (
        ("hRoot", 0, "I"),
        ("hObjectParent", 4, "I"),
        ("hObjectNew", 8, "I"),
        ("hClass", 12, "I"),
        ("flags", 16, "I"),
        ("pMemory", 24, "Q"),
        ("limit", 32, "Q"),
        ("status", 40, "I"),
        ("fd", 48, "i"),
    ),
)
NVOS33_WITH_FD = Layout(  # RM_MAP_MEMORY
    "nv_ioctl_nvos33_parameters_with_fd",
    56,
    (
        ("hClient", 0, "I"),
        ("hDevice", 4, "I"),
        ("hMemory", 8, "I"),
        ("offset", 16, "Q"),
        ("length", 24, "Q"),
        ("pLinearAddress", 32, "Q"),
        ("status", 40, "I"),
        ("flags", 44, "I"),
        ("fd", 48, "i"),
    ),
)
NVOS32 = Layout(  # RM_VID_HEAP_CONTROL, with the ALLOC_SIZE member of its union
    "NVOS32_PARAMETERS",
    184,
    (
        ("hRoot", 0, "I"),
        ("hObjectParent", 4, "I"),
        ("function", 8, "I"),
        ("hVASpace", 12, "I"),
        ("ivcHeapNumber", 16, "h"),
        ("status", 20, "I"),
        ("total", 24, "Q"),
        ("free", 32, "Q"),
        ("owner", 40, "I"),
        ("hMemory", 44, "I"),
        ("type", 48, "I"),
        ("flags", 52, "I"),
        ("attr", 56, "I"),
        ("format", 60, "I"),
        ("comprCovg", 64, "I"),
        ("zcullCovg", 68, "I"),
        ("partitionStride", 72, "I"),
        ("width", 76, "I"),
        ("height", 80, "I"),
        ("size", 88, "Q"),
        ("alignment", 96, "Q"),
        ("offset", 104, "Q"),
        ("limit", 112, "Q"),
        ("address", 120, "Q"),
        ("rangeBegin", 128, "Q"),
        ("rangeEnd", 136, "Q"),
        ("attr2", 144, "I"),
        ("ctagOffset", 148, "I"),
        ("numaNode", 152, "i"),
    ),
)
NVOS32_FUNCTION_ALLOC_SIZE = 2
NV_MEMORY_FABRIC = 0x00F8  # class00f8.h
NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED = 0x4000
NVOS34 = Layout(  # RM_UNMAP_MEMORY
    "NVOS34_PARAMETERS",
    32,
    (
        ("hClient", 0, "I"),
        ("hDevice", 4, "I"),
        ("hMemory", 8, "I"),
        ("pLinearAddress", 16, "Q"),
        ("status", 24, "I"),
        ("flags", 28, "I"),
    ),
)
NVOS55 = Layout(  # RM_DUP_OBJECT
    "NVOS55_PARAMETERS",
    28,
    (
        ("hClient", 0, "I"),
        ("hParent", 4, "I"),
        ("hObject", 8, "I"),
        ("hClientSrc", 12, "I"),
        ("hObjectSrc", 16, "I"),
        ("flags", 20, "I"),
        ("status", 24, "I"),
    ),
)
NV_IOCTL_XFER = Layout("nv_ioctl_xfer_t", 16, (("cmd", 0, "I"), ("size", 4, "I"), ("ptr", 8, "Q")))
NV_IOCTL_REGISTER_FD = Layout("nv_ioctl_register_fd_t", 4, (("ctl_fd", 0, "i"),))
NV_IOCTL_EXPORT_TO_DMA_BUF_FD = Layout(  # NV_ESC_EXPORT_TO_DMABUF_FD; 128 handles at most
    "nv_ioctl_export_to_dma_buf_fd_t",
    2608,
    (
        ("fd", 0, "i"),
        ("hClient", 4, "I"),
        ("totalObjects", 8, "I"),
        ("numObjects", 12, "I"),
        ("index", 16, "I"),
        ("totalSize", 24, "Q"),
        ("mappingType", 32, "B"),
        ("bAllowMmap", 33, "B"),
        ("handles0", 36, "I"),
        ("offsets0", 552, "Q"),
        ("sizes0", 1576, "Q"),
        ("status", 2600, "I"),
    ),
)
NV_IOCTL_ALLOC_OS_EVENT = Layout(
    "nv_ioctl_alloc_os_event_t",
    16,
    (("hClient", 0, "I"), ("hDevice", 4, "I"), ("fd", 8, "I"), ("Status", 12, "I")),
)
NV_IOCTL_SYS_PARAMS = Layout("nv_ioctl_sys_params_t", 8, (("memblock_size", 0, "Q"),))
NV_IOCTL_RM_API_VERSION = Layout(
    "nv_ioctl_rm_api_version_t", 72, (("cmd", 0, "I"), ("reply", 4, "I"))
)
NV_IOCTL_WAIT_OPEN_COMPLETE = Layout(
    "nv_ioctl_wait_open_complete_t", 8, (("rc", 0, "i"), ("adapterStatus", 4, "I"))
)
NV_IOCTL_CARD_INFO = Layout(
    "nv_ioctl_card_info_t",
    72,
    (
        ("valid", 0, "B"),
        ("domain", 4, "I"),
        ("bus", 8, "B"),
        ("slot", 9, "B"),
        ("function", 10, "B"),
        ("vendor_id", 12, "H"),
        ("device_id", 14, "H"),
        ("gpu_id", 16, "I"),
        ("interrupt_line", 20, "H"),
        ("reg_address", 24, "Q"),
        ("reg_size", 32, "Q"),
        ("fb_address", 40, "Q"),
        ("fb_size", 48, "Q"),
        ("minor_number", 56, "I"),
    ),
)

# The outer struct of each escape that creates, frees or controls RM objects.
ESCAPE_LAYOUTS: dict[Escape, Layout] = {
    Escape.RM_FREE: NVOS00,
    Escape.RM_CONTROL: NVOS54,
    Escape.RM_ALLOC_MEMORY: NVOS02_WITH_FD,
    Escape.RM_MAP_MEMORY: NVOS33_WITH_FD,
    Escape.RM_UNMAP_MEMORY: NVOS34,
    Escape.RM_DUP_OBJECT: NVOS55,
    Escape.IOCTL_XFER_CMD: NV_IOCTL_XFER,
    Escape.REGISTER_FD: NV_IOCTL_REGISTER_FD,
    Escape.ALLOC_OS_EVENT: NV_IOCTL_ALLOC_OS_EVENT,
    Escape.FREE_OS_EVENT: NV_IOCTL_ALLOC_OS_EVENT,
    Escape.SYS_PARAMS: NV_IOCTL_SYS_PARAMS,
    Escape.CHECK_VERSION_STR: NV_IOCTL_RM_API_VERSION,
    Escape.WAIT_OPEN_COMPLETE: NV_IOCTL_WAIT_OPEN_COMPLETE,
}


def rm_alloc_layout(size: int) -> Layout | None:
    """RM_ALLOC's struct is chosen by the request size alone (escape.c)."""
    return {NVOS21_SIZE: NVOS21, NVOS64_SIZE: NVOS64}.get(size)


# -- classes ---------------------------------------------------------------------------------------


class Kind(StrEnum):
    """What an RM object is, for the tracker's tree."""

    CLIENT = "client"
    DEVICE = "device"
    SUBDEVICE = "subdevice"
    USERMODE = "usermode"
    TSG = "tsg"
    CHANNEL = "channel"
    COMPUTE = "compute"
    COPY = "copy"
    VIDMEM = "vidmem"
    SYSMEM = "sysmem"
    OS_DESCRIPTOR = "os-descriptor"
    VIRTUAL_MEMORY = "virtual-memory"
    VASPACE = "vaspace"
    CONTEXT_SHARE = "context-share"
    EVENT = "event"
    OTHER = "other"


ENGINE_KINDS = frozenset({Kind.COMPUTE, Kind.COPY})
MEMORY_KINDS = frozenset({Kind.VIDMEM, Kind.SYSMEM, Kind.OS_DESCRIPTOR})

CLASSES: dict[int, tuple[str, Kind]] = {
    0x0000: ("NV01_ROOT", Kind.CLIENT),
    0x0001: ("NV01_ROOT_NON_PRIV", Kind.CLIENT),
    0x0041: ("NV01_ROOT_CLIENT", Kind.CLIENT),
    0x0005: ("NV01_EVENT", Kind.EVENT),
    0x0078: ("NV01_EVENT_KERNEL_CALLBACK", Kind.EVENT),
    0x0079: ("NV01_EVENT_OS_EVENT", Kind.EVENT),
    0x007E: ("NV01_EVENT_KERNEL_CALLBACK_EX", Kind.EVENT),
    0x0080: ("NV01_DEVICE_0", Kind.DEVICE),
    0x2080: ("NV20_SUBDEVICE_0", Kind.SUBDEVICE),
    0x003E: ("NV01_MEMORY_SYSTEM", Kind.SYSMEM),
    0x0040: ("NV01_MEMORY_LOCAL_USER", Kind.VIDMEM),
    0x0070: ("NV01_MEMORY_VIRTUAL", Kind.VIRTUAL_MEMORY),
    0x0071: ("NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", Kind.OS_DESCRIPTOR),
    0x50A0: ("NV50_MEMORY_VIRTUAL", Kind.VIRTUAL_MEMORY),
    0x90F1: ("FERMI_VASPACE_A", Kind.VASPACE),
    0x9067: ("FERMI_CONTEXT_SHARE_A", Kind.CONTEXT_SHARE),
    0xA06C: ("KEPLER_CHANNEL_GROUP_A", Kind.TSG),
    0xC36F: ("VOLTA_CHANNEL_GPFIFO_A", Kind.CHANNEL),
    0xC46F: ("TURING_CHANNEL_GPFIFO_A", Kind.CHANNEL),
    0xC56F: ("AMPERE_CHANNEL_GPFIFO_A", Kind.CHANNEL),
    0xC86F: ("HOPPER_CHANNEL_GPFIFO_A", Kind.CHANNEL),
    0xC96F: ("BLACKWELL_CHANNEL_GPFIFO_A", Kind.CHANNEL),
    0xCA6F: ("BLACKWELL_CHANNEL_GPFIFO_B", Kind.CHANNEL),
    0xC3C0: ("VOLTA_COMPUTE_A", Kind.COMPUTE),
    0xC4C0: ("VOLTA_COMPUTE_B", Kind.COMPUTE),
    0xC5C0: ("TURING_COMPUTE_A", Kind.COMPUTE),
    0xC6C0: ("AMPERE_COMPUTE_A", Kind.COMPUTE),
    0xC7C0: ("AMPERE_COMPUTE_B", Kind.COMPUTE),
    0xC9C0: ("ADA_COMPUTE_A", Kind.COMPUTE),
    0xCBC0: ("HOPPER_COMPUTE_A", Kind.COMPUTE),
    0xCDC0: ("BLACKWELL_COMPUTE_A", Kind.COMPUTE),
    0xCEC0: ("BLACKWELL_COMPUTE_B", Kind.COMPUTE),
    0xC3B5: ("VOLTA_DMA_COPY_A", Kind.COPY),
    0xC5B5: ("TURING_DMA_COPY_A", Kind.COPY),
    0xC6B5: ("AMPERE_DMA_COPY_A", Kind.COPY),
    0xC7B5: ("AMPERE_DMA_COPY_B", Kind.COPY),
    0xC8B5: ("HOPPER_DMA_COPY_A", Kind.COPY),
    0xC9B5: ("BLACKWELL_DMA_COPY_A", Kind.COPY),
    0xCAB5: ("BLACKWELL_DMA_COPY_B", Kind.COPY),
    0xC361: ("VOLTA_USERMODE_A", Kind.USERMODE),
    0xC461: ("TURING_USERMODE_A", Kind.USERMODE),
    0xC561: ("AMPERE_USERMODE_A", Kind.USERMODE),
    0xC661: ("HOPPER_USERMODE_A", Kind.USERMODE),
    0xC761: ("BLACKWELL_USERMODE_A", Kind.USERMODE),
}


NV01_ROOT_CLIENT = 0x0041  # what nvidia.ko allocates for any user client (escape.c)
# GET_CHILD_HANDLE names the child's class by RM's internal (NVOC) class id, not its class number
# (client_resource.c: refFindChildOfType takes an internalClassId). Device's is 0xe0ac20 in
# g_device_nvoc.h (__nvoc_class_id_Device), the same from 515.43.04 to 595.45.04.
NVOC_CLASS_ID_DEVICE = 0xE0AC20
# A TSG is a KernelChannelGroupApi below its device, a channel outside a TSG a KernelChannel
# (g_kernel_channel_group_api_nvoc.h, g_kernel_channel_nvoc.h; the same from 515.43.04 to
# 595.45.04).
NVOC_CLASS_ID_CHANNEL_GROUP = 0x2B5B80
NVOC_CLASS_ID_CHANNEL = 0x5D8D70


def class_name(cls: int) -> str:
    return CLASSES[cls][0] if cls in CLASSES else f"class 0x{cls:04x}"


def class_kind(cls: int) -> Kind:
    return CLASSES[cls][1] if cls in CLASSES else Kind.OTHER


# Alloc parameter structs, chosen by class: RM copies the per-class size from resource_list.h and
# ignores the caller's paramsSize (libcuda leaves it 0, as the trace shows).
NV_MEMORY_ALLOCATION_PARAMS = Layout(
    "NV_MEMORY_ALLOCATION_PARAMS",
    128,
    (
        ("owner", 0, "I"),
        ("type", 4, "I"),
        ("flags", 8, "I"),
        ("attr", 24, "I"),
        ("attr2", 28, "I"),
        ("size", 64, "Q"),
        ("alignment", 72, "Q"),
        ("offset", 80, "Q"),
        ("limit", 88, "Q"),
    ),
)
NV_EVENT_BUFFER_ALLOC_PARAMETERS = Layout(  # cl90cd.h
    "NV_EVENT_BUFFER_ALLOC_PARAMETERS",
    72,
    (
        ("bufferHeader", 0, "Q"),
        ("recordBuffer", 8, "Q"),
        ("recordSize", 16, "I"),
        ("recordCount", 20, "I"),
        ("vardataBuffer", 24, "Q"),
        ("vardataBufferSize", 32, "I"),
        ("recordsFreeThreshold", 36, "I"),
        ("notificationHandle", 40, "Q"),
        ("vardataFreeThreshold", 48, "I"),
        ("hSubDevice", 52, "I"),
        ("flags", 56, "I"),
        ("hBufferHeader", 60, "I"),
        ("hRecordBuffer", 64, "I"),
        ("hVardataBuffer", 68, "I"),
    ),
)
NV_EVENT_BUFFER_HEADER = Layout(  # cl90cd.h: the producer's put, the consumer's get
    "NV_EVENT_BUFFER_HEADER",
    32,
    (
        ("recordGet", 0, "I"),
        ("recordPut", 4, "I"),
        ("recordCount", 8, "Q"),
        ("recordDropcount", 16, "Q"),
        ("vardataDropcount", 24, "Q"),
    ),
)
# One record: NV_EVENT_BUFFER_RECORD_HEADER (type, subtype, varData), then the payload at 8,
# NV_EVENT_BUFFER_FECS_RECORD_V2 (cl90cdfecs.h).
FECS_RECORD = Layout(
    "NV_EVENT_BUFFER_RECORD + NV_EVENT_BUFFER_FECS_RECORD_V2",
    32,
    (
        ("type", 0, "H"),
        ("subtype", 2, "H"),
        ("varData", 4, "I"),
        ("tag", 8, "B"),
        ("vmid", 9, "B"),
        ("seqno", 10, "H"),
        ("context_id", 12, "I"),
        ("pid", 16, "I"),
        ("timestamp", 24, "Q"),
    ),
)
NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS = Layout(
    "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
    20,
    (
        ("hObjectError", 0, "I"),
        ("hObjectEccError", 4, "I"),
        ("hVASpace", 8, "I"),
        ("engineType", 12, "I"),
    ),
)
NV_CHANNEL_ALLOC_PARAMS = Layout(
    "NV_CHANNEL_ALLOC_PARAMS",
    368,
    (
        ("hObjectError", 0, "I"),
        ("hObjectBuffer", 4, "I"),
        ("gpFifoOffset", 8, "Q"),
        ("gpFifoEntries", 16, "I"),
        ("flags", 20, "I"),
        ("hContextShare", 24, "I"),
        ("hVASpace", 28, "I"),
        ("hUserdMemory0", 32, "I"),
        ("userdOffset0", 64, "Q"),
        ("engineType", 128, "I"),
        ("cid", 132, "I"),
        ("subDeviceId", 136, "I"),
    ),
)
NV0080_ALLOC_PARAMETERS = Layout(
    "NV0080_ALLOC_PARAMETERS",
    56,
    (("deviceId", 0, "I"), ("hClientShare", 4, "I"), ("flags", 16, "I"), ("vaMode", 48, "I")),
)
NV2080_ALLOC_PARAMETERS = Layout("NV2080_ALLOC_PARAMETERS", 4, (("subDeviceId", 0, "I"),))
NV00F8_ALLOCATION_PARAMETERS = Layout(  # NV_MEMORY_FABRIC
    "NV00F8_ALLOCATION_PARAMETERS",
    48,
    (
        ("alignment", 0, "Q"),
        ("allocSize", 8, "Q"),
        ("pageSize", 16, "Q"),
        ("allocFlags", 24, "I"),
        ("mapOffset", 32, "Q"),
        ("hVidMem", 40, "I"),
        ("mapFlags", 44, "I"),
    ),
)
NV_CTXSHARE_ALLOCATION_PARAMETERS = Layout(
    "NV_CTXSHARE_ALLOCATION_PARAMETERS",
    12,
    (("hVASpace", 0, "I"), ("flags", 4, "I"), ("subctxId", 8, "I")),
)

NVB0B5_ALLOCATION_PARAMETERS = Layout(  # a copy object's engine (clb0b5sw.h)
    "NVB0B5_ALLOCATION_PARAMETERS", 8, (("version", 0, "I"), ("engineType", 4, "I"))
)

ALLOC_PARAMS_BY_KIND: dict[Kind, Layout] = {
    Kind.VIDMEM: NV_MEMORY_ALLOCATION_PARAMS,
    Kind.SYSMEM: NV_MEMORY_ALLOCATION_PARAMS,
    Kind.VIRTUAL_MEMORY: NV_MEMORY_ALLOCATION_PARAMS,
    Kind.TSG: NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS,
    Kind.CHANNEL: NV_CHANNEL_ALLOC_PARAMS,
    Kind.DEVICE: NV0080_ALLOC_PARAMETERS,
    Kind.SUBDEVICE: NV2080_ALLOC_PARAMETERS,
    Kind.CONTEXT_SHARE: NV_CTXSHARE_ALLOCATION_PARAMETERS,
}

# -- control commands ------------------------------------------------------------------------------


def ctrl_class(cmd: int) -> int:
    return (cmd >> 16) & 0xFFFF


def ctrl_category(cmd: int) -> int:
    return (cmd >> 8) & 0x3F


def ctrl_index(cmd: int) -> int:
    return cmd & 0xFF


@dataclass(frozen=True, slots=True)
class Control:
    name: str
    params: Layout


NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101
NVA06C_CTRL_CMD_SET_TIMESLICE = 0xA06C0103
NVA06C_CTRL_CMD_GET_TIMESLICE = 0xA06C0104
NVA06C_CTRL_CMD_PREEMPT = 0xA06C0105
NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL = 0xA06C0107
NVA06C_CTRL_CMD_GET_INTERLEAVE_LEVEL = 0xA06C0108
NVA06F_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06F0103
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108
NV2080_CTRL_CMD_FIFO_GET_INFO = 0x20801109
NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS = 0x2080110B
NV2080_CTRL_CMD_FIFO_DISABLE_USERMODE_CHANNELS = 0x20801117
# Which GPU a subdevice is: its gpuId (ctrl2080gpu.h), then that GPU's PCI address from the
# client itself (ctrl0000gpu.h). Both are answered by the kernel side of RM, not by GSP.
NV2080_CTRL_CMD_GPU_GET_ID = 0x20800142
NV0000_CTRL_CMD_GPU_GET_PCI_INFO = 0x21B
# Preemption levers and what they show (qpolicy doctor; docs/levers.md): ctrl2080gr.h,
# ctrl2080fifo.h, ctrla06c.h, ctrla06f/ctrla06fgpfifo.h. GR controls go to a subdevice and name a
# channel (modes) or a TSG (stats) of the same client.
NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE = 0x20801210
NV2080_CTRL_CMD_GR_GET_CTXSW_STATS = 0x20801215
NV2080_CTRL_CMD_GR_GET_CTXSW_MODES = 0x20801235
# The FECS context-switch trace (ctrl2080gr.h, cl90cd.h, cl90cdfecs.h, ctrl90cd.h; read by
# qpolicy.nvrm.fecs): an event buffer the client allocates on memory of its own, bound to GR.
NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2 = 0x20801238
NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS = 0x90CD0101
# ctrl2080tmr.h: the GPU's timer against a CPU clock. PLATFORM_API is the kernel's
# ktime_get_raw (os_get_monotonic_time_ns_hr), CLOCK_MONOTONIC_RAW in user space, read on the CPU.
NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO = 0x20800406
TIMER_CPU_CLK_ID_PLATFORM_API = 0x3
NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET = 0x90CD0102
NV_EVENT_BUFFER = 0x90CD
NV01_MEMORY_DEVICELESS = 0x90CE
NV01_DEVICE_0, NV20_SUBDEVICE_0 = 0x0080, 0x2080
FECS_BIND_LOD_SIMPLE = 1  # NV2080_CTRL_GR_FECS_BIND_EVTBUF_LOD_SIMPLE
FECS_BIND_REASON = {
    0: "none",
    1: "GPU too old",
    2: "not enabled on this GPU",
    3: "not enabled",
    4: "needs admin",
    5: "needs capability",
}
EVENT_BUFFER_KEEP_OLDEST = 1  # NV_EVENT_BUFFER_FLAG_OVERFLOW_POLICY_KEEP_OLDEST
# NV_EVENT_BUFFER_RECORD_TYPE_FECS_CTX_SWITCH_V2 is the record's type; its subtype is 0.
FECS_TAG_SIMPLE_START, FECS_TAG_SIMPLE_END = 0x06, 0x07  # CONTEXT_START, SAVE_END as a user sees
# NVOS32_ATTR_COHERENCY_CACHED (31:29) and NVOS32_ATTR2_PROTECTION_USER_READ_ONLY (22:22): an
# event buffer's memory must be read-only to a user client (event_buffer.c).
NVOS32_ATTR_COHERENCY_CACHED = 1 << 29
NVOS32_ATTR2_PROTECTION_USER_READ_ONLY = 1 << 22
NVOS33_FLAGS_ACCESS_READ_ONLY = 0x1
NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY = 0x20801115
NVA06C_CTRL_CMD_MAKE_REALTIME = 0xA06C0110
NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL = 0xA06F0109
NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL = 0xA06F0110
NVA06F_CTRL_CMD_RESTART_RUNLIST = 0xA06F0111
NVA06F_CTRL_CMD_STOP_CHANNEL = 0xA06F0112
# Memory: what qgpu asks RM about a tenant's objects (ctrl0000client.h, ctrl0041.h) and the
# exports it refuses to a memory-limited cgroup (ctrl0000unix.h).
NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO = 0xD02
NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE = 0xD05
NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES = 0xD07
NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD = 0x3D05
NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD = 0x3D06
NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD = 0x3D0B
NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD = 0x3D0C
NV0041_CTRL_CMD_GET_SURFACE_INFO = 0x410110
# What libcuda asks after each channel and engine object (the shipped H200 trace; CUDA_SEQUENCE.md
# in tools/gpuload): the channels' IDs (ctrl0080fifo.h, two embedded lists), an object's class
# and engine (ctrl906f.h), and the GR context's size (ctrl2080gr.h). All are answered on the host.
NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST = 0x0080170D
NV906F_CTRL_GET_CLASS_ENGINEID = 0x906F0101
NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE = 0x20801218
CHANNELLIST_INVALID_CHANNEL = 0xFFFFFFFF  # NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL
# ctrl2080gpu.h: each unit's ECC state (enabled, scrub complete, supported, then four 64-bit
# error counts), NV2080_CTRL_GPU_ECC_UNIT_COUNT of them, then the poison and uncorrectable flags.
NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS = 0x2080012F
ECC_UNIT_COUNT, ECC_UNIT_SIZE, ECC_STATUS_SIZE = 0x24, 40, 1464
# NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_* (nvos.h) and the answer's ASYNC_PREFER_LOWER bit.
SUBCONTEXT_SYNC, SUBCONTEXT_ASYNC, SUBCONTEXT_SPECIFIED, SUBCONTEXT_PREFER_LOWER = 0, 1, 2, 3
SUBCTXID_PREFER_LOWER_SUCCESS = 1 << 31
HANDLE_INFO_INDEX_PARENT = 1
HANDLE_INFO_INDEX_CLASSID = 2
SURFACE_INFO_INDEX_ATTRS = 1
SURFACE_INFO_INDEX_PHYS_SIZE_LO = 2
SURFACE_INFO_INDEX_PHYS_SIZE_HI = 3
SURFACE_INFO_INDEX_COMPR_COVERAGE = 5
SURFACE_INFO_INDEX_PHYS_SIZE = 7
SURFACE_INFO_INDEX_PHYS_ATTR = 8
SURFACE_INFO_INDEX_ADDR_SPACE_TYPE = 9
# NV2080_CTRL_SET_CTXSW_PREEMPTION_MODE_COMPUTE_*; the flags field says which mode is meant.
PREEMPTION_MODE_WFI, PREEMPTION_MODE_CTA, PREEMPTION_MODE_CILP = 0, 1, 2
PREEMPTION_MODE_COMPUTE = {
    PREEMPTION_MODE_WFI: "WFI",
    PREEMPTION_MODE_CTA: "CTA",
    PREEMPTION_MODE_CILP: "CILP",
}
PREEMPTION_MODE_FLAG_CILP = 0x1
RUNLIST_SCHED_POLICY_DEFAULT = 0
RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED = 1
RUNLIST_SCHED_POLICY_FLAG_RESTORE = 0x1
INTERLEAVE_LEVEL = {0: "LOW", 1: "MEDIUM", 2: "HIGH"}

FIFO_DISABLE_CHANNELS_MAX = 64

_SCHEDULE = Layout(
    "NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS",
    3,
    (("bEnable", 0, "B"), ("bSkipSubmit", 1, "B"), ("bSkipEnable", 2, "B")),
)
_TIMESLICE = Layout("NVA06C_CTRL_TIMESLICE_PARAMS", 8, (("timesliceUs", 0, "Q"),))
NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS = Layout(
    "NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS",
    536,
    (
        ("bDisable", 0, "B"),
        ("numChannels", 4, "I"),
        ("bOnlyDisableScheduling", 8, "B"),
        ("bRewindGpPut", 9, "B"),
        ("pRunlistPreemptEvent", 16, "Q"),
        *((f"hClientList{i}", 24 + 4 * i, "I") for i in range(FIFO_DISABLE_CHANNELS_MAX)),
        *((f"hChannelList{i}", 280 + 4 * i, "I") for i in range(FIFO_DISABLE_CHANNELS_MAX)),
    ),
)

_EXPORT_OBJECT = (
    ("type", 0, "I"),
    ("hDevice", 4, "I"),
    ("hParent", 8, "I"),
    ("hObject", 12, "I"),
)
# The plural export and import (ctrl0000unix.h): handles into and out of the slots
# [index, index + numObjects) of an fd; metadata is 64 bytes, named metadata0..63 here.
EXPORT_OBJECTS_MAX = 512
IMPORT_OBJECTS_MAX = 128
IMPORT_OBJECT_TYPE = {0: "NONE", 1: "VIDMEM", 2: "SYSMEM", 3: "FABRIC", 4: "FABRIC_MC"}
NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS = Layout(
    "NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS",
    2128,
    (
        ("fd", 0, "i"),
        ("hDevice", 4, "I"),
        ("maxObjects", 8, "H"),
        *((f"metadata{i}", 10 + i, "B") for i in range(64)),
        *((f"objects{i}", 76 + 4 * i, "I") for i in range(EXPORT_OBJECTS_MAX)),
        ("numObjects", 2124, "H"),
        ("index", 2126, "H"),
    ),
)
NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS = Layout(
    "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS",
    652,
    (
        ("fd", 0, "i"),
        ("hParent", 4, "I"),
        *((f"objects{i}", 8 + 4 * i, "I") for i in range(IMPORT_OBJECTS_MAX)),
        *((f"objectTypes{i}", 520 + i, "B") for i in range(IMPORT_OBJECTS_MAX)),
        ("numObjects", 648, "H"),
        ("index", 650, "H"),
    ),
)
NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS = Layout(
    "NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS",
    16,
    (("hObject", 0, "I"), ("index", 4, "I"), ("data", 8, "Q")),
)
NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE_PARAMS = Layout(
    "NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE_PARAMS",
    12,
    (("hParent", 0, "I"), ("classId", 4, "I"), ("hObject", 8, "I")),
)
NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS = Layout(
    "NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS",
    12,
    (("hObject1", 0, "I"), ("hObject2", 4, "I"), ("bDuplicates", 8, "B")),
)
NV0041_CTRL_GET_SURFACE_INFO_PARAMS = Layout(
    "NV0041_CTRL_GET_SURFACE_INFO_PARAMS",
    16,
    (("surfaceInfoListSize", 0, "I"), ("surfaceInfoList", 8, "Q")),
)
NV0041_CTRL_SURFACE_INFO = Layout(
    "NV0041_CTRL_SURFACE_INFO", 8, (("index", 0, "I"), ("data", 4, "I"))
)

NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS = Layout(  # ctrl2080gpu.h: one unit's ECC state
    "NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS",
    ECC_UNIT_SIZE,
    (
        ("enabled", 0, "B"),
        ("scrubComplete", 1, "B"),
        ("supported", 2, "B"),
        ("dbe", 8, "Q"),
        ("dbeNonResettable", 16, "Q"),
        ("sbe", 24, "Q"),
        ("sbeNonResettable", 32, "Q"),
    ),
)
# The units' array first (each NV2080_CTRL_GPU_QUERY_ECC_UNIT_STATUS), then these.
NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS = Layout(
    "NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS",
    ECC_STATUS_SIZE,
    (("bFatalPoisonError", 1440, "B"), ("uncorrectableError", 1441, "B"), ("flags", 1444, "I")),
)

CONTROLS: dict[int, Control] = {
    NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: Control("NVA06C_CTRL_CMD_GPFIFO_SCHEDULE", _SCHEDULE),
    0xA06C0102: Control(
        "NVA06C_CTRL_CMD_BIND", Layout("NVA06F_CTRL_BIND_PARAMS", 4, (("engineType", 0, "I"),))
    ),
    NVA06C_CTRL_CMD_SET_TIMESLICE: Control("NVA06C_CTRL_CMD_SET_TIMESLICE", _TIMESLICE),
    NVA06C_CTRL_CMD_GET_TIMESLICE: Control("NVA06C_CTRL_CMD_GET_TIMESLICE", _TIMESLICE),
    NVA06C_CTRL_CMD_PREEMPT: Control(
        "NVA06C_CTRL_CMD_PREEMPT",
        Layout(
            "NVA06C_CTRL_PREEMPT_PARAMS",
            8,
            (("bWait", 0, "B"), ("bManualTimeout", 1, "B"), ("timeoutUs", 4, "I")),
        ),
    ),
    NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL: Control(
        "NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL",
        Layout("NVA06C_CTRL_INTERLEAVE_LEVEL_PARAMS", 4, (("tsgInterleaveLevel", 0, "I"),)),
    ),
    NVA06C_CTRL_CMD_GET_INTERLEAVE_LEVEL: Control(
        "NVA06C_CTRL_CMD_GET_INTERLEAVE_LEVEL",
        Layout("NVA06C_CTRL_INTERLEAVE_LEVEL_PARAMS", 4, (("tsgInterleaveLevel", 0, "I"),)),
    ),
    NVA06F_CTRL_CMD_GPFIFO_SCHEDULE: Control("NVA06F_CTRL_CMD_GPFIFO_SCHEDULE", _SCHEDULE),
    NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: Control(
        "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
        Layout(
            "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
            4,
            (("workSubmitToken", 0, "I"),),
        ),
    ),
    NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS: Control(
        "NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS", NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS
    ),
    NV2080_CTRL_CMD_FIFO_DISABLE_USERMODE_CHANNELS: Control(
        "NV2080_CTRL_CMD_FIFO_DISABLE_USERMODE_CHANNELS",
        Layout("NV2080_CTRL_FIFO_DISABLE_USERMODE_CHANNELS_PARAMS", 1, (("bDisable", 0, "B"),)),
    ),
    NV2080_CTRL_CMD_GPU_GET_ID: Control(
        "NV2080_CTRL_CMD_GPU_GET_ID",
        Layout("NV2080_CTRL_GPU_GET_ID_PARAMS", 4, (("gpuId", 0, "I"),)),
    ),
    NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE: Control(
        "NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE",
        Layout(
            "NV2080_CTRL_GR_SET_CTXSW_PREEMPTION_MODE_PARAMS",
            32,
            (
                ("flags", 0, "I"),
                ("hChannel", 4, "I"),
                ("gfxpPreemptMode", 8, "I"),
                ("cilpPreemptMode", 12, "I"),
                ("grRouteFlags", 16, "I"),
                ("grRoute", 24, "Q"),
            ),
        ),
    ),
    NV2080_CTRL_CMD_GR_GET_CTXSW_STATS: Control(
        "NV2080_CTRL_CMD_GR_GET_CTXSW_STATS",
        Layout(
            "NV2080_CTRL_GR_GET_CTXSW_STATS_PARAMS",
            32,
            (
                ("hChannel", 0, "I"),
                ("flags", 4, "I"),
                ("saveCnt", 8, "I"),
                ("restoreCnt", 12, "I"),
                ("wfiSaveCnt", 16, "I"),
                ("ctaSaveCnt", 20, "I"),
                ("cilpSaveCnt", 24, "I"),
                ("gfxpSaveCnt", 28, "I"),
            ),
        ),
    ),
    NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2: Control(
        "NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2",
        Layout(
            "NV2080_CTRL_GR_FECS_BIND_EVTBUF_FOR_UID_V2_PARAMS",
            24,
            (
                ("hEventBuffer", 0, "I"),
                ("recordSize", 4, "I"),
                ("levelOfDetail", 8, "I"),
                ("eventFilter", 12, "I"),
                ("bAllUsers", 16, "B"),
                ("reasonCode", 20, "I"),
            ),
        ),
    ),
    NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO: Control(
        "NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO",
        Layout(
            "NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS",
            264,  # 16 samples of (cpuTime, gpuTime) from 8; PLATFORM_API fills the first
            (
                ("cpuClkId", 0, "B"),
                ("sampleCount", 1, "B"),
                ("cpuTime", 8, "Q"),
                ("gpuTime", 16, "Q"),
            ),
        ),
    ),
    NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS: Control(
        "NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS",
        Layout(
            "NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS_PARAMS",
            8,
            (("enable", 0, "B"), ("flags", 4, "I")),
        ),
    ),
    NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET: Control(
        "NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET",
        Layout(
            "NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET_PARAMS",
            8,
            (("recordBufferGet", 0, "I"), ("varDataBufferGet", 4, "I")),
        ),
    ),
    NV2080_CTRL_CMD_GR_GET_CTXSW_MODES: Control(
        "NV2080_CTRL_CMD_GR_GET_CTXSW_MODES",
        Layout(
            "NV2080_CTRL_GR_GET_CTXSW_MODES_PARAMS",
            24,
            (
                ("hChannel", 0, "I"),
                ("zcullMode", 4, "I"),
                ("pmMode", 8, "I"),
                ("smpcMode", 12, "I"),
                ("cilpPreemptMode", 16, "I"),
                ("gfxpPreemptMode", 20, "I"),
            ),
        ),
    ),
    NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY: Control(
        "NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY",
        Layout(
            "NV2080_CTRL_FIFO_RUNLIST_SET_SCHED_POLICY_PARAMS",
            8,
            (("flags", 0, "I"), ("schedPolicy", 4, "I")),
        ),
    ),
    NVA06C_CTRL_CMD_MAKE_REALTIME: Control(
        "NVA06C_CTRL_CMD_MAKE_REALTIME",
        Layout("NVA06C_CTRL_MAKE_REALTIME_PARAMS", 1, (("bRealtime", 0, "B"),)),
    ),
    NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL: Control(
        "NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL",
        Layout("NVA06F_CTRL_INTERLEAVE_LEVEL_PARAMS", 4, (("channelInterleaveLevel", 0, "I"),)),
    ),
    NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL: Control(
        "NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL",
        Layout("NVA06F_CTRL_INTERLEAVE_LEVEL_PARAMS", 4, (("channelInterleaveLevel", 0, "I"),)),
    ),
    NVA06F_CTRL_CMD_RESTART_RUNLIST: Control(
        "NVA06F_CTRL_CMD_RESTART_RUNLIST",
        Layout(
            "NVA06F_CTRL_RESTART_RUNLIST_PARAMS",
            2,
            (("bForceRestart", 0, "B"), ("bBypassWait", 1, "B")),
        ),
    ),
    NVA06F_CTRL_CMD_STOP_CHANNEL: Control(
        "NVA06F_CTRL_CMD_STOP_CHANNEL",
        Layout("NVA06F_CTRL_STOP_CHANNEL_PARAMS", 1, (("bImmediate", 0, "B"),)),
    ),
    NV0000_CTRL_CMD_GPU_GET_PCI_INFO: Control(
        "NV0000_CTRL_CMD_GPU_GET_PCI_INFO",
        Layout(
            "NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS",
            12,
            (("gpuId", 0, "I"), ("domain", 4, "I"), ("bus", 8, "H"), ("slot", 10, "H")),
        ),
    ),
    NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO: Control(
        "NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO", NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS
    ),
    NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE: Control(
        "NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE", NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE_PARAMS
    ),
    NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES: Control(
        "NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES",
        NV0000_CTRL_CLIENT_OBJECTS_ARE_DUPLICATES_PARAMS,
    ),
    NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD: Control(
        "NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD",
        Layout(
            "NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS",
            24,
            (*_EXPORT_OBJECT, ("fd", 16, "i"), ("flags", 20, "I")),
        ),
    ),
    NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD: Control(
        "NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD",
        Layout(
            "NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS",
            20,
            (("fd", 0, "i"), *((n, o + 4, f) for n, o, f in _EXPORT_OBJECT)),
        ),
    ),
    NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD: Control(
        "NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD",
        NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS,
    ),
    NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD: Control(
        "NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD",
        NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS,
    ),
    NV0041_CTRL_CMD_GET_SURFACE_INFO: Control(
        "NV0041_CTRL_CMD_GET_SURFACE_INFO", NV0041_CTRL_GET_SURFACE_INFO_PARAMS
    ),
    NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST: Control(
        "NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST",
        Layout(
            "NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS",
            24,
            (("numChannels", 0, "I"), ("pChannelHandleList", 8, "Q"), ("pChannelList", 16, "Q")),
        ),
    ),
    NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: Control(
        "NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS", NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS
    ),
    NV906F_CTRL_GET_CLASS_ENGINEID: Control(
        "NV906F_CTRL_GET_CLASS_ENGINEID",
        Layout(
            "NV906F_CTRL_GET_CLASS_ENGINEID_PARAMS",
            16,
            (
                ("hObject", 0, "I"),
                ("classEngineID", 4, "I"),
                ("classID", 8, "I"),
                ("engineID", 12, "I"),
            ),
        ),
    ),
    NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE: Control(
        "NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE",
        Layout(
            "NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS",
            16,
            (("hChannel", 0, "I"), ("totalBufferSize", 8, "Q")),
        ),
    ),
}

# Controls a tenant may use to change how its own work is scheduled; qpolicy owns these on a
# gated GPU (the kernel module refuses them from tenants: kmod/qgpu/track.c,
# qgpu_scheduling_control, and the verdicts in kmod/qgpu/ioctl.c).
SCHEDULING_CONTROLS = frozenset(
    {
        NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
        NVA06C_CTRL_CMD_SET_TIMESLICE,
        NVA06C_CTRL_CMD_PREEMPT,
        NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL,
        NVA06C_CTRL_CMD_MAKE_REALTIME,
        NVA06F_CTRL_CMD_GPFIFO_SCHEDULE,
        NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL,
        NVA06F_CTRL_CMD_RESTART_RUNLIST,
        NVA06F_CTRL_CMD_STOP_CHANNEL,
        NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
        NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY,
        NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
    }
)


def control_name(cmd: int) -> str:
    if cmd in CONTROLS:
        return CONTROLS[cmd].name
    return f"ctrl 0x{cmd:08x}"


# -- status codes (nvstatuscodes.h) ----------------------------------------------------------------


class NvStatus(IntEnum):
    NV_OK = 0x00
    NV_ERR_ILLEGAL_ACTION = 0x16
    NV_ERR_IN_USE = 0x17
    NV_ERR_INSERT_DUPLICATE_NAME = 0x19
    NV_ERR_INSUFFICIENT_RESOURCES = 0x1A
    NV_ERR_INSUFFICIENT_PERMISSIONS = 0x1B
    NV_ERR_INVALID_ADDRESS = 0x1E
    NV_ERR_INVALID_ARGUMENT = 0x1F
    NV_ERR_INVALID_CHANNEL = 0x21
    NV_ERR_INVALID_CLASS = 0x22
    NV_ERR_INVALID_CLIENT = 0x23
    NV_ERR_INVALID_COMMAND = 0x24
    NV_ERR_INVALID_DEVICE = 0x26
    NV_ERR_INVALID_OBJECT = 0x31
    NV_ERR_INVALID_OBJECT_HANDLE = 0x33
    NV_ERR_INVALID_OBJECT_NEW = 0x34
    NV_ERR_INVALID_OBJECT_OLD = 0x35
    NV_ERR_INVALID_OBJECT_PARENT = 0x36
    NV_ERR_INVALID_OWNER = 0x39
    NV_ERR_INVALID_PARAM_STRUCT = 0x3A
    NV_ERR_INVALID_PARAMETER = 0x3B
    NV_ERR_INVALID_POINTER = 0x3D
    NV_ERR_INVALID_REQUEST = 0x3F
    NV_ERR_INVALID_STATE = 0x40
    NV_ERR_NO_MEMORY = 0x51
    NV_ERR_NOT_SUPPORTED = 0x56
    NV_ERR_OBJECT_NOT_FOUND = 0x57
    NV_ERR_OPERATING_SYSTEM = 0x59
    NV_ERR_OUT_OF_RANGE = 0x5B
    NV_ERR_STATE_IN_USE = 0x63
    NV_ERR_UVM_ADDRESS_IN_USE = 0x68
    NV_ERR_RESOURCE_LOST = 0x6E
    NV_ERR_GENERIC = 0xFFFF


def status_name(status: int) -> str:
    try:
        return NvStatus(status).name
    except ValueError:
        return f"status 0x{status:x}"


# -- nvidia-uvm ioctls (plain numbers, not _IOC-encoded) ------------------------------------------

UVM_IOCTLS: dict[int, str] = {
    0x30000001: "UVM_INITIALIZE",
    0x30000002: "UVM_DEINITIALIZE",
    23: "UVM_CREATE_RANGE_GROUP",
    25: "UVM_REGISTER_GPU_VASPACE",
    26: "UVM_UNREGISTER_GPU_VASPACE",
    27: "UVM_REGISTER_CHANNEL",
    28: "UVM_UNREGISTER_CHANNEL",
    33: "UVM_MAP_EXTERNAL_ALLOCATION",
    34: "UVM_FREE",
    37: "UVM_REGISTER_GPU",
    38: "UVM_UNREGISTER_GPU",
    39: "UVM_PAGEABLE_MEM_ACCESS",
    51: "UVM_MIGRATE",
    65: "UVM_MAP_DYNAMIC_PARALLELISM_REGION",
    66: "UVM_UNMAP_EXTERNAL",
    68: "UVM_ALLOC_SEMAPHORE_POOL",
    70: "UVM_PAGEABLE_MEM_ACCESS_ON_GPU",
    71: "UVM_POPULATE_PAGEABLE",
    72: "UVM_VALIDATE_VA_RANGE",
    73: "UVM_CREATE_EXTERNAL_RANGE",
    74: "UVM_MAP_EXTERNAL_SPARSE",
    75: "UVM_MM_INITIALIZE",
    78: "UVM_ALLOC_DEVICE_P2P",
    79: "UVM_CLEAR_ALL_ACCESS_COUNTERS",
    80: "UVM_DISCARD",
    2047: "UVM_IS_8_SUPPORTED",
}

UVM_INITIALIZE = 0x30000001
UVM_FREE = 34
UVM_ALLOC_SEMAPHORE_POOL = 68
UVM_MAX_GPUS = 256  # uvm_types.h: NV_MAX_DEVICES * UVM_PARENT_ID_MAX_SUB_PROCESSORS

UVM_INITIALIZE_PARAMS = Layout(  # uvm_linux_ioctl.h
    "UVM_INITIALIZE_PARAMS", 16, (("flags", 0, "Q"), ("rmStatus", 8, "I"))
)
UVM_FREE_PARAMS = Layout(  # uvm_ioctl.h
    "UVM_FREE_PARAMS", 24, (("base", 0, "Q"), ("length", 8, "Q"), ("rmStatus", 16, "I"))
)
UVM_GPU_MAPPING_ATTRIBUTES = Layout(  # UvmGpuMappingAttributes, uvm_types.h
    "UvmGpuMappingAttributes",
    36,
    (
        ("gpuMappingType", 16, "I"),
        ("gpuCachingType", 20, "I"),
        ("gpuFormatType", 24, "I"),
        ("gpuElementBits", 28, "I"),
        ("gpuCompressionType", 32, "I"),
    ),
)
UVM_ALLOC_SEMAPHORE_POOL_PARAMS = Layout(  # uvm_ioctl.h
    "UVM_ALLOC_SEMAPHORE_POOL_PARAMS",
    9248,
    (
        ("base", 0, "Q"),
        ("length", 8, "Q"),
        ("gpuAttributesCount", 9232, "Q"),
        ("rmStatus", 9240, "I"),
    ),
)
