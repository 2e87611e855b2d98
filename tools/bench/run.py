"""`make bench`: run the benchmarks, print a summary, write bench-results/<name>.json.

python tools/bench/run.py [engine] [sim] [targets] [exporter] [probe] [probemaps] [daemon]
    [annotations] [unseen] [cgroupids]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import (
    annotations,
    cgroupids,
    daemon,
    engine,
    exporter,
    probe,
    probemaps,
    sim,
    targets,
    unseen,
)
from tools.bench.common import machine

BENCHES = {
    "engine": engine.run,
    "sim": sim.run,
    "targets": targets.run,
    "exporter": exporter.run,
    "probe": probe.run,
    "probemaps": probemaps.run,
    "daemon": daemon.run,
    "annotations": annotations.run,
    "unseen": unseen.run,
    "cgroupids": cgroupids.run,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*BENCHES, []], help="benchmarks to run")
    parser.add_argument("--out", default="bench-results", help="directory for the JSON results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    host = machine()
    print(
        f"# {host['date']}  {host['cpu']} x{host['cores']}  python {host['python']}  "
        f"commit {host['commit']}"
    )
    failed = False
    for name in args.names or list(BENCHES):
        result = BENCHES[name]()
        document = {"bench": name, "machine": host, "result": result}
        (out / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
        print(f"\n## {name}")
        print(json.dumps(result, indent=2))
        if "skipped" in result:
            continue  # not measurable here (the probe needs root): reported, neither met nor missed
        failed |= not _met(result)
    print(f"\nresults in {out}/")
    # A missed target is reported, not hidden: the exit status says so.
    return 1 if failed else 0


def _met(result: dict[str, object]) -> bool:
    if "meets_target" in result:
        return bool(result["meets_target"])
    scenarios = result.get("scenarios", {})
    assert isinstance(scenarios, dict)
    return all(bool(row["meets_target"]) for row in scenarios.values())


if __name__ == "__main__":
    raise SystemExit(main())
