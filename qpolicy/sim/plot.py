"""A PNG chart of a simulation: each pod's share of the GPU over time, and request latency."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # Files only: no display on a GPU node or in CI.
import matplotlib.pyplot as plt

from qpolicy.errors import ValidationError
from qpolicy.sim.analysis import Phase
from qpolicy.sim.runner import SimResult


def plot(
    result: SimResult,
    phases: list[Phase],
    path: Path,
    *,
    native: SimResult | None = None,
) -> None:
    """Write the chart of ``result`` (and, faintly, the same scenario under ``native``)."""
    has_latency = any(pod.latency_trace for pod in result.pods.values())
    rows = 2 if has_latency else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 4.2 * rows), squeeze=False)
    shares = axes[0][0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    mids = [(start + end) / 2 for start, end in result.windows]
    gpu = result.scenario.gpu
    for index, (name, pod) in enumerate(result.pods.items()):
        color = colors[index % len(colors)]
        shares.plot(mids, [100 * v for v in pod.windows], color=color, label=f"{name} (qpolicy)")
        if native is not None:
            shares.plot(
                mids,
                [100 * v for v in native.pods[name].windows],
                color=color,
                alpha=0.35,
                linestyle=":",
                label=f"{name} (native)",
            )
        for phase in phases:
            if name in phase.expected and phase.expected[name] > 0:
                shares.hlines(
                    100 * phase.expected[name],
                    phase.start_s,
                    phase.end_s,
                    colors=color,
                    linestyles="--",
                    linewidth=0.8,
                )
    shares.set_title(
        f"share of GPU time per {result.window_s:g} s, {gpu.policy.value} "
        "(dashed: what the policy promises)"
    )
    shares.set_xlabel("time (s)")
    shares.set_ylabel("% of GPU time")
    shares.set_ylim(0, 105)
    shares.legend(loc="upper right", fontsize="small", ncol=2)
    shares.grid(alpha=0.3)

    if has_latency:
        latency = axes[1][0]
        for index, (name, pod) in enumerate(result.pods.items()):
            if not pod.latency_trace:
                continue
            color = colors[index % len(colors)]
            if native is not None and native.pods[name].latency_trace:
                t, ms = zip(*native.pods[name].latency_trace, strict=True)
                latency.scatter(t, ms, s=4, color="grey", alpha=0.4, label=f"{name} (native)")
            t, ms = zip(*pod.latency_trace, strict=True)
            latency.scatter(t, ms, s=4, color=color, label=f"{name} (qpolicy)")
            if pod.solo_latency is not None:
                latency.axhline(
                    pod.solo_latency.p99_ms,
                    color=color,
                    linestyle="--",
                    linewidth=0.8,
                    label=f"{name} alone, p99",
                )
        latency.set_title("request latency")
        latency.set_xlabel("time (s)")
        latency.set_ylabel("ms")
        latency.set_ylim(bottom=0)
        latency.legend(loc="upper right", fontsize="small")
        latency.grid(alpha=0.3)

    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ValidationError(f"cannot write plot {str(path)!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)
