"""The state qgpu keeps of each channel is what RM carried out, at any scale.

Unloading reopens every channel qgpu closed, however many (here a thousand, past what one
scheduler pass changes), and tries again where RM fails its opens; a FIFO_DISABLE_CHANNELS that
RM failed is tried again until it is carried out. Ground truth: nvmock's channels (debugfs
gpu0/channels) and its record of the kernel client's ops (debugfs kapi), with failures injected
by debugfs kapi_fail_control.

Run on single-threaded TCG like test_qgpu_safety.py (VM_QEMU_OPTS="-accel tcg,thread=single"):
the module is unloaded while its scheduler runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from qpolicy.enforcers.kmod.client import QgpuClient
from tests.vm.nvmock import DEBUGFS, kernel_log, objects
from tests.vm.qgpu_env import Cgroup, cgroups, insmod, loaded, qgpu_loaded, rmmod
from tests.vm.test_qgpu_rmapi import FIFO_DISABLE_CHANNELS, OP_CONTROL, kapi
from tests.vm.worker import Worker

CHANNELS = 1000
NV_ERR_INVALID_STATE = 0x40


def channel_fields(pid: int, gpu: int = 0) -> list[dict[str, str]]:
    """Each of the process's channels as nvmock lists it."""
    out = []
    for line in (DEBUGFS / f"gpu{gpu}" / "channels").read_text().splitlines():
        words = line.split()
        fields = dict(zip(words[1::2], words[2::2], strict=False))
        if int(fields["pid"]) == pid:
            out.append(fields)
    return out


def channel_states(pid: int, gpu: int = 0) -> list[bool]:
    """Whether each of the process's channels is enabled, from nvmock."""
    return [fields["enabled"] == "1" for fields in channel_fields(pid, gpu)]


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"no {what} in {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_unloading_reopens_a_thousand_closed_channels() -> None:
    with cgroups(1) as (pod,):
        insmod()
        try:
            worker = Worker(pod.path)
            try:
                assert worker.ask(f"channels {CHANNELS}") == {"channels": CHANNELS}
                with QgpuClient.open() as client:
                    # 1 % of a second: closed nearly all the time (never-mapped channels count
                    # as busy, so the slice runs out at once).
                    client.set_gpu(0, "fixed-share", 1_000_000)
                    client.set_cgroup(pod.id, 0, "offline", 1)
                took = wait_for(
                    "every channel closed",
                    lambda: channel_states(worker.pid).count(False) == CHANNELS,
                    timeout=30,
                )
                print(f"{CHANNELS} channels closed in {took:.2f} s")
                started = time.monotonic()
                result = rmmod()
                assert result.returncode == 0, result.stderr
                print(f"rmmod took {time.monotonic() - started:.2f} s")
                states = channel_states(worker.pid)
                assert len(states) == CHANNELS
                assert states.count(True) == CHANNELS, f"{states.count(False)} left closed"
                # Never closed twice: GSP counts closes (nvmock's control.c), and a channel
                # closed twice would have needed two opens.
                nested = max(int(f["disables_max"]) for f in channel_fields(worker.pid))
                assert nested == 1
                # The kernel client went with the module.
                assert objects()["clients"] == 1
            finally:
                worker.close()
        finally:
            if loaded():
                rmmod()


@contextmanager
def online_beside_offline(fail: str) -> Iterator[tuple[Cgroup, Cgroup, Worker, Worker]]:
    """An online and an offline cgroup with a worker of one channel in each, and the kernel
    client's next FIFO_DISABLE_CHANNELS armed to fail as ``fail`` tells nvmock ("4", "1 acted");
    disarmed after. qgpu must be loaded first, to track the workers' channels."""
    with cgroups(2) as (online, offline):
        busy = Worker(online.path)
        victim = Worker(offline.path)
        try:
            assert busy.ask("channels 1") == {"channels": 1}
            assert victim.ask("channels 1") == {"channels": 1}
            (DEBUGFS / "kapi_fail_control").write_text(f"{FIFO_DISABLE_CHANNELS:#x} {fail}")
            yield online, offline, busy, victim
        finally:
            (DEBUGFS / "kapi_fail_control").write_text(f"{FIFO_DISABLE_CHANNELS:#x} 0")
            busy.close()
            victim.close()


def configure_online_and_offline(client: QgpuClient, online: Cgroup, offline: Cgroup) -> None:
    # An online cgroup that always has work: offline channels are closed for good (with
    # online_gate=2, whatever their timeslice), so no later change closes them by the way.
    client.set_gpu(0, "best-effort", 50_000)
    client.set_cgroup(online.id, 0, "online", 50)
    client.set_cgroup(offline.id, 0, "offline", 50)


@contextmanager
def offline_closed_for_unloading(fail: str, **params: int) -> Iterator[tuple[Worker, Worker]]:
    """qgpu loaded (online_gate=2 and ``params``), an online and an offline worker as
    online_beside_offline() makes them, configured, and the offline channel closed: the
    workers, (busy, victim), for the test to unload qgpu. Unloaded after, if the test did not."""
    insmod(online_gate=2, **params)
    try:
        with online_beside_offline(fail) as (online, offline, busy, victim):
            with QgpuClient.open() as client:
                configure_online_and_offline(client, online, offline)
            wait_for("the offline channel closed",
                     lambda: channel_states(victim.pid) == [False], timeout=10)  # fmt: skip
            yield busy, victim
    finally:
        if loaded():
            rmmod()


def test_a_failed_close_is_tried_again_until_rm_carries_it_out() -> None:
    # RM fails the next four FIFO_DISABLE_CHANNELS: the batch and the one-by-one call of the
    # first try, then the retries.
    with (
        qgpu_loaded(online_gate=2) as client,
        online_beside_offline("4") as (online, offline, busy, victim),
    ):
        configure_online_and_offline(client, online, offline)
        took = wait_for("the offline channel closed",
                        lambda: channel_states(victim.pid) == [False], timeout=10)  # fmt: skip
        print(f"closed {took:.2f} s after configuring")
        failed = [
            op
            for op in kapi()[1]
            if op.op == OP_CONTROL
            and op.what == FIFO_DISABLE_CHANNELS
            and op.status == NV_ERR_INVALID_STATE
        ]
        assert len(failed) == 4, failed
        assert channel_states(busy.pid) == [True]
        # It stays closed.
        time.sleep(0.5)
        assert channel_states(victim.pid) == [False]


def test_a_close_rm_carried_out_but_failed_is_undone_before_it_is_tried_again() -> None:
    """RM counts closes (an H200: a channel closed twice runs only after two opens), and
    whether GSP acted on a list it answered an error for is unknown. Without the open that
    undoes a failed close, the one-by-one retry closed the channel a second time here, and
    unloading (one open) left it closed."""
    # The next FIFO_DISABLE_CHANNELS is carried out, then answered an error.
    with offline_closed_for_unloading("1 acted") as (busy, victim):
        time.sleep(0.3)
        (fields,) = channel_fields(victim.pid)
        assert fields["disables"] == "1" and fields["disables_max"] == "1", fields
        result = rmmod()
        assert result.returncode == 0, result.stderr
        assert channel_states(victim.pid) == [True]
        assert channel_states(busy.pid) == [True]


def test_unloading_tries_again_where_rm_fails_the_opens() -> None:
    """RM fails the opens of unloading's first two passes (a GSP busy for a moment: each pass
    sends the batch, then the channel alone). A channel left closed once qgpu is gone would hang
    its process for good, with nothing left to open it: unloading tries again, pass after pass,
    and gives up only after UNLOAD_TRIES passes in a row without progress. The online worker
    keeps the offline one closed until then (blind_busy_ms: its USERD is never mapped), so the
    failures armed are the unloading's."""
    log_lines = len(kernel_log().splitlines())
    with offline_closed_for_unloading("0", blind_busy_ms=600_000) as (busy, victim):
        failed = kapi()[0]["failed"]
        (DEBUGFS / "kapi_fail_control").write_text(f"{FIFO_DISABLE_CHANNELS:#x} 4")
        result = rmmod()
        assert result.returncode == 0, result.stderr
        assert channel_states(victim.pid) == [True]
        assert channel_states(busy.pid) == [True]
        assert kapi()[0]["failed"] - failed >= 4  # every armed failure was met
        said = kernel_log().splitlines()[log_lines:]
        assert not [line for line in said if "stay closed" in line], said
