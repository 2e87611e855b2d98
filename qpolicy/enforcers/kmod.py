"""The kmod enforcer: qpolicy's plans carried out by qgpu.ko, which runs the periods itself.

The module gates each cgroup's channels from an hrtimer, limits device memory at allocation time
and measures every cgroup (kmod/uapi/qgpu.h). So the enforcer has nothing to do at period
boundaries: it tells the module each GPU's policy and period and each pod's class, share and
memory limit, only when they change, and reads the module's counters back. A pod is a cgroup v2
directory and the module knows it by its cgroup id, the directory's inode number.

:class:`QgpuClient` speaks the ``qgpu`` generic netlink family through a :class:`Transport`:
netlink on a real host (:class:`NetlinkTransport`), an in-process stand-in in the unit tests.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.qgpu_uapi import (
    GENL_NAME,
    GENL_VERSION,
    MAX_CGROUPS,
    MCGRP_EVENTS,
    SHARE_MAX,
    Attr,
    CgroupClass,
    Cmd,
    Event,
    Policy,
    QgpuMsg,
)
from qpolicy.engine import Plan
from qpolicy.errors import QPolicyError
from qpolicy.model import GpuPolicy, PodClass, PodSpec
from qpolicy.telemetry.cgroups import CgroupError, normalize

log = logging.getLogger(__name__)

_E = TypeVar("_E", Policy, CgroupClass, Event)

SYSFS_ROOT = Path("/sys/kernel/qgpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")

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
}


class KmodError(QPolicyError):
    """qgpu.ko is absent, refused a command, or answered what this qpolicy cannot read.

    ``errno`` is the kernel's error number when the module refused a command.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.errno = code


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


def cgroup_id(path: str | os.PathLike[str], root: Path = CGROUP_ROOT) -> int:
    """The id qgpu.ko knows a cgroup v2 by: its directory's inode number.

    ``path`` is the cgroup's directory, or its path in the hierarchy (``/kubepods.slice/x`` or
    ``kubepods.slice/x``), taken relative to ``root``.
    """
    directory = Path(path)
    if not (directory.is_absolute() and directory.is_relative_to(root)):
        directory = root / normalize(str(path)).lstrip("/")
    try:
        info = os.stat(directory)
    except OSError as error:
        raise CgroupError(f"cgroup {str(path)!r}: {error.strerror} ({directory})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CgroupError(f"cgroup {str(path)!r}: {directory} is not a directory")
    return info.st_ino


# -- the message layer ----------------------------------------------------------------------------


class Transport(Protocol):
    """Carries qgpu messages to the module and its answers back.

    Refusals are raised as pyroute2's ``NetlinkError`` (``code`` is the errno), as the kernel's
    netlink acknowledgements carry them.
    """

    def request(self, message: QgpuMsg, *, dump: bool) -> Sequence[QgpuMsg]:
        """Send ``message``: a dump returns every answer, anything else is acknowledged."""
        ...

    def subscribe(self, group: str) -> None: ...

    def receive(self) -> Sequence[QgpuMsg]:
        """Wait for multicast messages of the groups subscribed to."""
        ...

    def close(self) -> None: ...


class NetlinkTransport:
    """A generic netlink socket bound to the ``qgpu`` family.

    ``family`` and ``message_class`` default to qgpu's; the tests point them at the kernel's own
    ``nlctrl`` family to exercise the socket without the module.
    """

    def __init__(self, family: str = GENL_NAME, message_class: type[Any] = QgpuMsg) -> None:
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.generic import GenericNetlinkSocket

        try:
            # Extended acks carry the module's reason for a refusal (NL_SET_ERR_MSG).
            self._socket: Any = GenericNetlinkSocket(ext_ack=True)
        except OSError as error:
            raise KmodError(f"cannot open a generic netlink socket: {error}") from None
        # pyroute2 logs a missing family as an error of its own; KmodError says it better.
        self._socket.asyncore.module_err_level = "debug"
        try:
            self._socket.bind(family, message_class)
        except NetlinkError as error:
            self._socket.close()
            if error.code == errno.ENOENT:
                raise KmodError(
                    f"qgpu.ko is not loaded: no generic netlink family {family!r}",
                    errno.ENOENT,
                ) from None
            raise KmodError(f"cannot look up generic netlink family {family!r}: {error}") from None

    def request(self, message: QgpuMsg, *, dump: bool) -> Sequence[QgpuMsg]:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST

        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        prid = self._socket.prid
        answers = self._socket.nlm_request(message, msg_type=prid, msg_flags=flags)
        return [answer for answer in answers if answer["header"]["type"] == prid]

    def subscribe(self, group: str) -> None:
        try:
            self._socket.add_membership(group)
        except KeyError:
            raise KmodError(f"qgpu.ko has no multicast group {group!r}") from None

    def receive(self) -> Sequence[QgpuMsg]:
        prid = self._socket.prid
        return [answer for answer in self._socket.get() if answer["header"]["type"] == prid]

    def close(self) -> None:
        self._socket.close()


# -- what the module answers ----------------------------------------------------------------------


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
    oom: int
    denied: int
    busy: bool

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
        )


@dataclass(frozen=True, slots=True)
class GpuStats:
    """One GPU as the module reports it (GPU_GET)."""

    gpu: int
    policy: Policy
    period_us: int
    nr_periods: int
    switches: int
    online_busy: bool

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


# -- the client -----------------------------------------------------------------------------------


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
    ) -> None:
        """Set a GPU's policy, its period, or both."""
        attrs = [(Attr.GPU, gpu)]
        if policy is not None:
            attrs.append((Attr.POLICY, to_policy(policy)))
        if period_us is not None:
            attrs.append((Attr.PERIOD_US, period_us))
        if len(attrs) == 1:
            raise ValueError("set_gpu needs a policy, a period or both")
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


# -- sysfs ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SysfsGpu:
    index: int
    policy: str | None
    period_us: int | None
    nr_periods: int | None
    online_busy: bool | None


@dataclass(frozen=True, slots=True)
class SysfsInfo:
    """What anyone may read of the module under /sys/kernel/qgpu (None: a file is missing)."""

    version: int | None
    target: str | None
    hooked: bool | None
    cgroups: int | None
    gpus: tuple[SysfsGpu, ...]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _read_bool(path: Path) -> bool | None:
    value = _read_int(path)
    return None if value is None else value != 0


def read_sysfs(root: Path = SYSFS_ROOT) -> SysfsInfo:
    gpus = []
    for directory in root.glob("gpu*"):
        suffix = directory.name.removeprefix("gpu")
        if not (suffix.isdigit() and directory.is_dir()):
            continue
        gpus.append(
            SysfsGpu(
                index=int(suffix),
                policy=_read(directory / "policy"),
                period_us=_read_int(directory / "period_us"),
                nr_periods=_read_int(directory / "nr_periods"),
                online_busy=_read_bool(directory / "online_busy"),
            )
        )
    return SysfsInfo(
        version=_read_int(root / "version"),
        target=_read(root / "target"),
        hooked=_read_bool(root / "hooked"),
        cgroups=_read_int(root / "cgroups"),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
    )


# -- the enforcer ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupConfig:
    """What the enforcer told the module about one pod."""

    cgroup_id: int
    klass: CgroupClass
    share: int
    mem_limit: int


def kernel_shares(plan: Plan) -> dict[str, int]:
    """The SHARE each planned pod is given.

    Fixed- and burst-share plans carry every pod's share. Best-effort ones need not, and the
    module reads none under best-effort, but CGROUP_SET takes a share from 1 to 100: a pod
    without one gets an equal part of what the pods with one leave, roughly what best-effort
    gives busy pods, so the module's view (``qpolicy status``) reads sensibly.
    """
    own = {s.pod: s.share for s in plan.slices if s.share is not None}
    without = [s.pod for s in plan.slices if s.share is None]
    left = SHARE_MAX - sum(own.values())
    equal = max(1, left // len(without)) if without else 0
    return own | dict.fromkeys(without, equal)


class KmodEnforcer:
    """The Enforcer interface of one GPU over qgpu.ko.

    ``apply`` pushes what changed since the last push and removes the pods that left the plan;
    ``collect`` reads the module's counters. ``pods`` gives the desired pod specs, for the
    memory limits a plan does not carry. Pods are named by their cgroup path relative to
    ``cgroup_root``; a pod that cannot be configured is reported once per distinct problem and
    tried again at every plan (a cgroup may appear later).

    The module keeps its configuration when a daemon dies without releasing it, so the first
    plan also deletes the cgroups configured on this GPU that it does not name: their shares
    would otherwise count against the new ones under fixed-share.
    """

    name = "kmod"

    def __init__(
        self,
        client: QgpuClient,
        gpu: int,
        *,
        pods: Callable[[], Mapping[str, PodSpec]] = dict,
        cgroup_root: Path = CGROUP_ROOT,
    ) -> None:
        self.client = client
        self.gpu = gpu
        self.cgroup_root = cgroup_root
        self._pods = pods
        self._pushed: dict[str, CgroupConfig] = {}
        self._gpu_pushed: tuple[Policy, int] | None = None
        self._planned: tuple[str, ...] = ()
        self._stats: dict[str, CgroupStats] = {}
        self._complaints: dict[str, str] = {}
        self._adopted = False

    @property
    def configured(self) -> Mapping[str, CgroupConfig]:
        """The pods the module has been told about, as it was told."""
        return self._pushed

    @property
    def stats(self) -> Mapping[str, CgroupStats]:
        """Each planned pod's counters as of the last :meth:`collect`."""
        return self._stats

    def _complain(self, key: str, message: str) -> None:
        if self._complaints.get(key) != message:
            self._complaints[key] = message
            log.warning("%s", message)

    def _settled(self, key: str) -> None:
        if self._complaints.pop(key, None) is not None:
            log.info("%s: configured", key)

    def _resolve(self, pod: str) -> int | None:
        pushed = self._pushed.get(pod)
        if pushed is not None:
            return pushed.cgroup_id
        if not pod.startswith("/"):
            self._complain(
                f"pod {pod}",
                f"pod {pod}: not enforced: the kmod enforcer needs a pod named by its cgroup "
                "path (/kubepods.slice/...)",
            )
            return None
        try:
            return cgroup_id(pod, self.cgroup_root)
        except CgroupError as error:
            self._complain(
                f"pod {pod}", f"pod {pod}: not enforced until its cgroup exists: {error}"
            )
            return None

    def apply(self, plan: Plan) -> None:
        if plan.gpu != self.gpu:
            raise ValueError(f"a plan of GPU {plan.gpu} given to the enforcer of GPU {self.gpu}")
        specs = self._pods()
        shares = kernel_shares(plan)
        wanted: dict[str, CgroupConfig] = {}
        for s in plan.slices:
            cgroup = self._resolve(s.pod)
            if cgroup is None:
                continue
            spec = specs.get(s.pod)
            limit = spec.memory_limit if spec is not None and spec.memory_limit else 0
            wanted[s.pod] = CgroupConfig(cgroup, CLASSES[s.pod_class], shares[s.pod], limit)
        self._planned = tuple(s.pod for s in plan.slices)
        if not self._adopted:
            self._adopt({config.cgroup_id for config in wanted.values()})
        for pod in [pod for pod in self._pushed if pod not in wanted]:
            self._remove(pod)
        changes = [(pod, c) for pod, c in wanted.items() if self._pushed.get(pod) != c]
        # Shares that go down go first and the policy after them, so that the GPU's shares
        # never sum past 100 on the way from one plan to the next.
        lowered = [
            (pod, c)
            for pod, c in changes
            if pod in self._pushed and c.share < self._pushed[pod].share
        ]
        for pod, config in lowered:
            self._push(pod, config)
        self._push_gpu(POLICIES[plan.policy], plan.period_us)
        for pod, config in changes:
            if (pod, config) not in lowered:
                self._push(pod, config)

    def _adopt(self, wanted: set[int]) -> None:
        try:
            configured = self.client.cgroups()
        except KmodError as error:
            self._complain("stats", f"GPU {self.gpu}: cannot read the pods' counters: {error}")
            return
        self._adopted = True
        for stats in configured:
            if stats.gpu != self.gpu or stats.cgroup_id in wanted:
                continue
            log.info("GPU %d: deleting cgroup #%d, left configured", self.gpu, stats.cgroup_id)
            try:
                self.client.del_cgroup(stats.cgroup_id)
            except KmodError as error:
                if error.errno != errno.ENOENT:
                    log.warning("GPU %d: %s", self.gpu, error)

    def _push_gpu(self, policy: Policy, period_us: int) -> None:
        if self._gpu_pushed == (policy, period_us):
            return
        key = f"GPU {self.gpu}"
        try:
            self.client.set_gpu(self.gpu, policy, period_us)
        except KmodError as error:
            self._complain(key, f"{key}: {error}")
            return
        self._gpu_pushed = (policy, period_us)
        self._settled(key)

    def _push(self, pod: str, config: CgroupConfig) -> None:
        key = f"pod {pod}"
        try:
            self.client.set_cgroup(
                config.cgroup_id, self.gpu, config.klass, config.share, config.mem_limit
            )
        except KmodError as error:
            self._complain(key, f"{key}: {error}")
            return
        self._pushed[pod] = config
        self._settled(key)

    def _remove(self, pod: str) -> bool:
        config = self._pushed[pod]
        # A pod that moved to another GPU belongs to that GPU's enforcer now.
        if self.client.placed.get(config.cgroup_id, self.gpu) == self.gpu:
            try:
                self.client.del_cgroup(config.cgroup_id)
            except KmodError as error:
                if error.errno != errno.ENOENT:  # ENOENT: the module forgot it already
                    self._complain(f"pod {pod}", f"pod {pod}: {error}")
                    return False
        del self._pushed[pod]
        self._stats.pop(pod, None)
        self._complaints.pop(f"pod {pod}", None)
        return True

    def collect(self) -> Mapping[str, PodUsage]:
        if not self._planned:
            return {}
        try:
            stats = {s.cgroup_id: s for s in self.client.cgroups()}
        except KmodError as error:
            self._complain("stats", f"GPU {self.gpu}: cannot read the pods' counters: {error}")
            return {pod: PodUsage(0.0, False) for pod in self._planned}
        self._settled("stats")
        usage: dict[str, PodUsage] = {}
        for pod in self._planned:
            config = self._pushed.get(pod)
            now = stats.get(config.cgroup_id) if config is not None else None
            if now is None:
                if config is not None:
                    # The module drops a cgroup that is removed (EVENT_CGROUP_GONE); one of the
                    # same path made later is another cgroup, to be looked up again.
                    log.info("pod %s: its cgroup is gone", pod)
                    del self._pushed[pod]
                    self.client.placed.pop(config.cgroup_id, None)
                self._stats.pop(pod, None)
                usage[pod] = PodUsage(0.0, False)
                continue
            before = self._stats.get(pod)
            self._stats[pod] = now
            if before is None or before.cgroup_id != now.cgroup_id:
                # Counters of a cgroup seen for the first time may predate this daemon.
                usage[pod] = PodUsage(0.0, False)
                continue
            usage[pod] = PodUsage(
                used_us=max(now.open_ns - before.open_ns, 0) / 1000,
                hungry=now.nr_throttled > before.nr_throttled,
            )
        return usage

    def stand_down(self) -> None:
        """No plan: nothing may stay gated, so the module forgets this GPU's pods."""
        self.release()

    def release(self) -> None:
        """Delete every cgroup configured here and leave the GPU best-effort."""
        for pod in list(self._pushed):
            if not self._remove(pod):
                log.warning("pod %s: left configured in qgpu.ko", pod)
        try:
            self.client.set_gpu(self.gpu, Policy.BEST_EFFORT)
        except KmodError as error:
            log.warning("GPU %d: not left best-effort: %s", self.gpu, error)
        self._gpu_pushed = None
        self._planned = ()
        self._stats.clear()
