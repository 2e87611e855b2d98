"""The VM benches' USERD-reads part and tools/bench/qgpu_vm_ab.py: what they read off a run."""

from __future__ import annotations

import random
import re

import pytest

from qpolicy.enforcers.kmod.sysfs import PARAMS_ROOT
from tests.vm.nvmock import NVMOCK_PARAMS
from tools.bench import qgpu_vm, qgpu_vm_ab


def test_the_ab_runs_report_gpuloads_own_p50_and_p99_and_a_p90_of_its_requests() -> None:
    latencies = [float(ms) for ms in range(1, 1002)]
    random.Random(1).shuffle(latencies)
    report = {"p50_ms": 501.5, "p99_ms": 991.5, "latencies_ms": latencies}
    assert qgpu_vm_ab.quantiles(report) == {"p50_ms": 501.5, "p90_ms": 901.0, "p99_ms": 991.5}


def test_the_ab_writes_qgpus_parameters_and_nvmocks_named_with_their_module() -> None:
    assert qgpu_vm_ab.param_path("cold_look_us") == PARAMS_ROOT / "cold_look_us"
    assert qgpu_vm_ab.param_path("qgpu.poll_us") == PARAMS_ROOT / "poll_us"
    assert qgpu_vm_ab.param_path("nvmock.engine_fifo") == NVMOCK_PARAMS / "engine_fifo"
    with pytest.raises(SystemExit, match=re.escape("'nvidia.foo'")):
        qgpu_vm_ab.param_path("nvidia.foo")


def _idle_gap_and_seconds() -> tuple[float, float]:
    rate = float(qgpu_vm.IDLE[qgpu_vm.IDLE.index("--rate-hz") + 1])
    seconds = float(qgpu_vm.IDLE[qgpu_vm.IDLE.index("--seconds") + 1])
    return 1 / rate, seconds


def test_the_idle_pods_stay_up_and_quiet_through_the_window() -> None:
    """gpuload ends after its last request where the next would fall past --seconds (on
    2026-12-05 a rate of 0.1 Hz with 8 s left one request, so the pods had gone before the
    window and nothing was read): the second request must come before the end, and after the
    window, which opens once the channels have gone cold."""
    gap, seconds = _idle_gap_and_seconds()
    assert gap < seconds
    assert gap > qgpu_vm.SETTLE_S + qgpu_vm.WINDOW_S
