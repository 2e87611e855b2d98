"""``qpolicy daemon``: the node agent."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from qpolicy.backends.base import BackendFactory
from qpolicy.backends.choice import (
    EnforcerKind,
    backend_factory,
    choose_enforcer,
    in_kubernetes,
)
from qpolicy.backends.rm import DEFAULT_MIN_TURN_MS
from qpolicy.cli.simulate import load_scenario_argument, sim_backend
from qpolicy.daemon import Daemon, DaemonConfig, ProbeMode, install_signal_handlers
from qpolicy.desired.source import PodSource
from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.kube.podresources import DEFAULT_SOCKET, PodResourcesClient
from qpolicy.kube.policy import parse_configmap_ref
from qpolicy.kube.source import KubernetesSource, api_client
from qpolicy.state import default_state_dir
from qpolicy.telemetry.cgroups import cgroup2_mount
from qpolicy.telemetry.exporter import DEFAULT_METRICS_ADDR, parse_metrics_addr

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def _parse_number(text: str, what: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid {what} {text!r}: expected a number") from None
    if not low <= value <= high:  # also refuses nan
        raise ValidationError(f"invalid {what} {text!r}: must be from {low:g} to {high:g}")
    return value


def _parse_positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid {what} {text!r}: expected a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValidationError(f"invalid {what} {text!r}: must be more than 0")
    return value


class _JsonLines(logging.Formatter):
    """One JSON object per log line, for log shippers (``--json``)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line)


def _mount(explicit: Path | None) -> Callable[[], Path | None]:
    """The cgroup v2 mount, looked up once it is first asked for."""
    found: list[Path] = []

    def root() -> Path | None:
        if explicit is not None:
            return explicit
        if not found:
            with contextlib.suppress(QPolicyError):
                found.append(cgroup2_mount())
        return found[0] if found else None

    return root


def _say(message: str, level: int = logging.WARNING) -> None:
    logging.getLogger("qpolicy.daemon").log(level, "%s", message)


def daemon(
    *,
    enforcer: Annotated[
        str,
        typer.Option(
            "--enforcer",
            metavar="KIND",
            help="**auto** (kmod where qgpu.ko is loaded, rm where NVIDIA devices exist, else "
            "the simulated node, which it says; refused inside Kubernetes), **rm** (RM controls "
            "from userspace; root), **kmod** (qgpu.ko runs the periods; needs the module and "
            "CAP_NET_ADMIN), **sim** (run --scenario on the simulated GPU), **none** (observe "
            "only).",
        ),
    ] = "auto",
    metrics_addr: Annotated[
        str,
        typer.Option(
            "--metrics-addr",
            metavar="HOST:PORT",
            help="Where to serve Prometheus metrics: an IP address, localhost, or nothing for "
            "every interface (:9402).",
            envvar="QPOLICY_METRICS_ADDR",
        ),
    ] = DEFAULT_METRICS_ADDR,
    no_metrics: Annotated[bool, typer.Option("--no-metrics", help="Do not serve metrics.")] = False,
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario",
            metavar="NAME|FILE",
            help="The scenario the sim enforcer runs (repeated when it ends; default: demo).",
        ),
    ] = None,
    speed: Annotated[
        str, typer.Option("--speed", metavar="X", help="Run the simulation X times real time.")
    ] = "1",
    tick_ms: Annotated[
        str, typer.Option("--tick-ms", metavar="MS", help="How often sources are read.")
    ] = "100",
    min_turn_ms: Annotated[
        str,
        typer.Option(
            "--min-turn-ms",
            metavar="MS",
            help="rm enforcer: the shortest turn an offline pod gets when pods take turns; the "
            "period is stretched to fit (each hand-over costs two RM controls, ~0.8 ms of CPU "
            "each). 0: turns as short as the period makes them.",
        ),
    ] = f"{DEFAULT_MIN_TURN_MS:g}",
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            help="**info** (what could not be done), **debug** (every period, turn and control), "
            "**warning**.",
        ),
    ] = "info",
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Log one JSON object per line instead of text (stderr)."),
    ] = False,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            help="Govern the pods of this node from the API server: their qpolicy.io/* "
            "annotations (and TKE, HAMi and Koordinator keys), cgroups found on disk, GPUs from "
            "the kubelet's pod-resources socket. `qpolicy kube explain` shows what a pod gets.",
        ),
    ] = False,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            metavar="FILE",
            help="With --kubernetes: reach the API server through this kubeconfig (development); "
            "default: the pod's service account.",
        ),
    ] = None,
    node_name: Annotated[
        str | None,
        typer.Option(
            "--node-name",
            metavar="NODE",
            envvar="NODE_NAME",
            help="With --kubernetes: this node's name (the DaemonSet sets NODE_NAME).",
        ),
    ] = None,
    policy_configmap: Annotated[
        str | None,
        typer.Option(
            "--policy-configmap",
            metavar="NAMESPACE/NAME",
            help="With --kubernetes: per-GPU policies from this ConfigMap, the key named by the "
            "node's label qpolicy.io/config, else `default` (watched: an edit applies at once).",
        ),
    ] = None,
    pod_resources: Annotated[
        Path,
        typer.Option(
            "--pod-resources",
            metavar="SOCKET",
            help="With --kubernetes: the kubelet's pod-resources socket.",
        ),
    ] = DEFAULT_SOCKET,
    cgroup_root: Annotated[
        Path | None,
        typer.Option(
            "--cgroup-root",
            metavar="DIR",
            help="Where the cgroup v2 hierarchy is (default: its mount in /proc/self/mounts).",
        ),
    ] = None,
    probe: Annotated[
        str | None,
        typer.Option(
            "--probe",
            metavar="MODE",
            help="Load the eBPF probe: **auto** (carry on without it if it cannot load; the "
            "default, except under the sim enforcer), **on**, **off**. Needs root and "
            "python3-bpfcc.",
        ),
    ] = None,
) -> None:
    """Run the node agent: read the desired state and telemetry, enforce, serve metrics.

    One daemon runs per node (a lock in the state directory). Stops cleanly on SIGTERM or SIGINT,
    re-opening every channel it closed and restoring every timeslice it changed.
    """
    kind = EnforcerKind.parse(enforcer)
    level = _LOG_LEVELS.get(log_level.lower())
    if level is None:
        raise ValidationError(
            f"invalid log level {log_level!r}: expected one of {', '.join(_LOG_LEVELS)}"
        )
    if not no_metrics:
        parse_metrics_addr(metrics_addr)
    tick_s = _parse_positive(tick_ms, "tick") / 1000
    speed_x = _parse_positive(speed, "speed")
    turn_ms = _parse_number(min_turn_ms, "minimum turn", 0, 10_000)
    probe_mode = None if probe is None else ProbeMode.parse(probe)
    if not kubernetes:
        for name, value in (
            ("--kubeconfig", kubeconfig),
            ("--policy-configmap", policy_configmap),
        ):
            if value is not None:
                raise ValidationError(f"{name} is for --kubernetes")
    configmap = None if policy_configmap is None else parse_configmap_ref(policy_configmap)
    if kubernetes and not (node_name or "").strip():
        raise ValidationError(
            "--kubernetes needs this node's name: --node-name NODE or the NODE_NAME environment "
            "variable (the DaemonSet sets it from spec.nodeName)"
        )
    if scenario is not None and kind not in (EnforcerKind.SIM, EnforcerKind.AUTO):
        raise ValidationError(f"--scenario is for --enforcer sim, not {kind.value}")
    chosen = choose_enforcer(kind, kubernetes=in_kubernetes())
    factory: BackendFactory
    if chosen.kind is EnforcerKind.SIM:
        factory = sim_backend(load_scenario_argument(scenario or "demo"), speed_x)
    else:
        if scenario is not None:
            raise ValidationError(
                f"--scenario is for the simulated node, and --enforcer auto chose "
                f"{chosen.kind.value} ({chosen.reason})"
            )
        factory = backend_factory(chosen.kind, min_turn_ms=turn_ms)
    if probe_mode is None:
        probe_mode = {EnforcerKind.SIM: ProbeMode.OFF, EnforcerKind.RM: ProbeMode.ON}.get(
            chosen.kind, ProbeMode.AUTO
        )
    elif chosen.kind is EnforcerKind.RM and probe_mode is not ProbeMode.ON:
        raise ValidationError(
            f"--probe {probe_mode.value}: the rm enforcer learns tenants' RM handles from the "
            "probe; it needs --probe on"
        )
    if cgroup_root is not None and not cgroup_root.is_dir():
        raise ValidationError(f"invalid --cgroup-root {str(cgroup_root)!r}: not a directory")
    config = DaemonConfig(
        state_dir=default_state_dir(),
        metrics_addr=None if no_metrics else metrics_addr,
        tick_s=tick_s,
        probe=probe_mode,
        cgroup_root=cgroup_root,
    )
    sources: tuple[PodSource, ...] = ()
    kube: KubernetesSource | None = None
    if kubernetes:
        kube = KubernetesSource(
            api_client(kubeconfig),
            (node_name or "").strip(),
            cgroup_root=_mount(cgroup_root),
            policy_configmap=configmap,
            pod_resources=PodResourcesClient(pod_resources),
        )
        sources = (kube,)
    # The enforcers report what they could not do (a process gone, a control refused) through
    # logging; a daemon's stderr is its journal.
    stamp = "%(relativeCreated)10.1f ms " if level == logging.DEBUG else ""
    logging.basicConfig(
        level=level, format=f"qpolicy daemon: {stamp}%(levelname)s %(name)s: %(message)s"
    )
    if as_json:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(_JsonLines())
    # A SIGTERM while the daemon starts (recovery, the probe) must stop it cleanly too, also one
    # sent as soon as the first line below is read (a supervisor, or a test, may do just that).
    early: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: early.append(number))
    if chosen.reason is not None:
        _say(f"--enforcer auto: {chosen.reason}")
    agent = Daemon(config, factory, sources=sources)
    install_signal_handlers(agent)
    if kube is not None:
        kube.start()
        _say(
            f"watching the pods of node {kube.node}"
            + (f", policy from ConfigMap {'/'.join(configmap)}" if configmap else ""),
            logging.INFO,
        )
    if early:
        agent.stop()
    if agent.probe_error is not None:
        _say(f"running without the eBPF probe: {agent.probe_error}")
    if config.metrics_addr is not None:
        _say(
            f"enforcer {agent.backend.kind}, metrics on http://{config.metrics_addr}/metrics",
            logging.INFO,
        )
    sys.stdout.flush()
    raise typer.Exit(agent.run())
