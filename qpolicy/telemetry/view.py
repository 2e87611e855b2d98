"""What the node looks like right now: the snapshot the exporter and ``qpolicy status`` read.

Sources fill in the parts they know. The desired state says which pods exist, their class, share
and memory limit; the probe (or the simulator) says what each pod's processes do with the driver;
the enforcer says how much GPU time each pod got, how long it was held back, and how long online
work waited. A snapshot is immutable, so a scrape never sees half an update.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Online wait buckets (seconds): from well under one context switch to several periods.
WAIT_BUCKETS_S = (
    0.00005,
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
)
# The probe's ioctl latency histogram is log2 in microseconds: bucket i counts calls that took
# [2^(i-1), 2^i) µs, bucket 0 those under 1 µs; the last bucket is open.
IOCTL_LOG2_BUCKETS = 27


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts per bucket (the last bucket is +Inf) and the sum of observations."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> Histogram:
        return cls(tuple(bounds), (0,) * (len(bounds) + 1), 0.0)

    @classmethod
    def of(cls, bounds: Sequence[float], samples: Sequence[float]) -> Histogram:
        counts = [0] * (len(bounds) + 1)
        for value in samples:
            counts[next((i for i, b in enumerate(bounds) if value <= b), len(bounds))] += 1
        return cls(tuple(bounds), tuple(counts), float(sum(samples)))

    @classmethod
    def from_log2_us(cls, counts: Sequence[int], total_s: float) -> Histogram:
        """The probe's log2-µs buckets as a histogram with bounds in seconds."""
        padded = list(counts[:IOCTL_LOG2_BUCKETS]) + [0] * (IOCTL_LOG2_BUCKETS - len(counts))
        bounds = tuple((2**i) / 1e6 for i in range(IOCTL_LOG2_BUCKETS - 1))
        overflow = sum(counts[IOCTL_LOG2_BUCKETS:])
        padded[-1] += overflow
        return cls(bounds, tuple(padded), total_s)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs as the Prometheus exposition wants them."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out

    def merged(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("cannot merge histograms with different buckets")
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return Histogram(self.bounds, counts, self.total + other.total)


@dataclass(frozen=True, slots=True)
class DriverActivity:
    """What a pod's processes did with the NVIDIA driver (from the probe or the simulator)."""

    ioctls: Mapping[str, int] = field(default_factory=dict)
    ioctl_latency: Histogram = field(default_factory=lambda: Histogram.from_log2_us((), 0.0))
    launches: int = 0
    #: libcuda synchronize calls and synchronous copies entered, and query calls answered "not
    #: ready" (the rm enforcer's sensor counts both as work, with the launches).
    waits: int = 0
    polls: int = 0
    tsgs: int = 0
    channels: int = 0
    device_memory: int = 0
    processes: int = 0


@dataclass(frozen=True, slots=True)
class Enforcement:
    """What the enforcer measured for a pod."""

    gpu_time_s: float = 0.0
    throttled_s: float = 0.0
    online_wait: Histogram = field(default_factory=lambda: Histogram.empty(WAIT_BUCKETS_S))
    #: The share planned for the current period; None where no period is planned here (no
    #: enforcer, or one that plans in the kernel).
    planned_share: float | None = None
    #: Whether the pod's channels are closed by qpolicy right now.
    closed: bool = False
    #: Processes of the pod using the GPU that the enforcer cannot govern (started before the
    #: probe: their RM handles were never seen).
    unseen_processes: int = 0


@dataclass(frozen=True, slots=True)
class PodView:
    gpu: str
    pod: str
    pod_class: str
    share_target: float | None
    memory_limit: int | None
    activity: DriverActivity
    enforcement: Enforcement
    #: Where the pod is a Kubernetes pod: its namespace and name (empty otherwise).
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: str
    policy: str
    period_s: float
    utilization: float | None


@dataclass(frozen=True, slots=True)
class RefusedPod:
    """A pod a source asked for that the node did not take on (or whose change it refused)."""

    gpu: str
    pod: str
    pod_class: str  # online, offline, or unknown where the pod could not be read
    source: str  # state file, kubernetes, annotations
    reason: str  # a short code: oversubscribed, no-share, unenforceable, nested, unreadable
    message: str
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class NodeView:
    pods: tuple[PodView, ...] = ()
    gpus: tuple[GpuView, ...] = ()
    # Per data source (state, probe, enforcer, nvml): whether its last read worked. A source that
    # is not configured is absent.
    sources: Mapping[str, bool] = field(default_factory=dict)
    refused: tuple[RefusedPod, ...] = ()
    # Events the probe could not stream since it started (None: no probe).
    probe_lost_events: int | None = None
