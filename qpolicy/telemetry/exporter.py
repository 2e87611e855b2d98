"""The Prometheus exporter: metrics built fresh from a NodeView at every scrape.

A custom collector, as the Prometheus guidelines ask of exporters that mirror another system's
state: nothing is cached between scrapes, so a pod that is gone has no series left. Names follow
the conventions: ``qpolicy_`` prefix, base units (seconds, bytes, ratios), ``_total`` counters.
Labels: ``gpu``, ``namespace``, ``pod``, ``container`` and ``class`` (online, offline, or unmanaged
for cgroups no pod spec covers). Where a pod came from Kubernetes, ``namespace`` and ``pod`` are its
namespace and name, as kube-state-metrics and the kubelet's cAdvisor write them, so that qpolicy's
series join the cluster's; elsewhere ``namespace`` is empty and ``pod`` is qpolicy's pod id (a
cgroup path, or a simulated pod's name). ``container`` is empty: every series is per pod. The empty
labels are written on purpose: under ``honor_labels`` (the ServiceMonitor's), Prometheus then
leaves them off rather than filling in the scraped agent's own namespace, pod and container.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.runtime.threads import NamedThread, name_this_thread
from qpolicy.telemetry.view import Histogram, NodeView, PodView

POD_LABELS = ("gpu", "namespace", "pod", "container", "class")
SOURCES = ("state", "kubernetes", "probe", "enforcer", "nvml")
log = logging.getLogger(__name__)

# Not dcgm-exporter's 9400, which runs on most GPU nodes; nor node_exporter's 9100, HAMi's
# 31992/31993 or the kubelet's and kube-proxy's 10249-10256.
DEFAULT_METRICS_PORT = 9402
DEFAULT_METRICS_ADDR = f"127.0.0.1:{DEFAULT_METRICS_PORT}"


def _labels(pod: PodView) -> list[str]:
    return [pod.gpu, pod.namespace, pod.name or pod.pod, "", pod.pod_class]


def _histogram(name: str, doc: str, labels: tuple[str, ...]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labels))


def _add_histogram(family: HistogramMetricFamily, values: list[str], histogram: Histogram) -> None:
    family.add_metric(values, histogram.cumulative(), histogram.total)


class NodeCollector(Collector):
    """Reads ``snapshot()`` once per scrape and turns it into metric families."""

    def __init__(self, snapshot: Callable[[], NodeView]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        view = self._snapshot()
        yield from self._sources(view)
        yield from self._gpus(view)
        yield from self._pods(view)
        yield from self._refused(view)

    @staticmethod
    def _refused(view: NodeView) -> Iterator[Metric]:
        refused = GaugeMetricFamily(
            "qpolicy_pod_refused",
            "A pod the node did not take on, or whose change it refused (1); the reason says why "
            "(oversubscribed, no-share, unenforceable, nested, unreadable) and the daemon's log "
            "and `qpolicy status` give the whole message.",
            labels=[*POD_LABELS, "source", "reason"],
        )
        for pod in view.refused:
            labels = [pod.gpu, pod.namespace, pod.name or pod.pod, "", pod.pod_class]
            refused.add_metric([*labels, pod.source, pod.reason], 1.0)
        yield refused
        if view.probe_lost_events is not None:
            lost = CounterMetricFamily(
                "qpolicy_probe_lost_events",
                "Events the eBPF probe could not stream (each may be a missed process exit or "
                "RM allocation).",
            )
            lost.add_metric([], view.probe_lost_events)
            yield lost

    @staticmethod
    def _sources(view: NodeView) -> Iterator[Metric]:
        for source in SOURCES:
            if source in view.sources:
                gauge = GaugeMetricFamily(
                    f"qpolicy_{source}_up",
                    f"Whether the {source} data source answered its last read (1) or not (0).",
                )
                gauge.add_metric([], 1.0 if view.sources[source] else 0.0)
                yield gauge

    @staticmethod
    def _gpus(view: NodeView) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "qpolicy_gpu_info", "The policy of each GPU (always 1).", labels=["gpu", "policy"]
        )
        period = GaugeMetricFamily(
            "qpolicy_gpu_period_seconds",
            "Scheduling period of each GPU in force: the configured one, or longer where the "
            "enforcer stretched it so that each offline pod's turn is its minimum turn, or to a "
            "second where it has nothing to gate.",
            labels=["gpu"],
        )
        busy = GaugeMetricFamily(
            "qpolicy_gpu_busy_ratio",
            "Fraction of time the GPU ran work over the last period, where known.",
            labels=["gpu"],
        )
        for gpu in view.gpus:
            info.add_metric([gpu.gpu, gpu.policy], 1.0)
            period.add_metric([gpu.gpu], gpu.period_s)
            if gpu.utilization is not None:
                busy.add_metric([gpu.gpu], gpu.utilization)
        yield from (info, period, busy)

    @staticmethod
    def _pods(view: NodeView) -> Iterator[Metric]:
        labels = list(POD_LABELS)
        ioctls = CounterMetricFamily(
            "qpolicy_ioctls",
            "ioctls on NVIDIA device files, by escape (RM escape or nvidia-uvm command).",
            labels=[*labels, "escape"],
        )
        latency = _histogram(
            "qpolicy_ioctl_duration_seconds",
            "Time spent in ioctls on NVIDIA device files.",
            POD_LABELS,
        )
        launches = CounterMetricFamily(
            "qpolicy_cuda_launches",
            "CUDA kernel and graph launches seen in libcuda.",
            labels=labels,
        )
        waits = CounterMetricFamily(
            "qpolicy_cuda_waits",
            "Synchronize calls (cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize) and "
            "synchronous copies (cuMemcpy*, not *Async) entered in libcuda: waits for the pod's "
            "GPU work.",
            labels=labels,
        )
        polls = CounterMetricFamily(
            "qpolicy_cuda_polls_not_ready",
            'Query calls in libcuda (cuStreamQuery, cuEventQuery) answered "not ready": the '
            "pod's GPU work still running.",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "qpolicy_device_memory_bytes", "Device memory the pod's processes hold.", labels=labels
        )
        limit = GaugeMetricFamily(
            "qpolicy_device_memory_limit_bytes", "The pod's device memory limit.", labels=labels
        )
        tsgs = GaugeMetricFamily(
            "qpolicy_tsgs", "Channel groups (TSGs) the pod holds.", labels=labels
        )
        channels = GaugeMetricFamily(
            "qpolicy_channels", "GPU channels the pod holds.", labels=labels
        )
        processes = GaugeMetricFamily(
            "qpolicy_processes", "Processes of the pod using the GPU.", labels=labels
        )
        gpu_time = CounterMetricFamily(
            "qpolicy_gpu_time_seconds", "GPU time the pod's work ran.", labels=labels
        )
        target = GaugeMetricFamily(
            "qpolicy_share_target_ratio", "The pod's share of its GPU (0-1).", labels=labels
        )
        planned = GaugeMetricFamily(
            "qpolicy_share_planned_ratio",
            "The share the policy engine planned for the pod in the current period (0-1).",
            labels=labels,
        )
        unseen = GaugeMetricFamily(
            "qpolicy_unenforced_processes",
            "Processes of the pod using the GPU that the enforcer cannot govern (they started "
            "before the eBPF probe, so their RM handles are unknown).",
            labels=labels,
        )
        throttled = CounterMetricFamily(
            "qpolicy_throttled_seconds",
            "Time the pod had work but its channels were closed by qpolicy.",
            labels=labels,
        )
        wait = _histogram(
            "qpolicy_online_wait_seconds",
            "How long an online pod's work waited for the GPU after it was submitted.",
            POD_LABELS,
        )
        for pod in view.pods:
            values = _labels(pod)
            activity, enforcement = pod.activity, pod.enforcement
            for escape, count in sorted(activity.ioctls.items()):
                ioctls.add_metric([*values, escape], count)
            _add_histogram(latency, values, activity.ioctl_latency)
            launches.add_metric(values, activity.launches)
            waits.add_metric(values, activity.waits)
            polls.add_metric(values, activity.polls)
            memory.add_metric(values, activity.device_memory)
            tsgs.add_metric(values, activity.tsgs)
            channels.add_metric(values, activity.channels)
            processes.add_metric(values, activity.processes)
            if pod.memory_limit is not None:
                limit.add_metric(values, pod.memory_limit)
            gpu_time.add_metric(values, enforcement.gpu_time_s)
            throttled.add_metric(values, enforcement.throttled_s)
            if pod.share_target is not None:
                target.add_metric(values, pod.share_target)
            if enforcement.planned_share is not None:
                planned.add_metric(values, enforcement.planned_share)
            if pod.pod_class != "unmanaged":
                unseen.add_metric(values, enforcement.unseen_processes)
            if pod.pod_class == "online":
                _add_histogram(wait, values, enforcement.online_wait)
        yield from (
            ioctls,
            latency,
            launches,
            waits,
            polls,
            memory,
            limit,
            tsgs,
            channels,
            processes,
            gpu_time,
            target,
            planned,
            throttled,
            unseen,
            wait,
        )


def parse_metrics_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT``, where HOST is an IP address (``[::1]`` for IPv6), ``localhost`` or nothing
    (``:9402``: every IPv4 interface, as Go exporters read it)."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    elif host == "":
        host = "0.0.0.0"
    try:
        if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ValueError
        ipaddress.ip_address(host)
    except ValueError:
        raise ValidationError(
            f"invalid metrics address {text!r}: expected HOST:PORT with HOST an IP address, "
            f"localhost or nothing, e.g. {DEFAULT_METRICS_ADDR} or :{DEFAULT_METRICS_PORT}"
        ) from None
    return host, int(port_text)


# A connection's reads and writes each get this long: a client that connects and sends nothing
# (or stops reading) would otherwise hold its thread for as long as it stays connected.
REQUEST_TIMEOUT_S = 5.0
# Connections served at once; more are closed at once. In a cluster the port is open to every
# pod: 300 idle connections held 300 threads for ever (2026-12-07), one more each.
MAX_CONNECTIONS = 256


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # Python's default backlog of 5 drops connections when dozens of scrapers arrive at once,
    # and their clients retry seconds later (measured: p99 2.7 s with 40 scrapers).
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.turned_away = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread started to give it back
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # One thread per scrape: named, so that a per-thread CPU reading tells scrapes apart.
        name_this_thread("qpolicy-scrape")
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is not the daemon's error (socketserver prints
        a traceback to stderr for each); anything else is logged."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # TimeoutError, ConnectionResetError, BrokenPipeError
            return
        log.error("serving %s failed", client_address, exc_info=error)


class _MetricsApp:
    """Serves /metrics; each published view is rendered once per format and reused.

    The view is immutable, so every scraper of one snapshot gets the same bytes; the first scrape
    after the daemon publishes a new view renders it (~1 ms per pod).
    """

    def __init__(self, snapshot: Callable[[], NodeView]) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._view: NodeView | None = None
        self._rendered: dict[tuple[str, bool], bytes] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET")])
            return [b""]
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"qpolicy serves /metrics\n"]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        key = (content_type, gzipped)
        view = self._snapshot()
        with self._lock:
            if view is not self._view:
                self._view, self._rendered = view, {}
            body = self._rendered.get(key)
            if body is None:
                registry = CollectorRegistry(auto_describe=False)
                registry.register(NodeCollector(lambda: view))
                body = encoder(registry)
                if gzipped:
                    body = gzip.compress(body, compresslevel=1)
                self._rendered[key] = body
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(addr: str, snapshot: Callable[[], NodeView]) -> MetricsServer:
    """Serve ``/metrics`` for ``snapshot`` on ``addr`` from a thread per scrape."""
    host, port = parse_metrics_addr(addr)
    server_class = type(
        "_ServerFamily",
        (_Server,),
        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
    )
    try:
        server: WSGIServer = make_server(
            host,
            port,
            _MetricsApp(snapshot),
            server_class=server_class,
            handler_class=_QuietHandler,
        )
    except OSError as error:
        raise QPolicyError(f"cannot listen on {addr!r}: {error.strerror}") from None
    thread = NamedThread(server.serve_forever, "qpolicy-metrics")
    thread.start()
    return MetricsServer(server, thread)
