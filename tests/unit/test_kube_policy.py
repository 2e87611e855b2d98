"""The policy ConfigMap's values: what parses, and that nothing else raises past StateError.

The daemon's policy watch keeps the last good policy on a StateError and says why; anything
else it took for the API server failing, and listed the ConfigMap again with back-off.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpolicy.errors import StateError
from qpolicy.kube.policy import parse_policy
from qpolicy.model import GpuConfig, GpuPolicy


def test_a_value_names_policies_per_gpu() -> None:
    text = 'gpus:\n  "0": {policy: burst-share}\n  1: {policy: fs, period_ms: 20}\n'
    assert parse_policy(text, "cm/default") == {
        0: GpuConfig(0, GpuPolicy.BURST_SHARE),
        1: GpuConfig(1, GpuPolicy.FIXED_SHARE, 20),
    }
    assert parse_policy("", "cm/default") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: [", "not YAML"),
        ("pods: {}", "the one key 'gpus'"),
        ('gpus:\n  "0": {policy: sometimes}', "sometimes"),
        ('gpus:\n  "0": {policy: bs, period_ms: ' + "9" * 5000 + "}", "digits"),
        ("gpus: " + "[" * 5000, "nested too deeply"),
        ('gpus:\n  "0": {policy: bs, period_ms: .inf}', "period_ms"),
    ],
)
def test_a_bad_value_is_a_state_error_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(StateError, match=message) as error:
        parse_policy(text, "cm/default")
    assert str(error.value).startswith("cm/default: ")


_SCALARS = st.sampled_from(
    [
        *("1e100000000", "9" * 5000, ".inf", ".nan", "50", "0x10", "1_000", "true", "~"),
        *("[1]", "{a: 1}", "'50'", "2001-01-01", "!!binary aGk=", "1:20", "bs", '"0"'),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["0", '"0"', "1", "01", "-1", "x", "1e3", "~"]),
            st.lists(
                st.tuples(st.sampled_from(["policy", "period_ms", "x"]), _SCALARS | st.text()),
                max_size=3,
            ),
        ),
        max_size=3,
    )
)
def test_any_value_parses_or_is_a_state_error(
    gpus: list[tuple[str, list[tuple[str, str]]]],
) -> None:
    text = "gpus:\n" + "\n".join(
        f"  {key}: {{" + ", ".join(f"{field}: {value}" for field, value in fields) + "}"
        for key, fields in gpus
    )
    try:
        policy = parse_policy(text, "cm/default")
    except StateError as error:
        assert str(error).startswith("cm/default: ")
    else:
        assert all(isinstance(config, GpuConfig) for config in policy.values())
