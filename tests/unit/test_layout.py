"""What qgpu, nvmock and gpuload share with nvidia.ko is what the conformance table says.

The table (kmod/nvmock/CONFORMANCE.md, Layout section) holds the numbers of NVIDIA's own headers
at tag 580.142 (tools/kmod/layout.py nvidia wrote them); nvrm.h and nvrm_kapi.h include the
static assertions generated from it. These tests keep the three in step and show that the
assertions bite: a member moved or a constant changed in qpolicy's headers does not compile.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "kmod"))

import layout  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

# Stand-ins for the three kernel definitions nvrm_kapi.h and its layout header use, so that the
# kernel half compiles in userspace too (the module builds in the VM tier compile it for real).
KERNEL_SHIM = """
#include <stddef.h>
#define sizeof_field(TYPE, MEMBER) sizeof((((TYPE *)0)->MEMBER))
typedef unsigned char u8;
typedef unsigned int u32;
"""


def table() -> list[layout.Row]:
    return layout.parse_table(layout.TABLE.read_text())


def compile_headers(uapi: Path, tmp: Path, kernel: bool) -> subprocess.CompletedProcess[str]:
    shim = tmp / "shim"
    (shim / "linux").mkdir(parents=True, exist_ok=True)
    (shim / "linux" / "stddef.h").write_text(KERNEL_SHIM)
    source = tmp / "probe.c"
    header = "nvrm_kapi.h" if kernel else "nvrm.h"
    source.write_text(f'#include "{header}"\nint main(void) {{ return 0; }}\n')
    args = ["gcc", "-std=gnu11", "-fsyntax-only", f"-I{uapi}"]
    if kernel:
        args += ["-D__KERNEL__", f"-I{shim}"]
    return subprocess.run([*args, str(source)], capture_output=True, text=True)


def copy_uapi(tmp: Path) -> Path:
    uapi = tmp / "uapi"
    shutil.copytree(layout.UAPI, uapi)
    return uapi


def test_the_generated_headers_are_what_the_table_gives() -> None:
    assert layout.main(["check"]) == 0
    for path, text in layout.render_headers(table()).items():
        assert path.read_text() == text, path


def test_every_member_and_constant_qpolicy_shares_is_in_the_table() -> None:
    items = {row.item for row in table()}
    wanted = {item for item, _, _, _ in layout.wanted_rows()} | set(layout.CONSTANT_GREP)
    assert wanted - items == set()
    # and every struct the headers declare is paired with the driver's
    paired = {pair.ours for pair in layout.PAIRS}
    for name in ("nvrm.h", "nvrm_kapi.h"):
        declared = set(layout.declared_structs((layout.UAPI / name).read_text()))
        assert declared - paired == set(), name


def test_the_table_has_every_kind_of_row() -> None:
    rows = {row.item: row for row in table()}
    # spot checks against numbers read by hand from 580.142's headers
    assert rows["offsetof(struct nvos64_params, status)"].value == 40  # nvos.h NVOS64
    assert rows["sizeof(struct nv_channel_alloc_params)"].value == 368  # alloc_channel.h
    assert rows["offsetof(struct nvrm_kernel_ops, op)"].value == 56  # nv-modeset-interface.h
    assert rows["NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS"].value == 0x2080110B
    assert rows["NVRM_USERD_GP_GET"].value == 0x88  # clc36f.h Nvc36fControl.GPGet
    assert rows["NVRM_CLIENT_HANDLE_BASE"].value == 0xC1D00000  # resserv.h
    assert rows["offsetof(struct nvrm_kernel_ops, op)"].kernel
    assert not rows["NV_ESC_RM_ALLOC"].kernel


@pytest.mark.parametrize("kernel", [False, True], ids=["uapi", "kernel"])
def test_qpolicys_headers_compile_with_the_assertions(tmp_path: Path, kernel: bool) -> None:
    result = compile_headers(layout.UAPI, tmp_path, kernel)
    assert result.returncode == 0, result.stderr


def compile_mutated(
    tmp: Path, header: str, old: str, new: str, kernel: bool, regex: bool = False
) -> subprocess.CompletedProcess[str]:
    """Compile a copy of kmod/uapi in which ``header`` has ``old`` replaced by ``new``."""
    uapi = copy_uapi(tmp)
    path = uapi / header
    text = path.read_text()
    changed = re.sub(old, new, text) if regex else text.replace(old, new)
    assert changed != text
    path.write_text(changed)
    return compile_headers(uapi, tmp, kernel)


def test_a_moved_member_fails_the_build(tmp_path: Path) -> None:
    result = compile_mutated(
        tmp_path,
        "nvrm.h",
        "\t__u32 paramsSize;\n\t__u32 flags;\n\t__u32 status;\n\t__u32 pad;",
        "\t__u32 flags;\n\t__u32 paramsSize;\n\t__u32 status;\n\t__u32 pad;",
        kernel=False,
    )
    assert result.returncode != 0
    assert "offsetof(NVOS64_PARAMETERS, paramsSize)" in result.stderr


def test_a_wrong_constant_fails_the_build(tmp_path: Path) -> None:
    result = compile_mutated(
        tmp_path,
        "nvrm.h",
        r"(#define NV_ESC_RM_ALLOC\s+)0x2B",
        r"\g<1>0x2C",
        kernel=False,
        regex=True,
    )
    assert result.returncode != 0
    assert '"NV_ESC_RM_ALLOC"' in result.stderr


def test_a_wrong_kernel_member_fails_the_build(tmp_path: Path) -> None:
    # NVOS21 in the op union where the driver has NVOS64: the bug the issue found
    result = compile_mutated(
        tmp_path,
        "nvrm_kapi.h",
        "struct nvos64_params alloc;",
        "struct nvos21_params alloc;",
        kernel=True,
    )
    assert result.returncode != 0
    assert "nvidia_kernel_rmapi_ops_t" in result.stderr or "NVOS64" in result.stderr
