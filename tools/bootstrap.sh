#!/usr/bin/env bash
# Make .venv usable on a fresh Debian 12 machine: a plain venv with qpolicy installed editable
# together with its dev tools. Safe to re-run; it returns at once while .venv is up to date.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv
stamp=$venv/.bootstrap-stamp
python=${PYTHON:-python3}

die() {
    echo "bootstrap: error: $*" >&2
    exit 1
}

# The stamp is written only after a complete install, so an interrupted run is redone next time.
if [[ -f $stamp && $stamp -nt pyproject.toml && -x $venv/bin/python ]]; then
    exit 0
fi

command -v "$python" >/dev/null 2>&1 ||
    die "'$python' not found: install Python >= 3.11 (apt-get install python3 python3-venv) or set PYTHON"

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$python is Python $version; qpolicy needs Python >= 3.11 (set PYTHON to a newer interpreter)"

# Debian splits venv/ensurepip out of the interpreter into python3-venv; `import venv` alone
# succeeds without it, so the only reliable test is to make a venv and see whether pip arrives.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
if ! "$python" -m venv "$probe/venv" >/dev/null 2>&1; then
    echo "bootstrap: '$python -m venv' does not work here; installing python3-venv" >&2
    if [[ $(id -u) -eq 0 ]]; then
        apt_get=(apt-get)
    elif command -v sudo >/dev/null 2>&1; then
        apt_get=(sudo apt-get)
    else
        die "$python cannot create virtual environments and neither root nor sudo is available:" \
            "install the Debian package python3-venv (or python$version-venv), then re-run"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "$python cannot create virtual environments and apt-get is missing: install venv support for Python $version"
    "${apt_get[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y -qq python3-venv
    rm -rf "$probe/venv"
    "$python" -m venv "$probe/venv" >/dev/null ||
        die "$python still cannot create a virtual environment after installing python3-venv" \
            "(is $python the system Python? install python$version-venv for it)"
fi

# A .venv left half-made by an interrupted run, or made by a Python that has since gone, has no
# working interpreter: start it over rather than pip-installing into it.
if [[ -d $venv ]] && ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "bootstrap: $venv is broken; recreating it" >&2
    rm -rf "$venv"
fi
if [[ ! -d $venv ]]; then
    "$python" -m venv "$venv"
fi

"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
touch "$stamp"
echo "bootstrap: $venv is ready (Python $version); activate it with: . $venv/bin/activate"
