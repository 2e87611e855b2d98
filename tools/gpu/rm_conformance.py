"""What the real NVIDIA driver answers to the RM calls nvmock models (tests/vm/rmcases.py).

Run as root on a GPU machine with the repository on PYTHONPATH (``tools/gpu/bcc-env.sh`` puts it
there; bcc itself is not needed):

    python3 tools/gpu/rm_conformance.py --gpu 0 --out rm-conformance.json

Each case makes RM objects of its own (clients, memory, a TSG without channels) and frees them:
it changes no setting of the GPU and touches no other process's objects. The answers are kept
in tools/gpu/results/, where tests/vm/test_nvmock_reality.py compares nvmock's with them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tests.vm import rmcases
from tests.vm.rmclient import Rm
from tools.gpu.hostinfo import host_facts


def gpu_info(index: int) -> dict[str, str]:
    """The GPU's model, UUID and bus location, from the driver's procfs (empty where
    unreadable): which card, and so which host, a recording came from."""
    try:
        for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
            lines = {
                key.strip(): value.strip()
                for key, value in (
                    line.split(":", 1) for line in info.read_text().splitlines() if ":" in line
                )
            }
            if lines.get("Device Minor") == str(index):
                return {
                    "model": lines.get("Model", ""),
                    "uuid": lines.get("GPU UUID", ""),
                    "bus": lines.get("Bus Location", ""),
                }
    except OSError:
        pass
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0, help="the GPU's minor number")
    parser.add_argument("--out", required=True, help="where the answers go (JSON)")
    parser.add_argument("--only", action="append", help="run this case only (repeatable)")
    args = parser.parse_args()
    unknown = set(args.only or ()) - set(rmcases.CASES)
    if unknown:
        print(f"rm_conformance: no such case: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    rm = Rm(args.gpu)
    try:
        answers = rmcases.run(rm, args.only)
    finally:
        rm.close()
    result: dict[str, Any] = host_facts()
    info = gpu_info(args.gpu)
    result.update(gpu=info.get("model"), card=info, cases=answers)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    failed = [name for name, answer in answers.items() if "error" in answer]
    print(f"{len(answers)} cases, {len(failed)} raised: {', '.join(failed) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
