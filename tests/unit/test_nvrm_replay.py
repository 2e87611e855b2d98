"""Replay of the real H200 trace, checked against a decoder written here from the ABI notes.

The reference below shares no code with qpolicy.nvrm: it unpacks the structs itself (offsets from
docs/driver-abi.md), keeps its own handle table and walks its own parent links. If the two
disagree on a single object or byte, the test says where.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pytest

from qpolicy.nvrm.replay import BUILTIN_TRACE, replay, replay_lines


def trace_lines() -> list[str]:
    data = resources.files("qpolicy.nvrm").joinpath(f"data/{BUILTIN_TRACE}.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        return text.readlines()


@dataclass
class Reference:
    """What the trace says, decoded by hand."""

    live: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    device_bytes: int = 0
    device_peak: int = 0
    nv_ioctls: int = 0
    other_ioctls: int = 0
    escapes: Counter[int] = field(default_factory=Counter)
    slowest_ns: int = 0

    def count(self, cls: int) -> int:
        return sum(1 for c, _, _ in self.live.values() if c == cls)


VIDMEM, TSG, HOPPER_CHANNEL, HOPPER_COMPUTE, HOPPER_COPY, CLIENT = (
    0x40,
    0xA06C,
    0xC86F,
    0xCBC0,
    0xC8B5,
    0x41,
)


def reference(lines: list[str]) -> Reference:
    ref = Reference()
    nvidia_fds: set[int] = set()
    for line in lines:
        rec: dict[str, Any] = json.loads(line)
        if rec["kind"] == "open" and rec["ret"] >= 0:
            nvidia_fds.add(rec["ret"])
        if rec["kind"] != "ioctl":
            continue
        if rec["a1"] not in nvidia_fds:
            ref.other_ioctls += 1
            continue
        ref.nv_ioctls += 1
        ref.slowest_ns = max(ref.slowest_ns, rec["dur_ns"])
        cmd = rec["cmd"]
        if (cmd >> 8) & 0xFF != ord("F"):
            continue
        nr, size = cmd & 0xFF, (cmd >> 16) & 0x3FFF
        ref.escapes[nr] += 1
        p, q = bytes.fromhex(rec["p"]), bytes.fromhex(rec["q"])
        if nr == 0x2B and size == 48 and rec["ret"] == 0:  # RM_ALLOC, NVOS64
            root, parent, new, cls = struct.unpack_from("<4I", p)
            if struct.unpack_from("<I", p, 40)[0] != 0:
                continue
            client = new if cls == CLIENT else root
            key = (client, new)
            if key in ref.live:
                free(ref, client, new)
            size_bytes = struct.unpack_from("<Q", q, 64)[0] if cls == VIDMEM else 0
            ref.live[key] = (cls, parent, size_bytes)
            ref.device_bytes += size_bytes
            ref.device_peak = max(ref.device_peak, ref.device_bytes)
        elif nr == 0x29 and rec["ret"] == 0:  # RM_FREE
            root, _, old, status = struct.unpack_from("<4I", p)
            if status == 0:
                free(ref, root, old)
    return ref


def free(ref: Reference, client: int, handle: int) -> None:
    doomed = {handle}
    changed = True
    while changed:
        changed = False
        for (c, h), (_, parent, _) in ref.live.items():
            if c == client and parent in doomed and h not in doomed and h != client:
                doomed.add(h)
                changed = True
    if handle == client:
        doomed |= {h for c, h in ref.live if c == client}
    for h in doomed:
        gone = ref.live.pop((client, h), None)
        if gone is not None:
            ref.device_bytes -= gone[2]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return trace_lines()


@pytest.fixture(scope="module")
def expected(lines: list[str]) -> Reference:
    return reference(lines)


def test_replay_finds_exactly_the_objects_and_bytes_of_the_reference(
    lines: list[str], expected: Reference
) -> None:
    result = replay_lines(io.StringIO("".join(lines)), "trace")
    assert result.malformed == 0 and result.records == len(lines)
    (proc,) = result.processes
    assert proc.tsgs == expected.count(TSG)
    assert proc.channels == {"HOPPER_CHANNEL_GPFIFO_A": expected.count(HOPPER_CHANNEL)}
    assert proc.engines == {
        "HOPPER_COMPUTE_A": expected.count(HOPPER_COMPUTE),
        "HOPPER_DMA_COPY_A": expected.count(HOPPER_COPY),
    }
    assert proc.clients == len({c for c, _ in expected.live})
    assert proc.device_bytes == expected.device_bytes
    assert proc.device_peak == expected.device_peak
    assert proc.ioctls == expected.nv_ioctls
    assert proc.other_ioctls == expected.other_ioctls
    assert proc.escapes["RM_ALLOC"] == expected.escapes[0x2B]
    assert proc.escapes["RM_CONTROL"] == expected.escapes[0x2A]
    assert proc.escapes["RM_FREE"] == expected.escapes[0x29]
    assert proc.slowest[0].dur_ns == expected.slowest_ns


def test_the_reference_matches_what_the_h200_findings_describe(expected: Reference) -> None:
    # docs/gpu-measurements.md §1: TSG x4 per process, Hopper channel x20, one 1 GB alloc freed
    # again.
    assert expected.count(TSG) == 4
    assert expected.count(HOPPER_CHANNEL) == 20
    assert expected.nv_ioctls + expected.other_ioctls == 1864
    assert expected.device_peak - expected.device_bytes >= 10**9 - 2**27


def test_replay_by_name_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from qpolicy.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["trace", "--replay", BUILTIN_TRACE, "--json"])
    assert exited.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    proc = doc["processes"][0]
    assert proc["tsgs"] == 4 and proc["channel_count"] == 20
    assert doc["malformed"] == {"count": 0, "examples": []}
    assert [slow["dur_ns"] for slow in proc["slowest"]] == sorted(
        (slow["dur_ns"] for slow in proc["slowest"]), reverse=True
    )


def test_malformed_and_truncated_lines_are_counted_not_fatal(
    lines: list[str], expected: Reference
) -> None:
    damaged = list(lines)
    garbage = [
        "not json at all\n",
        lines[100][: len(lines[100]) // 2] + "\n",  # truncated mid-record
        '{"kind": "ioctl", "tid": 1}\n',  # no ts
        '{"kind": "teleport", "ts": 1, "tid": 1}\n',
        '{"kind": "ioctl", "ts": 1, "tid": 1, "p": "zz"}\n',
        '{"kind": "ioctl", "ts": "soon", "tid": 1}\n',
        "[1, 2, 3]\n",
    ]
    for offset, bad in enumerate(garbage):
        damaged.insert(50 + 10 * offset, bad)
    result = replay_lines(io.StringIO("".join(damaged)), "damaged")
    assert result.malformed == len(garbage)
    assert result.records == len(lines)
    assert {bad.line for bad in result.malformed_examples} == {
        50 + 10 * offset + 1 for offset in range(len(garbage))
    }
    (proc,) = result.processes
    assert proc.tsgs == expected.count(TSG) and proc.device_bytes == expected.device_bytes


def test_a_trace_cut_off_mid_line_still_reports(lines: list[str]) -> None:
    text = "".join(lines)
    cut = text[: len(text) // 2]
    result = replay_lines(io.StringIO(cut), "cut")
    assert result.malformed <= 1
    assert result.records == cut.count("\n")


def test_missing_trace_file_is_a_clean_error(tmp_path: Any) -> None:
    from qpolicy.errors import ValidationError

    with pytest.raises(ValidationError, match="cannot read trace"):
        replay(str(tmp_path / "nope.jsonl"))
