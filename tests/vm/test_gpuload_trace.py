"""gpuload --tree cuda speaks CUDA's sequence: the RM calls it makes, as the eBPF probe sees them on
nvmock, against those of the real PyTorch process in the shipped H200 trace.

Both sides go through one normaliser (:func:`context_events`): the client that allocates the first
TSG, from its allocation to the first SET_TIMESLICE on that TSG; objects of the context's classes
and the memory its channels name, each renamed by kind and order (``tsg0``, ``channel3``,
``sysmem2``); their allocations with the parameters that say what CUDA asked for, their frees,
and the controls sent to them (device and subdevice controls from the first TSG on, none on the
client). RM_MAP_MEMORY is not in the probe's stream: the mappings are compared as a multiset of
(device file, length), gpuload's read from /proc/PID/maps while it runs. Every difference must
match a row of the "gpuload against the H200 trace" table in kmod/nvmock/CONFORMANCE.md, and
every row must still match a difference (a row left behind by a fix fails too).
"""

from __future__ import annotations

import difflib
import re
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node
from qpolicy.nvrm.decode import Ioctl, decode
from qpolicy.nvrm.records import Record
from qpolicy.nvrm.replay import builtin_records
from qpolicy.telemetry.probe import NvProbe
from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import ROOT

CONFORMANCE = ROOT / "kmod" / "nvmock" / "CONFORMANCE.md"
SECTION = "## gpuload against the H200 trace"
PAGE = 4096

# The classes of a CUDA context's tree, by the name its objects get.
CONTEXT_CLASSES = {
    0x0041: "client", 0x0080: "device", 0x2080: "subdevice", 0xC661: "usermode",
    0x90F1: "vaspace", 0xA06C: "tsg", 0x9067: "ctxshare", 0xC86F: "channel",
    0xCBC0: "compute", 0xC8B5: "copy",
}  # fmt: skip
# Memory is in the context when a channel names it (USERD, ring buffer, error notifier).
MEMORY_CLASSES = {0x0040: "vidmem", 0x003E: "sysmem"}
CHANNEL_MEMORY_FIELDS = ("hObjectError", "hObjectBuffer", "hUserdMemory0")
# The parameters compared per kind: what the caller asked for. Outputs RM writes (a memory's
# address and limit, a work-submit token) differ by design and are left out; handles are renamed.
ALLOC_FIELDS = {
    "device": ("deviceId", "hClientShare", "vaMode"),
    "subdevice": ("subDeviceId",),
    "tsg": ("hObjectError", "hVASpace", "engineType"),
    "ctxshare": ("hVASpace", "flags", "subctxId"),
    "channel": (
        "hObjectError", "hObjectBuffer", "gpFifoOffset", "gpFifoEntries", "flags",
        "hContextShare", "hVASpace", "hUserdMemory0", "userdOffset0",
    ),
    "vidmem": ("owner", "type", "flags", "attr", "attr2", "size", "alignment"),
    "sysmem": ("owner", "type", "flags", "attr", "attr2", "size", "alignment"),
    "compute": ("version", "flags"),
    "copy": ("version", "engineType"),
}  # fmt: skip
# A control's outputs that differ by design (a work-submit token names the channel's ID, which
# is the GPU's), and its embedded lists' addresses (the caller's memory).
CONTROL_OUTPUTS = {"workSubmitToken", "pChannelHandleList", "pChannelList"}
# Engine objects' parameters, which qpolicy's decoder leaves alone: NV_GR_ALLOCATION_PARAMETERS
# (nvos.h; the trace has bytes past its first two words that change with the caller's stack) and
# NVB0B5_ALLOCATION_PARAMETERS (clb0b5sw.h).
ENGINE_PARAMS = {"compute": ("version", "flags"), "copy": ("version", "engineType")}


@dataclass(frozen=True, slots=True)
class Call:
    """One RM ioctl, decoded, with what the fd it went through refers to."""

    node: Node
    ioctl: Ioctl
    ret: int
    inner: bytes


def calls_of(records: Iterable[Record], node_of: Any) -> list[Call]:
    """The RM ioctls of ``records``; ``node_of(record)`` names the file of each."""
    out = []
    for record in records:
        if record.kind != "ioctl":
            continue
        node = node_of(record)
        if node not in (Node.CTL, Node.GPU) or abi.ioc_type(record.cmd) != abi.NV_IOCTL_MAGIC:
            continue
        ioctl = decode(node, record.cmd, record.p, record.q)
        out.append(Call(node, ioctl, record.ret, record.q))
    return out


def trace_calls_and_nodes() -> tuple[list[Call], dict[int, Node]]:
    """The shipped trace's calls, and the node of every fd it opened (last open wins)."""
    nodes: dict[int, Node] = {}
    calls: list[Call] = []
    fd_node_at_map: dict[int, Node] = {}
    for record in builtin_records():
        if record.kind == "open":
            nodes[record.ret] = Node.of_path(record.s)
            continue
        calls.extend(calls_of([record], lambda r: nodes.get(r.fd)))
        if calls and record.kind == "ioctl" and calls[-1].ioctl.escape is Escape.RM_MAP_MEMORY:
            target = calls[-1].ioctl.fields.get("fd", -1)
            fd_node_at_map[len(calls) - 1] = nodes.get(target, Node.OTHER)
    return calls, fd_node_at_map


def engine_params(kind: str, raw: bytes) -> dict[str, int]:
    """The first two words of an engine object's parameters (what the probe and trace hold)."""
    names = ENGINE_PARAMS[kind]
    if len(raw) < 8:
        return {}
    return dict(zip(names, struct.unpack_from("<II", raw), strict=True))


def control_label(cmd: int) -> str:
    return abi.control_name(cmd) if cmd in abi.CONTROLS else "-"


@dataclass
class Context:
    """A context's RM sequence, normalised: ordered events, and its mappings as a multiset."""

    events: list[str]
    maps: Counter[tuple[str, int]]


def context_events(calls: Sequence[Call], map_nodes: dict[int, Node] | None = None) -> Context:
    """Normalise the part of ``calls`` that sets up the first TSG's CUDA context.

    ``map_nodes`` gives, by index in ``calls``, the file each RM_MAP_MEMORY attached its mapping
    to (the trace knows; the probe does not stream maps, so gpuload's come from elsewhere)."""
    ok = [i for i, c in enumerate(calls) if c.ioctl.succeeded(c.ret)]
    first_tsg = next(
        i for i in ok
        if calls[i].ioctl.escape is Escape.RM_ALLOC and calls[i].ioctl.alloc_class == 0xA06C
    )  # fmt: skip
    client = calls[first_tsg].ioctl.fields["hRoot"]
    tsg_handle = calls[first_tsg].ioctl.fields["hObjectNew"]
    start = next(
        i
        for i in ok
        if calls[i].ioctl.escape is Escape.RM_ALLOC
        and calls[i].ioctl.fields["hObjectNew"] == client
    )
    end = next(
        (
            i for i in ok[ok.index(first_tsg):]
            if calls[i].ioctl.control == abi.NVA06C_CTRL_CMD_SET_TIMESLICE
            and calls[i].ioctl.fields.get("hObject") == tsg_handle
        ),
        len(calls) - 1,
    )  # fmt: skip
    window = [calls[i] for i in range(start, end + 1)]

    def owner(call: Call) -> int | None:
        fields = call.ioctl.fields
        if call.ioctl.escape is Escape.RM_ALLOC and fields.get("hObjectNew") == client:
            return client  # the client itself, allocated under no root
        return fields.get("hRoot", fields.get("hClient"))

    named_memory = {
        call.ioctl.params.get(name)
        for call in window
        if call.ioctl.escape is Escape.RM_ALLOC and call.ioctl.alloc_class == 0xC86F
        and owner(call) == client
        for name in CHANNEL_MEMORY_FIELDS
    } - {None, 0}  # fmt: skip

    names: dict[int, str] = {}
    per_kind: Counter[str] = Counter()
    first_gpfifo: list[int] = []

    def name(handle: int) -> str:
        return "0" if handle == 0 else names.get(handle, "other")

    def shown(key: str, value: int, kind: str) -> str:
        if key.startswith("h") or key == "owner":
            return f"{key}={name(value)}"
        if kind == "channel" and key == "gpFifoOffset":
            if not first_gpfifo:
                first_gpfifo.append(value)
            return f"{key}=+0x{value - first_gpfifo[0]:x}"
        return f"{key}=0x{value:x}"

    events: list[str] = []
    maps: Counter[tuple[str, int]] = Counter()
    tsg_seen = False
    for index in range(start, end + 1):
        call = calls[index]
        ioctl, fields = call.ioctl, call.ioctl.fields
        if owner(call) != client:
            continue
        status = ioctl.status
        failed = "" if ioctl.succeeded(call.ret) else f" FAILED {abi.status_name(status or 0)}"
        if ioctl.escape is Escape.RM_ALLOC:
            cls = ioctl.alloc_class or 0
            new = fields["hObjectNew"]
            kind = CONTEXT_CLASSES.get(cls)
            if kind is None and cls in MEMORY_CLASSES and new in named_memory:
                kind = MEMORY_CLASSES[cls]
            if kind is None:
                continue
            tsg_seen = tsg_seen or kind == "tsg"
            if not failed:
                names[new] = f"{kind}{per_kind[kind]}"
                per_kind[kind] += 1
            values = dict(ioctl.params)
            if kind in ENGINE_PARAMS and fields.get("pAllocParms"):
                values = engine_params(kind, call.inner)
            params = [shown(k, values[k], kind) for k in ALLOC_FIELDS.get(kind, ()) if k in values]
            if kind not in ALLOC_FIELDS and fields.get("pAllocParms"):
                params.append("params")
            parent = name(fields["hObjectParent"]) if kind != "client" else "-"
            events.append(
                " ".join([f"ALLOC {kind}", f"0x{cls:04x}", f"parent={parent}", *params]) + failed
            )
        elif ioctl.escape is Escape.RM_FREE:
            old = fields["hObjectOld"]
            if old in names:
                events.append(f"FREE {names[old]}{failed}")
        elif ioctl.escape is Escape.RM_CONTROL:
            target = fields["hObject"]
            kind_of = names.get(target, "")
            if target not in names or kind_of.startswith("client"):
                continue
            if kind_of.startswith(("device", "subdevice")) and not tsg_seen:
                continue  # CUDA's device discovery before the context: out of scope
            cmd = fields["cmd"]
            params = [shown(k, v, "") for k, v in ioctl.params.items() if k not in CONTROL_OUTPUTS]
            head = [f"CTRL 0x{cmd:08x}", control_label(cmd), f"on={name(target)}"]
            events.append(" ".join([*head, *params]) + failed)
        elif (
            ioctl.escape is Escape.RM_MAP_MEMORY
            and map_nodes is not None
            and fields["hMemory"] in names
            and not failed
        ):
            node = map_nodes.get(index, Node.OTHER)
            maps[(node.value, -(-fields["length"] // PAGE) * PAGE)] += 1
    return Context(events, maps)


def trace_context() -> Context:
    calls, map_nodes = trace_calls_and_nodes()
    return context_events(calls, map_nodes)


# -- the explained differences ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    pattern: str
    why: str


def explained_rows(text: str) -> list[Row]:
    """The rows of CONFORMANCE.md's section on gpuload: a pattern in backticks, then why."""
    start = text.index(SECTION)
    following = text.find("\n## ", start + len(SECTION))
    section = text[start : following if following != -1 else len(text)]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        rows.append(Row(cells[0].strip("`"), cells[2]))
    return rows


def differences(expected: Context, got: Context) -> list[str]:
    """``missing: EVENT`` (in the trace, not from gpuload) and ``extra: EVENT``, in order;
    a reordered call is one of each. Mappings: ``missing map: NODE LEN`` and ``extra map: ...``."""
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, expected.events, got.events, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        out.extend(f"missing: {event}" for event in expected.events[i1:i2])
        out.extend(f"extra: {event}" for event in got.events[j1:j2])
    for (node, length), count in sorted((expected.maps - got.maps).items()):
        out.extend([f"missing map: {node} 0x{length:x}"] * count)
    for (node, length), count in sorted((got.maps - expected.maps).items()):
        out.extend([f"extra map: {node} 0x{length:x}"] * count)
    return out


def unexplained(diffs: Sequence[str], rows: Sequence[Row]) -> tuple[list[str], list[Row]]:
    """Differences no row explains, and rows that explain nothing."""
    loose = [diff for diff in diffs if not any(fnmatchcase(diff, row.pattern) for row in rows)]
    stale = [row for row in rows if not any(fnmatchcase(diff, row.pattern) for diff in diffs)]
    return loose, stale


# -- gpuload, seen from outside ---------------------------------------------------------------


class _ContextProbe(NvProbe):
    """The telemetry probe, also streaming the controls a CUDA context sends."""

    def __init__(self, controls: Iterable[int]) -> None:
        super().__init__(libcuda=None)
        self._extra_controls = sorted(set(controls))

    def _fill_maps(self, bpf: Any) -> None:
        super()._fill_maps(bpf)
        streamed = bpf[b"stream_controls"]
        for cmd in self._extra_controls:
            streamed[streamed.Key(cmd)] = streamed.Leaf(1)


MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s+(/dev/nvidia(?:ctl|\d+))$")


def device_maps(pid: int) -> Counter[tuple[str, int]]:
    maps: Counter[tuple[str, int]] = Counter()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        match = MAPS_LINE.match(line)
        if match:
            node = Node.of_path(match[3])
            maps[(node.value, int(match[2], 16) - int(match[1], 16))] += 1
    return maps


def trace_controls(context: Context) -> set[int]:
    return {int(event.split()[1], 16) for event in context.events if event.startswith("CTRL")}


def gpuload_context(args: Sequence[str], controls: Iterable[int]) -> Context:
    probe = _ContextProbe(controls).start()
    try:
        load = Gpuload(["--tree", "cuda", "--seconds", "1", *args]).ready()
        maps = device_maps(load.pid)
        load.result()
        records = []
        quiet = 0
        while quiet < 3:
            batch = probe.poll(200)
            records.extend(batch)
            quiet = 0 if batch else quiet + 1
        assert probe.lost == 0
    finally:
        probe.close()

    def node_of(record: Any) -> Node:
        return Node.CTL if record.minor == abi.NV_CTL_MINOR else Node.GPU

    mine = [r for r in records if r.pid == load.pid]
    context = context_events(calls_of(sorted(mine, key=lambda r: r.ts), node_of))
    context.maps = maps
    return context


def test_gpuload_speaks_the_h200_traces_sequence() -> None:
    expected = trace_context()
    got = gpuload_context([], trace_controls(expected))
    # Not vacuous: both sides hold the context (a TSG, its channels, their tokens).
    assert sum(e.startswith("ALLOC channel") for e in got.events) >= 20, got.events
    diffs = differences(expected, got)
    rows = explained_rows(CONFORMANCE.read_text())
    loose, stale = unexplained(diffs, rows)
    report = "\n".join(
        ["unexplained differences (gpuload vs the H200 trace):", *loose,
         "rows that explain nothing:", *(row.pattern for row in stale)]
    )  # fmt: skip
    assert not loose and not stale, report


def test_the_comparison_fails_on_an_unexplained_difference() -> None:
    """A gpuload that skipped GPFIFO_SCHEDULE on a TSG, or a table missing a row, fails."""
    expected = trace_context()
    rows = explained_rows(CONFORMANCE.read_text())
    assert rows, "no explained-difference rows parsed"
    dropped = Context(
        [e for e in expected.events if not e.startswith("CTRL 0xa06c0101")][:], expected.maps
    )
    loose, _ = unexplained(differences(expected, dropped), rows)
    assert any("0xa06c0101" in diff for diff in loose), loose
    reordered = Context(list(expected.events), expected.maps)
    channel = next(i for i, e in enumerate(reordered.events) if e.startswith("ALLOC channel"))
    reordered.events.insert(0, reordered.events.pop(channel))
    loose, _ = unexplained(differences(expected, reordered), rows)
    assert any("ALLOC channel" in diff for diff in loose), loose
