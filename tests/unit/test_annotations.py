"""Pods declared on cgroups with user.qpolicy.* extended attributes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qpolicy.annotations import Annotations, pod_of, scan
from qpolicy.daemon import merged_state
from qpolicy.errors import ValidationError
from qpolicy.model import PodClass, PodSpec
from qpolicy.state import DesiredState


def annotate(directory: Path, **values: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in values.items():
        os.setxattr(directory, f"user.qpolicy.{key}", value.encode())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    try:
        os.setxattr(tmp_path, "user.qpolicy.probe", b"1")
        os.removexattr(tmp_path, "user.qpolicy.probe")
    except OSError:
        pytest.skip(f"{tmp_path} does not take user.* extended attributes")
    return tmp_path


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


def test_the_state_file_wins_over_annotations() -> None:
    state = DesiredState().with_pod(PodSpec("/kube/web", 0, PodClass.OFFLINE, 10))
    annotations = Annotations(
        pods={
            "/kube/web": PodSpec("/kube/web", 0, PodClass.ONLINE, 30),
            "/kube/other": PodSpec("/kube/other", 0, PodClass.ONLINE, 20),
        }
    )
    merged = merged_state(state, annotations)
    assert merged.pods["/kube/web"].share == 10
    assert merged.pods["/kube/other"].share == 20
