"""What RM holds of a process the probe never saw, found by asking RM handle by handle.

The rm enforcer learns a process's RM clients, TSGs and channels from the RM_ALLOC traffic the
eBPF probe sees. A process that allocated them while no daemon ran (it started before qpolicy was
installed, or during a daemon's restart) is invisible that way, and RM offers no call that lists a
client's objects. It does answer, for one handle at a time, whether a client holds it and what it
is (``NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO``: its class or its parent). So the objects are found
by asking, through the tenant's own ``/dev/nvidiactl`` descriptor, about the handles they can have:

* **clients.** RM chooses client handles: ``RS_CLIENT_HANDLE_BASE`` (0xC1D00000) plus a 20-bit
  index (``RS_CLIENT_HANDLE_MAX`` 0x100000) taken from one counter for the whole system that only
  grows, wrapping (resserv.h; rs_server.c, ``serverAllocClient``). RM answers on a file only for
  the clients that live on it (client.c, ``rmclientValidate``: strict validation compares the
  file). But every question about a client handle that does not exist writes a line to the
  kernel log (``RmDeprecatedGetControlHandler``, rmapi_deprecated_control.c, at LEVEL_ERROR: one
  line per question on an H200, call 23I; asking all 2^20 filled the log in call 23H), and a
  refusal does not tell a missing client from another file's. So each client handle is first
  checked without a question (``in_use``: the daemon makes a client *at* that handle,
  rmctl.ClientCheck; RM refuses where one exists, silently: 2 050 checks, no log line, call
  24C), and only the handles a client holds are asked, newest first from the newest there is
  (one the daemon makes itself), each on each of the process's control descriptors, until the
  first client with channels; down to a mark (a client a daemon made itself, after which its
  probe saw every client made: a daemon that restarts finds its predecessor's in the handles
  file), or through every handle where there is none. Where handles cannot be checked, only
  the range above a mark is asked, and every refusal is counted against a :class:`Refusals`
  budget. Client handles the tracker already knows (objects were seen below them) are asked
  first: they exist.
* **objects.** Clients choose their objects' handles. libcuda numbers them one after another
  (0x5c000001, 0x5c000002, ... in the shipped H200 trace; its second client 0xa55a0000,
  0xa55a0010, ...). RM names one of them: the client's first device
  (``NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE``, client_resource.c,
  ``cliresCtrlCmdClientGetChildHandle``: ``refFindChildOfType``, which takes RM's internal class
  id, not the class number: call 23A, an H200, found every client and no device until it asked
  for Device's, :data:`~qpolicy.nvrm.abi.NVOC_CLASS_ID_DEVICE`). A device with no TSG or channel
  below it (asked the same way) ends the client's search: there is no work to govern. Otherwise
  the handles above the device are asked until :data:`GAP` in a row name nothing, and those
  below it until :data:`GAP_BELOW` do. A CUDA context's TSGs and channels are allocated with its
  device, so they are near it; objects past a run of more than :data:`GAP` freed handles are not
  found (memory the process allocated later, which the rm enforcer does not need to stop it).
  Only the client's first device is looked below: a client whose first device holds no work and
  a later one does is not governed.

What is found carries no byte counts and no record of what the tenant set (its timeslices), and an
object duplicated into the client (RM_DUP_OBJECT) is taken as its own. Nothing here is trusted
beyond what RM answered at the time; the rm enforcer checks a descriptor and its process before
each use, as for any other.

A search runs in slices: :meth:`Search.step` works for the time it is given and returns, and the
daemon gives it a few milliseconds a tick.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.abi import Kind, Node
from qpolicy.nvrm.tracker import Client, ProcessState, RmObject

#: resserv.h: the first client handle RM gives out, and how many it numbers before wrapping.
CLIENT_HANDLE_BASE = 0xC1D00000
CLIENT_HANDLE_COUNT = 0x100000
#: Handles in a row that name nothing before an object search stops above the device. libcuda's
#: objects lie one after another (the shipped trace's largest hole is 2 handles, 15 in its
#: second client, which numbers by 0x10); a run of freed handles longer than this hides what
#: lies past it. Each handle asked costs 4.5-9 us from Python (an H200, calls 23A-E), so the
#: misses are 20-40 ms of the daemon's CPU per client with work.
GAP = 4096
#: The same below the device: what libcuda allocates before it (one object in the shipped trace).
GAP_BELOW = 256
#: How often a slice looks at the clock (a control takes microseconds; the clock is not free).
CHECK_EVERY = 16


#: Whether RM holds a client handle (rmctl.ClientCheck.in_use); None where it cannot tell.
InUse = Callable[[int], "bool | None"]


class Asker(Protocol):
    """RM's answers about one client's handles, over one descriptor (tests stand in for RM)."""

    def info(self, client: int, handle: int, index: int) -> int | None:
        """``GET_HANDLE_INFO``: the object's class or parent; None where RM says no."""
        ...

    def child(self, client: int, parent: int, cls: int) -> int | None:
        """``GET_CHILD_HANDLE``: the handle of ``parent``'s first child of RM's internal class
        id ``cls``."""
        ...


def client_handles(newest: int | None, oldest: int | None = None) -> Iterator[int]:
    """Client handles from ``newest`` back to the one after ``oldest`` (not included), or through
    all of them: the index counter only grows and wraps, so those just below the newest are the
    latest."""
    start = 0 if newest is None else (newest - CLIENT_HANDLE_BASE) % CLIENT_HANDLE_COUNT
    count = CLIENT_HANDLE_COUNT
    if oldest is not None:
        count = (start - (oldest - CLIENT_HANDLE_BASE)) % CLIENT_HANDLE_COUNT
    for step in range(count):
        yield CLIENT_HANDLE_BASE + (start - step) % CLIENT_HANDLE_COUNT


def client_before(handle: int) -> int:
    """The client handle RM gave out just before ``handle``."""
    index = (handle - CLIENT_HANDLE_BASE - 1) % CLIENT_HANDLE_COUNT
    return CLIENT_HANDLE_BASE + index


class BudgetSpent(Exception):
    """A search asked as many client handles RM could not name as it was allowed."""


@dataclass
class Refusals:
    """Client handles RM refused to name: each may be one that does not exist, and have written a
    line to the kernel log. Shared by the searches of one daemon; :meth:`spend` raises
    :class:`BudgetSpent` past ``limit``."""

    limit: int
    spent: int = 0

    def spend(self) -> None:
        self.spent += 1
        if self.spent > self.limit:
            raise BudgetSpent(
                f"stopped after {self.limit} client handles RM could not name (each one that does "
                "not exist writes a line to the kernel log)"
            )


@dataclass
class FoundClient:
    """One client found on a descriptor, and its objects: handle -> (class, parent)."""

    fd: int
    handle: int
    objects: dict[int, tuple[int, int | None]] = field(default_factory=dict)

    @property
    def channels(self) -> int:
        return sum(1 for cls, _ in self.objects.values() if abi.class_kind(cls) is Kind.CHANNEL)


# A search is a generator that yields None after each control it sends, and a client once its
# objects are known: Search.step runs it for as long as it is given.
Steps = Generator["FoundClient | None", None, None]


def find_objects(ask: Asker, fd: int, client: int, client_class: int) -> Steps:
    """The objects of ``client`` near its first device, the device included (nothing where the
    client has no device: it holds no GPU work). A device with neither a TSG nor a channel below
    it is all there is to know: the client has no work to govern, and its other objects are
    not asked for."""
    device = ask.child(client, client, abi.NVOC_CLASS_ID_DEVICE)
    yield None
    if device is None:
        return
    found = FoundClient(fd, client, {client: (client_class, None)})
    work = ask.child(client, device, abi.NVOC_CLASS_ID_CHANNEL_GROUP)
    yield None
    if work is None:
        work = ask.child(client, device, abi.NVOC_CLASS_ID_CHANNEL)
        yield None
    if work is None:
        device_class = ask.info(client, device, abi.HANDLE_INFO_INDEX_CLASSID)
        yield None
        found.objects[device] = (device_class or 0, client)
        yield found
        return
    for direction, gap in ((-1, GAP_BELOW), (1, GAP)):
        handle = device if direction < 0 else device + 1
        misses = 0
        while misses < gap and 0 < handle <= 0xFFFFFFFF:
            cls = ask.info(client, handle, abi.HANDLE_INFO_INDEX_CLASSID)
            yield None
            if cls is None or handle == client:
                misses += 1
            else:
                parent = ask.info(client, handle, abi.HANDLE_INFO_INDEX_PARENT)
                yield None
                found.objects[handle] = (cls, parent or None)
                misses = 0
            handle += direction
    yield found


def search_clients(
    askers: Mapping[int, Asker],
    newest: int | None,
    oldest: int | None,
    refusals: Refusals,
    known: Iterable[int] = (),
    in_use: InUse | None = None,
) -> Steps:
    """The clients with GPU objects on the descriptors ``askers`` ask through (fd -> asker): the
    ``known`` handles first, then those from ``newest`` down to ``oldest`` (not included; no
    range where either is None: never the whole space), each on each descriptor (see the module's
    docstring); the search ends at the first client that holds channels. With ``in_use``, a
    handle of the range is first checked (silently); one no client holds is not asked, and a
    refusal of one that is held (another file's client) writes no log line and spends nothing."""
    span = client_handles(newest, oldest) if newest is not None and oldest is not None else ()
    known = tuple(known)
    seen: set[int] = set()
    for handle in itertools.chain(known, span):
        if handle in seen:
            continue
        seen.add(handle)
        held: bool | None = True if handle in known else None
        if held is None and in_use is not None:
            held = in_use(handle)
            yield None
            if held is False:
                continue
        for fd, ask in askers.items():
            cls = ask.info(handle, handle, abi.HANDLE_INFO_INDEX_CLASSID)
            yield None
            if cls is None:
                if held is None:
                    refusals.spend()
                continue
            if abi.class_kind(cls) is not Kind.CLIENT:
                continue
            work = False
            for step in find_objects(ask, fd, handle, cls):
                yield step
                work = work or (step is not None and step.channels > 0)
            if work:
                return
            break  # a client lives on one file


AskerFactory = Callable[[int, int], tuple[Asker, Callable[[], None]]]


class Search:
    """The search of one process's ``/dev/nvidiactl`` descriptors, run a slice at a time."""

    def __init__(
        self,
        pid: int,
        fds: Mapping[int, Node],
        newest: int | None,
        askers: AskerFactory,
        clock: Callable[[], float] = time.monotonic,
        *,
        oldest: int | None,
        refusals: Refusals,
        known: Iterable[int] = (),
        in_use: InUse | None = None,
    ) -> None:
        self.pid = pid
        self.fds = dict(fds)
        self.newest = newest
        self.oldest = oldest
        self.known = tuple(known)
        self.refusals = refusals
        self.in_use = in_use
        self._askers = askers
        self._clock = clock
        self.found: list[FoundClient] = []
        #: Controls sent so far.
        self.asked = 0
        #: Why the search ended early (a descriptor or the process went away), if it did.
        self.error: str | None = None
        self._steps: Steps | None = self._run()

    @property
    def done(self) -> bool:
        return self._steps is None

    def _run(self) -> Steps:
        askers: dict[int, Asker] = {}
        releases: list[Callable[[], None]] = []
        try:
            # nvidia.ko allocates clients on the control device only (escape.c, RM_ALLOC).
            for fd in sorted(fd for fd, node in self.fds.items() if node is Node.CTL):
                ask, release = self._askers(self.pid, fd)
                askers[fd] = ask
                releases.append(release)
            steps = search_clients(
                askers, self.newest, self.oldest, self.refusals, self.known, self.in_use
            )
            for step in steps:
                if step is None:
                    self.asked += 1  # each None follows one control
                yield step
        finally:
            for release in releases:
                release()

    def step(self, budget_s: float) -> list[FoundClient]:
        """Search for about ``budget_s``; the clients completed in that time. A descriptor or a
        process that went away ends the search (:attr:`error` says why)."""
        steps = self._steps
        if steps is None:
            return []
        deadline = self._clock() + budget_s
        new: list[FoundClient] = []
        try:
            for count, step in enumerate(steps, 1):
                if step is not None:
                    self.found.append(step)
                    new.append(step)
                if count % CHECK_EVERY == 0 and self._clock() >= deadline:
                    return new
        except (rmctl.RmError, BudgetSpent) as error:
            self.error = str(error)
        self._steps = None
        return new

    def close(self) -> None:
        """Stop early (the process exited, the daemon stops); descriptors are given back."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None


def process_state(
    pid: int,
    cgroup: int | None,
    fds: Mapping[int, Node],
    found: list[FoundClient],
    *,
    incomplete: bool = False,
) -> ProcessState:
    """The tracker's view of ``pid`` made of what a search found (``incomplete``: so far)."""
    proc = ProcessState(pid, cgroup=cgroup, fds=dict(fds), incomplete=incomplete)
    for client in found:
        objects = {
            handle: RmObject(client.handle, handle, cls, abi.class_kind(cls), parent)
            for handle, (cls, parent) in client.objects.items()
        }
        proc.clients[client.handle] = Client(client.handle, client.fd, objects)
    return proc


def borrowed_asker(pid: int, fd: int) -> tuple[Asker, Callable[[], None]]:
    """A :class:`~qpolicy.nvrm.rmctl.HandleAsker` on a copy of ``pid``'s ``fd``, and how to
    give the copy back."""
    mine = rmctl.borrow_fd(pid, fd)
    return rmctl.HandleAsker(mine), lambda: os.close(mine)
