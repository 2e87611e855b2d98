"""nvmock answers the RM calls of tests/vm/rmcases.py as the real driver answered them.

The real answers are recordings of ``tools/gpu/rm_conformance.py`` on GPU hosts
(``tools/gpu/results/*-rm-conformance-*.json``). Every answer nvmock gives differently fails this
test unless DIFFERENCES below names it, with why nvmock may differ; a named difference that no
longer differs fails too, so the list stays true. A case no recording has answered fails: a new
case needs a run on a GPU first. A recording is held to the cases it answered: one made before a
case was added keeps checking the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.vm import rmcases
from tests.vm.rmclient import Rm

RECORDINGS = rmcases.recordings()

# "case/answer" → why nvmock's answer may differ from the real driver's (CONFORMANCE.md).
DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="module")
def nvmock_answers() -> dict[str, Any]:
    rm = Rm(0)
    try:
        return rmcases.run(rm)
    finally:
        rm.close()


def test_there_is_a_recording_of_the_real_driver() -> None:
    assert RECORDINGS, f"no *-rm-conformance-*.json in {rmcases.RESULTS}"


def test_every_case_has_a_real_answer() -> None:
    answered = set().union(*(json.loads(path.read_text())["cases"] for path in RECORDINGS))
    unrecorded = sorted(set(rmcases.CASES) - answered)
    assert not unrecorded, f"cases {unrecorded} have no real answer in {rmcases.RESULTS}"


@pytest.mark.parametrize("recording", RECORDINGS, ids=[path.stem for path in RECORDINGS])
def test_nvmock_answers_as_the_real_driver_did(
    recording: Path, nvmock_answers: dict[str, Any]
) -> None:
    real = json.loads(recording.read_text())
    mock = {case: answers for case, answers in nvmock_answers.items() if case in real["cases"]}
    found = rmcases.differences(real["cases"], mock)
    unexplained = {path: pair for path, pair in found.items() if path not in DIFFERENCES}
    stale = sorted(
        path for path in DIFFERENCES if path.split("/")[0] in real["cases"] and path not in found
    )
    lines = [f"{path}: real {pair[0]!r}, nvmock {pair[1]!r}" for path, pair in unexplained.items()]
    assert not unexplained, f"{real.get('gpu')} ({real.get('driver')}):\n" + "\n".join(lines)
    assert not stale, f"named differences that nvmock no longer has: {stale}"
