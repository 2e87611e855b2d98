"""Pods told to the daemon by cgroup annotations on a GPU host: ``make bench-gpu``'s mode
``qpolicy-annotated``.

The annotation watch (qpolicy.desired.annotationwatch) rests on two things of the kernel it runs
on: cgroupfs keeping ``user.*`` extended attributes on its directories (kernfs, since Linux 5.7)
and ``setxattr`` raising ``IN_ATTRIB`` there (vfs_setxattr's fsnotify call). The VM tier checks
both on the VM's kernel; this checks them where the pods are, on the GPU host's kernel and its
cgroup mount, with the rm enforcer acting on what the annotations asked for. The daemon starts
knowing no pods (its state file holds the GPU's policy only); once its probe is up the bench
writes each pod's annotations on its cgroup, and times how long the daemon took to list them in
its status (written once a second) with the class they ask for; after the run it takes them off
and times how long the daemon took to drop the pods. Where the watch could not watch, the status
says it walks the hierarchy instead, and the bench records that too.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from qpolicy.model import PodClass, PodSpec

# README's first example: the namespace whoever owns the cgroup can write.
PREFIX = "user.qpolicy."
# Long enough for a daemon that fell back to walking (one walk a second) and a slow status write.
SEEN_TIMEOUT_S = 15.0
POLL_S = 0.05


def attributes(spec: PodSpec) -> dict[str, str]:
    """The annotations that declare ``spec`` on its cgroup (name -> value)."""
    values = {PREFIX + "class": str(spec.pod_class), PREFIX + "gpu": str(spec.gpu)}
    if spec.share is not None:
        values[PREFIX + "share"] = str(spec.share)
    if spec.memory_limit is not None:
        values[PREFIX + "memory"] = str(spec.memory_limit)
    return values


def annotate(directory: Path, spec: PodSpec) -> None:
    """Writes ``spec``'s annotations on the cgroup ``directory`` (OSError where the kernel
    refuses: the row cannot run as asked, and says so)."""
    for name, value in attributes(spec).items():
        os.setxattr(directory, name, value.encode())


def unannotate(directory: Path) -> None:
    """Takes every ``qpolicy`` annotation off ``directory`` (whatever is gone stays gone)."""
    with contextlib.suppress(OSError):
        for name in os.listxattr(directory):
            if name.startswith(PREFIX):
                with contextlib.suppress(OSError):
                    os.removexattr(directory, name)


def status_pods(status_path: Path) -> dict[str, str]:
    """The pods the daemon's status lists (id -> class); empty where it cannot be read."""
    try:
        pods = json.loads(status_path.read_text())["pods"]
        return {str(pod["id"]): str(pod["class"]) for pod in pods}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def watch_status(status_path: Path) -> dict[str, Any] | None:
    """How the daemon keeps the annotations (``watched_directories`` or ``walked``: why), from
    its status; None where it cannot be read."""
    try:
        found = json.loads(status_path.read_text())["annotations"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if isinstance(found, dict) else None


CLASSES = frozenset(str(c) for c in PodClass)


def wait_until(
    status_path: Path,
    specs: Iterable[PodSpec],
    *,
    listed: bool,
    timeout_s: float = SEEN_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Seconds until the daemon's status lists every pod of ``specs`` with its class
    (``listed``), or none of them as a pod of a class (not ``listed``: their annotations taken
    off, ``removexattr``'s ``IN_ATTRIB``; a cgroup whose processes still hold the GPU may stay
    listed as unmanaged); None where it had not within ``timeout_s``."""
    wanted = {spec.id: str(spec.pod_class) for spec in specs}

    def done(seen: dict[str, str]) -> bool:
        if listed:
            return all(seen.get(pod) == pod_class for pod, pod_class in wanted.items())
        return not any(seen.get(pod) in CLASSES for pod in wanted)

    start = clock()
    while True:
        if done(status_pods(status_path)):
            return clock() - start
        if clock() - start >= timeout_s:
            return None
        sleep(POLL_S)
