#!/usr/bin/env bash
# Make this machine able to run the host eBPF tier (tests/ebpf, the probe, `qpolicy trace`):
# bcc's Python module visible to .venv, kernel headers where bcc looks for them, gcc for the
# tests' workloads, tracefs and debugfs mounted. Safe to re-run; `make test` runs it first.
#
# As root on Debian it installs what is missing (python3-bpfcc, linux-headers-<arch>, gcc). The
# running kernel may be newer than any packaged headers (CI VMs, the GPU host): bcc then compiles
# against the packaged ones, which works because the probe takes struct offsets from the running
# kernel's BTF, not from the headers. As anyone else it says the eBPF tests will be skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv
bcc_package=/usr/lib/python3/dist-packages/bcc

say() {
    echo "setup-ebpf: $*" >&2
}

die() {
    say "error: $*"
    exit 1
}

# The venv sees Debian's bcc and nothing else of dist-packages: a directory holding only a link
# to the package, put on sys.path by a .pth file.
link_bcc() {
    [[ -d $bcc_package && -x $venv/bin/python ]] || return 0
    local dir=$venv/debian-bcc site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
        mkdir -p "$dir" &&
        ln -sfn "$bcc_package" "$dir/bcc" &&
        (cd "$dir" && pwd) >"$site/qpolicy-debian-bcc.pth"
}

if [[ $(id -u) -ne 0 ]]; then
    link_bcc || say "cannot make $venv see bcc"
    say "not root: the eBPF tests (tests/ebpf) will be skipped"
    exit 0
fi

arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
missing=()
[[ -d $bcc_package ]] || missing+=(python3-bpfcc)
compgen -G "/usr/src/linux-headers-*-$arch" >/dev/null || missing+=("linux-headers-$arch")
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if ((${#missing[@]})); then
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${missing[*]} by hand"
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
link_bcc || die "cannot make $venv see bcc"

# bcc looks for headers under /lib/modules/$(uname -r)/{build,source}. A real tree there is
# kept; a missing (or dangling) one points at the newest installed Debian headers.
modules=/lib/modules/$(uname -r)
if [[ ! -e $modules/build ]]; then
    build=$(compgen -G "/usr/src/linux-headers-*-$arch" | sort -V | tail -n 1)
    [[ -n $build ]] || die "no /usr/src/linux-headers-*-$arch after installing linux-headers-$arch"
    common=${build%-"$arch"}-common
    mkdir -p "$modules"
    ln -sfn "$build" "$modules/build"
    [[ -d $common && ! -e $modules/source ]] && ln -sfn "$common" "$modules/source"
    say "$modules/build -> $build (headers of another kernel; offsets come from BTF)"
fi

mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug ||
    say "could not mount debugfs on /sys/kernel/debug"
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing ||
    die "could not mount tracefs on /sys/kernel/tracing"

if [[ -x $venv/bin/python ]]; then
    "$venv/bin/python" -c 'import bcc' 2>/dev/null || die "$venv cannot import bcc after setup"
fi
say "ready: bcc $(dpkg-query -W -f='${Version}' python3-bpfcc 2>/dev/null), kernel $(uname -r)"
