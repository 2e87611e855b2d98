"""The BTF reader: a hand-built blob whose answers are known, and the running kernel's BTF."""

import struct
from pathlib import Path

import pytest

from qpolicy.telemetry import btf
from qpolicy.telemetry.btf import Btf, BtfError, Member, probe_offsets


class Builder:
    """Writes a BTF blob type by type (ids count from 1, as in the kernel's format)."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types = bytearray()
        self.count = 0

    def name(self, text: str) -> int:
        if not text:
            return 0
        offset = len(self.strings)
        self.strings += text.encode() + b"\0"
        return offset

    def add(
        self,
        kind: int,
        name: str,
        vlen: int,
        size_or_type: int,
        extra: bytes = b"",
        kind_flag: bool = False,
    ) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kind_flag else 0)
        self.types += struct.pack("<III", self.name(name), info, size_or_type) + extra
        self.count += 1
        return self.count

    def int_(self, name: str, size: int) -> int:
        return self.add(btf.KIND_INT, name, 0, size, struct.pack("<I", size * 8))

    def struct_(
        self,
        name: str,
        size: int,
        members: list[tuple[str, int, int]],
        kind: int = btf.KIND_STRUCT,
        kind_flag: bool = False,
    ) -> int:
        extra = b"".join(struct.pack("<III", self.name(m), t, bits) for m, t, bits in members)
        return self.add(kind, name, len(members), size, extra, kind_flag)

    def blob(self, magic: int = btf.BTF_MAGIC, version: int = 1) -> bytes:
        header = struct.pack(
            "<HBBIIIII",
            magic,
            version,
            0,
            24,
            0,
            len(self.types),
            len(self.types),
            len(self.strings),
        )
        return header + bytes(self.types) + bytes(self.strings)


def sample() -> bytes:
    b = Builder()
    u32 = b.int_("unsigned int", 4)  # 1
    u16 = b.int_("unsigned short", 2)  # 2
    const_u32 = b.add(btf.KIND_CONST, "", 0, u32)  # 3
    dev_t = b.add(btf.KIND_TYPEDEF, "dev_t", 0, const_u32)  # 4: typedef -> const -> int
    volatile_dev = b.add(btf.KIND_VOLATILE, "", 0, dev_t)  # 5
    b.add(btf.KIND_FWD, "inode", 0, 0)  # 6: a forward declaration of the same name
    ptr = b.add(btf.KIND_PTR, "", 0, 6)  # 7
    array = b.add(btf.KIND_ARRAY, "", 0, 0, struct.pack("<III", u32, u32, 3))  # 8: u32[3]
    anon_union = b.struct_(  # 9: union { u32 i_rdev_alias; u16 i_small; }
        "", 4, [("i_rdev_alias", u32, 0), ("i_small", u16, 0)], kind=btf.KIND_UNION
    )
    b.struct_(  # 10
        "inode",
        40,
        [
            ("i_mode", u16, 0),
            ("i_rdev", volatile_dev, 32),
            ("i_private", ptr, 64),
            ("", anon_union, 128),
            ("i_words", array, 160),
        ],
    )
    b.struct_(  # 11: kind_flag: a member's offset carries its bitfield size << 24
        "flags",
        4,
        [("low", u32, (3 << 24) | 0), ("aligned", u16, 16)],
        kind_flag=True,
    )
    b.add(btf.KIND_FUNC_PROTO, "", 1, 0, struct.pack("<II", 0, u32))  # 12: skipped correctly
    b.add(btf.KIND_ENUM, "e", 2, 4, struct.pack("<IiIi", b.name("A"), 0, b.name("B"), 1))
    b.struct_("after", 8, [("x", u32, 32)])  # 14: found only if everything before was skipped
    return b.blob()


def test_hand_built_members() -> None:
    blob = Btf(sample(), "sample")
    assert blob.member("inode", "i_mode") == Member(0, 2)
    assert blob.member("inode", "i_rdev") == Member(4, 4)  # typedef/const/volatile resolved
    assert blob.member("inode", "i_private") == Member(8, 8)
    assert blob.member("inode", "i_rdev_alias") == Member(16, 4)  # inside the anonymous union
    assert blob.member("inode", "i_small") == Member(16, 2)
    assert blob.member("inode", "i_words") == Member(20, 12)
    assert blob.member("flags", "aligned") == Member(2, 2)
    assert blob.member("after", "x") == Member(4, 4)
    assert blob.struct_size("inode") == 40


def test_hand_built_errors() -> None:
    blob = Btf(sample(), "sample")
    with pytest.raises(BtfError, match="no struct file"):
        blob.member("file", "f_inode")
    with pytest.raises(BtfError, match="struct inode has no member i_ino"):
        blob.member("inode", "i_ino")
    with pytest.raises(BtfError, match=r"flags\.low is a bitfield"):
        blob.member("flags", "low")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x9f\xeb", "too short"),
        (Builder().blob(magic=0x1234), "not BTF"),
        (Builder().blob(version=2), "version 2"),
        (sample()[:-5], "past the end"),
    ],
)
def test_bad_blobs(data: bytes, message: str) -> None:
    with pytest.raises(BtfError, match=message):
        Btf(data)


def test_unknown_kind_is_an_error() -> None:
    b = Builder()
    b.add(31, "", 0, 0)
    with pytest.raises(BtfError, match="unknown BTF kind 31"):
        Btf(b.blob())


def test_missing_vmlinux_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BtfError, match="CONFIG_DEBUG_INFO_BTF"):
        Btf.load(tmp_path / "vmlinux")


@pytest.mark.skipif(not btf.VMLINUX.exists(), reason="this kernel has no /sys/kernel/btf/vmlinux")
def test_running_kernel_offsets_are_plausible() -> None:
    kernel = Btf.load()
    offsets = probe_offsets(kernel)
    assert set(offsets) == {f"{s}.{m}" for s, m in btf.PROBE_MEMBERS}
    sizes = {
        "task_struct.files": 8,
        "files_struct.fdt": 8,
        "fdtable.max_fds": 4,
        "fdtable.fd": 8,
        "file.f_inode": 8,
        "inode.i_mode": 2,
        "inode.i_rdev": 4,
        "task_struct.signal": 8,
        "signal_struct.live": 4,
    }
    for name, member in offsets.items():
        struct_name = name.split(".")[0]
        assert member.size == sizes[name], name
        assert member.offset % member.size == 0, f"{name} is misaligned"
        assert member.offset + member.size <= kernel.struct_size(struct_name), name
    # Long-standing layout facts: fdtable starts with max_fds, followed by the fd array.
    assert offsets["fdtable.max_fds"].offset == 0
    assert offsets["fdtable.fd"].offset == 8
    assert offsets["inode.i_mode"].offset == 0
    assert offsets["inode.i_rdev"].offset > offsets["inode.i_mode"].offset
    # A second parse gives the same answers.
    assert probe_offsets(Btf.load()) == offsets
