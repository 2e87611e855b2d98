#!/usr/bin/env bash
# tools/bench/qgpu_baseline.sh REV: build qgpu.ko (and its nvmock) as they were at commit REV,
# under build/baseline/REV/kmod, for `make bench-vm` to measure beside the current qgpu.ko in
# the same VM run. The sources come from `git archive` (no worktree left behind); a second call
# for the same REV rebuilds only what changed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if (($# != 1)); then
    echo "usage: tools/bench/qgpu_baseline.sh REV" >&2
    exit 2
fi
rev=$(git rev-parse --short=7 --verify "$1^{commit}")
dir=build/baseline/$rev
if [[ ! -f $dir/kmod/Makefile ]]; then
    mkdir -p "$dir"
    git archive "$rev" kmod | tar -x -C "$dir"
fi
make -s -C "$dir/kmod" >/dev/null
echo "$dir/kmod/qgpu/qgpu.ko"
