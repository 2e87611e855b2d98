"""Pods declared on their cgroups: ``user.qpolicy.*`` extended attributes on cgroup v2 directories.

An orchestrator (or an admin) marks a pod where it lives::

    setfattr -n user.qpolicy.class -v online  /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.share -v 30      /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.gpu   -v 0       /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.memory -v 8GiB   /sys/fs/cgroup/kubepods.slice/pod-web

A directory with any ``user.qpolicy.*`` attribute is a pod named by its path; ``gpu`` defaults to
0 and ``class`` to offline. The daemon walks the hierarchy on each refresh (attribute changes do
not change a directory's times, so there is nothing cheaper to watch). Pods in the state file win
over annotations of the same path: the CLI is the administrator's explicit word.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from qpolicy.errors import ValidationError
from qpolicy.model import PodClass, PodSpec, parse_gpu_index, parse_memory, parse_share

PREFIX = "user.qpolicy."
KEYS = ("class", "share", "memory", "gpu")


@dataclass(frozen=True, slots=True)
class Annotations:
    pods: dict[str, PodSpec] = field(default_factory=dict)
    # Per cgroup path: why its annotations were not taken (one line each).
    errors: dict[str, str] = field(default_factory=dict)


def _attribute(directory: str, key: str) -> str | None:
    try:
        return os.getxattr(directory, PREFIX + key).decode().strip()
    except OSError:
        return None


def pod_of(path: str, values: dict[str, str]) -> PodSpec:
    """The pod a cgroup's annotations describe; ValidationError names the bad attribute."""
    try:
        return PodSpec(
            id=path,
            gpu=parse_gpu_index(values.get("gpu", "0")),
            pod_class=PodClass.parse(values.get("class", "offline")),
            share=parse_share(values["share"]) if "share" in values else None,
            memory_limit=parse_memory(values["memory"]) if "memory" in values else None,
        )
    except ValidationError as error:
        raise ValidationError(f"{path}: {error}") from None


def scan(root: Path) -> Annotations:
    """Every annotated cgroup under the cgroup v2 mount ``root``."""
    pods: dict[str, PodSpec] = {}
    errors: dict[str, str] = {}
    top = str(root)
    for directory, _subdirs, _files in os.walk(top):
        try:
            names = [name for name in os.listxattr(directory) if name.startswith(PREFIX)]
        except OSError:
            continue
        if not names:
            continue
        values = {}
        for key in KEYS:
            value = _attribute(directory, key)
            if value is not None:
                values[key] = value
        rel = os.path.relpath(directory, top)
        path = "/" if rel == "." else "/" + rel
        try:
            pods[path] = pod_of(path, values)
        except ValidationError as error:
            errors[path] = str(error)
    return Annotations(pods, errors)
