"""Host eBPF tier: the real probe on the running kernel, driven by real processes.

No NVIDIA device here: the probe's test-only device filter makes /dev/full (1:7) stand for
/dev/nvidiactl and /dev/zero (1:5) for /dev/nvidia-uvm. Both answer every RM request with ENOTTY,
which exercises everything up to the driver's answer; success paths are tested with synthetic
records in the unit tier. Each workload runs in a fresh cgroup v2 of its own, entered before it
starts, so counts can be asserted exactly while the rest of the machine goes on.

Skipped when not root. As root a probe that does not load is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.devices import DeviceFilter
from qpolicy.telemetry.probe import NvProbe
from qpolicy.telemetry.wire import ProbeRecord

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("workload.py")
TEST_DEVICES = ("1:7=ctl", "1:5=uvm")

FAKE_LIBCUDA_C = r"""
/* Launch entry points with libcuda's names; each does a little distinct work so that no two
 * share an address, except cuLaunchKernelEx_ptsz, an alias of cuLaunchKernelEx (the probe must
 * count one call once, not once per name). Built for CET, so each starts with endbr64, which
 * the probe steps over. */
volatile int calls[12];
__attribute__((noinline)) int cuLaunchKernel(void) { calls[0]++; return 0; }
__attribute__((noinline)) int cuLaunchKernel_ptsz(void) { calls[1]++; return 0; }
__attribute__((noinline)) int cuLaunchKernelEx(void) { calls[2]++; return 0; }
int cuLaunchKernelEx_ptsz(void) __attribute__((alias("cuLaunchKernelEx")));
__attribute__((noinline)) int cuGraphLaunch(void) { calls[3]++; return 0; }
__attribute__((noinline)) int cuMemAlloc(void) { calls[4]++; return 0; }
/* Synchronize calls: the stream's waits 0.4 s, as for a long kernel; the context's returns; the
 * event's calls the context's, then waits 0.4 s (one call inside another: one wait). */
int usleep(unsigned int usec);
__attribute__((noinline)) int cuStreamSynchronize(void) { calls[5]++; usleep(400000); return 0; }
__attribute__((noinline)) int cuCtxSynchronize(void) { calls[6]++; return 0; }
__attribute__((noinline)) int cuEventSynchronize(void)
{
	calls[7]++;
	cuCtxSynchronize();
	usleep(400000);
	return 0;
}
/* Query calls: the stream's answers CUDA_ERROR_NOT_READY (600) five times, then done; the
 * event's is always done. */
__attribute__((noinline)) int cuStreamQuery(void) { return ++calls[8] <= 5 ? 600 : 0; }
__attribute__((noinline)) int cuEventQuery(void) { calls[9]++; return 0; }
/* Copies: the synchronous one waits 0.4 s, as behind a long kernel; the Async one returns. */
__attribute__((noinline)) int cuMemcpyDtoH_v2(void) { calls[10]++; usleep(400000); return 0; }
__attribute__((noinline)) int cuMemcpyDtoHAsync_v2(void) { calls[11]++; return 0; }
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF probe needs root")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.ebpf)
            item.add_marker(needs_root)


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("libcuda")
    source = directory / "fake_libcuda.c"
    source.write_text(FAKE_LIBCUDA_C)
    library = directory / "libcuda.so.1"
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to build the fake libcuda (tools/setup-ebpf.sh installs it)"
    subprocess.run(
        [gcc, "-O1", "-fcf-protection=full", "-shared", "-fPIC", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
    )
    return library


@pytest.fixture(scope="session")
def probe(fake_libcuda: Path) -> Iterator[NvProbe]:
    with NvProbe(
        DeviceFilter.parse(TEST_DEVICES), libcuda=fake_libcuda, buffer_pages=1024
    ) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def cgroup_map() -> CgroupMap:
    return CgroupMap()


@dataclass
class Cgroup:
    path: Path  # in the v2 mount
    rel: str  # relative to the v2 root, as the probe's users see it
    id: int

    def child(self, name: str, cgroups: CgroupMap) -> Cgroup:
        path = self.path / name
        path.mkdir()
        return Cgroup(path, f"{self.rel}/{name}", cgroups.id_of(f"{self.rel}/{name}"))


@pytest.fixture
def make_cgroup(cgroup_map: CgroupMap) -> Iterator[Callable[[], Cgroup]]:
    made: list[Cgroup] = []

    def make() -> Cgroup:
        rel = f"/qpolicy-test-{uuid.uuid4().hex[:12]}"
        path = cgroup_map.root / rel.lstrip("/")
        path.mkdir()
        cgroup = Cgroup(path, rel, cgroup_map.id_of(rel))
        made.append(cgroup)
        return cgroup

    yield make
    for cgroup in made:
        _remove_tree(cgroup.path)


def _remove_tree(path: Path) -> None:
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        _remove_one(child)
    _remove_one(path)


def _remove_one(path: Path) -> None:
    for _ in range(50):
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.05)
    path.rmdir()


@dataclass
class Workload:
    process: subprocess.Popen[str]
    cgroup: Cgroup

    @property
    def pid(self) -> int:
        return self.process.pid

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait_line(self, text: str, timeout: float = 10) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.strip() == text:
                return
            if not line:
                break
        raise AssertionError(f"workload {self.pid} never said {text!r}")

    def report(self, timeout: float = 30) -> dict[str, Any]:
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, err
        return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[Cgroup, list[dict[str, Any]]], Workload]]:
    started: list[Workload] = []

    def start(cgroup: Cgroup, steps: list[dict[str, Any]]) -> Workload:
        plan = tmp_path / f"plan-{len(started)}.json"
        plan.write_text(json.dumps(steps))
        procs = cgroup.path / "cgroup.procs"

        def enter_cgroup() -> None:
            # Runs in the child between fork and exec: everything it execs is counted there.
            procs.write_text("0")

        process = subprocess.Popen(
            [sys.executable, str(WORKLOAD), str(plan)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            preexec_fn=enter_cgroup,
        )
        workload = Workload(process, cgroup)
        started.append(workload)
        return workload

    yield start
    for workload in started:
        if workload.process.poll() is None:
            workload.process.kill()
        workload.process.communicate()


@dataclass
class Collected:
    records: list[ProbeRecord] = field(default_factory=list)

    def of(self, cgroup: Cgroup, kind: str | None = None) -> list[ProbeRecord]:
        return [
            r for r in self.records if r.cgroup == cgroup.id and (kind is None or r.kind == kind)
        ]


def collect(
    probe: NvProbe,
    until: Callable[[Collected], bool],
    timeout: float = 10,
    into: Collected | None = None,
) -> Collected:
    """Poll the probe until ``until`` holds (or fail after ``timeout`` seconds)."""
    got = into if into is not None else Collected()
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; got {len(got.records)} records")
        got.records.extend(probe.poll(100))
    return got
