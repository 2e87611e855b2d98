"""The eBPF probe on the NVIDIA driver's device files (``ebpf/nvprobe.c``), loaded with bcc.

Per cgroup v2 the kernel side counts ioctls by escape, RM controls by command, allocations by
class, a log2 histogram of ioctl time, opens, mmaps and libcuda launches; it streams opens,
closes, process exits and the outcomes of the RM calls that create, free and schedule objects,
which :meth:`NvProbe.poll` returns as trace records for :class:`~qpolicy.nvrm.tracker.Tracker`.

Everything about the running kernel is probed at load time, never inferred from its version:
struct offsets from BTF, optional tracepoints from tracefs, the ring buffer by creating one.
bcc is imported only when a probe starts, so the rest of qpolicy works without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from qpolicy.errors import QPolicyError
from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node
from qpolicy.nvrm.decode import decode
from qpolicy.telemetry import wire
from qpolicy.telemetry.btf import Btf, Member, probe_offsets
from qpolicy.telemetry.devices import DeviceFilter
from qpolicy.telemetry.libcuda import (
    COPY_SYMBOLS,
    LAUNCH_SYMBOLS,
    QUERY_SYMBOLS,
    SYNC_SYMBOLS,
    file_offset,
    find_libcuda,
    probe_address,
)
from qpolicy.telemetry.mapbatch import BatchReader, MapBatchError
from qpolicy.telemetry.uprobemulti import UprobeMultiError, link, load_program
from qpolicy.telemetry.wire import ProbeRecord

EBPF_DIR = Path(__file__).resolve().parents[2] / "ebpf"
SOURCE = "nvprobe.c"
#: What bcc compiles the rendered source with (nvprobe.h beside it; bcc's own helpers redefine
#: some of the kernel's macros). tools/gpu/make-carry.sh compiles with the same.
CFLAGS = (f"-I{EBPF_DIR}", "-Wno-macro-redefined")
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
DEFAULT_BUFFER_PAGES = 64
# The most records one poll takes from the ring buffer (the rest wait for the next poll).
MAX_POLL_RECORDS = 8192

# RM controls whose outcome the tracker reads (scheduling state, work submit tokens).
STREAMED_CONTROLS = (
    abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
    abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
    abi.NVA06F_CTRL_CMD_GPFIFO_SCHEDULE,
    abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
    abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
)

# Placeholder -> "struct.member" whose byte offset replaces it.
OFFSET_PLACEHOLDERS = {
    "QP_OFF_TASK_FILES": "task_struct.files",
    "QP_OFF_FILES_FDT": "files_struct.fdt",
    "QP_OFF_FDT_MAX_FDS": "fdtable.max_fds",
    "QP_OFF_FDT_FD": "fdtable.fd",
    "QP_OFF_FILE_INODE": "file.f_inode",
    "QP_OFF_INODE_MODE": "inode.i_mode",
    "QP_OFF_INODE_RDEV": "inode.i_rdev",
    "QP_OFF_TASK_SIGNAL": "task_struct.signal",
    "QP_OFF_SIGNAL_LIVE": "signal_struct.live",
}
# The widths the C code reads each member with: a kernel that changed one must not be misread.
EXPECTED_SIZES = {
    "task_struct.files": 8,
    "files_struct.fdt": 8,
    "fdtable.max_fds": 4,
    "fdtable.fd": 8,
    "file.f_inode": 8,
    "inode.i_mode": 2,
    "inode.i_rdev": 4,
    "task_struct.signal": 8,
    "signal_struct.live": 4,
}

Output = Literal["auto", "ringbuf", "perf"]
GroupDead = Literal["auto", "tracepoint", "task"]


class ProbeError(QPolicyError):
    """The probe cannot be loaded or attached here; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class CgroupCounters:
    """Cumulative kernel-side counts of one cgroup since the probe was loaded.

    ``latency_log2[i]`` counts ioctls that took [2^(i-1), 2^i) µs; index 0 those under 1 µs.
    """

    cgroup: int
    ioctls: int = 0
    escapes: Mapping[str, int] = field(default_factory=dict)
    controls: Mapping[str, int] = field(default_factory=dict)
    allocs: Mapping[str, int] = field(default_factory=dict)
    latency_log2: tuple[int, ...] = ()
    latency_sum_ns: int = 0
    opens: int = 0
    mmaps: int = 0
    launches: int = 0
    #: libcuda synchronize calls and synchronous copies entered, and query calls answered "not
    #: ready": waits for GPU work.
    waits: int = 0
    polls: int = 0


@functools.lru_cache(maxsize=4096)
def ioctl_name(node: Node, code: int, by_nr: bool) -> str:
    """The name :func:`qpolicy.nvrm.decode.decode` gives, from the kernel's ioctl key (kept: the
    same few hundred keys are named again at every publish)."""
    if by_nr:
        try:
            return Escape(code).name
        except ValueError:
            return f"escape 0x{code:02x}"
    return decode(node, code, b"").name


def build_counters(
    ioctls: Iterable[tuple[int, int, int, bool, int]],
    controls: Iterable[tuple[int, int, int]],
    allocs: Iterable[tuple[int, int, int]],
    latency: Iterable[tuple[int, int, int]],
    stats: Iterable[tuple[int, int, int, int, int, int, int, int]],
) -> dict[int, CgroupCounters]:
    """Per-cgroup counters from the rows of the kernel maps.

    ``ioctls``: (cgroup, node code, code, by_nr, count); ``controls`` / ``allocs`` / ``latency``:
    (cgroup, command / class / log2 slot, count); ``stats``: (cgroup, ioctls, latency ns, opens,
    mmaps, launches, synchronize calls, "not ready" answers).
    """
    escapes: dict[int, Counter[str]] = defaultdict(Counter)
    for cgroup, node_code, code, by_nr, count in ioctls:
        node = wire.NODES_BY_CODE.get(node_code, Node.OTHER)
        escapes[cgroup][ioctl_name(node, code, by_nr)] += count
    named_controls: dict[int, Counter[str]] = defaultdict(Counter)
    for cgroup, cmd, count in controls:
        named_controls[cgroup][abi.control_name(cmd)] += count
    named_allocs: dict[int, Counter[str]] = defaultdict(Counter)
    for cgroup, cls, count in allocs:
        named_allocs[cgroup][abi.class_name(cls)] += count
    slots: dict[int, dict[int, int]] = defaultdict(dict)
    for cgroup, slot, count in latency:
        slots[cgroup][slot] = slots[cgroup].get(slot, 0) + count
    totals = {row[0]: row[1:] for row in stats}
    result = {}
    for cgroup in set(totals) | set(escapes) | set(named_controls) | set(named_allocs):
        n_ioctls, latency_ns, opens, mmaps, launches, waits, polls = totals.get(
            cgroup, (0, 0, 0, 0, 0, 0, 0)
        )
        hist = slots.get(cgroup, {})
        width = max(hist, default=-1) + 1
        result[cgroup] = CgroupCounters(
            cgroup=cgroup,
            ioctls=n_ioctls,
            escapes=dict(escapes.get(cgroup, {})),
            controls=dict(named_controls.get(cgroup, {})),
            allocs=dict(named_allocs.get(cgroup, {})),
            latency_log2=tuple(hist.get(i, 0) for i in range(width)),
            latency_sum_ns=latency_ns,
            opens=opens,
            mmaps=mmaps,
            launches=launches,
            waits=waits,
            polls=polls,
        )
    return result


def _number(key: Any) -> int:
    """A scalar map key or value: an int from a batch lookup, a ctypes scalar from iteration."""
    return key if isinstance(key, int) else int(key.value)


def _tracefs() -> Path | None:
    return next((d for d in TRACEFS_DIRS if (d / "events").is_dir()), None)


def tracepoint_format(category: str, event: str) -> str | None:
    tracefs = _tracefs()
    if tracefs is None:
        return None
    try:
        return (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None


def render_source(
    offsets: Mapping[str, Member],
    *,
    openat2: bool,
    open_: bool,
    group_dead: Literal["tracepoint", "task"],
    output: Literal["ringbuf", "perf"],
    buffer_pages: int = DEFAULT_BUFFER_PAGES,
    source: str | None = None,
) -> str:
    """The BPF C text with every placeholder substituted (what ``--ebpf`` prints)."""
    text = source if source is not None else (EBPF_DIR / SOURCE).read_text()
    for member, expected in EXPECTED_SIZES.items():
        if offsets[member].size != expected:
            raise ProbeError(
                f"kernel struct member {member} is {offsets[member].size} bytes, "
                f"the probe reads {expected}"
            )
    values: dict[str, str] = {
        name: str(offsets[member].offset) for name, member in OFFSET_PLACEHOLDERS.items()
    }
    values["QP_HAVE_OPENAT2"] = "1" if openat2 else "0"
    values["QP_HAVE_OPEN"] = "1" if open_ else "0"
    values["QP_GROUP_DEAD"] = (
        "args->group_dead" if group_dead == "tracepoint" else "signal_group_dead()"
    )
    if output == "ringbuf":
        values["QP_OUTPUT_DECL"] = f"BPF_RINGBUF_OUTPUT(events, {buffer_pages});"
        values["QP_SUBMIT_BODY"] = "return events.ringbuf_output(ev, size, 0);"
    else:
        values["QP_OUTPUT_DECL"] = "BPF_PERF_OUTPUT(events);"
        values["QP_SUBMIT_BODY"] = "return events.perf_submit(ctx, ev, size);"
    for name, value in values.items():
        text = re.sub(rf"\b{name}\b", value, text)
    left = sorted(set(re.findall(r"\bQP_[A-Z0-9_]*[A-Z0-9]\b", text)))
    if left:
        raise ProbeError(f"{SOURCE} has placeholders the probe does not fill: {', '.join(left)}")
    return text


def _import_bpf() -> Any:
    try:
        from bcc import BPF
    except ImportError:
        raise ProbeError(
            "the eBPF probe needs bcc's Python module: install the Debian package python3-bpfcc "
            "(tools/setup-ebpf.sh installs it and makes .venv see it)"
        ) from None
    return BPF


def _libbcc() -> Any:
    """bcc's ctypes handle on libbcc (its bpf_* calls), once bcc is imported."""
    from bcc.libbcc import lib

    return lib


CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def _check_privileges(status: str | None = None) -> None:
    if status is None:
        if os.geteuid() == 0:
            return
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            status = ""
    caps = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)

    def has(cap: int) -> bool:
        return bool(caps >> cap & 1)

    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        return
    raise ProbeError("the eBPF probe needs root (or CAP_BPF and CAP_PERFMON): run it with sudo")


def _ringbuf_supported() -> bool:
    """Whether this kernel creates BPF ring buffers (5.8+, but asked, not assumed)."""
    try:
        from bcc.libbcc import lib
    except ImportError:
        return False
    create = lib.bcc_create_map
    create.restype = ctypes.c_int
    create.argtypes = [ctypes.c_int] + [ctypes.c_char_p] + [ctypes.c_int] * 4
    fd = int(create(27, b"qp_ringbuf_probe", 0, 0, 4096, 0))  # BPF_MAP_TYPE_RINGBUF
    if fd < 0:
        return False
    os.close(fd)
    return True


class NvProbe:
    """The loaded probe. ``devices``: the device filter (default: this machine's NVIDIA nodes);
    ``libcuda``: "auto", a path, or None for no launch counting."""

    def __init__(
        self,
        devices: DeviceFilter | None = None,
        libcuda: str | Path | None = "auto",
        *,
        output: Output = "auto",
        group_dead: GroupDead = "auto",
        buffer_pages: int = DEFAULT_BUFFER_PAGES,
        uprobe_multi: bool = True,
    ) -> None:
        if buffer_pages <= 0 or buffer_pages & (buffer_pages - 1):
            raise ProbeError(f"buffer_pages must be a power of two, not {buffer_pages}")
        self.devices = devices if devices is not None else DeviceFilter.nvidia()
        self._libcuda_spec = libcuda
        self._output: Output = output
        self._group_dead: GroupDead = group_dead
        self._buffer_pages = buffer_pages
        # libcuda's uprobes as one link per program (uprobemulti.py) while the kernel takes them.
        self._uprobe_multi = uprobe_multi
        self._links: list[int] = []
        self._multi_programs: dict[bytes, int] = {}
        self.features: dict[str, bool | str] = {}
        self._bpf: Any = None
        self._pending: list[bytes] = []
        self.bad_events = 0
        self._batch_lookup = True
        # Per map: its batch reader, with buffers kept between reads (of this load's maps).
        self._readers: dict[bytes, BatchReader] = {}
        # Per cgroup: reads that found a thread of it inside a synchronize call (_activity).
        self._wait_ticks: dict[int, int] = {}
        #: Per cgroup, as the last read of its activity found them: launches, synchronize calls
        #: and synchronous copies entered, query calls answered "not ready" (what a view shows
        #: without reading the ioctl counters).
        self.cuda_calls: dict[int, tuple[int, int, int]] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    def source(self) -> str:
        """Probe the kernel's features and return the BPF C text that would be loaded."""
        bpf_class = _import_bpf()
        offsets = probe_offsets(Btf.load())
        if _tracefs() is None:
            raise ProbeError("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")

        def exists(name: str) -> bool:
            return bool(bpf_class.tracepoint_exists("syscalls", name))

        if not (exists("sys_enter_ioctl") and exists("sys_enter_openat")):
            raise ProbeError("no syscall tracepoints (a kernel without CONFIG_FTRACE_SYSCALLS)")
        openat2 = exists("sys_enter_openat2")
        open_ = exists("sys_enter_open")
        exit_format = tracepoint_format("sched", "sched_process_exit") or ""
        group_dead: Literal["tracepoint", "task"]
        if self._group_dead == "auto":
            group_dead = "tracepoint" if re.search(r"\bgroup_dead;", exit_format) else "task"
        else:
            group_dead = self._group_dead
        output: Literal["ringbuf", "perf"]
        if self._output == "auto":
            output = "ringbuf" if _ringbuf_supported() else "perf"
        else:
            output = self._output
        self.features.update(openat2=openat2, open=open_, group_dead=group_dead, output=output)
        return render_source(
            offsets,
            openat2=openat2,
            open_=open_,
            group_dead=group_dead,
            output=output,
            buffer_pages=self._buffer_pages,
        )

    def start(self) -> NvProbe:
        if self._bpf is not None:
            return self
        bpf_class = _import_bpf()
        _check_privileges()
        if not self.devices:
            raise ProbeError("the device filter is empty: nothing to watch")
        libcuda = find_libcuda(self._libcuda_spec)
        text = self.source()
        try:
            bpf = bpf_class(text=text.encode(), cflags=list(CFLAGS))
        except Exception as error:  # bcc raises bare Exception for compile/load/attach failures
            raise ProbeError(f"cannot load {SOURCE}: {error}") from None
        self._bpf = bpf
        self._readers = {}
        try:
            self._fill_maps(bpf)
            self._attach_launches(bpf, libcuda)
            self._open_output(bpf)
        except Exception:
            self.close()
            raise
        return self

    def _fill_maps(self, bpf: Any) -> None:
        devs = bpf[b"devs"]
        for (major, minor), node in self.devices.exact.items():
            devs[devs.Key(wire.kernel_dev(major, minor))] = devs.Leaf(wire.NODE_CODES[node])
        majors = bpf[b"majors"]
        for major, node in self.devices.majors.items():
            majors[majors.Key(major)] = majors.Leaf(wire.NODE_CODES[node])
        streamed = bpf[b"stream_controls"]
        for cmd in STREAMED_CONTROLS:
            streamed[streamed.Key(cmd)] = streamed.Leaf(1)

    def mute(self, pid: int) -> None:
        """Count ``pid``'s ioctls, but stream none of their outcomes: the daemon's own, whose
        searches of RM make and free a client for each client handle they check (30 000 checks
        cost a daemon 60 000 records to read; an H200, call 24D). At most 16 processes."""
        if self._bpf is None:
            raise ProbeError("the probe is not started")
        muted = self._bpf[b"muted"]
        try:
            muted[muted.Key(pid)] = muted.Leaf(1)
        except Exception as error:  # bcc raises bare Exception when the map is full
            raise ProbeError(f"cannot mute pid {pid}: {error}") from None

    def _attach_launches(self, bpf: Any, libcuda: Path | None) -> None:
        if libcuda is None:
            self.features["libcuda"] = False
            self.features["launch_symbols"] = "libcuda not found"
            return
        self.features["libcuda"] = str(libcuda)
        self._attach_calls(bpf, libcuda, "launch", LAUNCH_SYMBOLS, b"on_launch", None)
        # Threads waiting for their GPU work: entered and left (_activity).
        self._attach_calls(bpf, libcuda, "sync", SYNC_SYMBOLS, b"on_sync", b"on_synced")
        self._attach_calls(bpf, libcuda, "copy", COPY_SYMBOLS, b"on_sync", b"on_synced")
        # Threads polling for it: the answers "not ready".
        self._attach_calls(bpf, libcuda, "query", QUERY_SYMBOLS, None, b"on_queried")

    def _attach_calls(
        self,
        bpf: Any,
        libcuda: Path,
        kind: str,
        symbols: re.Pattern[str],
        entry: bytes | None,
        exit_: bytes | None,
    ) -> None:
        """Uprobes (given ``entry``) and uretprobes (given ``exit_``) on the functions of
        libcuda ``symbols`` names; ``features[kind + "_symbols"]`` names them,
        ``features[kind + "_uprobes"]`` counts the addresses probed."""
        path = str(libcuda).encode()
        try:
            found = bpf.get_user_functions_and_addresses(path, symbols.pattern.encode())
        except Exception as error:
            raise ProbeError(f"cannot read the symbols of {libcuda}: {error}") from None
        # Aliases share an address: one uprobe each, or a call would count once per name.
        addresses = sorted({probe_address(libcuda, int(address)) for _, address in found})
        if not (addresses and self._attach_multi(bpf, libcuda, addresses, entry, exit_)):
            try:
                for address in addresses:
                    if entry is not None:
                        bpf.attach_uprobe(name=path, addr=address, fn_name=entry)
                    if exit_ is not None:
                        bpf.attach_uretprobe(name=path, addr=address, fn_name=exit_)
            except Exception as error:
                raise ProbeError(f"cannot attach uprobes to {libcuda}: {error}") from None
        names = sorted({name.decode() for name, _ in found})
        self.features[f"{kind}_symbols"] = ",".join(names) if names else "none found"
        self.features[f"{kind}_uprobes"] = str(len(addresses))

    def _attach_multi(
        self,
        bpf: Any,
        libcuda: Path,
        addresses: Sequence[int],
        entry: bytes | None,
        exit_: bytes | None,
    ) -> bool:
        """Attach ``entry`` and ``exit_`` at ``addresses`` as uprobe-multi links, one per
        program (a daemon's exit then tears down a link per program, not a perf event per
        uprobe); whether it did. The first refusal turns them off for the probe's life, and
        ``features["uprobe_multi"]`` says why."""
        if not self._uprobe_multi:
            return False
        # The links take file offsets where bcc's attach takes the address and converts it.
        found_offsets = {file_offset(libcuda, address) for address in addresses}
        offsets = sorted(o for o in found_offsets if o is not None)
        made: list[int] = []
        try:
            if None in found_offsets:
                raise UprobeMultiError(0, "a function outside the library's loaded segments")
            for program, returns in ((entry, False), (exit_, True)):
                if program is None:
                    continue
                if program not in self._multi_programs:
                    self._multi_programs[program] = load_program(bpf, program)
                fd = self._multi_programs[program]
                made.append(link(fd, str(libcuda), offsets, returns=returns))
        except UprobeMultiError as error:
            for fd in made:
                os.close(fd)
            self._uprobe_multi = False
            self.features["uprobe_multi"] = f"refused ({error}): one perf event per uprobe"
            return False
        self._links += made
        self.features["uprobe_multi"] = "yes"
        return True

    def _open_output(self, bpf: Any) -> None:
        if self.features["output"] == "ringbuf":
            bpf[b"events"].open_ring_buffer(self._on_ringbuf)
        else:
            # Lost samples are counted in the kernel (a failed submit), not here as well.
            bpf[b"events"].open_perf_buffer(
                self._on_perf, page_cnt=self._buffer_pages, lost_cb=lambda _count: None
            )

    def _on_ringbuf(self, _ctx: Any, data: Any, size: int) -> int:
        self._pending.append(ctypes.string_at(data, size))
        # libbpf's ring_buffer__poll() reads for as long as the kernel keeps writing: under a
        # flood it would not return, and the caller would see neither its deadlines nor Ctrl-C.
        # A negative answer ends the poll; this record is taken, the next ones stay in the ring.
        return -1 if len(self._pending) >= MAX_POLL_RECORDS else 0

    def _on_perf(self, _cpu: int, data: Any, size: int) -> None:
        self._pending.append(ctypes.string_at(data, size))

    def close(self) -> None:
        bpf, self._bpf = self._bpf, None
        self._readers = {}
        links, self._links = self._links, []
        programs, self._multi_programs = self._multi_programs, {}
        for fd in (*links, *programs.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        if bpf is not None:
            bpf.cleanup()

    def __enter__(self) -> NvProbe:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------

    def _loaded(self) -> Any:
        if self._bpf is None:
            raise ProbeError("the probe is not started")
        return self._bpf

    def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]:
        """Streamed events that arrived, waiting up to ``timeout_ms`` for the first one (at most
        ``MAX_POLL_RECORDS`` from a ring buffer; a perf buffer gives what it holds)."""
        bpf = self._loaded()
        if self.features["output"] == "ringbuf":
            bpf.ring_buffer_poll(timeout_ms)
        else:
            bpf.perf_buffer_poll(timeout_ms)
        raw, self._pending = self._pending, []
        records = []
        for event in raw:
            try:
                records.append(wire.decode_event(event))
            except wire.WireError:
                self.bad_events += 1
        return records

    def counters(self) -> dict[int, CgroupCounters]:
        return build_counters(
            (
                (k.cgroup, k.node, k.code, bool(k.by_nr), _number(v))
                for k, v in self._items(b"ioctls")
            ),
            ((k.cgroup, k.value, _number(v)) for k, v in self._items(b"controls")),
            ((k.cgroup, k.value, _number(v)) for k, v in self._items(b"allocs")),
            ((k.cgroup, k.value, _number(v)) for k, v in self._items(b"latency")),
            (
                (
                    _number(k),
                    v.ioctls,
                    v.latency_ns,
                    v.opens,
                    v.mmaps,
                    v.launches,
                    v.syncs,
                    v.polls,
                )
                for k, v in self._items(b"stats")
            ),
        )

    def _activity(self, cgroup: int, stats: Any) -> int:
        """What the rm enforcer's sensor watches move: launches, synchronize calls and
        synchronous copies entered and query calls answered "not ready", plus one at each read
        that finds a thread of the cgroup inside a synchronize call or a synchronous copy. A
        loop waiting for a long kernel launches nothing while it runs, and to the sensor a count
        that stands still for its grace is an idle pod (enforcers/rm/sensor.py); left open
        beside the pod holding the GPU, both switched at every 1 us slice and stalled on an H100
        and an H200, whether it waited in a synchronize call or polled (BENCHMARKS.md,
        2026-11-27 and 2026-11-28)."""
        ticks = self._wait_ticks.get(cgroup, 0)
        if 0 < int(stats.waiting) < 1 << 63:  # a wrapped count is a lost return: not waiting
            ticks += 1
            self._wait_ticks[cgroup] = ticks
        calls = (int(stats.launches), int(stats.syncs), int(stats.polls))
        self.cuda_calls[cgroup] = calls
        return sum(calls) + ticks

    def launches(self) -> dict[int, int]:
        """CUDA activity per cgroup id (:meth:`_activity`): one map, read whole at the rm
        enforcer's polls of every pod (:meth:`launches_of` reads single cgroups)."""
        return {_number(k): self._activity(_number(k), v) for k, v in self._items(b"stats")}

    def launches_of(self, cgroups: Iterable[int]) -> dict[int, int]:
        """The activity counts of ``cgroups`` only, one map lookup each (no entry: none yet).

        A batch read of the whole map walks all of its buckets and has bcc allocate arrays for
        all of its entries; a look at the pod holding the GPU needs one or two cgroups
        (`make bench probemaps`).
        """
        table = self._loaded()[b"stats"]
        key, leaf = table.Key(), table.Leaf()
        lookup, fd = _libbcc().bpf_lookup_elem, table.map_fd
        found: dict[int, int] = {}
        for cgroup in cgroups:
            key.value = cgroup
            if lookup(fd, ctypes.byref(key), ctypes.byref(leaf)) == 0:
                found[cgroup] = self._activity(cgroup, leaf)
        return found

    def _items(self, name: bytes) -> list[tuple[Any, Any]]:
        """A map's entries, in batches where the kernel has BPF_MAP_LOOKUP_BATCH (5.6).

        bcc's item iteration costs two syscalls per entry; for the 40 cgroups of a GPU host a
        batch reads the launch counters in a quarter of the time and every counter map in a third
        (`sudo python tools/bench/run.py probemaps`, BENCHMARKS.md 2026-11-24).
        """
        table = self._loaded()[name]
        if self._batch_lookup:
            reader = self._readers.get(name)
            if reader is None:
                reader = self._readers[name] = BatchReader(table, _libbcc().bpf_lookup_batch)
            try:
                return reader.items()
            except MapBatchError:  # no batch ops in this kernel (before 5.6)
                self._batch_lookup = False
        return list(table.items())

    def forget(self, cgroups: Iterable[int]) -> int:
        """Drop the counters of cgroups that are gone, so that pod churn does not fill the maps
        (ids are never reused). Returns how many map entries were removed."""
        gone = set(cgroups)
        bpf = self._loaded()
        removed = 0
        for name in (b"ioctls", b"controls", b"allocs", b"latency"):
            table = bpf[name]
            for key in [key for key in table if key.cgroup in gone]:
                with contextlib.suppress(KeyError):
                    del table[key]
                    removed += 1
        stats = bpf[b"stats"]
        for cgroup in gone:
            self._wait_ticks.pop(cgroup, None)
            with contextlib.suppress(KeyError):
                del stats[stats.Key(cgroup)]
                removed += 1
        return removed

    def _meta(self, slot: int) -> int:
        table = self._loaded()[b"meta"]
        return int(table[table.Key(slot)].value)

    @property
    def lost(self) -> int:
        """Events the output buffer had no room for (userspace did not poll fast enough)."""
        return self._meta(wire.META_LOST)

    @property
    def map_full(self) -> int:
        """Counter updates dropped because a counter map was full."""
        return self._meta(wire.META_MAP_FULL)

    def node_of(self, major: int, minor: int) -> Node:
        return self.devices.node_of(major, minor)
