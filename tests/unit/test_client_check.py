"""tools/gpu/client_check.py without a GPU: its timing of checks and its verdict."""

from __future__ import annotations

from tools.gpu import client_check


def test_checks_are_counted_by_answer_and_timed() -> None:
    held = {0xC1D00003}
    result = client_check.timed(lambda h: h in held, [0xC1D00001, 0xC1D00002, 0xC1D00003])
    assert result["count"] == 3 and result["answers"] == {"False": 2, "True": 1}
    assert result["us"]["median"] >= 0 and result["us"]["p99"] >= result["us"]["median"]
    assert client_check.summary([]) is None


def test_the_verdict_wants_free_false_held_true_and_no_log_line() -> None:
    good = {
        "free": {"count": 2, "answers": {"False": 2}},
        "held": {"count": 1, "answers": {"True": 1}},
        "log_lines": {"checks": 0},
    }
    assert client_check.verdict(good) == []
    bad = {
        "free": {"count": 2, "answers": {"False": 1, "None": 1}},
        "held": {"count": 1, "answers": {"False": 1}},
        "log_lines": {"checks": 3},
    }
    assert client_check.verdict(bad) == [
        "free handles answered {'False': 1, 'None': 1}",
        "held handles answered {'False': 1}",
        "the checks wrote 3 kernel log line(s)",
    ]
    assert client_check.verdict({**good, "log_lines": {"checks": None}}) == [
        "the kernel log could not be read"
    ]
