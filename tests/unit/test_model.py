import re

import pytest

from qpolicy.errors import PlanError, ValidationError
from qpolicy.model import (
    GpuConfig,
    GpuPolicy,
    PodClass,
    PodIdKind,
    PodSpec,
    check_pods_fit,
    format_bytes,
    parse_gpu_index,
    parse_memory,
    parse_period_ms,
    parse_pod_id,
    parse_share,
    pod_id_kind,
)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("best-effort", GpuPolicy.BEST_EFFORT),
        ("be", GpuPolicy.BEST_EFFORT),
        ("fixed-share", GpuPolicy.FIXED_SHARE),
        ("FS", GpuPolicy.FIXED_SHARE),
        (" burst-share ", GpuPolicy.BURST_SHARE),
        ("bs", GpuPolicy.BURST_SHARE),
        ("burst", GpuPolicy.BURST_SHARE),
        ("Burst-Share", GpuPolicy.BURST_SHARE),
        ("BURST_SHARE", GpuPolicy.BURST_SHARE),
        ("fixed", GpuPolicy.FIXED_SHARE),
        ("fixed_share", GpuPolicy.FIXED_SHARE),
        ("best", GpuPolicy.BEST_EFFORT),
        ("besteffort", GpuPolicy.BEST_EFFORT),
        ("BestEffort", GpuPolicy.BEST_EFFORT),
        ("best_effort", GpuPolicy.BEST_EFFORT),
    ],
)
def test_policy_names_and_aliases(text: str, policy: GpuPolicy) -> None:
    assert GpuPolicy.parse(text) is policy


@pytest.mark.parametrize("text", ["", "fair", "b", "bursty", "best-share", "effort"])
def test_unknown_policy_is_named_in_the_error(text: str) -> None:
    with pytest.raises(ValidationError, match=repr(text)):
        GpuPolicy.parse(text)


def test_classes() -> None:
    assert PodClass.parse("Online") is PodClass.ONLINE
    assert PodClass.parse("offline") is PodClass.OFFLINE
    with pytest.raises(ValidationError, match="'batch'"):
        PodClass.parse("batch")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1048576", 1048576),
        ("8Gi", 8 * 2**30),
        ("1.5GiB", 3 * 2**29),
        ("16GB", 16 * 10**9),
        ("4kib", 4096),
        (" 2 TiB ", 2 * 2**40),
        (12345, 12345),
        # Kubernetes quantities, as in a pod's resources or qpolicy.io/memory.
        ("8G", 8 * 10**9),
        ("512Mi", 512 * 2**20),
        ("1e9", 10**9),
        ("1E9", 10**9),
        ("2.5e3", 2500),
        ("1.5Gi", 3 * 2**29),
        ("64k", 64_000),
        ("1Ei", 2**60),
    ],
)
def test_memory_sizes(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    "text", ["", "0", "-1", "8XB", "GiB", "1.5B", "0.3KiB", "8 G iB", "1e-3", "8Ei", "1e30"]
)
def test_bad_memory_sizes_name_the_value(text: str) -> None:
    with pytest.raises(ValidationError, match="invalid memory limit"):
        parse_memory(text)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("512m", "'m' is milli in Kubernetes quantities; write Mi"),
        ("8gi", "quantity suffixes are case-sensitive: Gi"),
        ("8g", "quantity suffixes are case-sensitive: G"),
    ],
)
def test_a_quantity_in_the_wrong_case_says_how_to_write_it(text: str, hint: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"invalid memory limit {text!r}: {hint}")):
        parse_memory(text)


def test_format_bytes_round_trips_exact_sizes() -> None:
    for text in ("8GiB", "512MiB", "3KiB", "2TiB"):
        assert format_bytes(parse_memory(text)) == text
    assert format_bytes(1000) == "1000B"


@pytest.mark.parametrize("value", ["0", "101", "-5", "abc", "3.5", "", 0, 101])
def test_share_bounds(value: str | int) -> None:
    with pytest.raises(ValidationError, match="share"):
        parse_share(value)


def test_share_gpu_period_accept_valid_values() -> None:
    assert parse_share("1") == 1
    assert parse_share(100) == 100
    assert parse_gpu_index("0") == 0
    assert parse_gpu_index(247) == 247
    assert parse_period_ms("50") == 50
    for bad_gpu in ("-1", "248", "x"):
        with pytest.raises(ValidationError, match="GPU index"):
            parse_gpu_index(bad_gpu)
    for bad_period in ("0", "4", "1001", "fast"):
        with pytest.raises(ValidationError, match="period"):
            parse_period_ms(bad_period)


@pytest.mark.parametrize(
    ("pod_id", "kind"),
    [
        ("/kubepods.slice/pod-1/ctr", PodIdKind.CGROUP),
        ("/a", PodIdKind.CGROUP),
        ("trainer-0", PodIdKind.NAME),
        ("Web_1", PodIdKind.NAME),
        ("ml/trainer-0", PodIdKind.KUBERNETES),
        ("default/web.v2-1", PodIdKind.KUBERNETES),
    ],
)
def test_pod_ids(pod_id: str, kind: PodIdKind) -> None:
    assert parse_pod_id(pod_id) == pod_id
    assert pod_id_kind(pod_id) is kind


@pytest.mark.parametrize(
    ("pod_id", "message"),
    [
        ("kubepods.slice/x", r"must start with '/' \(did you mean '/kubepods.slice/x'\?\)"),
        ("kubepods.slice", r"must start with '/' \(did you mean '/kubepods.slice'\?\)"),
        ("a/b/c", "a cgroup path must start with '/'"),
        ("ML/trainer-0", "a Kubernetes pod is namespace/name in lowercase"),
        ("ml/Trainer", "a Kubernetes pod is namespace/name in lowercase"),
        ("ml./x", "a Kubernetes pod is namespace/name"),
    ],
)
def test_paths_without_their_slash_are_not_taken_for_names(pod_id: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_pod_id(pod_id)


@pytest.mark.parametrize(
    "pod_id", ["", "/", "//a", "/a/", "/a/../b", "/a/./b", "/a b", "a b", "-x", "a//b", "x" * 5000]
)
def test_bad_pod_ids(pod_id: str) -> None:
    with pytest.raises(ValidationError, match="invalid pod id"):
        parse_pod_id(pod_id)


def test_specs_validate_on_construction() -> None:
    with pytest.raises(ValidationError):
        PodSpec("p", gpu=0, share=0)
    with pytest.raises(ValidationError):
        GpuConfig(0, period_ms=2)
    assert GpuConfig(3).period_us == 50_000


def test_fixed_share_oversubscription_names_gpu_and_pods() -> None:
    gpu = GpuConfig(1, GpuPolicy.FIXED_SHARE)
    pods = [PodSpec("a", 1, share=60), PodSpec("b", 1, share=50), PodSpec("c", 0, share=90)]
    with pytest.raises(PlanError) as info:
        check_pods_fit(gpu, pods)
    message = str(info.value)
    assert "GPU 1" in message and "a=60" in message and "b=50" in message and "110" in message
    assert "c=" not in message  # pods of other GPUs are not part of the sum


def test_missing_share_rejected_only_where_shares_matter() -> None:
    pods = [PodSpec("a", 0), PodSpec("b", 0, share=40)]
    check_pods_fit(GpuConfig(0, GpuPolicy.BEST_EFFORT), pods)
    with pytest.raises(PlanError, match="pod\\(s\\) a have no share"):
        check_pods_fit(GpuConfig(0, GpuPolicy.BURST_SHARE), pods)
