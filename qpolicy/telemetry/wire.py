"""The probe's kernel/user ABI: mirror of ``ebpf/nvprobe.h``, and its events as trace records.

The BPF side streams ``struct nv_event`` (only as much of it as the event type needs) and keeps
counters in maps keyed by ``struct ioctl_key`` / ``struct cg_key``. Events become the same
:class:`~qpolicy.nvrm.records.Record` a recorded trace holds, so the one decoder and tracker serve
both; the probe adds the device number the fd refers to. A test parses the header and checks
that these numbers agree with it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from qpolicy.errors import QPolicyError
from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.records import Record

NODE_NONE = 0
NODE_CODES: dict[Node, int] = {
    Node.CTL: 1,
    Node.GPU: 2,
    Node.UVM: 3,
    Node.MODESET: 4,
    Node.CAPS: 5,
    Node.OTHER: 6,
}
NODES_BY_CODE = {code: node for node, code in NODE_CODES.items()}

EV_OPEN = 1
EV_CLOSE = 2
EV_EXIT = 3
EV_IOCTL = 4

P_BYTES = 64
Q_BYTES = 96
PATH_BYTES = 256

META_LOST = 0
META_MAP_FULL = 1
META_SLOTS = 4

# struct nv_event up to p: type pid tid dev ts cgroup ret dur_ns cmd fd arg inner plen qlen slen pad
HEADER = struct.Struct("<IIIIQQqQIiQQHHHH")
EV_HEADER_BYTES = HEADER.size
EV_IOCTL_BYTES = EV_HEADER_BYTES + P_BYTES + Q_BYTES
EV_OPEN_BYTES = EV_IOCTL_BYTES + PATH_BYTES

MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor (include/linux/kdev_t.h)
MINOR_MASK = (1 << MINOR_BITS) - 1


def kernel_dev(major: int, minor: int) -> int:
    return (major << MINOR_BITS) | minor


def dev_major(dev: int) -> int:
    return dev >> MINOR_BITS


def dev_minor(dev: int) -> int:
    return dev & MINOR_MASK


class WireError(QPolicyError):
    """An event from the kernel that does not have the layout nvprobe.h describes."""


@dataclass(frozen=True, slots=True)
class ProbeRecord(Record):
    """A record as the probe saw it: also which device the fd refers to (0:0 for exits)."""

    major: int = 0
    minor: int = 0


_KINDS = {EV_OPEN: "open", EV_CLOSE: "close", EV_EXIT: "exit", EV_IOCTL: "ioctl"}
_MIN_BYTES = {
    EV_OPEN: EV_OPEN_BYTES,
    EV_CLOSE: EV_HEADER_BYTES,
    EV_EXIT: EV_HEADER_BYTES,
    EV_IOCTL: EV_IOCTL_BYTES,
}


def decode_event(raw: bytes) -> ProbeRecord:
    """One ``struct nv_event`` (as much of it as its type sends) as a record."""
    if len(raw) < EV_HEADER_BYTES:
        raise WireError(f"event of {len(raw)} bytes is shorter than its header")
    (
        ev_type,
        pid,
        tid,
        dev,
        ts,
        cgroup,
        ret,
        dur_ns,
        cmd,
        fd,
        arg,
        inner,
        plen,
        qlen,
        slen,
        _pad,
    ) = HEADER.unpack_from(raw)
    kind = _KINDS.get(ev_type)
    if kind is None:
        raise WireError(f"unknown event type {ev_type}")
    if len(raw) < _MIN_BYTES[ev_type]:
        raise WireError(f"{kind} event of {len(raw)} bytes, expected {_MIN_BYTES[ev_type]}")
    common = {
        "ts": ts,
        "tid": tid,
        "pid": pid,
        "cgroup": cgroup,
        "major": dev_major(dev),
        "minor": dev_minor(dev),
    }
    if ev_type == EV_OPEN:
        start = EV_IOCTL_BYTES
        path = raw[start : start + min(slen, PATH_BYTES)].decode("utf-8", "replace")
        return ProbeRecord("open", a1=arg, ret=fd, dur_ns=dur_ns, s=path, **common)
    if ev_type == EV_CLOSE:
        return ProbeRecord("close", a1=fd, **common)
    if ev_type == EV_EXIT:
        return ProbeRecord("exit", **common)
    p = raw[EV_HEADER_BYTES : EV_HEADER_BYTES + min(plen, P_BYTES)]
    q_start = EV_HEADER_BYTES + P_BYTES
    q = raw[q_start : q_start + min(qlen, Q_BYTES)]
    return ProbeRecord(
        "ioctl",
        cmd=cmd,
        a1=fd,
        a2=arg,
        a3=inner,
        ret=ret,
        dur_ns=dur_ns,
        p=bytes(p),
        q=bytes(q),
        **common,
    )


def encode_event(record: ProbeRecord) -> bytes:
    """The bytes the kernel would send for ``record``: for tests of the decoding."""
    ev_type = next(code for code, kind in _KINDS.items() if kind == record.kind)
    fd = record.ret if record.kind == "open" else record.a1
    arg = record.a1 if record.kind == "open" else record.a2
    path = record.s.encode()[: PATH_BYTES - 1]
    header = HEADER.pack(
        ev_type,
        record.pid or 0,
        record.tid,
        kernel_dev(record.major, record.minor),
        record.ts,
        record.cgroup or 0,
        record.ret,
        record.dur_ns,
        record.cmd,
        fd if record.kind != "exit" else -1,
        arg if record.kind in ("open", "ioctl") else 0,
        record.a3,
        len(record.p),
        len(record.q),
        len(path),
        0,
    )
    body = record.p.ljust(P_BYTES, b"\0") + record.q.ljust(Q_BYTES, b"\0")
    size = {EV_OPEN: EV_OPEN_BYTES, EV_IOCTL: EV_IOCTL_BYTES}.get(ev_type, EV_HEADER_BYTES)
    return (header + body + path.ljust(PATH_BYTES, b"\0"))[:size]
