"""tests/rerun_reasons.py: a test that fails once and passes on its rerun leaves its first
failure's message in the summary; a run with no rerun adds nothing."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

FAILS_ONCE = """
import pytest

tries = []

@pytest.mark.flaky(reruns=1)
def test_flaky():
    tries.append(1)
    p99 = 4.21 if len(tries) == 1 else 3.1
    assert p99 <= 2.0 * 2.0, "p99 over twice solo's"
"""


def test_the_summary_names_what_failed_before_the_rerun(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_once=FAILS_ONCE)
    result = pytester.runpytest_inprocess("-p", "tests.rerun_reasons", "-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"passed": 1, "rerun": 1}
    result.stdout.fnmatch_lines(
        [
            "*why each rerun ran*",
            "test_once.py::test_flaky (call): AssertionError: p99 over twice solo's",
            "assert 4.21 <= (2.0 * 2.0)",
        ]
    )


def test_no_rerun_no_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fine="def test_fine():\n    assert True\n")
    result = pytester.runpytest_inprocess("-p", "tests.rerun_reasons", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "why each rerun ran" not in result.stdout.str()


def test_a_setup_error_is_named_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_setup="""
import pytest

calls = []

@pytest.fixture
def vm():
    calls.append(1)
    if len(calls) == 1:
        raise OSError("no VM")

@pytest.mark.flaky(reruns=1)
def test_uses_vm(vm):
    pass
"""
    )
    result = pytester.runpytest_inprocess("-p", "tests.rerun_reasons", "-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"passed": 1, "rerun": 1}
    result.stdout.fnmatch_lines(["test_setup.py::test_uses_vm (setup): OSError: no VM"])
