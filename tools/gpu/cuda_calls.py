"""Which libcuda entry points a workload calls, and how often: what the probe could watch.

Run as root on a GPU machine with bcc importable (``source tools/gpu/bcc-env.sh``):

    python3 tools/gpu/cuda_calls.py [--pattern REGEX] [--out calls.json] -- COMMAND...

A uprobe on every libcuda function whose name matches ``--pattern`` (by default the stream, event,
context and launch calls) counts the calls made by COMMAND's process, by name. The probe's
activity signal (enforcers/rm/sensor.py) is only as good as the calls it watches: this shows,
for instance, what PyTorch's ``Stream.query()`` enters in the driver library. Prints one JSON
object: the command, the library, and the counts of the functions called at least once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from qpolicy.telemetry.libcuda import find_libcuda, probe_address

DEFAULT_PATTERN = r"^cu(Stream|Event|Ctx|Launch|Graph|Memcpy)[A-Za-z0-9_]*$"

_PROGRAM = """
#include <uapi/linux/ptrace.h>
BPF_ARRAY(counts, u64, %(n)d);
static __always_inline int count(u32 index)
{
    u64 *slot;

    if ((bpf_get_current_pid_tgid() >> 32) != %(tgid)d)
        return 0;
    slot = counts.lookup(&index);
    if (slot)
        __sync_fetch_and_add(slot, 1);
    return 0;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default="auto", help="libcuda to probe (default: search)")
    parser.add_argument("--pattern", default=DEFAULT_PATTERN)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run (give it after --)")
    library = find_libcuda(args.lib)
    if library is None:
        parser.error("no libcuda found (give --lib)")
    from bcc import BPF  # type: ignore[import-not-found]

    found = BPF.get_user_functions_and_addresses(str(library).encode(), args.pattern.encode())
    by_address: dict[int, list[str]] = {}
    for name, address in found:
        by_address.setdefault(probe_address(library, int(address)), []).append(name.decode())
    addresses = sorted(by_address)
    # The command waits for a line on stdin, so that its pid is filtered before it runs.
    child = subprocess.Popen(
        ["sh", "-c", 'read _ && exec "$@"', "sh", *command], stdin=subprocess.PIPE, text=True
    )
    text = _PROGRAM % {"n": max(len(addresses), 1), "tgid": child.pid}
    text += "".join(
        f"int at_{i}(struct pt_regs *ctx) {{ return count({i}); }}\n" for i in range(len(addresses))
    )
    bpf = BPF(text=text.encode())
    for i, address in enumerate(addresses):
        bpf.attach_uprobe(name=str(library).encode(), addr=address, fn_name=f"at_{i}".encode())
    start = time.monotonic()
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.close()
    code = child.wait()
    seconds = time.monotonic() - start
    table = bpf[b"counts"]
    counts = [int(table[table.Key(i)].value) for i in range(len(addresses))]
    called = {
        "/".join(sorted(set(by_address[address]))): count
        for address, count in zip(addresses, counts, strict=True)
        if count
    }
    result = {
        "command": command,
        "exit": code,
        "seconds": round(seconds, 3),
        "libcuda": str(library),
        "pattern": args.pattern,
        "functions_probed": len(addresses),
        "calls": dict(sorted(called.items(), key=lambda item: -item[1])),
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.out is not None:
        args.out.write_text(line + "\n")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
