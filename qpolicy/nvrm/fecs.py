"""The GPU's context switches as its front end (FECS) logs them: when each context began to run
and when its save ended, with the process it belongs to.

RM copies FECS's trace into an *event buffer* a client binds to GR (open-gpu-kernel-modules
580.142: ``fecsAddBindpoint`` in src/nvidia/src/kernel/gpu/gr/fecs_event_list.c,
``eventbufferConstruct_IMPL`` in src/nvidia/src/kernel/rmapi/event_buffer.c). What a client of
user privilege gets, root included, is the *simple* level of detail: a context's
``CONTEXT_START`` as ``SIMPLE_START`` and its ``SAVE_END`` as ``SIMPLE_END``, with the channel
or TSG handle and the pid (``notifyEventBuffers``; an administrator's records are not
sanitised). So a switch from the trainer to an online request shows as the trainer's
``SIMPLE_END`` (its save done) and the request's ``SIMPLE_START`` (its context restored and
running); the time between them is the restore, and the save's own start is not logged.

The steps, each answered by RM with a status (:class:`FecsError` names the step that failed):
a client of our own on ``/dev/nvidiactl`` with a device and a subdevice; two
``NV01_MEMORY_DEVICELESS`` objects, read-only to the user (a user client's event buffer must
lie in such memory), for the buffer's header and its records; the ``NV_EVENT_BUFFER`` on them;
``GR_FECS_BIND_EVTBUF_FOR_UID_V2`` for all users; ``ENABLE_EVENTS`` keeping the oldest records;
each memory mapped into this process (``RM_MAP_MEMORY`` onto a fresh ``/dev/nvidiactl`` fd, then
``mmap`` of that fd at offset 0: nv-mmap.c, ``nvidia_mmap_helper``). Logging needs the GPU to
support it: on Hopper ``bCtxswLoggingSupported`` is on unless the ``RMCtxswLog`` registry key
turns it off (kgraphics_gp100.c), and RM answers NOT_SUPPORTED with a reason code where it is
off. RM fills the buffer from a timer (``_fecsTimerCreate``), so records arrive in batches.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import mmap
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from qpolicy.errors import QPolicyError
from qpolicy.nvrm import abi, rmctl

PAGE = 4096
RECORD_TYPE_FECS_V2 = 2  # NV_EVENT_BUFFER_RECORD_TYPE_FECS_CTX_SWITCH_V2 (cl90cdtypes.h)
# The objects of our client; RM numbers the client itself.
H_DEVICE, H_SUBDEVICE, H_HEADER, H_RECORDS, H_BUFFER = (0xF5C50001 + i for i in range(5))


class FecsError(QPolicyError):
    """A step of opening the trace failed: which, and what RM or the kernel answered."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"FECS trace: {step}: {why}")
        self.step = step
        self.why = why


@dataclass(frozen=True, slots=True)
class Record:
    tag: int  # abi.FECS_TAG_SIMPLE_START or _END
    context: int  # the channel or TSG handle in its process's client
    pid: int
    ns: int  # the GPU's timer, in ns
    seqno: int


class Request(NamedTuple):
    """An online request on CLOCK_MONOTONIC_RAW, in ns: its launch, the end of its
    synchronisation, and the return of its launch call (its work and the doorbell written; None
    where the workload did not say)."""

    launch: int
    done: int
    enqueued: int | None = None


def parse(data: bytes | memoryview, get: int, put: int, count: int) -> list[Record]:
    """The FECS records of a record buffer of ``count`` slots from ``get`` up to ``put``."""
    records = []
    size = abi.FECS_RECORD.size
    index = get
    while index != put:
        fields = abi.FECS_RECORD.unpack(bytes(data[index * size : (index + 1) * size]))
        if fields["type"] == RECORD_TYPE_FECS_V2:
            records.append(
                Record(
                    fields["tag"],
                    fields["context_id"],
                    fields["pid"],
                    fields["timestamp"],
                    fields["seqno"],
                )
            )
        index = (index + 1) % count
    return records


class FecsTrace:
    """An open FECS trace of GPU ``gpu`` (RM's device instance and ``/dev/nvidiaN``; with
    ``bus``, only if that device is the GPU at that PCI address)."""

    def __init__(self, gpu: int, bus: str | None = None, records: int = 32768) -> None:
        self.gpu = gpu
        self.bus = bus  # its PCI address as Linux names it, to check RM's device against
        self.count = records
        self.steps: list[dict[str, Any]] = []
        self._fds: list[int] = []
        self._maps: list[mmap.mmap] = []
        self.client = 0
        self.dropped = 0

    # -- opening ----------------------------------------------------------------------------------

    def open(self) -> FecsTrace:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        ctl = self._open_file("/dev/nvidiactl")
        device = self._open_file(f"/dev/nvidia{self.gpu}")
        self._step("REGISTER_FD", -rmctl.register_fd(device, ctl), required=False)
        client = rmctl.alloc_client(ctl)
        if client is None:
            raise FecsError("a client", "RM refused")
        self.client = client
        device_params = abi.NV0080_ALLOC_PARAMETERS.pack(deviceId=self.gpu, hClientShare=client)
        self._alloc(ctl, "the device", client, H_DEVICE, abi.NV01_DEVICE_0, device_params)
        self._alloc(ctl, "the subdevice", H_DEVICE, H_SUBDEVICE, abi.NV20_SUBDEVICE_0, bytes(4))
        if self.bus is not None:
            # RM's device instances and nvidia-smi's indices need not agree on a node of
            # several GPUs: a trace of another GPU is refused. (Read, it would hold none of the
            # doctor's processes, whose records are all it keeps.) An address RM does not give
            # is noted, and the trace read.
            address = rmctl.gpu_pci_address(ctl, client, H_SUBDEVICE)
            self.steps.append({"step": "the device's PCI address", "address": str(address)})
            if address is not None and not self.bus.lower().startswith(str(address)):
                raise FecsError(
                    "the device", f"RM's device {self.gpu} is at {address}, not {self.bus}"
                )
        record_bytes = -(-self.count * abi.FECS_RECORD.size // PAGE) * PAGE
        for name, handle, size in (
            ("header", H_HEADER, PAGE),
            ("records", H_RECORDS, record_bytes),
        ):
            memory = abi.NV_MEMORY_ALLOCATION_PARAMS.pack(
                attr=abi.NVOS32_ATTR_COHERENCY_CACHED,
                attr2=abi.NVOS32_ATTR2_PROTECTION_USER_READ_ONLY,
                size=size,
            )
            self._alloc(
                ctl, f"the {name} memory", client, handle, abi.NV01_MEMORY_DEVICELESS, memory
            )
        params = abi.NV_EVENT_BUFFER_ALLOC_PARAMETERS.pack(
            recordSize=abi.FECS_RECORD.size,
            recordCount=self.count,
            hSubDevice=H_SUBDEVICE,
            hBufferHeader=H_HEADER,
            hRecordBuffer=H_RECORDS,
        )
        self._alloc(ctl, "the event buffer", client, H_BUFFER, abi.NV_EVENT_BUFFER, params)
        self._header = self._map(ctl, "the header", H_HEADER, PAGE)
        self._records = self._map(ctl, "the records", H_RECORDS, record_bytes)
        result, answer = rmctl.control(
            ctl, client, H_SUBDEVICE, abi.NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2,
            hEventBuffer=H_BUFFER, recordSize=abi.FECS_RECORD.size,
            levelOfDetail=abi.FECS_BIND_LOD_SIMPLE, bAllUsers=1,
        )  # fmt: skip
        reason = abi.FECS_BIND_REASON.get(answer.get("reasonCode", 0), "unknown")
        self._step("bind to GR", result.status, reason=reason)
        result, _ = rmctl.control(
            ctl, client, H_BUFFER, abi.NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS,
            enable=1, flags=abi.EVENT_BUFFER_KEEP_OLDEST,
        )  # fmt: skip
        self._step("enable", result.status)
        self._ctl = ctl

    def _open_file(self, path: str) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            raise FecsError(f"open {path}", error.strerror or str(error)) from None
        self._fds.append(fd)
        return fd

    def _step(self, step: str, status: int, *, required: bool = True, **extra: Any) -> None:
        self.steps.append(
            {"step": step, "status": f"{status:#x}" if status >= 0 else status, **extra}
        )
        if status != 0 and required:
            detail = f"RM answered {abi.status_name(status)}" if status > 0 else f"errno {-status}"
            if extra.get("reason") not in (None, "none"):
                detail += f" ({extra['reason']})"
            raise FecsError(step, detail)

    def _alloc(self, fd: int, step: str, parent: int, handle: int, cls: int, params: bytes) -> None:
        self._step(step, rmctl.alloc(fd, self.client, parent, handle, cls, params))

    def _map(self, ctl: int, step: str, handle: int, size: int) -> mmap.mmap:
        target = self._open_file("/dev/nvidiactl")
        status = rmctl.map_memory(
            ctl, self.client, self.client, handle, size, abi.NVOS33_FLAGS_ACCESS_READ_ONLY, target
        )
        self._step(f"map {step}", status)
        try:
            mapped = mmap.mmap(target, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=0)
        except OSError as error:
            raise FecsError(f"mmap {step}", error.strerror or str(error)) from None
        self._maps.append(mapped)
        return mapped

    def gpu_minus_cpu_ns(self, samples: int = 7) -> int:
        """The GPU's timer minus CLOCK_MONOTONIC_RAW, in ns: the median of ``samples`` pairs RM
        read side by side (``TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO``, PLATFORM_API: the CPU
        reads between two GPU reads, the closest pair kept; subdevice_ctrl_timer_kernel.c)."""
        offsets = []
        for _ in range(samples):
            result, answer = rmctl.control(
                self._ctl, self.client, H_SUBDEVICE,
                abi.NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO,
                cpuClkId=abi.TIMER_CPU_CLK_ID_PLATFORM_API, sampleCount=1,
            )  # fmt: skip
            if not result.ok:
                raise FecsError(
                    "correlate the clocks", f"RM answered {abi.status_name(result.status)}"
                )
            offsets.append(answer["gpuTime"] - answer["cpuTime"])
        return int(statistics.median(offsets))

    # -- reading ----------------------------------------------------------------------------------

    def read(self) -> list[Record]:
        """The records RM has added since the last read, oldest first; their slots are given
        back to RM (UPDATE_GET)."""
        header = abi.NV_EVENT_BUFFER_HEADER.unpack(self._header[: abi.NV_EVENT_BUFFER_HEADER.size])
        get, put = header["recordGet"], header["recordPut"]
        self.dropped = header["recordDropcount"]
        records = parse(memoryview(self._records), get, put, self.count)
        if put != get:
            result, _ = rmctl.control(
                self._ctl, self.client, H_BUFFER, abi.NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET,
                recordBufferGet=put, varDataBufferGet=0,
            )  # fmt: skip
            if not result.ok:
                raise FecsError(
                    "give records back", f"RM answered {abi.status_name(result.status)}"
                )
        return records

    def close(self) -> None:
        """Everything goes with the files: RM frees a client when its file is closed."""
        for mapped in self._maps:
            with contextlib.suppress(BufferError, ValueError):
                mapped.close()
        self._maps.clear()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> FecsTrace:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def switches(records: Iterable[Record], online: set[int], offline: set[int]) -> dict[str, Any]:
    """What the records say of the switches between the ``online`` processes' contexts and the
    ``offline`` ones' (pids): how many times an online context began to run right after an
    offline one's save ended, and how long after (the restore: ``restore_us``); how long online
    contexts ran each time (``online_run_us``); how long offline ones ran between two saves
    (``offline_run_us``). Percentiles p50 / p90 / p99 in µs; records of other pids are skipped."""
    ordered = sorted(records, key=lambda r: r.ns)
    restore: list[float] = []
    online_run: list[float] = []
    offline_run: list[float] = []
    started: dict[tuple[int, int], int] = {}
    last_end: Record | None = None
    for record in ordered:
        if record.pid not in online and record.pid not in offline:
            continue
        key = (record.pid, record.context)
        if record.tag == abi.FECS_TAG_SIMPLE_START:
            started[key] = record.ns
            if record.pid in online and last_end is not None and last_end.pid in offline:
                restore.append((record.ns - last_end.ns) / 1000)
        elif record.tag == abi.FECS_TAG_SIMPLE_END:
            begun = started.pop(key, None)
            if begun is not None:
                (online_run if record.pid in online else offline_run).append(
                    (record.ns - begun) / 1000
                )
            last_end = record
    return {
        "records": len(ordered),
        "offline_to_online": len(restore),
        "restore_us": _percentiles(restore),
        "online_run_us": _percentiles(online_run),
        "offline_run_us": _percentiles(offline_run),
    }


def _percentiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:  # nearest rank, as the doctor's latencies (report.percentile)
        return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)], 1)

    return {"n": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "mean": round(statistics.fmean(ordered), 1)}  # fmt: skip


def request_waits(
    records: Iterable[Record],
    gpu_minus_cpu_ns: int,
    requests: Sequence[Request | tuple[int, int]],
    online: set[int],
    offline: set[int],
) -> dict[str, Any]:
    """Where each online request's time went, on the GPU's own log: ``requests`` are on
    CLOCK_MONOTONIC_RAW, the records' times are moved onto it by ``gpu_minus_cpu_ns``.
    For a request during which an ``offline`` context's save ended and then an ``online``
    context started: from its launch to that save's end (``to_save_end_us``: the launch, the
    scheduler's move and the save) and to the online start (``to_start_us``: the restore too).
    ``placed`` counts the requests whose switch fell inside them; a clock offset that was wrong
    would place none. ``launch_to_done_us``: every request's launch to the end of its
    synchronisation, switched or not (solo's are the baseline). ``launch_call_us``: the launch
    call itself, until it returned with the work and its doorbell written, and
    ``returned_to_save_end_us`` the rest of the way to the save's end, which the CPU no longer
    holds up (both where the requests say when their call returned)."""
    ordered = sorted(
        (r for r in records if r.pid in online or r.pid in offline), key=lambda r: r.ns
    )
    times = [r.ns - gpu_minus_cpu_ns for r in ordered]
    asked = [Request(*request) for request in requests]
    to_save_end: list[float] = []
    to_start: list[float] = []
    returned_to_save_end: list[float] = []
    for launch, done, enqueued in asked:
        first = bisect.bisect_left(times, launch)
        saved = None
        for index in range(first, len(ordered)):
            if times[index] > done:
                break
            record = ordered[index]
            if record.tag == abi.FECS_TAG_SIMPLE_END and record.pid in offline and saved is None:
                saved = times[index]
            elif (
                record.tag == abi.FECS_TAG_SIMPLE_START
                and record.pid in online
                and saved is not None
            ):
                to_save_end.append((saved - launch) / 1000)
                to_start.append((times[index] - launch) / 1000)
                if enqueued is not None:
                    returned_to_save_end.append((saved - enqueued) / 1000)
                break
    calls = [(r.enqueued - r.launch) / 1000 for r in asked if r.enqueued is not None]
    return {
        "requests": len(asked),
        "launch_to_done_us": _percentiles([(r.done - r.launch) / 1000 for r in asked]),
        "launch_call_us": _percentiles(calls),
        "placed": len(to_start),
        "to_save_end_us": _percentiles(to_save_end),
        "returned_to_save_end_us": _percentiles(returned_to_save_end),
        "to_start_us": _percentiles(to_start),
    }
