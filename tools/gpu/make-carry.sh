#!/usr/bin/env bash
# Build the folder the device tool carries to a lent GPU machine: bcc 0.26 and its libraries,
# Debian's 6.1 header trees and pyroute2, unpacked into one root and packed as one solid
# .tar.xz that tools/gpu/bcc-env.sh unpacks there. Run on Debian bookworm (apt-get download and
# pip must reach their archives). The device tool carries at most 64 MiB with the tree, so the
# archive leaves out docs and the header subsystems ebpf/nvprobe.c never includes; bcc-env.sh
# names the trims and where they were checked.
#
# Then, as root, it compiles and loads the probe here (both forms of its source) against the
# carried header trees, under strace, and keeps only the header files that compile opened: 152 of
# about 6 000, 4 MB less to carry (the device tool's 64 MiB also hold the tracked tree, whose kept
# results grow). The trees are linked where bcc looks, as bcc-env.sh links them on a GPU host, so
# the compile there opens the same files (calls 28A-C, 2026-12-02, an H100, loaded the probe from a
# carry pruned so). --no-prune keeps the trimmed trees whole.
#
# usage: tools/gpu/make-carry.sh [--no-prune] [OUTDIR]   (default .gpu-carry/bccroot6, git-ignored)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prune=1
if [ "${1:-}" = --no-prune ]; then
    prune=0
    shift
fi
out=${1:-$here/.gpu-carry/bccroot6}
release=$(uname -r)
if [ "$prune" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "make-carry: pruning loads the probe: run as root, or pass --no-prune" >&2
        exit 1
    fi
    if ! command -v strace >/dev/null; then
        echo "make-carry: pruning needs strace (apt-get install strace), or pass --no-prune" >&2
        exit 1
    fi
    if [ -e "/lib/modules/$release/build" ] || [ -e "/lib/modules/$release/source" ]; then
        echo "make-carry: /lib/modules/$release has a header tree, which bcc would compile against" \
            "instead of the carried one: pass --no-prune" >&2
        exit 1
    fi
fi
work=$(mktemp -d)
links=()
cleanup() {
    for link in "${links[@]}"; do rm -f "$link"; done
    rm -rf "$work"
}
trap cleanup EXIT

# The newest 6.1 ABI the archive still holds: older ones leave it.
abi=$(apt-cache search --names-only '^linux-headers-6\.1\.0-[0-9]+-common$' |
    sed -E 's/^linux-headers-6\.1\.0-([0-9]+)-common.*/\1/' | sort -n | tail -1)
if [ -z "$abi" ]; then
    echo "make-carry: no linux-headers-6.1.0-*-common in the apt archive (run apt-get update)" >&2
    exit 1
fi
(cd "$work" && apt-get download -q libbpfcc libclang-cpp14 libllvm14 python3-bpfcc libbpf1 \
    libz3-4 "linux-headers-6.1.0-$abi-common" "linux-headers-6.1.0-$abi-cloud-amd64" >/dev/null)
mkdir "$work/root"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
python3 -m pip download -q --no-deps --only-binary :all: -d "$work/wheels" pyroute2
python3 -m pip install -q --no-index --no-deps --no-compile \
    --target "$work/root/usr/lib/python3/dist-packages" "$work"/wheels/*.whl

rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/lintian"
common=("$work"/root/usr/src/linux-headers-*-common)
arch=("$work"/root/usr/src/linux-headers-*-cloud-amd64)
rm -f "${arch[0]}/Module.symvers"
for tree in "${common[0]}"/arch/*; do
    [ "$(basename "$tree")" = x86 ] || rm -rf "$tree"
done
for sub in net scsi rdma xen acpi crypto sound media drm video trace/events; do
    rm -rf "${common[0]}/include/$sub"
done
for sub in drm rdma scsi sound xen misc mtd; do
    rm -rf "${common[0]}/include/uapi/$sub"
done
for sub in mfd platform_data mlx4 mlx5 qed iio mtd ceph regulator spi soc usb sunrpc \
    surface_aggregator bcma fsl mmc greybus ssb irqchip dma firmware; do
    rm -rf "${common[0]}/include/linux/$sub"
done

if [ "$prune" = 1 ]; then
    # Linked as bcc-env.sh links them (its links are made only where none exist: so are these).
    mkdir -p "/lib/modules/$release"
    ln -s "${arch[0]}" "/lib/modules/$release/build" && links+=("/lib/modules/$release/build")
    ln -s "${common[0]}" "/lib/modules/$release/source" && links+=("/lib/modules/$release/source")
    named=/usr/src/$(basename "${common[0]}")
    if [ ! -e "$named" ]; then
        ln -s "${common[0]}" "$named" && links+=("$named")
    fi
    mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
    LD_LIBRARY_PATH="$work/root/usr/lib/x86_64-linux-gnu:$work/root/usr/lib/llvm-14/lib" \
        PYTHONPATH="$here:$work/root/usr/lib/python3/dist-packages" \
        strace -f -y -qq -e trace=openat,open -o "$work/opened" python3 -c '
from qpolicy.telemetry.probe import CFLAGS, NvProbe
from bcc import BPF
for output, group_dead in (("ringbuf", "tracepoint"), ("perf", "task")):
    text = NvProbe(output=output, group_dead=group_dead).source()
    BPF(text=text.encode(), cflags=list(CFLAGS)).cleanup()
' || {
        echo "make-carry: the probe did not compile and load against the carried headers" >&2
        exit 1
    }
    # strace -y names each opened file by its real path: "= 3</path>".
    grep -o "= [0-9]*<$work/root/usr/src/[^>]*>" "$work/opened" |
        sed -e 's/^= [0-9]*<//' -e 's/>$//' | sort -u >"$work/keep"
    kept=$(wc -l <"$work/keep")
    if [ "$kept" -lt 50 ]; then
        echo "make-carry: the compile opened only $kept carried headers: not pruning" >&2
        exit 1
    fi
    find "$work/root/usr/src" -type f | sort | comm -23 - "$work/keep" | xargs -r rm -f
    echo "make-carry: kept the $kept header files the probe's compile opened"
fi

mkdir -p "$out"
rm -f "$out"/*.tar.xz "$out"/*.deb
tar -C "$work/root" -cf - . | xz -9e -T1 >"$out/bccroot.tar.xz" # one thread: one block, the smallest
du -h "$out/bccroot.tar.xz"
