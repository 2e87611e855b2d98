"""Which character devices the probe watches, and which NVIDIA node each one stands for.

By default: every minor of major 195 (nvidiaN, nvidiactl, nvidia-modeset) and the dynamic majors
of nvidia-uvm and nvidia-caps from ``/proc/devices``. Tests override the filter with ordinary
devices (``1:7=ctl``: /dev/full stands for /dev/nvidiactl) so the RM decoding path runs on a
machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qpolicy.errors import ValidationError
from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Node

PROC_DEVICES = Path("/proc/devices")
CAPS_DEVICE_NAME = "nvidia-caps"
MAX_MINOR = (1 << 20) - 1

NODE_ALIASES: dict[str, Node] = {
    "ctl": Node.CTL,
    "gpu": Node.GPU,
    "uvm": Node.UVM,
    "modeset": Node.MODESET,
    "caps": Node.CAPS,
    "other": Node.OTHER,
    **{node.value: node for node in Node},
}


def char_majors(text: str) -> dict[str, int]:
    """Driver name -> major of the character devices in ``/proc/devices`` text."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
            continue
        if line.startswith("Block devices"):
            in_char = False
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Devices by (major, minor), and majors whose every minor is one node."""

    exact: Mapping[tuple[int, int], Node] = field(default_factory=dict)
    majors: Mapping[int, Node] = field(default_factory=dict)

    def node_of(self, major: int, minor: int) -> Node:
        node = self.exact.get((major, minor))
        if node is None:
            node = self.majors.get(major, Node.OTHER)
        return node

    def __bool__(self) -> bool:
        return bool(self.exact or self.majors)

    def describe(self) -> str:
        parts = [f"{ma}:{mi}={node.value}" for (ma, mi), node in sorted(self.exact.items())]
        parts += [f"{ma}:*={node.value}" for ma, node in sorted(self.majors.items())]
        return ", ".join(parts)

    @classmethod
    def nvidia(cls, proc_devices: str | None = None) -> DeviceFilter:
        """The NVIDIA device files of this machine."""
        if proc_devices is None:
            try:
                proc_devices = PROC_DEVICES.read_text()
            except OSError:
                proc_devices = ""
        majors = char_majors(proc_devices)
        exact = {
            (abi.NV_MAJOR, minor): abi.Node.of_device(abi.NV_MAJOR, minor, None)
            for minor in range(256)
        }
        dynamic: dict[int, Node] = {}
        if abi.UVM_DEVICE_NAME in majors:
            dynamic[majors[abi.UVM_DEVICE_NAME]] = Node.UVM
        if CAPS_DEVICE_NAME in majors:
            dynamic[majors[CAPS_DEVICE_NAME]] = Node.CAPS
        return cls(exact, dynamic)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> DeviceFilter:
        """``MAJOR:MINOR=NODE`` or ``MAJOR:*=NODE`` items (NODE: ctl, gpu, uvm, ...)."""
        exact: dict[tuple[int, int], Node] = {}
        majors: dict[int, Node] = {}
        for spec in specs:
            device, sep, name = spec.partition("=")
            major_text, colon, minor_text = device.partition(":")
            node = NODE_ALIASES.get(name.strip().lower())
            if not sep or not colon or node is None:
                raise ValidationError(
                    f"device {spec!r}: expected MAJOR:MINOR=NODE with NODE one of "
                    f"{', '.join(sorted(NODE_ALIASES))}"
                )
            major = _number(spec, major_text, 4095)
            if minor_text.strip() == "*":
                majors[major] = node
            else:
                exact[(major, _number(spec, minor_text, MAX_MINOR))] = node
        return cls(exact, majors)


def _number(spec: str, text: str, limit: int) -> int:
    try:
        value = int(text.strip(), 0)
    except ValueError:
        raise ValidationError(f"device {spec!r}: {text!r} is not a device number") from None
    if not 0 <= value <= limit:
        raise ValidationError(f"device {spec!r}: {value} is out of range 0..{limit}")
    return value
