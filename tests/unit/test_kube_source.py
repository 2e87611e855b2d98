"""``qpolicy daemon --kubernetes``: the pod source against an API-server double.

The double (tests/unit/kube_double.py) is a small HTTP server speaking the API server's wire
format for the requests the agent makes; the agent reaches it through the real ``kubernetes``
client, as it reaches a real API server. No kube-apiserver can be installed here.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from qpolicy.desired.admission import Origin
from qpolicy.desired.source import DesiredSource
from qpolicy.kube.pods import cgroup_paths
from qpolicy.kube.source import CONFLICT, REFUSED, KubernetesSource, api_client
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.state import StateStore
from qpolicy.telemetry.gpus import GpuInfo
from tests.unit.kube_double import (
    NODE,
    FakeApiServer,
    configmap_json,
    kubeconfig,
    node_json,
    pod_json,
)

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-55555555-6666-7777-8888-999999999999"
GPUS = [
    GpuInfo(0, UUID0, "0000:17:00.0", 0, "NVIDIA H200"),
    GpuInfo(1, UUID1, "0000:65:00.0", 1, "NVIDIA H200"),
]
DEADLINE_S = 15.0


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.close()


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    return root


def make_cgroup(root: Path, pod: dict[str, Any], driver: str = "systemd") -> str:
    path = cgroup_paths(pod["metadata"]["uid"], pod["status"]["qosClass"])[driver]
    (root / path.lstrip("/")).mkdir(parents=True)
    return path


def client(server: FakeApiServer) -> Any:
    from kubernetes import client as k8s

    configuration = k8s.Configuration()
    configuration.host = server.url
    return k8s.ApiClient(configuration)


def source(server: FakeApiServer, root: Path, **kw: Any) -> KubernetesSource:
    kw.setdefault("gpus", lambda: GPUS)
    return KubernetesSource(
        client(server),
        NODE,
        cgroup_root=lambda: root,
        watch_timeout_s=5,
        request_timeout_s=5,
        backoff_s=(0.05, 0.3),
        node_every_s=1,
        **kw,
    )


def until(check: Callable[[], bool], refresh: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        refresh()
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def specs(kube: KubernetesSource) -> dict[str, PodSpec]:
    return {c.spec.id: c.spec for c in kube.candidates()}


def with_annotations(pod: dict[str, Any], **values: str) -> dict[str, Any]:
    changed = json.loads(json.dumps(pod))
    changed["metadata"]["annotations"].update(
        {f"qpolicy.io/{k}" if "/" not in k else k: v for k, v in values.items()}
    )
    return changed


def test_the_nodes_gpu_pods_become_candidates_and_follow_their_changes(
    api: FakeApiServer, cgroups: Path
) -> None:
    infer = pod_json(
        "infer-0",
        annotations={"qpolicy.io/class": "online", "qpolicy.io/share": "30"},
        limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"},
        env={"NVIDIA_VISIBLE_DEVICES": UUID1},
    )
    web = pod_json("web-0")  # no GPU: left alone
    elsewhere = pod_json("train-0", node="gpu-node-2", limits={"nvidia.com/gpu": "1"})
    for pod in (infer, web, elsewhere):
        api.add_pod(pod)
    infer_cgroup = make_cgroup(cgroups, infer)
    make_cgroup(cgroups, web)
    kube = source(api, cgroups).start()
    try:
        until(lambda: infer_cgroup in specs(kube), kube.refresh, "the GPU pod")
        assert specs(kube) == {
            infer_cgroup: PodSpec(infer_cgroup, 1, PodClass.ONLINE, 30, 8192 << 20)
        }
        (candidate,) = kube.candidates()
        assert candidate.origin is Origin.KUBERNETES
        assert candidate.arrived == datetime.fromisoformat("2026-11-24T10:00:00+00:00").timestamp()
        assert kube.names() == {infer_cgroup: ("ml", "infer-0")}
        assert kube.up
        # Listed and watched for this node only, from the list's version, with bookmarks.
        (listed,) = api.lists("/pods")
        assert listed["fieldSelector"] == [f"spec.nodeName={NODE}"]
        until(lambda: bool(api.watches("/pods")), kube.refresh, "the watch")
        watch = api.watches("/pods")[0]
        assert watch["fieldSelector"] == [f"spec.nodeName={NODE}"]
        assert watch["allowWatchBookmarks"] == ["true"]
        assert watch["resourceVersion"] == ["103"]

        api.modify_pod(with_annotations(infer, share="40"))
        until(lambda: specs(kube)[infer_cgroup].share == 40, kube.refresh, "the new share")

        # A pod whose cgroup is not there yet waits for it (cgroupfs driver, Guaranteed).
        train = pod_json(
            "train-1",
            qos="Guaranteed",
            limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/priority": "1"},
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
        )
        api.add_pod(train)
        time.sleep(0.3)
        for _ in range(5):
            kube.refresh()
        assert len(specs(kube)) == 1
        train_cgroup = make_cgroup(cgroups, train, "cgroupfs")
        assert train_cgroup == f"/kubepods/pod{train['metadata']['uid']}"
        until(lambda: train_cgroup in specs(kube), kube.refresh, "the cgroup to be found")
        assert specs(kube)[train_cgroup] == PodSpec(train_cgroup, 0, PodClass.OFFLINE, 50)

        api.delete_pod(infer)
        until(lambda: infer_cgroup not in specs(kube), kube.refresh, "the deleted pod to go")
        assert list(specs(kube)) == [train_cgroup]
        assert kube.relists == 1
    finally:
        kube.close()


def test_410_gone_makes_it_list_again(api: FakeApiServer, cgroups: Path) -> None:
    pod = pod_json(
        "infer-0", annotations={"qpolicy.io/share": "30"}, env={"NVIDIA_VISIBLE_DEVICES": "0"}
    )
    api.add_pod(pod)
    cgroup = make_cgroup(cgroups, pod)
    kube = source(api, cgroups).start()
    try:
        until(lambda: cgroup in specs(kube), kube.refresh, "the pod")
        # A change the watch never sees (history compacted), then 410 Gone on the watch.
        api.modify_pod(with_annotations(pod, share="60"), record=False)
        api.gone()
        until(lambda: specs(kube)[cgroup].share == 60, kube.refresh, "the relist")
        assert kube.relists == 2
        assert len(api.lists("/pods")) == 2
        assert kube.up
    finally:
        kube.close()


def test_a_dropped_watch_resumes_from_the_last_version_a_bookmark_gave(
    api: FakeApiServer, cgroups: Path
) -> None:
    first = pod_json(
        "a-0", annotations={"qpolicy.io/share": "30"}, env={"NVIDIA_VISIBLE_DEVICES": "0"}
    )
    api.add_pod(first)
    make_cgroup(cgroups, first)
    kube = source(api, cgroups).start()
    try:
        until(lambda: len(specs(kube)) == 1, kube.refresh, "the first pod")
        # A change on another node moves the version; only a bookmark tells this agent.
        api.add_pod(pod_json("x-0", node="gpu-node-2"))
        moved = str(api.rv)
        until(lambda: kube._pods_rv == moved, kube.refresh, "a bookmark")
        api.drop()
        second = pod_json(
            "b-0", annotations={"qpolicy.io/share": "20"}, env={"NVIDIA_VISIBLE_DEVICES": "1"}
        )
        cgroup = make_cgroup(cgroups, second)
        api.add_pod(second)
        until(lambda: cgroup in specs(kube), kube.refresh, "the pod added after the drop")
        assert kube.relists == 1  # resumed, not listed again
        assert [w["resourceVersion"] for w in api.watches("/pods")][:2] == [["101"], [moved]]
        assert kube.up
    finally:
        kube.close()


def test_up_is_false_while_the_api_server_cannot_be_reached(
    api: FakeApiServer, cgroups: Path
) -> None:
    pod = pod_json(
        "a-0", annotations={"qpolicy.io/share": "30"}, env={"NVIDIA_VISIBLE_DEVICES": "0"}
    )
    api.add_pod(pod)
    cgroup = make_cgroup(cgroups, pod)
    kube = source(api, cgroups).start()
    try:
        until(lambda: kube.up and cgroup in specs(kube), kube.refresh, "the first list")
        api.down = True
        api.drop()
        until(lambda: not kube.up, kube.refresh, "up to fall")
        assert cgroup in specs(kube)  # what was known is kept
        api.down = False
        until(lambda: kube.up, kube.refresh, "up to come back")
        # Reconnected: changes flow again.
        api.modify_pod(with_annotations(pod, share="45"))
        until(lambda: specs(kube)[cgroup].share == 45, kube.refresh, "the change after")
    finally:
        kube.close()


def events(api: FakeApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    with api.lock:
        return [
            e for e in api.events if e["involvedObject"]["name"] == name and e["reason"] == reason
        ]


def test_events_on_bad_values_conflicts_and_admission_refusals_once_each(
    api: FakeApiServer, cgroups: Path, tmp_path: Path
) -> None:
    api.nodes[NODE] = node_json(NODE, {})
    api.put_configmap(
        configmap_json(
            "qpolicy-policy", "qpolicy-system", {"default": 'gpus:\n  "0": {policy: burst-share}\n'}
        )
    )
    gpu0 = {"NVIDIA_VISIBLE_DEVICES": "0"}
    bad = pod_json("bad-0", annotations={"qpolicy.io/share": "150"}, env=gpu0)
    both = pod_json(
        "both-0",
        annotations={
            "qpolicy.io/class": "online",
            "tke.cloud.tencent.com/app-class": "offline",
            "qpolicy.io/share": "10",
        },
        env=gpu0,
    )
    first = pod_json(
        "a-0", annotations={"qpolicy.io/share": "60"}, env=gpu0, created="2026-11-24T10:00:00Z"
    )
    late = pod_json(
        "b-0", annotations={"qpolicy.io/share": "60"}, env=gpu0, created="2026-11-24T11:00:00Z"
    )
    cgroup = {}
    for pod in (bad, both, first, late):
        api.add_pod(pod)
        cgroup[pod["metadata"]["name"]] = make_cgroup(cgroups, pod)
    kube = source(api, cgroups, policy_configmap=("qpolicy-system", "qpolicy-policy")).start()
    desired = DesiredSource(StateStore(tmp_path / "state"), sources=[kube])
    try:
        until(
            lambda: bool(events(api, "b-0", REFUSED) and events(api, "bad-0", REFUSED)
                         and events(api, "both-0", CONFLICT)),
            desired.refresh,
            "the Events",
        )  # fmt: skip
        (refused,) = events(api, "b-0", REFUSED)
        assert refused["type"] == "Warning"
        # a-0 (60, first to arrive) and both-0 (10) were taken; b-0 arrived last.
        # Named as Kubernetes names them, not by cgroup.
        message = refused["message"]
        assert message.startswith(
            "qpolicy: pod ml/b-0 refused: shares on GPU 0 (burst-share) sum to 130 > 100: "
        )
        assert {"ml/both-0=10", "ml/a-0=60", "ml/b-0=60"} == set(
            message.split(": ")[-1].split(", ")
        )
        assert refused["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "b-0",
            "namespace": "ml",
            "uid": late["metadata"]["uid"],
        }
        assert refused["source"]["component"] == "qpolicy"
        assert refused["metadata"]["namespace"] == "ml"
        (invalid,) = events(api, "bad-0", REFUSED)
        assert "qpolicy.io/share" in invalid["message"] and "'150'" in invalid["message"]
        (conflict,) = events(api, "both-0", CONFLICT)
        assert "tke.cloud.tencent.com/app-class='offline' is ignored" in conflict["message"]
        # What was admitted: a-0 (first to arrive) and both-0 (online, the qpolicy.io key wins).
        assert set(desired.state.pods) == {cgroup["a-0"], cgroup["both-0"]}
        assert desired.state.pods[cgroup["both-0"]].pod_class is PodClass.ONLINE
        assert desired.state.gpus == {0: GpuConfig(0, GpuPolicy.BURST_SHARE)}
        assert kube.problems() == {
            cgroup["bad-0"]: "pod ml/bad-0: annotation qpolicy.io/share: invalid share '150': "
            "must be an integer percent from 1 to 100"
        }
        assert desired.names()[cgroup["b-0"]] == ("ml", "b-0")

        # A bad value on a managed pod keeps its last good settings, and says so once.
        api.modify_pod(with_annotations(first, share="abc"))
        until(lambda: bool(events(api, "a-0", REFUSED)), desired.refresh, "the bad edit's Event")
        assert desired.state.pods[cgroup["a-0"]].share == 60
        (kept,) = events(api, "a-0", REFUSED)
        assert "keeping the last good settings" in kept["message"] and "'abc'" in kept["message"]
        for _ in range(20):
            desired.refresh()
            time.sleep(0.02)
        api.modify_pod(with_annotations(both, share="11"))  # news, so that all is looked at again
        until(lambda: desired.state.pods[cgroup["both-0"]].share == 11, desired.refresh, "news")
        time.sleep(0.5)
        for name, reason in (
            ("b-0", REFUSED),
            ("bad-0", REFUSED),
            ("both-0", CONFLICT),
            ("a-0", REFUSED),
        ):
            assert len(events(api, name, reason)) == 1, (name, reason)
    finally:
        kube.close()


def test_the_policy_comes_from_the_key_the_node_label_names_and_a_bad_value_keeps_the_last(
    api: FakeApiServer, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.nodes[NODE] = node_json(NODE, {"qpolicy.io/config": "inference"})
    data = {
        "default": 'gpus:\n  "0": {policy: burst-share}\n',
        "inference": 'gpus:\n  "0": {policy: fixed-share, period_ms: 20}\n',
    }
    api.put_configmap(configmap_json("qpolicy-policy", "qpolicy-system", data))
    api.put_configmap(configmap_json("other", "qpolicy-system", {"default": "gpus: {}"}))
    kube = source(api, cgroups, policy_configmap=("qpolicy-system", "qpolicy-policy")).start()
    try:
        fixed = {0: GpuConfig(0, GpuPolicy.FIXED_SHARE, 20)}
        until(lambda: kube.gpus() == fixed, kube.refresh, "the inference policy")
        until(lambda: bool(api.lists("/configmaps")), kube.refresh, "the ConfigMap list")
        configmaps = api.lists("/configmaps")[0]
        assert configmaps["fieldSelector"] == ["metadata.name=qpolicy-policy"]
        with caplog.at_level(logging.WARNING, logger="qpolicy.kube.source"):
            bad = {**data, "inference": 'gpus:\n  "0": {policy: sometimes}\n'}
            api.put_configmap(configmap_json("qpolicy-policy", "qpolicy-system", bad))
            until(lambda: "sometimes" in caplog.text, kube.refresh, "the bad value's log line")
        assert kube.gpus() == fixed
        assert "keeping the last good policy" in caplog.text
        edited = {**data, "inference": 'gpus:\n  "0": {policy: bs}\n  "1": {policy: fs}\n'}
        api.put_configmap(configmap_json("qpolicy-policy", "qpolicy-system", edited))
        until(
            lambda: (
                kube.gpus()
                == {0: GpuConfig(0, GpuPolicy.BURST_SHARE), 1: GpuConfig(1, GpuPolicy.FIXED_SHARE)}
            ),
            kube.refresh,
            "the edit",
        )
        # The label goes: the node falls back to `default` (read again with each renewal).
        api.nodes[NODE] = node_json(NODE, {})
        until(
            lambda: kube.gpus() == {0: GpuConfig(0, GpuPolicy.BURST_SHARE)},
            kube.refresh,
            "the default key",
        )
        assert kube.up
    finally:
        kube.close()


def test_the_policy_is_kept_while_the_api_server_is_down_and_a_deleted_configmap_is_best_effort(
    api: FakeApiServer, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.nodes[NODE] = node_json(NODE, {})
    data = {"default": 'gpus:\n  "0": {policy: fixed-share, period_ms: 20}\n'}
    api.put_configmap(configmap_json("qpolicy-policy", "qpolicy-system", data))
    kube = source(api, cgroups, policy_configmap=("qpolicy-system", "qpolicy-policy")).start()
    fixed = {0: GpuConfig(0, GpuPolicy.FIXED_SHARE, 20)}
    try:
        until(lambda: kube.gpus() == fixed and kube.up, kube.refresh, "the policy")
        with caplog.at_level(logging.WARNING, logger="qpolicy.kube.source"):
            api.down = True
            api.drop()
            until(lambda: not kube.up, kube.refresh, "up to fall")
            # Retried with back-off while down (0.05 to 0.3 s here): each reason is logged once
            # (the cut watch, then the refused connection), the policy kept.
            time.sleep(1.5)
            kube.refresh()
        assert kube.gpus() == fixed
        lines = [r.getMessage() for r in caplog.records if "policy ConfigMap" in r.getMessage()]
        assert 1 <= len(lines) <= 2 and len(set(lines)) == len(lines), lines
        assert all(line.endswith("keeping the last policy") for line in lines)
        api.down = False
        until(lambda: kube.up, kube.refresh, "up to come back")
        edited = {"default": 'gpus:\n  "0": {policy: burst-share}\n'}
        api.put_configmap(configmap_json("qpolicy-policy", "qpolicy-system", edited))
        until(
            lambda: kube.gpus() == {0: GpuConfig(0, GpuPolicy.BURST_SHARE)},
            kube.refresh,
            "the edit after the outage",
        )
        # Deleted: the GPUs it configured run best-effort (the state file may still say more).
        api.delete_configmap("qpolicy-system", "qpolicy-policy")
        until(lambda: kube.gpus() == {}, kube.refresh, "the deletion")
        assert kube.up
    finally:
        kube.close()


def test_a_pod_on_two_gpus_is_governed_on_the_lowest_and_the_log_says_so(
    api: FakeApiServer, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pod = pod_json(
        "big-0",
        annotations={"qpolicy.io/share": "50"},
        env={"NVIDIA_VISIBLE_DEVICES": f"{UUID1},{UUID0}"},
    )
    api.add_pod(pod)
    cgroup = make_cgroup(cgroups, pod)
    kube = source(api, cgroups).start()
    try:
        with caplog.at_level(logging.WARNING, logger="qpolicy.kube.source"):
            until(lambda: cgroup in specs(kube), kube.refresh, "the pod")
        assert specs(kube)[cgroup].gpu == 0
        assert "pod ml/big-0 holds GPUs 0, 1 (NVIDIA_VISIBLE_DEVICES): governed on GPU 0 only" in (
            caplog.text
        )
    finally:
        kube.close()


# ------------------------------------------------------------------ the daemon, end to end


def test_qpolicy_daemon_kubernetes_shows_the_pod_in_status(
    api: FakeApiServer, tmp_path: Path
) -> None:
    cgroups = tmp_path / "cgroup"
    cgroups.mkdir()
    api.nodes[NODE] = node_json(NODE, {})
    api.put_configmap(
        configmap_json(
            "qpolicy-policy", "qpolicy-system", {"default": 'gpus:\n  "0": {policy: fixed-share}\n'}
        )
    )
    pod = pod_json(
        "infer-0",
        annotations={"qpolicy.io/class": "online", "qpolicy.io/share": "25"},
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    api.add_pod(pod)
    cgroup = make_cgroup(cgroups, pod)
    state = tmp_path / "state"
    state.mkdir()
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(state), "NODE_NAME": NODE}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [
            str(script),
            "daemon",
            "--kubernetes",
            "--kubeconfig",
            str(kubeconfig(tmp_path / "kubeconfig", api.url)),
            "--enforcer",
            "none",
            "--probe",
            "off",
            "--no-metrics",
            "--cgroup-root",
            str(cgroups),
            "--pod-resources",
            str(tmp_path / "no-kubelet.sock"),
            "--policy-configmap",
            "qpolicy-system/qpolicy-policy",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = subprocess.run(
                [str(script), "status", "--json"], env=env, capture_output=True, text=True
            )
            assert shown.returncode == 0, shown.stderr
            status = json.loads(shown.stdout)
            pods = (status.get("daemon") or {}).get("pods") or []
            if pods:
                break
            time.sleep(0.2)
        daemon = status["daemon"]
        assert daemon["enforcer"] == "none"
        assert daemon["sources"]["kubernetes"] is True
        (shown_pod,) = daemon["pods"]
        assert shown_pod["id"] == cgroup
        assert (shown_pod["namespace"], shown_pod["name"]) == ("ml", "infer-0")
        assert (shown_pod["class"], shown_pod["share"], shown_pod["gpu"]) == ("online", 0.25, "0")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert f"watching the pods of node {NODE}" in err
        assert "policy from ConfigMap qpolicy-system/qpolicy-policy: GPU 0 fixed-share" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_daemon_options_for_kubernetes_are_checked(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("qpolicy")
    env = {**os.environ, "QPOLICY_STATE_DIR": str(tmp_path)}
    env.pop("NODE_NAME", None)
    cases = [
        (["--policy-configmap", "a/b"], "--policy-configmap is for --kubernetes"),
        (["--kubernetes"], "--kubernetes needs this node's name"),
        (
            ["--kubernetes", "--node-name", "n", "--policy-configmap", "nope"],
            "invalid ConfigMap 'nope'",
        ),
        (
            ["--kubernetes", "--node-name", "n", "--kubeconfig", str(tmp_path / "missing")],
            "cannot configure the Kubernetes client from --kubeconfig",
        ),
    ]
    for args, message in cases:
        run = subprocess.run(
            [str(script), "daemon", "--enforcer", "none", "--no-metrics", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode in (1, 2), run.stderr
        assert run.stderr.startswith("qpolicy: error: ") and message in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_api_client_from_a_kubeconfig_reaches_the_double(
    api: FakeApiServer, tmp_path: Path
) -> None:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client(kubeconfig(tmp_path / "kc", api.url)))
    core.list_pod_for_all_namespaces(_preload_content=False)
    assert api.lists("/pods")
