"""The Prometheus exporter: what a scrape of a known node view contains."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from qpolicy.errors import ValidationError
from qpolicy.telemetry import exporter
from qpolicy.telemetry.exporter import NodeCollector, parse_metrics_addr, serve
from qpolicy.telemetry.view import (
    WAIT_BUCKETS_S,
    DriverActivity,
    Enforcement,
    GpuView,
    Histogram,
    NodeView,
    PodView,
)


def pod(name: str, pod_class: str = "offline", *, limit: int | None = None) -> PodView:
    return PodView(
        gpu="0",
        pod=name,
        pod_class=pod_class,
        share_target=0.3,
        memory_limit=limit,
        activity=DriverActivity(
            ioctls={"RM_ALLOC": 7, "RM_CONTROL": 3},
            ioctl_latency=Histogram.from_log2_us([1, 2, 0, 4], 0.5),
            launches=11,
            waits=5,
            polls=13,
            tsgs=4,
            channels=20,
            device_memory=800 << 20,
            processes=1,
        ),
        enforcement=Enforcement(
            gpu_time_s=12.5,
            throttled_s=1.25,
            online_wait=Histogram.of(WAIT_BUCKETS_S, [0.00015, 0.003, 9.0]),
            planned_share=0.35,
        ),
    )


GPU_TIME_LINE = (
    'qpolicy_gpu_time_seconds_total{class="offline",container="",gpu="0",namespace="",'
    'pod="train"} 12.5'
)
VIEW = NodeView(
    pods=(pod("/kubepods/web", "online", limit=8 << 30), pod("train")),
    gpus=(GpuView("0", "burst-share", 0.05, 0.97),),
    sources={"state": True, "enforcer": False},
)


def scrape(view: NodeView) -> dict[str, object]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: view))
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(families: dict[str, object], name: str) -> list[tuple[str, dict[str, str], float]]:
    family = families[name]
    return [(s.name, s.labels, s.value) for s in family.samples]  # type: ignore[attr-defined]


def test_counters_gauges_and_their_labels() -> None:
    families = scrape(VIEW)
    kinds = {name: family.type for name, family in families.items()}  # type: ignore[attr-defined]
    assert kinds["qpolicy_ioctls"] == "counter"
    assert kinds["qpolicy_gpu_time_seconds"] == "counter"
    assert kinds["qpolicy_throttled_seconds"] == "counter"
    assert kinds["qpolicy_cuda_launches"] == "counter"
    assert kinds["qpolicy_cuda_waits"] == "counter"
    assert kinds["qpolicy_cuda_polls_not_ready"] == "counter"
    assert kinds["qpolicy_device_memory_bytes"] == "gauge"
    assert kinds["qpolicy_share_target_ratio"] == "gauge"
    assert kinds["qpolicy_ioctl_duration_seconds"] == "histogram"
    assert kinds["qpolicy_online_wait_seconds"] == "histogram"
    gpu_time = samples(families, "qpolicy_gpu_time_seconds")
    assert (
        "qpolicy_gpu_time_seconds_total",
        {"gpu": "0", "namespace": "", "pod": "train", "container": "", "class": "offline"},
        12.5,
    ) in gpu_time
    train = {"gpu": "0", "namespace": "", "pod": "train", "container": "", "class": "offline"}
    for name, value in (("launches", 11), ("waits", 5), ("polls_not_ready", 13)):
        assert (f"qpolicy_cuda_{name}_total", train, value) in samples(
            families, f"qpolicy_cuda_{name}"
        )
    ioctls = samples(families, "qpolicy_ioctls")
    assert (
        "qpolicy_ioctls_total",
        {
            "gpu": "0",
            "namespace": "",
            "pod": "train",
            "container": "",
            "class": "offline",
            "escape": "RM_ALLOC",
        },
        7.0,
    ) in ioctls


def test_limits_and_online_wait_only_where_they_exist() -> None:
    families = scrape(VIEW)
    limits = samples(families, "qpolicy_device_memory_limit_bytes")
    assert [(labels["pod"], value) for _, labels, value in limits] == [("/kubepods/web", 8 << 30)]
    waits = samples(families, "qpolicy_online_wait_seconds")
    assert {labels["pod"] for _, labels, _ in waits} == {"/kubepods/web"}
    buckets = {labels["le"]: value for name, labels, value in waits if name.endswith("_bucket")}
    assert buckets["0.0002"] == 1 and buckets["0.005"] == 2 and buckets["+Inf"] == 3
    count = [value for name, _, value in waits if name.endswith("_count")]
    assert count == [3]


def test_ioctl_histogram_is_cumulative_in_seconds() -> None:
    families = scrape(VIEW)
    rows = samples(families, "qpolicy_ioctl_duration_seconds")
    train = {
        labels["le"]: value
        for name, labels, value in rows
        if name.endswith("_bucket") and labels["pod"] == "train"
    }
    # log2 µs buckets [<1 µs]=1, [1,2)=2, [2,4)=0, [4,8)=4
    assert (
        train["1e-06"] == 1 and train["2e-06"] == 3 and train["4e-06"] == 3 and train["8e-06"] == 7
    )
    assert train["+Inf"] == 7


def test_source_up_gauges_and_gpu_series() -> None:
    families = scrape(VIEW)
    assert samples(families, "qpolicy_state_up") == [("qpolicy_state_up", {}, 1.0)]
    assert samples(families, "qpolicy_enforcer_up") == [("qpolicy_enforcer_up", {}, 0.0)]
    assert "qpolicy_probe_up" not in families
    assert samples(families, "qpolicy_gpu_info") == [
        ("qpolicy_gpu_info", {"gpu": "0", "policy": "burst-share"}, 1.0)
    ]


def test_a_pod_that_is_gone_leaves_no_series() -> None:
    smaller = NodeView(pods=(VIEW.pods[1],), gpus=VIEW.gpus, sources=VIEW.sources)
    families = scrape(smaller)
    for name in ("qpolicy_gpu_time_seconds", "qpolicy_device_memory_bytes", "qpolicy_ioctls"):
        assert all(labels["pod"] == "train" for _, labels, _ in samples(families, name))


@pytest.mark.parametrize(
    "text", ["9400", "example.org:9400", "127.0.0.1", "127.0.0.1:99999", "1.2.3.4:x", ":"]
)
def test_bad_metrics_addresses(text: str) -> None:
    with pytest.raises(ValidationError, match="invalid metrics address"):
        parse_metrics_addr(text)


def test_metrics_addresses() -> None:
    assert parse_metrics_addr("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_metrics_addr("[::1]:9400") == ("::1", 9400)
    assert parse_metrics_addr(":9402") == ("0.0.0.0", 9402)
    assert parse_metrics_addr("localhost:9402") == ("127.0.0.1", 9402)


def test_serving_over_http() -> None:
    current = {"view": VIEW}
    server = serve("127.0.0.1:0", lambda: current["view"])
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        assert GPU_TIME_LINE in body
        current["view"] = NodeView()
        with urllib.request.urlopen(url, timeout=5) as response:
            assert "qpolicy_gpu_time_seconds_total{" not in response.read().decode()
    finally:
        server.close()


def test_idle_connections_are_closed_and_bounded_and_scrapes_go_on(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A client that connects and sends nothing held a thread for as long as it stayed
    connected (300 idle connections, 300 threads); in a cluster the port is open to every pod."""
    monkeypatch.setattr(exporter, "MAX_CONNECTIONS", 20)
    monkeypatch.setattr(exporter._QuietHandler, "timeout", 0.5)
    before = threading.active_count()
    server = serve("127.0.0.1:0", lambda: VIEW)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        deadline = time.monotonic() + 5
        while server.server.turned_away < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.server.turned_away == 20
        assert threading.active_count() <= before + 1 + 20
        for connection in idle:
            connection.settimeout(5)
            assert connection.recv(1) == b""  # closed by the server: at once, or timed out
        # The slots came back: scrapes are served again.
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert GPU_TIME_LINE in response.read().decode()
    finally:
        for connection in idle:
            connection.close()
        server.close()
    assert "Traceback" not in capfd.readouterr().err  # a timed-out client is nobody's error


def test_histograms_merge_only_with_equal_buckets() -> None:
    a = Histogram.of((1.0, 2.0), [0.5, 1.5, 5])
    assert a.counts == (1, 1, 1) and a.total == 7.0
    assert a.merged(a).counts == (2, 2, 2)
    with pytest.raises(ValueError, match="different buckets"):
        a.merged(Histogram.of((1.0,), []))


def test_gzip_and_openmetrics_as_prometheus_asks() -> None:
    import gzip

    server = serve("127.0.0.1:0", lambda: VIEW)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics",
            headers={
                "Accept": "application/openmetrics-text;version=1.0.0",
                "Accept-Encoding": "gzip",
            },
        )
        for _ in range(2):  # the second answer comes from the rendered copy of the same view
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.headers["Content-Encoding"] == "gzip"
                assert response.headers["Content-Type"].startswith("application/openmetrics-text")
                text = gzip.decompress(response.read()).decode()
            assert text.rstrip().endswith("# EOF")
            assert GPU_TIME_LINE in text
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=5)
    finally:
        server.close()


def test_refused_pods_lost_events_and_ungoverned_processes_are_exported() -> None:
    from dataclasses import replace

    from qpolicy.telemetry.view import RefusedPod

    unseen = replace(pod("/kubepods/a"), enforcement=Enforcement(unseen_processes=2))
    view = NodeView(
        pods=(unseen,),
        refused=(
            RefusedPod(
                "0", "/kubepods/b", "online", "annotations", "oversubscribed", "pod /b refused..."
            ),
        ),
        probe_lost_events=17,
    )
    families = scrape(view)
    assert samples(families, "qpolicy_pod_refused") == [
        (
            "qpolicy_pod_refused",
            {
                "gpu": "0",
                "namespace": "",
                "pod": "/kubepods/b",
                "container": "",
                "class": "online",
                "source": "annotations",
                "reason": "oversubscribed",
            },
            1.0,
        )
    ]
    assert samples(families, "qpolicy_probe_lost_events")[0][2] == 17
    assert samples(families, "qpolicy_unenforced_processes")[0][2] == 2
    # No probe: no lost-events series at all (not a zero that reads as "nothing lost").
    assert "qpolicy_probe_lost_events" not in scrape(NodeView())


def test_kubernetes_pods_carry_their_namespace_and_name_to_join_the_clusters_series() -> None:
    from dataclasses import replace

    from qpolicy.telemetry.view import RefusedPod

    cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
    kube = replace(pod(cgroup, "online"), namespace="ml", name="infer-0")
    view = NodeView(
        pods=(kube, pod("/kubepods/other")),
        refused=(
            RefusedPod("0", "/kubepods/x", "offline", "kubernetes", "no-share", "...", "ml", "x"),
        ),
    )
    families = scrape(view)
    rows = {labels["pod"]: labels for _, labels, _ in samples(families, "qpolicy_gpu_time_seconds")}
    assert rows["infer-0"] == {
        "gpu": "0",
        "namespace": "ml",
        "pod": "infer-0",
        "container": "",
        "class": "online",
    }
    # Not from Kubernetes: empty namespace and container, the pod id as the pod.
    assert rows["/kubepods/other"]["namespace"] == "" and rows["/kubepods/other"]["container"] == ""
    ((_, refused, _),) = samples(families, "qpolicy_pod_refused")
    assert (refused["namespace"], refused["pod"], refused["source"]) == ("ml", "x", "kubernetes")
