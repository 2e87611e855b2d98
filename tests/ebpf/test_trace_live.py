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

from .conftest import ROOT, Cgroup, CgroupMap, Workload
from .test_probe import sequence

Spawn = Callable[[Cgroup, list[dict[str, Any]]], Workload]
MakeCgroup = Callable[[], Cgroup]


def start_trace(*args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "qpolicy", "trace", "--device", "1:7=ctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "160"},  # rich's width off a terminal: paths unfolded
    )
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
