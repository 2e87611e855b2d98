"""The online strategy: taken from the doctor's cached result for the GPU, never from a constant,
and never stopping the daemon on a damaged cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpolicy.enforcers.strategy import (
    DEFAULT,
    doctor_cache_path,
    from_doctor,
    read_doctor_cache,
    strategy_for,
)
from qpolicy.engine import OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US, plan
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec


def report(
    lever: str | None, why: str = "", kind: str = "setting", **recommendation: object
) -> dict[str, object]:
    return {
        "schema": 1,
        "date": "2026-11-24",
        "recommendation": {"lever": lever, "why": why, "kind": kind, **recommendation},
    }


@pytest.mark.parametrize(
    ("lever", "offline", "online"),
    [
        ("timeslice", 128, 8192),
        ("timeslice+rebuild", 128, 8192),
        ("timeslice-new", 128, 8192),
        ("cilp+timeslice", 128, 8192),
        ("timeslice-1us", 1, 1_000_000),
        ("timeslice-1us-8ms", 1, 8192),
    ],
)
def test_a_recommended_timeslice_setting_becomes_the_strategy(
    lever: str, offline: int, online: int
) -> None:
    strategy = from_doctor(report(lever))
    assert (strategy.offline_timeslice_us, strategy.online_timeslice_us) == (offline, online)
    assert lever in strategy.source and "2026-11-24" in strategy.source


@pytest.mark.parametrize("lever", ["disable-per-request", "preempt-per-request", None])
def test_per_request_levers_and_no_lever_keep_the_engine_default(lever: str | None) -> None:
    strategy = from_doctor(report(lever, "nothing beat native", kind="per-request"))
    assert strategy.is_default
    assert (strategy.offline_timeslice_us, strategy.online_timeslice_us) == (
        OFFLINE_TIMESLICE_US,
        ONLINE_TIMESLICE_US,
    )
    assert (
        ("per request" in strategy.source) if lever else ("nothing beat native" in strategy.source)
    )


def test_a_setting_the_enforcers_do_not_make_keeps_the_engine_default_and_says_so() -> None:
    strategy = from_doctor(report("interleaved"))
    assert strategy.is_default
    assert "interleaved, a setting the enforcers do not make" in strategy.source


def test_the_cta_lever_is_the_engines_pair_and_cta_for_offline_contexts() -> None:
    """The doctor's cta+timeslice-1us-8ms: 1 / 8192 us and offline contexts CTA-preempted (the rm
    enforcer sets it: qpolicy.enforcers.rm.preemption)."""
    strategy = from_doctor(report("cta+timeslice-1us-8ms", long_kernels_checked=True))
    assert (strategy.offline_timeslice_us, strategy.online_timeslice_us) == (1, 8192)
    assert strategy.offline_preemption == 1 and not strategy.is_default
    assert strategy.describe()["offline_preemption"] == "CTA"
    assert from_doctor(report("timeslice-1us-8ms")).describe()["offline_preemption"] is None
    # Its timeslices are the engine's: the plan is left as it is.
    gpu = GpuConfig(0, GpuPolicy.BURST_SHARE)
    pods = [PodSpec("/on", 0, PodClass.ONLINE, 20), PodSpec("/off", 0, PodClass.OFFLINE, 80)]
    planned = plan(gpu, pods, {"/on": 0.1, "/off": 1.0})
    assert strategy.adjust(planned) is planned


@pytest.mark.parametrize(
    "damaged", [None, [], "x", {"recommendation": "timeslice"}, {"recommendation": {"lever": 3}}]
)
def test_a_damaged_result_is_the_default_not_an_exception(damaged: object) -> None:
    assert from_doctor(damaged).is_default


def test_the_cache_is_read_per_gpu_and_a_bad_file_is_no_strategy(tmp_path: Path) -> None:
    doctor_cache_path(tmp_path, 1).write_text(json.dumps(report("timeslice-1us")))
    assert strategy_for(tmp_path, 1).offline_timeslice_us == 1
    assert strategy_for(tmp_path, 0) == DEFAULT
    doctor_cache_path(tmp_path, 1).write_bytes(b"\xff{")
    assert read_doctor_cache(tmp_path, 1) is None and strategy_for(tmp_path, 1) == DEFAULT
    doctor_cache_path(tmp_path, 1).write_text(json.dumps({**report("timeslice"), "schema": 9}))
    assert strategy_for(tmp_path, 1) == DEFAULT


def test_adjust_replaces_only_the_class_timeslices_the_engine_set() -> None:
    gpu = GpuConfig(0, GpuPolicy.BURST_SHARE)
    pods = [PodSpec("/on", 0, PodClass.ONLINE, 20), PodSpec("/off", 0, PodClass.OFFLINE, 80)]
    wants = {"/on": 0.1, "/off": 1.0}
    with_online = plan(gpu, pods, wants)
    adjusted = from_doctor(report("timeslice-1us")).adjust(with_online)
    assert {s.pod: s.timeslice_us for s in adjusted.slices} == {"/on": 1_000_000, "/off": 1}
    assert [s.allocation for s in adjusted.slices] == [s.allocation for s in with_online.slices]
    # Without online pods the engine leaves the tenants' own timeslices: so does the strategy.
    offline_only = plan(gpu, pods[1:], wants)
    assert from_doctor(report("timeslice-1us")).adjust(offline_only) == offline_only
    assert DEFAULT.adjust(with_online) is with_online


def test_the_rm_backend_takes_each_gpus_strategy_from_its_doctor_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from qpolicy.backends.base import BackendContext
    from qpolicy.backends.rm import RmBackend
    from qpolicy.runtime.realtime import RealtimeLoop
    from qpolicy.state import DesiredState
    from qpolicy.telemetry.cgroups import CgroupMap
    from qpolicy.telemetry.probesource import ProbeSource
    from tests.unit.test_telemetry_live import FakeProbe

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    doctor_cache_path(state_dir, 1).write_text(json.dumps(report("timeslice-1us")))
    source = ProbeSource(FakeProbe(), CgroupMap(root=tmp_path))
    context = BackendContext(RealtimeLoop(), source, state_dir, lambda: tmp_path, lambda: 0.0)
    backend = RmBackend(context, gpus=list)
    try:
        state = DesiredState(
            gpus={g: GpuConfig(g, GpuPolicy.BURST_SHARE) for g in (0, 1)},
            pods={
                "/a": PodSpec("/a", 0, PodClass.ONLINE, 50),
                "/b": PodSpec("/b", 1, PodClass.ONLINE, 50),
            },
        )
        with caplog.at_level("INFO", "qpolicy.backends.rm"):
            backend.sync(state)
        gpus = backend.status()["gpus"]
        assert gpus["1"]["online_strategy"]["offline_timeslice_us"] == 1
        assert gpus["0"]["online_strategy"] == DEFAULT.describe()
        assert gpus["0"]["idle_checks"] == {"reads": 0, "found_running": 0, "refused": None}
        assert gpus["0"]["turns_handed_back"] == 0
        assert gpus["0"]["turn_ends"] == {}  # no period has ended yet
        assert gpus["0"]["periods_stretched"] == 0
        assert any("GPU 1: offline timeslice 1 us" in r.getMessage() for r in caplog.records)
    finally:
        backend.close()


def test_every_timeslice_lever_of_the_doctor_has_its_pair_here() -> None:
    from qpolicy.doctor.levers import LEVERS
    from qpolicy.enforcers.strategy import PREEMPTION_LEVERS, TIMESLICE_LEVERS

    # cta+timeslice-1us-8ms also sets a preemption mode, which the strategy carries too;
    # cilp+timeslice sets the one the channels already have (CILP on both GPUs), so its pair is
    # all it changes. An experiment (online-wfi+timeslice-1us-8ms) is never recommended.
    timeslices = {
        lever.name for lever in LEVERS if "timeslice" in lever.name and lever.kind != "experiment"
    }
    assert "online-wfi+timeslice-1us-8ms" not in timeslices
    assert set(PREEMPTION_LEVERS) == {"cta+timeslice-1us-8ms"} <= timeslices
    assert timeslices == set(TIMESLICE_LEVERS)


@pytest.mark.parametrize("checked", [None, False, "yes"])
def test_cta_unchecked_next_to_long_kernels_gives_its_timeslices_only(checked: object) -> None:
    """A doctor of before 2026-12-03 recommended CTA from a run next to short kernels alone (an
    H100's, 2026-11-27 call 13A; its JSON is in test_doctor's replay test). The daemon sets CTA
    on every offline pod, and next to long kernels it doubled the online p50 on an H100 and an
    H200 (docs/levers.md): such a cache gets the lever's timeslices and says why not CTA."""
    extra = {} if checked is None else {"long_kernels_checked": checked}
    strategy = from_doctor(report("cta+timeslice-1us-8ms", **extra))
    assert (strategy.offline_timeslice_us, strategy.online_timeslice_us) == (1, 8192)
    assert strategy.offline_preemption is None and strategy.is_default
    assert "did not check CTA next to long kernels" in strategy.source
