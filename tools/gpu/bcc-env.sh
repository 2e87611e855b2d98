#!/usr/bin/env bash
# Sourced on the lent GPU machine, as root: make bcc importable from Debian packages carried along
# and put the repository on PYTHONPATH. Where bcc already imports, nothing is unpacked. Fetch the
# packages on a machine with Debian bookworm's archive: apt-get download libbpfcc libclang-cpp14
# libllvm14 python3-bpfcc libbpf1 libz3-4 linux-headers-6.1.0-NN-common
# linux-headers-6.1.0-NN-cloud-amd64 (the newest NN the archive holds), into $DEBS, or run
# tools/gpu/make-carry.sh, which builds the packed and trimmed form below. bcc 0.26 compiles
# tracepoint and uprobe programs against Debian's 6.1 headers on newer kernels: tracepoint
# layouts are read from tracefs.
# $DEBS may instead hold the same packages already unpacked, as one *.tar.xz of their root (smaller
# to carry: one solid archive, without their docs). The device tool carries 64 MiB with the tree, so
# such an archive may also hold pyroute2 (unpacked into usr/lib/python3/dist-packages) and leave out
# header subsystems the probe never includes (include/{net,scsi,rdma,xen,acpi,crypto,...},
# include/uapi/{drm,rdma,scsi,sound,xen,misc,mtd}): ebpf/nvprobe.c compiled and loaded with bcc
# 0.26 against the common tree trimmed so (2026-11-26), and also without include/trace/events and
# the driver headers include/linux/{mfd,platform_data,mlx4,mlx5,qed,iio,mtd,ceph,regulator,spi,
# soc,usb,sunrpc,surface_aggregator,bcma,fsl,mmc,greybus,ssb,irqchip,dma,firmware} (2026-12-02,
# on this machine's 6.1 tree, and on an H200 host). make-carry.sh now keeps only the header files
# the probe's compile opens (152; loaded so on three H100 hosts, calls 28A-C, 2026-12-02).
# Since 2026-12-03 that archive (40.2 MB) and the tracked tree no longer fit in one call's 64 MiB:
# tools/gpu/carry-parts.sh carries it in two calls to one warm machine (the probe loaded so on an
# H200 that day).
# shellcheck shell=bash
qpolicy_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONPATH="$qpolicy_root${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import bcc' 2>/dev/null; then
    DEBS=${DEBS:-$qpolicy_root/.gpu-carry/debs}
    ROOT=${BCC_ROOT:-/tmp/bccroot}
    mkdir -p "$ROOT"
    for deb in "$DEBS"/*.deb; do
        if [ -e "$deb" ]; then dpkg -x "$deb" "$ROOT"; fi
    done
    for tree in "$DEBS"/*.tar.xz; do
        if [ -e "$tree" ]; then tar -C "$ROOT" -xJf "$tree"; fi
    done
    release=$(uname -r)
    trees=("$ROOT"/usr/src/linux-headers-*-cloud-amd64)
    headers=${trees[0]}
    trees=("$ROOT"/usr/src/linux-headers-*-common)
    common=${trees[0]}
    mkdir -p "/lib/modules/$release" /usr/src
    # Never replace a real header tree; the carried one is only a stand-in where none exists.
    [ -e "/lib/modules/$release/build" ] || ln -sfn "$headers" "/lib/modules/$release/build"
    [ -e "/lib/modules/$release/source" ] || ln -sfn "$common" "/lib/modules/$release/source"
    # The arch tree names its common tree by a path relative to /usr/src.
    [ -e "/usr/src/$(basename "$common")" ] || ln -sfn "$common" "/usr/src/$(basename "$common")"
    export LD_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/usr/lib/llvm-14/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$PYTHONPATH:$ROOT/usr/lib/python3/dist-packages"
fi
# Python packages the GPU image lacks (pyroute2, which the CLI imports), carried as wheels.
if [ -d "$qpolicy_root/.gpu-carry/wheels" ] && ! python3 -c 'import pyroute2' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qpolicy-site \
        "$qpolicy_root"/.gpu-carry/wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/qpolicy-site"
fi
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug || true
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || true
