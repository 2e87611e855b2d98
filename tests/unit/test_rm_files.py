"""Borrowed descriptors live no longer than the tenant's own: real processes, real pidfd_getfd."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpolicy.enforcers.rm.files import BorrowedFiles, same_file
from qpolicy.nvrm import rmctl

# The tenant: opens a file as fd 9, then on each line from stdin does what it says.
TENANT = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.dup2(fd, 9)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "swap":
        os.close(9)
        os.dup2(os.open(sys.argv[2], os.O_RDONLY), 9)
    print("done", flush=True)
"""


@pytest.fixture
def tenant(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("1")
    second.write_text("2")
    proc = subprocess.Popen(
        [sys.executable, "-c", TENANT, str(first), str(second)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    try:
        rmctl.borrow_fd(proc.pid, 9)
    except rmctl.RmError as error:
        proc.kill()
        pytest.skip(f"pidfd_getfd is not allowed here: {error}")
    yield proc
    proc.kill()
    proc.wait()


def send(proc: subprocess.Popen[str], command: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "done\n"


def test_a_reused_fd_number_is_not_handed_out_as_the_old_file(
    tenant: subprocess.Popen[str],
) -> None:
    files = BorrowedFiles()
    mine = files.get(tenant.pid, 9)
    assert os.pread(mine, 1, 0) == b"1"
    assert files.get(tenant.pid, 9) == mine  # cached while it is the same file
    send(tenant, "swap")
    if same_file(tenant.pid, 9, mine) is None:
        pytest.skip("kcmp(2) is not available on this kernel")
    fresh = files.get(tenant.pid, 9)
    assert os.pread(fresh, 1, 0) == b"2"
    assert files.closed_stale == 1
    files.close_all()


def test_reconcile_lets_go_of_a_process_that_exited_without_an_exit_event(
    tenant: subprocess.Popen[str],
) -> None:
    files = BorrowedFiles()
    mine = files.get(tenant.pid, 9)
    assert len(files) == 1
    tenant.kill()
    tenant.wait()
    # No probe told us: the pidfd did.
    deadline = time.monotonic() + 5
    exited: list[int] = []
    while not exited and time.monotonic() < deadline:
        exited = files.reconcile()
        time.sleep(0.01)
    assert exited == [tenant.pid]
    assert len(files) == 0 and files.processes() == [] and files.closed_exited == 1
    with pytest.raises(OSError):
        os.fstat(mine)  # closed: the tenant's file (and its RM clients) can go


def test_reconcile_closes_a_copy_whose_tenant_fd_changed(tenant: subprocess.Popen[str]) -> None:
    files = BorrowedFiles()
    files.get(tenant.pid, 9)
    send(tenant, "swap")
    if same_file(tenant.pid, 9, files.get(tenant.pid, 9)) is None:
        pytest.skip("kcmp(2) is not available on this kernel")
    send(tenant, "swap")  # the copy taken above is now stale too
    assert files.reconcile() == [] and len(files) == 0 and files.closed_stale == 2
    files.close_all()


def test_a_process_that_is_gone_is_an_rm_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(rmctl.RmError, match=f"cannot open process {proc.pid}"):
        BorrowedFiles().get(proc.pid, 0)
