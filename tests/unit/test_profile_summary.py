"""tools/gpu/profile_summary.py: a py-spy raw profile summed by thread and function, with blocked
threads counted apart, on made-up profiles in py-spy's format (``--threads --native
--function``, as py-spy 0.4 writes it)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from tools.gpu import profile_summary

MAIN = "thread (100): MainThread"
CONTROLS = "thread (101): qp-controls"
LOOP_WAIT = (
    "thread_run (libpython3.12.so.1.0);Daemon.run (qpolicy/daemon.py:300);"
    "RealtimeLoop.run (qpolicy/runtime/realtime.py:89);Event.wait (threading.py:655);"
    "Condition.wait (threading.py:359);PyThread_acquire_lock_timed (libpython3.12.so.1.0);"
    "0x7f0000001234 (libc.so.6)"
)
LOOP_SENSOR = (
    "thread_run (libpython3.12.so.1.0);Daemon.run (qpolicy/daemon.py:300);"
    "RealtimeLoop.run (qpolicy/runtime/realtime.py:89);"
    "RmUsageSensor.poll (qpolicy/enforcers/rm/sensor.py:97);"
    "MapBatch.read (qpolicy/telemetry/mapbatch.py:40);bpf_map_lookup_batch (libbcc.so.0);"
    "syscall (libc.so.6)"
)
CONTROL_SPIN = (
    "ControlWorker._run (qpolicy/enforcers/rm/worker.py:80);"
    "rm_control (qpolicy/nvrm/rmctl.py:200);0x7f00000000aa (libc.so.6)"
)
CONTROL_IDLE = (
    "ControlWorker._run (qpolicy/enforcers/rm/worker.py:80);"
    "_queue_SimpleQueue_get (_queuemodule.c.h);PyThread_acquire_lock_timed (libpython3.12.so.1.0)"
)
SLEEP = "Guard.run (qpolicy/enforcers/rm/guard.py:10);time_sleep (libpython3.12.so.1.0)"


def profile(*rows: tuple[str, str, int]) -> list[str]:
    return [f"{thread};{stack} {count}" for thread, stack, count in rows]


def test_blocked_samples_are_waiting_and_the_rest_is_split_by_thread_and_function() -> None:
    lines = profile(
        (MAIN, LOOP_WAIT, 900),
        (MAIN, LOOP_SENSOR, 60),
        (CONTROLS, CONTROL_SPIN, 40),
        (CONTROLS, CONTROL_IDLE, 500),
        (MAIN, SLEEP, 7),
    )
    s = profile_summary.summarise(lines, top=50)
    assert (s.samples, s.waiting) == (1507, 1407)
    assert s.threads == {"MainThread": 60, "qp-controls": 40}
    inclusive = dict(s.inclusive)
    assert inclusive["RmUsageSensor.poll sensor.py"] == 60
    assert inclusive["bpf_map_lookup_batch libbcc.so.0"] == 60
    assert inclusive["rm_control rmctl.py"] == 40
    # A waiting sample counts nowhere but in the waiting total.
    assert "Condition.wait threading.py" not in inclusive
    # An address without a symbol is its library's, innermost, and not listed as a function.
    assert dict(s.innermost) == {"syscall libc.so.6": 60, "(no symbol) libc.so.6": 40}
    assert not any(key.startswith(("0x", "(no symbol)")) for key in inclusive)


def test_one_thread_only() -> None:
    lines = profile((MAIN, LOOP_SENSOR, 60), (CONTROLS, CONTROL_SPIN, 40))
    s = profile_summary.summarise(lines, top=50, thread_name="qp-controls")
    assert (s.samples, s.threads) == (40, {"qp-controls": 40})


def test_a_profile_without_native_frames_waits_on_its_python_frame() -> None:
    lines = [
        "thread (7): loop;Daemon.run (qpolicy/daemon.py:300);Condition.wait (threading.py:359) 30",
        "thread (7): loop;Daemon.run (qpolicy/daemon.py:300);Daemon.tick (qpolicy/daemon.py:9) 3",
    ]
    s = profile_summary.summarise(lines, top=5)
    assert (s.samples, s.waiting, s.threads) == (33, 30, {"loop": 3})


def test_the_command_reads_xz_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "daemon.raw.xz"
    with lzma.open(path, "wt") as f:
        f.write("\n".join(profile((MAIN, LOOP_SENSOR, 6), (CONTROLS, CONTROL_IDLE, 4))) + "\n")
    assert profile_summary.main([str(path), "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["samples"], out["waiting"], out["threads"]) == (10, 4, {"MainThread": 6})
    assert len(out["inclusive"]) == 3


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--top", "0"], "--top must be at least 1, not 0"),
        (["--thread", "nope"], "no samples of thread 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    path = tmp_path / "p.raw"
    path.write_text("\n".join(profile((MAIN, LOOP_SENSOR, 6))) + "\n")
    assert profile_summary.main([str(path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err


def test_a_missing_or_empty_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert profile_summary.main([str(tmp_path / "none.raw")]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = tmp_path / "empty.raw"
    empty.write_text("not a profile line\n")
    assert profile_summary.main([str(empty)]) == 2
    assert f"no samples in {empty}" in capsys.readouterr().err
