#!/usr/bin/env bash
# Make this machine able to run the VM test tier: Debian's 6.1 kernel and its headers (the
# modules are built against them and loaded in a VM booting that kernel), QEMU, busybox for the
# VM's initramfs, and virtme-ng in .venv. Safe to re-run; tools/vm/run calls it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

VIRTME_NG_VERSION=1.42

say() {
    echo "vm-setup: $*" >&2
}

packages=()
compgen -G "/boot/vmlinuz-6.1.0-*-amd64" >/dev/null || packages+=(linux-image-amd64)
compgen -G "/lib/modules/6.1.0-*-amd64/build" >/dev/null || packages+=(linux-headers-amd64)
command -v qemu-system-x86_64 >/dev/null || packages+=(qemu-system-x86)
command -v busybox >/dev/null || packages+=(busybox-static)
if ((${#packages[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        say "error: needs root to install ${packages[*]}"
        exit 1
    fi
    say "installing ${packages[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/vng ]]; then
    [[ -x .venv/bin/pip ]] || tools/bootstrap.sh
    say "installing virtme-ng $VIRTME_NG_VERSION into .venv"
    .venv/bin/pip install -q "virtme-ng==$VIRTME_NG_VERSION"
fi
