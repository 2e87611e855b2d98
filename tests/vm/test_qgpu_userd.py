"""qgpu's busy detection with USERD as CUDA has it: a 512-byte slot at a client-chosen offset in
a video memory object mapped through BAR1 (nvmock's ivshmem BAR), the channel never mapped.

Busy is GP_PUT != GP_GET in that slot (kmod/qgpu/userd.c); online busy closes offline work
(sysfs online_busy says what qgpu decided). Before qgpu read such USERD, every CUDA channel
counted as busy for ever and one online CUDA process kept every offline channel closed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from qpolicy.nvrm.abi import NvStatus
from tests.vm.conftest import HOST_TIMED
from tests.vm.gpuload import start_together
from tests.vm.linetenant import LineTenant
from tests.vm.nvmock import nvmock_param, processes, reset, threads_named
from tests.vm.qgpu_env import (
    COLD_AFTER_S,
    COLD_LOOK,
    DORMANT_LOOK,
    SYSFS,
    Cgroup,
    cgroups,
    in_cgroup,
    qgpu_loaded,
    sched_counts,
)

PERIOD_US = 50_000
SLOT = 0x2200  # not page-aligned: slots are 512 bytes
SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]


class UserdTenant(LineTenant):
    """tests/vm/userd_tenant.py in a cgroup: a CUDA-shaped channel whose GP_PUT and GP_GET the
    test writes (the engine never fetches from it)."""

    def __init__(self, cg: Cgroup, *args: str) -> None:
        super().__init__(cg.path, "tests.vm.userd_tenant", str(SLOT), *args)


@contextmanager
def userd_tenant(cg: Cgroup, *args: str) -> Iterator[UserdTenant]:
    tenant = UserdTenant(cg, *args)
    try:
        yield tenant
    finally:
        tenant.close()


def online_busy_samples(seconds: float) -> list[bool]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append((SYSFS / "gpu0" / "online_busy").read_text().strip() == "1")
        time.sleep(0.02)
    return out


def gpu_rate(pid: int, seconds: float) -> float:
    before = processes().get(pid, 0)
    started = time.monotonic()
    time.sleep(seconds)
    return (processes().get(pid, 0) - before) / 1e9 / (time.monotonic() - started)


def test_client_userd_in_bar1_reads_busy_while_work_is_pending_and_idle_after() -> None:
    with qgpu_loaded() as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online) as tenant:
            assert not any(online_busy_samples(0.5))
            tenant.ask("put 1")
            assert all(online_busy_samples(0.5)[2:])
            tenant.ask("get 1")  # fetched: nothing pending (the hold is 2 ms)
            time.sleep(0.1)
            assert not any(online_busy_samples(0.5))


def test_qgpu_stops_reading_userd_once_rm_tears_its_mapping_down() -> None:
    """Unmapped or freed, the slot is not read again: the channel is blind, busy for
    blind_busy_ms and idle after, although the slot still says GP_PUT != GP_GET."""
    with qgpu_loaded(blind_busy_ms=300) as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        for teardown in ("unmap", "free"):
            with userd_tenant(online) as tenant:
                tenant.ask("put 1")
                assert all(online_busy_samples(0.3)[2:])
                tenant.ask(teardown)
                time.sleep(0.6)
                assert not any(online_busy_samples(0.5)), teardown


@pytest.mark.parametrize("race", ["--overwritten-map", "--renumbered-map"])
def test_the_mapping_of_userd_is_noted_on_the_file_rm_mapped_it_for(race: str) -> None:
    """An online tenant maps its USERD memory for a new GPU fd, twice, with RM_UNMAP_MEMORY
    between, and misleads whoever looks at the answer after the driver copied it out (never by
    chance: userd_tenant.OverwrittenMap stops the copy-out with userfaultfd):

    - overwritten: it stores another GPU fd of its own (the decoy, never mapped) over the fd of
      RM's answer, and an address past the mapping over its pLinearAddress. qgpu reads the
      answer from the driver's copy.
    - renumbered: it dup2()s the decoy over the fd's number (RM looked it up already) and mmaps
      the file RM mapped through another fd of it. qgpu takes the file RM found during the call
      (its probe on nv_get_file_private).

    Either way the tenant's mmap of the file RM mapped is read, and its channel with GP_PUT !=
    GP_GET stays busy well past blind_busy_ms; once the tenant unmaps the address RM answered,
    the slot is not read again (blind: idle after blind_busy_ms). (Read back from the tenant's
    buffer, or found again by its number after the call, the mapping was noted on the decoy's
    file and the channel went blind: busy for blind_busy_ms, then idle. With the decoy's
    address read back, the unmap of RM's matched nothing and qgpu went on reading a mapping RM
    had torn down.)"""
    with qgpu_loaded(blind_busy_ms=300) as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online, race) as tenant:
            for round_ in range(2):
                out = tenant.ask("map")
                assert out["status"] == NvStatus.NV_OK, out
                if race == "--overwritten-map":
                    # RM mapped the fd asked for, and the answer came back overwritten.
                    assert out["faults"] == ["copy-out", "read-back"], out
                    assert out["fd"] == out["decoy"] != out["target"], out
                    assert out["linear"] != out["rm_linear"], out
                else:
                    # The answer is RM's; its number names the decoy's file by then.
                    assert out["faults"] == ["copy-out"], out
                    assert out["fd"] == out["target"] != out["kept"], out
                tenant.ask("put 1")
                time.sleep(0.6)
                assert all(online_busy_samples(0.5)), (round_, out)
            tenant.ask("unmap")  # qgpu lets go of the mapping it names, whatever RM answers
            time.sleep(0.6)
            assert not any(online_busy_samples(0.5)), out
        assert int((SYSFS / "rewrites_unchecked").read_text()) == 0


def test_an_online_cuda_process_does_not_keep_offline_work_closed() -> None:
    """Two idle CUDA-shaped channels online, one of them never mapped (qgpu cannot read it):
    the offline pod runs once blind_busy_ms has passed."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with userd_tenant(online), userd_tenant(online, "--no-map"):
            reset()
            train = in_cgroup(offline, [*SATURATE, "--seconds", "5"]).ready()
            time.sleep(1.5)
            rate = gpu_rate(train.pid, 2.0)
            busy = online_busy_samples(0.5)
            train.result()
        print(f"offline GPU rate next to idle online CUDA channels: {rate:.3f}")
        assert rate > 0.5
        assert not any(busy)


def test_online_gpuload_with_client_userd_closes_offline_work_while_it_runs() -> None:
    """End to end through the engine: GP_PUT in a BAR1 slot, GP_GET moved on fetch. With
    online_gate=2 qgpu closes every offline cgroup while online work is seen, so what the
    offline pod gets follows what qgpu reads in USERD."""
    with qgpu_loaded(online_gate=2) as client, cgroups(2) as (online, offline):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        reset()
        infer, train = start_together(
            [*SATURATE, "--userd", "client", "--userd-offset", str(SLOT), "--seconds", "3"],
            [*SATURATE, "--seconds", "7"],
            cgroups=[str(online.path), str(offline.path)],
        )
        while not processes().get(infer.pid):
            time.sleep(0.01)
        time.sleep(0.2)
        during = gpu_rate(train.pid, 1.5)
        infer.result()
        time.sleep(0.5)
        after = gpu_rate(train.pid, 2.0)
        train.result()
        print(f"offline GPU rate: next to online work {during:.3f}, after it {after:.3f}")
        assert during < 0.15
        assert after > 0.5


def reads_over(seconds: float) -> tuple[int, int, float]:
    """The GPU's scheduler passes and USERD reads over ``seconds`` (as ratios: sched_counts()),
    and the seconds measured."""
    passes, reads = sched_counts()
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    passes_after, reads_after = sched_counts()
    return passes_after - passes, reads_after - reads, elapsed


def assert_read_every(reads: int, elapsed: float, every_s: float, edges: int = 2) -> None:
    """About one read each ``every_s``: never more than the cadence allows (``edges`` for the
    window's ends), and at least nine in ten of the looks due. A look is due an interval after
    the one before, unless its pass came an interval late, which starts the cadence again
    (userd.c, look_now()), so passes that run late lose looks. In the VM of two vCPUs, with
    nvmock's engine in SCHED_FIFO and free to run on either CPU, qgpu made 2 460-3 300 passes
    in 2 s where it made 3 740-4 400 with the engine an ordinary thread, and a channel due every
    20 ms was read 92, 94 and 96 times where 100 were due (100 with the engine ordinary): the
    engine bounced qgpu's thread between the CPUs, which engine_pin now prevents
    (test_the_mock_gpu_does_not_move_qgpus_scheduler_between_cpus)."""
    due = elapsed / every_s
    assert 0.9 * due - edges <= reads <= due + edges, (
        f"{reads} reads in {elapsed:.2f} s, one due every {every_s * 1000:g} ms"
    )


def _migrations(pid: int) -> int:
    """How many times the scheduler has moved task ``pid`` between CPUs (/proc/PID/sched)."""
    for line in Path(f"/proc/{pid}/sched").read_text().splitlines():
        if line.startswith("se.nr_migrations"):
            return int(line.split(":")[1])
    raise AssertionError(f"/proc/{pid}/sched has no se.nr_migrations")


def _moves_and_passes(qgpu: int, seconds: float) -> tuple[int, int]:
    moved, (passes, _) = _migrations(qgpu), sched_counts()
    time.sleep(seconds)
    return _migrations(qgpu) - moved, sched_counts()[0] - passes


@HOST_TIMED
def test_the_mock_gpu_does_not_move_qgpus_scheduler_between_cpus() -> None:
    """A GPU takes no host CPU. nvmock's engine thread does, in SCHED_FIFO above qgpu's
    scheduler: free to run on either vCPU, it woke where qgpu's thread ran and the real-time
    balancer pushed that thread to the other vCPU, 1 300-1 400 times a second, and qgpu made
    a sixth fewer passes (BENCHMARKS.md 2026-12-05, forty-second session). engine_pin keeps
    the engine on the last CPU, and qgpu's thread stays put; unpinned, it is moved again, which
    shows the test sees it."""
    if (os.cpu_count() or 1) < 2:
        pytest.fail("needs two vCPUs: with one, nothing can be moved")
    (engine,) = threads_named("nvmock-gpu0")
    assert os.sched_getaffinity(engine) == {max(os.sched_getaffinity(0))}
    with qgpu_loaded() as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online):
            (qgpu,) = threads_named("qgpu/gpu0")
            time.sleep(0.5)
            pinned = _moves_and_passes(qgpu, 2.0)
            with nvmock_param("engine_pin", 0):
                time.sleep(0.2)
                free = _moves_and_passes(qgpu, 2.0)
            time.sleep(0.2)
            again = _moves_and_passes(qgpu, 2.0)
    print(f"qgpu's thread moved / passes in 2 s: pinned {pinned}, free {free}, again {again}")
    assert pinned[0] < 100 and again[0] < 100
    assert free[0] > 500
    assert min(pinned[1], again[1]) > free[1]


@HOST_TIMED
def test_a_channel_idle_for_a_second_is_read_every_cold_look_us_and_its_work_still_seen() -> None:
    """Each read of USERD in BAR1 is a PCIe round trip (about 1.1 us on an H100 and an H200): a
    channel that showed no work for a second is read once every cold_look_us, not at every
    250 us pass; work put on it is seen at its next look, and it is read at every pass again."""
    with qgpu_loaded(cold_look_us=100_000) as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online) as tenant:
            time.sleep(COLD_AFTER_S + 0.5)
            passes, reads, elapsed = reads_over(1.0)
            print(f"cold, 100 ms: {reads} reads in {passes} passes, {elapsed:.2f} s")
            assert passes > 100  # the scheduler ran
            assert_read_every(reads, elapsed, 0.1)

            tenant.ask("put 1")
            busy = online_busy_samples(0.5)
            # Seen at its next look, at most 100 ms on (the samples are 20 ms apart).
            assert all(busy[8:]), busy
            passes, reads, _ = reads_over(0.5)
            print(f"warm, work pending: {reads} reads in {passes} passes")
            assert reads >= 0.95 * passes

            tenant.ask("get 1")
            time.sleep(COLD_AFTER_S + 0.5)
            COLD_LOOK.write_text("0")  # every channel at every pass, as before cold looks
            passes, reads, _ = reads_over(0.5)
            print(f"cold_look_us=0: {reads} reads in {passes} passes")
            assert passes > 50
            assert reads >= 0.95 * passes


@pytest.mark.parametrize(
    ("cold_ms", "dormant_ms", "every_ms"),
    [(20, 200, 200), (20, 0, 20), (100, 5, 100)],
    ids=["dormant", "dormant_look_us=0", "never-more-often-than-cold"],
)
@HOST_TIMED
def test_a_channel_fed_only_in_its_first_second_is_read_every_dormant_look_us(
    cold_ms: int, dormant_ms: int, every_ms: int
) -> None:
    """CUDA sets a context's 20 channels up and then feeds one or two (in ten PyTorch processes
    on H100s and H200s, 19 showed work only in the context's first 130 ms,
    tools/gpu/channel_use.py): a cold channel whose only work came in its first second is read
    every dormant_look_us, never more often than a cold one, and as a cold one with 0."""
    params = {"cold_look_us": cold_ms * 1000, "dormant_look_us": dormant_ms * 1000}
    with qgpu_loaded(**params) as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online) as tenant:
            tenant.ask("put 1")  # set-up work, fetched at once
            tenant.ask("get 1")
            time.sleep(COLD_AFTER_S + 0.5)
            passes, reads, elapsed = reads_over(2.0)
            print(f"fed at start, {params}: {reads} reads in {passes} passes, {elapsed:.2f} s")
            assert passes > 200  # the scheduler ran
            assert_read_every(reads, elapsed, every_ms / 1000)


@HOST_TIMED
def test_work_on_a_dormant_channel_is_seen_and_it_is_never_dormant_again() -> None:
    with (
        qgpu_loaded(cold_look_us=20_000, dormant_look_us=200_000) as client,
        cgroups(1) as (online,),
    ):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        with userd_tenant(online) as tenant:
            time.sleep(COLD_AFTER_S + 0.5)
            _, reads, elapsed = reads_over(1.0)
            assert reads <= elapsed / 0.2 + 2  # dormant: never fed

            tenant.ask("put 1")
            busy = online_busy_samples(0.6)
            # Seen at its next look, at most 200 ms on (the samples are 20 ms apart).
            assert all(busy[13:]), busy
            tenant.ask("get 1")
            time.sleep(COLD_AFTER_S + 0.5)
            passes, reads, elapsed = reads_over(2.0)
            print(f"cold after work: {reads} reads in {passes} passes, {elapsed:.2f} s")
            # Fed after its first second: read every cold_look_us (20 ms) from now on.
            assert_read_every(reads, elapsed, 0.02, edges=3)


@pytest.mark.parametrize("param", [COLD_LOOK, DORMANT_LOOK], ids=lambda p: p.name)
@pytest.mark.parametrize("value", ["1000001", "-1", "x", "1e3"])
def test_look_intervals_refuse_a_bad_value_and_keep_their_own(param: Path, value: str) -> None:
    with qgpu_loaded(cold_look_us=3000, dormant_look_us=3000):
        with pytest.raises(OSError) as refused:
            param.write_text(value)
        assert refused.value.errno == errno.EINVAL
        assert param.read_text().strip() == "3000"


def test_an_idle_cuda_process_costs_a_pass_few_reads() -> None:
    """CUDA's tree makes 20 channels a process (tools/gpuload/CUDA_SEQUENCE.md) and an idle
    process's channels were all read at every pass: 20 PCIe reads each 250 us. Idle for a
    second, they are read once every cold_look_us each."""
    with qgpu_loaded(cold_look_us=20_000) as client, cgroups(1) as (online,):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        # A request at the start and the next 5 s on: idle in between (a rate that puts the
        # second past --seconds ends the process after the first).
        idle = ["--tree", "cuda", "--shape", "requests", "--rate-hz", "0.2", "--seconds", "6"]
        served = in_cgroup(online, idle).ready()
        time.sleep(COLD_AFTER_S + 0.5)
        passes, reads, elapsed = reads_over(2.0)
        served.result()
        print(f"idle CUDA process: {reads} reads in {passes} passes, {elapsed:.2f} s")
        assert passes > 200
        assert reads > 0  # still looked at
        # 20 channels, one look each per 20 ms, spread over the passes.
        assert reads <= 20 * (elapsed / 0.02 + 1)
        assert reads < passes * 20 / 4
