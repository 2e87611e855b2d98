#!/usr/bin/env bash
# The bcc carry in two calls. The device tool carries at most 64 MiB a call with the tracked tree;
# since 2026-12-03 the tree (27.4 MB, its kept results growing) and make-carry.sh's archive
# (40.2 MB) no longer fit together. A warm machine keeps what a call left there, so the archive
# goes in two halves: the first call stashes its half outside the checkout, the second joins
# both and checks the whole against the sum taken here.
#
#   here:               tools/gpu/carry-parts.sh split [.gpu-carry/bccroot6]
#                       (writes .gpu-carry/bcc-part1 and .gpu-carry/bcc-part2, git-ignored)
#   call 1, carry .gpu-carry/bcc-part1:
#                       bash tools/gpu/carry-parts.sh stash .gpu-carry/bcc-part1
#   call 2 (within the machine's idle release), carry .gpu-carry/bcc-part2:
#                       export DEBS=$(bash tools/gpu/carry-parts.sh join .gpu-carry/bcc-part2) &&
#                       source tools/gpu/bcc-env.sh
#
# join fails, naming what is missing, where the machine was given back between the calls.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
stash=/tmp/qpolicy-carry
name=bccroot.tar.xz

case "${1:-}" in
split)
    from=${2:-$here/.gpu-carry/bccroot6}
    archive=$from/$name
    [ -f "$archive" ] || { echo "carry-parts: no $archive (tools/gpu/make-carry.sh makes it)" >&2; exit 1; }
    size=$(stat -c %s "$archive")
    for part in 1 2; do
        rm -rf "$here/.gpu-carry/bcc-part$part"
        mkdir -p "$here/.gpu-carry/bcc-part$part"
    done
    half=$(( (size + 1) / 2 ))
    head -c "$half" "$archive" >"$here/.gpu-carry/bcc-part1/$name.1"
    tail -c +"$(( half + 1 ))" "$archive" >"$here/.gpu-carry/bcc-part2/$name.2"
    sha256sum "$archive" | cut -d' ' -f1 >"$here/.gpu-carry/bcc-part2/$name.sha256"
    du -b "$here"/.gpu-carry/bcc-part*/*
    ;;
stash)
    part=${2:?which folder}
    mkdir -p "$stash"
    cp "$part/$name.1" "$stash/"
    echo "carry-parts: stashed $(stat -c %s "$stash/$name.1") bytes in $stash" >&2
    ;;
join)
    part=${2:?which folder}
    [ -f "$stash/$name.1" ] || {
        echo "carry-parts: no $stash/$name.1: the machine was given back after the first call" >&2
        exit 1
    }
    mkdir -p "$stash/root"
    cat "$stash/$name.1" "$part/$name.2" >"$stash/root/$name"
    want=$(cat "$part/$name.sha256")
    got=$(sha256sum "$stash/root/$name" | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "carry-parts: joined archive's sum $got, not $want" >&2; exit 1; }
    echo "$stash/root"
    ;;
*)
    echo "usage: carry-parts.sh split [DIR] | stash PART1 | join PART2" >&2
    exit 2
    ;;
esac
