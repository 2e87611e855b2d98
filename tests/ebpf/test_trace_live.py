"""``qpolicy trace`` live, as a script runs it: JSON lines, the cgroup filter, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qpolicy.nvrm import abi

from .conftest import ROOT, Cgroup, CgroupMap, Workload
from .test_probe import RM_CONTROL, control, sequence

Spawn = Callable[[Cgroup, list[dict[str, Any]]], Workload]
MakeCgroup = Callable[[], Cgroup]


def start_trace(*args: str) -> subprocess.Popen[str]:
    return wait_banner(launch_trace(*args))


def launch_trace(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "qpolicy", "trace", "--device", "1:7=ctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "160"},  # rich's width off a terminal: paths unfolded
    )


def wait_banner(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
    assert process.stderr is not None
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen.append(line)
        if "Hit Ctrl-C to end." in line:
            return process
        if not line:
            break
    process.kill()
    raise AssertionError(f"qpolicy trace did not start: {''.join(seen)}")


def test_json_lines_carry_the_counts_of_the_cgroup_and_its_descendants(
    make_cgroup: MakeCgroup,
    spawn: Spawn,
    cgroup_map: CgroupMap,
    fake_libcuda: Path,
) -> None:
    kept, other = make_cgroup(), make_cgroup()
    below = kept.child("pod", cgroup_map)
    steps_kept, expected_kept = sequence(1)
    steps_below, expected_below = sequence(2)
    launches = [{"launch": "cuLaunchKernel", "lib": str(fake_libcuda), "times": 25}]
    trace = start_trace(
        "--json",
        "--interval",
        "0.5",
        "--duration",
        "5",
        "--cgroup",
        kept.rel + "/",
        "--libcuda",
        str(fake_libcuda),
    )
    workloads = [
        spawn(kept, steps_kept),
        spawn(below, steps_below + launches),
        spawn(other, steps_kept),
    ]
    for workload in workloads:
        workload.go()
    for workload in workloads:
        workload.report()
    out, err = trace.communicate(timeout=30)
    assert trace.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) >= 8  # every 0.5 s for 5 s, nothing else on stdout
    for line in lines:
        assert set(line) == {"ts", "interval_s", "records", "lost_events", "cgroups"}
        assert {row["cgroup"] for row in line["cgroups"]} <= {kept.rel, below.rel}
    last = {row["cgroup"]: row for row in lines[-1]["cgroups"]}
    assert set(last) == {kept.rel, below.rel}
    for rel, expected, launched in ((kept.rel, expected_kept, 0), (below.rel, expected_below, 25)):
        row = last[rel]
        # /dev/zero is not watched by this run: no UVM calls, one open fewer, one mmap fewer.
        escapes = {k: v for k, v in expected["escapes"].items() if not k.startswith("UVM_")}
        assert row["escapes"] == escapes
        assert row["ioctls"] == sum(escapes.values())
        assert row["controls"] == expected["controls"]
        assert row["allocs"] == expected["allocs"]
        assert (row["opens"], row["mmaps"]) == (1, 1)
        assert row["launches"] == launched
        assert row["processes"] == 0  # they exited
        assert (row["tsgs"], row["channels"], row["device_bytes"]) == (0, 0, 0)
    # The rates add up to the totals over the intervals.
    total = sum(
        row["ioctls_per_s"] * line["interval_s"]
        for line in lines
        for row in line["cgroups"]
        if row["cgroup"] == kept.rel
    )
    assert abs(total - last[kept.rel]["ioctls"]) < 0.5


def test_ctrl_c_stops_cleanly_after_a_last_line(make_cgroup: MakeCgroup, spawn: Spawn) -> None:
    cgroup = make_cgroup()
    trace = start_trace("--json", "--cgroup", cgroup.rel, "--libcuda", "none")
    steps, expected = sequence(1)
    workload = spawn(cgroup, steps)
    workload.go()
    workload.report()
    time.sleep(0.3)
    trace.send_signal(signal.SIGINT)
    out, err = trace.communicate(timeout=30)
    assert trace.returncode == 0, err
    last = json.loads(out.splitlines()[-1])
    (row,) = last["cgroups"]
    assert row["cgroup"] == cgroup.rel
    assert row["escapes"]["RM_CONTROL"] == expected["escapes"]["RM_CONTROL"]


def test_ctrl_c_at_any_moment_ends_the_trace_with_status_0(
    make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    """Ctrl-C, and Ctrl-C again while the trace stops, at varied moments after the banner.

    A streamed record per ioctl, as fast as a process can ask, keeps the trace busy: it is often
    inside bcc's ring buffer callback when a signal lands. A KeyboardInterrupt raised there was
    dropped by ctypes ("Exception ignored on calling ctypes callback function") and the trace
    went on until killed; one raised during the last snapshot or the probe's cleanup aborted it
    with status 1."""
    cgroup = make_cgroup()
    steps: list[dict[str, Any]] = [
        {"open": "/dev/full", "as": "ctl"},
        {"say": "flooding"},
        {
            "forever": [
                {
                    "ioctl": "ctl",
                    "cmd": RM_CONTROL,
                    "arg": control(abi.NVA06C_CTRL_CMD_SET_TIMESLICE),  # streamed
                    "times": 1000,
                }
            ]
        },
    ]
    firsts = [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8]
    again = [0.0, 0.005, 0.05, 0.3, 0.7]  # after the first: while it stops and detaches
    args = ("--json", "--interval", "0.2", "--cgroup", cgroup.rel, "--libcuda", "none")
    for round_ in range(2):
        traces = [wait_banner(trace) for trace in [launch_trace(*args) for _ in firsts[::2]]]
        mine = firsts[round_::2]
        flood = spawn(cgroup, steps)  # once they are loaded: loading them is slow enough
        flood.go()
        flood.wait_line("flooding")
        begun = time.monotonic()
        signals = sorted(
            (first + later, i) for i, first in enumerate(mine) for later in again
        )  # fmt: skip
        for at, i in signals:
            time.sleep(max(0.0, begun + at - time.monotonic()))
            traces[i].send_signal(signal.SIGINT)  # nothing once it has been waited for
        for trace, first in zip(traces, mine, strict=True):
            try:
                out, err = trace.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                for other in traces:
                    other.kill()
                    other.communicate()
                raise AssertionError(f"Ctrl-C from {first} s after the banner was lost") from None
            assert trace.returncode == 0, (first, err)
            assert "Traceback" not in err and "Exception ignored" not in err, (first, err)
            lines = [json.loads(line) for line in out.splitlines()]
            assert lines, first  # at least the last snapshot
            (row,) = lines[-1]["cgroups"]
            assert row["cgroup"] == cgroup.rel and row["ioctls"] > 0
        flood.process.kill()


def test_table_output(make_cgroup: MakeCgroup, spawn: Spawn) -> None:
    cgroup = make_cgroup()
    trace = start_trace("--duration", "2", "--cgroup", cgroup.rel, "--libcuda", "none")
    workload = spawn(cgroup, sequence(1)[0])
    workload.go()
    workload.report()
    out, err = trace.communicate(timeout=30)
    assert trace.returncode == 0, err
    assert "NVIDIA driver traffic per cgroup" in out
    assert cgroup.rel in out


def test_smoke_under_timeout_sigint() -> None:
    """bcc's tool smoke test: run it under `timeout -s INT` and accept 0 or 124."""
    done = subprocess.run(
        ["timeout", "-s", "INT", "8", sys.executable, "-m", "qpolicy", "trace", "--json",
         "--device", "1:7=ctl", "--libcuda", "none"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode in (0, 124), done.stderr
    assert "Hit Ctrl-C to end." in done.stderr
    assert all(json.loads(line)["cgroups"] is not None for line in done.stdout.splitlines())
