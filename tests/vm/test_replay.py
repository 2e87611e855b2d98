"""The RM traffic of a real PyTorch process on an H200, replayed against nvmock: every allocation,
control and free of a class or command nvmock models gets the status the real driver gave."""

from __future__ import annotations

from collections import Counter

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node
from qpolicy.nvrm.replay import builtin_records
from tests.vm.rmclient import NVOS00, NVOS54, NVOS64, Alloc, Rm

# Parameter sizes of the classes nvmock models (RM copies this many, whatever paramsSize says).
CLASS_PARAMS = {
    0x41: 0, 0x80: 56, 0x2080: 4, 0xC661: 2, 0x90F1: 56, 0x9067: 12, 0xA06C: 20,
    0xC86F: 368, 0xC56F: 368, 0xCBC0: 16, 0xC8B5: 8, 0x3E: 128, 0x40: 128,
}  # fmt: skip
CONTROLS = {
    0xA06C0101, 0xA06C0103, 0xA06C0104, 0xA06C0105, 0xA06C0107, 0xA06C0108,
    0xA06F0103, 0xC36F0108, 0x2080110B, 0x20801210,
}  # fmt: skip


def replay(rm: Rm) -> tuple[Counter[str], list[str]]:
    nodes: dict[int, Node] = {}
    clients: dict[int, int] = {}  # trace client handle -> nvmock's
    objects: set[tuple[int, int]] = set()  # (trace client, handle) allocated here
    compared: Counter[str] = Counter()
    mismatches: list[str] = []

    def check(what: str, expected: int, got: int) -> None:
        compared[what.split()[0]] += 1
        if expected != got:
            mismatches.append(
                f"{what}: driver {abi.status_name(expected)}, nvmock {abi.status_name(got)}"
            )

    for record in builtin_records():
        if record.kind == "open":
            nodes[record.ret] = Node.of_path(record.s)
            continue
        if record.kind != "ioctl" or nodes.get(record.fd) not in (Node.CTL, Node.GPU):
            continue
        if abi.ioc_type(record.cmd) != abi.NV_IOCTL_MAGIC:
            continue
        nr, size = abi.ioc_nr(record.cmd), abi.ioc_size(record.cmd)
        if nr == Escape.RM_ALLOC and size == NVOS64.size:
            root, parent, new, cls, params_ptr, *_rest = NVOS64.unpack(record.p[: NVOS64.size])
            status = NVOS64.unpack(record.p[: NVOS64.size])[8]
            if cls not in CLASS_PARAMS or record.ret != 0:
                continue
            if cls == 0x41:
                result = rm.alloc(0, 0, cls)
                check(f"alloc class 0x{cls:x}", status, result.status)
                clients[new] = result.handle
                continue
            if root not in clients or (parent != root and (root, parent) not in objects):
                continue  # under an object of a class nvmock does not model
            size_params = CLASS_PARAMS[cls]
            params = record.q.ljust(size_params, b"\0")[:size_params] if params_ptr else None
            mine = clients[root]
            result = rm.alloc(mine, mine if parent == root else parent, cls, params, handle=new)
            check(f"alloc class 0x{cls:x} handle 0x{new:x}", status, result.status)
            if result.status == 0:
                objects.add((root, new))
        elif nr == Escape.RM_CONTROL and size == NVOS54.size:
            client, obj, cmd, _flags, _ptr, params_size, status = NVOS54.unpack(
                record.p[: NVOS54.size]
            )
            if cmd not in CONTROLS or client not in clients or (client, obj) not in objects:
                continue
            got, _ = rm.control(
                clients[client], obj, cmd, record.q[:params_size].ljust(params_size, b"\0")
            )
            check(f"control 0x{cmd:08x} on 0x{obj:x}", status, got)
        elif nr == Escape.RM_FREE and size == NVOS00.size:
            root, parent, old, status = NVOS00.unpack(record.p[: NVOS00.size])
            if root not in clients or (old != root and (root, old) not in objects):
                continue
            mine = clients[root]
            got = rm.free(mine, mine if parent == root else parent, mine if old == root else old)
            check(f"free 0x{old:x}", status, got)
            if old == root:
                del clients[root]
    for mine in clients.values():
        rm.free(mine, mine, mine)
    return compared, mismatches


def test_a_pytorch_process_gets_the_statuses_the_h200_gave() -> None:
    rm = Rm()
    try:
        compared, mismatches = replay(rm)
    finally:
        rm.close()
    assert not mismatches, "\n".join(mismatches)
    # Not a vacuous pass: the trace's modelled traffic was all there.
    assert compared["alloc"] >= 150 and compared["control"] >= 20, compared


def test_the_replay_catches_a_status_that_differs() -> None:
    """The check is not a no-op: a driver that refused TSGs would be caught."""
    rm = Rm()
    real_alloc = rm.alloc

    def no_tsgs(
        root: int, parent: int, cls: int, params: bytes | None = None, handle: int = 0
    ) -> Alloc:
        if cls == 0xA06C:
            return Alloc(abi.NvStatus.NV_ERR_NO_MEMORY, 0, b"")
        return real_alloc(root, parent, cls, params, handle)

    rm.alloc = no_tsgs  # type: ignore[method-assign]
    try:
        _, mismatches = replay(rm)
    finally:
        rm.close()
    assert any("alloc class 0xa06c" in line for line in mismatches)
