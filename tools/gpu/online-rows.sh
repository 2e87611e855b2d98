#!/usr/bin/env bash
# On a lent GPU machine, as root: issue 14's online rows as BENCHMARKS.md records them since the
# forty-sixth session, the doctor's FECS read beside them, and what says which host ran them.
# Until 2026-12-06 this lived untracked (.gpu-carry/s/rows.sh); the entries naming that script ran
# these steps.
#
#   ROWS     rows to run, in order: 8192, 2048 (issue 14's two trainer shapes), 10pods (the
#            daemon's CPU with ten busy pods, then the same pods watched by a daemon that
#            enforces nothing: the probe's part) and 10pods-profiled (10pods again, its daemon
#            sampled by py-spy in the pods' steady state, without stopping it: where the CPU
#            goes; tools/gpu/profile_summary.py says why not with native frames) and
#            8192-annotated (the 8192 row's online stream and trainer under native
#            time-slicing, qpolicy as the state file tells it the pods, and qpolicy as
#            annotations on their cgroups tell the running daemon: the annotation watch on the
#            GPU host's kernel, tools/gpu/annotated_pods.py); default "8192 2048"
#   PYSPY    the py-spy binary for 10pods-profiled (default .gpu-carry/pyspy/py-spy: the device
#            image has none and reaches no network; beside the tree and .gpu-carry/bcc-part2
#            its 8 MB pass the 64 MiB a call carries, so carry it xz-compressed, 2 MB, and unpack
#            it there first)
#   DOCTOR   a trainer size for `qpolicy doctor` with the engine's pair only (its FECS read of the
#            switch), or empty for none; default empty
#   ROW_S    seconds a row may take before it is stopped (default 300)
#   REV      the commit the tree is (the device copy has no .git), written to host.txt
#   DEBS     where the bcc carry is (default: joined from .gpu-carry/bcc-part2 and the half that
#            `tools/gpu/carry-parts.sh stash` left on this machine)
#
# Writes under $OUT: <row>-bench.json.xz (tools/bench/gpu.py's JSON: 3 001 requests a run, solos
# before and after, native, MPS and qpolicy), 10pods-profiled-daemon.raw.xz (py-spy's raw
# profile, for tools/gpu/profile_summary.py), doctor-<n>.json, smi.csv.xz (nvidia-smi every
# 250 ms for the whole call, for tools/gpu/row_clocks.py) and logs.tar.xz (host.txt, the daemons'
# debug logs, the doctor's stderr).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:?set OUT to the folder the results go to}
rows=${ROWS:-8192 2048}
doctor=${DOCTOR:-}
row_s=${ROW_S:-300}
pyspy=${PYSPY:-$here/.gpu-carry/pyspy/py-spy}

# A row's tools/bench/gpu.py scenario and modes, in $only and $modes; false for an unknown row.
row_args() {
    case $1 in
    8192) only="online 4096 @ 150 Hz next to an offline 8192 trainer" modes=native,mps,qpolicy ;;
    2048) only="online 4096 @ 150 Hz next to an offline 2048 trainer (short kernels)" modes=native,mps,qpolicy ;;
    10pods) only="daemon CPU, 10 pods" modes=qpolicy,probe ;;
    10pods-profiled) only="daemon CPU, 10 pods" modes=qpolicy ;;
    8192-annotated)
        only="online 4096 @ 150 Hz next to an offline 8192 trainer"
        modes=native,qpolicy,qpolicy-annotated
        ;;
    *) return 1 ;;
    esac
}

for row in $rows; do
    if ! row_args "$row"; then
        echo "online-rows: unknown row '$row' (8192, 2048, 10pods, 10pods-profiled or 8192-annotated)" >&2
        exit 2
    fi
    if [ "$row" = 10pods-profiled ] && ! [ -x "$pyspy" ]; then
        echo "online-rows: row 10pods-profiled needs py-spy, and '$pyspy' is not executable" >&2
        exit 2
    fi
done
if [ -n "$doctor" ] && ! [[ $doctor =~ ^[0-9]+$ ]]; then
    echo "online-rows: DOCTOR must be a matrix size, not '$doctor'" >&2
    exit 2
fi

if [ -z "${DEBS:-}" ] && ! python3 -c 'import bcc' 2>/dev/null; then
    DEBS=$(bash "$here/tools/gpu/carry-parts.sh" join "$here/.gpu-carry/bcc-part2")
    export DEBS
fi
# shellcheck source=tools/gpu/bcc-env.sh
source "$here/tools/gpu/bcc-env.sh"
cd "$here"

mkdir -p "$out/logs"
{
    date
    echo "rev ${REV:-unknown}"
    uname -r
    nproc
    nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv ||
        echo "nvidia-smi failed"
    # Where a line cannot be read, host.txt says so and the rows still run.
    head -1 /proc/driver/nvidia/version 2>/dev/null || echo "no /proc/driver/nvidia/version"
    grep -m1 'model name' /proc/cpuinfo || echo "no CPU model name"
} >"$out/logs/host.txt"

nvidia-smi -lms 250 --format=csv --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    >"$out/smi.csv" 2>/dev/null &
smi=$!
trap 'kill $smi 2>/dev/null || true' EXIT

# Samples the daemon of a 10pods row with py-spy into $1 from 2 s after its pods start until 2 s
# before they end (their --start-at and --seconds, read off pod p0's command line), so neither
# the daemon's start (bcc's compile) nor the pods' teardown is in it. Gives up without a profile
# once $2 exists (the row ended) and nothing was found.
profile_daemon() {
    local dest=$1 ended=$2 pid="" pod="" start seconds
    while [ ! -e "$ended" ]; do
        pid=$(pgrep -f -n 'qpolicy daemon --enforcer [r]m' || true)
        pod=$(pgrep -a -f 'matmul[.]py --n [0-9]+ --label p0 ' | head -1 || true)
        if [ -n "$pid" ] && [ -n "$pod" ]; then break; fi
        sleep 0.1
    done
    if [ -z "$pid" ] || [ -z "$pod" ]; then
        echo "online-rows: no daemon and pods to profile" >&2
        return 1
    fi
    start=$(sed -n 's/.* --start-at \([0-9.]*\).*/\1/p' <<<"$pod")
    seconds=$(sed -n 's/.* --seconds \([0-9.]*\).*/\1/p' <<<"$pod")
    if [ -z "$start" ] || [ -z "$seconds" ]; then
        echo "online-rows: no --start-at and --seconds in pod p0's command line: $pod" >&2
        return 1
    fi
    local now wait_s length_s
    now=$(date +%s.%N)
    wait_s=$(awk -v s="$start" -v now="$now" 'BEGIN { w = s + 2 - now; print (w > 0 ? w : 0) }')
    length_s=$(awk -v s="$seconds" 'BEGIN { d = int(s) - 4; print (d > 1 ? d : 1) }')
    sleep "$wait_s"
    "$pyspy" record -p "$pid" -r 1000 -d "$length_s" --nonblocking --threads --function -f raw \
        -o "$dest"
}

# Keeps $1 compressed as $2, where the row left it.
keep() {
    if [ -f "$1" ]; then
        xz -9 -c "$1" >"$2"
        rm "$1"
    fi
}

status=0
for row in $rows; do
    row_args "$row"
    mkdir -p "$out/logs/$row"
    spy=""
    if [ "$row" = 10pods-profiled ]; then
        profile_daemon "$out/logs/$row/daemon.raw" "$out/logs/$row/ended" \
            >"$out/logs/$row/py-spy.log" 2>&1 &
        spy=$!
    fi
    # A row that fails or runs over is reported and the next one still runs.
    if ! timeout "$row_s" python3 tools/bench/gpu.py --sizes 4096 --modes "$modes" --only "$only" \
        --daemon-logs --out "$out/logs/$row/bench.json"; then
        echo "online-rows: row $row failed or ran over ${row_s}s" >&2
        status=1
    fi
    if [ -n "$spy" ]; then
        touch "$out/logs/$row/ended"
        if ! wait "$spy"; then
            echo "online-rows: the profile of row $row failed (logs/$row/py-spy.log)" >&2
            status=1
        fi
        rm -f "$out/logs/$row/ended"
        keep "$out/logs/$row/daemon.raw" "$out/$row-daemon.raw.xz"
    fi
    keep "$out/logs/$row/bench.json" "$out/$row-bench.json.xz"
done

if [ -n "$doctor" ]; then
    if ! python3 -m qpolicy doctor --gpu 0 --trainer-n "$doctor" --levers timeslice-1us-8ms \
        --no-mps --no-cache --json >"$out/doctor-$doctor.json" 2>"$out/logs/doctor-$doctor.err"; then
        echo "online-rows: the doctor failed (logs/doctor-$doctor.err)" >&2
        status=1
    fi
fi

kill "$smi" 2>/dev/null || true
wait "$smi" 2>/dev/null || true
xz -9 -f "$out/smi.csv"
tar -C "$out/logs" -cJf "$out/logs.tar.xz" .
rm -rf "$out/logs"
exit "$status"
