"""The daemon's threads carry kernel names, so a per-thread CPU reading can tell them apart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from qpolicy.runtime import threads
from qpolicy.runtime.threads import NamedThread, kernel_name, name_this_thread


def comm_of(native_id: int) -> str:
    try:
        return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()
    except OSError:
        return ""  # the thread ended since it was listed


def test_kernel_names_are_short_and_prefixed() -> None:
    assert kernel_name("qpolicy-controls") == b"qp-controls"
    assert kernel_name("qpolicy-kube-policy") == b"qp-kube-policy"
    # The kernel keeps 15 bytes; a longer name is cut, not refused.
    assert kernel_name("qpolicy-a-very-long-role") == b"qp-a-very-long-"
    assert kernel_name("qpolicy-rôle") == b"qp-r?le"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc")
def test_a_named_thread_carries_its_name_in_proc() -> None:
    seen: list[str] = []
    done = threading.Event()

    def body() -> None:
        seen.append(comm_of(threading.get_native_id()))
        done.set()

    thread = NamedThread(body, "qpolicy-controls")
    assert thread.daemon
    assert thread.name == "qpolicy-controls"  # Python's own name is unchanged
    thread.start()
    assert done.wait(5)
    thread.join(5)
    assert seen == ["qp-controls"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc")
def test_the_control_worker_and_metrics_threads_are_named() -> None:
    from qpolicy.runtime.realtime import RealtimeLoop
    from qpolicy.runtime.worker import ControlWorker
    from qpolicy.telemetry.exporter import serve
    from qpolicy.telemetry.view import NodeView

    worker = ControlWorker(RealtimeLoop())
    server = serve("127.0.0.1:0", NodeView)
    try:
        # Each names itself as it starts, which may be a moment after start() returns.
        deadline = time.monotonic() + 5
        while True:
            names = {comm_of(t.native_id) for t in threading.enumerate() if t.native_id}
            if {"qp-controls", "qp-metrics"} <= names or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert {"qp-controls", "qp-metrics"} <= names
    finally:
        worker.close()
        server.close()


def test_each_scrape_thread_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    from qpolicy.telemetry import exporter
    from qpolicy.telemetry.view import NodeView

    named: list[str] = []
    monkeypatch.setattr(
        exporter,
        "name_this_thread",
        lambda name: named.append(name) or True,
    )
    server = exporter.serve("127.0.0.1:0", NodeView)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        server.close()
    assert named == ["qpolicy-scrape"]


def test_without_prctl_a_thread_runs_unnamed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_prctl", lambda: None)
    assert name_this_thread("qpolicy-controls") is False
    ran = threading.Event()
    thread = NamedThread(ran.set, "qpolicy-controls")
    thread.start()
    thread.join(5)
    assert ran.is_set()
