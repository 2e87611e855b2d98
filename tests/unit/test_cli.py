import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

import qpolicy
import qpolicy.cli.kmodstatus
import qpolicy.cli.status
from qpolicy.backends.observe import ObserveBackend
from qpolicy.cli import main
from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.state import DesiredState, StateStore
from tests.unit.qgpu_fake import FakeQgpu

GiB = 2**30


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "state"
    monkeypatch.setenv("QPOLICY_STATE_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def no_qgpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command sees a host without qgpu.ko unless a test loads the fake one."""
    monkeypatch.setattr(qpolicy.cli.kmodstatus, "SYSFS", tmp_path / "no-qgpu")


@pytest.fixture
def store(state_dir: Path) -> StateStore:
    return StateStore(state_dir)


@pytest.fixture
def qpolicy_cli(capsys: pytest.CaptureFixture[str], state_dir: Path) -> "Cli":
    return Cli(capsys)


class Cli:
    """Runs ``main`` in this process, as the console script would, and captures its output."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *args: str) -> Result:
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main(list(args))
        out, err = self.capsys.readouterr()
        code = exit_info.value.code
        assert isinstance(code, int)
        return Result(code, out, err)

    def ok(self, *args: str) -> Result:
        result = self(*args)
        assert (result.code, result.err) == (0, ""), result
        return result


def populated(store: StateStore) -> bytes:
    """GPU 0 fixed-share with pod a (50 %), pod free on best-effort GPU 1; returns the file."""
    store.update(
        lambda _: (
            DesiredState()
            .with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE, 20))
            .with_pod(PodSpec("a", 0, PodClass.ONLINE, 50, 8 * GiB))
            .with_pod(PodSpec("free", 1))
        )
    )
    return store.path.read_bytes()


# --- version and help -----------------------------------------------------------------------------


def test_version(qpolicy_cli: Cli) -> None:
    assert qpolicy_cli.ok("--version").out == f"qpolicy {qpolicy.__version__}\n"


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], ["set", "--help"], ["pod", "set", "-h"], ["status", "-h"]]
)
def test_help_exits_0(qpolicy_cli: Cli, args: list[str]) -> None:
    assert "Usage: qpolicy" in qpolicy_cli.ok(*args).out


def test_top_level_help_lists_the_commands(qpolicy_cli: Cli) -> None:
    out = qpolicy_cli.ok("--help").out
    for command in ("set", "pod", "status"):
        assert f"│ {command} " in out


def test_no_arguments_prints_help_and_no_error_line(qpolicy_cli: Cli) -> None:
    # typer's no_args_is_help: the help, exit 2 as for any incomplete command line.
    result = qpolicy_cli()
    assert result.code == 2
    assert "Usage: qpolicy" in result.out
    assert result.err == ""


# --- qpolicy set ----------------------------------------------------------------------------------


def test_set_policy_and_keep_the_period_when_omitted(qpolicy_cli: Cli, store: StateStore) -> None:
    assert qpolicy_cli.ok("set", "--gpu", "0", "--policy", "bs").out == (
        "GPU 0: burst-share, period 50 ms\n"
    )
    assert store.load().gpu(0) == GpuConfig(0, GpuPolicy.BURST_SHARE, 50)
    qpolicy_cli.ok("set", "--gpu", "0", "--policy", "fixed-share", "--period-ms", "20")
    assert store.load().gpu(0) == GpuConfig(0, GpuPolicy.FIXED_SHARE, 20)
    assert "period 20 ms" in qpolicy_cli.ok("set", "--gpu", "0", "--policy", "BE").out
    assert store.load().gpu(0) == GpuConfig(0, GpuPolicy.BEST_EFFORT, 20)
    assert set(store.load().gpus) == {0}


@pytest.mark.parametrize(
    ("spelling", "policy"),
    [
        ("burst", "burst-share"),
        ("fixed", "fixed-share"),
        ("best", "best-effort"),
        ("besteffort", "best-effort"),
        ("Burst_Share", "burst-share"),
    ],
)
def test_the_products_own_usage_line_works_and_output_uses_the_long_name(
    qpolicy_cli: Cli, store: StateStore, spelling: str, policy: str
) -> None:
    # The README's one-line usage: qpolicy set --gpu 0 --policy burst
    assert qpolicy_cli.ok("set", "--gpu", "0", "--policy", spelling).out == (
        f"GPU 0: {policy}, period 50 ms\n"
    )
    assert json.loads(store.path.read_text())["gpus"]["0"]["policy"] == policy


# --- qpolicy pod ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "expected"),
    [("8GiB", 8 * GiB), ("512MiB", 512 * 2**20), ("8Gi", 8 * GiB), ("1000000", 10**6)],
)
def test_pod_set_memory_spellings(
    qpolicy_cli: Cli, store: StateStore, memory: str, expected: int
) -> None:
    qpolicy_cli.ok("pod", "set", "/p", "--gpu", "2", "--memory", memory)
    assert store.load().pods["/p"].memory_limit == expected


def test_pod_set_adds_then_replaces(qpolicy_cli: Cli, store: StateStore) -> None:
    qpolicy_cli.ok("set", "--gpu", "0", "--policy", "bs")
    out = qpolicy_cli.ok(
        "pod", "set", "/kubepods/x", "--gpu", "0", "--class", "online", "--share", "30",
        "--memory", "8GiB",
    ).out  # fmt: skip
    assert out == "added pod /kubepods/x on GPU 0: online, share 30 %, memory 8GiB\n"
    assert store.load().pods["/kubepods/x"] == PodSpec(
        "/kubepods/x", 0, PodClass.ONLINE, 30, 8 * GiB
    )
    # A patch, as kubectl set: what is not given keeps its value.
    out = qpolicy_cli.ok("pod", "set", "/kubepods/x", "--share", "40").out
    assert out == "updated pod /kubepods/x on GPU 0: online, share 40 %, memory 8GiB\n"
    assert store.load().pods == {
        "/kubepods/x": PodSpec("/kubepods/x", 0, PodClass.ONLINE, 40, 8 * GiB)
    }
    # "none" removes a value; the same values again change nothing.
    qpolicy_cli.ok("pod", "set", "/kubepods/x", "--memory", "none", "--class", "offline")
    assert store.load().pods["/kubepods/x"] == PodSpec("/kubepods/x", 0, share=40)
    document = json.loads(
        qpolicy_cli.ok("pod", "set", "/kubepods/x", "--share", "40", "--json").out
    )
    assert document == {
        "action": "unchanged",
        "pod": {"id": "/kubepods/x", "gpu": 0, "class": "offline", "share": 40,
                "memory_bytes": None},
        "note": None,
    }  # fmt: skip


def test_pod_rm(qpolicy_cli: Cli, store: StateStore) -> None:
    populated(store)
    assert qpolicy_cli.ok("pod", "rm", "a").out == "removed pod a\n"
    assert set(store.load().pods) == {"free"}


def test_pod_ls_table(qpolicy_cli: Cli, store: StateStore) -> None:
    populated(store)
    lines = qpolicy_cli.ok("pod", "ls").out.splitlines()
    row_a = next(line for line in lines if "│ a " in line)
    row_free = next(line for line in lines if "│ free " in line)
    assert [cell.strip() for cell in row_a.strip("│").split("│")] == [
        "a", "0", "online", "50 %", "8GiB"
    ]  # fmt: skip
    assert [cell.strip() for cell in row_free.strip("│").split("│")] == [
        "free", "1", "offline", "-", "-"
    ]  # fmt: skip


def test_pod_ls_json_is_sorted_by_gpu_then_id(qpolicy_cli: Cli, store: StateStore) -> None:
    for pod_id, gpu in [("/b", 1), ("/z", 0), ("/a", 1)]:
        qpolicy_cli.ok("pod", "set", pod_id, "--gpu", str(gpu))
    listing = json.loads(qpolicy_cli.ok("pod", "ls", "--json").out)
    assert [(p["gpu"], p["id"]) for p in listing] == [(0, "/z"), (1, "/a"), (1, "/b")]
    assert listing[0] == {
        "id": "/z", "gpu": 0, "class": "offline", "share": None, "memory_bytes": None
    }  # fmt: skip


def test_pod_ids_that_look_like_markup_are_printed_as_they_are(
    qpolicy_cli: Cli, store: StateStore
) -> None:
    pod_id = "/kubepods/[bold]x[/bold]"
    qpolicy_cli.ok("pod", "set", pod_id, "--gpu", "0")
    assert pod_id in qpolicy_cli.ok("pod", "ls").out
    assert json.loads(qpolicy_cli.ok("pod", "ls", "--json").out)[0]["id"] == pod_id
    assert pod_id in qpolicy_cli.ok("pod", "rm", pod_id).out


def test_empty_state_listing_and_status_are_hints_not_errors(
    qpolicy_cli: Cli, state_dir: Path
) -> None:
    assert "No pods" in qpolicy_cli.ok("pod", "ls").out
    assert json.loads(qpolicy_cli.ok("pod", "ls", "--json").out) == []
    out = qpolicy_cli.ok("status").out
    assert "Nothing configured yet" in out
    assert "qpolicy set --gpu 0 --policy burst-share" in out
    assert json.loads(qpolicy_cli.ok("status", "--json").out) == {
        "state_file": str(state_dir / "state.json"),
        "gpus": [],
        "daemon": None,  # none runs
    }
    # Reading an absent state creates nothing.
    assert not state_dir.exists()


# --- qpolicy status -------------------------------------------------------------------------------


def test_status_json(qpolicy_cli: Cli, store: StateStore) -> None:
    qpolicy_cli.ok("set", "--gpu", "0", "--policy", "burst-share")
    qpolicy_cli.ok("pod", "set", "/big", "--gpu", "0", "--share", "50", "--memory", "8GiB")
    qpolicy_cli.ok("pod", "set", "/small", "--gpu", "0", "--share", "30")
    qpolicy_cli.ok("pod", "set", "/solo", "--gpu", "2")
    qpolicy_cli.ok("set", "--gpu", "1", "--policy", "fs", "--period-ms", "10")
    report = json.loads(qpolicy_cli.ok("status", "--json").out)
    assert report["state_file"] == str(store.path)
    assert [gpu["index"] for gpu in report["gpus"]] == [0, 1, 2]
    gpu0 = report["gpus"][0]
    assert {k: v for k, v in gpu0.items() if k != "pods"} == {
        "index": 0, "policy": "burst-share", "period_ms": 50, "shares_sum": 80, "error": None
    }  # fmt: skip
    # Both busy: each keeps its share and the idle 20 % is split 50:30.
    assert gpu0["pods"] == [
        {"id": "/big", "class": "offline", "share": 50, "memory_bytes": 8 * GiB,
         "planned_share_when_busy": 0.625},
        {"id": "/small", "class": "offline", "share": 30, "memory_bytes": None,
         "planned_share_when_busy": 0.375},
    ]  # fmt: skip
    assert report["gpus"][1]["pods"] == []
    assert report["gpus"][1]["period_ms"] == 10
    assert report["gpus"][2]["policy"] == "best-effort"
    assert report["gpus"][2]["pods"][0]["planned_share_when_busy"] == 1.0


def test_status_table(qpolicy_cli: Cli, store: StateStore) -> None:
    populated(store)
    out = qpolicy_cli.ok("status").out
    assert "GPU 0 · fixed-share · period 20 ms · shares 50 %" in out
    assert "GPU 1 · best-effort · period 50 ms · shares 0 %" in out
    row_a = next(line for line in out.splitlines() if "│ a " in line)
    assert [cell.strip() for cell in row_a.strip("│").split("│")] == [
        "a", "online", "50 %", "8GiB", "50.0 %"
    ]  # fmt: skip
    assert f"state file: {store.path}" in out


def test_status_shows_a_gpu_that_cannot_be_planned_instead_of_failing(
    qpolicy_cli: Cli, store: StateStore
) -> None:
    # Hand-edited: 60 + 60 on a fixed-share GPU, which the CLI itself would refuse.
    document = {
        "schema": 1,
        "gpus": {"0": {"policy": "fixed-share", "period_ms": 50}},
        "pods": {"a": {"gpu": 0, "share": 60}, "b": {"gpu": 0, "share": 60}, "c": {"gpu": 1}},
    }
    store.directory.mkdir()
    store.path.write_text(json.dumps(document))
    gpu0, gpu1 = json.loads(qpolicy_cli.ok("status", "--json").out)["gpus"]
    assert gpu0["error"] == "shares on GPU 0 (fixed-share) sum to 120 > 100: a=60, b=60"
    assert [pod["planned_share_when_busy"] for pod in gpu0["pods"]] == [None, None]
    assert gpu1["error"] is None
    out = qpolicy_cli.ok("status").out
    assert "cannot plan GPU 0: shares on GPU 0 (fixed-share) sum to 120 > 100" in out
    assert "100.0 %" in out


@pytest.fixture
def qgpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeQgpu, Path]:
    """qgpu.ko loaded (its sysfs files, the in-process module) over a cgroup hierarchy."""
    sysfs = tmp_path / "qgpu"
    (sysfs / "gpu0").mkdir(parents=True)
    root = {"version": "1", "target": "nvmock", "hooked": "1", "uvm_hooked": "0", "cgroups": "2"}
    for name, value in root.items():
        (sysfs / name).write_text(value + "\n")
    for name, value in {
        "policy": "fixed-share",
        "period_us": "20000",
        "nr_periods": "77",
        "offline_timeslice_us": "128",
        "online_timeslice_us": "8192",
        "offline_preemption": "cta",
        "passes": "4000",
        "userd_reads": "10000",
    }.items():
        (sysfs / "gpu0" / name).write_text(value + "\n")
    params = tmp_path / "parameters"
    params.mkdir()
    (params / "online_gate").write_text("1\n")
    cgroups = tmp_path / "cgroup"
    (cgroups / "a").mkdir(parents=True)
    fake = FakeQgpu()
    monkeypatch.setattr(qpolicy.cli.kmodstatus, "SYSFS", sysfs)
    monkeypatch.setattr(qpolicy.cli.kmodstatus, "PARAMS", params)
    monkeypatch.setattr(qpolicy.cli.kmodstatus, "CGROUPS", cgroups)
    monkeypatch.setattr(qpolicy.cli.kmodstatus, "open_client", lambda: QgpuClient(fake))
    return fake, cgroups


def test_status_shows_the_modules_view_where_it_is_loaded(
    qpolicy_cli: Cli, store: StateStore, qgpu: tuple[FakeQgpu, Path]
) -> None:
    fake, cgroups = qgpu
    populated(store)
    a = os.stat(cgroups / "a").st_ino
    client = QgpuClient(fake)
    client.set_cgroup(a, 0, "online", 50, GiB)
    client.set_cgroup(424242, 0, "offline", 50)
    fake.count(a, mem_used=GiB // 2, open_ns=3_500_000_000, throttled_ns=1_250_000_000)
    fake.count(a, nr_periods=70, nr_throttled=20, channels=8)
    report = json.loads(qpolicy_cli.ok("status", "--json").out)
    kmod = report["kmod"]
    assert {k: v for k, v in kmod.items() if k not in ("gpus", "cgroups")} == {
        "sysfs": str(qpolicy.cli.kmodstatus.SYSFS),
        "version": 1,
        "target": "nvmock",
        "hooked": True,
        "uvm_hooked": False,
        "online_gate": 1,
        "cgroups_configured": 2,
        "error": None,
    }
    assert kmod["gpus"] == [
        {"index": 0, "policy": "fixed-share", "period_us": 20000, "periods": 77,
         "online_busy": None, "offline_timeslice_us": 128, "online_timeslice_us": 8192,
         "offline_preemption": "cta", "passes": 4000, "userd_reads": 10000}
    ]  # fmt: skip
    mine, other = sorted(kmod["cgroups"], key=lambda c: c["path"] is None)
    assert mine == {
        "cgroup_id": a, "path": "/a", "gpu": 0, "class": "online", "share": 50,
        "memory_used_bytes": GiB // 2, "memory_limit_bytes": GiB,
        "gpu_time_s": 3.5, "throttled_s": 1.25, "periods": 70, "throttled_periods": 20,
        "busy": False, "clients": 0, "tsgs": 0, "channels": 8,
        "refused_allocations": 0, "refused_controls": 0, "own_timeslices": False,
        "timeslice_preempted": False,
    }  # fmt: skip
    assert (other["cgroup_id"], other["path"], other["memory_limit_bytes"]) == (424242, None, None)
    assert [gpu["index"] for gpu in report["gpus"]] == [0, 1]  # the desired state is still there
    out = qpolicy_cli.ok("status").out
    assert "qgpu.ko · interface 1 · driver nvmock · hooked · 2 cgroup(s) configured" in out
    assert "nvidia-uvm not hooked: managed memory (cudaMallocManaged) is not refused" in out
    assert "qgpu.ko GPU 0 · fixed-share · period 20 ms · 77 periods" in out
    assert "timeslices 128 / 8192 µs (offline / online), CTA preemption offline" in out
    assert "2.5 USERD reads a pass" in out
    row_a = next(line for line in out.splitlines() if "│ /a " in line)
    assert [cell.strip() for cell in row_a.strip("│").split("│")] == [
        "/a", "online", "50 %", "512MiB / 1GiB", "3.5 s", "1.2 s, 20/70"
    ]  # fmt: skip
    assert "#424242" in out


def test_status_without_cap_net_admin_shows_sysfs_and_says_why_the_rest_is_missing(
    qpolicy_cli: Cli, qgpu: tuple[FakeQgpu, Path]
) -> None:
    fake, _ = qgpu
    fake.unprivileged = True
    kmod = json.loads(qpolicy_cli.ok("status", "--json").out)["kmod"]
    assert kmod["cgroups"] is None and "CAP_NET_ADMIN" in kmod["error"]
    assert kmod["gpus"][0]["policy"] == "fixed-share"
    out = qpolicy_cli.ok("status").out
    assert "Nothing configured yet" in out  # the state file's part, as without the module
    assert "per-cgroup counters unavailable: qgpu.ko refused CGROUP_GET" in out
    assert out.endswith(
        "\nqgpu.ko GPU 0 · fixed-share · period 20 ms · 77 periods"
        " · timeslices 128 / 8192 µs (offline / online), CTA preemption offline"
        " · 2.5 USERD reads a pass\n"
    )


# --- errors ---------------------------------------------------------------------------------------

BAD_INPUTS = [
    ("share too big", ["pod", "set", "n", "--gpu", "0", "--share", "150"], "'150'"),
    ("share not a number", ["pod", "set", "n", "--gpu", "0", "--share", "abc"], "'abc'"),
    ("unknown policy", ["set", "--gpu", "0", "--policy", "xx"], "'xx'"),
    ("negative gpu", ["set", "--gpu", "-1", "--policy", "be"], "'-1'"),
    ("gpu out of range", ["pod", "set", "n", "--gpu", "248"], "'248'"),
    ("bad memory unit", ["pod", "set", "n", "--gpu", "1", "--memory", "8XB"], "'8XB'"),
    ("period zero", ["set", "--gpu", "0", "--policy", "be", "--period-ms", "0"], "'0'"),
    ("unknown class", ["pod", "set", "n", "--gpu", "1", "--class", "batch"], "'batch'"),
    ("bad pod id", ["pod", "set", "a b", "--gpu", "1"], "'a b'"),
    ("unknown pod", ["pod", "rm", "nope"], "no pod 'nope'"),
    ("fixed-share overflow", ["pod", "set", "b", "--gpu", "0", "--share", "60"], "b=60"),
    ("no share on fixed-share", ["pod", "set", "b", "--gpu", "0"], "b have no share"),
    ("policy pods do not fit", ["set", "--gpu", "1", "--policy", "bs"], "free have no share"),
    ("missing --gpu", ["set", "--policy", "be"], "Missing option '--gpu'"),
    ("missing pod id", ["pod", "set", "--gpu", "0"], "Missing argument 'ID'"),
    ("unknown option", ["set", "--gpu", "0", "--policy", "be", "--bogus"], "--bogus"),
    ("option without value", ["set", "--policy", "be", "--gpu"], "--gpu"),
    ("unknown command", ["frobnicate"], "frobnicate"),
    ("extra argument", ["status", "extra"], "extra"),
]


@pytest.mark.parametrize(
    ("args", "needle"), [pytest.param(args, needle, id=name) for name, args, needle in BAD_INPUTS]
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    qpolicy_cli: Cli, store: StateStore, args: list[str], needle: str
) -> None:
    before = populated(store)
    result = qpolicy_cli(*args)
    assert result.code == 2
    assert len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith("qpolicy: error: ")
    assert needle in result.err_lines[0]
    assert result.out == ""
    assert store.path.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["pod", "ls"],
        ["set", "--gpu", "0", "--policy", "be"],
        ["pod", "set", "n", "--gpu", "0"],
        ["pod", "rm", "a"],
    ],
)
def test_unusable_state_file_is_exit_1_one_line_and_left_alone(
    qpolicy_cli: Cli, store: StateStore, args: list[str]
) -> None:
    store.directory.mkdir()
    store.path.write_bytes(b'{"schema": 1, "gpus": {}, "pods": {"a": {"gpu": 0, "share": 150}}')
    before = store.path.read_bytes()
    result = qpolicy_cli(*args)
    assert result.code == 1
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith(f"qpolicy: error: state file {store.path}: not valid")
    assert "left untouched" in result.err
    assert result.out == ""
    assert store.path.read_bytes() == before


def test_state_dir_that_cannot_be_used(
    qpolicy_cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.setenv("QPOLICY_STATE_DIR", str(blocker))
    result = qpolicy_cli("pod", "set", "n", "--gpu", "0")
    assert result.code == 1
    assert len(result.err_lines) == 1
    assert "QPOLICY_STATE_DIR" in result.err
    assert blocker.read_text() == "x"


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (
            RuntimeError("boom"),
            "internal error: RuntimeError: boom (QPOLICY_DEBUG=1 shows the traceback)",
        ),
        (typer.Abort(), "aborted"),
    ],
)
def test_unexpected_failures_are_one_line_too(
    qpolicy_cli: Cli, monkeypatch: pytest.MonkeyPatch, raised: BaseException, message: str
) -> None:
    def explode(*_: object) -> None:
        raise raised

    monkeypatch.setattr(qpolicy.cli.status, "gpu_report", explode)
    qpolicy_cli.ok("pod", "set", "/a", "--gpu", "0")
    result = qpolicy_cli("status")
    assert result.code == 1
    assert result.err_lines == [f"qpolicy: error: {message}"]


def test_debug_environment_shows_the_traceback_of_an_internal_error(
    qpolicy_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(qpolicy.cli.status, "gpu_report", explode)
    monkeypatch.setenv("QPOLICY_DEBUG", "1")
    qpolicy_cli.ok("pod", "set", "/a", "--gpu", "0")
    result = qpolicy_cli("status")
    assert result.code == 1
    assert "Traceback (most recent call last)" in result.err
    assert result.err_lines[-1].startswith("qpolicy: error: internal error: RuntimeError: boom")


# --- the installed script -------------------------------------------------------------------------


@pytest.fixture
def script() -> Path:
    path = Path(sys.executable).with_name("qpolicy")
    if not path.exists():
        pytest.skip(f"the qpolicy console script is not installed next to {sys.executable}")
    return path


def script_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["QPOLICY_STATE_DIR"] = str(state_dir)
    return env


def test_script_version_help_and_errors(script: Path, state_dir: Path) -> None:
    env = script_env(state_dir)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [script, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    version = run("--version")
    assert (version.returncode, version.stdout) == (0, f"qpolicy {qpolicy.__version__}\n")
    assert run("--help").returncode == 0
    assert run("pod", "set", "/kubepods/x", "--gpu", "0", "--share", "30").returncode == 0
    before = (state_dir / "state.json").read_bytes()
    bad = run("pod", "set", "/kubepods/y", "--gpu", "0", "--share", "150")
    assert bad.returncode == 2
    assert bad.stderr == (
        "qpolicy: error: invalid share '150': must be an integer percent from 1 to 100\n"
    )
    usage = run("set", "--gpu", "0", "--nope")
    assert usage.returncode == 2
    assert usage.stderr.count("\n") == 1
    assert "--nope" in usage.stderr
    assert (state_dir / "state.json").read_bytes() == before
    listing = json.loads(run("pod", "ls", "--json").stdout)
    assert [pod["id"] for pod in listing] == ["/kubepods/x"]


def test_concurrent_cli_calls_lose_no_pod(script: Path, state_dir: Path) -> None:
    env = script_env(state_dir)
    calls = [
        subprocess.Popen(
            [script, "pod", "set", f"p{n}", "--gpu", str(n % 4)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in range(16)
    ]
    errors = [call.communicate(timeout=120)[1] for call in calls]
    assert [call.returncode for call in calls] == [0] * 16, errors
    assert set(StateStore(state_dir).load().pods) == {f"p{n}" for n in range(16)}


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="becoming another user needs root; as a normal user "
    "test_state.py::test_unreadable_file_and_unwritable_directory covers this",
)
def test_permission_errors_for_an_unprivileged_user(script: Path) -> None:
    """As root the permission-bit test in test_state.py cannot bite, so drop to nobody here."""
    if subprocess.run([*NOBODY, str(script), "--version"], capture_output=True).returncode:
        pytest.skip("user nobody cannot run this venv's interpreter")
    base = Path(tempfile.mkdtemp(prefix="qpolicy-perm-"))
    try:
        base.chmod(0o755)
        env = script_env(base / "state")
        subprocess.run([str(script), "pod", "set", "a", "--gpu", "0"], env=env, check=True)
        state_file = base / "state" / "state.json"
        before = state_file.read_bytes()

        denied = subprocess.run(
            [*NOBODY, str(script), "pod", "set", "b", "--gpu", "0"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert denied.returncode == 1
        assert denied.stderr.count("\n") == 1
        assert "Permission denied" in denied.stderr and "QPOLICY_STATE_DIR" in denied.stderr

        state_file.chmod(0o600)
        unreadable = subprocess.run(
            [*NOBODY, str(script), "status"], env=env, capture_output=True, text=True
        )
        assert unreadable.returncode == 1
        assert "cannot read" in unreadable.stderr and unreadable.stderr.count("\n") == 1
        assert state_file.read_bytes() == before
    finally:
        shutil.rmtree(base)


# --- what operators expect of every command ------------------------------------------------------

COMMANDS = [
    [], ["set"], ["pod"], ["pod", "set"], ["pod", "rm"], ["pod", "delete"], ["pod", "ls"],
    ["status"], ["daemon"], ["trace"], ["sim"], ["demo"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_metavars_not_python_types(qpolicy_cli: Cli, command: list[str]) -> None:
    out = qpolicy_cli.ok(*command, "--help").out
    for python_type in ("<bool>", "<str>", "<int>", "<float>"):
        assert python_type not in out


@pytest.mark.parametrize(
    "command",
    [c for c in COMMANDS if c and c != ["pod"]],
    ids=" ".join,
)
def test_every_command_that_prints_a_result_takes_json(
    qpolicy_cli: Cli, command: list[str]
) -> None:
    assert "--json" in qpolicy_cli.ok(*command, "--help").out


def test_set_pod_rm_and_pod_delete_speak_json(qpolicy_cli: Cli, store: StateStore) -> None:
    assert json.loads(qpolicy_cli.ok("set", "--gpu", "1", "--policy", "fixed", "--json").out) == {
        "gpu": 1,
        "policy": "fixed-share",
        "period_ms": 50,
    }
    added = json.loads(
        qpolicy_cli.ok("pod", "set", "/a", "--gpu", "1", "--share", "5", "--json").out
    )
    assert added["action"] == "added" and added["pod"]["share"] == 5
    qpolicy_cli.ok("pod", "set", "/b", "--gpu", "1", "--share", "5")
    assert json.loads(qpolicy_cli.ok("pod", "rm", "/a", "--json").out) == {
        "action": "removed",
        "pod": "/a",
    }
    assert qpolicy_cli.ok("pod", "delete", "/b").out == "removed pod /b\n"
    assert store.load().pods == {}


def test_a_path_without_its_slash_is_refused_and_names_get_a_note(
    qpolicy_cli: Cli, store: StateStore
) -> None:
    result = qpolicy_cli("pod", "set", "kubepods.slice/x", "--gpu", "0")
    assert result.code == 2
    assert result.err_lines == [
        "qpolicy: error: invalid pod id 'kubepods.slice/x': a cgroup path must start with '/' "
        "(did you mean '/kubepods.slice/x'?); a Kubernetes pod is written namespace/name"
    ]
    assert store.load().pods == {}
    result = qpolicy_cli("pod", "set", "ml/trainer-0", "--gpu", "0")
    assert result.code == 0 and result.err_lines[0].startswith(
        "qpolicy: note: ml/trainer-0 names a Kubernetes pod: the rm and kmod enforcers govern pods "
        "by their cgroup path, so the daemon refuses it"
    )


@pytest.mark.parametrize(
    ("memory", "expected"), [("512Mi", 512 * 2**20), ("1e9", 10**9), ("8G", 8 * 10**9)]
)
def test_memory_takes_kubernetes_quantities(
    qpolicy_cli: Cli, store: StateStore, memory: str, expected: int
) -> None:
    qpolicy_cli.ok("pod", "set", "/p", "--memory", memory)
    assert store.load().pods["/p"].memory_limit == expected


def test_gpus_by_uuid(
    qpolicy_cli: Cli, store: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qpolicy.telemetry.gpus

    proc = tmp_path / "proc-gpus"
    for bus, uuid, minor in (
        ("0000:41:00.0", "GPU-11111111-2222-3333-4444-555555555555", 1),
        ("0000:3b:00.0", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 0),
    ):
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(
            f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\n"
        )
    monkeypatch.setattr(qpolicy.telemetry.gpus, "PROC_GPUS", proc)
    qpolicy_cli.ok("set", "--gpu", "GPU-11111111-2222-3333-4444-555555555555", "--policy", "bs")
    qpolicy_cli.ok("pod", "set", "/p", "--gpu", "gpu-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    state = store.load()
    assert set(state.gpus) == {1} and state.pods["/p"].gpu == 0  # PCI order, as nvidia-smi
    result = qpolicy_cli("pod", "set", "/q", "--gpu", "GPU-00000000-0000-0000-0000-000000000000")
    assert result.code == 2 and "no GPU of that UUID on this node (2 GPU(s) here)" in result.err


def test_status_shows_what_the_running_daemon_sees(
    qpolicy_cli: Cli, store: StateStore, state_dir: Path
) -> None:
    from qpolicy.daemon import Daemon, DaemonConfig

    qpolicy_cli.ok("set", "--gpu", "0", "--policy", "fs")
    qpolicy_cli.ok("pod", "set", "/a", "--gpu", "0", "--share", "60")
    assert qpolicy_cli("pod", "set", "ml/web", "--gpu", "0", "--share", "10").code == 0
    agent = Daemon(
        DaemonConfig(state_dir=state_dir, metrics_addr=None, cgroup_root=state_dir / "none"),
        lambda context: Unnamed(context),
    )
    try:
        agent.tick()
        report = json.loads(qpolicy_cli.ok("status", "--json").out)["daemon"]
        assert report["pid"] == os.getpid() and report["enforcer"] == "none"
        assert [p["id"] for p in report["pods"]] == ["/a"]
        (refused,) = report["refused"]
        assert (refused["pod"], refused["reason"]) == ("ml/web", "unenforceable")
        out = qpolicy_cli.ok("status").out
        assert f"daemon pid {os.getpid()} · enforcer none" in out
        assert "refused (state file, unenforceable): pod ml/web: only cgroups here" in out
    finally:
        agent.close()
    assert json.loads(qpolicy_cli.ok("status", "--json").out)["daemon"] is None


def test_status_says_which_pods_keep_their_own_timeslices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pod of several GPU processes loses the online lever next to it (the rm enforcer's
    own_timeslices); the text status says so, not only --json."""
    from qpolicy.cli import daemonstatus

    doc = {
        "pid": 7,
        "enforcer": "rm",
        "sources": {},
        "backend": {"gpus": {"0": {"own_timeslices": {"/train": 2}}, "1": {}}},
    }
    daemonstatus.render(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU 0: pod /train has 2 CUDA contexts here: its TSGs keep their own timeslices" in out
    daemonstatus.render({**doc, "backend": {"gpus": {"0": {"own_timeslices": {}}}}})
    assert "own timeslices" not in capsys.readouterr().out


def test_daemon_status_says_when_annotations_are_walked_rather_than_watched(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from qpolicy.cli import daemonstatus

    doc = {"pid": 7, "enforcer": "rm", "sources": {}}
    daemonstatus.render(
        {**doc, "annotations": {"walked": "no inotify instance (Too many open files)"}}
    )
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "annotations: the cgroup hierarchy is walked every second (no inotify instance (Too many"
        " open files))" in out
    )
    daemonstatus.render(
        {**doc, "annotations": {"walked": "watching /x: No space left on device",
                                "directories": 5211, "walk_ms": 254.3, "walk_every_s": 25.4}}
    )  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "annotations: the cgroup hierarchy is walked every 25.4 s, 254.3 ms a walk (watching /x:"
        " No space left on device)" in out
    )
    daemonstatus.render({**doc, "annotations": {"watched_directories": 40}})
    assert "annotations" not in capsys.readouterr().out


def test_daemon_status_says_when_cgroup_ids_are_walked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from qpolicy.cli import daemonstatus

    doc = {"pid": 7, "enforcer": "rm", "sources": {}}
    walked = {"by_id": False, "opened": 0, "walks": 3, "walk_ms": 201.5, "walk_every_s": 20.2}
    daemonstatus.render({**doc, "cgroup_ids": walked})
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "cgroup ids are found by walking the hierarchy (3 walks, 201.5 ms the last, at most every"
        " 20.2 s): opening cgroups by id needs CAP_DAC_READ_SEARCH and Linux 5.5" in out
    )
    for quiet in ({**walked, "by_id": True}, {**walked, "walks": 0}, {}):
        daemonstatus.render({**doc, "cgroup_ids": quiet})
        assert "cgroup ids" not in capsys.readouterr().out


def test_status_says_which_pods_the_cta_strategy_set(capsys: pytest.CaptureFixture[str]) -> None:
    from qpolicy.cli import daemonstatus

    gpus = {"0": {"preemption_modes": {"/train": "CTA"}}, "1": {"preemption_modes": {}}}
    daemonstatus.render({"pid": 7, "enforcer": "rm", "sources": {}, "backend": {"gpus": gpus}})
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU 0: compute preemption set on offline pods' contexts: /train (CTA)" in out
    assert "GPU 1" not in out


def test_status_says_where_the_rm_enforcer_stretched_the_period(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three offline pods at 400 ms turns run 1.2 s periods, not the 50 ms configured: fixed
    shares hold over those, and status says so; a period as configured is not mentioned."""
    from qpolicy.cli import daemonstatus

    gpus = {
        "0": {"period_us": 1_200_000, "configured_period_us": 50_000, "stretched_for": "turns"},
        "1": {"period_us": 50_000, "configured_period_us": 50_000, "stretched_for": None},
        "2": {"period_us": None, "configured_period_us": 50_000},
        "3": {"period_us": 1_000_000, "configured_period_us": 50_000, "stretched_for": "quiet"},
    }
    daemonstatus.render({"pid": 7, "enforcer": "rm", "sources": {}, "backend": {"gpus": gpus}})
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "GPU 0: period stretched to 1200 ms (configured 50 ms) so that each offline pod's turn "
        "lasts the daemon's --min-turn-ms" in out
    )
    assert "GPU 1" not in out and "GPU 2" not in out
    assert (
        "GPU 3: period stretched to 1000 ms (configured 50 ms): nothing to gate (one offline "
        "pod at most, no online cap), so the loop steps once a second" in out
    )


def test_status_says_what_the_doctor_promises_online_work_on_each_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The daemon's strategy carries the doctor's promise from its cache; the text status says
    it per GPU, and nothing where no doctor result has one."""
    from qpolicy.cli import daemonstatus
    from qpolicy.doctor.promise import promise
    from qpolicy.enforcers.strategy import DEFAULT, strategy_for

    results = Path(__file__).parents[2] / "tools" / "gpu" / "results"
    report = json.loads((results / "2026-12-03-doctor-promise-8192-h200-call31A.json").read_text())
    report["promise"] = promise(report["phases"], report["recommendation"])
    (tmp_path / "doctor-gpu0.json").write_text(json.dumps(report))
    gpus = {
        "0": {"online_strategy": strategy_for(tmp_path, 0).describe()},
        "1": {"online_strategy": DEFAULT.describe()},
    }
    daemonstatus.render({"pid": 7, "enforcer": "rm", "sources": {}, "backend": {"gpus": gpus}})
    out = capsys.readouterr().out
    assert (
        "GPU 0: what qpolicy can promise online work here (qpolicy doctor of 2026-12-03 06:48 "
        "UTC: timeslice-1us-8ms):\n"
        "  online p99 <= 1.5 x solo's: 1.00 ms, 1.17 x solo's 0.86: met\n"
        "  online p50 <= 1.2 x solo's: 0.78 ms, 1.47 x solo's 0.53: MISSED\n"
    ) in out
    assert "better than MPS at p50 and p99: 0.78 / 1.00 against 1.35 / 2.29 ms: met" in out
    assert "GPU 1" not in out
    # A damaged promise in the cache is no promise, and no exception.
    report["promise"] = {"targets": [{"text": 3}, "x"]}
    (tmp_path / "doctor-gpu0.json").write_text(json.dumps(report))
    assert strategy_for(tmp_path, 0).promise == ()


def test_status_says_what_the_daemon_took_over_from_the_one_before_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a restart the text status says what the rm enforcer re-opened and adopted, and
    what it could not; a first start says nothing of it."""
    from qpolicy.cli import daemonstatus

    doc = {
        "pid": 7,
        "enforcer": "rm",
        "sources": {},
        "backend": {
            "recovered": {"channel_groups_opened": 2, "timeslices_restored": 0, "problems": []},
            "adopted": {
                "processes": 2,
                "channels": 40,
                "objects": 270,
                "dropped": 0,
                "problems": ["pid 9: RM_CONTROL: Bad file descriptor"],
            },
            "gpus": {},
        },
    }
    daemonstatus.render(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "at start: re-opened 2 channel group(s) and restored 0 timeslice(s); adopted 2 "
        "process(es) (40 channels) the daemon before it left" in out
    )
    assert "could not adopt at start: pid 9: RM_CONTROL: Bad file descriptor" in out
    first = {"recovered": {"channel_groups_opened": 0, "timeslices_restored": 0, "problems": []}}
    daemonstatus.render({**doc, "backend": {**first, "adopted": {"processes": 0}, "gpus": {}}})
    assert "at start" not in capsys.readouterr().out


def test_status_speaks_of_the_rm_guard_only_when_something_is_wrong(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from qpolicy.cli import daemonstatus

    def said(guard: object) -> str:
        doc = {"pid": 7, "enforcer": "rm", "sources": {}, "backend": {"gpus": {}, "guard": guard}}
        daemonstatus.render(doc)
        return " ".join(capsys.readouterr().out.split())

    assert "guard" not in said({"pid": 9, "running": True, "restarts": 0})
    assert "no guard: it could not be started" in said(None)
    down = said({"pid": 9, "running": False, "restarts": 2})
    assert "the guard is not running" in down
    assert "the guard was started again 2 time(s)" in down
    daemonstatus.render({"pid": 7, "enforcer": "kmod", "sources": {}, "backend": {"gpus": {}}})
    assert "guard" not in capsys.readouterr().out


def test_status_says_which_processes_were_found_by_asking_rm_and_which_are_not_governed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from qpolicy.cli import daemonstatus

    doc = {
        "pid": 7,
        "enforcer": "rm",
        "sources": {},
        "backend": {
            "gpus": {},
            "unseen_processes": {"/kubepods.slice/a": [41, 42]},
            "searched": {
                "found_processes": 2,
                "found_channels": 40,
                "controls": 9500,
                "searching": [42],
                "not_found": [41],
                "refusals": 12,
                "look": {"cgroups": 5003, "ms": 266.1, "every_s": 26.6, "spaced": True},
            },
        },
    }
    daemonstatus.render(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "12 question(s) about client handles RM could not name" in out
    # A tenant's many cgroups space the looks (qpolicy.enforcers.rm.unseen.LOOK_SHARE).
    assert "looked for every 26.6 s: the pods' 5003 cgroups took 266.1 ms a look" in out
    assert "found by asking RM: 2 process(es) (40 channels) no probe saw allocate" in out
    assert "asking RM for the objects of pid(s) 42" in out
    assert "not governed: pod /kubepods.slice/a: pid(s) 41, 42 use the GPU" in out
    daemonstatus.render({**doc, "backend": {"gpus": {}}})
    quiet = capsys.readouterr().out
    assert "asking RM" not in quiet and "not governed" not in quiet
    daemonstatus.render({**doc, "backend": {"gpus": {}, "searched": {"look": {"spaced": False}}}})
    assert "looked for" not in capsys.readouterr().out


def test_kmod_status_says_which_cgroups_keep_their_own_timeslices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """qgpu.ko's own_timeslices (more than one CUDA context of the cgroup on its GPU) is said in
    the text status, with the words the rm enforcer's uses."""
    from qpolicy.cli import kmodstatus

    cgroup = {
        "cgroup_id": 5, "path": "/train", "gpu": 0, "class": "offline", "share": 50,
        "memory_used_bytes": 0, "memory_limit_bytes": None, "gpu_time_s": 1.0,
        "throttled_s": 0.0, "periods": 3, "throttled_periods": 0, "own_timeslices": True,
    }  # fmt: skip
    doc = {
        "version": 1, "target": "nvidia", "hooked": True, "cgroups_configured": 1,
        "error": None, "gpus": [], "cgroups": [cgroup],
    }  # fmt: skip
    kmodstatus.render(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "/train: several CUDA contexts on this GPU: its TSGs keep their own timeslices" in out
    assert "waits as under native time-slicing" in out  # online_gate unknown: nothing promised
    # qgpu's default closes such a pod for online work, and the status says so.
    for gate in (1, 2):
        kmodstatus.render({**doc, "online_gate": gate})
        out = " ".join(capsys.readouterr().out.split())
        assert "qgpu closes it while online work runs" in out and "waits" not in out
    kmodstatus.render({**doc, "online_gate": 0})
    assert "waits as under native time-slicing" in " ".join(capsys.readouterr().out.split())
    kmodstatus.render({**doc, "cgroups": [{**cgroup, "own_timeslices": False}]})
    assert "own timeslices" not in capsys.readouterr().out


class Unnamed(ObserveBackend):
    """An observing backend that, like rm and kmod, takes only cgroup paths."""

    def unenforceable(self, pod: PodSpec) -> str | None:
        return None if pod.id.startswith("/") else "only cgroups here"
