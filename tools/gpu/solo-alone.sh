#!/usr/bin/env bash
# On a GPU machine: the online bench's solo stream alone (tools/gpu/matmul.py, 3001 requests at
# 150 Hz, 4096 bf16, plain), in pairs, each pair once without and once with nvidia-smi sampling
# the GPU every 250 ms beside it, and tools/gpu/host_noise.py sampling the host's CPU beside each
# run. Why: the bench's solos on H100 hosts were unstable (p99 over 2x p50) in every run of calls
# 41B and 42B, where nvidia-smi also sampled; call 42C ran this to tell the sampler from the host
# (it was the host: tools/gpu/late_tails.py, BENCHMARKS.md). Read it with late_tails.py.
#
#   tools/gpu/solo-alone.sh OUT_DIR [PAIRS [SECONDS]]   # 3 pairs of 20 s runs by default
#
# OUT_DIR/solo-alone.tar holds solo-{off,on}-I.json.xz (matmul.py's line, late_ms included),
# smi-on-I.csv.xz and noise-{off,on}-I.json.xz: one file, as a device call returns few.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 3 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
out=$(realpath -m "$1") pairs=${2:-3} seconds=${3:-20}
case $pairs in '' | *[!0-9]* | 0*) echo "solo-alone: PAIRS must be a positive whole number, not '$pairs'" >&2; exit 2 ;; esac
if ! python3 -c 'import sys; assert 0 < float(sys.argv[1]) <= 600' "$seconds" 2> /dev/null; then
    echo "solo-alone: SECONDS must be a number of seconds in (0, 600], not '$seconds'" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
query=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active
for i in $(seq 1 "$pairs"); do
    for smi in off on; do
        tag=$smi-$i sampler=
        if [ "$smi" = on ]; then
            nvidia-smi --query-gpu="$query" --format=csv -lms 250 > "$work/smi-$tag.csv" 2>&1 &
            sampler=$!
        fi
        # Stopped (SIGTERM: it writes what it has) once the run is done.
        python3 "$here/tools/gpu/host_noise.py" --seconds 900 --out "$work/noise-$tag.json" > /dev/null &
        noise=$!
        python3 "$here/tools/gpu/matmul.py" --n 4096 --requests-hz 150 --plain --seconds "$seconds" \
            --label "solo-$tag" > "$work/solo-$tag.json"
        [ -z "$sampler" ] || kill "$sampler"
        kill "$noise"
        wait "$noise" || echo "solo-alone: the host sampler beside $tag wrote nothing" >&2
    done
done
xz -9 "$work"/*.json "$work"/*.csv
tar cf "$out/solo-alone.tar" -C "$work" .
python3 "$here/tools/gpu/late_tails.py" "$work"/solo-*.json.xz
