"""``qpolicy daemon``: the node agent. Read the desired state, let the backend enforce it, publish.

Everything that schedules runs on one real-time loop thread: the refresh of the desired state and
of the probe (every tick), the backend's own timers (an rm backend's period loops), the view
published for ``qpolicy status`` (every second) and, with the probe's ioctl counters, the view a
Prometheus scrape asks for (built on the loop thread when it comes). The daemon does not know which
enforcer it drives: it hands the admitted desired state to its backend
(:class:`~qpolicy.backends.base.Backend`) when it changes and asks it for counters when it
publishes.

One daemon runs per node (:class:`~qpolicy.instance.InstanceLock`, taken before anything else).
SIGTERM and SIGINT stop the loop; the backend then gives everything back (channels open,
timeslices restored, the module unconfigured) and the daemon exits 0. Whatever fails at start-up,
the metrics socket included, gives back what was taken before it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

from qpolicy.backends.base import Backend, BackendContext, BackendFactory
from qpolicy.desired.source import DesiredSource, PodSource
from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.instance import STATUS_NAME, InstanceLock
from qpolicy.node import node_view, refused_pods
from qpolicy.runtime.atomicfile import write_atomically
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.state import StateStore
from qpolicy.telemetry.cgroups import cgroup2_mount
from qpolicy.telemetry.exporter import MetricsServer, serve
from qpolicy.telemetry.probesource import ProbeSource
from qpolicy.telemetry.view import NodeView

log = logging.getLogger(__name__)

# How often cgroups that are gone are dropped from the probe's maps (which have a fixed size).
PRUNE_EVERY_S = 10.0
# How often the view is rebuilt (scrapes come far less often).
PUBLISH_EVERY_S = 1.0
# How long a scrape waits for the loop thread to read the probe's counters (Prometheus gives a
# scrape 10 s by default); after that it is served the last view.
SCRAPE_WAIT_S = 2.0


class ProbeMode(StrEnum):
    """Whether to load the eBPF probe: ``auto`` tries and carries on without it."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"

    @classmethod
    def parse(cls, text: str) -> ProbeMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValidationError(
                f"invalid probe mode {text!r}: expected auto, on or off"
            ) from None


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    state_dir: Path
    metrics_addr: str | None
    tick_s: float = 0.1
    probe: ProbeMode = ProbeMode.OFF
    cgroup_root: Path | None = None

    def __post_init__(self) -> None:
        if not 0.01 <= self.tick_s <= 10:
            raise ValidationError(f"invalid tick {self.tick_s!r} s: must be from 0.01 to 10")


def load_probe() -> ProbeSource:
    # bcc is imported only when a probe is wanted.
    from qpolicy.telemetry.probe import NvProbe, ProbeError

    probe = NvProbe().start()
    # What the daemon sends itself (its searches' checks, its controls) is no tenant's.
    try:
        probe.mute(os.getpid())
    except ProbeError as error:
        log.warning("%s: the daemon's own RM calls are read as any process's", error)
    return ProbeSource(probe)


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        backend: BackendFactory,
        *,
        sources: tuple[PodSource, ...] = (),
        clock: Callable[[], float] = time.monotonic,
        probe_loader: Callable[[], ProbeSource] = load_probe,
    ) -> None:
        self.config = config
        self.loop = RealtimeLoop(clock)
        self._clock = clock
        self.lock = InstanceLock(config.state_dir)
        self.lock.acquire()
        self.probe: ProbeSource | None = None
        self.probe_error: str | None = None
        self.server: MetricsServer | None = None
        try:
            # What must happen before the probe loads (its compile takes seconds): the rm
            # backend re-opens the pods a killed daemon left closed.
            prepare = getattr(backend, "prepare", None)
            if prepare is not None:
                prepare(config.state_dir)
            if config.probe is not ProbeMode.OFF:
                try:
                    self.probe = probe_loader()
                except QPolicyError as error:
                    if config.probe is ProbeMode.ON:
                        raise
                    self.probe_error = str(error)
            self._mount = config.cgroup_root
            context = BackendContext(
                self.loop, self.probe, config.state_dir, self._cgroup_root, clock
            )
            self.backend: Backend = backend(context)
        except BaseException:
            self._close_probe()
            self.lock.release()
            raise
        self.desired = DesiredSource(
            StateStore(config.state_dir),
            cgroup_root=self._cgroup_root,
            sources=sources,
            unenforceable=self.backend.unenforceable,
            clock=clock,
        )
        self._pruned_at = clock()
        self._view = NodeView()
        self._scraped: tuple[float, NodeView] | None = None  # (when, the view with counters)
        self._loop_thread: int | None = None  # while run() serves
        self._started = time.time()

    def _cgroup_root(self) -> Path | None:
        if self._mount is None:
            if self.probe is not None:
                self._mount = self.probe.view.cgroups.root
            else:
                with contextlib.suppress(QPolicyError):
                    self._mount = cgroup2_mount()
        return self._mount

    # -- the view ------------------------------------------------------------------------------

    def snapshot(self) -> NodeView:
        """The view the exporter serves: the published one, with the probe's ioctl counters read
        now (at most once per ``PUBLISH_EVERY_S``, however many scrape). Called from the
        exporter's threads: the view is built on the loop thread, which owns the probe and the
        backend; a loop that does not answer within ``SCRAPE_WAIT_S`` gets the last view."""
        if self.probe is None:
            return self._view  # the published view has everything
        if self._loop_thread is None or threading.get_ident() == self._loop_thread:
            return self._scraped_view()
        recent = self._recent_scrape()
        if recent is not None:
            return recent  # many scrapers: the loop is asked once a second, not per scrape
        built: list[NodeView] = []
        done = threading.Event()

        def build() -> None:
            try:
                built.append(self._scraped_view())
            finally:
                done.set()

        self.loop.call_soon(build)
        if done.wait(SCRAPE_WAIT_S) and built:
            return built[0]
        return self._scraped[1] if self._scraped is not None else self._view

    def _recent_scrape(self) -> NodeView | None:
        """The last view with the counters if it is under ``PUBLISH_EVERY_S`` old (one read of a
        tuple the loop thread replaces whole: safe from any thread)."""
        scraped = self._scraped
        if scraped is not None and self._clock() - scraped[0] < PUBLISH_EVERY_S:
            return scraped[1]
        return None

    def _scraped_view(self) -> NodeView:
        view = self._recent_scrape()
        if view is None:
            view = self._build_view(counters=True)
            self._scraped = (self._clock(), view)
        return view

    def tick(self) -> None:
        """Refresh the sources and publish a new view."""
        self.refresh()
        self.publish()

    def refresh(self) -> None:
        """Read the sources and follow changes of the desired state (every tick)."""
        if self.desired.refresh():
            self.backend.sync(self.desired.state)
        if self.probe is not None:
            self.probe.refresh()
            now = self._clock()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                self.probe.prune()
        self.backend.refresh()

    def publish(self) -> None:
        """Build the view and write what ``qpolicy status`` reads. The probe's ioctl counters
        are left out: only the exporter shows them, and they are read when it is scraped
        (:meth:`snapshot`), not every second."""
        self.backend.publish()
        self._view = self._build_view(counters=False)
        self._write_status()

    def _build_view(self, counters: bool) -> NodeView:
        sources = {"state": self.desired.file.up}
        for source in self.desired.sources:
            sources[source.name] = source.up
        if self.config.probe is not ProbeMode.OFF:
            sources["probe"] = self.probe is not None and self.probe.up
        up = self.backend.up
        if up is not None:
            sources["enforcer"] = up
        own = self.backend.view()
        if own is not None:
            # The backend makes the node up (the simulator); what the daemon refused is real.
            return NodeView(
                pods=own.pods,
                gpus=own.gpus,
                sources={**own.sources, **sources},
                refused=refused_pods(self.desired),
                probe_lost_events=self.probe.lost if self.probe is not None else None,
            )
        return node_view(self.desired, self.probe, self.backend, sources, counters)

    def _write_status(self) -> None:
        document: dict[str, Any] = {
            "pid": os.getpid(),
            "started": self._started,
            "written": time.time(),
            "enforcer": self.backend.kind,
            "sources": dict(self._view.sources),
            "probe_error": self.probe_error,
            "probe_lost_events": self._view.probe_lost_events,
            "annotations": self._annotations_status(),
            "cgroup_ids": self._cgroup_ids_status(),
            "pods": [
                {
                    "gpu": pod.gpu,
                    "id": pod.pod,
                    **({"namespace": pod.namespace, "name": pod.name} if pod.name else {}),
                    "class": pod.pod_class,
                    "share": pod.share_target,
                    "gpu_time_s": round(pod.enforcement.gpu_time_s, 3),
                    "throttled_s": round(pod.enforcement.throttled_s, 3),
                    "planned_share": pod.enforcement.planned_share,
                    "closed": pod.enforcement.closed,
                    "unseen_processes": pod.enforcement.unseen_processes,
                    "launches": pod.activity.launches,
                    "waits": pod.activity.waits,
                    "polls": pod.activity.polls,
                    "processes": pod.activity.processes,
                    "device_memory_bytes": pod.activity.device_memory,
                }
                for pod in self._view.pods
            ],
            "refused": [asdict(refused) for refused in self._view.refused],
            "backend": self.backend.status(),
        }
        path = self.config.state_dir / STATUS_NAME
        try:
            # dumps, not dump: dump streams through json's Python encoder, dumps runs the C one
            # (5x less CPU, and this runs every second). Not durable: rewritten every second.
            write_atomically(path, json.dumps(document).encode(), prefix=".status.")
        except OSError as error:
            log.debug("cannot write %s: %s", path, error)

    def _annotations_status(self) -> dict[str, Any]:
        """How cgroup annotations are kept: watched (inotify) or walked, and why; how often the
        whole hierarchy is walked, and what its last walk cost."""
        watch = self.desired.watch
        if watch is None:
            return {}
        spacing = {
            "directories": watch.directories,
            "walk_ms": round(watch.walk_cost_s * 1000, 1),
            "walk_every_s": round(watch.walk_every_s, 1),
            "queue_overflows": watch.overflows,
        }
        if watch.unwatched is not None:
            return {"walked": watch.unwatched, **spacing}
        return {"watched_directories": watch.watches, **spacing}

    def _cgroup_ids_status(self) -> dict[str, Any]:
        """How the paths of the cgroup ids the probe reports are found: opened by id, or by
        walking the hierarchy (spaced to a share of a core), and what a walk cost."""
        if self.probe is None:
            return {}
        cgroups = self.probe.view.cgroups
        return {
            "by_id": cgroups.by_id,
            "opened": cgroups.opened,
            "walks": cgroups.walks,
            "walk_ms": round(cgroups.walk_cost_s * 1000, 1),
            "walk_every_s": round(cgroups.walk_every_s, 1),
        }

    # -- running -------------------------------------------------------------------------------

    def stop(self) -> None:
        self.loop.stop()

    def run(self) -> int:
        """Serve until stopped; returns the exit status. Everything taken is given back, also
        when something fails on the way up (the metrics address in use, say)."""
        try:
            self.tick()
            if self.config.metrics_addr is not None:
                self.server = serve(self.config.metrics_addr, self.snapshot)
            # Neither needs its own wake-up: each runs with whatever wakes the loop in the last
            # half of its interval (a look of the rm enforcer's, a period step), on its grid.
            tick_us = self.config.tick_s * 1e6
            publish_us = max(PUBLISH_EVERY_S, self.config.tick_s) * 1e6
            self.loop.every(tick_us, self.refresh, slack_us=tick_us / 2)
            self.loop.every(publish_us, self.publish, slack_us=publish_us / 2)
            self._loop_thread = threading.get_ident()
            self.loop.run()
        finally:
            self._loop_thread = None
            self.close()
        return 0

    def close(self) -> None:
        """Give everything back: the backend first (channels, timeslices, the module)."""
        try:
            self.backend.close()
        finally:
            self.desired.close()
            for source in self.desired.sources:
                try:
                    source.close()
                except Exception as error:  # one source must not keep the rest from closing
                    log.warning("closing the %s source: %s", source.name, error)
            if self.server is not None:
                self.server.close()
                self.server = None
            self._close_probe()
            with contextlib.suppress(OSError):
                (self.config.state_dir / STATUS_NAME).unlink()
            self.lock.release()

    def _close_probe(self) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None


def install_signal_handlers(daemon: Daemon) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
