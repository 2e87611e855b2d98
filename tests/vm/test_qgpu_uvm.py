"""Managed memory (cudaMallocManaged) and the memory limit: nvidia-uvm makes it without RM, so
qgpu refuses it to a cgroup with a memory limit, and lets through the semaphore pool CUDA maps at
start-up. nvmock's /dev/nvidia-uvm follows kernel-open/nvidia-uvm/uvm.c (kmod/nvmock/uvm.c)."""

from __future__ import annotations

import errno
import json
import sys
from typing import Any

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.enforcers.kmod.uapi import Event
from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import ROOT
from tests.vm.qgpu_env import (
    SYSFS,
    Cgroup,
    cgroups,
    drain,
    qgpu_loaded,
    refusal_events,
    remove_tree,
    run_in_cgroup,
    stats_of,
)

MIB = 1 << 20


def uvm_tenant(cg: Cgroup, mib: int = 16) -> dict[str, Any]:
    result = run_in_cgroup(cg, [sys.executable, "-m", "tests.vm.uvmtenant", str(mib)], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def check_start_up(report: dict[str, Any]) -> None:
    """What CUDA's start-up needs of UVM went through, as on a GPU without qgpu."""
    assert report["before_init"] == errno.EBADFD
    assert report["init"] == NvStatus.NV_OK
    assert report["pool"] == NvStatus.NV_OK
    assert report["pool_map"] == 0 and report["pool_write"]
    assert report["bad_offset"] == errno.EINVAL
    assert report["free"] == NvStatus.NV_OK


def test_nvmock_uvm_makes_managed_memory_as_uvm_does() -> None:
    """Without qgpu: the pool maps, a managed range is made by its mmap alone and takes writes,
    and nothing of either is left once unmapped and freed (the conftest checks uvm_ranges)."""
    with cgroups(1) as (cg,):
        report = uvm_tenant(cg)
    check_start_up(report)
    assert report["managed"] == 0 and report["managed_write"]
    assert report["uvm_ranges"] == 2


def test_managed_memory_is_refused_to_a_memory_limited_cgroup_only() -> None:
    """A cgroup with a limit gets EPERM for its managed mmap, even well under the limit (qgpu
    cannot see what of it comes to live in device memory), and no range is left behind; its
    start-up's pool still maps. A configured cgroup without a limit gets its managed memory."""
    with qgpu_loaded() as client, cgroups(2) as (limited, free):
        assert (SYSFS / "uvm_hooked").read_text() == "1\n"
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=64 * MIB)
        client.set_cgroup(free.id, 0, "offline", 50)
        inside, outside = uvm_tenant(limited), uvm_tenant(free)
        assert stats_of(client, limited).oom == 1
        assert stats_of(client, free).oom == 0
    check_start_up(inside)
    assert inside["managed"] == errno.EPERM and not inside["managed_write"]
    assert inside["uvm_ranges"] == 1  # the pool alone: the refused range was destroyed
    check_start_up(outside)
    assert outside["managed"] == 0 and outside["managed_write"]
    assert outside["uvm_ranges"] == 2


def test_a_process_in_a_child_of_a_limited_pod_is_refused_too() -> None:
    """Containers live in scopes below the pod's slice: the nearest configured ancestor's limit
    governs them."""
    with qgpu_loaded() as client, cgroups(1) as (pod,), QgpuClient.open() as watcher:
        watcher.subscribe_events()
        client.set_cgroup(pod.id, 0, "offline", 50, mem_limit=64 * MIB)
        container = Cgroup(pod.path / "container")
        container.path.mkdir()
        try:
            report = uvm_tenant(container)
        finally:
            remove_tree(container.path)
        assert stats_of(client, pod).oom == 1
        # The event names the pod, whose counter moved, not the container.
        assert refusal_events(drain(watcher, quiet=0.5)) == [(Event.OOM, pod.id)]
    check_start_up(report)
    assert report["managed"] == errno.EPERM
    assert report["uvm_ranges"] == 1


def test_without_nvidia_uvm_qgpu_loads_and_says_managed_memory_is_not_refused() -> None:
    """Where nvidia-uvm was not found, qgpu still gates the rest and says so in uvm_hooked; a
    limited cgroup's managed mmap then reaches the driver (what the refusal above depends on)."""
    with qgpu_loaded(uvm_devnode="/dev/qgpu-test-no-uvm") as client, cgroups(1) as (cg,):
        assert (SYSFS / "hooked").read_text() == "1\n"
        assert (SYSFS / "uvm_hooked").read_text() == "0\n"
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        report = uvm_tenant(cg)
        assert stats_of(client, cg).oom == 0
    check_start_up(report)
    assert report["managed"] == 0 and report["managed_write"]
