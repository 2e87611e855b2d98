"""Which enforcer a daemon runs, and making its backend.

``auto`` picks the kernel module where it is loaded, the rm enforcer where NVIDIA devices exist,
and otherwise the simulated node, which it says out loud: a daemon that silently became a demo
would look like a working node agent. Inside Kubernetes (a DaemonSet's pod), a node with no GPU is
a misplaced pod, and ``auto`` refuses rather than simulate; ``--enforcer sim`` still asks for the
simulator explicitly. The simulated backend itself is made by the simulator's commands, never here:
production code does not import the simulator.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from qpolicy.backends.base import Backend, BackendContext
from qpolicy.backends.kmod import KmodBackend
from qpolicy.backends.observe import ObserveBackend
from qpolicy.backends.rm import DEFAULT_MIN_TURN_MS, RmBackendFactory
from qpolicy.enforcers.kmod.client import QgpuClient, connect
from qpolicy.enforcers.kmod.sysfs import SYSFS_ROOT
from qpolicy.errors import QPolicyError, ValidationError

NVIDIA_CTL = Path("/dev/nvidiactl")


class EnforcerKind(StrEnum):
    AUTO = "auto"
    KMOD = "kmod"
    RM = "rm"
    SIM = "sim"
    NONE = "none"

    @classmethod
    def parse(cls, text: str) -> EnforcerKind:
        try:
            return cls(text.strip().lower())
        except ValueError:
            choices = ", ".join(kind.value for kind in cls)
            raise ValidationError(f"invalid enforcer {text!r}: expected one of {choices}") from None


@dataclass(frozen=True, slots=True)
class Choice:
    kind: EnforcerKind
    #: What ``auto`` decided and why, for the log (None when the enforcer was named).
    reason: str | None = None


def in_kubernetes(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets this in every one)."""
    return "KUBERNETES_SERVICE_HOST" in environ


def choose_enforcer(
    kind: EnforcerKind,
    *,
    kubernetes: bool = False,
    qgpu: Path = SYSFS_ROOT,
    nvidia: Path = NVIDIA_CTL,
) -> Choice:
    if kind is not EnforcerKind.AUTO:
        return Choice(kind)
    if qgpu.exists():
        return Choice(EnforcerKind.KMOD, f"qgpu.ko is loaded ({qgpu})")
    if nvidia.exists():
        return Choice(EnforcerKind.RM, f"qgpu.ko is not loaded and {nvidia} exists")
    missing = f"qgpu.ko is not loaded ({qgpu} is missing) and there is no NVIDIA GPU ({nvidia})"
    if kubernetes:
        raise QPolicyError(
            f"--enforcer auto: {missing}; refusing to run a simulated node under Kubernetes "
            "(--enforcer sim asks for one)"
        )
    return Choice(EnforcerKind.SIM, f"{missing}: running the simulated demo node")


def backend_factory(
    kind: EnforcerKind,
    *,
    min_turn_ms: float = DEFAULT_MIN_TURN_MS,
    is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
    kmod_connect: Callable[[], QgpuClient] = connect,
) -> Callable[[BackendContext], Backend]:
    """How to make the backend of ``kind`` once the daemon has its loop and probe.

    Root is checked now, before the daemon takes the node's lock; whether the module is there and
    obeys is found when the backend is made.
    """
    if kind is EnforcerKind.RM:
        if not is_root():
            raise QPolicyError(
                "the rm enforcer needs root: it takes tenants' /dev/nvidiactl descriptors "
                "(pidfd_getfd) and loads the eBPF probe"
            )
        return RmBackendFactory(min_turn_ms)
    if kind is EnforcerKind.KMOD:
        return lambda context: KmodBackend(context, kmod_connect())
    if kind is EnforcerKind.NONE:
        return ObserveBackend
    raise ValueError(f"no backend here for --enforcer {kind.value}")
