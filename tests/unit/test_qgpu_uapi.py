"""kmod/uapi/qgpu.h and qpolicy/enforcers/kmod/uapi.py describe the same interface.

The header is parsed (``#define``s and ``enum`` bodies, with C's rule for members without a value)
and every name is compared with the Python mirror both ways, so a value changed, added or removed
in either file fails here. The attribute types come from the header's comments.
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

import pytest

from qpolicy.enforcers.kmod import uapi
from tests.unit.qgpu_fake import raw_attributes

HEADER = Path(__file__).resolve().parents[2] / "kmod" / "uapi" / "qgpu.h"

# C enum -> (Python enum, the prefix its members carry in C)
ENUMS: dict[str, tuple[type[IntEnum], str]] = {
    "qgpu_cmd": (uapi.Cmd, "QGPU_CMD_"),
    "qgpu_attr": (uapi.Attr, "QGPU_A_"),
    "qgpu_policy": (uapi.Policy, "QGPU_POLICY_"),
    "qgpu_class": (uapi.CgroupClass, "QGPU_CLASS_"),
    "qgpu_event": (uapi.Event, "QGPU_EVENT_"),
    "qgpu_preemption": (uapi.Preemption, "QGPU_PREEMPTION_"),
}

NLA_TYPES = {"u8": "uint8", "u32": "uint32", "u64": "uint64"}


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)


def _evaluate(expression: str, known: dict[str, int | str]) -> int | str:
    """A header value: a number, a string, a name, or ``(NAME - 1)`` as the ``*_MAX`` idiom."""
    expression = expression.strip()
    if expression.startswith('"'):
        return str(expression.strip('"'))
    match = re.fullmatch(r"\(?\s*(\w+)\s*(?:([-+])\s*(\w+))?\s*\)?", expression)
    assert match is not None, f"cannot read {expression!r} in {HEADER.name}"

    def term(token: str) -> int:
        if re.fullmatch(r"0x[0-9a-fA-F]+|[0-9]+", token):
            return int(token, 0)
        value = known[token]
        assert isinstance(value, int), token
        return value

    value = term(match.group(1))
    if match.group(2):
        value += term(match.group(3)) * (1 if match.group(2) == "+" else -1)
    return value


def header_enums() -> dict[str, dict[str, int]]:
    """Every enum of the header: name -> {member: value}, values as C assigns them."""
    text = _strip_comments(HEADER.read_text())
    enums: dict[str, dict[str, int]] = {}
    for match in re.finditer(r"\benum\s+(\w+)\s*\{(.*?)\}\s*;", text, re.DOTALL):
        members: dict[str, int] = {}
        following = 0
        for entry in filter(None, (part.strip() for part in match.group(2).split(","))):
            name, _, value = (piece.strip() for piece in entry.partition("="))
            number = _evaluate(value, dict(members)) if value else following
            assert isinstance(number, int)
            members[name] = number
            following = number + 1
        enums[match.group(1)] = members
    return enums


def header_defines() -> dict[str, int | str]:
    """Every ``#define`` with a value, evaluated (the include guard has none)."""
    known: dict[str, int | str] = {}
    for members in header_enums().values():
        known.update(members)
    defines: dict[str, int | str] = {}
    text = _strip_comments(HEADER.read_text())
    for match in re.finditer(r"^\s*#define\s+(\w+)[ \t]+(.+?)\s*$", text, re.MULTILINE):
        defines[match.group(1)] = known[match.group(1)] = _evaluate(match.group(2), known)
    return defines


def attribute_types() -> dict[str, str]:
    """``QGPU_A_X`` -> u8/u32/u64, from the comment on each member of ``enum qgpu_attr``."""
    body = re.search(r"enum\s+qgpu_attr\s*\{(.*?)\}", HEADER.read_text(), re.DOTALL)
    assert body is not None
    return dict(re.findall(r"(QGPU_A_\w+)\s*=\s*\d+\s*,\s*/\*\s*(u8|u32|u64)\b", body.group(1)))


def python_constants() -> dict[str, int | str]:
    """The mirror's module constants, under their C names."""
    return {
        f"QGPU_{name}": value
        for name, value in vars(uapi).items()
        if name.isupper() and isinstance(value, int | str) and not isinstance(value, IntEnum)
    }


def test_the_header_is_read() -> None:
    """Guards the parser: a header it reads as empty would agree with anything."""
    enums = header_enums()
    assert set(enums) == set(ENUMS)
    assert enums["qgpu_attr"]["QGPU_A_ONLINE_TIMESLICE_US"] == 24
    assert enums["qgpu_cmd"]["__QGPU_CMD_MAX"] == 7
    defines = header_defines()
    assert defines["QGPU_GENL_NAME"] == "qgpu"
    assert defines["QGPU_CMD_MAX"] == 6
    assert defines["QGPU_ONLINE_TIMESLICE_DEFAULT_US"] == 8192
    assert len(attribute_types()) == 26  # every attribute but UNSPEC and PAD has a type


def test_every_define_has_the_same_value_both_ways() -> None:
    defines = header_defines()
    # The include guard is a name, not a value; it is not mirrored.
    defines.pop("_UAPI_QPOLICY_QGPU_H", None)
    assert python_constants() == defines


@pytest.mark.parametrize("c_name", sorted(ENUMS))
def test_every_enum_has_the_same_members_both_ways(c_name: str) -> None:
    python_enum, prefix = ENUMS[c_name]
    # __QGPU_*_MAX only counts the members; the #define QGPU_*_MAX that uses it is compared.
    header = {
        name.removeprefix(prefix): value
        for name, value in header_enums()[c_name].items()
        if not name.startswith("__")
    }
    assert all(name.startswith(prefix) for name in header_enums()[c_name] if name[0] != "_")
    assert {member.name: member.value for member in python_enum} == header


def test_the_mirror_has_no_enum_the_header_lacks() -> None:
    mirrored = {
        value
        for value in vars(uapi).values()
        if isinstance(value, type) and issubclass(value, IntEnum) and value is not IntEnum
    }
    assert mirrored == {python_enum for python_enum, _ in ENUMS.values()}


def test_the_message_class_maps_every_attribute_to_its_number_and_type() -> None:
    types = attribute_types()
    attributes = header_enums()["qgpu_attr"]
    declared = {name: (number, nla_type) for number, name, nla_type in uapi.QgpuMsg.nla_map}
    expected = {
        name: (number, NLA_TYPES[types[name]] if name in types else "none")
        for name, number in attributes.items()
        if not name.startswith("__")
    }
    assert declared == expected
    assert uapi.QgpuMsg.prefix == "QGPU_A_"


def test_attribute_types_survive_encoding() -> None:
    """What pyroute2 makes of the declared types on the wire: each attribute has the header's
    width and carries that width's largest value there and back."""
    message = uapi.QgpuMsg()
    message["cmd"] = uapi.Cmd.CGROUP_GET
    message["version"] = uapi.GENL_VERSION
    largest = {"u8": 0xFF, "u32": 0xFFFF_FFFF, "u64": 0xFFFF_FFFF_FFFF_FFFF}
    types = attribute_types()
    attributes = header_enums()["qgpu_attr"]
    message["attrs"] = [
        (name, largest[kind])
        for name, kind in sorted(types.items(), key=lambda i: attributes[i[0]])
    ]
    message.encode()
    decoded = uapi.QgpuMsg(message.data)
    decoded.decode()
    for name, kind in types.items():
        assert decoded.get_attr(name) == largest[kind], name
    # On the wire, an attribute's length is its 4-byte header plus the value's size.
    sizes = {"u8": 5, "u32": 8, "u64": 12}
    assert raw_attributes(message.data) == sorted(
        (attributes[name], sizes[kind]) for name, kind in types.items()
    )
