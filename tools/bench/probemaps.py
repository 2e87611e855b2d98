"""The probe's map reads as the daemon makes them: bcc's item iteration against batch lookups,
and the single-cgroup read of a look at the pod holding the GPU.

The rm enforcer reads the per-cgroup launch counters at every poll that reads every pod (turn
ends, period steps; a look at the holder reads its cgroup alone), and the daemon reads every
counter map when Prometheus scrapes it. The kernel maps are filled from
userspace with what a GPU host holds: 40 cgroups, 8 ioctl codes and 8 controls each. Each read
runs three ways on the same loaded probe (``NvProbe._batch_lookup`` off; bcc's
``items_lookup_batch``, which allocates arrays for the map's 16 384 entries at every read; the
probe's own batch reader, qpolicy/telemetry/mapbatch.py), so the comparison is from one run.
"""

from __future__ import annotations

import time
from typing import Any

from tools.bench.probe import _why_not

CGROUPS = 40
CODES = 8
LAUNCH_READS = 200
COUNTER_READS = 50


def run() -> dict[str, Any]:
    why = _why_not()
    if why is not None:
        return {"skipped": why}
    from qpolicy.telemetry.devices import DeviceFilter
    from qpolicy.telemetry.probe import NvProbe

    # Any two character devices stand for the NVIDIA nodes: nothing here sends them an ioctl.
    with NvProbe(DeviceFilter.parse(("1:7=ctl", "1:5=uvm")), libcuda=None) as probe:
        bpf = probe._bpf
        stats, ioctls, controls = bpf[b"stats"], bpf[b"ioctls"], bpf[b"controls"]
        for index in range(CGROUPS):
            cgroup = 1000 + index
            leaf = stats.Leaf()
            leaf.launches = index
            stats[stats.Key(cgroup)] = leaf
            for code in range(CODES):
                key = ioctls.Key()
                key.cgroup, key.code = cgroup, code
                ioctls[key] = ioctls.Leaf(5)
                control = controls.Key()
                control.cgroup, control.value = cgroup, code
                controls[control] = controls.Leaf(3)
        result: dict[str, Any] = {"cgroups": CGROUPS}
        for way in ("items", "bcc_batch", "batch"):
            probe._batch_lookup = way == "batch"
            if way == "bcc_batch":
                # bcc's own batch read (until 2026-12-02): arrays of max_entries per read.
                probe._items = lambda name: list(bpf[name].items_lookup_batch())  # type: ignore[method-assign]
            else:
                probe.__dict__.pop("_items", None)
            start = time.perf_counter()
            for _ in range(LAUNCH_READS):
                launches = probe.launches()
            per_launches = (time.perf_counter() - start) / LAUNCH_READS
            start = time.perf_counter()
            for _ in range(COUNTER_READS):
                counters = probe.counters()
            per_counters = (time.perf_counter() - start) / COUNTER_READS
            assert len(launches) == len(counters) == CGROUPS
            result[way] = {
                "launches_us": round(per_launches * 1e6, 1),
                "counters_ms": round(per_counters * 1e3, 2),
            }
        result["batch_supported"] = probe._batch_lookup
        # The rm enforcer's look at the pod holding the GPU: its own cgroup, read alone.
        start = time.perf_counter()
        for _ in range(LAUNCH_READS):
            one = probe.launches_of([1000])
        result["launches_of_one_us"] = round((time.perf_counter() - start) / LAUNCH_READS * 1e6, 1)
        assert one == {1000: 0}
    # Not a target: the batched reads must not be slower than the item iteration or bcc's
    # batch read they replace.
    result["meets_target"] = all(
        result["batch"][what] <= result[other][what]
        for other in ("items", "bcc_batch")
        for what in ("launches_us", "counters_ms")
    )
    return result
