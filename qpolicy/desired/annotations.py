"""Pods declared on their cgroups: ``qpolicy.*`` extended attributes on cgroup v2 directories.

An orchestrator (or an admin) marks a pod where it lives::

    setfattr -n user.qpolicy.class -v online  /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.share -v 30      /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.gpu   -v 0       /sys/fs/cgroup/kubepods.slice/pod-web
    setfattr -n user.qpolicy.memory -v 8Gi    /sys/fs/cgroup/kubepods.slice/pod-web

A directory with any ``qpolicy.*`` attribute is a pod named by its path; ``gpu`` defaults to 0 and
``class`` to offline. ``user.*`` attributes can be written by whoever owns the directory, which on a
host that delegates cgroups to tenants is the tenant: there, use ``trusted.qpolicy.*`` (root only).
Where a directory carries any ``trusted.qpolicy.*`` attribute, its ``user.qpolicy.*`` ones are not
read at all.

The daemon reads them once by a walk of the hierarchy and then as inotify reports new directories
and attribute changes (:mod:`qpolicy.desired.annotationwatch`); where inotify cannot watch, it
walks the hierarchy every second. What it reads is untrusted input: a value that is not
UTF-8, not printable, or not valid is reported for that cgroup and the cgroup is skipped; nothing
here raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from qpolicy.errors import ValidationError
from qpolicy.model import PodClass, PodSpec, parse_gpu_index, parse_memory, parse_share
from qpolicy.runtime.dirtree import directories

NAMESPACES = ("trusted.qpolicy.", "user.qpolicy.")  # the first one present wins
KEYS = ("class", "share", "memory", "gpu")
# Longer values are not read: no valid value comes near this.
MAX_VALUE_BYTES = 256


@dataclass(frozen=True, slots=True)
class Annotations:
    pods: dict[str, PodSpec] = field(default_factory=dict)
    # Per cgroup path: why its annotations were not taken (one line each).
    errors: dict[str, str] = field(default_factory=dict)


class _Unreadable(Exception):
    """An attribute's bytes are not a value (not UTF-8, not printable, too long)."""


def _value(raw: bytes, name: str) -> str:
    if len(raw) > MAX_VALUE_BYTES:
        raise _Unreadable(f"{name} is {len(raw)} bytes long")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise _Unreadable(f"{name} is not UTF-8 text ({raw[:32]!r})") from None
    if not text.isprintable():
        raise _Unreadable(f"{name} holds unprintable characters ({text[:32]!r})")
    return text


def _read(directory: str, names: list[str], prefix: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for key in KEYS:
        name = prefix + key
        if name not in names:
            continue
        try:
            raw = os.getxattr(directory, name)
        except OSError:
            continue  # removed since it was listed
        values[key] = _value(raw, name)
    unknown = sorted(n for n in names if n.startswith(prefix) and n[len(prefix) :] not in KEYS)
    if unknown:
        raise _Unreadable(f"unknown attribute(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    return values


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


def annotation_of(directory: str, path: str) -> PodSpec | str | None:
    """The pod the cgroup ``directory`` (named ``path`` under the mount) declares, the one line
    saying why its annotations cannot be taken, or None: no ``qpolicy.*`` attribute, or the
    directory is gone."""
    try:
        names = os.listxattr(directory)
    except OSError:
        return None  # removed since it was seen
    prefix = next((p for p in NAMESPACES if any(n.startswith(p) for n in names)), None)
    if prefix is None:
        return None
    try:
        return pod_of(path, _read(directory, names, prefix))
    except _Unreadable as error:
        return f"{path}: {error}"
    except ValidationError as error:
        return str(error)


def path_under(directory: str, top: str) -> str:
    """``directory``'s cgroup path: relative to the mount ``top``, with a leading slash."""
    rel = os.path.relpath(directory, top)
    return "/" if rel == "." else "/" + rel


def scan(root: Path) -> Annotations:
    """Every annotated cgroup under the cgroup v2 mount ``root``."""
    pods: dict[str, PodSpec] = {}
    errors: dict[str, str] = {}
    top = str(root)
    for directory in directories(top):
        path = path_under(directory, top)
        found = annotation_of(directory, path)
        if isinstance(found, PodSpec):
            pods[path] = found
        elif found is not None:
            errors[path] = found
    return Annotations(pods, errors)
