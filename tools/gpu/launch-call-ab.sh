#!/usr/bin/env bash
# On a GPU machine, as root: PyTorch's launch call (tools/gpu/launch_call.py) without and with
# qpolicy's probe loaded, interleaved a b a b; results in DIR/launch-{a1,b1,a2,b2}.json.
#
#     tools/gpu/launch-call-ab.sh DIR
set -euo pipefail
# shellcheck source=tools/gpu/bcc-env.sh
source "$(dirname "$0")/bcc-env.sh"
out=${1:?usage: launch-call-ab.sh DIR}
mkdir -p "$out"
ready=$(mktemp -u)
for run in a1 b1 a2 b2; do
  held=
  if [[ $run == b* ]]; then
    rm -f "$ready"
    python3 -m tools.gpu.hold_probe 120 "$ready" > "$out/probe-$run.log" 2>&1 &
    held=$!
    for _ in $(seq 120); do [[ -e $ready ]] && break; sleep 0.5; done
    [[ -e $ready ]] || { echo "$run: the probe did not load (see $out/probe-$run.log)" >&2; kill "$held"; exit 1; }
  fi
  python3 -m tools.gpu.launch_call --out "$out/launch-$run.json" > /dev/null
  if [[ -n $held ]]; then kill "$held"; wait "$held" 2> /dev/null || true; fi
done
rm -f "$ready"
