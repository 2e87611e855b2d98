"""``qpolicy trace`` without --replay, where no probe can load: one-line errors, --ebpf."""

import os
import sys
from pathlib import Path

import pytest

from qpolicy.cli import main
from qpolicy.telemetry import probe as probe_module
from qpolicy.telemetry.btf import VMLINUX
from qpolicy.telemetry.probe import ProbeError


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    assert isinstance(exit_info.value.code, int)
    return exit_info.value.code, out, err


def test_without_bcc_the_error_names_the_package(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bcc", None)  # import bcc now raises ImportError
    code, out, err = run(capsys, "trace", "--device", "1:7=ctl")
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert "python3-bpfcc" in err


def test_without_privileges_the_error_says_root(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe_module, "_import_bpf", lambda: object)
    check = probe_module._check_privileges

    def unprivileged(status: str | None = None) -> None:
        check("CapEff:\t0000000000000000\n")

    monkeypatch.setattr(probe_module, "_check_privileges", unprivileged)
    code, _, err = run(capsys, "trace", "--json", "--device", "1:7=ctl")
    assert code == 1
    assert err.startswith("qpolicy: error: the eBPF probe needs root")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "1:7"], "expected MAJOR:MINOR=NODE"),
        (["--replay", "x.jsonl", "--cgroup", "/a"], "are for live tracing"),
        (["--interval", "0"], "--interval"),
    ],
)
def test_bad_live_options(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, "trace", *args)
    assert code == 2
    assert message in err and err.count("\n") == 1


def _have_bcc() -> bool:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(
    not VMLINUX.exists() or not os.access("/sys/kernel/tracing/events", os.R_OK) or not _have_bcc(),
    reason="needs the kernel's BTF, a readable tracefs and bcc",
)
def test_ebpf_prints_the_program_with_this_kernels_offsets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "trace", "--ebpf", "--device", "1:7=ctl")
    assert (code, err) == (0, "")
    assert "TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)" in out
    assert "QP_OFF_" not in out.split("*/", 1)[1]


def test_probe_error_is_a_qpolicy_error() -> None:
    assert issubclass(ProbeError, probe_module.QPolicyError)
    assert Path(probe_module.EBPF_DIR / probe_module.SOURCE).is_file()
