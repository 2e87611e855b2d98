"""qgpu.ko's user interface in Python: the mirror of kmod/uapi/qgpu.h.

The header is the spec. Every ``#define QGPU_X`` is the constant ``X`` here and every member
``QGPU_<PREFIX>_X`` of an enum is ``<Enum>.X`` (``QGPU_CMD_GPU_SET`` is ``Cmd.GPU_SET``,
``QGPU_A_CGROUP_ID`` is ``Attr.CGROUP_ID``); tests/unit/test_qgpu_uapi.py parses the header and
fails on any difference, either way. Nothing else belongs in this module: what qpolicy makes of
the interface lives in :mod:`qpolicy.enforcers.kmod`.
"""

from __future__ import annotations

from enum import IntEnum

from pyroute2.netlink import genlmsg

GENL_NAME = "qgpu"
GENL_VERSION = 1
MCGRP_EVENTS = "events"

MAX_GPUS = 8
MAX_CGROUPS = 256
PERIOD_MIN_US = 1000
PERIOD_MAX_US = 1000000
PERIOD_DEFAULT_US = 50000
SHARE_MAX = 100
TIMESLICE_MAX_US = 1000000
OFFLINE_TIMESLICE_DEFAULT_US = 1
OFFLINE_PREEMPTION_DEFAULT = 0  # Preemption.OWN
ONLINE_TIMESLICE_DEFAULT_US = 8192
EVENT_RATE_PER_SEC = 100


class Cmd(IntEnum):
    UNSPEC = 0
    GPU_SET = 1
    GPU_GET = 2
    CGROUP_SET = 3
    CGROUP_DEL = 4
    CGROUP_GET = 5
    EVENT = 6


CMD_MAX = 6


class Attr(IntEnum):
    UNSPEC = 0
    GPU = 1
    POLICY = 2
    PERIOD_US = 3
    CGROUP_ID = 4
    CLASS = 5
    SHARE = 6
    MEM_LIMIT = 7
    PAD = 8
    MEM_USED = 9
    NR_PERIODS = 10
    NR_THROTTLED = 11
    THROTTLED_NS = 12
    OPEN_NS = 13
    CLIENTS = 14
    TSGS = 15
    CHANNELS = 16
    OOM = 17  # refused by the memory gate, whatever the answer (see the header)
    DENIED = 18  # refused by the tenant guard or a handle rule
    BUSY = 19
    EVENT = 20
    ONLINE_BUSY = 21
    SWITCHES = 22
    OFFLINE_TIMESLICE_US = 23
    ONLINE_TIMESLICE_US = 24
    OWN_TIMESLICES = 25
    TIMESLICE_PREEMPTED = 26
    OFFLINE_PREEMPTION = 27


A_MAX = 27


class Policy(IntEnum):
    BEST_EFFORT = 0
    FIXED_SHARE = 1
    BURST_SHARE = 2


class CgroupClass(IntEnum):
    """``enum qgpu_class`` (``class`` is taken in Python)."""

    OFFLINE = 0
    ONLINE = 1


class Preemption(IntEnum):
    """``enum qgpu_preemption``: the compute preemption mode of offline contexts."""

    OWN = 0
    CTA = 1


class Event(IntEnum):
    OOM = 1  # a refusal counted in Attr.OOM
    DENIED = 2  # a refusal counted in Attr.DENIED
    CGROUP_GONE = 3


class QgpuMsg(genlmsg):  # type: ignore[misc]  # pyroute2 has no type information
    """A message of the ``qgpu`` family; attributes are named ``QGPU_A_*`` as in the header.

    Netlink attributes are in host byte order, which is what pyroute2's ``uint*`` types use.
    ``QGPU_A_PAD`` only aligns the u64 attributes that follow it (``nla_put_u64_64bit``) and
    carries nothing.
    """

    prefix = "QGPU_A_"
    nla_map = (
        (Attr.UNSPEC.value, "QGPU_A_UNSPEC", "none"),
        (Attr.GPU.value, "QGPU_A_GPU", "uint32"),
        (Attr.POLICY.value, "QGPU_A_POLICY", "uint8"),
        (Attr.PERIOD_US.value, "QGPU_A_PERIOD_US", "uint32"),
        (Attr.CGROUP_ID.value, "QGPU_A_CGROUP_ID", "uint64"),
        (Attr.CLASS.value, "QGPU_A_CLASS", "uint8"),
        (Attr.SHARE.value, "QGPU_A_SHARE", "uint32"),
        (Attr.MEM_LIMIT.value, "QGPU_A_MEM_LIMIT", "uint64"),
        (Attr.PAD.value, "QGPU_A_PAD", "none"),
        (Attr.MEM_USED.value, "QGPU_A_MEM_USED", "uint64"),
        (Attr.NR_PERIODS.value, "QGPU_A_NR_PERIODS", "uint64"),
        (Attr.NR_THROTTLED.value, "QGPU_A_NR_THROTTLED", "uint64"),
        (Attr.THROTTLED_NS.value, "QGPU_A_THROTTLED_NS", "uint64"),
        (Attr.OPEN_NS.value, "QGPU_A_OPEN_NS", "uint64"),
        (Attr.CLIENTS.value, "QGPU_A_CLIENTS", "uint32"),
        (Attr.TSGS.value, "QGPU_A_TSGS", "uint32"),
        (Attr.CHANNELS.value, "QGPU_A_CHANNELS", "uint32"),
        (Attr.OOM.value, "QGPU_A_OOM", "uint64"),
        (Attr.DENIED.value, "QGPU_A_DENIED", "uint64"),
        (Attr.BUSY.value, "QGPU_A_BUSY", "uint8"),
        (Attr.EVENT.value, "QGPU_A_EVENT", "uint8"),
        (Attr.ONLINE_BUSY.value, "QGPU_A_ONLINE_BUSY", "uint8"),
        (Attr.SWITCHES.value, "QGPU_A_SWITCHES", "uint64"),
        (Attr.OFFLINE_TIMESLICE_US.value, "QGPU_A_OFFLINE_TIMESLICE_US", "uint32"),
        (Attr.ONLINE_TIMESLICE_US.value, "QGPU_A_ONLINE_TIMESLICE_US", "uint32"),
        (Attr.OWN_TIMESLICES.value, "QGPU_A_OWN_TIMESLICES", "uint8"),
        (Attr.TIMESLICE_PREEMPTED.value, "QGPU_A_TIMESLICE_PREEMPTED", "uint8"),
        (Attr.OFFLINE_PREEMPTION.value, "QGPU_A_OFFLINE_PREEMPTION", "uint8"),
    )
