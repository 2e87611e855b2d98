"""The node's NVIDIA GPUs: index, UUID, PCI address and device minor, from the driver's procfs.

``/proc/driver/nvidia/gpus/<domain:bus:slot.fn>/information`` (written by nvidia.ko,
``kernel-open/nvidia/nv-procfs.c``, ``nv_procfs_read_gpu_info``) names each GPU's model, UUID, bus
location and device minor. A GPU's *index* is the one ``nvidia-smi`` and NVML print: NVML numbers
GPUs in PCI bus order, so sorting by bus location gives the same numbers without loading NVML.
Users name a GPU by index or by UUID (``GPU-8f6f...``, as Kubernetes' device plugin does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from qpolicy.errors import ValidationError
from qpolicy.model import parse_gpu_index

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_UUID_RE = re.compile(r"GPU-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str | None
    bus: str  # domain:bus:slot.function, lower case
    minor: int | None
    model: str | None

    def on_bus(self, address: str) -> bool:
        """Whether ``address`` (``domain:bus:slot``, any case, function optional) is this GPU."""
        return self.bus.startswith(address.lower())


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def node_gpus(root: Path | None = None) -> list[GpuInfo]:
    """The GPUs nvidia.ko drives here, by index; empty where there are none (or no driver)."""
    found: list[tuple[str, dict[str, str]]] = []
    try:
        entries = sorted((root or PROC_GPUS).iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            fields = _fields((entry / "information").read_text())
        except OSError:
            continue
        found.append((fields.get("Bus Location", entry.name).lower(), fields))
    gpus = []
    for index, (bus, fields) in enumerate(sorted(found)):
        minor = fields.get("Device Minor", "")
        gpus.append(
            GpuInfo(
                index=index,
                uuid=fields.get("GPU UUID") or None,
                bus=bus,
                minor=int(minor) if minor.isdigit() else None,
                model=fields.get("Model") or None,
            )
        )
    return gpus


def parse_gpu(text: str, gpus: list[GpuInfo] | None = None) -> int:
    """A GPU named by index (``0``) or UUID (``GPU-8f6f...``); the index it has on this node."""
    stripped = text.strip()
    if not stripped.upper().startswith("GPU-"):
        return parse_gpu_index(text)
    if not _UUID_RE.fullmatch(stripped):
        raise ValidationError(f"invalid GPU {text!r}: a GPU UUID looks like GPU-xxxxxxxx-xxxx-...")
    known = node_gpus() if gpus is None else gpus
    for gpu in known:
        if gpu.uuid is not None and gpu.uuid.lower() == stripped.lower():
            return gpu.index
    where = f"{len(known)} GPU(s) here" if known else "no NVIDIA GPU here"
    raise ValidationError(f"invalid GPU {text!r}: no GPU of that UUID on this node ({where})")
