"""Load qpolicy's probe as the daemon loads it, say so in a file, and hold it for a while.

    python3 -m tools.gpu.hold_probe SECONDS READY_FILE

For A/B runs of a workload with and without the probe's programs attached
(tools/gpu/launch-call-ab.sh): its tracepoints and libcuda uprobes act on every process of the
machine, whichever process holds them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from qpolicy.telemetry.probe import NvProbe


def main() -> int:
    seconds, ready = float(sys.argv[1]), Path(sys.argv[2])
    probe = NvProbe().start()
    try:
        ready.write_text("ready\n")
        time.sleep(seconds)
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
