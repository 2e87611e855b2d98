"""Decoding one ioctl on an NVIDIA device file: what was asked and what the driver answered.

The input is what a capture holds: the request number, the node the fd refers to, the argument
bytes after the call and, for RM_ALLOC and RM_CONTROL, the bytes of the inner parameters after the
call. Inner parameters are decoded by class (allocations) or by command (controls), never by the
caller's ``paramsSize``: the driver ignores it for allocations and libcuda leaves it 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node


@dataclass(frozen=True, slots=True)
class Ioctl:
    node: Node
    cmd: int
    name: str
    escape: Escape | None = None
    size: int = 0
    size_ok: bool = True
    fields: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    alloc_class: int | None = None
    control: int | None = None

    @property
    def status(self) -> int | None:
        """RM's status for the escapes that carry one (the ioctl itself returns 0 then)."""
        for key in ("status", "Status"):
            if key in self.fields:
                return self.fields[key]
        return None

    def succeeded(self, ret: int) -> bool:
        """Whether the driver did what was asked: the syscall and RM both said yes."""
        return ret == 0 and self.size_ok and self.status in (None, abi.NvStatus.NV_OK)

    @property
    def control_name(self) -> str | None:
        return None if self.control is None else abi.control_name(self.control)


def decode(node: Node, cmd: int, arg: bytes, inner: bytes = b"") -> Ioctl:
    """Decode request ``cmd`` sent on ``node`` with argument bytes ``arg`` and inner ``inner``."""
    if node is Node.UVM:
        return Ioctl(node, cmd, abi.UVM_IOCTLS.get(cmd, f"uvm 0x{cmd:x}"))
    if node not in (Node.CTL, Node.GPU) or abi.ioc_type(cmd) != abi.NV_IOCTL_MAGIC:
        return Ioctl(node, cmd, f"ioctl 0x{cmd:x}")
    nr = abi.ioc_nr(cmd)
    size = abi.ioc_size(cmd)
    try:
        escape = Escape(nr)
    except ValueError:
        return Ioctl(node, cmd, f"escape 0x{nr:02x}", size=size, size_ok=False)
    size_ok = abi.escape_size_ok(escape, size)
    if escape is Escape.RM_ALLOC:
        layout = abi.rm_alloc_layout(size)
        if layout is None:
            return Ioctl(node, cmd, escape.name, escape, size, False)
        fields = layout.unpack(arg)
        cls = fields.get("hClass")
        params: dict[str, int] = {}
        if cls is not None:
            params_layout = abi.ALLOC_PARAMS_BY_KIND.get(abi.class_kind(cls))
            if params_layout is not None and fields.get("pAllocParms"):
                params = params_layout.unpack(inner)
        return Ioctl(node, cmd, escape.name, escape, size, size_ok, fields, params, alloc_class=cls)
    layout = abi.ESCAPE_LAYOUTS.get(escape)
    fields = layout.unpack(arg) if layout is not None else {}
    if escape is Escape.RM_CONTROL:
        control = fields.get("cmd")
        params = {}
        if control is not None and control in abi.CONTROLS:
            params = abi.CONTROLS[control].params.unpack(inner)
        return Ioctl(node, cmd, escape.name, escape, size, size_ok, fields, params, control=control)
    if escape is Escape.RM_ALLOC_MEMORY:
        return Ioctl(
            node,
            cmd,
            escape.name,
            escape,
            size,
            size_ok,
            fields,
            alloc_class=fields.get("hClass"),
        )
    return Ioctl(node, cmd, escape.name, escape, size, size_ok, fields)
