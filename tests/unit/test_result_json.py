"""tools/gpu/result_json.py: raw results read as kept, plain or xz, bad ones named in one line."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from tools.gpu.result_json import Unreadable, read_json, read_object


def test_plain_and_xz_read_alike(tmp_path: Path) -> None:
    plain, packed = tmp_path / "r.json", tmp_path / "r.json.xz"
    plain.write_text(json.dumps({"a": [1, 2]}))
    with lzma.open(packed, "wt") as f:
        json.dump({"a": [1, 2]}, f)
    assert read_json(plain) == read_json(packed) == read_object(packed) == {"a": [1, 2]}


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("list.json", b"[1]", "not a JSON object"),
        ("torn.json", b'{"a": ', "Expecting value"),
        ("fake.json.xz", b"{}", "Input format not supported"),
        ("missing.json", None, "No such file"),
    ],
)
def test_what_cannot_be_read_is_unreadable_naming_the_file(
    tmp_path: Path, name: str, content: bytes | None, words: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(Unreadable, match=words) as raised:
        read_object(path)
    assert str(raised.value).startswith(f"{path}: ")
