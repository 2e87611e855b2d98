"""RM's answers about handles, as NVIDIA's open driver (580.142) gives them: a double for
qpolicy.nvrm.discover's searches. What it models, and where from:

* ``NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO`` (client_resource.c,
  ``cliresCtrlCmdClientGetHandleInfo``): sent to a client, it answers only on the file the client
  lives on (client.c, ``rmclientValidate``, strict validation: ``NV_ERR_INVALID_CLIENT`` 0x23;
  measured on an H200, call 23A: 0x23 for each of the 2^20 - 1 other client handles asked); a
  handle the client does not hold: ``NV_ERR_OBJECT_NOT_FOUND`` (rs_client.c,
  ``clientGetResourceRef``); index CLASSID: the object's class number (``externalClassId``), the
  client's own NV01_ROOT_CLIENT (escape.c forces that class on user clients); index PARENT: the
  parent's handle, 0 for the client.
* ``NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE`` (``cliresCtrlCmdClientGetChildHandle`` and
  ``refFindChildOfType``, rs_resource.c): the first child of the parent whose RM-internal class id
  is the one asked (Device's 0xe0ac20, g_device_nvoc.h; a TSG's 0x2b5b80 and a channel's
  0x5d8d70); asked by class number it finds nothing (call 23A). Which child is "first" is RM's
  index order; here, the lowest handle (libcuda numbers its objects upwards: the shipped trace).
* A control sent to a client handle that does not exist writes a kernel log line
  (``RmDeprecatedGetControlHandler``, rmapi_deprecated_control.c; call 23I: one per question),
  one that exists on another file none: counted in ``logged``.
* A client allocated at a named handle (rmctl.ClientCheck): ``NV_ERR_INSERT_DUPLICATE_NAME`` where
  a client holds it, on any file (rs_server.c, ``_serverCreateEntryAndLockForNewClient``);
  otherwise made and freed again. Neither logs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

from qpolicy.nvrm import abi, discover, rmctl
from qpolicy.nvrm.replay import builtin_records
from qpolicy.nvrm.tracker import ProcessState, Tracker


def traced_process(pid: int, cgroup: int = 55) -> ProcessState:
    """The shipped H200 trace's process (PyTorch's matmul) as ``pid``: client 0xc1d0001b on fd 8
    with its TSGs and channels, client 0xc1d0001d on fd 17 with a device and nothing below it."""
    tracker = Tracker()
    for record in builtin_records():
        if record.kind != "exit":
            tracker.feed(dataclasses.replace(record, pid=pid, cgroup=cgroup))
    return tracker.processes[pid]


NV_ERR_INVALID_CLIENT = 0x23
NV_ERR_OBJECT_NOT_FOUND = 0x57


def internal_class(cls: int) -> int | None:
    """RM's internal class id of an object of class number ``cls`` (those the double knows)."""
    if cls == 0x0080:
        return abi.NVOC_CLASS_ID_DEVICE
    if abi.class_kind(cls) is abi.Kind.TSG:
        return abi.NVOC_CLASS_ID_CHANNEL_GROUP
    if abi.class_kind(cls) is abi.Kind.CHANNEL:
        return abi.NVOC_CLASS_ID_CHANNEL
    return None


class RmDouble:
    def __init__(self) -> None:
        #: client -> ((pid, fd) it lives on, {handle: (class, parent)})
        self.clients: dict[int, tuple[tuple[int, int], dict[int, tuple[int, int]]]] = {}
        self.asked = 0
        self.refusals: Counter[int] = Counter()
        self.open: set[tuple[int, int]] = set()
        self.fail_after: int | None = None
        #: Kernel log lines written: questions about a client that does not exist.
        self.logged = 0
        #: Client handles checked by allocating a client at them.
        self.checked = 0
        self.check_closed = False

    def in_use(self, handle: int) -> bool | None:
        """rmctl.ClientCheck.in_use: whether any file holds a client ``handle``."""
        self.checked += 1
        return handle in self.clients

    def close(self) -> None:
        self.check_closed = True

    def add(self, pid: int, fd: int, client: int, objects: dict[int, tuple[int, int]]) -> None:
        self.clients[client] = ((pid, fd), {client: (abi.NV01_ROOT_CLIENT, 0), **objects})

    def add_process(self, proc: ProcessState) -> None:
        """Everything ``proc`` holds (a tracker's view), on the files it was allocated on."""
        assert proc.pid is not None
        for client in proc.clients.values():
            assert client.fd is not None
            objects = {
                o.handle: (o.cls, o.parent or 0)
                for o in client.objects.values()
                if o.handle != client.handle
            }
            self.add(proc.pid, client.fd, client.handle, objects)

    def asker(self, pid: int, fd: int) -> tuple[discover.Asker, Callable[[], None]]:
        self.open.add((pid, fd))
        return _Ask(self, (pid, fd)), lambda: self.open.discard((pid, fd))


class _Ask:
    def __init__(self, rm: RmDouble, file: tuple[int, int]) -> None:
        self.rm = rm
        self.file = file

    def _client(self, client: int) -> dict[int, tuple[int, int]] | None:
        rm = self.rm
        rm.asked += 1
        if rm.fail_after is not None and rm.asked > rm.fail_after:
            raise rmctl.RmError("RM control on fd 8 failed: Bad file descriptor")
        held = rm.clients.get(client)
        if held is None:
            rm.logged += 1
        if held is None or held[0] != self.file:
            rm.refusals[NV_ERR_INVALID_CLIENT] += 1
            return None
        return held[1]

    def info(self, client: int, handle: int, index: int) -> int | None:
        objects = self._client(client)
        if objects is None:
            return None
        if handle not in objects:
            self.rm.refusals[NV_ERR_OBJECT_NOT_FOUND] += 1
            return None
        cls, parent = objects[handle]
        return cls if index == abi.HANDLE_INFO_INDEX_CLASSID else parent

    def child(self, client: int, parent: int, cls: int) -> int | None:
        objects = self._client(client)
        if objects is None:
            return None
        children = sorted(
            h
            for h, (c, p) in objects.items()
            if p == parent and h != client and internal_class(c) == cls
        )
        return children[0] if children else None
