#!/usr/bin/env bash
# On a GPU machine, as root: one online row of tools/bench/gpu.py from this tree (a) and from
# another (b, e.g. `git archive PREV | tar -x -C ../prev`), interleaved in one call, with the
# GPU's SM clock, power and clock-event reasons sampled every 100 ms beside them. The first run
# also runs native and the solos; the others reuse its solos. Read it with tools/gpu/ab_runs.py.
#
#   tools/gpu/ab-row.sh OUT_DIR PREV_TREE "a1 b1 a2 b2" ROW [bench-gpu.sh arguments...]
#
# ROW, bench-gpu.sh's --only, is a prefix of the scenario's name: one that starts several rows
# is refused. Each run NAME leaves OUT_DIR/NAME/bench.json.xz and OUT_DIR/logs-NAME.tar.xz (the
# daemon's logs); OUT_DIR/smi.csv.xz the samples. A run that would start past AB_ROW_BUDGET_S
# (500) seconds is not started, so that a device call's limit is not met half-way through one.
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
out=$(realpath -m "$1") prev=$(realpath "$2") order=$3 row=$4
shift 4
here=$(cd "$(dirname "$0")/../.." && pwd)
budget=${AB_ROW_BUDGET_S:-500}
for name in $order; do
    if [[ ! $name =~ ^[ab][A-Za-z0-9_-]*$ ]]; then
        echo "ab-row: bad run name '$name': a... (this tree) or b... (PREV_TREE)" >&2
        exit 2
    fi
done
matches=$(cd "$here" && tools/gpu/bench-gpu.sh --only "$row" --list | grep -c . || true)
if [ "$matches" != 1 ]; then
    echo "ab-row: ROW '$row' starts $matches rows of tools/bench/gpu.py, not one" >&2
    exit 2
fi
mkdir -p "$out"
query=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
if nvidia-smi --query-gpu="$query,clocks_event_reasons.active" --format=csv >/dev/null 2>&1; then
    query=$query,clocks_event_reasons.active
fi
nvidia-smi --query-gpu="$query" --format=csv -lms 100 >"$out/smi.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null || true' EXIT
solo=""
for name in $order; do
    if [ "$SECONDS" -ge "$budget" ]; then
        echo "ab-row: $name not started: ${SECONDS} s gone of $budget" >&2
        break
    fi
    tree=$here
    [[ $name == b* ]] && tree=$prev
    mkdir -p "$out/$name"
    echo "== $name ($tree) at $(date -u +%T), ${SECONDS} s in"
    if [ -z "$solo" ]; then
        modes=(--modes native,qpolicy)
    else
        modes=(--modes qpolicy --solo-from "$solo")
    fi
    if ! (cd "$tree" && tools/gpu/bench-gpu.sh --only "$row" "${modes[@]}" --daemon-logs \
        --out "$out/$name/bench.json" "$@" 2>&1 | tail -5); then
        echo "ab-row: $name failed" >&2
    fi
    if compgen -G "$out/$name/*.log" >/dev/null; then
        (cd "$out" && tar -cJf "logs-$name.tar.xz" "$name"/*.log && rm -f "$name"/*.log)
    fi
    [ -f "$out/$name/bench.json" ] || continue
    [ -n "$solo" ] || solo=$out/$name/bench.json
    xz -9 -k "$out/$name/bench.json"
done
kill $smi 2>/dev/null || true
rm -f "$out"/*/bench.json
xz -9 -f "$out/smi.csv"
echo "ab-row: done in ${SECONDS} s"
