"""Which RM objects each process holds, built from its successful RM_ALLOC / RM_FREE traffic.

RM names objects by (client handle, object handle). Per process the tracker keeps the tree
client → device → subdevice / TSG → channel → engine objects (plus memory, VA spaces, events), the
bytes of device and system memory live, and the fd each client was allocated through: closing that
fd frees the client and everything under it, as the driver does. Failed calls change nothing. A
free removes the whole subtree, and with it the objects RM destroys as its dependents
(serverFreeResourceTree in 580.142's resserv invalidates them: their handles stay until freed,
but they no longer run): the TSGs and context shares made on a freed VA space, the channels that
run in a freed context share. A handle that is allocated again replaces the old object. Objects
whose parents were allocated before tracing began hang under a placeholder client. What RM makes
itself in a client (a TSG's graphics context, the two context shares of a TSG whose channels
name none) is never seen allocated: a free of one of those leaves the channels RM destroyed with
it in the tree, until the rm enforcer finds them lost (Tracker.forget).

The same tracker is fed by ``qpolicy trace --replay`` (a recorded trace) and by the eBPF probe.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Kind, Node
from qpolicy.nvrm.decode import Ioctl, decode
from qpolicy.nvrm.records import Record

SLOWEST_KEPT = 10
# The cgroups whose changes to the tracker are counted, at most (Tracker.changes_by_cgroup).
CGROUPS_COUNTED = 1024
# The kinds RM destroys other objects with (besides their children): see _depends_on.
_HOLDS_DEPENDENTS = frozenset({Kind.VASPACE, Kind.CONTEXT_SHARE})
# The handle fields each request needs to be applied to the object tree.
_HANDLES: dict[Escape, tuple[str, ...]] = {
    Escape.RM_ALLOC: ("hRoot", "hObjectParent", "hObjectNew"),
    Escape.RM_ALLOC_MEMORY: ("hRoot", "hObjectParent", "hObjectNew"),
    Escape.RM_FREE: ("hRoot", "hObjectOld"),
    Escape.RM_DUP_OBJECT: ("hClient", "hParent", "hObject", "hClientSrc", "hObjectSrc"),
    Escape.RM_CONTROL: ("hClient", "hObject"),
}


@dataclass(slots=True)
class RmObject:
    client: int
    handle: int
    cls: int
    kind: Kind
    parent: int | None
    bytes: int = 0
    dup: bool = False
    children: set[int] = field(default_factory=set)
    #: What RM destroys it with besides its parent (refAddDependant): a VA space, a share.
    depends_on: tuple[int, ...] = ()
    # What controls told us: timeslice_us, timeslice_sets, scheduled, work_submit_token.
    info: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Client:
    handle: int
    fd: int | None
    objects: dict[int, RmObject] = field(default_factory=dict)


@dataclass(slots=True)
class Slow:
    dur_ns: int
    ts: int
    name: str


@dataclass(slots=True)
class ProcessState:
    pid: int | None
    cgroup: int | None = None
    fds: dict[int, Node] = field(default_factory=dict)
    clients: dict[int, Client] = field(default_factory=dict)
    device_bytes: int = 0
    device_peak: int = 0
    system_bytes: int = 0
    system_peak: int = 0
    created: Counter[Kind] = field(default_factory=Counter)
    escapes: Counter[str] = field(default_factory=Counter)
    controls: Counter[str] = field(default_factory=Counter)
    allocs: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    other_ioctls: int = 0
    mmaps: int = 0
    opens: Counter[Node] = field(default_factory=Counter)
    slowest: list[tuple[int, int, str]] = field(default_factory=list)
    #: Clients may be missing: what is known was found by a search of RM that had not finished
    #: (qpolicy.nvrm.discover); such a process is searched again rather than taken as known.
    incomplete: bool = False
    #: The tracker's generation at this process's last change (Tracker.changed): what was
    #: written of it holds while this is unchanged.
    changed_at: int = 0

    def objects(self, kind: Kind) -> list[RmObject]:
        return [
            obj
            for client in self.clients.values()
            for obj in client.objects.values()
            if obj.kind is kind and not obj.dup
        ]


@dataclass(frozen=True, slots=True)
class ClientChannels:
    """One client's GPU work handles on one GPU, as the rm enforcer addresses them.

    A client holds one device object per GPU it uses (NV01_DEVICE_0, whose ``deviceId`` is RM's
    device instance), and its channels and TSGs hang below one of them. ``FIFO_DISABLE_CHANNELS``
    goes to the subdevice of that same device, over the fd the client lives on; ``SET_TIMESLICE``
    goes to each TSG. A client on two GPUs is two groups.
    """

    pid: int | None
    cgroup: int | None
    fd: int | None
    client: int
    subdevice: int | None
    channels: tuple[int, ...]
    tsgs: tuple[int, ...]
    #: The device object the channels hang below, and RM's instance number for it.
    device: int | None = None
    device_instance: int | None = None
    #: Per TSG (as ``tsgs``): how many times the tenant set its timeslice itself.
    timeslice_sets: tuple[int, ...] = ()
    #: Per TSG (as ``tsgs``): the value the tenant last set, where the probe read it.
    tenant_timeslices: tuple[int | None, ...] = ()
    #: The TSGs of ``tsgs`` with a compute engine object on one of their channels: one per CUDA
    #: context (the shipped H200 trace: 4 TSGs, the compute object on 8 channels of one).
    compute_tsgs: tuple[int, ...] = ()
    #: The channels of ``channels`` with a compute engine object of their own, each with its
    #: TSG: where a context's compute preemption mode is set (the trace: 8, in one TSG).
    compute_channels: tuple[tuple[int, int | None], ...] = ()

    def tenant_sets(self, tsg: int) -> int:
        """How many times the tenant set ``tsg``'s timeslice itself (0 if never, or unknown)."""
        try:
            return self.timeslice_sets[self.tsgs.index(tsg)]
        except (ValueError, IndexError):
            return 0

    def tenant_timeslice(self, tsg: int) -> int | None:
        """The timeslice the tenant last set on ``tsg`` itself (None if never, or not read)."""
        try:
            return self.tenant_timeslices[self.tsgs.index(tsg)]
        except (ValueError, IndexError):
            return None


@dataclass(frozen=True, slots=True)
class Summary:
    """What one process (or, summed, one cgroup) holds now and has done."""

    pid: int | None
    cgroup: int | None
    clients: int
    tsgs: int
    channels: dict[str, int]
    engines: dict[str, int]
    device_bytes: int
    device_peak: int
    system_bytes: int
    system_peak: int
    created: dict[str, int]
    escapes: dict[str, int]
    controls: dict[str, int]
    allocs: dict[str, int]
    failed: int
    other_ioctls: int
    mmaps: int
    opens: dict[str, int]
    slowest: tuple[Slow, ...]

    @property
    def channel_count(self) -> int:
        return sum(self.channels.values())

    @property
    def ioctls(self) -> int:
        return sum(self.escapes.values())


class Tracker:
    def __init__(self) -> None:
        self.processes: dict[int | None, ProcessState] = {}
        #: Changes to the processes, their files and their object trees so far: what is derived
        #: from those (summaries of what a cgroup holds, the channels to stop) holds while this is
        #: unchanged. Counting alone does not change it: the rm enforcer's own controls, five a
        #: second with ten busy pods, made every publish rebuild every summary (py-spy, H100,
        #: 2026-11-27).
        self.generation = 0
        #: What moved the generation, by cause: what makes everything derived from the tree
        #: (and the rm enforcer's handle file) be built again.
        self.changes: Counter[str] = Counter()
        #: The same per cgroup (None: not known): where the processes that keep changing it run,
        #: also those that exit at once (a monitoring agent's short queries).
        self.changes_by_cgroup: Counter[int | None] = Counter()
        #: The handle of the last client seen allocated, by any process: where a search of RM
        #: starts when the daemon cannot make a client of its own (qpolicy.enforcers.rm.unseen).
        #: Not a mark for the next daemon: a tenant may name its client's handle.
        self.newest_client: int | None = None

    def changed(
        self, cause: str, cgroup: int | None = None, proc: ProcessState | None = None
    ) -> None:
        """Note a change to the processes, their files or their object trees (moves the
        generation), made by a process of ``cgroup``: ``proc``, unless it is gone."""
        self.generation += 1
        if proc is not None:
            proc.changed_at = self.generation
        self.changes[cause] += 1
        self.changes_by_cgroup[cgroup] += 1
        if len(self.changes_by_cgroup) > CGROUPS_COUNTED:
            # Pods come and go for weeks: the busiest half is kept.
            kept = self.changes_by_cgroup.most_common(CGROUPS_COUNTED // 2)
            self.changes_by_cgroup = Counter(dict(kept))

    # -- feeding -------------------------------------------------------------------------------

    def feed(self, record: Record, node: Node | None = None) -> Ioctl | None:
        """Account one record; ``node`` overrides the fd's node (the probe knows the device).

        Returns the decoded ioctl for ioctl records on NVIDIA nodes.
        """
        known = self.processes.get(record.pid)
        if record.kind == "exit":
            self.changed("exit", known.cgroup if known is not None else record.cgroup)
            self.processes.pop(record.pid, None)
            return None
        # A new process, or one moved to another cgroup.
        moved = known is None or (record.cgroup is not None and record.cgroup != known.cgroup)
        proc = self._process(record.pid, record.cgroup)
        if moved:
            self.changed("process", record.cgroup, proc)
        if record.kind == "open":
            if record.ret >= 0:
                self.changed("open", proc.cgroup, proc)
                opened = node or Node.of_path(record.s)
                proc.fds[record.ret] = opened
                proc.opens[opened] += 1
            return None
        if record.kind == "close":
            self.changed("close", proc.cgroup, proc)
            self.close_fd(proc, record.a1)
            return None
        fd_node = node or proc.fds.get(record.fd)
        if record.kind == "mmap":
            if fd_node is not None and fd_node is not Node.OTHER:
                proc.mmaps += 1
            return None
        if fd_node is None or fd_node is Node.OTHER:
            proc.other_ioctls += 1
            return None
        ioctl = decode(fd_node, record.cmd, record.p, record.q)
        self._count(proc, record, ioctl)
        if ioctl.succeeded(record.ret):
            cause = self._apply(proc, record.fd, ioctl)
            if cause is not None:
                self.changed(cause, proc.cgroup, proc)
        else:
            proc.failed += 1
        return ioctl

    def feed_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.feed(record)

    def _process(self, pid: int | None, cgroup: int | None) -> ProcessState:
        proc = self.processes.get(pid)
        if proc is None:
            proc = self.processes[pid] = ProcessState(pid)
        if cgroup is not None:
            proc.cgroup = cgroup
        return proc

    @staticmethod
    def _count(proc: ProcessState, record: Record, ioctl: Ioctl) -> None:
        proc.escapes[ioctl.name] += 1
        if ioctl.control is not None:
            proc.controls[abi.control_name(ioctl.control)] += 1
        if ioctl.alloc_class is not None:
            proc.allocs[abi.class_name(ioctl.alloc_class)] += 1
        name = ioctl.control_name or (
            f"{ioctl.name} {abi.class_name(ioctl.alloc_class)}"
            if ioctl.alloc_class is not None
            else ioctl.name
        )
        entry = (record.dur_ns, record.ts, name)
        if len(proc.slowest) < SLOWEST_KEPT:
            heapq.heappush(proc.slowest, entry)
        elif entry > proc.slowest[0]:
            heapq.heapreplace(proc.slowest, entry)

    # -- the object tree -----------------------------------------------------------------------

    def _apply(self, proc: ProcessState, fd: int, ioctl: Ioctl) -> str | None:
        """Follow a call that succeeded in the object tree; what changed in it, if anything may
        have (the request's kind), else None."""
        f = ioctl.fields
        # A capture may hold only a prefix of the argument (and a tenant may send anything):
        # without its handles a request changes nothing the tracker can name.
        if ioctl.escape is None or any(key not in f for key in _HANDLES.get(ioctl.escape, ())):
            return None
        if ioctl.escape in (Escape.RM_ALLOC, Escape.RM_ALLOC_MEMORY):
            if ioctl.alloc_class is None:
                return None
            # RM_ALLOC_MEMORY describes memory by its last byte (limit), RM_ALLOC by its size.
            if ioctl.escape is Escape.RM_ALLOC:
                size = ioctl.params.get("size", 0)
            else:
                size = f["limit"] + 1 if "limit" in f else 0
            new = (f["hRoot"], f["hObjectParent"], f["hObjectNew"])
            self._alloc(proc, fd, *new, ioctl.alloc_class, size, ioctl.params)
            return "alloc"
        if ioctl.escape is Escape.RM_FREE:
            self._free(proc, f["hRoot"], f["hObjectOld"])
            return "free"
        if ioctl.escape is Escape.RM_DUP_OBJECT:
            self._dup(proc, f)
            return "dup"
        control = ioctl.control if ioctl.escape is Escape.RM_CONTROL else None
        if control is not None and self._control(
            proc, f["hClient"], f["hObject"], control, ioctl.params
        ):
            return "control"
        return None

    def _alloc(
        self,
        proc: ProcessState,
        fd: int,
        root: int,
        parent: int,
        handle: int,
        cls: int,
        size: int,
        params: dict[str, int] | None = None,
    ) -> None:
        kind = abi.class_kind(cls)
        if kind is Kind.CLIENT:
            self.newest_client = handle
            if handle in proc.clients:
                self._drop_client(proc, handle)
            client = Client(handle, fd)
            client.objects[handle] = RmObject(handle, handle, cls, kind, None)
            proc.clients[handle] = client
            proc.created[kind] += 1
            return
        found = proc.clients.get(root)
        if found is None:
            # Allocated before we started watching: keep its objects under a stand-in client.
            found = proc.clients[root] = Client(root, None)
            found.objects[root] = RmObject(root, root, 0, Kind.CLIENT, None)
        client = found
        if handle in client.objects:
            self._remove_subtree(proc, client, handle)
        obj = RmObject(root, handle, cls, kind, parent)
        obj.depends_on = _depends_on(kind, params or {})
        if kind is Kind.DEVICE and params and "deviceId" in params:
            obj.info["device_instance"] = params["deviceId"]
        if kind in abi.MEMORY_KINDS:
            obj.bytes = size
            self._add_bytes(proc, kind, size)
        client.objects[handle] = obj
        if parent in client.objects:
            client.objects[parent].children.add(handle)
        proc.created[kind] += 1

    def _free(self, proc: ProcessState, root: int, handle: int) -> None:
        if handle == root:
            self._drop_client(proc, root)
            return
        client = proc.clients.get(root)
        if client is not None and handle in client.objects:
            self._remove_subtree(proc, client, handle)

    def _dup(self, proc: ProcessState, f: dict[str, int]) -> None:
        client = proc.clients.get(f["hClient"])
        if client is None:
            return
        source_client = proc.clients.get(f["hClientSrc"])
        source = source_client.objects.get(f["hObjectSrc"]) if source_client else None
        cls = source.cls if source else 0
        kind = source.kind if source else Kind.OTHER
        handle = f["hObject"]
        if handle in client.objects:
            self._remove_subtree(proc, client, handle)
        client.objects[handle] = RmObject(client.handle, handle, cls, kind, f["hParent"], dup=True)
        if f["hParent"] in client.objects:
            client.objects[f["hParent"]].children.add(handle)

    @staticmethod
    def _control(
        proc: ProcessState, client_handle: int, handle: int, cmd: int, params: dict[str, int]
    ) -> bool:
        """Note what a control tells about its object; whether it told anything."""
        client = proc.clients.get(client_handle)
        obj = client.objects.get(handle) if client else None
        if obj is None:
            return False
        if cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE:
            # Counted whether or not the parameters were captured: libcuda sets its compute
            # TSG's timeslice itself, some 110 ms after allocating it (the shipped H200 trace),
            # over whatever an enforcer set in between.
            obj.info["timeslice_sets"] = obj.info.get("timeslice_sets", 0) + 1
            if "timesliceUs" in params:
                obj.info["timeslice_us"] = params["timesliceUs"]
        elif cmd in (abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, abi.NVA06F_CTRL_CMD_GPFIFO_SCHEDULE):
            if "bEnable" in params:
                obj.info["scheduled"] = params["bEnable"]
        elif (
            cmd == abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN and "workSubmitToken" in params
        ):
            obj.info["work_submit_token"] = params["workSubmitToken"]
        else:
            return False
        return True

    def _remove_subtree(self, proc: ProcessState, client: Client, handle: int) -> None:
        stack = [handle]
        while stack:
            obj = client.objects.pop(stack.pop(), None)
            if obj is None:
                continue
            stack.extend(obj.children)
            if obj.kind in _HOLDS_DEPENDENTS:
                stack.extend(h for h, o in client.objects.items() if obj.handle in o.depends_on)
            if obj.bytes and not obj.dup:
                self._add_bytes(proc, obj.kind, -obj.bytes)
            if obj.parent is not None and obj.parent in client.objects:
                client.objects[obj.parent].children.discard(obj.handle)
        # Objects whose parent is not tracked (allocated before tracing) are not reachable from
        # the client's tree; a freed client takes them along.

    def _drop_client(self, proc: ProcessState, handle: int) -> None:
        client = proc.clients.pop(handle, None)
        if client is None:
            return
        for obj in client.objects.values():
            if obj.bytes and not obj.dup:
                self._add_bytes(proc, obj.kind, -obj.bytes)

    @staticmethod
    def _add_bytes(proc: ProcessState, kind: Kind, delta: int) -> None:
        if kind is Kind.VIDMEM:
            proc.device_bytes += delta
            proc.device_peak = max(proc.device_peak, proc.device_bytes)
        elif kind in (Kind.SYSMEM, Kind.OS_DESCRIPTOR):
            proc.system_bytes += delta
            proc.system_peak = max(proc.system_peak, proc.system_bytes)

    def forget(self, pid: int | None, client: int, handles: Iterable[int]) -> bool:
        """Drop objects RM says ``client`` of ``pid`` no longer has (with what is below them and
        depends on them): what RM destroyed with an object the probe never saw made, such as a
        TSG's graphics context. Whether anything was dropped."""
        proc = self.processes.get(pid)
        found = proc.clients.get(client) if proc is not None else None
        if proc is None or found is None:
            return False
        gone = [handle for handle in handles if handle in found.objects and handle != client]
        for handle in gone:
            self._remove_subtree(proc, found, handle)
        if gone:
            self.changed("forget", proc.cgroup, proc)
        return bool(gone)

    def close_fd(self, proc: ProcessState, fd: int) -> None:
        """The driver frees the clients allocated through an fd when it is closed."""
        proc.fds.pop(fd, None)
        for handle in [h for h, client in proc.clients.items() if client.fd == fd]:
            self._drop_client(proc, handle)

    def adopt(self, proc: ProcessState) -> None:
        """Take ``proc`` whole, its object tree learnt elsewhere (a previous daemon's tracker,
        checked against RM), in place of whatever is known of its pid. Its objects' children and
        its bytes are derived here from the objects' parent links and sizes."""
        self.changed("adopt", proc.cgroup, proc)
        self._derive(proc)
        self.processes[proc.pid] = proc

    def add_clients(self, proc: ProcessState) -> None:
        """Add the clients of ``proc``, found by asking RM (qpolicy.nvrm.discover), to what is
        known of its pid. A client known on a file is kept as it is; one known only from objects
        seen below it (its allocation was not seen) takes the found client's file and objects,
        and keeps its own objects the search did not find (allocated since)."""
        known = self.processes.get(proc.pid)
        if known is None:
            self.adopt(proc)
            return
        self.changed("found", known.cgroup or proc.cgroup, known)
        known.incomplete = proc.incomplete
        if known.cgroup is None:
            known.cgroup = proc.cgroup
        for fd, node in proc.fds.items():
            known.fds.setdefault(fd, node)
        for handle, client in proc.clients.items():
            mine = known.clients.get(handle)
            if mine is not None and mine.fd is not None:
                continue
            if mine is not None:
                for obj in mine.objects.values():
                    if obj.handle != handle:
                        client.objects.setdefault(obj.handle, obj)
            known.clients[handle] = client
        self._derive(known)

    def _derive(self, proc: ProcessState) -> None:
        """``proc``'s objects' children, from their parent links, and its bytes."""
        proc.device_bytes = proc.system_bytes = 0
        for client in proc.clients.values():
            for obj in client.objects.values():
                obj.children.clear()
            for obj in client.objects.values():
                above = client.objects.get(obj.parent) if obj.parent is not None else None
                if above is not None and above is not obj:
                    above.children.add(obj.handle)
                if obj.bytes and not obj.dup:
                    self._add_bytes(proc, obj.kind, obj.bytes)

    # -- reading -------------------------------------------------------------------------------

    def summary(self, pid: int | None) -> Summary:
        proc = self.processes[pid]
        channels: Counter[str] = Counter()
        engines: Counter[str] = Counter()
        for client in proc.clients.values():
            for obj in client.objects.values():
                if obj.dup:
                    continue
                if obj.kind is Kind.CHANNEL:
                    channels[abi.class_name(obj.cls)] += 1
                elif obj.kind in abi.ENGINE_KINDS:
                    engines[abi.class_name(obj.cls)] += 1
        return Summary(
            pid=proc.pid,
            cgroup=proc.cgroup,
            clients=len(proc.clients),
            tsgs=len(proc.objects(Kind.TSG)),
            channels=dict(channels),
            engines=dict(engines),
            device_bytes=proc.device_bytes,
            device_peak=proc.device_peak,
            system_bytes=proc.system_bytes,
            system_peak=proc.system_peak,
            created={kind.value: count for kind, count in proc.created.items()},
            escapes=dict(proc.escapes),
            controls=dict(proc.controls),
            allocs=dict(proc.allocs),
            failed=proc.failed,
            other_ioctls=proc.other_ioctls,
            mmaps=proc.mmaps,
            opens={node.value: count for node, count in proc.opens.items()},
            slowest=tuple(
                Slow(dur, ts, name) for dur, ts, name in sorted(proc.slowest, reverse=True)
            ),
        )

    def channel_groups(self, pid: int | None) -> list[ClientChannels]:
        """Per client of ``pid`` and GPU it holds channels on: what it takes to stop and resume
        them (the subdevice of the channels' own device, never another GPU's)."""
        proc = self.processes.get(pid)
        if proc is None:
            return []
        groups: list[ClientChannels] = []
        for client in proc.clients.values():
            owned = [obj for obj in client.objects.values() if not obj.dup]
            # The TSGs with a compute object on one of their channels: a CUDA context each.
            computing = {tsg for _, tsg in self._computing(client) if tsg is not None}
            by_device: dict[int | None, list[RmObject]] = {}
            for obj in owned:
                if obj.kind in (Kind.CHANNEL, Kind.TSG, Kind.SUBDEVICE):
                    by_device.setdefault(self._device_of(client, obj), []).append(obj)
            for device, objects in by_device.items():
                channels = tuple(sorted(o.handle for o in objects if o.kind is Kind.CHANNEL))
                if not channels:
                    continue
                tsgs = sorted((o for o in objects if o.kind is Kind.TSG), key=lambda o: o.handle)
                subdevices = sorted(o.handle for o in objects if o.kind is Kind.SUBDEVICE)
                device_obj = client.objects.get(device) if device is not None else None
                groups.append(
                    ClientChannels(
                        pid=proc.pid,
                        cgroup=proc.cgroup,
                        fd=client.fd,
                        client=client.handle,
                        subdevice=subdevices[0] if subdevices else None,
                        channels=channels,
                        tsgs=tuple(o.handle for o in tsgs),
                        device=device,
                        device_instance=(
                            device_obj.info.get("device_instance") if device_obj else None
                        ),
                        timeslice_sets=tuple(o.info.get("timeslice_sets", 0) for o in tsgs),
                        tenant_timeslices=tuple(o.info.get("timeslice_us") for o in tsgs),
                        compute_tsgs=tuple(o.handle for o in tsgs if o.handle in computing),
                        compute_channels=tuple(
                            sorted(
                                (channel, tsg)
                                for channel, tsg in self._computing(client)
                                if channel in channels
                            )
                        ),
                    )
                )
        return groups

    def compute_channels(self, pid: int | None) -> list[tuple[int, int, int | None]]:
        """(client, channel, its TSG) of each channel of ``pid`` that holds a compute engine
        object: the channels a kernel runs on, which preemption controls are about."""
        proc = self.processes.get(pid)
        if proc is None:
            return []
        return sorted(
            (client.handle, channel, tsg)
            for client in proc.clients.values()
            for channel, tsg in self._computing(client)
        )

    @staticmethod
    def _computing(client: Client) -> Iterator[tuple[int, int | None]]:
        """(channel, its TSG or None) of each channel of ``client`` that holds a compute engine
        object of its own (not a duplicate)."""
        for obj in client.objects.values():
            if obj.kind is not Kind.COMPUTE or obj.dup or obj.parent is None:
                continue
            channel = client.objects.get(obj.parent)
            if channel is None or channel.kind is not Kind.CHANNEL:
                continue
            above = client.objects.get(channel.parent) if channel.parent is not None else None
            yield (
                channel.handle,
                above.handle if above is not None and above.kind is Kind.TSG else None,
            )

    @staticmethod
    def _device_of(client: Client, obj: RmObject) -> int | None:
        """The device object ``obj`` hangs below (None: its chain leaves what was traced)."""
        seen = 0
        parent = obj.parent
        while parent is not None and seen < 64:  # a handle loop cannot hang the daemon
            above = client.objects.get(parent)
            if above is None:
                return None
            if above.kind is Kind.DEVICE:
                return above.handle
            parent, seen = above.parent, seen + 1
        return None

    def handles(self, pid: int | None, kind: Kind) -> list[tuple[int, int]]:
        """(client, object) handles of ``kind`` a process holds, e.g. for channel controls."""
        proc = self.processes.get(pid)
        if proc is None:
            return []
        return sorted((obj.client, obj.handle) for obj in proc.objects(kind))


def _depends_on(kind: Kind, params: dict[str, int]) -> tuple[int, ...]:
    """The objects RM makes a new one the dependent of, from its allocation's parameters
    (580.142): a TSG and a context share depend on the VA space they name
    (kchangrpapiConstruct_IMPL, kctxshareapiConstruct_IMPL), a channel on the context share it
    names or, made without a TSG, on its VA space (kchannelConstruct_IMPL)."""
    names: tuple[str, ...]
    if kind in (Kind.TSG, Kind.CONTEXT_SHARE):
        names = ("hVASpace",)
    elif kind is Kind.CHANNEL:
        names = ("hContextShare", "hVASpace")
    else:
        return ()
    return tuple(params[name] for name in names if params.get(name))
