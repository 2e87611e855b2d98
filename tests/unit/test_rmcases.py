"""The RM conformance cases and the real driver's kept answers fit together (no VM needed).

tests/vm/test_nvmock_reality.py compares nvmock with these recordings; here, without a driver:
every case has a real answer, the recordings name the GPU and driver they came from, and the
comparison finds a changed, a missing and an extra answer.
"""

from __future__ import annotations

import json

from tests.vm import rmcases


def test_every_case_has_an_answer_from_a_real_gpu() -> None:
    kept = rmcases.recordings()
    assert kept
    answered: set[str] = set()
    for path in kept:
        recording = json.loads(path.read_text())
        assert recording["gpu"] and "NVIDIA" in recording["driver"], path.name
        assert not [name for name, answer in recording["cases"].items() if "error" in answer]
        answered |= set(recording["cases"])
    assert set(rmcases.CASES) <= answered


def test_the_comparison_finds_each_kind_of_difference() -> None:
    real = {"a": {"status": "NV_OK", "size": 65536, "pair": ["NV_OK", 1]}, "b": "NV_OK"}
    same = {"a": {"status": "NV_OK", "size": 65536, "pair": ("NV_OK", 1)}, "b": "NV_OK"}
    assert rmcases.differences(real, same) == {}
    changed = {"a": {"status": "NV_OK", "size": 4096, "pair": ("NV_OK", 1)}, "c": 1}
    assert rmcases.differences(real, changed) == {
        "a/size": (65536, 4096),
        "b": ("NV_OK", "(none)"),
        "c": ("(none)", 1),
    }
