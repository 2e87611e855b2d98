"""Human-readable tables of simulation results (rich)."""

from __future__ import annotations

from rich.table import Table

from qpolicy.sim.analysis import Phase
from qpolicy.sim.runner import Latency, SimResult


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _ms(latency: Latency | None, field: str) -> str:
    if latency is None:
        return "-"
    return f"{getattr(latency, field):.2f}"


def _ratio(latency: Latency | None, solo: Latency | None) -> str:
    if latency is None or solo is None or solo.p99_ms <= 0:
        return "-"
    return f"{latency.p99_ms / solo.p99_ms:.2f}x"


def pods_table(result: SimResult) -> Table:
    gpu = result.scenario.gpu
    mode = "qpolicy" if result.gated else "native time-slicing"
    table = Table(
        title=(
            f"{gpu.policy.value}, {gpu.period_ms} ms period, {result.scenario.duration_s:g} s, "
            f"{mode}: GPU busy {_pct(result.utilization)}; latency in ms"
        ),
        title_justify="left",
    )
    latency = any(pod.latency is not None for pod in result.pods.values())
    headers = ["pod", "class", "share", "GPU time", "kernels/s"]
    if latency:
        headers += ["p50", "p99", "solo p99", "x solo"]
    for header in headers:
        table.add_column(header, justify="left" if header in ("pod", "class") else "right")
    for pod in result.pods.values():
        row = [
            pod.name,
            pod.pod_class.value,
            "-" if pod.share_target is None else f"{pod.share_target} %",
            _pct(pod.gpu_time_fraction),
            f"{pod.throughput_per_s:.1f}",
        ]
        if latency:
            row += [
                _ms(pod.latency, "p50_ms"),
                _ms(pod.latency, "p99_ms"),
                _ms(pod.solo_latency, "p99_ms"),
                _ratio(pod.latency, pod.solo_latency),
            ]
        table.add_row(*row)
    return table


def phases_table(phases: list[tuple[str, list[Phase]]]) -> Table:
    """Expected vs achieved share per phase; one achieved column per labelled run."""
    table = Table(title="share of GPU time, by phase", title_justify="left")
    table.add_column("phase")
    table.add_column("pod")
    table.add_column("expected", justify="right")
    for label, _ in phases:
        table.add_column(label, justify="right")
    reference = phases[0][1]
    for index, phase in enumerate(reference):
        for row, pod in enumerate(phase.active):
            achieved = []
            for _, runs in phases:
                measured = runs[index].achieved
                achieved.append(_pct(None if measured is None else measured.get(pod)))
            table.add_row(
                f"{phase.start_s:g}-{phase.end_s:g} s" if row == 0 else "",
                pod,
                _pct(phase.expected.get(pod)),
                *achieved,
                end_section=row == len(phase.active) - 1,
            )
    return table


def latency_table(runs: list[tuple[str, SimResult]]) -> Table | None:
    """Request latency of each labelled run next to the same stream alone."""
    table = Table(title="request latency (arrival to completion)", title_justify="left")
    for header in ("pod", "run", "p50 ms", "p99 ms", "solo p50 ms", "solo p99 ms", "p99 / solo"):
        table.add_column(header, justify="left" if header in ("pod", "run") else "right")
    rows = 0
    for label, result in runs:
        for pod in result.pods.values():
            if pod.latency is None:
                continue
            rows += 1
            table.add_row(
                pod.name,
                label,
                _ms(pod.latency, "p50_ms"),
                _ms(pod.latency, "p99_ms"),
                _ms(pod.solo_latency, "p50_ms"),
                _ms(pod.solo_latency, "p99_ms"),
                _ratio(pod.latency, pod.solo_latency),
            )
    return table if rows else None
