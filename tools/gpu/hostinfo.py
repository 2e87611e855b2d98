"""What a GPU tool's result records about the machine it ran on."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def host_facts() -> dict[str, Any]:
    """The date, the kernel and the NVIDIA driver's version line (absent where unreadable)."""
    facts: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        facts["uname"] = os.uname().release
        facts["driver"] = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except OSError:
        pass
    return facts
