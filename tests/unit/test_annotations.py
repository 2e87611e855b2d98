"""Pods declared on cgroups with user.qpolicy.* extended attributes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qpolicy.desired.annotations import MAX_VALUE_BYTES, pod_of, scan
from qpolicy.errors import ValidationError
from qpolicy.model import PodClass, PodSpec
from tests.annotated_tree import annotate, xattr_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return xattr_root(tmp_path)


def test_annotated_cgroups_become_pods(root: Path) -> None:
    annotate(
        root / "kube" / "web", **{"class": "online", "share": "30", "gpu": "1", "memory": "8GiB"}
    )
    annotate(root / "kube" / "batch", share="50")
    (root / "kube" / "plain").mkdir()
    found = scan(root)
    assert found.errors == {}
    assert found.pods == {
        "/kube/web": PodSpec("/kube/web", 1, PodClass.ONLINE, 30, 8 << 30),
        "/kube/batch": PodSpec("/kube/batch", 0, PodClass.OFFLINE, 50, None),
    }


def test_bad_annotations_are_reported_and_skipped(root: Path) -> None:
    annotate(root / "bad", share="150")
    annotate(root / "good", share="10")
    found = scan(root)
    assert list(found.pods) == ["/good"]
    assert "invalid share '150'" in found.errors["/bad"] and found.errors["/bad"].startswith("/bad")


def test_pod_of_names_the_cgroup_in_errors() -> None:
    with pytest.raises(ValidationError, match="/x: invalid class 'urgent'"):
        pod_of("/x", {"class": "urgent"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe30", "user.qpolicy.share is not UTF-8 text"),
        (b"3\x000", "user.qpolicy.share holds unprintable characters"),
        (b"1" * (MAX_VALUE_BYTES + 1), f"user.qpolicy.share is {MAX_VALUE_BYTES + 1} bytes long"),
    ],
)
def test_garbage_in_an_attribute_is_reported_for_that_cgroup_only(
    root: Path, raw: bytes, message: str
) -> None:
    (root / "bad").mkdir()
    os.setxattr(root / "bad", "user.qpolicy.share", raw)
    annotate(root / "good", share="10")
    found = scan(root)  # must not raise: the daemon reads this every second
    assert list(found.pods) == ["/good"]
    assert found.errors["/bad"].startswith(f"/bad: {message}")


def test_a_misspelt_attribute_is_refused_rather_than_ignored(root: Path) -> None:
    annotate(root / "typo", shares="10")
    found = scan(root)
    assert found.pods == {}
    assert "unknown attribute(s) user.qpolicy.shares" in found.errors["/typo"]


def test_trusted_attributes_win_over_user_ones(root: Path) -> None:
    directory = root / "pod"
    annotate(directory, **{"class": "online", "share": "90"})
    try:
        os.setxattr(directory, "trusted.qpolicy.share", b"10")
    except OSError:
        pytest.skip("trusted.* attributes need CAP_SYS_ADMIN and a filesystem that takes them")
    found = scan(root)
    # Only the trusted namespace is read where it is present: the user class is not taken either.
    assert found.pods == {"/pod": PodSpec("/pod", 0, PodClass.OFFLINE, 10, None)}
