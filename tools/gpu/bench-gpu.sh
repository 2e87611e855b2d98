#!/usr/bin/env bash
# On a GPU machine, as root: native time-slicing vs MPS vs qpolicy's rm enforcer
# (tools/bench/gpu.py; arguments go to it, e.g. --sizes 4096 --only "fixed-share 70/30").
set -euo pipefail
# shellcheck source=tools/gpu/bcc-env.sh
source "$(dirname "$0")/bcc-env.sh"
exec python3 "$qpolicy_root/tools/bench/gpu.py" "$@"
