#!/usr/bin/env bash
# Build the folder the device tool carries to a lent GPU machine: bcc 0.26 and its libraries,
# Debian's 6.1 header trees and pyroute2, unpacked into one root and packed as one solid
# .tar.xz that tools/gpu/bcc-env.sh unpacks there. Run on Debian bookworm (apt-get download and
# pip must reach their archives). The device tool carries at most 64 MiB with the tree, so the
# archive leaves out docs and the header subsystems ebpf/nvprobe.c never includes; bcc-env.sh
# names the trims and where they were checked.
#
# usage: tools/gpu/make-carry.sh [OUTDIR]   (default .gpu-carry/bccroot6, git-ignored)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$here/.gpu-carry/bccroot6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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

mkdir -p "$out"
rm -f "$out"/*.tar.xz "$out"/*.deb
tar -C "$work/root" -cf - . | xz -9e -T1 >"$out/bccroot.tar.xz" # one thread: one block, the smallest
du -h "$out/bccroot.tar.xz"
