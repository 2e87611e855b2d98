"""``qpolicy status``'s section on qgpu.ko: the module's own view, when it is loaded.

sysfs is readable by anyone; the per-cgroup counters come from CGROUP_GET, which needs
CAP_NET_ADMIN like every command of the module, so without it the section says why they are
missing instead of failing the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from qpolicy.cli.output import console, print_own_timeslices
from qpolicy.enforcers.kmod.client import CgroupStats, QgpuClient
from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.sysfs import PARAMS_ROOT, SYSFS_ROOT, read_sysfs
from qpolicy.model import format_bytes
from qpolicy.telemetry.cgroups import CGROUP_ROOT, CgroupError, CgroupMap, cgroup2_mount

# Looked up when the command runs, so that tests can point them elsewhere. CGROUPS: None is the
# cgroup2 mount.
SYSFS = SYSFS_ROOT
PARAMS = PARAMS_ROOT
CGROUPS: Path | None = None
open_client: Callable[[], QgpuClient] = QgpuClient.open


def _cgroup_paths() -> Callable[[int], str | None]:
    root = CGROUPS
    if root is None:
        try:
            root = cgroup2_mount()
        except CgroupError:
            root = CGROUP_ROOT
    return CgroupMap(root).path_of


def _cgroup_report(stats: CgroupStats, path: str | None) -> dict[str, Any]:
    return {
        "cgroup_id": stats.cgroup_id,
        "path": path,
        "gpu": stats.gpu,
        "class": stats.klass.name.lower(),
        "share": stats.share,
        "memory_used_bytes": stats.mem_used,
        "memory_limit_bytes": stats.mem_limit or None,
        "gpu_time_s": stats.open_ns / 1e9,
        "throttled_s": stats.throttled_ns / 1e9,
        "periods": stats.nr_periods,
        "throttled_periods": stats.nr_throttled,
        "busy": stats.busy,
        "own_timeslices": stats.own_timeslices,
        # Offline and at the class's short timeslice: the GPU switches to online work by itself,
        # so qgpu does not close this cgroup for it (online_gate 1, the default).
        "timeslice_preempted": stats.timeslice_preempted,
        "clients": stats.clients,
        "tsgs": stats.tsgs,
        "channels": stats.channels,
        # The module's two refusal counters (CgroupStats.oom, .denied), under the names this
        # report has always had: the first counts the memory gate's refusals (past the limit, or
        # memory a limited cgroup may not take where qgpu cannot charge it), the second the
        # tenant guard's refused controls and the objects refused by the handle rules.
        "refused_allocations": stats.oom,
        "refused_controls": stats.denied,
    }


def report() -> dict[str, Any] | None:
    """The module's view as JSON, or None when it is not loaded."""
    if not SYSFS.is_dir():
        return None
    info = read_sysfs(SYSFS, PARAMS)
    doc: dict[str, Any] = {
        "sysfs": str(SYSFS),
        "version": info.version,
        "target": info.target,
        "hooked": info.hooked,
        "uvm_hooked": info.uvm_hooked,
        "online_gate": info.online_gate,
        "cgroups_configured": info.cgroups,
        "gpus": [
            {
                "index": gpu.index,
                "policy": gpu.policy,
                "period_us": gpu.period_us,
                "periods": gpu.nr_periods,
                "online_busy": gpu.online_busy,
                "offline_timeslice_us": gpu.offline_timeslice_us,
                "online_timeslice_us": gpu.online_timeslice_us,
                "offline_preemption": gpu.offline_preemption,
                "passes": gpu.passes,
                "userd_reads": gpu.userd_reads,
            }
            for gpu in info.gpus
        ],
        "cgroups": None,
        "error": None,
    }
    try:
        with open_client() as client:
            stats = client.cgroups()
    except KmodError as error:
        doc["error"] = str(error)
        return doc
    path_of = _cgroup_paths()
    doc["cgroups"] = [
        _cgroup_report(s, path_of(s.cgroup_id)) for s in sorted(stats, key=lambda s: s.cgroup_id)
    ]
    return doc


def _flag(value: bool | None, yes: str, no: str) -> str:
    return "?" if value is None else yes if value else no


def render(doc: dict[str, Any]) -> None:
    console.print(
        f"[b]qgpu.ko[/b] · interface {doc['version'] if doc['version'] is not None else '?'}"
        f" · driver {escape(doc['target'] or '?')}"
        f" · {_flag(doc['hooked'], 'hooked', 'not hooked')}"
        f" · {doc['cgroups_configured'] if doc['cgroups_configured'] is not None else '?'}"
        " cgroup(s) configured",
        soft_wrap=True,
    )
    if doc.get("uvm_hooked") is False:
        console.print(
            "[yellow]nvidia-uvm not hooked:[/yellow] managed memory (cudaMallocManaged) is not"
            " refused to memory-limited cgroups; load nvidia-uvm before qgpu.ko",
            soft_wrap=True,
        )
    if doc["error"] is not None:
        console.print(
            f"[yellow]per-cgroup counters unavailable:[/yellow] {escape(doc['error'])}",
            soft_wrap=True,
        )
    gpus = {gpu["index"]: gpu for gpu in doc["gpus"]}
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for cgroup in doc["cgroups"] or ():
        by_gpu.setdefault(cgroup["gpu"], []).append(cgroup)
    for index in sorted(gpus.keys() | by_gpu.keys()):
        known = None if doc["cgroups"] is None else by_gpu.get(index, [])
        _render_gpu(index, gpus.get(index), known, closes=doc.get("online_gate") in (1, 2))


def _render_gpu(
    index: int,
    gpu: dict[str, Any] | None,
    cgroups: list[dict[str, Any]] | None,
    closes: bool = False,
) -> None:
    """One GPU's line, and the table of its cgroups (None: they could not be read). ``closes``:
    the module closes an offline cgroup of several CUDA contexts for online work."""
    title = f"qgpu.ko GPU {index}"
    notes = None
    if gpu is not None:
        period = "?" if gpu["period_us"] is None else f"{gpu['period_us'] / 1000:g} ms"
        title += f" · {escape(gpu['policy'] or '?')} · period {period}"
        if gpu["periods"] is not None:
            title += f" · {gpu['periods']} periods"
        if gpu["online_busy"]:
            title += " · online work pending"
        offline, online = gpu.get("offline_timeslice_us"), gpu.get("online_timeslice_us")
        if offline is not None and online is not None:
            # Set on the TSGs while the GPU has an online cgroup; 0: the TSG keeps its own.
            notes = f"timeslices {offline or 'own'} / {online or 'own'} µs (offline / online)"
            if gpu.get("offline_preemption") == "cta":
                notes += ", CTA preemption offline"
        if gpu.get("passes") and gpu.get("userd_reads") is not None:
            # Each a PCIe read on a GPU, under the module's lock: what watching the GPU costs.
            reads = f"{gpu['userd_reads'] / gpu['passes']:.1f} USERD reads a pass"
            notes = reads if notes is None else f"{notes} · {reads}"
    if not cgroups:
        if notes is not None:
            title += f" · {notes}"
        console.print(title if cgroups is None else f"{title}: no cgroups", soft_wrap=True)
        return
    table = Table(title=title, caption=notes)
    table.add_column("cgroup", overflow="fold")
    # The numbers stay whole on a narrow terminal; long cgroup paths fold instead.
    for header in ("class", "share", "memory", "GPU time", "throttled"):
        table.add_column(header, no_wrap=True)
    for cgroup in cgroups:
        limit = cgroup["memory_limit_bytes"]
        table.add_row(
            escape(cgroup["path"] or f"#{cgroup['cgroup_id']}"),
            cgroup["class"],
            f"{cgroup['share']} %",
            f"{format_bytes(cgroup['memory_used_bytes'])} / "
            + ("-" if limit is None else format_bytes(limit)),
            f"{cgroup['gpu_time_s']:.1f} s",
            f"{cgroup['throttled_s']:.1f} s, {cgroup['throttled_periods']}/{cgroup['periods']}",
        )
    console.print(table)
    for cgroup in cgroups:
        if cgroup.get("own_timeslices"):
            path = cgroup["path"] or f"#{cgroup['cgroup_id']}"
            print_own_timeslices(
                f"{escape(path)}: several CUDA contexts on this GPU",
                closed_for_online=closes,
            )
