"""The simulated GPU's hardware scheduler, one behaviour at a time, on hand-checked timelines."""

import pytest

from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.gpu import SimGpu

SWITCH = 100.0


def make(timeslice: float = 1000.0) -> tuple[EventLoop, SimGpu]:
    loop = EventLoop()
    return loop, SimGpu(loop, switch_us=SWITCH, window_us=1000.0)


def test_a_lone_context_pays_one_load_and_runs_its_jobs_back_to_back() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 1000.0)
    done: list[float] = []
    for _ in range(3):
        gpu.submit(a, 500.0, lambda: done.append(loop.now))
    loop.run_until(10_000)
    assert done == [SWITCH + 500, SWITCH + 1000, SWITCH + 1500]
    assert gpu.gpu_time(a) == pytest.approx(1500)
    assert gpu.switches == 1


def test_two_runnable_contexts_alternate_at_timeslice_ends_mid_job() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 1000.0)
    b = gpu.add_context("b", 1000.0)
    finished: dict[str, float] = {}
    gpu.submit(a, 2500.0, lambda: finished.setdefault("a", loop.now))
    gpu.submit(b, 2500.0, lambda: finished.setdefault("b", loop.now))
    loop.run_until(20_000)
    # a: load(100) run 1000 | switch | b 1000 | switch | a 1000 | switch | b 1000 | switch | a 500
    assert finished["a"] == pytest.approx(5 * SWITCH + 4500)
    assert finished["b"] == pytest.approx(6 * SWITCH + 5000)
    assert gpu.gpu_time(a) == pytest.approx(2500)
    assert gpu.switches == 6


def test_no_preemption_without_a_competitor() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 100.0)
    gpu.submit(a, 5000.0, None)
    loop.run_until(10_000)
    assert gpu.switches == 1
    assert gpu.gpu_time(a) == pytest.approx(5000)


def test_a_late_competitor_waits_for_the_current_timeslice_end() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 1000.0)
    b = gpu.add_context("b", 1000.0)
    gpu.submit(a, 10_000.0, None)
    started: list[float] = []
    loop.at(1350.0, lambda: gpu.submit(b, 10.0, lambda: started.append(loop.now)))
    loop.run_until(20_000)
    # a runs from 100; its timeslices end at 1100, 2100: b arrives at 1350, runs after 2100 + load.
    assert started == [pytest.approx(2100 + SWITCH + 10)]


def test_disable_stops_at_once_and_enable_resumes() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 1000.0)
    gpu.submit(a, 10_000.0, None)
    loop.at(2100.0, lambda: gpu.set_enabled(a, False))
    loop.run_until(5000)
    assert gpu.gpu_time(a) == pytest.approx(2000)
    loop.at(6000.0, lambda: gpu.set_enabled(a, True))
    loop.run_until(7000)
    # Same context still loaded: no switch cost on resume.
    assert gpu.gpu_time(a) == pytest.approx(3000)
    assert gpu.switches == 1


def test_disabled_context_keeps_its_work_queued_and_is_not_idle() -> None:
    loop, gpu = make()
    a = gpu.add_context("a")
    gpu.set_enabled(a, False)
    gpu.submit(a, 100.0, None)
    loop.run_until(5000)
    assert gpu.gpu_time(a) == 0
    assert gpu.idle_for(a) == 0
    gpu.set_enabled(a, True)
    loop.run_until(10_000)
    assert gpu.gpu_time(a) == pytest.approx(100)
    assert gpu.idle_for(a) == pytest.approx(10_000 - (5000 + SWITCH + 100))


def test_disabling_the_other_context_lets_the_runner_keep_going() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 500.0)
    b = gpu.add_context("b", 500.0)
    gpu.submit(a, 4000.0, None)
    gpu.submit(b, 4000.0, None)
    gpu.set_enabled(b, False)
    loop.run_until(4100)
    assert gpu.gpu_time(a) == pytest.approx(4000)
    assert gpu.gpu_time(b) == 0


def test_timeslice_change_applies_to_the_running_context() -> None:
    loop, gpu = make()
    a = gpu.add_context("a", 8000.0)
    b = gpu.add_context("b", 8000.0)
    gpu.submit(a, 100_000.0, None)
    gpu.submit(b, 100_000.0, None)
    loop.at(200.0, lambda: gpu.set_timeslice(a, 50.0))
    loop.run_until(400)
    # a started at 100, its 50 µs slices restart at 200: preempted at 250, b loads until 350.
    assert gpu.gpu_time(a) == pytest.approx(150)
    assert gpu.gpu_time(b) == pytest.approx(50)


def test_window_accounting_splits_segments_across_windows() -> None:
    loop, gpu = make()
    a = gpu.add_context("a")
    gpu.submit(a, 2500.0, None)
    loop.run_until(3000)
    gpu.flush()
    assert a.windows == pytest.approx([900.0, 1000.0, 600.0])
    assert sum(a.windows) == pytest.approx(gpu.gpu_time(a))


def test_event_loop_runs_in_time_order_and_skips_cancelled() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.at(20, lambda: seen.append("b"))
    loop.at(10, lambda: seen.append("a"))
    cancelled = loop.at(15, lambda: seen.append("x"))
    loop.at(20, lambda: seen.append("c"))
    cancelled.cancel()
    loop.run_until(100)
    assert seen == ["a", "b", "c"]
    assert loop.now == 100
