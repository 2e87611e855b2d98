"""A raw result's JSON, read from the file as it was kept: plain, or compressed with xz (the
repository keeps tools/gpu/results/*.json.xz; a GPU call's $OUT holds plain .json)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any


class Unreadable(ValueError):
    """A result file that cannot be read as a JSON object; the message names the file."""


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``; what opening, decompressing or parsing raises goes up."""
    opener = lzma.open if path.name.endswith(".xz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def read_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; anything else, or a file that cannot be read, is
    Unreadable with one line naming the file and why."""
    try:
        data = read_json(path)
    except (OSError, lzma.LZMAError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Unreadable(f"{path}: {err}") from err
    if not isinstance(data, dict):
        raise Unreadable(f"{path}: not a JSON object")
    return data
