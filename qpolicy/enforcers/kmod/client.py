"""The ``qgpu`` generic netlink family's commands and what the module answers them.

:class:`QgpuClient` speaks the family through a :class:`~.transport.Transport`: netlink on a real
host, an in-process stand-in in the unit tests. Every command is all or nothing as the module
carries it out; refusals come back as :class:`~.error.KmodError` naming the command, its values
and the kernel's reason.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.sysfs import SYSFS_ROOT, read_sysfs
from qpolicy.enforcers.kmod.transport import NetlinkTransport, Transport
from qpolicy.enforcers.kmod.uapi import (
    GENL_VERSION,
    MAX_CGROUPS,
    MCGRP_EVENTS,
    Attr,
    CgroupClass,
    Cmd,
    Event,
    Policy,
    Preemption,
    QgpuMsg,
)
from qpolicy.model import GpuPolicy, PodClass

_E = TypeVar("_E", Policy, CgroupClass, Event, Preemption)

POLICIES = {
    GpuPolicy.BEST_EFFORT: Policy.BEST_EFFORT,
    GpuPolicy.FIXED_SHARE: Policy.FIXED_SHARE,
    GpuPolicy.BURST_SHARE: Policy.BURST_SHARE,
}
CLASSES = {PodClass.ONLINE: CgroupClass.ONLINE, PodClass.OFFLINE: CgroupClass.OFFLINE}

# The width of each attribute a request may carry: a value that does not fit is refused with its
# name rather than left to fail inside pyroute2's struct.pack.
_BITS = {
    Attr.GPU: 32,
    Attr.POLICY: 8,
    Attr.PERIOD_US: 32,
    Attr.CGROUP_ID: 64,
    Attr.CLASS: 8,
    Attr.SHARE: 32,
    Attr.MEM_LIMIT: 64,
    Attr.OFFLINE_TIMESLICE_US: 32,
    Attr.ONLINE_TIMESLICE_US: 32,
    Attr.OFFLINE_PREEMPTION: 8,
}


def policy_name(policy: Policy) -> str:
    """The spelling of sysfs and of qpolicy's model: ``fixed-share``."""
    return policy.name.lower().replace("_", "-")


def to_policy(policy: Policy | GpuPolicy | str) -> Policy:
    if isinstance(policy, Policy):
        return policy
    return POLICIES[policy if isinstance(policy, GpuPolicy) else GpuPolicy.parse(policy)]


def to_class(klass: CgroupClass | PodClass | str) -> CgroupClass:
    if isinstance(klass, CgroupClass):
        return klass
    return CLASSES[klass if isinstance(klass, PodClass) else PodClass.parse(klass)]


def _values(message: QgpuMsg) -> dict[Attr, int]:
    values: dict[Attr, int] = {}
    for attr in Attr:
        value = message.get_attr(f"QGPU_A_{attr.name}")
        if isinstance(value, int):
            values[attr] = value
    return values


def _required(values: Mapping[Attr, int], attr: Attr, cmd: Cmd) -> int:
    try:
        return values[attr]
    except KeyError:
        raise KmodError(f"qgpu.ko answered {cmd.name} without {attr.name}") from None


def _enum(kind: type[_E], value: int, cmd: Cmd) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise KmodError(
            f"qgpu.ko answered {cmd.name} with {kind.__name__} {value}, which this qpolicy "
            f"(interface version {GENL_VERSION}) does not know"
        ) from None


@dataclass(frozen=True, slots=True)
class CgroupStats:
    """One configured cgroup as the module reports it (CGROUP_GET); counters are cumulative."""

    cgroup_id: int
    gpu: int
    klass: CgroupClass
    share: int
    mem_limit: int
    mem_used: int
    nr_periods: int
    nr_throttled: int
    throttled_ns: int
    open_ns: int
    clients: int
    tsgs: int
    channels: int
    # Refusals, each counted in one of the two (QGPU_A_OOM, QGPU_A_DENIED in kmod/uapi/qgpu.h).
    # oom: the memory gate's, because of the cgroup's memory limit: memory past it, and memory
    # qgpu cannot charge (fabric, exports and imports, dma-buf, managed memory, a duplicate
    # without the driver's RM entry), whether the tenant was answered NV_ERR_NO_MEMORY,
    # NV_ERR_INSUFFICIENT_PERMISSIONS or EPERM.
    oom: int
    # denied: the tenant guard's (a gated cgroup's own scheduling controls) and the handle
    # rules' (an object left for RM to name, another file's client).
    denied: int
    busy: bool
    # Its TSGs keep their own timeslices: several of its processes are on the GPU.
    own_timeslices: bool = False
    # Offline, its TSGs at the class's short timeslice: the GPU itself switches to online work,
    # and qgpu (online_gate 1) does not close it for that work.
    timeslice_preempted: bool = False

    @classmethod
    def from_message(cls, message: QgpuMsg) -> CgroupStats:
        v = _values(message)
        cmd = Cmd.CGROUP_GET
        return cls(
            cgroup_id=_required(v, Attr.CGROUP_ID, cmd),
            gpu=_required(v, Attr.GPU, cmd),
            klass=_enum(CgroupClass, v.get(Attr.CLASS, CgroupClass.OFFLINE), cmd),
            share=v.get(Attr.SHARE, 0),
            mem_limit=v.get(Attr.MEM_LIMIT, 0),
            mem_used=v.get(Attr.MEM_USED, 0),
            nr_periods=v.get(Attr.NR_PERIODS, 0),
            nr_throttled=v.get(Attr.NR_THROTTLED, 0),
            throttled_ns=v.get(Attr.THROTTLED_NS, 0),
            open_ns=v.get(Attr.OPEN_NS, 0),
            clients=v.get(Attr.CLIENTS, 0),
            tsgs=v.get(Attr.TSGS, 0),
            channels=v.get(Attr.CHANNELS, 0),
            oom=v.get(Attr.OOM, 0),
            denied=v.get(Attr.DENIED, 0),
            busy=bool(v.get(Attr.BUSY, 0)),
            own_timeslices=bool(v.get(Attr.OWN_TIMESLICES, 0)),
            timeslice_preempted=bool(v.get(Attr.TIMESLICE_PREEMPTED, 0)),
        )


@dataclass(frozen=True, slots=True)
class GpuStats:
    """One GPU as the module reports it (GPU_GET).

    The timeslices are what the module sets on each class's TSGs while the GPU has an online
    cgroup (0: the TSGs keep their own), and the offline preemption the mode it sets on offline
    contexts holding their class's timeslice; None from a module that does not report them.
    """

    gpu: int
    policy: Policy
    period_us: int
    nr_periods: int
    switches: int
    online_busy: bool
    offline_timeslice_us: int | None = None
    online_timeslice_us: int | None = None
    offline_preemption: Preemption | None = None

    @classmethod
    def from_message(cls, message: QgpuMsg) -> GpuStats:
        v = _values(message)
        cmd = Cmd.GPU_GET
        return cls(
            gpu=_required(v, Attr.GPU, cmd),
            policy=_enum(Policy, _required(v, Attr.POLICY, cmd), cmd),
            period_us=_required(v, Attr.PERIOD_US, cmd),
            nr_periods=v.get(Attr.NR_PERIODS, 0),
            switches=v.get(Attr.SWITCHES, 0),
            online_busy=bool(v.get(Attr.ONLINE_BUSY, 0)),
            offline_timeslice_us=v.get(Attr.OFFLINE_TIMESLICE_US),
            online_timeslice_us=v.get(Attr.ONLINE_TIMESLICE_US),
            offline_preemption=(
                None
                if Attr.OFFLINE_PREEMPTION not in v
                else _enum(Preemption, v[Attr.OFFLINE_PREEMPTION], cmd)
            ),
        )


@dataclass(frozen=True, slots=True)
class QgpuEvent:
    """A multicast on ``events``; ``values`` holds every attribute it carried."""

    event: Event
    cgroup_id: int | None
    gpu: int | None
    values: Mapping[Attr, int]

    @classmethod
    def from_message(cls, message: QgpuMsg) -> QgpuEvent:
        v = _values(message)
        return cls(
            event=_enum(Event, _required(v, Attr.EVENT, Cmd.EVENT), Cmd.EVENT),
            cgroup_id=v.get(Attr.CGROUP_ID),
            gpu=v.get(Attr.GPU),
            values=v,
        )


def _show(attr: Attr, value: int) -> str:
    try:
        if attr is Attr.POLICY:
            return policy_name(Policy(value))
        if attr is Attr.CLASS:
            return CgroupClass(value).name.lower()
    except ValueError:
        pass  # out of range: shown as the number that was sent
    return str(value)


_HINTS = {
    errno.EPERM: "qgpu.ko takes commands only with CAP_NET_ADMIN in the initial user namespace",
    errno.ENOSPC: f"qgpu.ko takes at most {MAX_CGROUPS} cgroups",
}


class QgpuClient:
    """The ``qgpu`` family's commands, each all or nothing as the module carries them out.

    ``placed`` is where this client last put each cgroup (cgroup id -> GPU), so that the
    enforcer of one GPU does not delete a pod that has just moved to another.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.placed: dict[int, int] = {}

    @classmethod
    def open(cls) -> QgpuClient:
        """A client on a netlink socket bound to qgpu.ko's family."""
        return cls(NetlinkTransport())

    def __enter__(self) -> QgpuClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def _request(
        self, cmd: Cmd, attrs: Iterable[tuple[Attr, int]] = (), *, dump: bool = False
    ) -> Sequence[QgpuMsg]:
        from pyroute2.netlink.exceptions import NetlinkError

        attrs = list(attrs)
        described = " ".join([cmd.name, *(f"{a.name.lower()}={_show(a, v)}" for a, v in attrs)])
        for attr, value in attrs:
            bits = _BITS[attr]
            if not 0 <= value < 1 << bits:
                raise KmodError(f"{described}: {attr.name.lower()} {value} is not a u{bits}")
        message = QgpuMsg()
        message["cmd"] = cmd
        message["version"] = GENL_VERSION
        message["attrs"] = [(f"QGPU_A_{attr.name}", value) for attr, value in attrs]
        try:
            return self.transport.request(message, dump=dump)
        except NetlinkError as error:
            code = abs(error.code)
            name = errno.errorcode.get(code, str(code))
            reasons = [r for r in error.args[1:2] if isinstance(r, str) and r != os.strerror(code)]
            hint = _HINTS.get(code)
            raise KmodError(
                f"qgpu.ko refused {described}: {os.strerror(code)} ({name})"
                + "".join(f": {r}" for r in reasons)
                + (f"; {hint}" if hint else ""),
                code,
            ) from None
        except OSError as error:
            raise KmodError(f"{described}: cannot talk to qgpu.ko: {error}", error.errno) from None

    def set_gpu(
        self,
        gpu: int,
        policy: Policy | GpuPolicy | str | None = None,
        period_us: int | None = None,
        *,
        offline_timeslice_us: int | None = None,
        online_timeslice_us: int | None = None,
        offline_preemption: Preemption | None = None,
    ) -> None:
        """Set any of a GPU's policy, period, class timeslices (µs, 0: the TSGs' own; the
        module sets them while the GPU has an online cgroup) and offline contexts' compute
        preemption (set with the offline timeslice)."""
        attrs = [(Attr.GPU, gpu)]
        if policy is not None:
            attrs.append((Attr.POLICY, to_policy(policy)))
        if period_us is not None:
            attrs.append((Attr.PERIOD_US, period_us))
        if offline_timeslice_us is not None:
            attrs.append((Attr.OFFLINE_TIMESLICE_US, offline_timeslice_us))
        if online_timeslice_us is not None:
            attrs.append((Attr.ONLINE_TIMESLICE_US, online_timeslice_us))
        if offline_preemption is not None:
            attrs.append((Attr.OFFLINE_PREEMPTION, offline_preemption))
        if len(attrs) == 1:
            raise ValueError("set_gpu needs a policy, a period, a timeslice or a preemption")
        self._request(Cmd.GPU_SET, attrs)

    def set_cgroup(
        self,
        cgroup_id: int,
        gpu: int,
        klass: CgroupClass | PodClass | str,
        share: int,
        mem_limit: int = 0,
    ) -> None:
        """Configure a cgroup (again): its GPU, class, share in percent, device memory limit in
        bytes (0: none; always sent, so an update can lift a limit)."""
        self._request(
            Cmd.CGROUP_SET,
            [
                (Attr.CGROUP_ID, cgroup_id),
                (Attr.GPU, gpu),
                (Attr.CLASS, to_class(klass)),
                (Attr.SHARE, share),
                (Attr.MEM_LIMIT, mem_limit),
            ],
        )
        self.placed[cgroup_id] = gpu

    def del_cgroup(self, cgroup_id: int) -> None:
        """Forget a cgroup: its channels are no longer gated nor its memory limited."""
        self._request(Cmd.CGROUP_DEL, [(Attr.CGROUP_ID, cgroup_id)])
        self.placed.pop(cgroup_id, None)

    def cgroups(self) -> list[CgroupStats]:
        return [CgroupStats.from_message(m) for m in self._request(Cmd.CGROUP_GET, dump=True)]

    def gpus(self) -> list[GpuStats]:
        return [GpuStats.from_message(m) for m in self._request(Cmd.GPU_GET, dump=True)]

    def subscribe_events(self) -> None:
        self.transport.subscribe(MCGRP_EVENTS)

    def events(self) -> list[QgpuEvent]:
        """Wait for the next events (after :meth:`subscribe_events`)."""
        return [
            QgpuEvent.from_message(m) for m in self.transport.receive() if m["cmd"] == Cmd.EVENT
        ]


def connect(
    sysfs: Path = SYSFS_ROOT, transport: Callable[[], Transport] = NetlinkTransport
) -> QgpuClient:
    """A client for the daemon, once it is clear the module is there and will obey.

    Every command needs CAP_NET_ADMIN, reading included, so one dump tells now whether the
    daemon may drive the module rather than at its first plan.
    """
    if not sysfs.is_dir():
        raise KmodError(
            f"qgpu.ko is not loaded ({sysfs} is missing): load it, or use --enforcer rm"
        )
    info = read_sysfs(sysfs)
    if info.version is not None and info.version != GENL_VERSION:
        raise KmodError(
            f"qgpu.ko speaks interface version {info.version}; this qpolicy speaks {GENL_VERSION}"
        )
    client = QgpuClient(transport())
    try:
        client.gpus()
    except KmodError as error:
        client.close()
        if error.errno == errno.EPERM:
            raise KmodError(
                "the kmod enforcer needs CAP_NET_ADMIN: qgpu.ko refuses its commands to anyone "
                "else (run the daemon as root)",
                errno.EPERM,
            ) from None
        raise
    return client
