"""The doctor without a GPU: its real workload processes (on a stand-in for PyTorch), its real
phase runner, and a fake RM that answers controls as the driver's headers say it does.

What a lever does on a GPU cannot be known here; what is checked is what the doctor does with the
answers: every lever's settings are undone, per-request levers send their control at each request,
one failing lever does not end the run, and the recommendation follows the rules it states.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qpolicy.doctor.lab import Lab
from qpolicy.doctor.levers import LEVERS
from qpolicy.doctor.mps import PIPE, mps_server, server_pids
from qpolicy.doctor.report import read_cache, recommend, table, write_cache
from qpolicy.doctor.run import Doctor, DoctorConfig
from qpolicy.errors import QPolicyError
from qpolicy.nvrm import abi, fecs, rmctl
from qpolicy.nvrm.abi import NvStatus
from qpolicy.nvrm.records import Record
from qpolicy.nvrm.tracker import Tracker

FAKE_TORCH = Path(__file__).parent / "fake_torch"
RM_ALLOC = abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_ALLOC, 48)


def rm_allocs(pid: int) -> list[Record]:
    """What one CUDA process allocates that the doctor acts on: a client, device, subdevice, a
    compute TSG with a compute channel, and a copy TSG (handles distinct per process)."""
    client = 0xC1D00000 + pid
    records = [Record("open", 1, pid, ret=8, s="/dev/nvidiactl", pid=pid)]

    def alloc(parent: int, new: int, cls: int, params: bytes = b"") -> Record:
        p = abi.NVOS64.pack(
            hRoot=client if cls != 0x41 else 0, hObjectParent=parent, hObjectNew=new,
            hClass=cls, pAllocParms=0x1000,
        )  # fmt: skip
        q = params + bytes(96 - len(params))
        return Record("ioctl", 2, pid, cmd=RM_ALLOC, a1=8, p=p, q=q, pid=pid)

    records += [
        alloc(0, client, 0x41),
        alloc(client, 0x10, 0x80, abi.NV0080_ALLOC_PARAMETERS.pack(deviceId=0)),
        alloc(0x10, 0x11, 0x2080),
        alloc(0x10, 0x20, 0xA06C),
        alloc(0x20, 0x21, 0xC86F),
        alloc(0x21, 0x22, 0xCBC0),
        alloc(0x10, 0x30, 0xA06C),
        alloc(0x30, 0x31, 0xC86F),
        alloc(0x31, 0x32, 0xC8B5),
    ]
    return records


class Handles:
    """The probe's view, as the doctor's workloads appear in it."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.tracker = Tracker()
        self.fed: set[int] = set()

    def refresh(self) -> None:
        for workload in (self.lab.online, self.lab.trainer):
            if workload is not None and workload.pid not in self.fed:
                self.fed.add(workload.pid)
                self.tracker.feed_all(rm_allocs(workload.pid))


class Files:
    def get(self, pid: int, fd: int) -> int:
        return 1000 + pid


class FakeRm:
    """Answers controls; remembers the timeslices and modes it was given."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.calls: list[tuple[int, int, dict[str, int]]] = []
        self.timeslice: dict[tuple[int, int], int] = {}
        self.cilp: dict[tuple[int, int], int] = {}
        self.modes_set: list[tuple[int, int, int]] = []  # (client, channel, mode)
        self.refuse = refuse or set()
        self.lock = threading.Lock()
        self.disabled: set[int] = set()  # channels FIFO_DISABLE_CHANNELS left disabled
        #: How long a FIFO_DISABLE_CHANNELS that disables takes to answer (GSP: 0.6-1.3 ms).
        self.disable_s = 0.0

    def __call__(
        self, fd: int, client: int, obj: int, cmd: int, **fields: int
    ) -> tuple[rmctl.ControlResult, dict[str, int]]:
        if cmd == abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS and fields["bDisable"]:
            time.sleep(self.disable_s)
        with self.lock:
            self.calls.append((cmd, obj, fields))
            answer = dict(fields)
            if cmd in self.refuse:
                return rmctl.ControlResult(NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS, 1000), answer
            if cmd == abi.NVA06C_CTRL_CMD_GET_TIMESLICE:
                answer["timesliceUs"] = self.timeslice.get((client, obj), 2048)
            elif cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE:
                self.timeslice[(client, obj)] = fields["timesliceUs"]
            elif cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES:
                # CILP: what GR_GET_CTXSW_MODES reports for every compute channel on the H100
                # and the H200 (docs/levers.md).
                answer["cilpPreemptMode"] = self.cilp.get((client, fields["hChannel"]), 2)
            elif cmd == abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE:
                self.cilp[(client, fields["hChannel"])] = fields["cilpPreemptMode"]
                self.modes_set.append((client, fields["hChannel"], fields["cilpPreemptMode"]))
            elif cmd == abi.NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL:
                answer["channelInterleaveLevel"] = 1
            elif cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS:
                answer.update(saveCnt=len(self.calls), ctaSaveCnt=len(self.calls))
            elif cmd == abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS:
                named = {fields[f"hChannelList{i}"] for i in range(fields["numChannels"])}
                self.disabled = (
                    self.disabled | named if fields["bDisable"] else self.disabled - named
                )
            return rmctl.ControlResult(NvStatus.NV_OK, 300_000), answer

    def sent(self, cmd: int) -> int:
        return sum(1 for c, _, _ in self.calls if c == cmd)


class NoTrace:
    """The FECS trace of a machine without a GPU: the first step fails, as FecsTrace's would."""

    def __init__(self, gpu: int, bus: str | None = None) -> None:
        self.steps: list[dict[str, Any]] = []

    def open(self) -> None:
        raise fecs.FecsError("open /dev/nvidiactl", "No such file or directory")

    def read(self) -> list[fecs.Record]:
        raise AssertionError("never opened")

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_fecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run here reads no FECS trace unless its test gives it one, GPU or not."""
    monkeypatch.setattr("qpolicy.doctor.run.FecsTrace", NoTrace)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_TORCH}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    yield


# A stand-in for nvidia-cuda-mps-control: `-d` starts a "server" (a copy of sleep, whose process
# name is the real server's, "nvidia-cuda-mps") with the caller's environment and returns at once;
# `quit` on stdin stops it, unless FAKE_MPS_STUCK is set. Every call is logged with its pipe
# directory.
FAKE_MPS_CONTROL = """#!/bin/sh
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
    echo "start $pipe" >> "$FAKE_MPS_LOG"
    "$FAKE_MPS_SERVER" 600 </dev/null >/dev/null 2>&1 &
    echo $! > "$pipe/server.pid"
    exit 0
fi
read -r line
echo "$line $pipe" >> "$FAKE_MPS_LOG"
[ -n "$FAKE_MPS_STUCK" ] || kill "$(cat "$pipe/server.pid")"
"""


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake MPS control on PATH; yields its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    server = bin_dir / "nvidia-cuda-mps-server"
    sleep = shutil.which("sleep")
    assert sleep is not None
    shutil.copy(sleep, server)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.setenv("FAKE_MPS_SERVER", str(server))
    yield log
    for line in log.read_text().splitlines() if log.exists() else []:
        pipe = line.split()[-1]
        for pid in server_pids(pipe):
            os.kill(pid, signal.SIGKILL)


def lab_with(rm: FakeRm) -> tuple[Lab, Handles]:
    lab = Lab(0, None, Files(), send=rm)  # type: ignore[arg-type]
    handles = Handles(lab)
    lab.handles = handles
    return lab, handles


def test_a_run_measures_every_lever_undoes_each_and_stops_its_workloads(
    fake_torch: None, fake_mps: Path
) -> None:
    rm = FakeRm()
    lab, _ = lab_with(rm)
    config = DoctorConfig(gpu=0, hz=200, phase_s=0.4, settle_s=0.1)
    report = Doctor(lab, config).run({"index": 0, "name": "fake", "driver": "580.142"})
    names = [phase["lever"] for phase in report["phases"]]
    assert names == ["solo", *(lever.name for lever in LEVERS), "solo-after", "mps"]
    for phase in report["phases"]:
        assert "error" not in phase, phase
        assert phase["online"]["requests"] >= 40, phase["lever"]
    # The second solo ran with the trainer stopped, as the first ran before it started.
    by_lever = {phase["lever"]: phase for phase in report["phases"]}
    assert by_lever["solo"]["trainer_it_per_s"] is None
    assert by_lever["solo-after"]["trainer_it_per_s"] is None
    assert by_lever["native"]["trainer_it_per_s"]
    # The MPS comparison: both workloads were clients of the doctor's own server, which was
    # told to quit, is gone, and whose directories are removed; it sent no control.
    mps = report["phases"][-1]
    assert mps["kind"] == "comparison" and mps["calls"] == {} and mps["trainer_it_per_s"]
    started, quit_ = fake_mps.read_text().splitlines()
    pipe = started.removeprefix("start ")
    assert quit_ == f"quit {pipe}" and not Path(pipe).exists() and not server_pids(pipe)
    assert lab.online is not None and lab.trainer is not None
    assert lab.online.env[PIPE] == lab.trainer.env[PIPE] == pipe
    assert PIPE not in lab.env  # the workloads after it (none here) are not clients
    assert "about 60 requests a phase, so a p99 is indicative" in report["notes"][0]
    # Everything a lever set was put back: every TSG its own 2048 µs again, CTA back to CILP.
    assert set(rm.timeslice.values()) == {2048}
    assert set(rm.cilp.values()) == {2}
    modes_sent = [
        f["cilpPreemptMode"] for c, _, f in rm.calls
        if c == abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE
    ]  # fmt: skip
    assert 1 in modes_sent and 2 in modes_sent  # cta+timeslice-1us-8ms, cilp+timeslice
    # WFI went to the online stream's compute channels (online-wfi+timeslice-1us-8ms), CTA to
    # the trainer's: two other clients.
    wfi = {client for client, _, mode in rm.modes_set if mode == 0}
    cta = {client for client, _, mode in rm.modes_set if mode == 1}
    assert wfi and cta and not wfi & cta
    # Per-request levers sent their control at (nearly) every request of their phase.
    by_lever = {phase["lever"]: phase for phase in report["phases"]}
    restarts = by_lever["realtime+restart"]["calls"]["NVA06F_CTRL_CMD_RESTART_RUNLIST"]
    assert restarts["sent"] >= 0.8 * 0.4 * 200
    for name in ("disable-per-request", "disable-beside-request"):
        disables = by_lever[name]["calls"]["NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS"]
        assert disables["sent"] >= 2 * 0.8 * 0.4 * 200, name  # a disable before, an enable after
    assert not rm.disabled  # whenever a phase ended, the trainer was enabled again
    assert report["preemption_modes"]  # read before anything was changed
    assert lab.online is not None and lab.online.proc.poll() is not None
    assert lab.trainer is not None and lab.trainer.proc.poll() is not None
    assert "lever" in report["recommendation"]


class FakeTrace:
    """A FECS trace that logs one switch in each online request next to the trainer, on a GPU
    timer 5 s ahead of CLOCK_MONOTONIC_RAW: the trainer's save ends 150 µs after the launch, the
    online context starts 90 µs later and runs 250 µs."""

    OFFSET = 5_000_000_000

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.steps = [{"step": "enable", "status": "0x0"}]
        self.seen = 0
        self.dropped = 0
        self.closed = False

    def open(self) -> None:
        pass

    def gpu_minus_cpu_ns(self) -> int:
        return self.OFFSET

    def read(self) -> list[fecs.Record]:
        lab = self.lab
        if lab.online is None:
            return []
        launches = list(lab.online.launches)
        fresh, self.seen = launches[self.seen :], len(launches)
        if lab.trainer is None:
            return []  # alone, the online context is never switched
        trainer, online = lab.trainer.pid, lab.online.pid
        records = []
        for _, (launch, _, _) in fresh:
            gpu = launch + self.OFFSET
            records += [
                fecs.Record(abi.FECS_TAG_SIMPLE_END, 0x20, trainer, gpu + 150_000, 0),
                fecs.Record(abi.FECS_TAG_SIMPLE_START, 0x20, online, gpu + 240_000, 0),
                fecs.Record(abi.FECS_TAG_SIMPLE_END, 0x20, online, gpu + 490_000, 0),
                fecs.Record(abi.FECS_TAG_SIMPLE_START, 0x20, trainer, gpu + 550_000, 0),
            ]
        return records

    def close(self) -> None:
        self.closed = True


def test_where_the_gpu_logs_its_switches_each_phase_says_what_they_cost(fake_torch: None) -> None:
    rm = FakeRm()
    lab, _ = lab_with(rm)
    traces: list[FakeTrace] = []

    def trace(gpu: int, bus: str | None) -> FakeTrace:
        assert (gpu, bus) == (0, "0000:3b:00.0")
        traces.append(FakeTrace(lab))
        return traces[-1]

    config = DoctorConfig(
        gpu=0, hz=200, phase_s=0.2, settle_s=0.05, levers=("timeslice-1us-8ms",), mps=False
    )
    report = Doctor(lab, config, trace=trace).run({"index": 0, "bus": "0000:3b:00.0"})
    assert report["fecs"] == {"steps": [{"step": "enable", "status": "0x0"}]}
    by_lever = {p["lever"]: p for p in report["phases"]}
    assert "fecs" not in by_lever["solo"] or by_lever["solo"]["fecs"]["offline_to_online"] == 0
    pair = by_lever["timeslice-1us-8ms"]["fecs"]
    assert pair["offline_to_online"] >= 30 and pair["restore_us"]["p50"] == 90.0
    assert pair["online_run_us"]["p50"] == 250.0 and pair["dropped_so_far"] == 0
    # Every request of the window placed on the GPU's log, through the clocks' offset.
    waits = pair["requests"]
    assert (
        waits["placed"] == waits["requests"] == by_lever["timeslice-1us-8ms"]["online"]["requests"]
    )
    assert waits["to_save_end_us"]["p50"] == 150.0 and waits["to_start_us"]["p99"] == 240.0
    # The workload says when its launch call returned: the call (the stand-in for PyTorch takes
    # its time), and the rest of the way to the save's end, 150 µs after the launch.
    call, rest = waits["launch_call_us"], waits["returned_to_save_end_us"]
    assert call["n"] == waits["requests"] and call["p50"] > 0 and rest["n"] == waits["placed"]
    assert rest["mean"] == pytest.approx(150.0 - call["mean"], abs=0.2)
    assert report["promise"]["lever"] == "timeslice-1us-8ms"  # the run says what it promises
    assert traces[0].closed  # with the run
    assert "the FECS context-switch trace was read" in " ".join(report["notes"])
    line = next(x for x in table(report) if x.startswith("| timeslice-1us-8ms |"))
    assert line.endswith(f"| {pair['offline_to_online']} (90 / 90), 250, 150 |")
    # As read on a lent H200 (call 30C): one switch per request, the restore under each lever.
    results = Path(__file__).parents[2] / "tools" / "gpu" / "results"
    run = json.loads((results / "2026-12-03-doctor-fecs-8192-h200-call30C.json").read_text())
    rows = {x.split(" | ")[0]: x for x in table(run) if x.startswith("| ")}
    assert rows["| native"].endswith("| 1211 (97 / 109), 289 |")
    assert rows["| cta+timeslice-1us-8ms"].endswith("| 1213 (98 / 102), 291 |")
    assert rows["| solo"].endswith("| 0 |")
    # Call 30D placed every request: the launch to the trainer's save end under each lever.
    run = json.loads(
        (results / "2026-12-03-doctor-fecs-requests-8192-h200-call30D.json").read_text()
    )
    rows = {x.split(" | ")[0]: x for x in table(run) if x.startswith("| ")}
    assert rows["| timeslice-1us-8ms"].endswith("| 1509 (97 / 100), 289, 220 |")
    assert rows["| native"].endswith("| 1508 (97 / 105), 289, 1158 |")
    # Call 31B: WFI on the online stream's channels left its restore where it was.
    run = json.loads((results / "2026-12-03-doctor-online-wfi-8192-h200-call31B.json").read_text())
    rows = {x.split(" | ")[0]: x for x in table(run) if x.startswith("| ")}
    assert rows["| timeslice-1us-8ms"].endswith("| 1510 (97 / 99), 288, 206 |")
    assert rows["| online-wfi+timeslice-1us-8ms"].endswith("| 1518 (96 / 99), 285, 196 |")

    # A read whose ioctl fails leaves the phase without its FECS part; the run goes on.
    class Broken(FakeTrace):
        def read(self) -> list[fecs.Record]:
            raise rmctl.RmError("RM control NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET failed: I/O error")

    lab, _ = lab_with(FakeRm())
    report = Doctor(lab, config, trace=lambda gpu, bus: Broken(lab)).run({"index": 0})
    levers = ["solo", "native", "timeslice-1us-8ms", "solo-after"]
    assert [p["lever"] for p in report["phases"]] == levers
    assert all("fecs" not in p and "error" not in p for p in report["phases"])
    # Not asked for (--no-fecs): no trace is opened, and nothing said of it.
    quiet = DoctorConfig(
        gpu=0, hz=200, phase_s=0.2, settle_s=0.05, levers=(), mps=False, fecs=False
    )
    report = Doctor(lab_with(FakeRm())[0], quiet, trace=trace).run({"index": 0, "bus": None})
    assert "fecs" not in report and len(traces) == 1
    assert all("fecs" not in p for p in report["phases"])
    # Without it, the run goes on and says why.
    lab, _ = lab_with(FakeRm())
    report = Doctor(lab, config).run({"index": 0})
    assert report["fecs"]["error"] == "FECS trace: open /dev/nvidiactl: No such file or directory"
    assert all("fecs" not in p for p in report["phases"])
    assert any(n.startswith("the FECS context-switch trace was not read") for n in report["notes"])
    assert not any("FECS" in x for x in table(report)[:4])


def test_a_disable_beside_the_request_does_not_hold_the_request_up(fake_torch: None) -> None:
    """disable-beside-request sends its FIFO_DISABLE_CHANNELS from another thread, as qgpu.ko
    closes a pod when it sees online work: with RM taking 30 ms to answer each disable, the
    requests of disable-per-request wait that long and those beside it do not; both enable the
    trainer again."""
    rm = FakeRm()
    rm.disable_s = 0.03
    lab, _ = lab_with(rm)
    levers = ("native", "disable-per-request", "disable-beside-request")
    config = DoctorConfig(gpu=0, hz=20, phase_s=1.0, settle_s=0.1, levers=levers, mps=False)
    report = Doctor(lab, config).run({"index": 0})
    by_lever = {phase["lever"]: phase for phase in report["phases"]}
    waited, beside = by_lever["disable-per-request"], by_lever["disable-beside-request"]
    assert waited["online"]["p50_ms"] >= 30
    assert beside["online"]["p50_ms"] < 10, beside["online"]
    sent = beside["calls"]["NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS"]["sent"]
    assert sent >= 2 * 0.8 * 1.0 * 20  # a disable and an enable for (nearly) every request
    assert not rm.disabled


def test_refusals_are_recorded_and_a_refused_lever_is_never_recommended(fake_torch: None) -> None:
    rm = FakeRm(refuse={abi.NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY})
    lab, _ = lab_with(rm)
    config = DoctorConfig(
        gpu=0, hz=200, phase_s=0.3, settle_s=0.1, levers=("native", "interleaved")
    )
    report = Doctor(lab, config).run({"index": 0})
    (interleaved,) = [p for p in report["phases"] if p["lever"] == "interleaved"]
    policy = interleaved["calls"]["NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY"]
    assert policy["statuses"] == ["0x1b"]
    assert report["recommendation"]["lever"] != "interleaved"
    assert any("interleaved" in line and "0x1b" in line for line in table(report))


def phase(lever: str, kind: str, p99: float, trainer: float, status: str = "0x0") -> dict[str, Any]:
    return {
        "lever": lever,
        "kind": kind,
        "online": {"p99_ms": p99, "requests": 600},
        "trainer_it_per_s": trainer,
        "calls": {"X": {"sent": 1, "statuses": [status], "median_us": 300.0}},
    }


def test_the_recommendation_prefers_a_setting_that_keeps_the_trainer() -> None:
    native = phase("native", "baseline", 2.8, 100.0)
    # The per-request lever is fastest, one setting starves the trainer, one setting works.
    phases = [
        native,
        phase("starves", "setting", 0.6, 80.0),
        phase("works", "setting", 1.2, 97.0),
        phase("per-req", "per-request", 0.9, 99.0),
        phase("refused", "setting", 0.5, 100.0, status="0x1b"),
    ]
    rec = recommend(phases)
    assert (rec["lever"], rec["kind"], rec["trainer_keeps"]) == ("works", "setting", 0.97)
    # Without a working setting, the per-request lever, saying what it costs.
    rec = recommend([native, phase("per-req", "per-request", 0.9, 99.0)])
    assert rec["lever"] == "per-req" and "a control at every request" in rec["why"]
    # Nothing beats native by 10 %: no lever, and why.
    rec = recommend([native, phase("meh", "setting", 2.6, 100.0)])
    assert rec["lever"] is None and "beat native's online p99 (2.80 ms) by 10%" in rec["why"]


def timed(lever: str, p50: float, p99: float, kind: str = "setting") -> dict[str, Any]:
    return {**phase(lever, kind, p99, 100.0), "online": {"p50_ms": p50, "p99_ms": p99}}


def test_the_recommendation_is_the_lever_nearest_solo_on_both_targets() -> None:
    native = {**phase("native", "baseline", 2.8, 100.0), "online": {"p50_ms": 1.7, "p99_ms": 2.8}}
    solo = {**phase("solo", "baseline", 0.8, 0.0), "online": {"p50_ms": 0.5, "p99_ms": 0.8}}
    # The lowest p99 by a hair, with a p50 far from solo's, against one near on both.
    hair = timed("hair", p50=0.85, p99=1.00)
    near = timed("near", p50=0.62, p99=1.05)
    rec = recommend([native, solo, hair, near])
    assert rec["lever"] == "near" and rec["online_p50_ms"] == 0.62
    assert (
        "the nearest to solo's 0.50 / 0.80 ms: 1.03 x the bound of its worse target" in rec["why"]
    )
    # Without solo, the p99 alone.
    assert recommend([native, hair, near])["lever"] == "hair"
    # A noisy solo p99 still ranks the tails: the H100 doctor run of 2026-11-26 (solo 0.47 /
    # 0.98 ms), where a p50 3 % lower must not win against half the p99.
    noisy = {**solo, "online": {"p50_ms": 0.47, "p99_ms": 0.98}}
    low_p50 = timed("timeslice-1us", p50=0.72, p99=2.00)
    low_p99 = timed("cilp+timeslice", p50=0.74, p99=0.90)
    assert recommend([native, noisy, low_p50, low_p99])["lever"] == "cilp+timeslice"


def test_the_engines_pair_is_left_only_for_a_lever_clearly_nearer_solo() -> None:
    """A phase of a few hundred requests cannot tell levers within 5 % apart; the engine's pair
    was chosen on runs of 3 001 (qpolicy/engine.py)."""
    native = {**phase("native", "baseline", 2.8, 100.0), "online": {"p50_ms": 1.7, "p99_ms": 2.8}}
    solo = {**phase("solo", "baseline", 0.8, 0.0), "online": {"p50_ms": 0.5, "p99_ms": 0.8}}
    engine = timed("timeslice-1us-8ms", p50=0.73, p99=0.85)  # 0.73 / 0.6: 1.217 x its bound
    close = timed("timeslice", p50=0.72, p99=0.91)  # 1.200 x: 1.4 % nearer
    rec = recommend([native, solo, engine, close])
    assert rec["lever"] == "timeslice-1us-8ms"
    assert "timeslice was within 5% of it (1.20 x)" in rec["why"]
    clear = timed("timeslice", p50=0.66, p99=0.91)  # 1.100 x: 9.6 % nearer
    assert recommend([native, solo, engine, clear])["lever"] == "timeslice"
    # Where the engine's pair does not qualify (here the trainer slowed), the nearest qualifying.
    slow = {**engine, "trainer_it_per_s": 90.0}
    assert recommend([native, solo, slow, close])["lever"] == "timeslice"


def test_cta_from_short_kernels_needs_its_check_next_to_long_ones() -> None:
    """The daemon sets CTA on every offline pod of the GPU, and next to the 8192 trainer CTA
    doubled the online p50 on an H100 and an H200 (1.46 against 0.73 ms; 1.40 against 0.65 ms),
    where next to short kernels it was the nearest solo (H100, call 13A)."""
    native = {**phase("native", "baseline", 2.8, 100.0), "online": {"p50_ms": 0.7, "p99_ms": 2.8}}
    solo = {**phase("solo", "baseline", 0.8, 0.0), "online": {"p50_ms": 0.5, "p99_ms": 0.8}}
    pair = timed("timeslice-1us-8ms", p50=0.75, p99=1.0)
    cta = timed("cta+timeslice-1us-8ms", p50=0.62, p99=0.95)
    short = [native, solo, pair, cta]

    def check(lever: str, p50: float, p99: float, trainer: float = 550.0) -> dict[str, Any]:
        return {**timed(lever, p50, p99), "kind": "check", "trainer_n": 8192,
                "trainer_it_per_s": trainer}  # fmt: skip

    # A run with the long trainer itself measured CTA there: nothing more to check.
    assert recommend(short)["lever"] == "cta+timeslice-1us-8ms"
    assert recommend(short)["long_kernels_checked"] is True
    # Short kernels, no check: the pair, and why not CTA.
    rec = recommend(short, trainer_n=2048)
    assert rec["lever"] == "timeslice-1us-8ms" and "long_kernels_checked" not in rec
    assert "cta+timeslice-1us-8ms held back: not measured next to the 8192 trainer" in rec["why"]
    # The check passes within the noise margin of the pair's there.
    fine = [check("timeslice-1us-8ms", 0.65, 1.27), check("cta+timeslice-1us-8ms", 0.68, 1.30)]
    rec = recommend([*short, *fine], trainer_n=2048)
    assert rec["lever"] == "cta+timeslice-1us-8ms" and rec["long_kernels_checked"] is True
    # The measured H200 check (call 30A's 8192 row): CTA's p50 twice the pair's.
    bad = [check("timeslice-1us-8ms", 0.65, 1.27), check("cta+timeslice-1us-8ms", 1.40, 2.23)]
    rec = recommend([*short, *bad], trainer_n=2048)
    assert rec["lever"] == "timeslice-1us-8ms"
    assert (
        "cta+timeslice-1us-8ms held back: next to the 8192 trainer it did worse than the "
        "engine's pair (timeslice-1us-8ms): p50 1.40 against 0.65 ms, p99 2.23 against 1.27 ms"
    ) in rec["why"]
    # Its trainer slowed there, or the pair's check is missing or refused: held back too.
    slow = [check("timeslice-1us-8ms", 0.65, 1.27), check("cta+timeslice-1us-8ms", 0.65, 1.27, 500)]
    assert "trainer 91% of the pair's" in recommend([*short, *slow], trainer_n=2048)["why"]
    alone = [check("cta+timeslice-1us-8ms", 0.6, 1.0)]
    assert recommend([*short, *alone], trainer_n=2048)["lever"] == "timeslice-1us-8ms"
    refused = [{**fine[0], "calls": {"X": {"sent": 1, "statuses": ["0x1b"], "median_us": 1.0}}},
               fine[1]]  # fmt: skip
    rec = recommend([*short, *refused], trainer_n=2048)
    assert rec["lever"] == "timeslice-1us-8ms" and "check next to the 8192" in rec["why"]
    # Nothing else qualifies: no lever, and CTA's reason with it.
    rec = recommend([native, solo, cta, *bad], trainer_n=2048)
    assert rec["lever"] is None and "cta+timeslice-1us-8ms held back" in rec["why"]
    # The check on a lent H200 (call 30B), said although CTA did not beat native's p99 by 10 %.
    results = Path(__file__).parents[2] / "tools" / "gpu" / "results"
    run = json.loads((results / "2026-12-03-doctor-2048-cta-checked-h200-call30B.json").read_text())
    assert (
        "held back: next to the 8192 trainer it did worse than the engine's pair "
        "(timeslice-1us-8ms): p50 1.52 against 0.76 ms, p99 2.40 against 1.09 ms"
    ) in recommend(run["phases"], trainer_n=2048)["why"]


def test_a_short_kernel_run_checks_its_preemption_lever_next_to_the_long_trainer(
    fake_torch: None,
) -> None:
    rm = FakeRm()
    lab, _ = lab_with(rm)
    levers = ("timeslice-1us-8ms", "cta+timeslice-1us-8ms")
    config = DoctorConfig(
        gpu=0, trainer_n=2048, hz=200, phase_s=0.3, settle_s=0.1, levers=levers, mps=False
    )
    started: list[int] = []
    start_trainer = lab.start_trainer

    def starting(n: int, **kwargs: Any) -> Any:
        started.append(n)
        return start_trainer(n, **kwargs)

    lab.start_trainer = starting  # type: ignore[method-assign]
    report = Doctor(lab, config).run({"index": 0})
    shape = [(p["lever"], p["kind"], p.get("trainer_n")) for p in report["phases"]]
    assert shape == [
        ("solo", "baseline", None),
        ("native", "baseline", None),
        ("timeslice-1us-8ms", "setting", None),
        ("cta+timeslice-1us-8ms", "setting", None),
        ("timeslice-1us-8ms", "check", 8192),
        ("cta+timeslice-1us-8ms", "check", 8192),
        ("solo-after", "baseline", None),
    ]
    for p in report["phases"][-3:-1]:
        assert "error" not in p and p["online"]["requests"] >= 20 and p["trainer_it_per_s"]
    # The check ran next to a trainer of 8192, which replaced the 2048 one; the second solo
    # ran with it stopped.
    assert started == [2048, 8192] and lab.trainer is None
    assert set(rm.timeslice.values()) == {2048} and set(rm.cilp.values()) == {2}
    lines = table(report)
    assert any(
        line.startswith("| cta+timeslice-1us-8ms (8192 trainer) | check |") for line in lines
    )
    assert (
        "note: cta+timeslice-1us-8ms and the engine's pair measured again next to a 8192 "
        "trainer (kind check): the daemon would set it on every offline pod, whatever kernels "
        "they run"
    ) in lines
    # A long trainer that does not start fails the check, not the run: CTA is held back.
    rm = FakeRm()
    lab, _ = lab_with(rm)
    start = lab.start_trainer

    def no_long_trainer(n: int, **kwargs: Any) -> Any:
        if n == 8192:
            raise QPolicyError("a doctor workload did not start within 120 s: out of memory")
        return start(n, **kwargs)

    lab.start_trainer = no_long_trainer  # type: ignore[method-assign]
    report = Doctor(lab, config).run({"index": 0})
    checks = [p for p in report["phases"] if p["kind"] == "check"]
    assert [p["lever"] for p in checks] == list(levers) and len(report["phases"]) == 7
    assert all("QPolicyError: a doctor workload did not start" in p["error"] for p in checks)
    rec = report["recommendation"]
    assert rec["lever"] != "cta+timeslice-1us-8ms"
    assert (
        "cta+timeslice-1us-8ms held back: its check next to the 8192 trainer failed" in rec["why"]
    )
    assert lab.online is not None and lab.online.proc.poll() is not None  # stopped all the same
    # A run next to the long trainer, or without a preemption lever, adds no check.
    for trainer_n, chosen in ((8192, levers), (2048, levers[:1])):
        config = DoctorConfig(
            gpu=0, trainer_n=trainer_n, hz=200, phase_s=0.2, settle_s=0.05, levers=chosen,
            mps=False,
        )  # fmt: skip
        report = Doctor(lab_with(FakeRm())[0], config).run({"index": 0})
        assert all(p["kind"] != "check" for p in report["phases"]), (trainer_n, chosen)


@pytest.mark.parametrize(
    ("run", "lever"),
    [
        ("2026-11-24-doctor-h100", "timeslice-1us"),
        ("2026-11-24-doctor-h200", "timeslice-1us"),
        ("2026-11-26-doctor-h200", "timeslice-1us"),
        # A noisy host: most levers' p99 near 2 ms, cilp+timeslice's 0.90.
        ("2026-11-26-doctor-h100", "cilp+timeslice"),
        ("2026-11-26-doctor-h100-g", "timeslice-1us"),
        ("2026-11-26-doctor-h100-callW", "timeslice-1us"),
        # The first run with the 1 us / 8192 us lever, within noise of 1 us / 1 s.
        ("2026-11-26-doctor-h100-callZ3", "timeslice-1us-8ms"),
        # 128 / 8192 us was nearer solo by 0.7 %: the engine's pair (1 / 8192 us) is kept.
        ("2026-11-26-doctor-h100-callAA-8192-cta", "timeslice-1us-8ms"),
        # Next to the 2048 trainer nothing beat native's p99 by 10 %.
        ("2026-11-26-doctor-h100-callAA-2048-cta", None),
        # Every lever on another host, the engine's pair 1 / 8192 us: timeslice-1us within 5 %.
        ("2026-11-26-doctor-h100-callBD", "timeslice-1us-8ms"),
        # With the MPS comparison row, which beat every lever's p50 next to the 2048 trainer and
        # is never recommended (MPS is not a lever qpolicy sets).
        ("2026-11-27-doctor-mps-8192-h100-call13A", "timeslice-1us-8ms"),
        # CTA was nearest solo, by more than 5 %, next to the 2048 trainer; the run did not
        # measure it next to the 8192 one, so the engine's pair (until 2026-12-03: CTA).
        ("2026-11-27-doctor-mps-2048-h100-call13A", "timeslice-1us-8ms"),
        ("2026-11-27-doctor-mps-8192-h200-call13B", "timeslice-1us-8ms"),
        ("2026-11-27-doctor-mps-2048-h200-call13B", "timeslice-1us-8ms"),
        # 20 s phases next to the 2048 trainer: CTA's p50 under native's, its p99 over it.
        ("2026-12-02-doctor-2048-cta-h200-call29B", None),
        # The same, with CTA checked next to the 8192 trainer (its p50 1.52 against 0.76 ms).
        ("2026-12-03-doctor-2048-cta-checked-h200-call30B", "timeslice-1us-8ms"),
        # With the FECS trace read (call 30C): the pair next to the 8192 trainer, nothing next
        # to the 2048 one.
        ("2026-12-03-doctor-fecs-8192-h200-call30C", "timeslice-1us-8ms"),
        ("2026-12-03-doctor-fecs-2048-h200-call30C", None),
        # Each request placed on the FECS log (call 30D); next to the 2048 trainer the pair kept
        # it at 68 % in this phase, the lowest of any run.
        ("2026-12-03-doctor-fecs-requests-8192-h200-call30D", "timeslice-1us-8ms"),
        ("2026-12-03-doctor-fecs-requests-2048-h200-call30D", None),
        # Again with 20 s phases (call 30E): the pair kept the trainer at 96 %.
        ("2026-12-03-doctor-fecs-requests-2048-20s-h200-call30E", None),
        # The FECS opening of 9cbc486-9805259 on a real driver, with the MPS comparison and each
        # request's launch call timed (call 31A).
        ("2026-12-03-doctor-promise-8192-h200-call31A", "timeslice-1us-8ms"),
        ("2026-12-03-doctor-promise-2048-h200-call31A", "timeslice-1us-8ms"),
        # WFI on the online stream's channels (call 31B): its restore unchanged (96 against 97
        # µs), within 5 % of the pair next to the 8192 trainer; next to the 2048 one nothing
        # beat native's p99 by 10 %.
        ("2026-12-03-doctor-online-wfi-8192-h200-call31B", "timeslice-1us-8ms"),
        ("2026-12-03-doctor-online-wfi-2048-h200-call31B", None),
    ],
)
def test_the_recorded_doctor_runs_recommend_what_was_nearest_solo(
    run: str, lever: str | None
) -> None:
    # The phases measured on lent GPUs (580.159.04). On 2026-11-24 the lowest p99 picked
    # timeslice+rebuild on the H100 (1.025 ms) and cilp+timeslice on the H200 (0.981 ms), each a
    # few requests ahead of the next; GPreempt's 1 us / 1 s pair had the lowest p50 on both and
    # was the better lever in `make bench-gpu` on an H200 on 2026-11-26 (3 001 requests: p50 /
    # p99 0.62 / 0.87 ms against 0.68 / 1.18 with the engine's 128 / 8192 us).
    results = Path(__file__).parents[2] / "tools" / "gpu" / "results"
    report = json.loads((results / f"{run}.json").read_text())
    trainer = report["workloads"]["trainer"]
    assert trainer.startswith("bf16 matmul n=")
    assert (
        recommend(report["phases"], int(trainer.removeprefix("bf16 matmul n=")))["lever"] == lever
    )


def test_the_cache_round_trips_and_ignores_what_it_cannot_read(tmp_path: Path) -> None:
    report = {"schema": 1, "gpu": {"index": 2}, "recommendation": {"lever": "timeslice"}}
    path = write_cache(tmp_path, report)
    assert path.name == "doctor-gpu2.json" and read_cache(tmp_path, 2) == report
    assert read_cache(tmp_path, 0) is None
    path.write_text("{")
    assert read_cache(tmp_path, 2) is None
    path.write_text('{"schema": 99}')
    assert read_cache(tmp_path, 2) is None


def test_a_cache_that_cannot_be_written_keeps_the_last_and_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {"schema": 1, "gpu": {"index": 0}, "recommendation": {"lever": "timeslice"}}
    write_cache(tmp_path, first)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        write_cache(tmp_path, {**first, "recommendation": {"lever": "cta"}})
    monkeypatch.undo()
    assert read_cache(tmp_path, 0) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor-gpu0.json"]


def test_the_command_refuses_what_cannot_work(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(tmp_path)}
    bad = subprocess.run(
        [str(script), "doctor", "--levers", "timeslice,warp"], env=env, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("qpolicy: error: invalid lever(s) 'warp': expected ")
    for side, why in (("100", "a whole number from 256"), ("2048.5", "a whole number from 256"),
                      ("65536", "at most 32768"), ("big", "expected a number")):  # fmt: skip
        bad = subprocess.run(
            [str(script), "doctor", "--trainer-n", side], env=env, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert bad.returncode == 2, side
        assert bad.stderr.startswith(f"qpolicy: error: invalid trainer matmul side {side!r}")
        assert why in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU")
    no_gpu = subprocess.run(
        [str(script), "doctor"], env=env, capture_output=True, text=True, check=False
    )
    assert no_gpu.returncode == 1
    expected = (
        "qpolicy doctor needs root" if os.geteuid() != 0 else "qpolicy doctor needs an NVIDIA GPU"
    )
    assert no_gpu.stderr.startswith(f"qpolicy: error: {expected}")


def test_a_run_of_chosen_levers_still_measures_the_baselines(fake_torch: None) -> None:
    """--levers timeslice-1us on a GPU host (2026-11-26, call R) measured no native phase, so
    the doctor recommended nothing and its cache turned the daemon back to the engine's pair."""
    rm = FakeRm()
    lab, _ = lab_with(rm)
    config = DoctorConfig(
        gpu=0, hz=200, phase_s=0.3, settle_s=0.1, levers=("timeslice-1us",), mps=False
    )
    report = Doctor(lab, config).run({"index": 0})
    names = [p["lever"] for p in report["phases"]]
    assert names == ["solo", "native", "timeslice-1us", "solo-after"]
    assert report["recommendation"].get("why") != "no native baseline was measured"


def test_the_trainer_side_reaches_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import qpolicy.doctor.checkup
    from qpolicy.cli.doctor import doctor

    seen: list[DoctorConfig] = []

    def checkup(config: DoctorConfig, state_dir: object) -> dict[str, object]:
        seen.append(config)
        return {"phases": []}

    monkeypatch.setattr(qpolicy.doctor.checkup, "checkup", checkup)
    doctor(trainer_n="2048", levers="cta+timeslice-1us-8ms", no_cache=True, as_json=True)
    assert seen[0].trainer_n == 2048 and seen[0].levers == ("cta+timeslice-1us-8ms",)
    assert json.loads(capsys.readouterr().out) == {"phases": []}
    assert seen[0].mps and seen[0].fecs
    doctor(no_mps=True, no_fecs=True, no_cache=True, as_json=True)
    assert not seen[1].mps and not seen[1].fecs
    capsys.readouterr()


def test_without_the_mps_tools_the_comparison_says_so_and_the_run_goes_on(
    fake_torch: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control
    rm = FakeRm()
    lab, _ = lab_with(rm)
    config = DoctorConfig(gpu=0, hz=200, phase_s=0.3, settle_s=0.1, levers=("timeslice-1us",))
    report = Doctor(lab, config).run({"index": 0})
    *levers, mps = report["phases"]
    assert [p["lever"] for p in levers] == ["solo", "native", "timeslice-1us", "solo-after"]
    assert all("error" not in p for p in levers)
    assert mps["lever"] == "mps" and "nvidia-cuda-mps-control is not on PATH" in mps["error"]
    assert mps["online"]["requests"] == 0 and mps["trainer_it_per_s"] is None
    rows = [line for line in table(report) if line.startswith("| mps | comparison |")]
    assert len(rows) == 1 and "error: QPolicyError" in rows[0]
    assert lab.online is not None and lab.online.proc.poll() is not None


def test_a_server_that_does_not_quit_is_named_and_its_directory_kept(
    fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_STUCK", "1")
    quit_late = pytest.raises(QPolicyError, match=r"did not quit within 0.3 s \(pids \d+")
    with quit_late, mps_server(quit_timeout_s=0.3) as dirs:
        (pid,) = server_pids(dirs[PIPE])
    assert Path(dirs[PIPE]).exists()  # still the running server's
    os.kill(pid, signal.SIGKILL)


def test_the_comparison_is_never_recommended() -> None:
    native = {**phase("native", "baseline", 2.8, 100.0), "online": {"p50_ms": 1.7, "p99_ms": 2.8}}
    mps = {**phase("mps", "comparison", 0.5, 100.0), "online": {"p50_ms": 0.4, "p99_ms": 0.5}}
    mps["calls"] = {}
    lever = timed("timeslice-1us-8ms", p50=0.73, p99=0.85)
    assert recommend([native, mps, lever])["lever"] == "timeslice-1us-8ms"
    assert recommend([native, mps])["lever"] is None


def test_an_experiment_is_measured_and_never_recommended() -> None:
    native = {**phase("native", "baseline", 2.8, 100.0), "online": {"p50_ms": 1.7, "p99_ms": 2.8}}
    experiment = next(lever for lever in LEVERS if lever.kind == "experiment")
    assert experiment.name == "online-wfi+timeslice-1us-8ms"
    faster = timed(experiment.name, p50=0.40, p99=0.50, kind="experiment")
    lever = timed("timeslice-1us-8ms", p50=0.73, p99=0.85)
    assert recommend([native, faster, lever])["lever"] == "timeslice-1us-8ms"
    assert recommend([native, faster])["lever"] is None


def test_server_pids_are_the_mps_processes_of_one_pipe_directory(tmp_path: Path) -> None:
    def process(pid: int, comm: str, pipe: str) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "comm").write_text(comm + "\n")
        (entry / "environ").write_bytes(f"HOME=/root\0{PIPE}={pipe}\0".encode())

    process(10, "nvidia-cuda-mps", "/tmp/a/pipe")
    process(11, "nvidia-cuda-mps", "/tmp/b/pipe")  # another server, on other directories
    process(12, "python3", "/tmp/a/pipe")  # a client of it
    process(13, "nvidia-cuda-mps", "/tmp/a/pipe/x")
    (tmp_path / "self").mkdir()
    assert server_pids("/tmp/a/pipe", tmp_path) == [10]
