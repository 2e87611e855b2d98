"""What the doctor says qpolicy can promise online work on a GPU: the lever the daemon will run,
held against the online targets, with the evidence where one against solo is missed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qpolicy.doctor.promise import lines, promise
from qpolicy.doctor.report import recommend

RESULTS = Path(__file__).parents[2] / "tools" / "gpu" / "results"


def phase(
    lever: str,
    kind: str,
    p50: float,
    p99: float,
    trainer: float | None = 100.0,
    status: str = "0x0",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "lever": lever,
        "kind": kind,
        "online": {"p50_ms": p50, "p99_ms": p99, "requests": 1425},
        "trainer_it_per_s": trainer,
        "calls": {"X": {"sent": 1, "statuses": [status], "median_us": 300.0}},
        **extra,
    }


SOLO = phase("solo", "baseline", 0.50, 0.80, trainer=None)
NATIVE = phase("native", "baseline", 1.70, 2.80)
MPS = phase("mps", "comparison", 1.20, 1.40)
PAIR = "timeslice-1us-8ms"


def targets(result: dict[str, Any]) -> dict[str, bool | None]:
    return {t["target"]: t["met"] for t in result["targets"]}


def test_each_target_is_held_against_the_recommended_lever() -> None:
    lever = phase(PAIR, "setting", 0.58, 1.10, trainer=97.0)
    result = promise([SOLO, NATIVE, lever, MPS], {"lever": PAIR})
    assert (result["lever"], result["how"]) == (PAIR, "the recommended lever")
    assert targets(result) == {
        "p99": True,  # 1.10 <= 1.5 x 0.80
        "p50": True,  # 0.58 <= 1.2 x 0.50
        "trainer": True,  # 97 % of native's
        "native": True,
        "mps": True,
    }
    assert result["met"] is True and result["evidence"] == []
    assert result["requests"] == 1425 and not result["p99_indicative"]
    # Just over a bound is a miss: 0.61 > 0.60, 1.21 > 1.20, 94 %, not strictly better.
    worse = phase(PAIR, "setting", 0.61, 1.21, trainer=94.0)
    result = promise([SOLO, NATIVE, worse, phase("mps", "comparison", 1.2, 1.21)], {"lever": PAIR})
    assert targets(result) == {
        "p99": False,
        "p50": False,
        "trainer": False,
        "native": True,
        "mps": False,
    }
    assert result["met"] is False


def test_without_a_recommendation_the_engines_pair_is_what_the_daemon_runs() -> None:
    lever = phase(PAIR, "setting", 0.70, 1.00)
    other = phase("timeslice", "setting", 0.65, 0.95)
    result = promise([SOLO, NATIVE, other, lever], {"lever": None, "why": "..."})
    assert result["lever"] == PAIR and "recommends no lever" in result["how"]
    # Where the run did not measure it, nothing is promised, and the output says why.
    result = promise([SOLO, NATIVE, other], {"lever": None})
    assert result["met"] is None and result["targets"] == []
    assert lines(result)[-1] == (
        "what qpolicy can promise online work here: not known (no lever of this run sets what "
        "the daemon runs (the engine's pair, which the daemon runs where the doctor recommends "
        "no lever))"
    )
    failed = {**lever, "error": "RmError: boom"}
    result = promise([SOLO, NATIVE, failed], {"lever": None})
    assert result["met"] is None and "measured no requests" in result["why"]


def test_the_promise_is_for_what_the_daemon_runs_of_the_recommendation() -> None:
    """strategy.from_doctor: per-request controls are never sent, and a CTA recommendation not
    checked next to long kernels (a doctor of before 2026-12-03) gets its timeslices alone."""
    pair = phase(PAIR, "setting", 0.70, 1.00)
    cta = phase("cta+timeslice-1us-8ms", "setting", 0.55, 0.90)
    per_request = phase("preempt-per-request", "per-request", 0.52, 0.85)
    phases = [SOLO, NATIVE, pair, cta, per_request]
    result = promise(phases, {"lever": "preempt-per-request", "kind": "per-request"})
    assert result["lever"] == PAIR
    assert result["how"] == (
        "the engine's pair, which the daemon runs: it does not carry out preempt-per-request"
    )
    result = promise(phases, {"lever": "cta+timeslice-1us-8ms", "kind": "setting"})
    assert result["lever"] == PAIR and result["how"].startswith(
        "the timeslices of the recommended cta+timeslice-1us-8ms alone, which the daemon runs"
    )
    checked = {"lever": "cta+timeslice-1us-8ms", "kind": "setting", "long_kernels_checked": True}
    assert promise(phases, checked)["lever"] == "cta+timeslice-1us-8ms"
    # Another pair of timeslices the enforcers set: that lever.
    other = phase("timeslice-1us", "setting", 0.60, 0.90)
    assert promise([*phases, other], {"lever": "timeslice-1us"})["lever"] == "timeslice-1us"


def test_what_cannot_be_judged_is_said_not_counted() -> None:
    lever = phase(PAIR, "setting", 0.58, 1.10)
    # A solo whose p99 is over twice its p50 is not divided by (as make bench-gpu judges).
    noisy = phase("solo", "baseline", 0.50, 1.20, trainer=None)
    result = promise([noisy, NATIVE, lever], {"lever": PAIR})
    assert targets(result) == {
        "p99": None,
        "p50": None,
        "trainer": True,
        "native": True,
        "mps": None,
    }
    assert result["met"] is None
    text = "\n".join(lines(result))
    assert "not judged: solo unstable (p99 1.20 > 2 x p50 0.50)" in text
    assert "better than MPS at p50 and p99: not measured" in text
    # No solo, a failed MPS phase, a trainer that reported nothing: not judged either.
    broken = {**MPS, "error": "server did not start"}
    result = promise(
        [NATIVE, phase(PAIR, "setting", 0.58, 1.1, trainer=None), broken], {"lever": PAIR}
    )
    assert set(targets(result).values()) == {None, True}
    assert targets(result)["mps"] is None and targets(result)["trainer"] is None
    measured = {t["target"]: t["measured"] for t in result["targets"]}
    assert measured["trainer"] == "not judged: a trainer reported nothing"
    result = promise([SOLO, phase(PAIR, "setting", 0.58, 1.1)], {"lever": PAIR})
    assert {t["target"]: t["measured"] for t in result["targets"]}["trainer"] == (
        "not judged: no native baseline"
    )
    # A miss outweighs what was not judged.
    result = promise([noisy, NATIVE, phase(PAIR, "setting", 2.0, 3.0)], {"lever": PAIR})
    assert result["met"] is False


def test_a_missed_target_says_whether_another_lever_met_it() -> None:
    lever = phase(PAIR, "setting", 0.70, 1.00)
    nearer = phase("timeslice", "setting", 0.66, 1.00)
    refused = phase("cilp+timeslice", "setting", 0.40, 0.70, status="0x1b")
    result = promise([SOLO, NATIVE, lever, nearer, refused], {"lever": PAIR})
    assert result["evidence"] == [
        "the p50 target: no lever RM accepted met it here (the nearest: timeslice, 1.32 x solo's "
        "0.50 ms)"
    ]
    meets = phase("cta+timeslice-1us-8ms", "setting", 0.59, 1.50)
    result = promise([SOLO, NATIVE, lever, meets], {"lever": PAIR})
    assert result["evidence"] == [
        "the p50 target: met here by cta+timeslice-1us-8ms (1.18 x), which the doctor did not "
        "recommend (the recommendation says why)"
    ]


def test_a_missed_p50_shows_the_switch_each_request_waited_for() -> None:
    fecs = {
        "restore_us": {"n": 1425, "p50": 97.0, "p99": 101.0},
        "requests": {
            "requests": 1425,
            "placed": 1425,
            "to_save_end_us": {"p50": 220.0},
            "launch_to_done_us": {"p50": 550.0},
        },
    }
    solo = {**SOLO, "fecs": {"requests": {"launch_to_done_us": {"p50": 311.0}}}}
    lever = phase(PAIR, "setting", 0.79, 0.99, fecs=fecs)
    result = promise([solo, NATIVE, lever], {"lever": PAIR})
    assert result["evidence"][-1] == (
        "the p50 target, on the GPU's log of its switches (timeslice-1us-8ms): 1425 of 1425 "
        "requests waited for a switch: the trainer's save ended 220 µs after the launch, and the "
        "online context's restore took 97 µs more (p50), where the target leaves 100 µs over "
        "solo's p50; launch to done 550 µs against solo's 311"
    )
    # Where the workload said when its launch call returned, the switch counts from there (the
    # call costs solo as much).
    fecs["requests"]["launch_call_us"] = {"p50": 132.0}
    fecs["requests"]["returned_to_save_end_us"] = {"p50": 71.0}
    solo["fecs"]["requests"]["launch_call_us"] = {"p50": 126.0}
    result = promise([solo, NATIVE, lever], {"lever": PAIR})
    assert result["evidence"][-1].endswith(
        "1425 of 1425 requests waited for a switch: the trainer's save ended 71 µs after the "
        "launch call returned (132 µs after the launch; alone 126), and the online context's "
        "restore took 97 µs more (p50): about 168 µs of switching, where the target leaves 100 "
        "µs over solo's p50; launch to done 550 µs against solo's 311"
    )
    # The switches without the requests placed on them: the restore alone.
    lever = phase(PAIR, "setting", 0.79, 0.99, fecs={"restore_us": {"p50": 97.0}})
    result = promise([SOLO, NATIVE, lever], {"lever": PAIR})
    assert result["evidence"][-1].endswith(
        "the online context's restore after the trainer's save took 97 µs (p50), where the "
        "target leaves 100 µs over solo's p50"
    )
    # Without the log, no such line.
    result = promise([SOLO, NATIVE, phase(PAIR, "setting", 0.79, 0.99)], {"lever": PAIR})
    assert len(result["evidence"]) == 1


def test_a_missed_p99_shows_the_switch_against_what_the_target_leaves() -> None:
    """Solo's p99 here is 0.80 ms (SOLO), so the p99 target leaves 400 µs over it."""
    fecs: dict[str, Any] = {
        "restore_us": {"p50": 96.0},
        "requests": {"placed": 525, "returned_to_save_end_us": {"p50": 320.0}},
    }
    lever = phase(PAIR, "setting", 0.79, 1.30, fecs=fecs)
    result = promise([SOLO, NATIVE, lever], {"lever": PAIR})
    p99 = [line for line in result["evidence"] if line.startswith("the p99 target, on the GPU")]
    assert p99 == [
        "the p99 target, on the GPU's log of its switches (timeslice-1us-8ms): about 416 µs of "
        "switching (p50), where the target leaves 400 µs over solo's p99 for the switch and the "
        "trainer's tail together"
    ]
    # The requests not placed on the log: the restore alone.
    del fecs["requests"]
    result = promise([SOLO, NATIVE, lever], {"lever": PAIR})
    assert any(
        "(timeslice-1us-8ms): the online context's restore alone took 96 µs (p50), where the "
        "target leaves 400 µs over solo's p99" in line
        for line in result["evidence"]
    ), result["evidence"]
    # A p99 that met its target says nothing of the switch.
    met = phase(PAIR, "setting", 0.79, 1.10, fecs=fecs)
    result = promise([SOLO, NATIVE, met], {"lever": PAIR})
    assert not any(line.startswith("the p99 target") for line in result["evidence"])


def test_the_h100_of_call_43d_switched_for_longer_than_its_p99_target_leaves() -> None:
    """A host that launches fast (solo p50 0.32, p99 0.41 ms in the doctor's phases): the median
    switch alone (226 µs) is more than the p99 target's room over solo's p99 (203 µs)."""
    run = "2026-12-05-doctor-fecs-8192-b6c3f80-h100-call43D"
    report = json.loads((RESULTS / f"{run}.json").read_text())
    result = promise(report["phases"], recommend(report["phases"], 8192))
    assert targets(result) == {
        "p99": False, "p50": False, "trainer": True, "native": True, "mps": None
    }  # fmt: skip
    assert (
        "the p99 target, on the GPU's log of its switches (timeslice-1us-8ms): about 226 µs of "
        "switching (p50), where the target leaves 203 µs over solo's p99"
    ) in result["evidence"][1]
    p50 = result["evidence"][-1]
    assert "about 226 µs of switching, where the target leaves 65 µs over solo's p50" in p50


def test_a_short_phase_marks_its_p99_as_indicative() -> None:
    lever = phase(PAIR, "setting", 0.58, 1.10)
    lever["online"]["requests"] = 525
    result = promise([SOLO, NATIVE, lever], {"lever": PAIR})
    assert result["p99_indicative"]
    assert "525 requests a phase; a p99 of 525 requests is indicative" in lines(result)[1]


@pytest.mark.parametrize(
    ("run", "expected", "evidence"),
    [
        # H200 next to the 8192 trainer, every request on the GPU's log (call 30D).
        (
            "2026-12-03-doctor-fecs-requests-8192-h200-call30D",
            {"p99": True, "p50": False, "trainer": True, "native": True, "mps": None},
            "the trainer's save ended 220 µs after the launch, and the online context's restore "
            "took 97 µs more (p50), where the target leaves 111 µs over solo's p50; launch to "
            "done 550 µs against solo's 311",
        ),
        # Another H200 (call 31A), each request's launch call timed: 132 µs of the 205 to the
        # trainer's save end were the call, which solo's requests took too (126 µs).
        (
            "2026-12-03-doctor-promise-8192-h200-call31A",
            {"p99": True, "p50": False, "trainer": True, "native": True, "mps": True},
            "the trainer's save ended 71 µs after the launch call returned (132 µs after the "
            "launch; alone 126), and the online context's restore took 98 µs more (p50): about "
            "169 µs of switching, where the target leaves 107 µs over solo's p50; launch to done "
            "546 µs against solo's 301",
        ),
        # Next to the 2048 trainer on it: solo unstable (p99 2.24 ms), MPS ahead at p50 and p99.
        (
            "2026-12-03-doctor-promise-2048-h200-call31A",
            {"p99": None, "p50": None, "trainer": True, "native": True, "mps": False},
            None,
        ),
        # H200 with the MPS comparison (call 13B): the lever beats both at p50 and p99.
        (
            "2026-11-27-doctor-mps-8192-h200-call13B",
            {"p99": True, "p50": False, "trainer": True, "native": True, "mps": True},
            "no lever RM accepted met it here (the nearest: timeslice-1us-8ms, 1.35 x solo's "
            "0.55 ms)",
        ),
        # An H100 with every lever (call 28B, 4 s phases): the p50 target missed by all of them.
        (
            "2026-12-02-doctor-h100-call28B",
            {"p99": True, "p50": False, "trainer": True, "native": True, "mps": True},
            "no lever RM accepted met it here (the nearest: timeslice-1us, 1.28 x solo's 0.80 ms)",
        ),
        # H100 (call 13A): solo's p99 2.89 ms against a p50 of 0.62, not divided by.
        (
            "2026-11-27-doctor-mps-8192-h100-call13A",
            {"p99": None, "p50": None, "trainer": True, "native": True, "mps": True},
            None,
        ),
        # H200 next to the 2048 trainer, 20 s phases (call 30E): no lever recommended, so the
        # engine's pair; its p50 within 1.2 x solo's, and 0.02 ms behind native's.
        (
            "2026-12-03-doctor-fecs-requests-2048-20s-h200-call30E",
            {"p99": True, "p50": True, "trainer": True, "native": False, "mps": None},
            None,
        ),
    ],
)
def test_the_recorded_runs_say_what_qpolicy_can_promise(
    run: str, expected: dict[str, bool | None], evidence: str | None
) -> None:
    report = json.loads((RESULTS / f"{run}.json").read_text())
    trainer = int(report["workloads"]["trainer"].removeprefix("bf16 matmul n="))
    result = promise(report["phases"], recommend(report["phases"], trainer))
    assert result["lever"] == PAIR
    assert targets(result) == expected
    if evidence is None:
        assert result["evidence"] == []
    else:
        assert evidence in result["evidence"][-1]


def test_the_command_prints_the_promise_under_its_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import qpolicy.doctor.checkup
    from qpolicy.cli.doctor import doctor

    report = json.loads(
        (RESULTS / "2026-12-03-doctor-fecs-requests-8192-h200-call30D.json").read_text()
    )
    report["promise"] = promise(report["phases"], report["recommendation"])
    monkeypatch.setattr(qpolicy.doctor.checkup, "checkup", lambda config, state_dir: report)
    doctor(no_cache=True)
    out = capsys.readouterr().out
    assert "recommended online lever: timeslice-1us-8ms" in out
    assert (
        "\nwhat qpolicy can promise online work here, from this run (timeslice-1us-8ms, the "
        "recommended lever; 1425 requests a phase):\n"
        "- online p99 <= 1.5 x solo's: 0.99 ms, 1.15 x solo's 0.86: met\n"
        "- online p50 <= 1.2 x solo's: 0.79 ms, 1.43 x solo's 0.55: MISSED\n"
    ) in out


def run_show(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [str(script), "doctor", "--show", *args], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip


def test_show_prints_the_kept_result_with_its_promise_and_measures_nothing(tmp_path: Path) -> None:
    # Nothing kept: one line that says what to run, and no GPU touched (this machine has none).
    missing = run_show(tmp_path, "--gpu", "1")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == (
        f"qpolicy: error: no doctor result kept for GPU 1 in {tmp_path}: run `qpolicy doctor "
        "--gpu 1`\n"
    )
    # A result kept before the promise existed (call 30D's): the daemon's recommendation, and
    # the promise worked out from its phases.
    report = json.loads(
        (RESULTS / "2026-12-03-doctor-fecs-requests-8192-h200-call30D.json").read_text()
    )
    assert "promise" not in report
    (tmp_path / "doctor-gpu1.json").write_text(json.dumps(report))
    shown = run_show(tmp_path, "--gpu", "1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("GPU 0: NVIDIA H200, driver 580.159.04; ")
    assert "recommended online lever: timeslice-1us-8ms" in shown.stdout
    assert "- online p50 <= 1.2 x solo's: 0.79 ms, 1.43 x solo's 0.55: MISSED\n" in shown.stdout
    as_json = json.loads(run_show(tmp_path, "--gpu", "1", "--json").stdout)
    assert as_json["promise"] == promise(report["phases"], report["recommendation"])
    assert json.loads((tmp_path / "doctor-gpu1.json").read_text()) == report  # left as it was
    # A kept result that is not a doctor's: named, with what to do; nothing printed.
    (tmp_path / "doctor-gpu1.json").write_text(json.dumps({"schema": 1, "phases": [{}]}))
    broken = run_show(tmp_path, "--gpu", "1")
    assert broken.returncode == 1 and broken.stdout == ""
    assert broken.stderr.startswith(
        f"qpolicy: error: the doctor result kept for GPU 1 in {tmp_path} is not readable ("
    )
    assert broken.stderr.endswith("run `qpolicy doctor --gpu 1` again\n")
    assert broken.stderr.count("\n") == 1


def test_the_levers_are_held_to_the_stricter_stable_of_the_two_solos() -> None:
    """The doctor measures the online stream alone before the trainer starts and again after
    the levers: an unstable first solo (H200 calls 35C-36H) no longer leaves the targets
    against solo unjudged where the second is stable."""
    lever = phase(PAIR, "setting", 0.62, 0.78, trainer=97.0)
    noisy = phase("solo", "baseline", 0.42, 1.03, trainer=None)
    after = phase("solo-after", "baseline", 0.38, 0.74, trainer=None)
    result = promise([noisy, NATIVE, lever, after, MPS], {"lever": PAIR})
    assert targets(result)["p99"] is True and targets(result)["p50"] is False
    measured = {t["target"]: t["measured"] for t in result["targets"]}
    assert measured["p99"] == "0.78 ms, 1.05 x solo's 0.74 (the solo after the levers)"
    assert recommend([noisy, NATIVE, lever, after])["why"].count("solo's 0.38 / 0.74") == 1
    # Both stable: the lower p99, whichever came first; the first is not named.
    calm = phase("solo", "baseline", 0.40, 0.60, trainer=None)
    result = promise([calm, NATIVE, lever, after, MPS], {"lever": PAIR})
    measured = {t["target"]: t["measured"] for t in result["targets"]}
    assert measured["p99"] == "0.78 ms, 1.30 x solo's 0.60"
    # Neither stable: the first, not divided by.
    worse = phase("solo-after", "baseline", 0.40, 0.95, trainer=None)
    result = promise([noisy, NATIVE, lever, worse, MPS], {"lever": PAIR})
    assert targets(result)["p99"] is None
    assert "solo unstable (p99 1.03 > 2 x p50 0.42)" in "\n".join(lines(result))
    # A second solo that failed is no baseline.
    broken = {**after, "error": "the online stream stopped"}
    assert targets(promise([noisy, NATIVE, lever, broken], {"lever": PAIR}))["p99"] is None
