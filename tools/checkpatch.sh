#!/usr/bin/env bash
# Run the kernel's checkpatch.pl on qpolicy's kernel code (kmod/). Debian ships checkpatch only
# inside the kernel source package: the first run downloads linux-source-6.1 (about 140 MB, no
# root needed) and keeps just checkpatch and its data files under build/checkpatch.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=build/checkpatch
if [[ ! -x $dir/scripts/checkpatch.pl ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && apt-get download -q linux-source-6.1 >/dev/null)
    dpkg -x "$tmp"/linux-source-6.1_*.deb "$tmp/pkg"
    tar -xJf "$tmp"/pkg/usr/src/linux-source-6.1.tar.xz -C "$tmp" --wildcards \
        'linux-source-6.1/scripts/checkpatch.pl' 'linux-source-6.1/scripts/spelling.txt' \
        'linux-source-6.1/scripts/const_structs.checkpatch'
    mkdir -p "$dir"
    rm -rf "$dir/scripts"
    mv "$tmp/linux-source-6.1/scripts" "$dir/scripts"
fi

# Generated files are checked by what generates them: the *.mod.c of Kbuild, the *_layout.h of
# tools/kmod/layout.py (whose sizeof_field for userspace is the kernel's own definition).
files=()
while IFS= read -r file; do
    files+=("$file")
done < <(find kmod -name '*.[ch]' -not -name '*.mod.c' -not -name '*_layout.h' | sort)
# Lines up to 100 columns, as the kernel allows since 5.7. CamelCase is allowed: the RM ABI's
# field names are kept so that they match the driver's headers and the fact sheet. ENOSYS is
# allowed: nvmock answers an unknown UVM ioctl with it because nvidia-uvm does (kmod/nvmock/uvm.c).
exec "$dir/scripts/checkpatch.pl" --no-tree --strict --max-line-length=100 --quiet \
    --ignore=FILE_PATH_CHANGES,CAMELCASE,ENOSYS -f "${files[@]}"
