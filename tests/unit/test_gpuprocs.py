"""GPU processes the probe never saw: found from cgroup.procs and /proc, and reported."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from qpolicy.backends.base import BackendContext
from qpolicy.backends.rm import RmBackend
from qpolicy.enforcers.rm import unseen
from qpolicy.enforcers.rm.handles import HANDLES_NAME
from qpolicy.model import GpuConfig, GpuPolicy, PodSpec
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.abi import Node
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.gpuprocs import cgroup_procs, is_mps_server, maps_libcuda, uses_nvidia
from qpolicy.telemetry.probesource import ProbeSource
from tests.unit.rm_double import RmDouble
from tests.unit.test_telemetry_live import FakeProbe, process


def fake_proc(root: Path, pid: int, *targets: str) -> None:
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    for number, target in enumerate(targets):
        os.symlink(target, fd / str(number))


def test_processes_of_a_subtree_and_which_hold_nvidia_files(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    (cgroup / "pod" / "ctr").mkdir(parents=True)
    (cgroup / "pod" / "cgroup.procs").write_text("")
    (cgroup / "pod" / "ctr" / "cgroup.procs").write_text("30\n10\n")
    (cgroup / "other").mkdir()
    (cgroup / "other" / "cgroup.procs").write_text("99\n")
    (cgroup / "pod" / "gone").mkdir()  # no cgroup.procs: removed while walked
    # A list a cgroup, the empty ones too (a look in slices can stop between any two).
    assert sorted(cgroup_procs(cgroup, "/pod")) == [[], [], [30, 10]]
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "/dev/null", "/dev/nvidiactl")
    fake_proc(proc, 30, "/dev/nvidia-uvm", "socket:[1234]")
    fake_proc(proc, 40, "/dev/nvidia3")
    assert [uses_nvidia(pid, proc) for pid in (10, 30, 40, 50)] == [True, False, True, False]


def test_the_rm_backend_names_the_processes_it_cannot_govern(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cgroup = tmp_path / "cgroup"
    (cgroup / "a").mkdir(parents=True)
    (cgroup / "a" / "cgroup.procs").write_text("10\n4242\n")
    cgroups = CgroupMap(root=cgroup)
    probe = FakeProbe()
    probe.pending = process(10, cgroups.id_of("/a"), tsgs=1, channels_per_tsg=1, vidmem=0)
    source = ProbeSource(probe, cgroups)
    source.refresh()
    # Both use the GPU; the probe saw pid 10 allocate, never pid 4242 (it started first), and
    # asking RM finds nothing of 4242's (a double holding nothing).
    files = {8: Node.CTL}
    monkeypatch.setattr(unseen, "nvidia_files", lambda pid: files if pid in (10, 4242) else {})
    monkeypatch.setattr(unseen, "process_start_time", lambda pid: 1)
    monkeypatch.setattr(rmctl, "newest_client_handle", lambda: 0xC1D00002)
    monkeypatch.setattr(unseen, "maps_libcuda", lambda pid: True)
    monkeypatch.setattr(unseen, "process_running", lambda pid, started: True)
    monkeypatch.setattr(unseen, "open_client_check", lambda: None)  # asked the old way
    rm = RmDouble()
    clock = [0.0]
    context = BackendContext(
        RealtimeLoop(), source, tmp_path / "state", lambda: cgroup, lambda: clock[0]
    )

    state = DesiredState(
        gpus={0: GpuConfig(0, GpuPolicy.FIXED_SHARE)}, pods={"/a": PodSpec("/a", 0, share=50)}
    )

    def run_backend() -> tuple[RmBackend, list[str]]:
        backend = RmBackend(context, gpus=list, askers=rm.asker)  # type: ignore[arg-type]
        backend._state = state  # what sync would set, without starting a control loop
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                backend.refresh()
                clock[0] += 11.0
        return backend, [r.getMessage() for r in caplog.records if "pid 4242" in r.getMessage()]

    # The first daemon on the node: no mark to search above, so 4242 is reported, not searched.
    backend, messages = run_backend()
    try:
        assert backend.unseen == {"/a": [4242]}
        assert backend.enforcement(0, "/a").unseen_processes == 1
        assert backend.status()["unseen_processes"] == {"/a": [4242]}
        assert backend.status()["searched"]["not_searched"] == [4242]
        assert rm.asked == 0
        (message,) = messages
        assert message.startswith("pod /a: pid 4242 uses the GPU but started before any daemon")
    finally:
        backend.close()
    # A daemon after one that saw clients made up to 0xc1d00000: the clients made since are
    # asked (0xc1d00001, just below the one it makes itself), and RM names none of 4242's.
    (tmp_path / "state" / HANDLES_NAME).write_text(
        json.dumps({"version": 1, "newest_client": 0xC1D00000, "processes": []})
    )
    backend, messages = run_backend()
    try:
        assert backend.unseen == {"/a": [4242]}
        assert backend.status()["searched"]["not_found"] == [4242]
        assert rm.refusals[0x23] == 1  # the one client handle made since the mark
        (message,) = messages
        assert message.startswith(
            "pod /a: pid 4242 uses the GPU, but asking RM found none of its channels"
        )
    finally:
        backend.close()


def test_only_the_mps_servers_executable_is_an_mps_server(tmp_path: Path) -> None:
    exes = ("/usr/bin/nvidia-cuda-mps-server", "/usr/bin/nvidia-cuda-mps-control", "/bin/python3")
    for pid, exe in enumerate(exes, start=1):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "exe").symlink_to(exe)
    assert [p for p in (1, 2, 3, 4) if is_mps_server(p, tmp_path)] == [1]


def test_which_processes_have_libcuda_mapped(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "maps").write_text(
        "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04\n"
    )
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "maps").write_text(
        "7f00-7f10 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
    )
    assert [maps_libcuda(pid, tmp_path) for pid in (10, 11, 12)] == [True, False, False]
