"""An in-process stand-in for qgpu.ko behind QgpuClient's Transport.

Every message goes through pyroute2's encoder and decoder both ways, as over a netlink socket,
and is checked against kmod/uapi/qgpu.h's rules (attributes present, values in range, all or
nothing), so the client is tested against what it really puts on the wire.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyroute2.netlink.exceptions import NetlinkError

from qpolicy.enforcers.kmod.uapi import (
    MAX_CGROUPS,
    MAX_GPUS,
    OFFLINE_PREEMPTION_DEFAULT,
    OFFLINE_TIMESLICE_DEFAULT_US,
    ONLINE_TIMESLICE_DEFAULT_US,
    PERIOD_DEFAULT_US,
    PERIOD_MAX_US,
    PERIOD_MIN_US,
    SHARE_MAX,
    TIMESLICE_MAX_US,
    Attr,
    CgroupClass,
    Cmd,
    Policy,
    Preemption,
    QgpuMsg,
)

CONFIG = (Attr.GPU, Attr.CLASS, Attr.SHARE, Attr.MEM_LIMIT)
GPU_SETTINGS = (
    Attr.POLICY,
    Attr.PERIOD_US,
    Attr.OFFLINE_TIMESLICE_US,
    Attr.ONLINE_TIMESLICE_US,
    Attr.OFFLINE_PREEMPTION,
)
TIMESLICES = (Attr.OFFLINE_TIMESLICE_US, Attr.ONLINE_TIMESLICE_US)
COUNTERS = (
    Attr.MEM_USED,
    Attr.NR_PERIODS,
    Attr.NR_THROTTLED,
    Attr.THROTTLED_NS,
    Attr.OPEN_NS,
    Attr.CLIENTS,
    Attr.TSGS,
    Attr.CHANNELS,
    Attr.OOM,
    Attr.DENIED,
    Attr.BUSY,
)


def wire(message: QgpuMsg) -> QgpuMsg:
    """``message`` as the other end of a socket reads it."""
    message.encode()
    decoded = QgpuMsg(message.data)
    decoded.decode()
    return decoded


def raw_attributes(data: bytes) -> list[tuple[int, int]]:
    """(type, length) of each attribute of an encoded generic netlink message, in order."""
    (end,) = struct.unpack_from("=I", data)
    found = []
    offset = 16 + 4  # nlmsghdr, genlmsghdr
    while offset < end:
        length, kind = struct.unpack_from("=HH", data, offset)
        assert length >= 4, f"attribute of length {length} at {offset}"
        found.append((kind, length))
        offset += (length + 3) & ~3
    return found


@dataclass
class Sent:
    cmd: Cmd
    version: int
    values: dict[Attr, int]
    raw: list[tuple[int, int]]
    dump: bool


@dataclass
class FakeQgpu:
    """The module's state, what was sent to it, and the refusals to come."""

    gpus: dict[int, dict[Attr, int]] = field(
        default_factory=lambda: {
            g: {
                Attr.POLICY: Policy.BEST_EFFORT,
                Attr.PERIOD_US: PERIOD_DEFAULT_US,
                Attr.OFFLINE_TIMESLICE_US: OFFLINE_TIMESLICE_DEFAULT_US,
                Attr.ONLINE_TIMESLICE_US: ONLINE_TIMESLICE_DEFAULT_US,
                Attr.OFFLINE_PREEMPTION: OFFLINE_PREEMPTION_DEFAULT,
            }
            for g in range(2)
        }
    )
    cgroups: dict[int, dict[Attr, int]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    #: The next command of that kind is refused with that errno.
    refuse: dict[Cmd, int] = field(default_factory=dict)
    #: Every command is refused with EPERM (no CAP_NET_ADMIN).
    unprivileged: bool = False
    #: Only cgroup ids in here can be configured; None: any.
    existing: set[int] | None = None
    events: list[QgpuMsg] = field(default_factory=list)
    subscribed: list[str] = field(default_factory=list)
    closed: bool = False

    def changes(self) -> list[Sent]:
        """What was sent that changes something, and forget it."""
        found = [s for s in self.sent if s.cmd in (Cmd.GPU_SET, Cmd.CGROUP_SET, Cmd.CGROUP_DEL)]
        self.sent.clear()
        return found

    def count(self, cgroup: int, **counters: int) -> None:
        """Let the cgroup's counters move, as the module's periods would."""
        for name, value in counters.items():
            self.cgroups[cgroup][Attr[name.upper()]] = value

    # -- Transport --------------------------------------------------------------------------

    def request(self, message: QgpuMsg, *, dump: bool) -> Sequence[QgpuMsg]:
        got = wire(message)
        cmd = Cmd(got["cmd"])
        values = {a: v for a in Attr if (v := got.get_attr(f"QGPU_A_{a.name}")) is not None}
        self.sent.append(Sent(cmd, got["version"], values, raw_attributes(message.data), dump))
        if self.unprivileged:
            raise NetlinkError(errno.EPERM)
        if cmd in self.refuse:
            raise NetlinkError(self.refuse.pop(cmd))
        if dump != (cmd in (Cmd.GPU_GET, Cmd.CGROUP_GET)):
            raise NetlinkError(errno.EOPNOTSUPP)
        if cmd is Cmd.GPU_SET:
            self._gpu_set(values)
        elif cmd is Cmd.CGROUP_SET:
            self._cgroup_set(values)
        elif cmd is Cmd.CGROUP_DEL:
            if self.cgroups.pop(self._need(values, Attr.CGROUP_ID), None) is None:
                raise NetlinkError(errno.ENOENT)
        elif cmd is Cmd.GPU_GET:
            return [self._answer(cmd, {Attr.GPU: g, **v}) for g, v in sorted(self.gpus.items())]
        elif cmd is Cmd.CGROUP_GET:
            return [
                self._answer(cmd, {Attr.CGROUP_ID: c, **v}) for c, v in sorted(self.cgroups.items())
            ]
        else:
            raise NetlinkError(errno.EOPNOTSUPP)
        return []

    def subscribe(self, group: str) -> None:
        self.subscribed.append(group)

    def receive(self) -> Sequence[QgpuMsg]:
        found = [wire(m) for m in self.events]
        self.events.clear()
        return found

    def close(self) -> None:
        self.closed = True

    # -- the module's rules -----------------------------------------------------------------

    @staticmethod
    def _need(values: dict[Attr, int], attr: Attr) -> int:
        if attr not in values:
            raise NetlinkError(errno.EINVAL)
        return values[attr]

    def _shares_fit(self, gpu: int, policy: int, cgroup: int = 0, share: int = 0) -> None:
        """Fixed-share caps must fit in the period, as the module checks them."""
        if policy != Policy.FIXED_SHARE:
            return
        others = sum(
            v[Attr.SHARE] for c, v in self.cgroups.items() if v[Attr.GPU] == gpu and c != cgroup
        )
        if others + share > SHARE_MAX:
            raise NetlinkError(
                errno.EINVAL, "qgpu: fixed-share shares on this GPU would sum to more than 100"
            )

    def _gpu_set(self, values: dict[Attr, int]) -> None:
        gpu = self._need(values, Attr.GPU)
        if gpu >= MAX_GPUS or not set(GPU_SETTINGS) & values.keys():
            raise NetlinkError(errno.EINVAL)
        if values.get(Attr.POLICY, 0) not in set(Policy):
            raise NetlinkError(errno.EINVAL)
        if values.get(Attr.OFFLINE_PREEMPTION, 0) not in set(Preemption):
            raise NetlinkError(errno.ERANGE)  # NLA_POLICY_MAX
        if not PERIOD_MIN_US <= values.get(Attr.PERIOD_US, PERIOD_MIN_US) <= PERIOD_MAX_US:
            raise NetlinkError(errno.ERANGE)
        if any(values.get(attr, 0) > TIMESLICE_MAX_US for attr in TIMESLICES):
            raise NetlinkError(errno.ERANGE)
        if gpu not in self.gpus:
            raise NetlinkError(errno.EINVAL)  # no such GPU behind the driver
        if Attr.POLICY in values:
            self._shares_fit(gpu, values[Attr.POLICY])
        state = self.gpus[gpu]
        for attr in GPU_SETTINGS:
            if attr in values:
                state[attr] = values[attr]

    def _cgroup_set(self, values: dict[Attr, int]) -> None:
        cgroup = self._need(values, Attr.CGROUP_ID)
        gpu = self._need(values, Attr.GPU)
        klass = self._need(values, Attr.CLASS)
        share = self._need(values, Attr.SHARE)
        if gpu >= MAX_GPUS or klass not in set(CgroupClass) or not 1 <= share <= SHARE_MAX:
            raise NetlinkError(errno.EINVAL)
        if self.existing is not None and cgroup not in self.existing:
            raise NetlinkError(errno.ENOENT)
        if cgroup not in self.cgroups and len(self.cgroups) >= MAX_CGROUPS:
            raise NetlinkError(errno.ENOSPC)
        policy = self.gpus.get(gpu, {}).get(Attr.POLICY, Policy.BEST_EFFORT)
        self._shares_fit(gpu, policy, cgroup, share)
        state = self.cgroups.setdefault(cgroup, dict.fromkeys(COUNTERS, 0))
        state.update({Attr.MEM_LIMIT: 0} | {a: values[a] for a in CONFIG if a in values})

    @staticmethod
    def _answer(cmd: Cmd, values: dict[Attr, int]) -> QgpuMsg:
        message = QgpuMsg()
        message["cmd"] = cmd
        message["version"] = 1
        message["attrs"] = [(f"QGPU_A_{a.name}", v) for a, v in sorted(values.items())]
        return wire(message)
