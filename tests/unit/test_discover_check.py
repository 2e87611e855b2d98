"""tools/gpu/discover_check.py: what a search found, against the probe's tree."""

from __future__ import annotations

from tools.gpu.discover_check import compare


def test_compare_names_what_the_search_missed_added_or_saw_otherwise() -> None:
    client, other = 0xC1D00001, 0xC1D00003
    reference = {
        client: {
            client: (0x41, None),
            0x10: (0x80, client),
            0x11: (0xA06C, 0x10),
            0x12: (0xC86F, 0x11),
            0x13: (0x40, 0x10),
        },
        other: {other: (0x41, None), 0x20: (0x80, other), 0x21: (0x2080, 0x20)},
    }
    found = {
        client: {
            client: (0x41, None),
            0x10: (0x80, client),
            0x11: (0xA06C, 0x10),
            0x13: (0x40, 0x11),  # another parent
            0x14: (0x40, 0x10),  # one the probe lost
        },
        other: {other: (0x41, None), 0x20: (0x80, other)},
    }
    result = compare(reference, found)
    main = result[f"{client:#x}"]
    assert (main["missing"], main["extra"]) == (1, 1)
    assert main["missing_kinds"] == {"channel": 1}
    assert main["enforcer_objects_missing"] == ["0x12"]
    assert main["differ"] == [["0x13", (0x40, 0x10), (0x40, 0x11)]]
    # A client without channels is searched no further than its device: its subdevice missing
    # is not an object the rm enforcer needs.
    assert result[f"{other:#x}"]["missing_kinds"] == {"subdevice": 1}
    assert result[f"{other:#x}"]["enforcer_objects_missing"] == []
    assert result["clients_not_found"] == [] and result["clients_not_in_reference"] == []
    assert compare(reference, {})["clients_not_found"] == [f"{client:#x}", f"{other:#x}"]
