"""The rm enforcer's guard against a real OOM kill, the one way of dying the GPU hosts could not
show (no CAP_SYS_RESOURCE there: the guard's ``oom_score_adj`` -1000 was refused).

On cgroup v2 the kubelet (1.28 on) sets ``memory.oom.group`` on each container, and the OOM
killer then takes every process of the container, all but those at -1000 (mm/oom_kill.c,
``oom_kill_memcg_member``). Here a stand-in daemon (tests/vm/oomdaemon.py: the real Guard and
RmRecord, a channel of a gpuload closed as the rm enforcer closes one) runs in such a cgroup with
a sleeper beside it, and allocates until the cgroup's limit kills them. The guard must outlive
the kill and open the channel again.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qpolicy.enforcers.rm.record import parse_stat
from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import BAD_KERNEL_LOG, ROOT, kernel_log, processes, read_counts

SATURATE = ["--shape", "saturate", "--kernel-us", "1000", "--sync-every", "4", "--queue", "2"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
LIMIT = 160 << 20  # two Pythons (the stand-in, the guard) fit; the hoard does not


def gpu_ns(pid: int) -> int:
    return processes().get(pid, 0)


def alive(pid: int) -> bool:
    try:
        stat = parse_stat(Path(f"/proc/{pid}/stat").read_bytes())
    except OSError:
        return False
    return stat is not None and stat[0] != "Z"


def test_an_oom_group_kill_spares_the_guard_which_reopens_the_closed_pod() -> None:
    earlier = [line for line in kernel_log().splitlines() if BAD_KERNEL_LOG.search(line)]
    assert not earlier, "\n".join(earlier)  # checked here: the OOM report is cleared below
    controllers = (CGROUP_ROOT / "cgroup.subtree_control").read_text().split()
    if "memory" not in controllers:
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
    cgroup = CGROUP_ROOT / f"qpolicy-vm-oom-{os.getpid()}"
    cgroup.mkdir()
    state_dir = Path(tempfile.mkdtemp(prefix="qpolicy-vm-oom-"))
    load = Gpuload([*SATURATE, "--seconds", "30"]).ready()
    stand_in = None
    try:
        (cgroup / "memory.max").write_text(str(LIMIT))
        (cgroup / "memory.swap.max").write_text("0")
        (cgroup / "memory.oom.group").write_text("1")
        time.sleep(0.5)
        stand_in = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.vm.oomdaemon",
                str(cgroup),
                str(state_dir),
                str(load.pid),
                str(load.ctl_fd()),
                hex(load.client),
                hex(load.subdevice),
                hex(load.channel),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert stand_in.stdout is not None
        said = stand_in.stdout.readline().split()
        assert said[:2] == ["closed", "ok=True"], said
        guard_pid, sleeper_pid = (int(word.split("=")[1]) for word in said[2:4])
        assert Path(f"/proc/{guard_pid}/oom_score_adj").read_text().strip() == "-1000"
        closed_at = gpu_ns(load.pid)
        time.sleep(0.3)
        # Closed: at most the chunk in flight ran on.
        assert gpu_ns(load.pid) - closed_at < 5_000_000

        pidfd = os.pidfd_open(stand_in.pid)
        try:
            assert select.select([pidfd], [], [], 60)[0], "the stand-in was never killed"
            died = time.monotonic()
        finally:
            os.close(pidfd)
        stopped = gpu_ns(load.pid)
        reopened = None
        while time.monotonic() - died < 5:
            if gpu_ns(load.pid) - stopped > 2_000_000:
                reopened = time.monotonic() - died
                break
            time.sleep(0.002)
        _, err = stand_in.communicate(timeout=10)
        events = read_counts(cgroup / "memory.events")
        said_by_guard = [line for line in err.splitlines() if "guard:" in line]
        print(f"pod open again {reopened} s after the stand-in's death showed; {events}")
        print("\n".join(said_by_guard))
        assert stand_in.returncode == -9
        assert events["oom_group_kill"] >= 1
        assert not alive(sleeper_pid)  # the whole group went, but for the guard
        assert reopened is not None, err
        assert "re-opened 1 channel group(s)" in err, err
        deadline = time.monotonic() + 10
        while alive(guard_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(guard_pid)  # its work done, it left
        log = kernel_log()
        assert "Memory cgroup out of memory" in log
        others = [
            line
            for line in log.splitlines()
            if BAD_KERNEL_LOG.search(line) and "Call Trace" not in line
        ]
        assert not others, "\n".join(others)
    finally:
        if stand_in is not None and stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()
        for pid in (cgroup / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        deadline = time.monotonic() + 5
        while (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        cgroup.rmdir()
        shutil.rmtree(state_dir, ignore_errors=True)
        load.result()
        # The OOM report's stack trace is the kernel's, not a fault: the session's check must
        # not read it as one (every line before it was checked above).
        subprocess.run(["dmesg", "--clear"], check=True)
