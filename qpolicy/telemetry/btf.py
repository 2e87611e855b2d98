"""Struct member offsets of the running kernel, read from its BTF (``/sys/kernel/btf/vmlinux``).

bcc compiles the probe against whatever kernel headers are installed, and on the CI machines and
the GPU host those are older than the running kernel: ``task_struct`` and friends have moved. The
probe therefore never dereferences a kernel struct through the headers; it reads raw offsets that
come from here and are substituted into the BPF C text. Only what the probe needs is decoded: the
header, the string section and the type section (format: Documentation/bpf/btf.rst).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from qpolicy.errors import QPolicyError

VMLINUX = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F

# Type kinds (include/uapi/linux/btf.h).
KIND_INT = 1
KIND_PTR = 2
KIND_ARRAY = 3
KIND_STRUCT = 4
KIND_UNION = 5
KIND_ENUM = 6
KIND_FWD = 7
KIND_TYPEDEF = 8
KIND_VOLATILE = 9
KIND_CONST = 10
KIND_RESTRICT = 11
KIND_FUNC = 12
KIND_FUNC_PROTO = 13
KIND_VAR = 14
KIND_DATASEC = 15
KIND_FLOAT = 16
KIND_DECL_TAG = 17
KIND_TYPE_TAG = 18
KIND_ENUM64 = 19

# Kinds that only qualify or rename another type: followed to reach the real one.
_MODIFIERS = frozenset({KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG})
# Bytes that follow the 12-byte btf_type, per kind: fixed, or per vlen entry.
_FIXED_EXTRA = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
_PER_ENTRY = {
    KIND_STRUCT: 12,
    KIND_UNION: 12,
    KIND_ENUM: 8,
    KIND_FUNC_PROTO: 8,
    KIND_DATASEC: 12,
    KIND_ENUM64: 12,
}
_HEADER = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")
_MEMBER = struct.Struct("<III")
_ARRAY = struct.Struct("<III")

# The probe's walk from the current task to the device number of fd N, and what decides whether
# the whole process has exited on kernels whose sched_process_exit has no group_dead field.
PROBE_MEMBERS: tuple[tuple[str, str], ...] = (
    ("task_struct", "files"),
    ("files_struct", "fdt"),
    ("fdtable", "max_fds"),
    ("fdtable", "fd"),
    ("file", "f_inode"),
    ("inode", "i_mode"),
    ("inode", "i_rdev"),
    ("task_struct", "signal"),
    ("signal_struct", "live"),
)


class BtfError(QPolicyError):
    """The kernel's BTF is missing, unreadable, or lacks a struct member the probe needs."""


@dataclass(frozen=True, slots=True)
class Member:
    offset: int  # bytes from the start of the outermost struct
    size: int  # bytes


@dataclass(frozen=True, slots=True)
class _Type:
    kind: int
    name: str
    vlen: int
    kind_flag: bool
    size_or_type: int
    extra: int  # offset of the kind-specific data in the type section


class Btf:
    """A parsed BTF blob: look up struct members by name."""

    def __init__(self, data: bytes, source: str = "BTF") -> None:
        self.source = source
        if len(data) < _HEADER.size:
            raise BtfError(f"{source}: too short to be BTF ({len(data)} bytes)")
        magic, version, _flags, hdr_len, type_off, type_len, str_off, str_len = _HEADER.unpack_from(
            data
        )
        if magic != BTF_MAGIC:
            raise BtfError(f"{source}: not BTF (magic 0x{magic:04x})")
        if version != 1:
            raise BtfError(f"{source}: BTF version {version} is not supported")
        types_start = hdr_len + type_off
        strings_start = hdr_len + str_off
        if types_start + type_len > len(data) or strings_start + str_len > len(data):
            raise BtfError(f"{source}: sections run past the end of the data")
        self._types_data = data[types_start : types_start + type_len]
        self._strings = data[strings_start : strings_start + str_len]
        # Type id 0 is void; ids count from 1 in section order.
        self._types: list[_Type | None] = [None]
        self._structs: dict[str, list[int]] = {}
        self._parse_types()

    @classmethod
    def load(cls, path: Path = VMLINUX) -> Btf:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BtfError(
                f"{path} does not exist: the kernel was built without CONFIG_DEBUG_INFO_BTF, "
                "and the probe will not guess struct offsets"
            ) from None
        except OSError as error:
            raise BtfError(f"cannot read {path}: {error.strerror}") from None
        return cls(data, str(path))

    def _name(self, offset: int) -> str:
        end = self._strings.find(b"\0", offset)
        if end < 0:
            raise BtfError(f"{self.source}: name offset {offset} runs past the string section")
        return self._strings[offset:end].decode("utf-8", "replace")

    def _parse_types(self) -> None:
        data = self._types_data
        pos = 0
        while pos < len(data):
            if pos + _TYPE.size > len(data):
                raise BtfError(f"{self.source}: truncated type at byte {pos}")
            name_off, info, size_or_type = _TYPE.unpack_from(data, pos)
            kind = (info >> 24) & 0x1F
            vlen = info & 0xFFFF
            extra = pos + _TYPE.size
            if kind in _FIXED_EXTRA:
                pos = extra + _FIXED_EXTRA[kind]
            elif kind in _PER_ENTRY:
                pos = extra + vlen * _PER_ENTRY[kind]
            elif kind in (KIND_PTR, KIND_FWD, KIND_FUNC, KIND_FLOAT) or kind in _MODIFIERS:
                pos = extra
            else:
                raise BtfError(f"{self.source}: unknown BTF kind {kind} (type {len(self._types)})")
            name = self._name(name_off) if kind in (KIND_STRUCT, KIND_UNION) else ""
            self._types.append(_Type(kind, name, vlen, bool(info >> 31), size_or_type, extra))
            if kind == KIND_STRUCT and name:
                self._structs.setdefault(name, []).append(len(self._types) - 1)

    def _type(self, type_id: int) -> _Type:
        if not 0 < type_id < len(self._types):
            raise BtfError(f"{self.source}: type id {type_id} does not exist")
        found = self._types[type_id]
        assert found is not None
        return found

    def _resolve(self, type_id: int) -> int:
        """Follow typedef / const / volatile / restrict / type-tag chains to the real type."""
        for _ in range(64):
            if type_id == 0:
                return 0
            t = self._type(type_id)
            if t.kind not in _MODIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BtfError(f"{self.source}: type {type_id} is a modifier loop")

    def size_of(self, type_id: int) -> int:
        type_id = self._resolve(type_id)
        if type_id == 0:
            raise BtfError(f"{self.source}: void has no size")
        t = self._type(type_id)
        if t.kind in (KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT):
            return t.size_or_type
        if t.kind == KIND_PTR:
            return 8
        if t.kind == KIND_ARRAY:
            element, _index, count = _ARRAY.unpack_from(self._types_data, t.extra)
            return self.size_of(element) * int(count)
        raise BtfError(f"{self.source}: type {type_id} (kind {t.kind}) has no size")

    def _members(self, type_id: int) -> Iterable[tuple[str, int, int, int]]:
        """(name, member type id, bit offset, bitfield bits or 0) of a struct or union."""
        t = self._type(type_id)
        for index in range(t.vlen):
            name_off, member_type, offset = _MEMBER.unpack_from(
                self._types_data, t.extra + index * _MEMBER.size
            )
            # With kind_flag the top 8 bits hold a bitfield size; the offset is the low 24.
            if t.kind_flag:
                yield self._name(name_off), member_type, offset & 0xFFFFFF, offset >> 24
            else:
                yield self._name(name_off), member_type, offset, 0

    def _find(self, type_id: int, member: str, base_bits: int) -> tuple[int, int, int] | None:
        """(bit offset, type id, bitfield size) of ``member``, looking into anonymous structs
        and unions."""
        for name, member_type, bits, bitfield in self._members(type_id):
            if name == member:
                return base_bits + bits, member_type, bitfield
            if not name:
                inner = self._resolve(member_type)
                if inner and self._type(inner).kind in (KIND_STRUCT, KIND_UNION):
                    found = self._find(inner, member, base_bits + bits)
                    if found is not None:
                        return found
        return None

    def member(self, struct_name: str, member: str) -> Member:
        """Byte offset and size of ``struct struct_name``'s member ``member``."""
        candidates = [
            type_id for type_id in self._structs.get(struct_name, ()) if self._type(type_id).vlen
        ]
        if not candidates:
            raise BtfError(f"{self.source}: no struct {struct_name}")
        for type_id in candidates:
            found = self._find(type_id, member, 0)
            if found is None:
                continue
            bits, member_type, bitfield = found
            if bits % 8 or bitfield:
                raise BtfError(f"{self.source}: {struct_name}.{member} is a bitfield")
            return Member(bits // 8, self.size_of(member_type))
        raise BtfError(f"{self.source}: struct {struct_name} has no member {member}")

    def struct_size(self, struct_name: str) -> int:
        for type_id in self._structs.get(struct_name, ()):
            return self._type(type_id).size_or_type
        raise BtfError(f"{self.source}: no struct {struct_name}")


def probe_offsets(btf: Btf) -> dict[str, Member]:
    """The members the probe walks, keyed ``struct.member``."""
    return {f"{s}.{m}": btf.member(s, m) for s, m in PROBE_MEMBERS}
