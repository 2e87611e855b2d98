"""Bad input to qgpu's control interface: the generic netlink family and /sys/kernel/qgpu.

Commands come only from CAP_NET_ADMIN in the initial user namespace; a malformed or refused
message answers an error and changes nothing (kmod/uapi/qgpu.h: "every command is all or
nothing"). Messages are built byte by byte on a raw NETLINK_GENERIC socket, so that lengths,
types and framing can be wrong in ways pyroute2 would not send. "Changes nothing" is checked on
the module's whole answer to CGROUP_GET and GPU_GET, attribute by attribute.
"""

from __future__ import annotations

import copy
import ctypes
import errno
import json
import os
import random
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qpolicy.enforcers.kmod.uapi import (
    A_MAX,
    GENL_NAME,
    GENL_VERSION,
    MAX_GPUS,
    MCGRP_EVENTS,
    OFFLINE_TIMESLICE_DEFAULT_US,
    ONLINE_TIMESLICE_DEFAULT_US,
    PERIOD_DEFAULT_US,
    PERIOD_MAX_US,
    PERIOD_MIN_US,
    SHARE_MAX,
    TIMESLICE_MAX_US,
    Attr,
    Cmd,
    Policy,
    Preemption,
)
from tests.vm.nvmock import BAD_KERNEL_LOG, kernel_log
from tests.vm.qgpu_env import SYSFS, Cgroup, cgroups, module_loaded

# -- a raw generic netlink socket --------------------------------------------------------------

NETLINK_GENERIC = 16
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
CTRL_ATTR_MCAST_GROUPS = 7
CTRL_ATTR_MCAST_GRP_NAME = 1
CTRL_ATTR_MCAST_GRP_ID = 2
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGERR_ATTR_MSG = 1
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_ECHO = 0x8
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000
NLA_F_NET_BYTEORDER = 0x4000
NLA_TYPE_MASK = ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER) & 0xFFFF
NLMSGHDR = struct.Struct("=IHHII")  # len type flags seq pid
GENLHDR = struct.Struct("=BBH")  # cmd version reserved
NLAHDR = struct.Struct("=HH")  # len type

CLONE_NEWUSER = 0x10000000
NOBODY = 65534

# The attributes a SET may carry, with their width and the range the policy allows.
WIDTH = {
    Attr.GPU: 4,
    Attr.POLICY: 1,
    Attr.PERIOD_US: 4,
    Attr.CGROUP_ID: 8,
    Attr.CLASS: 1,
    Attr.SHARE: 4,
    Attr.MEM_LIMIT: 8,
    Attr.OFFLINE_TIMESLICE_US: 4,
    Attr.ONLINE_TIMESLICE_US: 4,
    Attr.OFFLINE_PREEMPTION: 1,
}
RANGE = {
    Attr.GPU: (0, MAX_GPUS - 1),
    Attr.POLICY: (0, Policy.BURST_SHARE),
    Attr.PERIOD_US: (PERIOD_MIN_US, PERIOD_MAX_US),
    Attr.CGROUP_ID: (0, (1 << 64) - 1),
    Attr.CLASS: (0, 1),
    Attr.SHARE: (1, SHARE_MAX),
    Attr.MEM_LIMIT: (0, (1 << 64) - 1),
    Attr.OFFLINE_TIMESLICE_US: (0, TIMESLICE_MAX_US),
    Attr.ONLINE_TIMESLICE_US: (0, TIMESLICE_MAX_US),
    Attr.OFFLINE_PREEMPTION: (0, Preemption.CTA),
}
GPU_SETTINGS = (
    Attr.POLICY,
    Attr.PERIOD_US,
    Attr.OFFLINE_TIMESLICE_US,
    Attr.ONLINE_TIMESLICE_US,
    Attr.OFFLINE_PREEMPTION,
)
DEFAULT_SLICES = (OFFLINE_TIMESLICE_DEFAULT_US, ONLINE_TIMESLICE_DEFAULT_US)
FORMAT = {1: "=B", 2: "=H", 4: "=I", 8: "=Q"}


def nla(kind: int, payload: bytes, *, length: int | None = None) -> bytes:
    """One attribute; ``length`` overrides nla_len (the bytes sent stay ``payload``)."""
    size = NLAHDR.size + len(payload) if length is None else length
    data = NLAHDR.pack(size, kind) + payload
    return data + bytes(-len(data) % 4)


def put(attr: int, value: int, width: int | None = None) -> bytes:
    """An integer attribute, in its own width unless told otherwise."""
    size = width if width is not None else WIDTH[Attr(attr)]
    return nla(attr, struct.pack(FORMAT[size], value & ((1 << (8 * size)) - 1)))


def parse_attrs(data: bytes) -> dict[int, bytes]:
    out = {}
    offset = 0
    while offset + NLAHDR.size <= len(data):
        size, kind = NLAHDR.unpack_from(data, offset)
        if size < NLAHDR.size:
            break
        out[kind & NLA_TYPE_MASK] = data[offset + NLAHDR.size : offset + size]
        offset += (size + 3) & ~3
    return out


def as_int(raw: bytes) -> int:
    return int(struct.unpack(FORMAT[len(raw)], raw)[0])


@dataclass
class Reply:
    """What the kernel answered one request: an errno (0: done), the messages of a dump, the
    reason it gave (extended ack), and whether anything came back at all."""

    error: int | None = None
    messages: list[bytes] = field(default_factory=list)
    reason: str = ""
    done: bool = False

    @property
    def answered(self) -> bool:
        return self.error is not None or self.done or bool(self.messages)

    @property
    def outcome(self) -> int | None:
        """None: no answer; else the errno acked, or 0 for a dump that answered."""
        if not self.answered:
            return None
        return self.error if self.error is not None else 0


class Genl:
    """A NETLINK_GENERIC socket of our own: qgpu's family id is looked up with
    CTRL_CMD_GETFAMILY, and requests are sent as the bytes given."""

    def __init__(self, family: str = GENL_NAME) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.sock.bind((0, 0))
        self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        self.sock.setblocking(False)
        self.seq = 0
        self.family, self.groups = self.lookup(family)

    def close(self) -> None:
        self.sock.close()

    def lookup(self, name: str) -> tuple[int, dict[str, int]]:
        reply = self.request(
            CTRL_CMD_GETFAMILY,
            nla(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0"),
            family=GENL_ID_CTRL,
            ack=False,
        )
        assert reply.error in (None, 0) and reply.messages, f"no family {name}: {reply}"
        attrs = parse_attrs(reply.messages[0][GENLHDR.size :])
        groups = {}
        for nest in parse_attrs(attrs.get(CTRL_ATTR_MCAST_GROUPS, b"")).values():
            group = parse_attrs(nest)
            groups[group[CTRL_ATTR_MCAST_GRP_NAME].rstrip(b"\0").decode()] = as_int(
                group[CTRL_ATTR_MCAST_GRP_ID]
            )
        return as_int(attrs[CTRL_ATTR_FAMILY_ID]), groups

    def frame(
        self,
        cmd: int,
        attrs: bytes = b"",
        *,
        flags: int = NLM_F_REQUEST | NLM_F_ACK,
        version: int = GENL_VERSION,
        reserved: int = 0,
        family: int | None = None,
    ) -> tuple[int, bytes]:
        self.seq += 1
        body = GENLHDR.pack(cmd, version, reserved) + attrs
        size = NLMSGHDR.size + len(body)
        kind = self.family if family is None else family
        return self.seq, NLMSGHDR.pack(size, kind, flags, self.seq, 0) + body

    def send(self, data: bytes) -> None:
        self.sock.send(data)

    def collect(self, seq: int, reply: Reply, data: bytes) -> None:
        offset = 0
        while offset + NLMSGHDR.size <= len(data):
            size, kind, _flags, got_seq, _pid = NLMSGHDR.unpack_from(data, offset)
            payload = data[offset + NLMSGHDR.size : offset + size]
            offset += (size + 3) & ~3
            if got_seq != seq:
                raise AssertionError(f"an answer to request {got_seq} came for {seq}")
            if kind == NLMSG_ERROR:
                reply.error = -struct.unpack_from("=i", payload)[0]
                # With NETLINK_CAP_ACK the request is not echoed: the TLVs follow its header.
                reason = parse_attrs(payload[4 + NLMSGHDR.size :]).get(NLMSGERR_ATTR_MSG)
                reply.reason = reason.rstrip(b"\0").decode() if reason else ""
            elif kind == NLMSG_DONE:
                reply.done = True
            else:
                reply.messages.append(payload)

    def drain(self, seq: int) -> Reply:
        """Every answer already there. The kernel handles a request inside send(), and the next
        part of a dump inside the recv() that makes room for it, so nothing is left behind."""
        reply = Reply()
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return reply
            self.collect(seq, reply, data)

    def receive(self, timeout: float = 10.0) -> bytes:
        """The next datagram, waiting for it."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no answer from the kernel in {timeout} s")
        return self.sock.recv(65536)

    def wait(self, seq: int, dump: bool) -> Reply:
        reply = Reply()
        while not (reply.error is not None or reply.done):
            self.collect(seq, reply, self.receive())
        assert not dump or reply.error is not None or reply.done
        return reply

    def request(
        self,
        cmd: int,
        attrs: bytes = b"",
        *,
        dump: bool = False,
        ack: bool = True,
        family: int | None = None,
    ) -> Reply:
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0) | (NLM_F_ACK if ack else 0)
        seq, data = self.frame(cmd, attrs, flags=flags, family=family)
        self.send(data)
        if not dump and not ack:
            # CTRL_CMD_GETFAMILY answers with the family (or an error), no ack needed.
            reply = Reply()
            while not (reply.messages or reply.error is not None):
                self.collect(seq, reply, self.receive())
            return reply
        return self.wait(seq, dump)

    def dump(self, cmd: int) -> list[dict[int, int]]:
        reply = self.request(cmd, dump=True)
        assert reply.error in (None, 0), f"{Cmd(cmd).name} dump: errno {reply.error}"
        out = []
        for message in reply.messages:
            assert GENLHDR.unpack_from(message)[0] == cmd
            attrs = parse_attrs(message[GENLHDR.size :])
            out.append({kind: as_int(raw) for kind, raw in attrs.items() if kind != Attr.PAD})
        return out


# -- what the module holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """Every attribute of the module's answers, except the periods a GPU's scheduler counts
    (it runs on its own while anything is gated there), and the sysfs view of the same."""

    cgroups: tuple[tuple[tuple[int, int], ...], ...]
    gpus: tuple[tuple[tuple[int, int], ...], ...]
    sysfs: tuple[str, ...]

    def configs(self) -> dict[int, tuple[int, int, int, int]]:
        """cgroup id -> (gpu, class, share, mem_limit)."""
        out = {}
        for row in self.cgroups:
            a = dict(row)
            out[a[Attr.CGROUP_ID]] = (a[Attr.GPU], a[Attr.CLASS], a[Attr.SHARE], a[Attr.MEM_LIMIT])
        return out

    def gpu_settings(self) -> list[tuple[int, ...]]:
        """(policy, period_us, offline and online timeslice, offline preemption) of each GPU."""
        return [tuple(dict(row)[a] for a in GPU_SETTINGS) for row in self.gpus]


def state(genl: Genl) -> State:
    cgs = sorted(tuple(sorted(m.items())) for m in genl.dump(Cmd.CGROUP_GET))
    gpus = [
        tuple(sorted((k, v) for k, v in m.items() if k != Attr.NR_PERIODS))
        for m in genl.dump(Cmd.GPU_GET)
    ]
    assert [dict(g)[Attr.GPU] for g in gpus] == list(range(MAX_GPUS))
    names = (
        "policy",
        "period_us",
        "offline_timeslice_us",
        "online_timeslice_us",
        "offline_preemption",
    )
    files = [SYSFS / "cgroups"] + [
        SYSFS / f"gpu{i}" / name for i in range(MAX_GPUS) for name in names
    ]
    return State(tuple(cgs), tuple(gpus), tuple(f.read_text() for f in files))


# -- the module, loaded once for this file, and a configuration to damage ----------------------


@dataclass
class Setup:
    genl: Genl
    cgs: dict[str, Cgroup]
    before: State

    def id(self, name: str) -> int:
        return self.cgs[name].id


def cgroup_set(genl: Genl, cg: int, gpu: int, klass: int, share: int, limit: int = 0) -> Reply:
    return genl.request(
        Cmd.CGROUP_SET,
        put(Attr.CGROUP_ID, cg)
        + put(Attr.GPU, gpu)
        + put(Attr.CLASS, klass)
        + put(Attr.SHARE, share)
        + put(Attr.MEM_LIMIT, limit),
    )


def gpu_set(
    genl: Genl,
    gpu: int,
    policy: int | None = None,
    period: int | None = None,
    slices: tuple[int, int] | None = None,
    preemption: int | None = None,
) -> Reply:
    attrs = put(Attr.GPU, gpu)
    if policy is not None:
        attrs += put(Attr.POLICY, policy)
    if period is not None:
        attrs += put(Attr.PERIOD_US, period)
    if slices is not None:
        attrs += put(Attr.OFFLINE_TIMESLICE_US, slices[0])
        attrs += put(Attr.ONLINE_TIMESLICE_US, slices[1])
    if preemption is not None:
        attrs += put(Attr.OFFLINE_PREEMPTION, preemption)
    return genl.request(Cmd.GPU_SET, attrs)


def cgroup_del(genl: Genl, cg: int) -> Reply:
    return genl.request(Cmd.CGROUP_DEL, put(Attr.CGROUP_ID, cg))


def configure(genl: Genl, cgs: dict[str, Cgroup]) -> None:
    """GPU 0 fixed-share with 40 + 30 given; GPU 1 burst-share with 70 + 50 (more than 100 is
    allowed there, so switching it to fixed-share must be refused), timeslices of its own and
    CTA for offline contexts; ``spare`` unconfigured."""
    for reply in [
        gpu_set(genl, 0, Policy.FIXED_SHARE, 20_000),
        gpu_set(genl, 1, Policy.BURST_SHARE, 100_000, (64, 0), Preemption.CTA),
        cgroup_set(genl, cgs["a"].id, 0, 0, 40, 1 << 30),
        cgroup_set(genl, cgs["b"].id, 0, 1, 30),
        cgroup_set(genl, cgs["c"].id, 1, 0, 70),
        cgroup_set(genl, cgs["e"].id, 1, 0, 50, 5 << 20),
    ]:
        assert reply.error == 0, reply


def unconfigure(genl: Genl) -> None:
    for row in genl.dump(Cmd.CGROUP_GET):
        assert cgroup_del(genl, row[Attr.CGROUP_ID]).error == 0
    for gpu in range(MAX_GPUS):
        reply = gpu_set(
            genl, gpu, Policy.BEST_EFFORT, PERIOD_DEFAULT_US, DEFAULT_SLICES, Preemption.OWN
        )
        assert reply.error == 0


@pytest.fixture(scope="module")
def loaded() -> Iterator[Genl]:
    # Schedulers looking less often: nothing here runs on the GPU, and the VM's CPUs are slow.
    with module_loaded(poll_us=5000):
        genl = Genl()
        try:
            yield genl
        finally:
            genl.close()


@pytest.fixture(scope="module")
def module_setup(loaded: Genl) -> Iterator[Setup]:
    with cgroups(5) as made:
        cgs = dict(zip(["a", "b", "c", "e", "spare"], made, strict=True))
        configure(loaded, cgs)
        try:
            yield Setup(loaded, cgs, state(loaded))
        finally:
            unconfigure(loaded)


@pytest.fixture
def setup(module_setup: Setup) -> Iterator[Setup]:
    """The configuration, as it was: a test that changed it on purpose puts it back."""
    genl = module_setup.genl
    if state(genl) != module_setup.before:
        unconfigure(genl)
        configure(genl, module_setup.cgs)
        assert state(genl) == module_setup.before
    yield module_setup


# -- other identities --------------------------------------------------------------------------


def as_other(identity: str, work: Callable[[], Any]) -> Any:
    """Run ``work`` in a child process as ``nobody`` or as root of a new user namespace and
    return what it returned (JSON), or raise what it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            if identity == "nobody":
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            elif identity == "userns":
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(CLONE_NEWUSER) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
                Path("/proc/self/setgroups").write_text("deny")
                Path("/proc/self/uid_map").write_text("0 0 1")
                Path("/proc/self/gid_map").write_text("0 0 1")
            else:
                raise ValueError(identity)
            out = {"ok": work()}
        except BaseException as error:
            out = {"error": repr(error)}
            code = 1
        try:
            os.write(write, json.dumps(out).encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    answer = json.loads(b"".join(chunks))
    assert "error" not in answer, f"as {identity}: {answer['error']}"
    return answer["ok"]


def capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff")


def every_command(ids: dict[str, int]) -> Callable[[], dict[str, Any]]:
    """Each command, well formed and one that root may carry out, from a fresh socket."""

    def work() -> dict[str, Any]:
        genl = Genl()
        out: dict[str, Any] = {"uid": os.getuid(), "caps": capabilities()}
        out["GPU_SET"] = gpu_set(genl, 0, Policy.BURST_SHARE, 30_000).outcome
        out["CGROUP_SET"] = cgroup_set(genl, ids["spare"], 0, 0, 10).outcome
        out["CGROUP_SET update"] = cgroup_set(genl, ids["a"], 0, 0, 20).outcome
        out["CGROUP_DEL"] = cgroup_del(genl, ids["b"]).outcome
        gpus = genl.request(Cmd.GPU_GET, dump=True)
        out["GPU_GET"], out["GPU_GET answers"] = gpus.outcome, len(gpus.messages)
        cgs = genl.request(Cmd.CGROUP_GET, dump=True)
        out["CGROUP_GET"], out["CGROUP_GET answers"] = cgs.outcome, len(cgs.messages)
        try:
            genl.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, genl.groups[MCGRP_EVENTS])
            out["events"] = 0
        except OSError as error:
            out["events"] = error.errno
        genl.close()
        return out

    return work


COMMANDS = ["GPU_SET", "CGROUP_SET", "CGROUP_SET update", "CGROUP_DEL", "GPU_GET", "CGROUP_GET"]


@pytest.mark.parametrize("identity", ["nobody", "userns"])
def test_commands_need_cap_net_admin_in_the_initial_user_namespace(
    setup: Setup, identity: str
) -> None:
    genl = setup.genl
    ids = {name: cg.id for name, cg in setup.cgs.items()}
    out = as_other(identity, every_command(ids))
    if identity == "nobody":
        assert out["uid"] == NOBODY and out["caps"] == 0
    else:
        # Root with every capability, in its own user namespace.
        assert out["uid"] == 0 and out["caps"] & (1 << 12)  # CAP_NET_ADMIN
    assert {cmd: out[cmd] for cmd in COMMANDS} == dict.fromkeys(COMMANDS, errno.EPERM)
    assert out["events"] == errno.EPERM
    assert out["GPU_GET answers"] == out["CGROUP_GET answers"] == 0
    assert state(genl) == setup.before
    # The same requests from root are carried out: the refusal was the sender's.
    out = every_command(ids)()
    assert {cmd: out[cmd] for cmd in COMMANDS} == dict.fromkeys(COMMANDS, 0)
    assert out["events"] == 0
    assert out["GPU_GET answers"] == MAX_GPUS and out["CGROUP_GET answers"] == 4
    configs = state(genl).configs()
    assert configs[ids["spare"]] == (0, 0, 10, 0) and configs[ids["a"]] == (0, 0, 20, 0)
    assert ids["b"] not in configs
    assert state(genl).gpu_settings()[0] == (
        Policy.BURST_SHARE,
        30_000,
        *DEFAULT_SLICES,
        Preemption.OWN,
    )


# -- malformed and refused messages ------------------------------------------------------------

G0 = put(Attr.GPU, 0)
G1 = put(Attr.GPU, 1)
BURST = put(Attr.POLICY, Policy.BURST_SHARE)
FIXED = put(Attr.POLICY, Policy.FIXED_SHARE)
PERIOD = put(Attr.PERIOD_US, 30_000)
OFFLINE = put(Attr.CLASS, 0)
SHARE10 = put(Attr.SHARE, 10)
NONE = (1 << 63) + 12345  # no cgroup has this id
READ_ONLY = [a for a in Attr if a >= Attr.PAD and a not in WIDTH]


@dataclass(frozen=True)
class Case:
    name: str
    cmd: int
    attrs: Callable[[Setup], bytes]
    errno: int
    dump: bool = False


def cgroup_attrs(
    cg: str | int = "spare",
    gpu: bytes = G0,
    klass: bytes = OFFLINE,
    share: bytes = SHARE10,
    extra: bytes = b"",
) -> Callable[[Setup], bytes]:
    def build(s: Setup) -> bytes:
        ident = put(Attr.CGROUP_ID, s.id(cg) if isinstance(cg, str) else cg)
        return ident + gpu + klass + share + extra

    return build


def fixed(attrs: bytes) -> Callable[[Setup], bytes]:
    return lambda _s: attrs


def procs_inode(s: Setup) -> bytes:
    """The id of a file in a cgroup directory, not of a cgroup."""
    return put(Attr.CGROUP_ID, os.stat(s.cgs["spare"].path / "cgroup.procs").st_ino)


CASES = [
    # GPU_SET: what is required, ranges, widths, read-only and unknown attributes, framing.
    Case("gpu_set no attributes", Cmd.GPU_SET, fixed(b""), errno.EINVAL),
    Case("gpu_set no gpu", Cmd.GPU_SET, fixed(BURST + PERIOD), errno.EINVAL),
    Case("gpu_set nothing to set", Cmd.GPU_SET, fixed(G0), errno.EINVAL),
    Case("gpu_set gpu 8", Cmd.GPU_SET, fixed(put(Attr.GPU, 8) + BURST), errno.ERANGE),
    Case("gpu_set gpu ~0", Cmd.GPU_SET, fixed(put(Attr.GPU, 0xFFFFFFFF) + BURST), errno.ERANGE),
    Case("gpu_set policy 3", Cmd.GPU_SET, fixed(G0 + put(Attr.POLICY, 3)), errno.ERANGE),
    Case("gpu_set policy 255", Cmd.GPU_SET, fixed(G0 + put(Attr.POLICY, 255)), errno.ERANGE),
    Case("gpu_set period 0", Cmd.GPU_SET, fixed(G0 + put(Attr.PERIOD_US, 0)), errno.ERANGE),
    Case("gpu_set period 999", Cmd.GPU_SET, fixed(G0 + put(Attr.PERIOD_US, 999)), errno.ERANGE),
    Case(
        "gpu_set period 1000001",
        Cmd.GPU_SET,
        fixed(G0 + put(Attr.PERIOD_US, PERIOD_MAX_US + 1)),
        errno.ERANGE,
    ),
    Case(
        "gpu_set good policy, period out of range",
        Cmd.GPU_SET,
        fixed(G0 + BURST + put(Attr.PERIOD_US, 999)),
        errno.ERANGE,
    ),
    Case("gpu_set policy as u32", Cmd.GPU_SET, fixed(G0 + put(Attr.POLICY, 2, 4)), errno.EINVAL),
    Case("gpu_set gpu as u64", Cmd.GPU_SET, fixed(put(Attr.GPU, 0, 8) + BURST), errno.EINVAL),
    Case("gpu_set gpu as u16", Cmd.GPU_SET, fixed(put(Attr.GPU, 0, 2) + BURST), errno.EINVAL),
    Case("gpu_set gpu empty", Cmd.GPU_SET, fixed(nla(Attr.GPU, b"") + BURST), errno.EINVAL),
    Case(
        "gpu_set period 3 bytes",
        Cmd.GPU_SET,
        fixed(G0 + nla(Attr.PERIOD_US, b"\x30\x75\x00")),
        errno.EINVAL,
    ),
    Case(
        "gpu_set policy nested flag",
        Cmd.GPU_SET,
        fixed(G0 + nla(Attr.POLICY | NLA_F_NESTED, b"\x02")),
        errno.EINVAL,
    ),
    Case(
        "gpu_set later duplicate out of range",
        Cmd.GPU_SET,
        fixed(G0 + BURST + put(Attr.POLICY, 7)),
        errno.ERANGE,
    ),
    Case("gpu_set attribute 0", Cmd.GPU_SET, fixed(G0 + BURST + put(0, 0, 4)), errno.EINVAL),
    Case(
        "gpu_set unknown attribute",
        Cmd.GPU_SET,
        fixed(G0 + BURST + put(A_MAX + 1, 0, 4)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set attribute 0x3fff",
        Cmd.GPU_SET,
        fixed(G0 + BURST + put(0x3FFF, 0, 4)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set nla_len past the end",
        Cmd.GPU_SET,
        fixed(G0 + BURST + nla(Attr.PERIOD_US, struct.pack("=I", 30_000), length=64)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set nla_len below its header",
        Cmd.GPU_SET,
        fixed(G0 + BURST + nla(Attr.PERIOD_US, struct.pack("=I", 30_000), length=2)),
        errno.EINVAL,
    ),
    Case("gpu_set trailing bytes", Cmd.GPU_SET, fixed(G0 + BURST + b"\x08\x00\x03"), errno.EINVAL),
    Case(
        "gpu_set offline timeslice past the most",
        Cmd.GPU_SET,
        fixed(G0 + put(Attr.OFFLINE_TIMESLICE_US, TIMESLICE_MAX_US + 1)),
        errno.ERANGE,
    ),
    Case(
        "gpu_set online timeslice ~0",
        Cmd.GPU_SET,
        fixed(G0 + put(Attr.ONLINE_TIMESLICE_US, 0xFFFFFFFF)),
        errno.ERANGE,
    ),
    Case(
        "gpu_set good policy, timeslice out of range",
        Cmd.GPU_SET,
        fixed(G0 + BURST + put(Attr.ONLINE_TIMESLICE_US, TIMESLICE_MAX_US + 1)),
        errno.ERANGE,
    ),
    Case(
        "gpu_set timeslice as u64",
        Cmd.GPU_SET,
        fixed(G0 + put(Attr.OFFLINE_TIMESLICE_US, 128, 8)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set timeslice as u8",
        Cmd.GPU_SET,
        fixed(G0 + put(Attr.ONLINE_TIMESLICE_US, 128, 1)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set fixed-share where shares sum to 120, with timeslices",
        Cmd.GPU_SET,
        fixed(G1 + FIXED + put(Attr.OFFLINE_TIMESLICE_US, 256)),
        errno.EINVAL,
    ),
    Case(
        "gpu_set fixed-share where shares sum to 120",
        Cmd.GPU_SET,
        fixed(G1 + FIXED),
        errno.EINVAL,
    ),
    Case(
        "gpu_set fixed-share where shares sum to 120, with a period",
        Cmd.GPU_SET,
        fixed(G1 + FIXED + PERIOD),
        errno.EINVAL,
    ),
    # CGROUP_SET
    Case("cgroup_set no attributes", Cmd.CGROUP_SET, fixed(b""), errno.EINVAL),
    Case(
        "cgroup_set no cgroup id",
        Cmd.CGROUP_SET,
        fixed(G0 + OFFLINE + SHARE10),
        errno.EINVAL,
    ),
    Case("cgroup_set no gpu", Cmd.CGROUP_SET, cgroup_attrs(gpu=b""), errno.EINVAL),
    Case("cgroup_set no class", Cmd.CGROUP_SET, cgroup_attrs(klass=b""), errno.EINVAL),
    Case("cgroup_set no share", Cmd.CGROUP_SET, cgroup_attrs(share=b""), errno.EINVAL),
    Case(
        "cgroup_set share 0", Cmd.CGROUP_SET, cgroup_attrs(share=put(Attr.SHARE, 0)), errno.ERANGE
    ),
    Case(
        "cgroup_set share 101",
        Cmd.CGROUP_SET,
        cgroup_attrs(share=put(Attr.SHARE, 101)),
        errno.ERANGE,
    ),
    Case(
        "cgroup_set share ~0",
        Cmd.CGROUP_SET,
        cgroup_attrs(share=put(Attr.SHARE, 0xFFFFFFFF)),
        errno.ERANGE,
    ),
    Case(
        "cgroup_set class 2", Cmd.CGROUP_SET, cgroup_attrs(klass=put(Attr.CLASS, 2)), errno.ERANGE
    ),
    Case("cgroup_set gpu 8", Cmd.CGROUP_SET, cgroup_attrs(gpu=put(Attr.GPU, 8)), errno.ERANGE),
    Case(
        "cgroup_set share as u8",
        Cmd.CGROUP_SET,
        cgroup_attrs(share=put(Attr.SHARE, 10, 1)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set class as u32",
        Cmd.CGROUP_SET,
        cgroup_attrs(klass=put(Attr.CLASS, 0, 4)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set cgroup id as u32",
        Cmd.CGROUP_SET,
        lambda s: put(Attr.CGROUP_ID, s.id("spare"), 4) + G0 + OFFLINE + SHARE10,
        errno.EINVAL,
    ),
    Case(
        "cgroup_set mem_limit as u32",
        Cmd.CGROUP_SET,
        cgroup_attrs(extra=put(Attr.MEM_LIMIT, 1 << 20, 4)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set mem_limit 12 bytes",
        Cmd.CGROUP_SET,
        cgroup_attrs(extra=nla(Attr.MEM_LIMIT, bytes(12))),
        errno.EINVAL,
    ),
    *[
        Case(
            f"cgroup_set with read-only {a.name}",
            Cmd.CGROUP_SET,
            cgroup_attrs(extra=put(a, 0, 8)),
            errno.EINVAL,
        )
        for a in READ_ONLY
    ],
    Case(
        "cgroup_set read-only MEM_USED as u8",
        Cmd.CGROUP_SET,
        cgroup_attrs(extra=put(Attr.MEM_USED, 0, 1)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set unknown attribute",
        Cmd.CGROUP_SET,
        cgroup_attrs(extra=put(A_MAX + 1, 0, 8)),
        errno.EINVAL,
    ),
    Case("cgroup_set no such cgroup", Cmd.CGROUP_SET, cgroup_attrs(cg=NONE), errno.ENOENT),
    Case("cgroup_set cgroup id 0", Cmd.CGROUP_SET, cgroup_attrs(cg=0), errno.ENOENT),
    Case("cgroup_set cgroup id ~0", Cmd.CGROUP_SET, cgroup_attrs(cg=(1 << 64) - 1), errno.ENOENT),
    Case(
        "cgroup_set the id of a file",
        Cmd.CGROUP_SET,
        lambda s: procs_inode(s) + G0 + OFFLINE + SHARE10,
        errno.ENOENT,
    ),
    Case(
        "cgroup_set no such cgroup, share out of range",
        Cmd.CGROUP_SET,
        cgroup_attrs(cg=NONE, share=put(Attr.SHARE, 0)),
        errno.ERANGE,
    ),
    Case(
        "cgroup_set fixed-share past 100 (70 + 31)",
        Cmd.CGROUP_SET,
        cgroup_attrs(share=put(Attr.SHARE, 31)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set raising a share past 100 (71 + 30)",
        Cmd.CGROUP_SET,
        cgroup_attrs(cg="a", share=put(Attr.SHARE, 71)),
        errno.EINVAL,
    ),
    Case(
        "cgroup_set moving a cgroup onto a full fixed-share GPU",
        Cmd.CGROUP_SET,
        cgroup_attrs(cg="c", share=put(Attr.SHARE, 31)),
        errno.EINVAL,
    ),
    # CGROUP_DEL
    Case("cgroup_del no attributes", Cmd.CGROUP_DEL, fixed(b""), errno.EINVAL),
    Case("cgroup_del only a gpu", Cmd.CGROUP_DEL, fixed(G0), errno.EINVAL),
    Case(
        "cgroup_del not configured",
        Cmd.CGROUP_DEL,
        lambda s: put(Attr.CGROUP_ID, s.id("spare")),
        errno.ENOENT,
    ),
    Case(
        "cgroup_del no such cgroup", Cmd.CGROUP_DEL, fixed(put(Attr.CGROUP_ID, NONE)), errno.ENOENT
    ),
    Case(
        "cgroup_del cgroup id as u32",
        Cmd.CGROUP_DEL,
        lambda s: put(Attr.CGROUP_ID, s.id("a"), 4),
        errno.EINVAL,
    ),
    Case(
        "cgroup_del with a read-only attribute",
        Cmd.CGROUP_DEL,
        lambda s: put(Attr.CGROUP_ID, s.id("a")) + put(Attr.MEM_USED, 0, 8),
        errno.EINVAL,
    ),
    Case(
        "cgroup_del with an unknown attribute",
        Cmd.CGROUP_DEL,
        lambda s: put(Attr.CGROUP_ID, s.id("a")) + put(A_MAX + 1, 0, 4),
        errno.EINVAL,
    ),
    # Commands that do not exist or are not done that way.
    Case("command 0", Cmd.UNSPEC, fixed(G0 + BURST), errno.EOPNOTSUPP),
    Case("command EVENT", Cmd.EVENT, fixed(G0 + BURST), errno.EOPNOTSUPP),
    Case("command 7", 7, fixed(G0 + BURST), errno.EOPNOTSUPP),
    Case("command 255", 255, fixed(G0 + BURST), errno.EOPNOTSUPP),
    Case("GPU_GET as a do", Cmd.GPU_GET, fixed(b""), errno.EOPNOTSUPP),
    Case("GPU_SET as a dump", Cmd.GPU_SET, fixed(G0 + BURST), errno.EOPNOTSUPP, dump=True),
    Case(
        "CGROUP_DEL as a dump",
        Cmd.CGROUP_DEL,
        lambda s: put(Attr.CGROUP_ID, s.id("a")),
        errno.EOPNOTSUPP,
        dump=True,
    ),
    Case(
        "CGROUP_GET dump with a read-only attribute",
        Cmd.CGROUP_GET,
        fixed(put(Attr.MEM_USED, 0, 8)),
        errno.EINVAL,
        dump=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_message_is_refused_and_changes_nothing(setup: Setup, case: Case) -> None:
    genl = setup.genl
    reply = genl.request(case.cmd, case.attrs(setup), dump=case.dump)
    assert (reply.error, reply.messages) == (case.errno, []), reply.reason
    assert state(genl) == setup.before


def test_a_refused_message_leaves_the_configuration_usable(setup: Setup) -> None:
    """After the refusals the same cgroups and GPUs take good commands."""
    genl = setup.genl
    assert cgroup_set(genl, setup.id("spare"), 0, 0, 30).error == 0  # 40 + 30 + 30 = 100
    assert cgroup_set(genl, setup.id("spare"), 0, 0, 31).error == errno.EINVAL
    assert cgroup_del(genl, setup.id("spare")).error == 0
    assert cgroup_del(genl, setup.id("spare")).error == errno.ENOENT
    assert gpu_set(genl, 1, period=PERIOD_MIN_US).error == 0
    assert gpu_set(genl, 1, period=PERIOD_MAX_US).error == 0
    assert state(genl).gpu_settings()[1] == (
        Policy.BURST_SHARE,
        PERIOD_MAX_US,
        64,
        0,
        Preemption.CTA,
    )


def test_framing_errors(setup: Setup) -> None:
    genl = setup.genl
    good = G0 + BURST + PERIOD
    # A header too short for the generic netlink header: refused.
    seq, data = genl.frame(Cmd.GPU_SET, b"")
    short = NLMSGHDR.pack(NLMSGHDR.size + 2, genl.family, NLM_F_REQUEST | NLM_F_ACK, seq, 0)
    genl.send(short + data[NLMSGHDR.size : NLMSGHDR.size + 2])
    assert genl.wait(seq, False).error == errno.EINVAL
    # nlmsg_len past the end of the datagram, or below a netlink header: dropped unanswered.
    for size in (200, 8, 0):
        seq, data = genl.frame(Cmd.GPU_SET, good)
        genl.send(NLMSGHDR.pack(size, genl.family, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + data[16:])
        assert not genl.drain(seq).answered
    # A datagram shorter than a netlink header: nothing to answer.
    genl.send(b"\x10\x00\x00")
    # A reserved field that is not 0, and netlink flags genetlink gives no meaning to.
    seq, data = genl.frame(Cmd.GPU_SET, good, reserved=1)
    genl.send(data)
    assert genl.wait(seq, False).error == errno.EINVAL
    for flag in (0x10, 0x20, 0x100, 0x200, 0x400, 0x8000):
        seq, data = genl.frame(Cmd.GPU_SET, good, flags=NLM_F_REQUEST | NLM_F_ACK | flag)
        genl.send(data)
        assert genl.wait(seq, False).error == errno.EINVAL, hex(flag)
    # Not a request: not carried out (acknowledged, as asked).
    seq, data = genl.frame(Cmd.GPU_SET, good, flags=NLM_F_ACK)
    genl.send(data)
    assert genl.drain(seq).error == 0
    assert state(genl) == setup.before


# -- sysfs -------------------------------------------------------------------------------------

GPU0 = SYSFS / "gpu0"
GPU1 = SYSFS / "gpu1"
BAD_POLICIES = [
    b"bogus",
    b"fixed",
    b"fixed-share2",
    b"FIXED-SHARE",
    b" fixed-share",
    b"fixed-share \n",
    b"fixed-share\n\n",
    b"1",
    b"fs bs",
    b"\x00",
    b"\xff\xfe",
    b"x" * 4000,
]
BAD_PERIODS = [
    b"abc",
    b"-1",
    b"0",
    b"999",
    b"1000001",
    b"4294967296",
    b"0x4e20",
    b"20000abc",
    b" 20000",
    b"20000 ",
    b"2e4",
    b"\n",
    b"9" * 4000,
]
BAD_TIMESLICES = [b"abc", b"-1", b"1000001", b"4294967296", b"0x80", b" 128", b"\n", b"9" * 4000]
BAD_PREEMPTIONS = [b"wfi", b"cilp", b"CTA", b"1", b" cta", b"cta ", b"ctaa", b"\n", b"own\n\n"]
READ_ONLY_FILES = [
    SYSFS / "version",
    SYSFS / "target",
    SYSFS / "hooked",
    SYSFS / "cgroups",
    GPU0 / "nr_periods",
    GPU0 / "online_busy",
    SYSFS / "rm_version",
    SYSFS / "events_sent",
    SYSFS / "events_dropped",
    SYSFS / "rewrites_refused",
    SYSFS / "rewrites_unchecked",
    SYSFS / "answers_missed",
    SYSFS / "uvm_hooked",
]


def write(path: Path, data: bytes) -> int:
    """The errno of writing ``data`` to ``path`` at once (0: taken)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as error:
        return error.errno or -1
    try:
        os.write(fd, data)
        return 0
    except OSError as error:
        return error.errno or -1
    finally:
        os.close(fd)


def test_sysfs_refuses_garbage_and_keeps_the_value(setup: Setup) -> None:
    genl = setup.genl
    for data in BAD_POLICIES:
        assert write(GPU0 / "policy", data) == errno.EINVAL, data
    for data in BAD_PERIODS:
        assert write(GPU0 / "period_us", data) == errno.EINVAL, data
    for name in ("offline_timeslice_us", "online_timeslice_us"):
        for data in BAD_TIMESLICES:
            assert write(GPU0 / name, data) == errno.EINVAL, (name, data)
    for data in BAD_PREEMPTIONS:
        assert write(GPU0 / "offline_preemption", data) == errno.EINVAL, data
    # A good word that the shares do not allow: GPU 1's shares sum to 120.
    assert write(GPU1 / "policy", b"fixed-share\n") == errno.EINVAL
    assert write(GPU1 / "policy", b"fs") == errno.EINVAL
    assert state(genl) == setup.before
    assert (GPU0 / "policy").read_text() == "fixed-share\n"
    assert (GPU0 / "period_us").read_text() == "20000\n"
    # What is allowed is taken, at the edges too, and shows in netlink.
    assert write(GPU0 / "policy", b"bs\n") == 0
    assert write(GPU0 / "period_us", b"1000") == 0
    assert state(genl).gpu_settings()[0] == (
        Policy.BURST_SHARE,
        1000,
        *DEFAULT_SLICES,
        Preemption.OWN,
    )
    assert write(GPU0 / "period_us", b"1000000\n") == 0
    assert (GPU0 / "period_us").read_text() == "1000000\n"
    assert write(GPU0 / "offline_timeslice_us", b"0") == 0
    assert write(GPU0 / "online_timeslice_us", b"1000000\n") == 0
    assert state(genl).gpu_settings()[0][2:4] == (0, TIMESLICE_MAX_US)
    assert (GPU0 / "online_timeslice_us").read_text() == "1000000\n"
    assert write(GPU0 / "offline_preemption", b"cta\n") == 0
    assert state(genl).gpu_settings()[0][4] == Preemption.CTA
    assert (GPU0 / "offline_preemption").read_text() == "cta\n"
    assert write(GPU0 / "offline_preemption", b"own") == 0
    assert state(genl).gpu_settings()[0][4] == Preemption.OWN


def test_online_gate_takes_0_1_and_2_and_refuses_the_rest(setup: Setup) -> None:
    """The module parameter that says which offline cgroups close for online work
    (kmod/qgpu/sched.c): 0 by default; anything but 0, 1 and 2 refused, the value kept."""
    gate = Path("/sys/module/qgpu/parameters/online_gate")
    assert gate.read_text() == "0\n"
    for data in (b"3", b"-1", b"abc", b"4294967297", b"1x"):
        assert write(gate, data) == errno.EINVAL, data
    assert gate.read_text() == "0\n"
    try:
        for data in (b"2", b"1\n", b"0"):
            assert write(gate, data) == 0, data
            assert gate.read_text() == f"{int(data)}\n"
    finally:
        gate.write_text("0")


def test_sysfs_read_only_files_refuse_writes(setup: Setup) -> None:
    steady = [p for p in READ_ONLY_FILES if p.name != "nr_periods"]
    values = [p.read_text() for p in steady]
    for path in READ_ONLY_FILES:
        assert write(path, b"1\n") == errno.EACCES, path
        assert write(path, b"0") == errno.EACCES, path
    assert [p.read_text() for p in steady] == values
    assert values[:4] == [f"{GENL_VERSION}\n", "nvmock\n", "1\n", "4\n"]
    assert values[-1] == "1\n"  # uvm_hooked: nvmock's /dev/nvidia-uvm was found
    assert state(setup.genl) == setup.before


def test_sysfs_writes_need_root_in_the_initial_user_namespace(setup: Setup) -> None:
    # The files are root's, 0644: nobody cannot open them for writing.
    def nobody_writes() -> list[int]:
        return [
            write(GPU0 / "policy", b"bs"),
            write(GPU0 / "period_us", b"30000"),
            write(GPU0 / "online_timeslice_us", b"1"),
        ]

    assert as_other("nobody", nobody_writes) == [errno.EACCES] * 3

    # A file root opened is still refused to a writer who is no longer root.
    opened = [os.open(GPU0 / "policy", os.O_WRONLY), os.open(GPU0 / "period_us", os.O_WRONLY)]

    def write_opened() -> list[int]:
        out = []
        for fd, data in zip(opened, [b"bs", b"30000"], strict=True):
            try:
                os.write(fd, data)
                out.append(0)
            except OSError as error:
                out.append(error.errno or -1)
        return out

    try:
        assert as_other("nobody", write_opened) == [errno.EPERM, errno.EPERM]
        # Root of a user namespace is the files' owner but not CAP_SYS_ADMIN where it counts.
        assert as_other("userns", nobody_writes) == [errno.EPERM] * 3
    finally:
        for fd in opened:
            os.close(fd)
    assert state(setup.genl) == setup.before


# -- fuzzing -----------------------------------------------------------------------------------

FUZZ_MESSAGES = 10_000
ERRNO_NAMES = {code: errno.errorcode[code] for code in (errno.EINVAL, errno.ERANGE, errno.ENOENT)}
ERRNO_NAMES[errno.EOPNOTSUPP] = "EOPNOTSUPP"  # errorcode calls it ENOTSUP
CHECK_EVERY = 1000


class Refused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Model:
    """What the module should hold, after the messages it accepted; and whether it should
    accept one (strict attribute validation as lib/nlattr.c does it for qgpu's policy, then
    the handlers of netlink.c)."""

    def __init__(self, before: State, existing: set[int]) -> None:
        self.configs = before.configs()
        self.gpus = before.gpu_settings()
        self.existing = existing

    @staticmethod
    def parse(data: bytes) -> dict[int, int]:
        attrs: dict[int, int] = {}
        offset = 0
        while len(data) - offset >= NLAHDR.size:
            size, raw_type = NLAHDR.unpack_from(data, offset)
            if size < NLAHDR.size or size > len(data) - offset:
                break
            kind = raw_type & NLA_TYPE_MASK
            payload = data[offset + NLAHDR.size : offset + size]
            offset += (size + 3) & ~3
            if kind == 0 or kind > A_MAX:
                raise Refused(errno.EINVAL)  # unknown attribute type
            if kind not in WIDTH:
                raise Refused(errno.EINVAL)  # NLA_REJECT (after the same length check)
            width = WIDTH[Attr(kind)]
            if len(payload) != width or raw_type & NLA_F_NESTED:
                raise Refused(errno.EINVAL)
            value = as_int(payload)
            low, high = RANGE[Attr(kind)]
            if not low <= value <= high:
                raise Refused(errno.ERANGE)
            attrs[kind] = value  # a later duplicate wins
        if offset < len(data):
            raise Refused(errno.EINVAL)  # bytes left over
        return attrs

    def shares(self, gpu: int, skip: int | None = None) -> int:
        return sum(c[2] for i, c in self.configs.items() if c[0] == gpu and i != skip)

    def apply(self, cmd: int, attrs: dict[int, int]) -> None:
        """Carry out a valid command, or raise Refused with the module's errno."""

        def need(*names: Attr) -> None:
            if any(n not in attrs for n in names):
                raise Refused(errno.EINVAL)

        if cmd == Cmd.GPU_SET:
            need(Attr.GPU)
            if not any(a in attrs for a in GPU_SETTINGS):
                raise Refused(errno.EINVAL)
            gpu = attrs[Attr.GPU]
            if attrs.get(Attr.POLICY) == Policy.FIXED_SHARE and self.shares(gpu) > SHARE_MAX:
                raise Refused(errno.EINVAL)
            self.gpus[gpu] = tuple(
                attrs.get(a, now) for a, now in zip(GPU_SETTINGS, self.gpus[gpu], strict=True)
            )
        elif cmd == Cmd.CGROUP_SET:
            need(Attr.CGROUP_ID, Attr.GPU, Attr.CLASS, Attr.SHARE)
            ident, gpu, share = attrs[Attr.CGROUP_ID], attrs[Attr.GPU], attrs[Attr.SHARE]
            if ident not in self.existing:
                raise Refused(errno.ENOENT)
            if (
                self.gpus[gpu][0] == Policy.FIXED_SHARE
                and self.shares(gpu, skip=ident) + share > SHARE_MAX
            ):
                raise Refused(errno.EINVAL)
            self.configs[ident] = (gpu, attrs[Attr.CLASS], share, attrs.get(Attr.MEM_LIMIT, 0))
        elif cmd == Cmd.CGROUP_DEL:
            need(Attr.CGROUP_ID)
            if attrs[Attr.CGROUP_ID] not in self.configs:
                raise Refused(errno.ENOENT)
            del self.configs[attrs[Attr.CGROUP_ID]]

    def expect(self, cmd: int, flags: int, body: bytes) -> int:
        """The errno a well-framed request should get (0: carried out or dumped)."""
        if len(body) < GENLHDR.size:
            return errno.EINVAL
        dump = flags & NLM_F_DUMP == NLM_F_DUMP
        # genl_header_check(), for the commands from resv_start_op (1) on: reserved is 0, and
        # no netlink flag beyond REQUEST, ACK, ECHO and the whole of DUMP.
        reserved = GENLHDR.unpack_from(body)[2]
        loose = flags & ~(NLM_F_DUMP if dump else 0) & ~(NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO)
        if cmd >= Cmd.GPU_SET and (reserved or loose):
            return errno.EINVAL
        if cmd not in (Cmd.GPU_SET, Cmd.GPU_GET, Cmd.CGROUP_SET, Cmd.CGROUP_DEL, Cmd.CGROUP_GET):
            return errno.EOPNOTSUPP
        if dump != (cmd in (Cmd.GPU_GET, Cmd.CGROUP_GET)):
            return errno.EOPNOTSUPP
        try:
            attrs = self.parse(body[GENLHDR.size :])
            if not dump:
                self.apply(cmd, attrs)
        except Refused as refused:
            return refused.code
        return 0

    def matches(self, now: State) -> bool:
        return now.configs() == self.configs and now.gpu_settings() == self.gpus


@dataclass
class Fuzzer:
    rng: random.Random
    cgroup_ids: list[int]

    def value(self, kind: int, width: int) -> int:
        rng = self.rng
        if kind in RANGE and rng.random() < 0.8:
            low, high = RANGE[Attr(kind)]
            if kind == Attr.CGROUP_ID:
                return rng.choice(self.cgroup_ids)
            if kind == Attr.GPU and rng.random() < 0.7:
                return rng.randrange(0, 10)
            edges = [low, high, low - 1, high + 1, (low + high) // 2]
            if rng.random() < 0.5:
                return rng.choice(edges) % (1 << (8 * width))
            return rng.randint(low, min(high, (1 << (8 * width)) - 1))
        return rng.getrandbits(8 * width)

    def attribute(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.7:
            kind = rng.randrange(Attr.GPU, Attr.MEM_LIMIT + 1)
        elif roll < 0.82:
            kind = rng.randrange(Attr.PAD, A_MAX + 1)
        elif roll < 0.95:
            kind = rng.randrange(0, 40)
        else:
            kind = rng.getrandbits(16)
        if rng.random() < 0.04:
            kind |= NLA_F_NESTED
        if rng.random() < 0.04:
            kind |= NLA_F_NET_BYTEORDER
        base = kind & NLA_TYPE_MASK
        width = WIDTH.get(Attr(base)) if base in WIDTH else rng.choice([1, 4, 8])
        if rng.random() < 0.8 and width is not None:
            payload = self.value(base, width).to_bytes(width, "little")
        else:
            payload = rng.randbytes(rng.choice([0, 1, 2, 3, 5, 6, 7, 9, 12, 16, rng.randrange(64)]))
        length = None
        if rng.random() < 0.03:
            length = rng.choice([0, 1, 2, 3, rng.randrange(len(payload) + 5, 0x10000)])
        return nla(kind, payload, length=length)

    def message(self, genl: Genl) -> tuple[int, int, int, bytes, bool]:
        """(seq, cmd, flags, datagram, framed): framed when nlmsg_len is the datagram's."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.65:
            cmd = rng.choice([Cmd.GPU_SET, Cmd.CGROUP_SET, Cmd.CGROUP_DEL])
        elif roll < 0.8:
            cmd = rng.choice([Cmd.GPU_GET, Cmd.CGROUP_GET])
        else:
            cmd = rng.randrange(0, 11)
        attrs = b"".join(self.attribute() for _ in range(rng.choice([0, 1, 2, 3, 3, 4, 4, 5, 6])))
        if rng.random() < 0.03:
            attrs += rng.randbytes(rng.randrange(1, 8))  # a truncated attribute header
        roll = rng.random()
        if cmd in (Cmd.GPU_GET, Cmd.CGROUP_GET) and roll < 0.8:
            flags = NLM_F_REQUEST | NLM_F_DUMP | (NLM_F_ACK if roll < 0.4 else 0)
        elif roll < 0.85:
            flags = NLM_F_REQUEST | NLM_F_ACK
        elif roll < 0.9:
            flags = NLM_F_REQUEST
        elif roll < 0.94:
            flags = NLM_F_REQUEST | NLM_F_DUMP | NLM_F_ACK
        elif roll < 0.96:
            flags = NLM_F_ACK
        else:
            flags = rng.getrandbits(16)
        version = GENL_VERSION if rng.random() < 0.5 else rng.getrandbits(8)
        reserved = 0 if rng.random() < 0.8 else rng.getrandbits(16)
        seq, data = genl.frame(cmd, attrs, flags=flags, version=version, reserved=reserved)
        roll = rng.random()
        if roll < 0.02:
            # Cut short, nlmsg_len saying so: the genetlink header or the attributes truncated.
            cut = rng.randrange(NLMSGHDR.size, len(data) + 1)
            data = struct.pack("=I", cut) + data[4:cut]
        elif roll < 0.03:
            # nlmsg_len past the datagram, or below a netlink header: dropped.
            size = rng.choice([len(data) + rng.randrange(1, 4096), rng.randrange(0, 16)])
            return seq, cmd, flags, struct.pack("=I", size) + data[4:], False
        elif roll < 0.035:
            # A datagram shorter than a netlink header.
            return seq, cmd, flags, data[: rng.randrange(1, 16)], False
        elif roll < 0.04:
            # Junk after the message, too short to be another one.
            return seq, cmd, flags, data + bytes(-len(data) % 4) + rng.randbytes(7), True
        return seq, cmd, flags, data, True

    def valid(self, genl: Genl, model: Model, cgroup_ids: list[int]) -> tuple[int, bytes]:
        """A well-formed command the model accepts, sent on purpose between the random ones:
        (command, attributes)."""
        rng = self.rng
        while True:
            cmd = rng.choice([Cmd.GPU_SET, Cmd.CGROUP_SET, Cmd.CGROUP_SET, Cmd.CGROUP_DEL])
            if cmd == Cmd.GPU_SET:
                attrs = put(Attr.GPU, rng.randrange(MAX_GPUS))
                attrs += put(Attr.POLICY, rng.randrange(3)) if rng.random() < 0.8 else b""
                attrs += put(Attr.PERIOD_US, rng.randint(PERIOD_MIN_US, PERIOD_MAX_US))
                for slice_attr in (Attr.OFFLINE_TIMESLICE_US, Attr.ONLINE_TIMESLICE_US):
                    if rng.random() < 0.3:
                        attrs += put(slice_attr, rng.randint(0, TIMESLICE_MAX_US))
                if rng.random() < 0.3:
                    attrs += put(Attr.OFFLINE_PREEMPTION, rng.randrange(2))
            elif cmd == Cmd.CGROUP_SET:
                attrs = (
                    put(Attr.CGROUP_ID, rng.choice(cgroup_ids))
                    + put(Attr.GPU, rng.randrange(3))
                    + put(Attr.CLASS, rng.randrange(2))
                    + put(Attr.SHARE, rng.randint(1, 60))
                    + (put(Attr.MEM_LIMIT, rng.getrandbits(40)) if rng.random() < 0.5 else b"")
                )
            else:
                attrs = put(Attr.CGROUP_ID, rng.choice(cgroup_ids))
            if (
                copy.deepcopy(model).expect(cmd, NLM_F_REQUEST, GENLHDR.pack(cmd, 1, 0) + attrs)
                == 0
            ):
                return cmd, attrs


def test_ten_thousand_fuzzed_messages(setup: Setup) -> None:
    seed = int(os.environ.get("QGPU_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"fuzz seed {seed} (QGPU_FUZZ_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    genl = setup.genl
    log_lines = len(kernel_log().splitlines())
    pool = [cg.id for cg in setup.cgs.values()]
    procs = os.stat(setup.cgs["spare"].path / "cgroup.procs").st_ino
    fuzzer = Fuzzer(rng, [*pool, *pool, procs, NONE, 0, (1 << 64) - 1])
    model = Model(setup.before, set(pool))
    outcomes: dict[str, int] = {}
    wrong: list[str] = []
    started = time.monotonic()
    for i in range(FUZZ_MESSAGES):
        if i % 50 == 49:
            cmd, attrs = fuzzer.valid(genl, model, pool)
            seq, data = genl.frame(cmd, attrs)
            flags, framed = NLM_F_REQUEST | NLM_F_ACK, True
        else:
            seq, cmd, flags, data, framed = fuzzer.message(genl)
        genl.send(data)
        reply = genl.drain(seq)
        size = struct.unpack_from("=I", data)[0] if len(data) >= 4 else 0
        # What the kernel should do (want: None, not looked at; else its errno, 0 if carried
        # out) and answer (expect: None, nothing; else the errno it acks or 0 for a dump).
        if not framed or size < NLMSGHDR.size:
            want = expect = None
        elif not flags & NLM_F_REQUEST:
            want, expect = None, (0 if flags & NLM_F_ACK else None)
        else:
            want = model.expect(cmd, flags, data[NLMSGHDR.size : size])
            dump = flags & NLM_F_DUMP == NLM_F_DUMP
            expect = want if want or flags & NLM_F_ACK or dump else None
        got = reply.outcome
        if i % 50 == 49:
            assert want == 0, f"message {i}: a deliberate command is refused by the model"
        if want is None:
            key = "ignored"
        else:
            key = ERRNO_NAMES.get(want, str(want)) if want else "carried out"
        outcomes[key] = outcomes.get(key, 0) + 1
        if got != expect and len(wrong) < 20:
            wrong.append(
                f"message {i} (seed {seed}): {data.hex()}: answered {got}, expected {expect}"
                f" ({reply.reason})"
            )
        if i % CHECK_EVERY == CHECK_EVERY - 1:
            assert not wrong, "\n".join(wrong)
            now = state(genl)
            assert model.matches(now), f"after message {i} (seed {seed}): {now} != model"
            print(f"{i + 1} messages, {time.monotonic() - started:.1f} s")
    elapsed = time.monotonic() - started
    print(f"{FUZZ_MESSAGES} messages in {elapsed:.1f} s: {sorted(outcomes.items())}")
    assert not wrong, "\n".join(wrong)
    assert model.matches(state(genl))
    # Every kind of answer came up, and commands were carried out along the way.
    assert {"EINVAL", "ERANGE", "ENOENT", "EOPNOTSUPP", "ignored"} <= outcomes.keys()
    assert outcomes["carried out"] >= FUZZ_MESSAGES // 50
    # The module still takes valid commands.
    unconfigure(genl)
    spare = setup.id("spare")
    assert cgroup_set(genl, spare, MAX_GPUS - 1, 1, 1, 1 << 20).error == 0
    assert state(genl).configs() == {spare: (MAX_GPUS - 1, 1, 1, 1 << 20)}
    assert cgroup_del(genl, spare).error == 0
    assert state(genl).configs() == {}
    bad = [line for line in kernel_log().splitlines()[log_lines:] if BAD_KERNEL_LOG.search(line)]
    assert not bad, "\n".join(bad)
