"""What qpolicy derives from a Pod (qpolicy.kube.pods), its cgroup on disk (both drivers), and
``qpolicy kube explain``, which prints the same derivation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from qpolicy.kube.podcgroup import find_cgroup
from qpolicy.kube.pods import cgroup_paths, derive, qos_class, quantity
from qpolicy.model import PodClass
from tests.unit.kube_double import pod_json
from tests.unit.test_cli import Cli

UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"


def pod(
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    return pod_json(
        "p-0", uid=UID, annotations=annotations, labels=labels, limits=limits, env=env, **kw
    )


GPU = {"nvidia.com/gpu": "1"}


# ------------------------------------------------------------------ the annotation families


@pytest.mark.parametrize(
    ("annotations", "labels", "limits", "expected", "key"),
    [
        ({"qpolicy.io/class": "online"}, None, GPU, PodClass.ONLINE, "annotation qpolicy.io/class"),
        (
            {"qpolicy.io/class": "Offline "},
            None,
            GPU,
            PodClass.OFFLINE,
            "annotation qpolicy.io/class",
        ),
        (
            {"tke.cloud.tencent.com/app-class": "online"},
            None,
            GPU,
            PodClass.ONLINE,
            "annotation tke.cloud.tencent.com/app-class",
        ),
        (
            None,
            None,
            {**GPU, "nvidia.com/priority": "0"},
            PodClass.ONLINE,
            "container main limit nvidia.com/priority",
        ),
        (
            None,
            None,
            {**GPU, "nvidia.com/priority": "1"},
            PodClass.OFFLINE,
            "container main limit nvidia.com/priority",
        ),
        (
            None,
            {"koordinator.sh/qosClass": "LSR"},
            GPU,
            PodClass.ONLINE,
            "label koordinator.sh/qosClass",
        ),
        (
            None,
            {"koordinator.sh/qosClass": "LS"},
            GPU,
            PodClass.ONLINE,
            "label koordinator.sh/qosClass",
        ),
        (
            None,
            {"koordinator.sh/qosClass": "BE"},
            GPU,
            PodClass.OFFLINE,
            "label koordinator.sh/qosClass",
        ),
        (None, None, GPU, PodClass.OFFLINE, "default"),
    ],
)
def test_class_from_each_family(
    annotations: dict[str, str] | None,
    labels: dict[str, str] | None,
    limits: dict[str, str],
    expected: PodClass,
    key: str,
) -> None:
    facts = derive(pod(annotations, labels, limits))
    assert facts.gpu_pod and not facts.errors and not facts.conflicts
    assert (facts.pod_class.value, facts.pod_class.key) == (expected, key)


def test_share_and_memory_from_qpolicy_annotations_or_hami_limits() -> None:
    ours = derive(pod({"qpolicy.io/share": "30", "qpolicy.io/memory": "8Gi"}))
    assert (ours.share.value, ours.share.key) == (30, "annotation qpolicy.io/share")
    assert (ours.memory.value, ours.memory.key) == (8 << 30, "annotation qpolicy.io/memory")
    assert ours.gpu_reasons == ("annotation(s) qpolicy.io/memory, qpolicy.io/share",)
    hami = derive(pod(limits={**GPU, "nvidia.com/gpucores": "40", "nvidia.com/gpumem": "3000"}))
    assert (hami.share.value, hami.share.key) == (40, "limit nvidia.com/gpucores (container main)")
    assert (hami.memory.value, hami.memory.key) == (
        3000 << 20,
        "limit nvidia.com/gpumem (container main)",
    )
    # gpucores 0 is HAMi's "no limit".
    assert derive(pod(limits={**GPU, "nvidia.com/gpucores": "0"})).share.value is None


def test_hami_limits_add_up_over_containers() -> None:
    manifest = pod(limits={**GPU, "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "1024"})
    second = json.loads(json.dumps(manifest["spec"]["containers"][0]))
    second["name"] = "sidecar"
    manifest["spec"]["containers"].append(second)
    facts = derive(manifest)
    assert (facts.share.value, facts.share.key) == (
        60,
        "limit nvidia.com/gpucores (containers main + sidecar)",
    )
    assert facts.memory.value == 2048 << 20
    second["resources"]["limits"]["nvidia.com/gpucores"] = "80"
    over = derive(manifest)
    assert over.errors == (
        "limit nvidia.com/gpucores (containers main + sidecar): shares over 100: "
        "nvidia.com/gpucores adds up to 110 % of one GPU over the pod's containers",
    )


def test_qpolicy_keys_win_and_each_disagreement_is_reported() -> None:
    facts = derive(
        pod(
            {"qpolicy.io/class": "offline", "tke.cloud.tencent.com/app-class": "online",
             "qpolicy.io/share": "20", "qpolicy.io/memory": "1Gi"},
            {"koordinator.sh/qosClass": "BE"},
            {**GPU, "nvidia.com/priority": "0", "nvidia.com/gpucores": "50",
             "nvidia.com/gpumem": "1024"},
        )
    )  # fmt: skip
    assert (facts.pod_class.value, facts.share.value, facts.memory.value) == (
        PodClass.OFFLINE,
        20,
        1 << 30,
    )
    assert [c.message for c in facts.conflicts] == [
        "class: annotation qpolicy.io/class='offline' is used, "
        "annotation tke.cloud.tencent.com/app-class='online' is ignored",
        "class: annotation qpolicy.io/class='offline' is used, "
        "container main limit nvidia.com/priority='online' is ignored",
        "share: annotation qpolicy.io/share='20' is used, "
        "limit nvidia.com/gpucores (container main)='50' is ignored",
    ]  # BE agrees with offline, and 1024 MiB is 1Gi: no disagreement there


@pytest.mark.parametrize(
    ("annotations", "labels", "limits", "message"),
    [
        (
            {"qpolicy.io/class": "gold"},
            None,
            GPU,
            "annotation qpolicy.io/class: invalid class 'gold'",
        ),
        ({"qpolicy.io/share": "0"}, None, GPU, "annotation qpolicy.io/share: invalid share '0'"),
        ({"qpolicy.io/share": "150"}, None, GPU, "invalid share '150'"),
        ({"qpolicy.io/memory": "8gb!"}, None, GPU, "invalid memory limit '8gb!'"),
        ({"qpolicy.io/memory": "512m"}, None, GPU, "'m' is milli"),
        ({"qpolicy.io/shares": "30"}, None, GPU, "unknown annotation qpolicy.io/shares"),
        ({"tke.cloud.tencent.com/app-class": "batch"}, None, GPU, "invalid class 'batch'"),
        (None, None, {**GPU, "nvidia.com/priority": "5"}, "invalid nvidia.com/priority '5'"),
        (None, {"koordinator.sh/qosClass": "GOLD"}, GPU, "invalid koordinator.sh/qosClass 'GOLD'"),
        (
            None,
            None,
            {**GPU, "nvidia.com/gpucores": "half"},
            "invalid nvidia.com/gpucores of container main 'half'",
        ),
        ({"qpolicy.io/share": "9" * 300}, None, GPU, "qpolicy.io/share is 300 characters long"),
    ],
)
def test_bad_values_are_errors_naming_the_value(
    annotations: dict[str, str] | None,
    labels: dict[str, str] | None,
    limits: dict[str, str],
    message: str,
) -> None:
    facts = derive(pod(annotations, labels, limits))
    assert len(facts.errors) == 1 and message in facts.errors[0], facts.errors


def test_a_bad_value_in_a_key_that_lost_is_only_a_note() -> None:
    facts = derive(pod({"qpolicy.io/class": "online", "tke.cloud.tencent.com/app-class": "batch"}))
    assert facts.errors == () and facts.pod_class.value is PodClass.ONLINE
    assert (
        "invalid class 'batch'" in facts.notes[0]
        and "annotation qpolicy.io/class is used" in facts.notes[0]
    )


def test_which_pods_are_gpu_pods() -> None:
    assert not derive(pod()).gpu_pod
    assert not derive(pod(env={"NVIDIA_VISIBLE_DEVICES": "none"})).gpu_pod
    assert derive(pod(env={"NVIDIA_VISIBLE_DEVICES": "all"})).gpu_pod
    assert derive(pod(limits=GPU)).gpu_requests == (("main", 1),)
    # A non-GPU pod with a stray key is left alone, not refused.
    assert derive(pod({"qpolicy.io/bogus": "1"})).errors == ()
    assert not derive(pod(limits={"nvidia.com/gpu": "0"})).gpu_pod


def test_qos_class_from_status_or_computed_as_kubernetes_does() -> None:
    assert qos_class(pod(qos="Guaranteed")) == ("Guaranteed", "status.qosClass")

    def manifest(*resources: dict[str, Any]) -> dict[str, Any]:
        return {
            "spec": {
                "containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]
            }
        }

    computed = "computed from the containers' requests and limits"
    assert qos_class(manifest({})) == ("BestEffort", computed)
    assert qos_class(manifest({"limits": {"nvidia.com/gpu": 1}})) == ("BestEffort", computed)
    both = {"cpu": "1", "memory": "1Gi"}
    assert qos_class(manifest({"limits": both})) == ("Guaranteed", computed)
    assert qos_class(
        manifest({"limits": both, "requests": {"cpu": "1000m", "memory": "1024Mi"}})
    ) == (
        "Guaranteed",
        computed,
    )
    assert qos_class(manifest({"limits": both}, {"requests": {"cpu": "1"}})) == (
        "Burstable",
        computed,
    )
    assert qos_class(manifest({"limits": both, "requests": {"cpu": "500m"}})) == (
        "Burstable",
        computed,
    )
    assert quantity("1.5Gi") == 3 << 29 and quantity("250m") * 4 == 1 and quantity("1e3") == 1000


# ------------------------------------------------------------------ cgroups, both drivers


def test_cgroup_paths_as_the_kubelet_names_them() -> None:
    assert cgroup_paths(UID, "Burstable") == {
        "systemd": "/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice",
        "cgroupfs": f"/kubepods/burstable/pod{UID}",
    }
    assert cgroup_paths(UID, "BestEffort")["cgroupfs"] == f"/kubepods/besteffort/pod{UID}"
    assert cgroup_paths(UID, "Guaranteed") == {
        "systemd": "/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice",
        "cgroupfs": f"/kubepods/pod{UID}",
    }


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("qos", ["Guaranteed", "Burstable", "BestEffort"])
def test_the_cgroup_is_found_on_disk_for_each_driver(tmp_path: Path, driver: str, qos: str) -> None:
    # The tree as the kubelet lays it out: the QoS tiers, another pod, then this pod's own.
    if driver == "systemd":
        top = tmp_path / "kubepods.slice"
        for tier in ("kubepods-burstable.slice", "kubepods-besteffort.slice"):
            (top / tier).mkdir(parents=True)
        (top / "kubepods-burstable.slice" / "kubepods-burstable-podffff.slice").mkdir()
    else:
        top = tmp_path / "kubepods"
        for tier in ("burstable", "besteffort"):
            (top / tier).mkdir(parents=True)
        (top / "burstable" / "podffff").mkdir()
    assert find_cgroup(tmp_path, UID, qos) is None  # not created yet: asked again later
    path = cgroup_paths(UID, qos)[driver]
    (tmp_path / path.lstrip("/")).mkdir()
    (tmp_path / path.lstrip("/") / "cri-containerd-abc.scope").mkdir()  # a container below
    assert find_cgroup(tmp_path, UID, qos) == path
    assert find_cgroup(tmp_path, "../../etc", qos) is None


def test_the_cgroup_is_found_in_the_real_cgroup2_hierarchy() -> None:
    """Real cgroups (the kernel makes each directory a cgroup), made and removed here."""
    from qpolicy.errors import QPolicyError
    from qpolicy.telemetry.cgroups import cgroup2_mount

    try:
        root = cgroup2_mount()  # /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts
    except QPolicyError:
        pytest.skip("no cgroup v2 hierarchy mounted")
    if os.geteuid() != 0 or not os.access(root, os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v2 hierarchy ({root})")
    base = root / f"qpolicy-test-{os.getpid()}"
    try:
        (base / "kubepods.slice" / "kubepods-besteffort.slice").mkdir(parents=True)
        assert (base / "kubepods.slice" / "cgroup.procs").exists()  # a cgroup, not a directory
        path = cgroup_paths(UID, "BestEffort")["systemd"]
        (base / path.lstrip("/")).mkdir()
        assert find_cgroup(base, UID, "BestEffort") == path
        assert find_cgroup(base, UID, "Burstable") is None
    finally:
        # cgroups are removed with rmdir, deepest first (their control files go with them).
        made = [d for d in base.rglob("*") if d.is_dir()] if base.exists() else []
        for directory in sorted(made, key=lambda p: len(p.parts), reverse=True):
            directory.rmdir()
        if base.exists():
            base.rmdir()


# ------------------------------------------------------------------ qpolicy kube explain


def explain(cli: Any, tmp_path: Path, manifest: dict[str, Any] | str, *args: str) -> Any:
    path = tmp_path / "pod.yaml"
    path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return cli("kube", "explain", str(path), *args)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


HAMI_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: train-3
  namespace: research
  uid: 0a1b2c3d-4e5f-6789-abcd-ef0123456789
spec:
  containers:
    - name: trainer
      image: registry.example/train:1
      resources:
        limits:
          nvidia.com/gpu: 2
          nvidia.com/gpucores: 40
          nvidia.com/gpumem: 20000
          nvidia.com/priority: 1
      env:
        - name: NVIDIA_VISIBLE_DEVICES
          value: "3,1"
"""


def test_explain_prints_what_each_setting_came_from(cli: Any, tmp_path: Path) -> None:
    result = explain(cli, tmp_path, HAMI_YAML)
    assert result.code == 0, result.err
    text = result.out
    assert "pod research/train-3 (uid 0a1b2c3d-4e5f-6789-abcd-ef0123456789)" in text
    assert "class    offline      from container trainer limit nvidia.com/priority" in text
    assert "share    40 %         from limit nvidia.com/gpucores (container trainer)" in text
    assert "memory   19.5GiB      from limit nvidia.com/gpumem (container trainer)" in text
    assert "QoS      BestEffort" in text
    assert "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_4e5f" in text
    assert "/kubepods/besteffort/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789" in text
    assert "GPUs     1, 3 (NVIDIA_VISIBLE_DEVICES): governed on GPU 1 only" in text


def test_explain_json_and_stdin(cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = pod(
        {
            "qpolicy.io/class": "online",
            "tke.cloud.tencent.com/app-class": "offline",
            "qpolicy.io/share": "30",
        },
        {"koordinator.sh/qosClass": "LS"},
        GPU,
    )
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(manifest)))
    result = cli("kube", "explain", "-", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["pod"] == "ml/p-0" and report["gpu_pod"] is True
    assert report["class"] == {"value": "online", "from": "annotation qpolicy.io/class"}
    assert report["share"] == {"value": 30, "from": "annotation qpolicy.io/share"}
    assert report["memory_bytes"] == {"value": None, "from": "default"}
    assert report["conflicts"] == [
        "class: annotation qpolicy.io/class='online' is used, "
        "annotation tke.cloud.tencent.com/app-class='offline' is ignored"
    ]
    assert report["qos"] == {"value": "Burstable", "from": "status.qosClass"}
    assert report["cgroups"]["cgroupfs"] == f"/kubepods/burstable/pod{UID}"
    assert report["gpus"]["requested"] == [{"container": "main", "count": 1}]
    assert report["refused"] == []


def test_explain_says_what_would_be_refused(cli: Any, tmp_path: Path) -> None:
    no_share = explain(cli, tmp_path, pod(limits=GPU), "--policy", "burst", "--json")
    assert no_share.code == 0, no_share.err
    assert json.loads(no_share.out)["refused"] == [
        "on a burst-share GPU: GPU 0 is burst-share but pod(s) ml/p-0 have no share"
    ]
    fits = explain(cli, tmp_path, pod({"qpolicy.io/share": "30"}), "--policy", "fixed-share")
    assert "admitted alone on a fixed-share GPU: yes" in fits.out
    not_gpu = explain(cli, tmp_path, pod(), "--json")
    assert json.loads(not_gpu.out)["refused"] == ["not a GPU pod: qpolicy leaves it alone"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (
            pod({"qpolicy.io/share": "150"}),
            "pod ml/p-0: annotation qpolicy.io/share: invalid share '150'",
        ),
        (pod({"qpolicy.io/class": "urgent"}), "invalid class 'urgent'"),
        (pod({"qpolicy.io/memory": "lots"}), "invalid memory limit 'lots'"),
        (pod(limits={**GPU, "nvidia.com/priority": "2"}), "invalid nvidia.com/priority '2'"),
        (
            "kind: Deployment\nmetadata: {name: x}\n",
            "expected one Pod manifest, found 0 Pod(s) among Deployment",
        ),
        ("a: [b\n", "not YAML or JSON"),
    ],
)
def test_explain_refuses_a_bad_value_in_one_line_with_exit_2(
    cli: Any, tmp_path: Path, manifest: dict[str, Any] | str, message: str
) -> None:
    for extra in ((), ("--json",)):
        result = explain(cli, tmp_path, manifest, *extra)
        assert result.code == 2
        assert result.out == ""
        lines = result.err.strip().splitlines()
        assert (
            len(lines) == 1 and lines[0].startswith("qpolicy: error: ") and message in lines[0]
        ), lines


def test_explain_of_a_missing_file(cli: Any, tmp_path: Path) -> None:
    result = cli("kube", "explain", str(tmp_path / "none.yaml"))
    assert result.code == 2 and "cannot read" in result.err
