#!/usr/bin/env bash
# On a GPU machine, as root: `qpolicy doctor` from this checkout (arguments go to it).
set -euo pipefail
# shellcheck source=tools/gpu/bcc-env.sh
source "$(dirname "$0")/bcc-env.sh"
exec python3 -m qpolicy doctor "$@"
