"""The probe's kernel/user ABI: ebpf/nvprobe.h and .c against their Python mirror, and events
turned into records."""

import re
import struct
from pathlib import Path

import pytest

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape
from qpolicy.telemetry import wire
from qpolicy.telemetry.wire import ProbeRecord, WireError, decode_event, encode_event

EBPF = Path(__file__).resolve().parents[2] / "ebpf"
C_SIZES = {"__u8": 1, "char": 1, "__u16": 2, "__s16": 2, "__u32": 4, "__s32": 4, "__u64": 8}
C_SIZES["__s64"] = 8
FORMAT_SIZES = {"H": 2, "I": 4, "i": 4, "Q": 8, "q": 8}


def defines(path: Path) -> dict[str, int]:
    found = {}
    for name, value in re.findall(r"^#define (\w+) (\S+)", path.read_text(), re.M):
        try:
            found[name] = int(value, 0)
        except ValueError:
            continue
    return found


def c_struct(text: str, name: str, macros: dict[str, int]) -> list[tuple[str, int, int]]:
    """(field, offset, size) of a struct of fixed-width members, laid out as the C ABI does."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", text, re.S)
    assert body, name
    fields = []
    offset = 0
    members = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    for ctype, field, count in re.findall(r"(\w+) (\w+)(?:\[(\w+)\])?;", members):
        size = C_SIZES[ctype]
        offset = (offset + size - 1) // size * size
        n = 1 if not count else macros.get(count, 0) or int(count)
        fields.append((field, offset, size * n))
        offset += size * n
    return fields


def test_header_matches_the_python_mirror() -> None:
    header = (EBPF / "nvprobe.h").read_text()
    macros = defines(EBPF / "nvprobe.h")
    for name in ("P_BYTES", "Q_BYTES", "PATH_BYTES", "EV_OPEN", "EV_CLOSE", "EV_EXIT", "EV_IOCTL"):
        assert macros[name] == getattr(wire, name), name
    for name in ("META_LOST", "META_MAP_FULL", "META_SLOTS", "NODE_NONE"):
        assert macros[name] == getattr(wire, name), name
    for node, code in wire.NODE_CODES.items():
        assert macros[f"NODE_{node.name}"] == code, node
    assert macros["EV_HEADER_BYTES"] == wire.EV_HEADER_BYTES

    event = c_struct(header, "nv_event", macros)
    names = [field for field, _, _ in event]
    assert names[-3:] == ["p", "q", "s"]
    fixed = event[:-3]
    assert [size for _, _, size in fixed] == [FORMAT_SIZES[c] for c in wire.HEADER.format[1:]]
    chars = wire.HEADER.format.lstrip("<")
    ends = [struct.calcsize("<" + chars[: i + 1]) for i in range(len(chars))]
    assert [offset for _, offset, _ in fixed] == [0, *ends[:-1]]
    p_offset = {f: o for f, o, _ in event}
    assert p_offset["p"] == wire.EV_HEADER_BYTES
    assert p_offset["q"] == wire.EV_HEADER_BYTES + wire.P_BYTES
    assert p_offset["s"] == wire.EV_IOCTL_BYTES

    # The fields probe.counters() reads from the map keys and values.
    assert [f for f, _, _ in c_struct(header, "ioctl_key", macros)] == [
        "cgroup",
        "code",
        "node",
        "by_nr",
        "pad",
    ]
    assert [f for f, _, _ in c_struct(header, "cg_key", macros)] == ["cgroup", "value", "pad"]
    assert [f for f, _, _ in c_struct(header, "cg_stats", macros)] == [
        "ioctls",
        "latency_ns",
        "opens",
        "mmaps",
        "launches",
        "syncs",
        "waiting",
        "polls",
    ]


def test_program_constants_match_the_rm_abi() -> None:
    macros = defines(EBPF / "nvprobe.c")
    assert macros["ESC_RM_ALLOC_MEMORY"] == Escape.RM_ALLOC_MEMORY
    assert macros["ESC_RM_FREE"] == Escape.RM_FREE
    assert macros["ESC_RM_CONTROL"] == Escape.RM_CONTROL
    assert macros["ESC_RM_ALLOC"] == Escape.RM_ALLOC
    assert macros["ESC_RM_DUP_OBJECT"] == Escape.RM_DUP_OBJECT
    assert macros["NVOS21_BYTES"] == abi.NVOS21_SIZE
    assert macros["NVOS64_BYTES"] == abi.NVOS64_SIZE
    assert macros["MINOR_BITS"] == wire.MINOR_BITS
    # The offsets the program reads from the user argument.
    assert {n: o for n, o, _ in abi.NVOS54.fields}["cmd"] == 8
    assert {n: o for n, o, _ in abi.NVOS54.fields}["params"] == 16
    for layout in (abi.NVOS21, abi.NVOS64, abi.NVOS02_WITH_FD):
        assert {n: o for n, o, _ in layout.fields}["hClass"] == 12
    for layout in (abi.NVOS21, abi.NVOS64):
        assert {n: o for n, o, _ in layout.fields}["pAllocParms"] == 16


ALLOC = abi.NVOS64.pack(hRoot=1, hObjectParent=1, hObjectNew=0xA0, hClass=0xA06C, status=0)
RECORDS = [
    ProbeRecord(
        "open", ts=5, tid=11, a1=0o2000002, ret=7, dur_ns=9, s="/dev/nvidiactl",
        pid=10, cgroup=99, major=195, minor=255,
    ),
    ProbeRecord(
        "ioctl", ts=6, tid=12, cmd=0xC030462B, a1=7, a2=0x7FFF0000, a3=0x7FFF1000,
        ret=0, dur_ns=1200, p=ALLOC, q=bytes(range(96)), pid=10, cgroup=99, major=195,
        minor=0,
    ),
    ProbeRecord(
        "ioctl", ts=7, tid=12, cmd=0xC0104629, a1=7, a2=0x10, ret=-25, p=b"\1" * 16,
        pid=10, cgroup=99, major=195, minor=0,
    ),
    ProbeRecord("close", ts=8, tid=11, a1=7, pid=10, cgroup=99, major=195, minor=255),
    ProbeRecord("exit", ts=9, tid=10, pid=10, cgroup=99),
]  # fmt: skip


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_events_become_the_records_they_encode(record: ProbeRecord) -> None:
    raw = encode_event(record)
    expected_size = {"open": wire.EV_OPEN_BYTES, "ioctl": wire.EV_IOCTL_BYTES}
    assert len(raw) == expected_size.get(record.kind, wire.EV_HEADER_BYTES)
    assert decode_event(raw) == record


def test_lengths_in_the_event_bound_p_q_and_the_path() -> None:
    raw = bytearray(encode_event(RECORDS[1]))
    struct.pack_into("<HH", raw, 72, 48, 8)  # plen, qlen
    record = decode_event(bytes(raw))
    assert record.p == ALLOC and record.q == bytes(range(8))
    struct.pack_into("<HH", raw, 72, 999, 999)  # a bad length cannot read past its field
    record = decode_event(bytes(raw))
    assert len(record.p) == wire.P_BYTES and len(record.q) == wire.Q_BYTES


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\0" * 10, "shorter than its header"),
        (struct.pack("<I", 77) + b"\0" * 76, "unknown event type 77"),
        (encode_event(RECORDS[1])[:100], "ioctl event of 100 bytes"),
    ],
)
def test_malformed_events(raw: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_event(raw)


def test_kernel_dev_t() -> None:
    dev = wire.kernel_dev(195, 255)
    assert dev == (195 << 20) | 255
    assert (wire.dev_major(dev), wire.dev_minor(dev)) == (195, 255)
