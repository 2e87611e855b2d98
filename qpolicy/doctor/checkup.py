"""The doctor on this node: the checks before, the probe and descriptors, the cache after."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from qpolicy.doctor.lab import Lab
from qpolicy.doctor.report import write_cache
from qpolicy.doctor.run import Doctor, DoctorConfig
from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.errors import QPolicyError
from qpolicy.nvrm.tracker import Tracker
from qpolicy.telemetry.gpus import node_gpus
from qpolicy.telemetry.probesource import ProbeSource

NVIDIA_CTL = Path("/dev/nvidiactl")
DRIVER_VERSION = Path("/proc/driver/nvidia/version")


def driver_version(text: str | None = None) -> str | None:
    """The driver's version from ``/proc/driver/nvidia/version`` (``580.159.04``)."""
    if text is None:
        try:
            text = DRIVER_VERSION.read_text()
        except OSError:
            return None
    match = re.search(r"Kernel Module(?: for \w+)?\s+([0-9][0-9.]+)", text)
    return match.group(1) if match else None


def preflight(gpu: int) -> dict[str, Any]:
    """Refuse clearly what cannot work; the GPU as the report names it."""
    if os.geteuid() != 0:
        raise QPolicyError(
            "qpolicy doctor needs root: it loads the eBPF probe and sends RM controls on its "
            "workloads' objects (pidfd_getfd)"
        )
    if not NVIDIA_CTL.exists():
        raise QPolicyError(f"qpolicy doctor needs an NVIDIA GPU: {NVIDIA_CTL} is missing")
    gpus = {info.index: info for info in node_gpus()}
    if gpus and gpu not in gpus:
        raise QPolicyError(f"no GPU {gpu} here: this node has GPU(s) {', '.join(map(str, gpus))}")
    if importlib.util.find_spec("torch") is None:
        raise QPolicyError(
            "qpolicy doctor runs PyTorch matmuls as its workloads: `import torch` fails in this "
            "Python"
        )
    info = gpus.get(gpu)
    return {
        "index": gpu,
        "name": info.model if info else None,
        "uuid": info.uuid if info else None,
        "bus": info.bus if info else None,
        "driver": driver_version(),
    }


class _ProbeHandles:
    def __init__(self, source: ProbeSource) -> None:
        self.source = source

    @property
    def tracker(self) -> Tracker:
        return self.source.view.tracker

    def refresh(self) -> None:
        self.source.refresh()


def checkup(config: DoctorConfig, state_dir: Path | None) -> dict[str, Any]:
    """Run the doctor on GPU ``config.gpu``; the report, cached under ``state_dir`` if given."""
    gpu_info = preflight(config.gpu)
    from qpolicy.telemetry.probe import NvProbe  # bcc is imported only when the doctor runs

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    try:
        lab = Lab(config.gpu, _ProbeHandles(source), files)
        report = Doctor(lab, config).run(gpu_info)
    finally:
        files.close_all()
        source.close()
    if state_dir is not None:
        report["cached_in"] = str(write_cache(state_dir, report))
    return report
