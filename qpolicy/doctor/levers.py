"""The preemption levers the doctor tries: what each sets, on which objects, and how it is undone.

Every lever acts on the workloads' own objects, through the calls the rm enforcer (and qgpu.ko's
kernel client) can make: TSG timeslices, the trainer's compute preemption mode, the runlist's
interleave policy and levels, a realtime online TSG with a runlist restart per request, a PREEMPT
per request, and disabling the trainer's channels around each request (or beside it). Numbers and
layouts are NVIDIA's (qpolicy/nvrm/abi.py cites where); what GSP does with them is what the doctor
measures.

A *setting* is made once and left for the GPU to enforce; a *per-request* lever sends a control
before (and after) each online request, which costs a GSP round trip every time. An *experiment*
is measured and shown like a setting but never recommended: it asks a question of the GPU that
the enforcers do not act on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from qpolicy.doctor.lab import Call, Lab
from qpolicy.enforcers.strategy import EARLIER_OFFLINE_US, GPREEMPT_OFFLINE_US, GPREEMPT_ONLINE_US
from qpolicy.engine import ONLINE_TIMESLICE_US
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels

# qpolicy's classes as the study began (offline 128 µs, the engine's until 2026-11-26; online
# 8192 µs, qpolicy/engine.py) and GPreempt's (a 1 µs best-effort slice, 1 s for the
# latency-critical context): the values the daemon takes from the doctor's recommendation
# (qpolicy/enforcers/strategy.py). The engine's own pair is now timeslice-1us-8ms's.
OFFLINE_US, ONLINE_US = EARLIER_OFFLINE_US, ONLINE_TIMESLICE_US
TINY_US, HUGE_US = GPREEMPT_OFFLINE_US, GPREEMPT_ONLINE_US


@dataclass
class Objects:
    """The workloads' objects and what they held before the doctor changed anything."""

    trainer: list[ClientChannels]
    online: list[ClientChannels]
    #: (client, channel, TSG) of the channels that hold a compute engine object.
    trainer_compute: list[tuple[int, int, int | None]]
    online_compute: list[tuple[int, int, int | None]]
    timeslices: dict[tuple[int, int], int] = field(default_factory=dict)  # (client, TSG) -> µs
    cilp: dict[tuple[int, int], int] = field(default_factory=dict)  # (client, channel) -> mode
    interleave: dict[tuple[int, int], int] = field(default_factory=dict)

    def group_of(self, client: int) -> ClientChannels:
        for group in (*self.trainer, *self.online):
            if group.client == client:
                return group
        raise KeyError(client)

    def compute_tsgs(self, which: str) -> list[tuple[int, int]]:
        channels = self.trainer_compute if which == "trainer" else self.online_compute
        return sorted({(c, tsg) for c, _, tsg in channels if tsg is not None})


Apply = Callable[[Lab, Objects], list[Call]]


@dataclass(frozen=True, slots=True)
class Lever:
    name: str
    kind: str  # baseline, setting, per-request, experiment
    description: str
    apply: Apply = lambda lab, objects: []
    undo: Apply = lambda lab, objects: []
    before: Apply | None = None  # per request, before the online request is released
    after: Apply | None = None  # per request, once its result is back
    new_trainer: bool = False  # the setting is made on a trainer started for it


# -- building blocks -------------------------------------------------------------------------------


def _tsg_target(objects: Objects, client: int, tsg: int) -> str:
    return f"TSG {tsg:#x} of client {client:#x}"


def set_timeslices(lab: Lab, objects: Objects, trainer_us: int, online_us: int) -> list[Call]:
    calls = []
    for which, value in (("trainer", trainer_us), ("online", online_us)):
        groups = objects.trainer if which == "trainer" else objects.online
        for group in groups:
            for tsg in group.tsgs:
                calls.append(
                    lab.control(
                        group,
                        f"{which} {_tsg_target(objects, group.client, tsg)}",
                        tsg,
                        abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
                        timesliceUs=value,
                    )
                )
    return calls


def restore_timeslices(lab: Lab, objects: Objects) -> list[Call]:
    calls = []
    for (client, tsg), value in objects.timeslices.items():
        group = objects.group_of(client)
        calls.append(
            lab.control(
                group,
                f"restore {_tsg_target(objects, client, tsg)}",
                tsg,
                abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
                timesliceUs=value,
            )
        )
    return calls


def _disable(lab: Lab, objects: Objects, disable: bool) -> list[Call]:
    calls = []
    for group in objects.trainer:
        assert group.subdevice is not None
        # RM takes 64 channels a call; a CUDA context has about 20.
        channels = group.channels[: abi.FIFO_DISABLE_CHANNELS_MAX]
        fields = rmctl.disable_channels_fields(group.client, channels, disable=disable)
        calls.append(
            lab.control(
                group,
                f"trainer {len(group.channels)} channels",
                group.subdevice,
                abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                **fields,
            )
        )
    return calls


class _DisableBeside:
    """FIFO_DISABLE_CHANNELS on the trainer sent from a thread of its own as each online request
    is released, the request not waiting for it: the way qgpu.ko closes an offline cgroup whose
    TSGs keep their own timeslices (several CUDA contexts) once it sees online work, where
    disable-per-request makes the request wait for RM's answer first. The trainer is enabled
    again once both the request and the disable are done (and by the phase's undo, should the
    phase end between the two)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._calls: list[Call] = []
        self._error: BaseException | None = None

    def before(self, lab: Lab, objects: Objects) -> list[Call]:
        done = self._join()

        def send() -> None:
            try:
                self._calls = _disable(lab, objects, True)
            except BaseException as error:  # raised where the request's hooks run, at _join
                self._error = error

        self._thread = threading.Thread(target=send, name="doctor-disable", daemon=True)
        self._thread.start()
        return done

    def after(self, lab: Lab, objects: Objects) -> list[Call]:
        return [*self._join(), *_disable(lab, objects, False)]

    def _join(self) -> list[Call]:
        """The calls of the disable sent last, once RM has answered it."""
        if self._thread is None:
            return []
        self._thread.join()
        self._thread = None
        calls, self._calls = self._calls, []
        error, self._error = self._error, None
        if error is not None:
            raise error
        return calls


_beside = _DisableBeside()


def _timeslice_and_rebuild(lab: Lab, objects: Objects) -> list[Call]:
    # Taking the trainer's channels off the runlist and back makes RM rebuild it, as NVIDIA's
    # Tegra driver applies a new slice.
    return [
        *set_timeslices(lab, objects, OFFLINE_US, ONLINE_US),
        *_disable(lab, objects, True),
        *_disable(lab, objects, False),
    ]


def _compute_preemption(
    lab: Lab, objects: Objects, mode: int | None, which: str = "trainer"
) -> list[Call]:
    """The compute preemption mode (0 WFI, 1 CTA, 2 CILP) of the trainer's compute channels, or
    of the online stream's (``which``); None restores each channel's own."""
    calls = []
    channels = objects.trainer_compute if which == "trainer" else objects.online_compute
    for client, channel, _ in channels:
        group = objects.group_of(client)
        assert group.subdevice is not None
        value = objects.cilp.get((client, channel), 0) if mode is None else mode
        calls.append(
            lab.control(
                group,
                f"{which} channel {channel:#x} -> "
                f"{abi.PREEMPTION_MODE_COMPUTE.get(value, str(value))}",
                group.subdevice,
                abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
                flags=abi.PREEMPTION_MODE_FLAG_CILP,
                hChannel=channel,
                cilpPreemptMode=value,
            )
        )
    return calls


def _interleave(lab: Lab, objects: Objects, on: bool) -> list[Call]:
    group = objects.trainer[0]
    assert group.subdevice is not None
    calls = [
        lab.control(
            group,
            "runlist (from the trainer's client)",
            group.subdevice,
            abi.NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY,
            flags=0 if on else abi.RUNLIST_SCHED_POLICY_FLAG_RESTORE,
            schedPolicy=abi.RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED,
        )
    ]
    for which, level in (("trainer", 0), ("online", 2)):
        channels = objects.trainer_compute if which == "trainer" else objects.online_compute
        for client, channel, _ in channels[:1]:  # one channel sets its whole TSG
            value = level if on else objects.interleave.get((client, channel), 1)
            calls.append(
                lab.control(
                    objects.group_of(client),
                    f"{which} channel {channel:#x} -> {abi.INTERLEAVE_LEVEL.get(value)}",
                    channel,
                    abi.NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL,
                    channelInterleaveLevel=value,
                )
            )
    return calls


def _realtime(lab: Lab, objects: Objects, on: bool) -> list[Call]:
    calls = _interleave(lab, objects, on) if on else []
    for client, tsg in objects.compute_tsgs("online"):
        calls.append(
            lab.control(
                objects.group_of(client),
                f"online {_tsg_target(objects, client, tsg)}",
                tsg,
                abi.NVA06C_CTRL_CMD_MAKE_REALTIME,
                bRealtime=int(on),
            )
        )
    return calls if on else [*calls, *_interleave(lab, objects, False)]


def _restart_runlist(lab: Lab, objects: Objects) -> list[Call]:
    client, channel, _ = objects.online_compute[0]
    return [
        lab.control(
            objects.group_of(client),
            f"online channel {channel:#x}",
            channel,
            abi.NVA06F_CTRL_CMD_RESTART_RUNLIST,
            bForceRestart=1,
            bBypassWait=0,
        )
    ]


def _preempt_trainer(lab: Lab, objects: Objects) -> list[Call]:
    return [
        lab.control(
            objects.group_of(client),
            f"trainer {_tsg_target(objects, client, tsg)}",
            tsg,
            abi.NVA06C_CTRL_CMD_PREEMPT,
            bWait=1,
        )
        for client, tsg in objects.compute_tsgs("trainer")
    ]


LEVERS: tuple[Lever, ...] = (
    Lever("native", "baseline", "nothing set: the driver's own time-slicing"),
    Lever(
        "timeslice",
        "setting",
        f"SET_TIMESLICE on the running TSGs: trainer {OFFLINE_US} µs, online {ONLINE_US} µs "
        "(qpolicy's classes until 2026-11-26)",
        lambda lab, o: set_timeslices(lab, o, OFFLINE_US, ONLINE_US),
        restore_timeslices,
    ),
    Lever(
        "timeslice+rebuild",
        "setting",
        "the same, then the trainer's channels disabled and enabled so the runlist is rebuilt",
        _timeslice_and_rebuild,
        restore_timeslices,
    ),
    Lever(
        "timeslice-1us",
        "setting",
        f"SET_TIMESLICE trainer {TINY_US} µs, online {HUGE_US} µs (GPreempt's values)",
        lambda lab, o: set_timeslices(lab, o, TINY_US, HUGE_US),
        restore_timeslices,
    ),
    Lever(
        # The online timeslice only counts while the online TSG has work and another TSG waits:
        # a request shorter than 8 ms never reaches it, while two busy online pods at 1 s would
        # hold the GPU from each other for up to a second. Is the offline 1 µs all that acts?
        "timeslice-1us-8ms",
        "setting",
        f"SET_TIMESLICE trainer {TINY_US} µs, online {ONLINE_US} µs (GPreempt's offline value "
        "with qpolicy's online one: the engine's default since 2026-11-26)",
        lambda lab, o: set_timeslices(lab, o, TINY_US, ONLINE_US),
        restore_timeslices,
    ),
    Lever(
        "timeslice-new",
        "setting",
        f"a new trainer, its TSGs set to {OFFLINE_US} µs while idle (after CUDA's own setting, "
        "before its loop starts)",
        lambda lab, o: set_timeslices(lab, o, OFFLINE_US, ONLINE_US),
        restore_timeslices,
        new_trainer=True,
    ),
    Lever(
        "cilp+timeslice",
        "setting",
        f"GR_SET_CTXSW_PREEMPTION_MODE CILP on the trainer's compute channels, and trainer "
        f"{OFFLINE_US} µs / online {ONLINE_US} µs",
        lambda lab, o: [
            *_compute_preemption(lab, o, abi.PREEMPTION_MODE_CILP),
            *set_timeslices(lab, o, OFFLINE_US, ONLINE_US),
        ],
        lambda lab, o: [*_compute_preemption(lab, o, None), *restore_timeslices(lab, o)],
    ),
    Lever(
        # Under the 1 µs offline slice the online request still waits ~0.2 ms for the trainer to
        # be switched out (docs/levers.md): a CILP save of every SM's registers and shared memory.
        # A CTA-level save has none to write, but waits for the running thread blocks to finish:
        # short blocks should switch faster, a persistent kernel's far slower.
        "cta+timeslice-1us-8ms",
        "setting",
        f"GR_SET_CTXSW_PREEMPTION_MODE CTA on the trainer's compute channels, and trainer "
        f"{TINY_US} µs / online {ONLINE_US} µs",
        lambda lab, o: [
            *_compute_preemption(lab, o, abi.PREEMPTION_MODE_CTA),
            *set_timeslices(lab, o, TINY_US, ONLINE_US),
        ],
        lambda lab, o: [*_compute_preemption(lab, o, None), *restore_timeslices(lab, o)],
    ),
    Lever(
        # FECS shows an online request next to a trainer waiting ~0.1 ms for its own context's
        # restore, under every lever (docs/levers.md, thirtieth session): the larger half of the
        # switch. The online context is saved idle, but libcuda makes it CILP-preemptible.
        # Whether a context that may only be preempted at idle restores faster is FECS's and
        # GSP's business (closed), so it is measured: WFI on the online stream's compute
        # channels, with the engine's pair. On an H200 it changed nothing (restore 96 against
        # 97 µs, call 31B: docs/levers.md), and the enforcers do not set it: an experiment.
        "online-wfi+timeslice-1us-8ms",
        "experiment",
        f"GR_SET_CTXSW_PREEMPTION_MODE WFI on the online stream's compute channels, and trainer "
        f"{TINY_US} µs / online {ONLINE_US} µs",
        lambda lab, o: [
            *_compute_preemption(lab, o, abi.PREEMPTION_MODE_WFI, "online"),
            *set_timeslices(lab, o, TINY_US, ONLINE_US),
        ],
        lambda lab, o: [*_compute_preemption(lab, o, None, "online"), *restore_timeslices(lab, o)],
    ),
    Lever(
        "interleaved",
        "setting",
        "runlist policy CHANNEL_INTERLEAVED; online TSG HIGH, trainer TSG LOW",
        lambda lab, o: _interleave(lab, o, True),
        lambda lab, o: _interleave(lab, o, False),
    ),
    Lever(
        "realtime+restart",
        "per-request",
        "CHANNEL_INTERLEAVED, the online TSG MAKE_REALTIME (the rest become CTA-preemptible), and "
        "RESTART_RUNLIST on its compute channel before each request",
        lambda lab, o: _realtime(lab, o, True),
        lambda lab, o: _realtime(lab, o, False),
        before=_restart_runlist,
    ),
    Lever(
        "preempt-per-request",
        "per-request",
        "PREEMPT (bWait) on the trainer's compute TSG before each request",
        before=_preempt_trainer,
    ),
    Lever(
        "disable-per-request",
        "per-request",
        "FIFO_DISABLE_CHANNELS on the trainer before each request (running work taken off the "
        "engine), enabled again once the request is done",
        before=lambda lab, o: _disable(lab, o, True),
        after=lambda lab, o: _disable(lab, o, False),
        # The phase may end between a request's disable and its enable.
        undo=lambda lab, o: _disable(lab, o, False),
    ),
    Lever(
        "disable-beside-request",
        "per-request",
        "FIFO_DISABLE_CHANNELS on the trainer sent from another thread as each request is "
        "released (the request does not wait for it, as qgpu.ko closes a pod of several CUDA "
        "contexts once it sees online work), enabled again once both are done",
        before=_beside.before,
        after=_beside.after,
        undo=_beside.after,
    ),
)
