"""The daemon: its sources, its backends, one instance per node, and a clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from qpolicy.backends.base import BackendContext, BackendFactory
from qpolicy.backends.choice import (
    Choice,
    EnforcerKind,
    backend_factory,
    choose_enforcer,
    in_kubernetes,
)
from qpolicy.backends.observe import ObserveBackend
from qpolicy.backends.rm import RmBackend
from qpolicy.daemon import Daemon, DaemonConfig, ProbeMode
from qpolicy.errors import QPolicyError
from qpolicy.instance import STATUS_NAME
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.gpu import SimGpu
from qpolicy.sim.node import SimulatedNode, trace_activity
from qpolicy.sim.scenarios import builtin
from qpolicy.state import StateStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_simulated_node_counters_keep_growing_across_restarts() -> None:
    clock = FakeClock()
    scenario = builtin("demo")
    node = SimulatedNode(scenario, clock=clock)
    clock.now += 15
    node.advance()
    first = {p.pod: p for p in node.view().pods}
    assert node.runs == 0
    clock.now += 10  # 25 s: the 20 s scenario ran once and started again
    node.advance()
    second = {p.pod: p for p in node.view().pods}
    assert node.runs == 1
    for name in first:
        a, b = first[name], second[name]
        assert b.enforcement.gpu_time_s > a.enforcement.gpu_time_s
        assert b.activity.launches > a.activity.launches
        assert sum(b.activity.ioctls.values()) >= sum(a.activity.ioctls.values())
        assert b.enforcement.online_wait.count >= a.enforcement.online_wait.count
    # 25 s of 50 requests/s: every request's kernel waited once and was counted once.
    infer = second["infer"]
    assert infer.enforcement.online_wait.count == pytest.approx(25 * 50, abs=3)
    assert infer.activity.launches == pytest.approx(25 * 50, abs=3)


def test_simulated_processes_hold_what_the_traced_process_held() -> None:
    clock = FakeClock()
    node = SimulatedNode(builtin("demo"), clock=clock)
    trace = trace_activity()
    clock.now += 5  # train-b starts at 8 s
    node.advance()
    pods = {p.pod: p for p in node.view().pods}
    assert pods["train-a"].activity.tsgs == trace.tsgs == 4
    assert pods["train-a"].activity.channels == 20
    assert pods["train-a"].activity.device_memory == trace.device_memory
    assert pods["train-b"].activity.tsgs == 0 and pods["train-b"].activity.ioctls == {}
    assert pods["train-b"].enforcement.gpu_time_s == 0
    assert pods["train-a"].enforcement.planned_share == pytest.approx(0.985, abs=0.01)


def test_blocked_time_and_waits_in_the_simulated_gpu() -> None:
    loop = EventLoop()
    gpu = SimGpu(loop, switch_us=0.0)
    a = gpu.add_context("a")
    gpu.set_enabled(a, False)
    gpu.submit(a, 100.0, None)
    loop.at(1000.0, lambda: gpu.set_enabled(a, True))
    loop.run_until(500.0)
    assert gpu.blocked_time(a) == pytest.approx(500.0)
    loop.run_until(5000.0)
    assert gpu.blocked_time(a) == pytest.approx(1000.0)
    gpu.submit(a, 50.0, None)
    gpu.submit(a, 50.0, None)
    loop.run_until(6000.0)
    # The first job waited for its channels, the next two for their predecessors only.
    assert a.waits == [pytest.approx(1000.0), pytest.approx(0.0), pytest.approx(50.0)]


def daemon(tmp_path: Path, backend: BackendFactory = ObserveBackend, **kw: Any) -> Daemon:
    return Daemon(DaemonConfig(state_dir=tmp_path, metrics_addr=None, **kw), backend)


def test_observe_only_daemon_follows_the_state_file(tmp_path: Path) -> None:
    agent = daemon(tmp_path)
    agent.tick()
    assert agent.snapshot().pods == () and agent.snapshot().sources == {"state": True}
    store = StateStore(tmp_path)
    store.update(lambda s: s.with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE)))
    store.update(lambda s: s.with_pod(PodSpec("/kubepods/a", 0, PodClass.ONLINE, 40, 1 << 30)))
    agent.tick()
    (pod,) = agent.snapshot().pods
    assert (pod.pod, pod.pod_class, pod.share_target, pod.memory_limit) == (
        "/kubepods/a",
        "online",
        0.4,
        1 << 30,
    )
    # No control loop plans a period here: there is no planned share to report (it used to be
    # reported as 0, which reads as a pod starved).
    assert pod.enforcement.planned_share is None
    assert agent.snapshot().gpus[0].policy == "fixed-share"
    agent.close()


def test_a_corrupt_state_file_marks_the_source_down_and_keeps_the_last_good_state(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.update(lambda s: s.with_pod(PodSpec("a", 0)))
    agent = daemon(tmp_path)
    agent.tick()
    store.path.write_text("{ not json")
    agent.tick()
    view = agent.snapshot()
    assert view.sources == {"state": False}
    assert [p.pod for p in view.pods] == ["a"]
    assert agent.desired.file.error is not None and "not valid JSON" in agent.desired.file.error
    agent.close()


def test_a_second_daemon_says_who_holds_the_node_and_touches_nothing(tmp_path: Path) -> None:
    first = daemon(tmp_path)
    made: list[BackendContext] = []

    def backend(context: BackendContext) -> ObserveBackend:
        made.append(context)  # a real backend would recover (re-open the first one's channels)
        return ObserveBackend(context)

    with pytest.raises(QPolicyError) as caught:
        daemon(tmp_path, backend)
    assert str(caught.value) == (
        f"another qpolicy daemon (pid {os.getpid()}) is running on this node: it holds "
        f"{tmp_path / 'daemon.lock'}"
    )
    assert made == []
    first.close()
    daemon(tmp_path, backend).close()  # released: the next one starts
    assert len(made) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_metrics_address_in_use_gives_back_everything_taken_before_it(tmp_path: Path) -> None:
    closed: list[str] = []

    class Recording(ObserveBackend):
        def close(self) -> None:
            closed.append("backend")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = DaemonConfig(state_dir=tmp_path, metrics_addr=f"127.0.0.1:{port}")
        agent = Daemon(config, Recording)
        with pytest.raises(QPolicyError, match="cannot listen on"):
            agent.run()
    assert closed == ["backend"]
    daemon(tmp_path).close()  # the lock was released too


def test_the_daemon_writes_what_status_shows_and_removes_it_when_it_stops(
    tmp_path: Path,
) -> None:
    StateStore(tmp_path).update(
        lambda s: s.with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE)).with_pod(
            PodSpec("/a", 0, share=60)
        )
    )
    agent = daemon(tmp_path, cgroup_root=tmp_path / "no-cgroups")
    agent.tick()
    document = json.loads((tmp_path / "daemon-status.json").read_text())
    assert document["pid"] == os.getpid() and document["enforcer"] == "none"
    assert [p["id"] for p in document["pods"]] == ["/a"]
    agent.close()
    assert not (tmp_path / "daemon-status.json").exists()


class _Source:
    """A pod source with nothing to say, whose close can fail."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.closed = name, fail, False
        self.up = True

    def refresh(self) -> bool:
        return False

    def candidates(self) -> tuple[()]:
        return ()

    def gpus(self) -> dict[int, GpuConfig]:
        return {}

    def refused(self, refusals: Any) -> None:
        pass

    def names(self) -> dict[str, tuple[str, str]]:
        return {}

    def problems(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        self.closed = True
        if self.fail:
            raise RuntimeError("the API client's pool would not shut down")


def test_a_source_that_fails_to_close_keeps_nothing_else_from_being_given_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failing, other = _Source("kubernetes", fail=True), _Source("other")
    agent = Daemon(
        DaemonConfig(state_dir=tmp_path, metrics_addr=None, probe=ProbeMode.OFF),
        ObserveBackend,
        sources=(failing, other),
    )
    agent.tick()
    assert (tmp_path / STATUS_NAME).exists()
    agent.close()
    assert failing.closed and other.closed
    assert "closing the kubernetes source: the API client's pool" in caplog.text
    assert not (tmp_path / STATUS_NAME).exists()
    # The node is free again: the next daemon takes its lock.
    daemon(tmp_path, probe=ProbeMode.OFF).close()


def test_a_status_file_that_cannot_be_written_does_not_stop_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    StateStore(tmp_path).update(lambda s: s.with_pod(PodSpec("/a", 0)))
    agent = daemon(tmp_path, probe=ProbeMode.OFF)
    import qpolicy.daemon as daemon_module

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(daemon_module.os, "replace", full)
    agent.tick()  # logged at debug level, not raised
    assert [p.pod for p in agent.snapshot().pods] == ["/a"]
    assert not (tmp_path / STATUS_NAME).exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".status.")]
    monkeypatch.undo()
    agent.tick()
    assert [p["id"] for p in json.loads((tmp_path / STATUS_NAME).read_text())["pods"]] == ["/a"]
    agent.close()


def test_annotations_are_watched_and_the_watch_is_given_back_at_close(tmp_path: Path) -> None:
    """The daemon finds annotated cgroups by inotify (qpolicy.desired.annotationwatch), says so
    in its status, and closes the inotify descriptor when it stops."""
    cgroups = tmp_path / "cgroup"
    (cgroups / "kube" / "web").mkdir(parents=True)
    try:
        os.setxattr(cgroups / "kube" / "web", "user.qpolicy.class", b"online")
    except OSError:
        pytest.skip(f"{cgroups} does not take user.* extended attributes")
    state = tmp_path / "state"
    state.mkdir()
    fds = len(os.listdir("/proc/self/fd"))
    agent = daemon(state, cgroup_root=cgroups)
    agent.tick()
    assert [p.pod for p in agent.snapshot().pods] == ["/kube/web"]
    (cgroups / "kube" / "batch").mkdir()
    os.setxattr(cgroups / "kube" / "batch", "user.qpolicy.share", b"20")
    agent.tick()
    assert [p.pod for p in agent.snapshot().pods] == ["/kube/batch", "/kube/web"]
    document = json.loads((state / "daemon-status.json").read_text())
    annotations = document["annotations"]
    assert annotations.pop("walk_ms") >= 0
    assert annotations == {
        "watched_directories": 4,
        "directories": 4,
        "walk_every_s": 60.0,
        "queue_overflows": 0,
    }
    agent.close()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_daemon_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            str(script),
            "daemon",
            "--enforcer",
            "sim",
            "--scenario",
            "demo",
            "--metrics-addr",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert (
            'qpolicy_share_target_ratio{class="offline",container="",gpu="0",namespace="",'
            'pod="train-a"} 0.5' in body
        )
        assert "qpolicy_enforcer_up 1.0" in body
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_probe_activity_is_attributed_to_the_pod_owning_the_cgroup(tmp_path: Path) -> None:
    from qpolicy.telemetry.cgroups import CgroupMap
    from qpolicy.telemetry.probe import CgroupCounters
    from qpolicy.telemetry.probesource import ProbeSource
    from qpolicy.telemetry.wire import ProbeRecord
    from tests.unit.test_telemetry_live import FakeProbe, rm_alloc

    def open_record(pid: int, cgroup: int, fd: int, path: str, minor: int) -> ProbeRecord:
        return ProbeRecord(
            "open", ts=0, tid=pid, ret=fd, s=path, pid=pid, cgroup=cgroup, major=195, minor=minor
        )

    root = tmp_path / "cgroup"
    (root / "kube" / "web" / "ctr").mkdir(parents=True)
    (root / "batch").mkdir()
    cgroups = CgroupMap(root=root)
    web, batch = cgroups.id_of("/kube/web/ctr"), cgroups.id_of("/batch")
    probe = FakeProbe()
    probe.pending = [
        open_record(10, web, 5, "/dev/nvidiactl", minor=255),
        open_record(10, web, 6, "/dev/nvidia0", minor=0),
        rm_alloc(10, web, 0xC1D00001, 0, 0x41),
        rm_alloc(10, web, 0x2, 0xC1D00001, 0x80),
        rm_alloc(10, web, 0x3, 0x2, 0xA06C),
        open_record(20, batch, 7, "/dev/nvidia1", minor=1),
    ]
    probe.counts = {
        web: CgroupCounters(web, ioctls=3, escapes={"RM_ALLOC": 3}, launches=42),
        batch: CgroupCounters(batch, ioctls=1, escapes={"CARD_INFO": 1}),
    }
    store = StateStore(tmp_path / "state")
    store.update(lambda s: s.with_pod(PodSpec("/kube/web", 0, PodClass.ONLINE, 30)))
    config = DaemonConfig(state_dir=tmp_path / "state", metrics_addr=None, probe=ProbeMode.ON)
    agent = Daemon(config, ObserveBackend, probe_loader=lambda: ProbeSource(probe, cgroups))
    agent.tick()
    view = agent.snapshot()
    pods = {pod.pod: pod for pod in view.pods}
    assert view.sources == {"state": True, "probe": True}
    assert view.probe_lost_events == 0
    web_pod = pods["/kube/web"]
    assert web_pod.pod_class == "online" and web_pod.gpu == "0"
    assert web_pod.activity.ioctls == {"RM_ALLOC": 3} and web_pod.activity.launches == 42
    assert web_pod.activity.tsgs == 1 and web_pod.activity.processes == 1
    stray = pods["/batch"]
    assert (stray.pod_class, stray.gpu, stray.share_target) == ("unmanaged", "1", None)
    assert stray.activity.ioctls == {"CARD_INFO": 1}
    # A process in a cgroup the map never learnt: found by a walk here (a test's directory
    # cannot be opened by id), and the status says how.
    (root / "late").mkdir()
    late = os.stat(root / "late").st_ino
    probe.pending = [open_record(30, late, 8, "/dev/nvidia0", minor=0)]
    agent.tick()
    assert cgroups.known_path(late) == "/late"
    ids = json.loads((tmp_path / "state" / STATUS_NAME).read_text())["cgroup_ids"]
    assert ids.pop("walk_ms") >= 0
    assert ids == {"by_id": False, "opened": 0, "walks": 1, "walk_every_s": 0.5}
    agent.close()


def test_the_ioctl_counters_are_read_at_a_scrape_on_the_loop_thread_not_every_second(
    tmp_path: Path,
) -> None:
    from qpolicy.telemetry.cgroups import CgroupMap
    from qpolicy.telemetry.probe import CgroupCounters
    from qpolicy.telemetry.probesource import ProbeSource
    from tests.unit.test_probesource import ReadCounting

    root = tmp_path / "cgroup"
    (root / "kube" / "web" / "ctr").mkdir(parents=True)
    cgroups = CgroupMap(root=root)
    web = cgroups.id_of("/kube/web/ctr")
    probe = ReadCounting()
    probe.counts = {web: CgroupCounters(web, ioctls=3, escapes={"RM_ALLOC": 3}, launches=42)}
    store = StateStore(tmp_path / "state")
    store.update(lambda s: s.with_pod(PodSpec("/kube/web", 0, PodClass.ONLINE, 30)))
    config = DaemonConfig(state_dir=tmp_path / "state", metrics_addr=None, probe=ProbeMode.ON)
    agent = Daemon(config, ObserveBackend, probe_loader=lambda: ProbeSource(probe, cgroups))
    for _ in range(3):
        agent.tick()
    assert probe.counter_reads == []
    status = json.loads((tmp_path / "state" / STATUS_NAME).read_text())
    assert [(p["id"], p["launches"]) for p in status["pods"]] == [("/kube/web", 42)]

    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while agent._loop_thread is None and time.monotonic() < deadline:
            time.sleep(0.01)
        loop_thread = agent._loop_thread
        assert loop_thread is not None
        (pod,) = agent.snapshot().pods  # from this thread, as the exporter's would
        assert pod.activity.ioctls == {"RM_ALLOC": 3} and pod.activity.launches == 42
        assert probe.counter_reads == [loop_thread]
        agent.snapshot()  # a second scrape within a second: the same read
        assert probe.counter_reads == [loop_thread]
    finally:
        agent.stop()
        runner.join(timeout=10)
    assert not runner.is_alive()


def test_probe_that_cannot_load(tmp_path: Path) -> None:
    def fail() -> Any:
        raise QPolicyError("bcc missing: install python3-bpfcc")

    for mode, fatal in ((ProbeMode.AUTO, False), (ProbeMode.ON, True)):
        config = DaemonConfig(state_dir=tmp_path, metrics_addr=None, probe=mode)
        if fatal:
            with pytest.raises(QPolicyError, match="python3-bpfcc"):
                Daemon(config, ObserveBackend, probe_loader=fail)
            continue
        agent = Daemon(config, ObserveBackend, probe_loader=fail)
        agent.tick()
        assert agent.snapshot().sources == {"state": True, "probe": False}
        assert agent.probe_error == "bcc missing: install python3-bpfcc"
        agent.close()


def test_auto_picks_kmod_then_rm_then_says_it_simulates(tmp_path: Path) -> None:
    qgpu, ctl = tmp_path / "qgpu", tmp_path / "nvidiactl"
    choice = choose_enforcer(EnforcerKind.AUTO, qgpu=qgpu, nvidia=ctl)
    assert choice.kind is EnforcerKind.SIM
    assert choice.reason == (
        f"qgpu.ko is not loaded ({qgpu} is missing) and there is no NVIDIA GPU ({ctl}): running "
        "the simulated demo node"
    )
    ctl.touch()
    assert choose_enforcer(EnforcerKind.AUTO, qgpu=qgpu, nvidia=ctl).kind is EnforcerKind.RM
    qgpu.mkdir()
    assert choose_enforcer(EnforcerKind.AUTO, qgpu=qgpu, nvidia=ctl).kind is EnforcerKind.KMOD
    assert choose_enforcer(EnforcerKind.NONE, qgpu=qgpu, nvidia=ctl) == Choice(EnforcerKind.NONE)


def test_auto_refuses_to_simulate_a_node_inside_kubernetes(tmp_path: Path) -> None:
    qgpu, ctl = tmp_path / "qgpu", tmp_path / "nvidiactl"
    with pytest.raises(QPolicyError, match="refusing to run a simulated node under Kubernetes"):
        choose_enforcer(EnforcerKind.AUTO, kubernetes=True, qgpu=qgpu, nvidia=ctl)
    explicit = choose_enforcer(EnforcerKind.SIM, kubernetes=True, qgpu=qgpu, nvidia=ctl)
    assert explicit.kind is EnforcerKind.SIM
    assert in_kubernetes({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert not in_kubernetes({})


def test_rm_enforcer_needs_root_and_says_so() -> None:
    with pytest.raises(QPolicyError, match="rm enforcer needs root"):
        backend_factory(EnforcerKind.RM, is_root=lambda: False)


def test_kmod_enforcer_needs_the_module_and_cap_net_admin(tmp_path: Path) -> None:
    from qpolicy.enforcers.kmod.client import connect
    from tests.unit.qgpu_fake import FakeQgpu

    sysfs = tmp_path / "qgpu"
    missing = backend_factory(EnforcerKind.KMOD, kmod_connect=lambda: connect(sysfs, FakeQgpu))
    with pytest.raises(QPolicyError, match=r"qgpu\.ko is not loaded \(.*/qgpu is missing\)"):
        daemon(tmp_path, missing)
    sysfs.mkdir()
    refusing = backend_factory(
        EnforcerKind.KMOD,
        kmod_connect=lambda: connect(sysfs, lambda: FakeQgpu(unprivileged=True)),
    )
    with pytest.raises(QPolicyError, match="kmod enforcer needs CAP_NET_ADMIN"):
        daemon(tmp_path, refusing)
    daemon(tmp_path).close()  # each failure released the lock


def test_kmod_daemon_configures_the_module_and_unconfigures_it_when_stopped(
    tmp_path: Path,
) -> None:
    """The daemon's kmod wiring, the module replaced by the in-process one: pods of the state
    file are configured, follow its changes, show the module's counters, and are deleted (every
    GPU left best-effort) on shutdown. The GPU's timeslices are its doctor's."""
    import json

    from qpolicy.enforcers.kmod.client import QgpuClient
    from qpolicy.enforcers.kmod.uapi import Attr, Cmd, Policy
    from qpolicy.enforcers.strategy import doctor_cache_path
    from tests.unit.qgpu_fake import FakeQgpu

    root = tmp_path / "cgroup"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    a, b = os.stat(root / "a").st_ino, os.stat(root / "b").st_ino
    store = StateStore(tmp_path / "state")
    store.update(
        lambda s: (
            s.with_gpu(GpuConfig(1, GpuPolicy.FIXED_SHARE, 20))
            .with_pod(PodSpec("/a", 1, PodClass.ONLINE, share=70, memory_limit=2**30))
            .with_pod(PodSpec("/b", 1, share=30))
        )
    )
    doctor = {"schema": 1, "date": "2026-11-24", "recommendation": {"lever": "timeslice-1us"}}
    doctor_cache_path(store.directory, 1).write_text(json.dumps(doctor))
    fake = FakeQgpu()
    factory = backend_factory(EnforcerKind.KMOD, kmod_connect=lambda: QgpuClient(fake))
    agent = daemon(store.directory, factory, cgroup_root=root)
    agent.tick()
    assert fake.gpus[1] == {
        Attr.POLICY: Policy.FIXED_SHARE,
        Attr.PERIOD_US: 20_000,
        Attr.OFFLINE_TIMESLICE_US: 1,
        Attr.ONLINE_TIMESLICE_US: 1_000_000,
        Attr.OFFLINE_PREEMPTION: 0,  # the contexts' own: timeslice-1us sets no mode
    }
    assert {
        c: (v[Attr.GPU], v[Attr.SHARE], v[Attr.MEM_LIMIT]) for c, v in fake.cgroups.items()
    } == {
        a: (1, 70, 2**30),
        b: (1, 30, 0),
    }
    fake.count(a, open_ns=1_000_000_000, throttled_ns=250_000_000)
    fake.changes()
    for _ in range(5):  # ticks push nothing while nothing changes: no 50 ms loop here
        agent.tick()
    assert fake.changes() == []
    pods = {p.pod: p for p in agent.snapshot().pods}
    assert pods["/a"].enforcement.gpu_time_s == pytest.approx(1.0)
    assert pods["/a"].enforcement.throttled_s == pytest.approx(0.25)
    assert pods["/a"].enforcement.planned_share is None
    assert agent.snapshot().sources["enforcer"] is True
    store.update(lambda s: s.without_pod("/b"))
    agent.tick()
    assert set(fake.cgroups) == {a}
    # The module stops answering: the enforcer is down, and says so.
    fake.refuse[Cmd.CGROUP_GET] = 5
    agent.publish()
    assert agent.snapshot().sources["enforcer"] is False
    agent.close()
    assert fake.cgroups == {} and fake.closed
    assert fake.gpus[1][Attr.POLICY] == Policy.BEST_EFFORT


def test_rm_daemon_takes_turns_then_gives_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's rm wiring end to end, with the probe and the RM controls replaced: two
    fixed-share pods take turns in a stretched period and, stopped, the daemon re-opens every
    channel it closed and restores every timeslice."""
    import threading

    from qpolicy.enforcers.rm import record
    from qpolicy.nvrm import rmctl
    from qpolicy.nvrm.abi import NvStatus
    from qpolicy.telemetry.cgroups import CgroupMap
    from qpolicy.telemetry.probesource import ProbeSource
    from tests.unit.test_rm_enforcer import FakeDriver, FakeFiles
    from tests.unit.test_telemetry_live import FakeProbe, process, rm_alloc

    root = tmp_path / "cgroup"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    cgroups = CgroupMap(root=root)
    ids = {"/a": cgroups.id_of("/a"), "/b": cgroups.id_of("/b")}
    pids = {"/a": 10, "/b": 20}

    class BusyProbe(FakeProbe):
        """Both pods launch all the time."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def launches(self) -> dict[int, int]:
            self.calls += 1
            return dict.fromkeys(ids.values(), self.calls)

    probe = BusyProbe()
    for pod, cgroup in ids.items():
        pid = pids[pod]
        probe.pending += [
            *process(pid, cgroup, tsgs=1, channels_per_tsg=2, vidmem=0),
            rm_alloc(pid, cgroup, 0xD1, 0xD0, 0x2080),
        ]
    lock = threading.Lock()
    controls: list[tuple[int, bool]] = []
    disabled: set[int] = set()
    timeslices: dict[int, int] = {}

    def disable_channels(
        fd: int, client: int, subdevice: int, channels: list[int], *, disable: bool
    ) -> rmctl.ControlResult:
        with lock:
            controls.append((fd, disable))
            (disabled.add if disable else disabled.discard)(fd)
        return rmctl.ControlResult(NvStatus.NV_OK, 1000)

    def set_timeslice(fd: int, client: int, tsg: int, us: int) -> rmctl.ControlResult:
        timeslices[fd] = us
        return rmctl.ControlResult(NvStatus.NV_OK, 1)

    monkeypatch.setattr(rmctl, "disable_channels", disable_channels)
    monkeypatch.setattr(
        rmctl, "get_timeslice", lambda fd, c, t: (rmctl.ControlResult(NvStatus.NV_OK, 1), 2048)
    )
    monkeypatch.setattr(rmctl, "set_timeslice", set_timeslice)
    monkeypatch.setattr(rmctl, "gpu_pci_address", lambda fd, client, subdevice: None)
    monkeypatch.setattr(record, "process_start_time", lambda pid: 1)

    state_dir = tmp_path / "state"
    store = StateStore(state_dir)
    store.update(
        lambda s: s.with_pod(PodSpec("/a", 0, share=70)).with_pod(PodSpec("/b", 0, share=30))
    )
    files = FakeFiles(FakeDriver(None))  # type: ignore[arg-type]
    config = DaemonConfig(
        state_dir=state_dir, metrics_addr=None, cgroup_root=root, probe=ProbeMode.ON
    )

    def backend(context: BackendContext) -> RmBackend:
        return RmBackend(context, min_turn_ms=100, files=files, gpus=list)  # type: ignore[arg-type]

    agent = Daemon(config, backend, probe_loader=lambda: ProbeSource(probe, cgroups))
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        time.sleep(2.0)
        rm_backend = agent.backend
        assert isinstance(rm_backend, RmBackend)
        periodic = rm_backend._gpus[0].periodic
        assert periodic.control.last_plan is not None
        assert periodic.control.last_plan.period_us == 200_000
        with lock:
            seen = list(controls)
        fds = {pod: files.get(pid, 5) for pod, pid in pids.items()}
        status = json.loads((state_dir / "daemon-status.json").read_text())
        assert status["enforcer"] == "rm" and set(status["backend"]["gpus"]) == {"0"}
        # The stretched period is the one in force: what status says and Prometheus reads.
        gpu0 = status["backend"]["gpus"]["0"]
        assert (gpu0["period_us"], gpu0["configured_period_us"]) == (200_000, 50_000)
        assert [g.period_s for g in agent._build_view(counters=False).gpus] == [0.2]
    finally:
        agent.stop()
        runner.join(timeout=10)
    assert not runner.is_alive()
    # Turns: each pod was closed and opened again, a few times a second (not 20 times).
    for fd in fds.values():
        assert (fd, True) in seen and (fd, False) in seen
    assert len(seen) <= 2 * 2 * 12
    # Stopped: nothing is left closed and no record is left.
    assert disabled == set()
    assert timeslices == {}  # offline pods only: no timeslice to change
    assert not (state_dir / "rm-record.json").exists()


def test_auto_without_a_gpu_says_it_simulates_and_refuses_to_inside_kubernetes(
    tmp_path: Path,
) -> None:
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    kube = subprocess.run(
        [str(script), "daemon", "--no-metrics"],
        env={**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert kube.returncode == 1
    assert kube.stderr.startswith("qpolicy: error: --enforcer auto: qgpu.ko is not loaded")
    assert "refusing to run a simulated node under Kubernetes" in kube.stderr
    # Outside Kubernetes it runs the simulated node, and says so first (as JSON lines here).
    proc = subprocess.Popen(
        [str(script), "daemon", "--no-metrics", "--json"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = json.loads(proc.stderr.readline())
        assert first["level"] == "warning" and first["message"].startswith(
            "--enforcer auto: qgpu.ko is not loaded"
        )
        assert first["message"].endswith("running the simulated demo node")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_rm_daemon_reopens_what_a_killed_one_left_closed_before_it_loads_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod the dead daemon closed waits for the next one's recovery, and the probe's compile
    took 1.5-2 s of that wait on an H200: the channels are opened before the probe is loaded."""
    from qpolicy.backends.rm import RmBackendFactory
    from qpolicy.enforcers.rm import record
    from qpolicy.nvrm import rmctl
    from qpolicy.nvrm.abi import NvStatus
    from qpolicy.telemetry.probesource import ProbeSource
    from tests.unit.test_telemetry_live import FakeProbe

    events: list[str] = []

    def disable_channels(
        fd: int, client: int, subdevice: int, channels: list[int], *, disable: bool
    ) -> rmctl.ControlResult:
        events.append(("close " if disable else "open ") + ",".join(map(str, channels)))
        return rmctl.ControlResult(NvStatus.NV_OK, 1000)

    def load_probe() -> ProbeSource:
        events.append("probe loaded")
        return ProbeSource(FakeProbe())

    monkeypatch.setattr(rmctl, "disable_channels", disable_channels)
    monkeypatch.setattr(rmctl, "borrow_fd", lambda pid, fd: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(record, "process_start_time", lambda pid: 77)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    left = {"pid": 4242, "start_time": 77, "fd": 8, "client": 1, "subdevice": 2, "channels": [3]}
    (state_dir / record.RECORD_NAME).write_text(
        json.dumps({"version": 2, "closed": {"k": left}, "timeslices": {}})
    )
    config = DaemonConfig(state_dir=state_dir, metrics_addr=None, probe=ProbeMode.ON)
    agent = Daemon(config, RmBackendFactory(guard=None), probe_loader=load_probe)
    try:
        assert events == ["open 3", "probe loaded"]
        assert isinstance(agent.backend, RmBackend)
        assert agent.backend.status()["recovered"]["channel_groups_opened"] == 1
        assert not (state_dir / record.RECORD_NAME).exists()
    finally:
        agent.close()
