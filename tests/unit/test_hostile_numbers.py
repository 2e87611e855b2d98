"""Numbers a tenant writes cannot stall or kill the daemon.

Integers are parsed with Python's int, which refuses strings of more than 4 300 digits with a
ValueError: where the parsers promise a ValidationError (which the daemon logs, keeping the last
good value), such a value raised past them.

Memory limits and Kubernetes quantities are parsed exactly (fractions), and an exponent is a
power of ten: built exactly, "1e100000000" takes minutes and gigabytes. The daemon parses cgroup
annotations and pod objects on its loop thread, so one pod's annotation would have stopped the
enforcement of every pod on the node. Each case runs in a child process with a deadline, so a
parser that builds the number fails the test instead of hanging the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from qpolicy.errors import ValidationError
from qpolicy.instance import holder_of
from qpolicy.kube.pods import derive, quantity
from qpolicy.model import (
    exact_decimal,
    parse_gpu_index,
    parse_memory,
    parse_period_ms,
    parse_share,
)
from tests.unit.kube_double import pod_json

ROOT = Path(__file__).parents[2]
HUGE = "1e100000000"
# Each is refused at once; built exactly, the first three take minutes.
REFUSED = [HUGE, "1e-100000000", "0e999999999", "9" * 5000, "1e" + "9" * 5000]


def run_child(code: str) -> object:
    """What ``code`` prints (one JSON value), run in a fresh interpreter with 60 s to finish."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_memory_limits_with_far_exponents_are_refused_at_once() -> None:
    answers = run_child(
        f"""
        import json
        from qpolicy.errors import ValidationError
        from qpolicy.model import parse_memory
        out = []
        for text in {REFUSED!r}:
            try:
                out.append(parse_memory(text))
            except ValidationError as error:
                out.append(str(error)[:40])
        print(json.dumps(out))
        """
    )
    assert isinstance(answers, list) and len(answers) == len(REFUSED)
    assert all(str(a).startswith("invalid memory limit") for a in answers), answers


@pytest.mark.parametrize("parse", [parse_share, parse_gpu_index, parse_period_ms])
def test_integers_of_more_digits_than_python_converts_are_refused(
    parse: Callable[[str], int],
) -> None:
    with pytest.raises(ValidationError, match="out of range"):
        parse("9" * 5000)


def test_a_lock_file_with_no_pid_in_it_names_no_holder(tmp_path: Path) -> None:
    for text in ("9" * 5000, "\N{SUPERSCRIPT TWO}", "12a", ""):
        (tmp_path / "lock").write_text(text)
        assert holder_of(tmp_path / "lock") is None
    (tmp_path / "lock").write_text("4242\n")
    assert holder_of(tmp_path / "lock") == 4242


def test_a_pods_annotation_or_limit_with_a_far_exponent_is_an_error_of_that_pod() -> None:
    answers = run_child(
        f"""
        import json
        from qpolicy.desired.annotations import pod_of
        from qpolicy.errors import ValidationError
        from qpolicy.kube.pods import derive
        from tests.unit.kube_double import pod_json
        out = []
        for annotations, limits in (
            ({{"qpolicy.io/memory": {HUGE!r}}}, {{"nvidia.com/gpu": "1"}}),
            ({{}}, {{"nvidia.com/gpu": {HUGE!r}}}),
            ({{}}, {{"nvidia.com/gpu": "1", "nvidia.com/gpucores": {HUGE!r}}}),
        ):
            pod = pod_json("a-0", annotations=annotations)
            pod["spec"]["containers"][0]["resources"] = {{"limits": limits}}
            out.append(list(derive(pod).errors))
        try:
            pod_of("/kubepods/a", {{"memory": {HUGE!r}}})
        except ValidationError as error:
            out.append([str(error)])
        print(json.dumps(out))
        """
    )
    assert isinstance(answers, list) and len(answers) == 4
    assert all(len(errors) == 1 for errors in answers), answers
    assert "qpolicy.io/memory" in answers[0][0] and "nvidia.com/gpu" in answers[1][0]
    assert "nvidia.com/gpucores" in answers[2][0] and "/kubepods/a" in answers[3][0]


def test_infinity_and_nan_in_a_pod_object_are_errors_not_crashes() -> None:
    # Python's json reads Infinity and NaN, so a pod object may hold them.
    for bad in (float("inf"), float("nan")):
        pod = pod_json("a-0")
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": bad}}
        errors = derive(pod).errors
        assert len(errors) == 1 and "nvidia.com/gpu" in errors[0], errors
        with pytest.raises(ValueError):
            quantity(bad)


@pytest.mark.parametrize(
    ("mantissa", "exponent", "value"),
    [("1", None, 1), ("1.5", "3", 1500), ("25", "-1", 2.5), ("1", "41", 10**41), ("0", "41", 0)],
)
def test_exact_decimal_builds_what_can_be_a_value(
    mantissa: str, exponent: str | None, value: float
) -> None:
    assert exact_decimal(mantissa, exponent) == value


def test_exact_decimal_refuses_exponents_no_value_can_have() -> None:
    for mantissa, exponent in (("1", "42"), ("1", "-42"), ("0", "100000000")):
        with pytest.raises(ValueError, match="out of range"):
            exact_decimal(mantissa, exponent)
    # The values qpolicy takes are all far inside: the largest memory limit, 2**63 - 1 bytes.
    assert parse_memory("9.2e18") == 9_200_000_000_000_000_000
    with pytest.raises(ValidationError):
        parse_memory("1e19")
