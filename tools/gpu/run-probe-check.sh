#!/usr/bin/env bash
# On a GPU machine, as root: the probe's GPU-tier check (tools/gpu/probe_check.py).
set -euo pipefail
# shellcheck source=tools/gpu/bcc-env.sh
source "$(dirname "$0")/bcc-env.sh"
exec python3 "$qpolicy_root/tools/gpu/probe_check.py" "$@"
