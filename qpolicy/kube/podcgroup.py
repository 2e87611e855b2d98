"""A pod's cgroup, found on disk: the kubelet names it from the pod's UID and QoS class, in the
layout of its cgroup driver (systemd or cgroupfs; :func:`qpolicy.kube.pods.cgroup_paths`).

The path is looked up under the cgroup v2 mount rather than assumed: which driver a node runs is
the kubelet's setting, and a pod's cgroup appears only once the kubelet has started to create
its sandbox. Until then the pod has none, and the caller asks again later.
"""

from __future__ import annotations

import re
from pathlib import Path

from qpolicy.kube.pods import cgroup_paths

DRIVERS = ("systemd", "cgroupfs")
# The API server writes UIDs as UUIDs; anything else never becomes part of a path.
_UID = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,63}")


def find_cgroup(root: Path, uid: str, qos: str) -> str | None:
    """The pod's cgroup path (``/kubepods.slice/...``) under the cgroup2 mount ``root``, or None
    while there is none."""
    if not _UID.fullmatch(uid):
        return None
    paths = cgroup_paths(uid, qos)
    for driver in DRIVERS:
        path = paths[driver]
        if (root / path.lstrip("/")).is_dir():
            return path
    return None
