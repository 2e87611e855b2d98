"""What it costs to take the daemon's eBPF probe down: why a killed daemon takes ~15 s to exit.

A daemon killed with SIGKILL on an H200 took 14.7-15.3 s to be reaped (tools/gpu/daemon_restart.py,
call 22A), and a clean stop as long; the next daemon starts only after, and a pod the killed one had
closed stays closed meanwhile. The probe is the daemon's only kernel state, so each case here loads
it alone in a child process (``NvProbe``, as the daemon does) and times its end:

- ``kill``: SIGKILL, then the time until the child is reaped (the kernel tears the probe down);
- ``exit``: the child exits without closing the probe (``os._exit``), the same teardown unasked;
- ``close``: the child closes it (bcc's ``cleanup``: one uprobe after another), then exits;
- ``pclose``: the child closes the uprobes' perf events from many threads at once, then the rest.

Each with libcuda's uprobes (launches, waits, copies, queries) as uprobe-multi links where the
kernel takes them (``auto``, the probe's default), as one perf event each (``perf``, what the probe
did before, and does where links are refused), and without them (``none``): if the time goes with
them, it is the uprobes' teardown.

As root on a GPU machine with the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/probe_teardown.py --out teardown.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES = ("kill", "exit", "close", "pclose")
LIBCUDA = ("auto", "perf", "none")
PARALLEL = 32
WAIT_S = 120.0


def child(libcuda: str, end: str) -> int:
    """Load the probe, say so on stdout, then end as ``end`` says (``kill``: wait for it)."""
    import os

    from qpolicy.telemetry.probe import NvProbe

    began = time.monotonic()
    probe = NvProbe(
        libcuda=None if libcuda == "none" else "auto", uprobe_multi=libcuda == "auto"
    ).start()
    bpf: Any = probe._bpf
    report: dict[str, Any] = {
        "load_s": round(time.monotonic() - began, 3),
        "features": {k: str(v) for k, v in probe.features.items()},
        "uprobe_fds": len(getattr(bpf, "uprobe_fds", {})),
        "uprobe_multi_links": len(probe._links),
        "kprobe_fds": len(getattr(bpf, "kprobe_fds", {})),
        "tracepoint_fds": len(getattr(bpf, "tracepoint_fds", {})),
    }
    print(json.dumps(report), flush=True)
    if end in ("kill", "exit"):
        sys.stdin.readline()  # the parent kills us, or says exit
        os._exit(0)
    began = time.monotonic()
    if end == "pclose":
        from bcc.libbcc import lib  # what bcc's detach_uprobe closes each one with

        fds = list(bpf.uprobe_fds.values())
        close = lib.bpf_close_perf_event_fd
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(close, fds))
        for name in list(bpf.uprobe_fds):
            lib.bpf_detach_uprobe(name)  # a tracefs event, where bcc made one (none with a PMU)
        bpf.uprobe_fds.clear()
        report = {"uprobes_closed_s": round(time.monotonic() - began, 3)}
    probe.close()
    report["close_s"] = round(time.monotonic() - began, 3)
    print(json.dumps(report), flush=True)
    os._exit(0)


def measure(libcuda: str, end: str) -> dict[str, Any]:
    """One case, timed from this side: load, then the end until the child is reaped."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", libcuda, end],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(WAIT_S)
        assert proc.stderr is not None
        return {"libcuda": libcuda, "end": end, "error": proc.stderr.read()[-2000:]}
    out: dict[str, Any] = {"libcuda": libcuda, "end": end, **json.loads(line)}
    began = time.monotonic()
    if end == "kill":
        proc.kill()
    elif end == "exit":
        proc.stdin.write("\n")
        proc.stdin.flush()
    rest, _ = proc.communicate(timeout=WAIT_S)
    out["reaped_s"] = round(time.monotonic() - began, 3)
    for text in rest.splitlines():
        out.update(json.loads(text))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("probe-teardown.json"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ends", default=",".join(CASES), help="of " + ",".join(CASES))
    parser.add_argument("--libcuda", default=",".join(LIBCUDA), help="of " + ",".join(LIBCUDA))
    parser.add_argument("--child", nargs=2, metavar=("LIBCUDA", "END"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    results = []
    for _ in range(args.repeats):
        for libcuda in args.libcuda.split(","):
            for end in args.ends.split(","):
                result = measure(libcuda, end)
                results.append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "features"}), flush=True)
    args.out.write_text(json.dumps({"date": time.time(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
