"""tools/gpu/daemon_restart.py without a GPU: its windows and verdicts read from synthetic
trainer timelines (governed 70/30, native-like 50/50, a trainer stopped, a window too short, a
tail with a pod left closed), its seeded schedule of lives, the daemon's command line, a
trainer's missing result, and ``--table`` on a small result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from qpolicy.model import GpuPolicy, PodClass
from tools.bench.gpu import Cgroups
from tools.gpu import daemon_restart as restart

T0 = 1_000_000.0  # the trainers' wall-clock start


def timeline(*segments: tuple[float, float, float]) -> list[float]:
    """Batch ends, seconds after T0: ``(from_s, to_s, batches per second)`` each; 0 a stop. Each
    batch ends mid-way through its slot, never on a window's edge."""
    points: list[float] = []
    for start, end, rate in segments:
        count = round((end - start) * rate)
        points += [round(start + (k + 0.5) / rate, 5) for k in range(count)]
    return points


def trainer(*segments: tuple[float, float, float]) -> dict[str, Any]:
    last = max(end for _, end, _ in segments)
    return {"wall_start": T0, "seconds": last, "timeline": timeline(*segments)}


def pair(a: float, b: float, seconds: float = 10.0) -> dict[str, dict[str, Any]]:
    """Both trainers at a constant rate (batches per second) over ``seconds``."""
    return {"a": trainer((0, seconds, a)), "b": trainer((0, seconds, b))}


def up(trainers: dict[str, dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    return restart.window("up", 0, T0 + start, T0 + end, trainers, T0)


def test_a_window_at_70_30_is_governed() -> None:
    w = up(pair(70, 30), 1.0, 4.0)
    assert w["batches"] == {"a": 210, "b": 90}
    assert w["it_per_s"] == {"a": pytest.approx(560, abs=3), "b": pytest.approx(240, abs=3)}
    assert w["share_a"] == pytest.approx(0.70, abs=0.005)
    assert (w["governed"], w["looks_ungoverned"], w["ok"], w["stuck"]) == (True, False, True, [])
    assert w["verdict"] == "governed"
    assert (w["from_s"], w["to_s"], w["seconds"]) == (1.0, 4.0, 3.0)


def test_a_window_at_50_50_looks_ungoverned_and_fails() -> None:
    w = up(pair(50, 50), 1.0, 4.0)
    assert w["share_a"] == pytest.approx(0.5, abs=0.005)
    assert (w["governed"], w["looks_ungoverned"], w["ok"]) == (False, True, False)
    assert w["verdict"].startswith("UNGOVERNED")


def test_a_share_neither_governed_nor_native_is_off_target() -> None:
    w = up(pair(60, 40), 1.0, 4.0)
    assert (w["governed"], w["looks_ungoverned"], w["ok"]) == (False, False, False)
    assert w["verdict"] == "OFF TARGET"


def test_a_trainer_that_finishes_nothing_for_seconds_is_stuck() -> None:
    trainers = {"a": trainer((0, 10, 100)), "b": trainer((0, 2, 30), (2, 10, 0))}
    w = up(trainers, 3.0, 5.0)
    assert w["batches"]["b"] == 0 and w["stuck"] == ["b"]
    assert w["ok"] is False and w["verdict"] == "STUCK: b"
    # Under a second it is a turn (a's are ~1.1 s), not a stop: part of a period, not judged.
    short = up(trainers, 3.0, 3.8)
    assert short["stuck"] == [] and short["share_a"] == 1.0 and short["ok"] is None
    assert short["verdict"] == "too short (no whole period)"


def turn_taking(a_s: float, b_s: float, periods: int, rate: float = 35.0) -> dict[str, Any]:
    """Two trainers taking turns from T0, a first: a for ``a_s``, then b for ``b_s``, as the rm
    enforcer hands them the GPU (each at ``rate`` batches a second in its turn)."""
    a_segments, b_segments = [], []
    t = 0.0
    for _ in range(periods):
        a_segments += [(t, t + a_s, rate), (t + a_s, t + a_s + b_s, 0.0)]
        b_segments += [(t, t + a_s, 0.0), (t + a_s, t + a_s + b_s, rate)]
        t += a_s + b_s
    return {"a": trainer(*a_segments), "b": trainer(*b_segments)}


def test_a_window_of_turns_is_judged_over_its_whole_periods() -> None:
    """Call 29C's timelines: a's turns 1.1-1.2 s, b's 0.4-0.5 s. A 2.4 s window starting in a's
    turn read 0.800 and a 1.2 s one 0.635; over whole periods every governed window of the kept
    runs (H100 and H200, 22E-29C) read 0.694-0.713."""
    trainers = turn_taking(1.12, 0.48, 6)  # a 70 % of each 1.6 s period
    # From the middle of a's turn, through b's, a's, b's, to the middle of a's: 4.0 s.
    w = up(trainers, 0.56, 4.56)
    assert w["share_a"] == pytest.approx(0.68, abs=0.02)  # the raw read, kept
    whole = w["whole_periods"]
    assert whole["periods"] == 2 and whole["share_a"] == pytest.approx(0.70, abs=0.01)
    assert whole["from_s"] == pytest.approx(1.12, abs=0.03)
    assert whole["to_s"] == pytest.approx(4.32, abs=0.03)
    assert w["verdict"] == "governed" and w["ok"] is True
    # Off by a turn in the raw read, on target over the whole periods.
    skewed = up(trainers, 0.2, 2.6)
    assert skewed["share_a"] > 0.75 and skewed["verdict"] == "too short (no whole period)"
    # A pair at 50/50 in turns is read as such over whole periods: not governed.
    even = up(turn_taking(0.8, 0.8, 6), 0.4, 6.0)
    assert even["whole_periods"]["share_a"] == pytest.approx(0.50, abs=0.01)
    assert even["verdict"] == "UNGOVERNED (native-like)"


def test_trainers_interleaved_batch_by_batch_are_not_turns() -> None:
    """Both open, the driver interleaves them: no turns, the raw share is judged."""
    w = up(pair(50, 50), 1.0, 4.0)
    assert restart.turns(pair(50, 50), T0 + 1.0, T0 + 4.0) is None
    assert "whole_periods" not in w and w["verdict"] == "UNGOVERNED (native-like)"
    # A trainer with no timeline: no turns either.
    assert restart.turns({"a": {}, "b": {}}, T0, T0 + 1) is None


def test_a_window_too_short_is_reported_not_judged() -> None:
    w = up(pair(50, 50), 1.0, 1.3)
    assert w["too_short"] is True and w["verdict"] == "too short"
    assert (w["governed"], w["looks_ungoverned"], w["ok"]) == (None, None, None)
    assert w["share_a"] == pytest.approx(0.5, abs=0.05)  # still measured


def test_a_down_window_reports_a_paused_pod_without_failing() -> None:
    trainers = {"a": trainer((0, 10, 100)), "b": trainer((0, 5, 30), (5, 10, 0))}
    w = restart.window("down", 3, T0 + 5, T0 + 9, trainers, T0)
    assert w["closed"] == ["b"] and w["stuck"] == [] and w["ok"] is None
    assert w["verdict"] == "b paused"


def test_a_pod_reopened_just_before_the_next_daemon_is_up_still_counts_as_paused() -> None:
    """The next daemon re-opens the pod as it starts, before its probe is up: a few batches of
    b at the end of a window in which a ran alone; the longest gap says how long b stood."""
    trainers = {"a": trainer((0, 20, 100)), "b": trainer((0, 5, 30), (5, 19.5, 0), (19.5, 20, 30))}
    w = restart.window("down", 3, T0 + 5, T0 + 20, trainers, T0)
    assert w["batches"]["b"] > 0 and w["closed"] == ["b"] and w["verdict"] == "b paused"
    assert w["longest_gap_s"]["b"] == pytest.approx(14.5, abs=0.05)
    assert w["longest_gap_s"]["a"] < 0.02
    both = restart.window("down", 3, T0 + 1, T0 + 4, pair(70, 30), T0)
    assert both["verdict"] == "both ran" and both["longest_gap_s"]["b"] < 0.05


def test_a_trainer_without_a_result_gives_no_data() -> None:
    trainers = {"a": trainer((0, 10, 70)), "b": {"error": ["exited with 1"]}}
    w = up(trainers, 1.0, 4.0)
    assert w["verdict"] == "no data" and w["ok"] is False and w["batches"]["b"] is None


def test_an_empty_timeline_is_a_trainer_that_did_nothing() -> None:
    trainers = {"a": trainer((0, 10, 70)), "b": {"wall_start": T0, "seconds": 10, "timeline": []}}
    assert up(trainers, 1.0, 4.0)["stuck"] == ["b"]


# -- a whole run -----------------------------------------------------------------------------------


def run_report(
    up_shares: tuple[float, float] = (70, 30),
    tail: tuple[float, float] = (50, 50),
    b_stuck_in_tail: bool = False,
) -> dict[str, Any]:
    """Life 0 (long) up before the trainers start, killed at 5 s; b closed at the kill until
    life 1's probe at 8 s; life 1 (short) killed at 8.2 s; life 2 (final) up at 11.5 s,
    stopped at 18 s, exited at 18.3 s; the trainers end at 24 s."""
    a_up, b_up = up_shares
    a_tail, b_tail = tail
    a = trainer((0, 5, a_up), (5, 8, 100), (8, 18.3, a_up), (18.3, 24, a_tail))
    b_end = (18.3, 24, 0 if b_stuck_in_tail else b_tail)
    b = trainer((0, 5, b_up), (5, 8, 0), (8, 18.3, b_up), b_end)
    lives = [
        {"life": 0, "kind": "long", "started": T0 - 12, "probe_up": T0 - 8, "startup_s": 4.0,
         "killed": T0 + 5, "exited": T0 + 5.01},
        {"life": 1, "kind": "short", "started": T0 + 6, "probe_up": T0 + 8, "startup_s": 2.0,
         "killed": T0 + 8.2, "exited": T0 + 8.21},
        {"life": 2, "kind": "final", "started": T0 + 9.2, "probe_up": T0 + 11.5,
         "startup_s": 2.3, "stopped": T0 + 18, "exited": T0 + 18.3},
    ]  # fmt: skip
    return {
        "args": {"settle_s": 1.0},
        "start_at": T0,
        "planned_end": T0 + 24,
        "lives": lives,
        "trainers": {"a": a, "b": b},
        "errors": [],
    }


def test_a_run_governed_throughout_and_restored_at_the_end_holds() -> None:
    report = restart.analyse(run_report())
    kinds = [(w["kind"], w["life"]) for w in report["windows"]]
    assert kinds == [("up", 0), ("down", 0), ("up", 1), ("down", 1), ("final", 2), ("tail", None)]
    first, down, short, _, final, tail = report["windows"]
    assert (first["from_s"], first["to_s"]) == (1.0, 5.0)  # from the trainers' start + settle
    assert first["verdict"] == "governed" and final["verdict"] == "governed"
    assert down["closed"] == ["b"] and short["too_short"]
    assert (tail["from_s"], tail["to_s"]) == (pytest.approx(19.3), 24.0)
    assert tail["verdict"] == "restored"
    s = report["summary"]
    assert (s["up_windows"], s["too_short"], s["governed"], s["stuck"]) == (2, 1, 2, 0)
    assert (s["down_windows_paused"], s["kills"], s["trainer_errors"]) == (1, 2, {})
    # Per down window, the longest any trainer finished nothing: b's, closed at the kill.
    assert s["down_longest_gap_s"] == [
        max(down["longest_gap_s"].values()),
        max(report["windows"][3]["longest_gap_s"].values()),
    ]
    assert s["down_longest_gap_s"][0] == down["longest_gap_s"]["b"] > 1.0
    assert s["tail_share"] == pytest.approx(0.5, abs=0.01)
    assert s["startup_s"] == {"min": 2.0, "mean": 2.77, "max": 4.0}
    assert s["holds"] is True and s["failures"] == []


def test_a_tail_with_a_pod_left_closed_fails_the_run() -> None:
    report = restart.analyse(run_report(b_stuck_in_tail=True))
    tail = report["windows"][-1]
    assert tail["stuck"] == ["b"] and tail["ok"] is False and tail["verdict"] == "STUCK: b"
    s = report["summary"]
    assert s["holds"] is False and s["tail_stuck"] == ["b"]
    assert s["failures"] == ["tail: STUCK: b"]


def test_a_tail_still_at_the_governed_share_is_not_restored() -> None:
    report = restart.analyse(run_report(tail=(70, 30)))
    assert report["windows"][-1]["verdict"] == "NOT RESTORED"
    assert report["summary"]["holds"] is False


def test_ungoverned_up_windows_fail_the_run_and_are_counted() -> None:
    s = restart.analyse(run_report(up_shares=(50, 50)))["summary"]
    assert (s["governed"], s["looks_ungoverned"]) == (0, 2)
    assert s["failures"] == ["2 of 2 up windows not governed"] and s["holds"] is False


def test_a_trainer_error_or_a_failed_run_fails_it() -> None:
    report = run_report()
    report["trainers"]["b"] = {"error": ["printed no JSON"]}
    report["errors"] = ["RuntimeError: daemon life 1 exited with 1"]
    s = restart.analyse(report)["summary"]
    assert s["trainer_errors"] == {"b": ["printed no JSON"]}
    assert "trainer errors: b" in s["failures"]
    assert "the run failed: RuntimeError: daemon life 1 exited with 1" in s["failures"]
    assert "no tail window" not in s["failures"] and s["holds"] is False


def test_a_run_cut_off_before_its_final_daemon_has_no_tail() -> None:
    report = run_report()
    del report["lives"][2]
    s = restart.analyse(report)["summary"]
    assert "no tail window" in s["failures"]


# -- the plan --------------------------------------------------------------------------------------


def test_the_schedule_alternates_long_and_short_from_its_seed() -> None:
    schedule = restart.up_times(20, seed=1, long_s=(3.0, 6.0))
    assert [kind for kind, _ in schedule] == ["long", "short"] * 10
    assert all(3.0 <= s <= 6.0 for kind, s in schedule if kind == "long")
    assert all(0.05 <= s <= 0.5 for kind, s in schedule if kind == "short")
    assert restart.up_times(20, seed=1, long_s=(3.0, 6.0)) == schedule
    assert restart.up_times(20, seed=2, long_s=(3.0, 6.0)) != schedule
    assert len({s for _, s in schedule}) == 20  # drawn, not one value repeated
    assert restart.up_times(0, seed=1, long_s=(3.0, 6.0)) == []


def test_the_trainers_outlast_the_plan_and_the_defaults_fit_in_five_minutes() -> None:
    schedule = restart.up_times(6, seed=1, long_s=(3.0, 6.0))
    ups = sum(s for _, s in schedule)
    seconds = restart.trainer_seconds(schedule, 1.0, 6.0, 4.0, startup_s=4.0, exit_s=16.0)
    # Each restart's exit (longer than the down time) and a start-up with room, the final
    # life, its exit, the tail.
    assert seconds >= ups + 6 * (16.0 + 4.0) + 6.0 + 16.0 + 4.0
    assert restart.trainer_seconds(schedule, 1.0, 6.0, 4.0, 4.0, exit_s=0.5) < seconds - 6 * 15
    total = restart.estimate_s(schedule, 1.0, 6.0, 4.0)
    assert 150 < total < 300


def test_the_daemon_runs_from_the_root_it_is_given(tmp_path: Path) -> None:
    argv, env = restart.daemon_command(
        tmp_path, 9400, tmp_path / "state", debug=True, environ={"PYTHONPATH": "/x", "HOME": "/h"}
    )
    assert argv[1:7] == ["-m", "qpolicy", "daemon", "--enforcer", "rm", "--metrics-addr"]
    assert argv[7] == "127.0.0.1:9400" and argv[-2:] == ["--log-level", "debug"]
    assert env["PYTHONPATH"] == f"{tmp_path}:/x" and env["HOME"] == "/h"
    assert env["QPOLICY_STATE_DIR"] == str(tmp_path / "state")
    _, bare = restart.daemon_command(tmp_path, 1, tmp_path, debug=False, environ={})
    assert bare["PYTHONPATH"] == str(tmp_path)


def test_the_desired_state_is_fixed_share_70_30_on_the_gpu_asked_for() -> None:
    state = restart.desired_state({"a": "/qpolicy-bench/a", "b": "/qpolicy-bench/b"}, 1)
    assert state.gpu(1).policy is GpuPolicy.FIXED_SHARE
    pods = {pod.id: (pod.gpu, pod.pod_class, pod.share) for pod in state.pods_on(1)}
    assert pods == {
        "/qpolicy-bench/a": (1, PodClass.OFFLINE, 70),
        "/qpolicy-bench/b": (1, PodClass.OFFLINE, 30),
    }


def test_log_marks_keep_what_a_daemon_found_of_its_predecessor() -> None:
    text = "\n".join(
        [
            "qpolicy daemon: INFO qpolicy.backends.rm: re-opened 2 channel group(s) and ...",
            "qpolicy daemon: INFO qpolicy.control: GPU 0: offline timeslice 1 us",
            "qpolicy daemon: WARNING x: pod /p/a: pid 7 uses the GPU but started before the probe",
            "qpolicy daemon: INFO x: Adopted pid 8",
            "2026-12-02 06:53:07,511 WARNING guard: could not undo what daemon 617 changed: x",
            # The line qpolicy.enforcers.rm.unseen writes when a search finds a process; its
            # mark holds capitals, which a lowercased line never contained before.
            "qpolicy daemon: INFO x: pod /p/a: pid 9: its RM objects found by asking RM (20 chan",
        ]
    )
    marks = restart.log_marks(text)
    assert len(marks) == 5 and "offline timeslice" not in " ".join(marks)
    assert "found by asking RM" in marks[-1]


def test_a_trainer_without_its_json_line_is_an_error_not_an_exception(tmp_path: Path) -> None:
    args = argparse.Namespace(gpu=0)
    report: dict[str, Any] = {"trainers": {}}
    run = restart.Run(args, tmp_path, report, cgroups=Cgroups(root=tmp_path / "cg"))
    (tmp_path / "trainer-a.out").write_text("warming up\n")
    (tmp_path / "trainer-a.err").write_text("a warning\n")
    assert run._result("a", 0) == {"error": ["printed no JSON", "a warning"]}
    assert run._result("a", 1)["error"][0] == "exited with 1"
    (tmp_path / "trainer-b.out").write_text('{"it_per_s": 1.0, "timeline": []}\n')
    assert run._result("b", 0) == {"it_per_s": 1.0, "timeline": []}


# -- the table -------------------------------------------------------------------------------------


def test_table_prints_an_earlier_result_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_report(b_stuck_in_tail=True)
    # Written as main writes it; --table analyses it again from the lives and timelines.
    path = tmp_path / "restart.json"
    path.write_text(json.dumps({**report, "windows": [], "summary": {"holds": True}}))
    assert restart.main(["--table", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| window | life |")
    assert "| up (long) | 0 | 1.0-5.0 | 560.0 | 240.0 | 0.700 | governed |" in lines
    assert any(line.startswith("| down | 0 | 5.0-8.0 |") and "b paused" in line for line in lines)
    assert any(line.startswith("| up (short) | 1 |") and "too short" in line for line in lines)
    assert any(line.startswith("| tail | - |") and "STUCK: b" in line for line in lines)
    assert "up windows judged 2 (too short 1): governed 2" in "\n".join(lines)
    assert any(line.startswith("longest a trainer finished nothing, per down window: ")
               for line in lines)  # fmt: skip
    assert lines[-1] == "verdict: FAILS: tail: STUCK: b"


def test_clients_between_makes_and_frees_that_many_rm_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qpolicy.nvrm import rmctl

    made = iter(range(0xC1D00010, 0xC1D00010 + 5))
    monkeypatch.setattr(rmctl, "newest_client_handle", lambda: next(made))
    aged = restart.age_clients(3)
    assert (aged["count"], aged["first"], aged["last"]) == (3, "0xc1d00010", "0xc1d00012")
    assert next(made) == 0xC1D00013  # three made, no more


def test_daemon_cpu_is_the_lives_mean_and_its_busiest_second() -> None:
    # 1 % of a core for 10 s, with 2 s at 5 % (a search) in the middle: samples every 0.5 s.
    samples, cpu = [], 0.0
    for k in range(21):
        t = k * 0.5
        samples.append([T0 + t, round(cpu, 4)])
        cpu += 0.5 * (0.05 if 4.0 <= t < 6.0 else 0.01)
    found = restart.daemon_cpu(samples)
    assert found == {"seconds": 10.0, "mean_pct": 1.8, "peak_pct": 5.0}
    # One sample, or none, says nothing.
    assert restart.daemon_cpu(samples[:1]) is None
    assert restart.daemon_cpu([]) is None


def test_each_life_reports_its_cpu_and_the_table_prints_it() -> None:
    report = run_report()
    report["lives"][0]["cpu"] = [[T0, 1.0], [T0 + 2.0, 1.04]]
    analysed = restart.analyse(report)
    assert analysed["summary"]["daemon_cpu"]["0"] == {
        "seconds": 2.0,
        "mean_pct": 2.0,
        "peak_pct": 2.0,
    }
    assert analysed["summary"]["daemon_cpu"]["1"] is None  # no samples: a killed short life
    line = next(x for x in restart.table(analysed) if x.startswith("daemon CPU"))
    assert "life 0 2.0 / 2.0 over 2 s" in line and "life 1 -" in line


def test_the_sampler_reads_a_running_process_until_stopped(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    args = argparse.Namespace()
    run = restart.Run(args, tmp_path, {"lives": []}, cgroups=Cgroups(root=tmp_path / "cg"))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        samples: list[list[float]] = []
        run._stop_cpu.clear()
        sampler = restart.threading.Thread(target=run._sample_cpu, args=(busy.pid, samples))
        sampler.start()
        time.sleep(3 * restart.CPU_EVERY_S + 0.2)
        run._sampler = sampler
        run._stop_sampling()
        assert not sampler.is_alive()
        assert len(samples) >= 3
        # A process spinning takes CPU time (no more than the wall clock allows).
        spent = samples[-1][1] - samples[0][1]
        assert 0 < spent <= samples[-1][0] - samples[0][0] + 0.05
    finally:
        busy.kill()
        busy.wait()
    # A process that exited ends the sampling by itself.
    gone: list[list[float]] = []
    run._stop_cpu.clear()
    run._sample_cpu(busy.pid, gone)
    assert gone == []


# -- --configured-after: a mark above the trainers' clients ----------------------------------------


def test_an_unconfigured_life_is_reported_native_like_and_not_judged() -> None:
    """The daemon that ran before the pods were configured governs nothing: its window reads
    50/50 and neither fails the run nor counts as an up window."""
    report = run_report()
    a = trainer((0, 2.5, 50), (2.5, 5, 70), (5, 8, 100), (8, 18.3, 70), (18.3, 24, 50))
    b = trainer((0, 2.5, 50), (2.5, 5, 30), (5, 8, 0), (8, 18.3, 30), (18.3, 24, 50))
    report["trainers"] = {"a": a, "b": b}
    first = report["lives"][0]
    first.update(probe_up=T0 + 2.5, started=T0 + 1)
    report["lives"].insert(
        0,
        {"life": 0, "kind": "unconfigured", "started": T0 - 3, "probe_up": T0 - 1,
         "startup_s": 2.0, "stopped": T0 + 2, "exited": T0 + 2.5},
    )  # fmt: skip
    report = restart.analyse(report)
    kinds = [(w["kind"], w["life"]) for w in report["windows"]]
    assert kinds[:2] == [("unconfigured", 0), ("up", 1)]
    unconfigured = report["windows"][0]
    assert unconfigured["verdict"] == "not configured" and unconfigured["ok"] is None
    assert unconfigured["share_a"] == pytest.approx(0.5, abs=0.01)
    s = report["summary"]
    assert s["up_windows"] == 2 and s["governed"] == 2 and s["holds"] is True
    assert "| unconfigured (unconfigured) | 0 |" in "\n".join(restart.table(report))


def test_handles_left_reads_the_mark_and_each_process_clients(tmp_path: Path) -> None:
    path = tmp_path / "rm-handles.json"
    assert restart.handles_left(path) is None  # none written
    path.write_text("{not json")
    assert restart.handles_left(path) is None
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "newest_client": 0xC1D00040,
                "processes": [
                    {"pid": 7, "clients": [{"handle": 0xC1D00031}, {"handle": 0xC1D00032}]},
                    {"pid": 8, "clients": "garbage"},
                    "garbage",
                ],
            }
        )
    )
    assert restart.handles_left(path) == {
        "mark": 0xC1D00040,
        "clients": {"7": [0xC1D00031, 0xC1D00032]},
    }


class _Scripted(restart.Run):
    """A Run whose daemons and trainers are stand-ins: what the state said at each start."""

    def __init__(self, args: argparse.Namespace, state_dir: Path) -> None:
        report: dict[str, Any] = {"lives": [], "trainers": {}, "errors": []}
        super().__init__(args, state_dir, report, cgroups=Cgroups(root=state_dir / "cg"))
        self.events: list[tuple[str, Any]] = []

    def _pods(self) -> list[str]:
        from qpolicy.state import StateStore

        return sorted(StateStore(self.state_dir).load().pods)

    def start_daemon(self, kind: str, planned_up_s: float) -> dict[str, Any]:
        life = {"life": len(self.report["lives"]), "kind": kind, "probe_up": 0.0,
                "startup_s": 1.0}  # fmt: skip
        self.report["lives"].append(life)
        self.life = life
        self.events.append(("start " + kind, len(self._pods())))
        return life

    def stop_daemon(self, read_status: bool = True) -> None:
        if self.life is not None:
            self.events.append(("stop " + self.life["kind"], None))
            self.life.update(stopped=1.0, exit_code=0)
        self.life = None

    def kill_daemon(self) -> None:
        assert self.life is not None
        self.life["killed"] = 1.0
        self.events.append(("kill " + self.life["kind"], None))

    def start_trainers(self, start_at: float, seconds: float) -> None:
        self.events.append(("trainers", seconds))

    def collect_trainers(self, timeout_s: float) -> None:
        pass

    def sleep_until(self, moment: float) -> None:
        pass


def _args(**changes: Any) -> argparse.Namespace:
    values = {
        "gpu": 0, "kills": 0, "down_s": 1.0, "final_up_s": 6.0, "tail_s": 4.0,
        "exit_s": restart.EXIT_S, "trainers_first": True, "daemon_before": 0.0,
        "clients_between": 0, "configured_after": 0.0,
    }  # fmt: skip
    values.update(changes)
    return argparse.Namespace(**values)


def test_configured_after_runs_a_daemon_with_no_pods_then_configures_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restart, "place_doctor_cache", lambda state_dir: None)
    monkeypatch.setattr(Cgroups, "id", lambda self, pod: f"/qpolicy-bench/{pod}")
    late = _Scripted(_args(configured_after=3.0), tmp_path / "late")
    (tmp_path / "late").mkdir()
    late.run([])
    assert [e[0] for e in late.events] == [
        "trainers", "start unconfigured", "stop unconfigured", "start final", "stop final",
    ]  # fmt: skip
    assert late.events[1][1] == 0 and late.events[3][1] == 2  # pods: none, then a and b
    assert "configured_at" in late.report
    # Without it: the pods are configured from the start, and the trainers run less long.
    plain = _Scripted(_args(), tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    plain.run([])
    assert [e[0] for e in plain.events] == ["trainers", "start final", "stop final"]
    assert plain.events[1][1] == 2
    extra = restart.startup_budget(restart.ASSUMED_STARTUP_S) + 3.0 + restart.EXIT_S
    assert late.events[0][1] == pytest.approx(plain.events[0][1] + extra)


def test_configured_after_needs_trainers_first(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        restart.main(["--configured-after", "3"])
    assert raised.value.code == 2
    assert "--configured-after and --daemon-before need --trainers-first" in capsys.readouterr().err


def test_a_life_that_searched_rm_is_judged_from_its_find() -> None:
    """Processes a daemon had to search RM for are governed from the find on (its status's
    last_found_at): the window starts there, and the search's time is reported instead."""
    report = run_report()
    report["trainers"]["a"] = trainer((0, 3, 50), (3, 5, 70), (5, 8, 100), (8, 18.3, 70),
                                      (18.3, 24, 50))  # fmt: skip
    report["trainers"]["b"] = trainer((0, 3, 50), (3, 5, 30), (5, 8, 0), (8, 18.3, 30),
                                      (18.3, 24, 50))  # fmt: skip
    searched = {"backend": {"searched": {"last_found_at": T0 + 3.0}}}
    # Read as the daemon's status of another life (a kill before its first write): not used.
    report["lives"][0].update(status=searched, status_is_its_own=False)
    first = restart.analyse(report)["windows"][0]
    assert first["from_s"] == 1.0 and first["verdict"] == "OFF TARGET"
    assert first["found_after_s"] is None
    report["lives"][0]["status_is_its_own"] = True
    report = restart.analyse(report)
    first = report["windows"][0]
    assert (first["from_s"], first["to_s"]) == (4.0, 5.0)  # the find + the settle
    assert first["verdict"] == "governed" and first["found_after_s"] == 11.0
    assert report["summary"]["found_after_s"] == [11.0] and report["summary"]["holds"]
    assert "found by searching RM, s after the probe up: 11.00" in "\n".join(restart.table(report))
    # A status without the searches' section has no find.
    assert restart.found_at({"status": {"backend": {}}, "status_is_its_own": True}) is None


def test_a_searching_life_is_kept_up_its_planned_time_from_the_find() -> None:
    """Call 29B: a life up 3.4 s that found its processes 1.1 s after its probe left a 1.2 s
    window after the settle; it is now killed up_s after the find, at most
    SEARCH_EXTENSION_MAX_S later than planned."""
    life: dict[str, Any] = {"probe_up": 100.0, "status_is_its_own": True}
    planned = 100.0 + 3.4
    assert restart.kill_at(life, 3.4, planned) == planned  # no status: as planned
    life["status"] = {"backend": {"searched": {"last_found_at": 101.14}}}
    assert restart.kill_at(life, 3.4, planned) == pytest.approx(101.14 + 3.4)
    # A find long after the probe: bounded.
    life["status"] = {"backend": {"searched": {"last_found_at": 110.0}}}
    assert restart.kill_at(life, 3.4, planned) == planned + restart.SEARCH_EXTENSION_MAX_S
    # A find before this life's probe (a status left by another daemon): as planned.
    life["status"] = {"backend": {"searched": {"last_found_at": 99.0}}}
    assert restart.kill_at(life, 3.4, planned) == planned
    life.update(status={"backend": {"searched": {"last_found_at": 101.0}}}, status_is_its_own=False)
    assert restart.kill_at(life, 3.4, planned) == planned


def test_the_guards_line_is_timed_against_the_kill() -> None:
    """How long after each SIGKILL the dead daemon's guard had undone its changes, read from the
    guard's log line (its asctime, milliseconds) and the kill's wall time; lives whose guard
    said nothing give nothing."""
    import datetime

    killed = 1_796_242_604.0
    stamp = datetime.datetime.fromtimestamp(killed + 0.0099).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    line = (
        f"{stamp} WARNING guard: daemon 756 died without undoing its changes: re-opened 2 "
        "channel group(s) and restored 0 timeslice(s) in 2.3 ms"
    )
    other = "2026-12-02 20:16:31,063 WARNING guard: cannot set oom_score_adj to -1000"
    acted = restart.guard_acted({"killed": killed, "marks": [other, line]})
    assert acted == {"after_kill_ms": pytest.approx(9.0, abs=1.0), "recovery_ms": 2.3}
    assert restart.guard_acted({"killed": killed, "marks": [other]}) is None
    assert restart.guard_acted({"stopped": killed, "marks": [line]}) is None  # not killed
    report = run_report()
    report["lives"][0].update(killed=killed, marks=[line])
    report = restart.analyse(report)
    assert report["summary"]["guard"] == [acted]
    assert "after each SIGKILL (its recovery): 9." in "\n".join(restart.table(report))
