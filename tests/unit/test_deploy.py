"""The deployment files of tools/deploy and kmod/dkms.conf.

Every Kubernetes object is validated against the Kubernetes OpenAPI schemas (strict: unknown
fields are errors) that the kubernetes-validate package ships, for the oldest Kubernetes we support
and the newest it knows; it reads them from the package, offline. The Prometheus Operator's kinds
(ServiceMonitor, PrometheusRule) are CRDs that it has no schema for: they are checked field by
field here instead, and the alerts' PromQL by promtool (the Debian package prometheus, which
tools/setup-prometheus.sh installs for `make test`) with rule unit tests. Where kubectl is
installed, the kustomizations are rendered with its built-in kustomize and validated the same way.

Beyond the schemas: the RBAC grants exactly what the agent needs, the DaemonSet mounts what the
daemon reads, the ConfigMaps parse, the dashboard ConfigMap is the rendered dashboard, and
dkms.conf builds for the kernels we support.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, all_versions, major_minor

import qpolicy
from qpolicy.cli import app
from qpolicy.state import decode_state
from qpolicy.telemetry.exporter import DEFAULT_METRICS_PORT
from tests.grafana.test_dashboard import exporter_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "tools" / "deploy"
KUBE = DEPLOY / "kubernetes"
OVERLAYS = DEPLOY / "overlays"
DASHBOARD = ROOT / "tools" / "grafana" / "dashboards" / "qpolicy-overview.json"
DKMS_CONF = ROOT / "kmod" / "dkms.conf"
NAMESPACE = "qpolicy-system"
AGENT = "qpolicy-agent"
PROMTOOL = os.environ.get("QPOLICY_TEST_PROMTOOL", "/usr/bin/promtool")

# The oldest Kubernetes the manifests support, and the newest kubernetes-validate has schemas for.
OLDEST = "1.27"
NEWEST = major_minor(kubernetes_validate.latest_version())
VERSIONS = sorted({OLDEST, NEWEST}, key=lambda v: tuple(map(int, v.split("."))))
# Kinds that are custom resources: no OpenAPI schema in Kubernetes, checked structurally below.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def objects() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in load(path)]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in objects()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def validate(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def agent_container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = the("DaemonSet", AGENT)["spec"]["template"]["spec"][
        "containers"
    ]
    assert len(containers) == 1
    return containers[0]


# ------------------------------------------------------------------ schemas


def test_the_versions_we_support_have_schemas() -> None:
    # kubernetes-validate falls back to the newest schema not newer than the one asked for; a
    # release that dropped 1.27 would then fail obscurely, so say it here.
    shipped = {major_minor(v) for v in all_versions()}
    assert OLDEST in shipped, f"kubernetes-validate no longer ships Kubernetes {OLDEST} schemas"


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load(KUBE / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == [p.name for p in manifest_files()]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = load(path)
    assert len(docs) == 1, f"{path.name}: one object per file"
    (obj,) = docs
    assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "qpolicy"
    if obj["kind"] in CRD_KINDS:
        # No schema to check against: test_service_monitor and test_prometheus_rule do it.
        with pytest.raises(SchemaNotFoundError):
            validate(obj, version)
        return
    validate(obj, version)
    if obj["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
        assert obj["metadata"]["namespace"] == NAMESPACE, path.name


def test_strict_validation_catches_a_misspelt_field() -> None:
    # The schemas are only worth something if a typo fails them.
    daemonset = copy.deepcopy(the("DaemonSet", AGENT))
    daemonset["spec"]["template"]["spec"]["hostPid"] = daemonset["spec"]["template"]["spec"].pop(
        "hostPID"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset, OLDEST)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomizations are not rendered")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


@pytest.mark.parametrize(
    "directory",
    [KUBE, *sorted(p for p in OVERLAYS.iterdir() if p.is_dir())],
    ids=lambda p: p.name,
)
def test_kustomization_renders_valid_kubernetes(directory: Path) -> None:
    rendered = kustomize(directory)
    kinds = {o["kind"] for o in rendered}
    assert {"DaemonSet", "ClusterRole", "Role", "ConfigMap", "Service"} <= kinds
    if directory.name == "without-prometheus-operator":
        assert not kinds & CRD_KINDS
    for obj in rendered:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in VERSIONS:
            validate(obj, version)
        images = [
            c["image"]
            for key in ("containers", "initContainers")
            for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get(key, [])
        ]
        assert all(image == f"qpolicy:{qpolicy.__version__}" for image in images), images


# ------------------------------------------------------------------ RBAC


def rbac_grants() -> set[tuple[str, str, str, str]]:
    """(scope, API group, resource, verb) for every rule of every Role and ClusterRole."""
    grants = set()
    for obj in objects():
        if obj["kind"] not in {"Role", "ClusterRole"}:
            continue
        scope = obj["metadata"].get("namespace", "cluster")
        assert "aggregationRule" not in obj
        for rule in obj["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, URLs
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.add((scope, group, resource, verb))
    return grants


def test_rbac_grants_exactly_what_the_agent_needs() -> None:
    # Widening this is a decision: each grant is explained in clusterrole.yaml and role.yaml.
    read = ("get", "list", "watch")
    expected = {
        *{("cluster", "", "pods", verb) for verb in read},
        ("cluster", "", "nodes", "get"),
        ("cluster", "", "events", "create"),
        ("cluster", "events.k8s.io", "events", "create"),
        *{(NAMESPACE, "", "configmaps", verb) for verb in read},
    }
    grants = rbac_grants()
    assert not {g for g in grants if "*" in g}, "no wildcards"
    assert not {g for g in grants if g[2] in {"secrets", "pods/exec", "nodes/proxy"}}
    assert grants == expected


def test_rbac_binds_the_agent_service_account() -> None:
    account = the("ServiceAccount")
    for binding_kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = the(binding_kind)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": the(role_kind)["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}
        ]
    assert account["metadata"] == {**account["metadata"], "name": AGENT, "namespace": NAMESPACE}
    spec = the("DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == AGENT


# ------------------------------------------------------------------ DaemonSet


def host_mounts() -> dict[str, tuple[str, bool]]:
    """Container mount path -> (host path, read-only) for the agent's hostPath volumes."""
    spec = the("DaemonSet", AGENT)["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {
        m["mountPath"]: (volumes[m["name"]], m.get("readOnly", False))
        for m in agent_container()["volumeMounts"]
        if m["name"] in volumes
    }


def test_daemonset_mounts_what_the_daemon_reads() -> None:
    mounts = host_mounts()
    for path in (
        "/sys/fs/cgroup",  # pods' cgroups (cgroup v2)
        "/var/lib/kubelet/pod-resources",  # kubelet.sock: which GPUs each container holds
        "/dev",  # /dev/nvidia*, also those created after the container started
        "/var/lib/qpolicy",  # the lock and rm-record.json survive the container
        "/sys/kernel/debug",
        "/sys/kernel/tracing",
    ):
        assert mounts.get(path) == (path, False), path
    for path in ("/lib/modules", "/usr/src"):  # kernel headers for bcc: read only
        assert mounts.get(path) == (path, True), path


def test_daemonset_runs_privileged_on_gpu_nodes() -> None:
    spec = the("DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    container = agent_container()
    assert container["securityContext"]["privileged"] is True
    assert {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    } in container["env"]
    requests = container["resources"]["requests"]
    assert requests == {"cpu": "50m", "memory": "128Mi"}
    assert "cpu" not in container["resources"].get("limits", {}), "CPU throttling delays hand-overs"
    assert container["image"] == f"qpolicy:{qpolicy.__version__}"


def test_daemonset_command_and_metrics_port_agree() -> None:
    container = agent_container()
    assert container["command"] == [
        "qpolicy",
        "daemon",
        "--kubernetes",
        "--enforcer",
        "auto",
        "--metrics-addr",
        f":{DEFAULT_METRICS_PORT}",
        "--policy-configmap",
        f"{NAMESPACE}/qpolicy-policy",
    ]
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    (service_port,) = the("Service", AGENT)["spec"]["ports"]
    assert service_port["name"] == "metrics"
    assert service_port["port"] == DEFAULT_METRICS_PORT
    assert the("Service", AGENT)["spec"]["clusterIP"] == "None"


def test_daemonset_command_uses_only_daemon_options() -> None:
    daemon = typer.main.get_command(app).commands["daemon"]  # type: ignore[attr-defined]
    known = {opt for param in daemon.params for opt in param.opts}
    used = {arg for arg in agent_container()["command"] if arg.startswith("--")}
    assert used <= known, sorted(used - known)


# ------------------------------------------------------------------ ConfigMaps

# A ConfigMap key, which must also be a node label value (qpolicy.io/config picks it).
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def test_policy_configmap_parses_with_the_daemons_parsers() -> None:
    data = the("ConfigMap", "qpolicy-policy")["data"]
    assert "default" in data
    for key, text in data.items():
        assert LABEL_VALUE.match(key), f"{key!r} cannot be a value of the qpolicy.io/config label"
        value = yaml.safe_load(text)
        assert set(value) == {"gpus"}, key
        # The gpus part of a state file: the same keys, checked by the same code.
        document = {"schema": 1, "gpus": value["gpus"], "pods": {}}
        state = decode_state(json.dumps(document).encode(), f"qpolicy-policy[{key}]")
        assert state.gpus, key


def test_dashboard_configmap_is_rendered_from_the_dashboard() -> None:
    renderer = load_renderer()
    committed = (KUBE / "grafana-dashboard-configmap.yaml").read_text()
    assert committed == renderer.render(DASHBOARD.read_text()), (
        "tools/deploy/kubernetes/grafana-dashboard-configmap.yaml is out of date: run "
        "tools/deploy/render-dashboard-configmap.py"
    )
    configmap = the("ConfigMap", "qpolicy-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    # kubectl apply (client side) keeps the whole object in an annotation, limited to 256 KiB.
    assert len(committed.encode()) < 256 * 1024


def test_dashboard_renderer_check_mode() -> None:
    script = DEPLOY / "render-dashboard-configmap.py"
    run = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_dashboard_renderer_keeps_the_json_byte_for_byte() -> None:
    renderer = load_renderer()
    for text in ('{\n  "a": "x: y # z"\n}\n', '{\n\n  "b": [1]\n}', "{}\n"):
        (doc,) = yaml.safe_load_all(renderer.render(text))
        assert doc["data"] == {DASHBOARD.name: text}


def load_renderer() -> ModuleType:
    path = DEPLOY / "render-dashboard-configmap.py"
    spec = importlib.util.spec_from_file_location("render_dashboard_configmap", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ Prometheus Operator objects


def test_service_monitor() -> None:
    monitor = the("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    service = the("Service", AGENT)
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
    # qpolicy's `pod` label must not become `exported_pod` under the operator's own `pod`.
    assert endpoint["honorLabels"] is True
    for relabeling in endpoint.get("relabelings", []):
        assert set(relabeling) <= {
            "sourceLabels",
            "separator",
            "targetLabel",
            "regex",
            "modulus",
            "replacement",
            "action",
        }


def alert_rules() -> list[dict[str, Any]]:
    rule = the("PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_prometheus_rule() -> None:
    rule = the("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        assert group["name"] and group["rules"]
    rules = alert_rules()
    assert [r["alert"] for r in rules] == [
        "QpolicyPodBelowShare",
        "QpolicyPodRefused",
        "QpolicyAgentDown",
    ]
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert isinstance(r["expr"], str) and r["expr"].strip()
        assert re.fullmatch(r"\d+[smh]", r["for"])
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
        assert {"summary", "description"} <= set(r["annotations"])


def test_alerts_name_only_exported_metrics() -> None:
    exported = exporter_names()
    for r in alert_rules():
        for name in re.findall(r"(?<![\w:])qpolicy_\w+", r["expr"]):
            assert name in exported, f"{r['alert']}: {name} is not exported"
    job = the("Service", AGENT)["metadata"]["name"]  # the operator's job label: the Service's name
    (down,) = [r for r in alert_rules() if r["alert"] == "QpolicyAgentDown"]
    assert f'job="{job}"' in down["expr"]


def promtool() -> str:
    if not os.access(PROMTOOL, os.X_OK):
        pytest.skip(f"{PROMTOOL} missing (tools/setup-prometheus.sh installs it, as root)")
    return PROMTOOL


LABELS = 'instance="gpu-node-1", gpu="0", pod="/kubepods.slice/train", class="offline"'
ALERT_LABELS = {"instance": "gpu-node-1", "gpu": "0", "pod": "/kubepods.slice/train"}
UP = 'up{job="qpolicy-agent", namespace="qpolicy-system", instance="gpu-node-1"}'


def alert(name: str, at: str, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": expected}


def below_share_case(achieved_per_min: int, planned: float) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": f"qpolicy_gpu_time_seconds_total{{{LABELS}}}",
                "values": f"0+{achieved_per_min}x60",
            },
            {"series": f"qpolicy_share_planned_ratio{{{LABELS}}}", "values": f"{planned}x60"},
        ],
    }


def rule_tests() -> list[dict[str, Any]]:
    below = {
        **below_share_case(12, 0.5),  # ran 20 % of the GPU, planned 50 %
        "alert_rule_test": [
            # 15 minutes of `for` after the first evaluation that is below.
            alert("QpolicyPodBelowShare", "10m", []),
            alert(
                "QpolicyPodBelowShare",
                "30m",
                [
                    {
                        "exp_labels": {
                            **ALERT_LABELS,
                            "class": "offline",
                            "severity": "warning",
                        },
                        "exp_annotations": {
                            "summary": "GPU pod below its planned share",
                            "description": "Pod /kubepods.slice/train (offline) on GPU 0 of "
                            "gpu-node-1 ran 20% of the GPU over the last 10 minutes, less than "
                            "80 % of what qpolicy planned for it.",
                        },
                    }
                ],
            ),
        ],
    }
    on_share = {
        **below_share_case(30, 0.5),  # ran the 50 % planned
        "alert_rule_test": [alert("QpolicyPodBelowShare", "30m", [])],
    }
    tiny = {
        **below_share_case(0, 0.04),  # planned under 5 %: not alerted on
        "alert_rule_test": [alert("QpolicyPodBelowShare", "30m", [])],
    }
    refused_labels = f'{LABELS}, source="annotations", reason="oversubscribed"'
    kube_labels = (
        'instance="gpu-node-1", gpu="0", namespace="ml", pod="infer-0", container="", '
        'class="online", source="kubernetes", reason="no-share"'
    )
    refused = {
        "interval": "1m",
        "input_series": [
            {"series": f"qpolicy_pod_refused{{{refused_labels}}}", "values": "1x20"},
            {"series": f"qpolicy_pod_refused{{{kube_labels}}}", "values": "1x20"},
        ],
        "alert_rule_test": [
            alert("QpolicyPodRefused", "3m", []),
            alert(
                "QpolicyPodRefused",
                "10m",
                [
                    {
                        "exp_labels": {
                            **ALERT_LABELS,
                            "class": "offline",
                            "source": "annotations",
                            "reason": "oversubscribed",
                            "severity": "warning",
                        },
                        "exp_annotations": {
                            "summary": "qpolicy refused a GPU pod",
                            "description": "qpolicy on gpu-node-1 refused pod "
                            "/kubepods.slice/train on GPU 0 (oversubscribed, from "
                            "annotations): `kubectl describe pod` and `qpolicy status` on the "
                            "node say why.",
                        },
                    },
                    {
                        # A Kubernetes pod: named namespace/name, as kubectl names it.
                        "exp_labels": {
                            "instance": "gpu-node-1",
                            "gpu": "0",
                            "namespace": "ml",
                            "pod": "infer-0",
                            "class": "online",
                            "source": "kubernetes",
                            "reason": "no-share",
                            "severity": "warning",
                        },
                        "exp_annotations": {
                            "summary": "qpolicy refused a GPU pod",
                            "description": "qpolicy on gpu-node-1 refused pod ml/infer-0 on GPU "
                            "0 (no-share, from kubernetes): `kubectl describe pod` and "
                            "`qpolicy status` on the node say why.",
                        },
                    },
                ],
            ),
        ],
    }
    down = {
        "interval": "1m",
        "input_series": [{"series": UP, "values": "1x5 0x20"}],
        "alert_rule_test": [
            alert("QpolicyAgentDown", "5m", []),
            alert(
                "QpolicyAgentDown",
                "20m",
                [
                    {
                        "exp_labels": {
                            "job": "qpolicy-agent",
                            "namespace": "qpolicy-system",
                            "instance": "gpu-node-1",
                            "severity": "critical",
                        },
                        "exp_annotations": {
                            "summary": "qpolicy agent down",
                            "description": "The qpolicy agent on gpu-node-1 has not answered "
                            "Prometheus for 10 minutes: its node's GPU pods are not governed.",
                        },
                    }
                ],
            ),
        ],
    }
    absent = {
        "interval": "1m",
        "input_series": [{"series": 'up{job="other"}', "values": "1x20"}],
        "alert_rule_test": [
            alert(
                "QpolicyAgentDown",
                "15m",
                [
                    {
                        "exp_labels": {
                            "job": "qpolicy-agent",
                            "namespace": "qpolicy-system",
                            "severity": "critical",
                        },
                        "exp_annotations": {
                            "summary": "qpolicy agent down",
                            "description": "The qpolicy agent has not answered Prometheus for "
                            "10 minutes: its node's GPU pods are not governed.",
                        },
                    }
                ],
            ),
        ],
    }
    return [below, on_share, tiny, refused, down, absent]


def test_alert_rules_with_promtool(tmp_path: Path) -> None:
    binary = promtool()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(the("PrometheusRule")["spec"]))
    check = subprocess.run([binary, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = tmp_path / "tests.yaml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": rule_tests()}
        )
    )
    run = subprocess.run(
        [binary, "test", "rules", str(tests)], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr


# ------------------------------------------------------------------ kernel module and host


def dkms_conf() -> dict[str, str]:
    """dkms.conf's variables as DKMS sees them: the file is sourced by bash."""
    names = ["PACKAGE_NAME", "PACKAGE_VERSION", "BUILD_EXCLUSIVE_KERNEL", "AUTOINSTALL"]
    script = 'source "$1"; ' + "; ".join(f'printf "%s\\0" "${name}"' for name in names)
    script += '; printf "%s\\0" "${BUILT_MODULE_NAME[0]}" "${BUILT_MODULE_LOCATION[0]}"'
    script += '; printf "%s\\0" "${MAKE[0]}"'
    out = subprocess.run(
        ["bash", "-c", script, "bash", str(DKMS_CONF)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    ).stdout
    values = out.split("\0")[:-1]
    keys = [*names, "BUILT_MODULE_NAME[0]", "BUILT_MODULE_LOCATION[0]", "MAKE[0]"]
    return dict(zip(keys, values, strict=True))


def kernel_matches(release: str, pattern: str) -> bool:
    """Whether DKMS builds for ``release``: it tests BUILD_EXCLUSIVE_KERNEL with bash's =~."""
    run = subprocess.run(["bash", "-c", "[[ $1 =~ $2 ]]", "bash", release, pattern])
    return run.returncode == 0


def test_dkms_conf() -> None:
    conf = dkms_conf()
    assert conf["PACKAGE_NAME"] == "qgpu"
    assert conf["PACKAGE_VERSION"] == qpolicy.__version__
    assert conf["AUTOINSTALL"] == "yes"
    assert conf["BUILT_MODULE_NAME[0]"] == "qgpu"
    location = conf["BUILT_MODULE_LOCATION[0]"]
    assert (DKMS_CONF.parent / location / "Kbuild").is_file()
    assert "obj-m := qgpu.o" in (DKMS_CONF.parent / location / "Kbuild").read_text()
    assert "M=" in conf["MAKE[0]"] and conf["MAKE[0]"].rstrip("/ ").endswith("qgpu modules")


@pytest.mark.parametrize(
    ("release", "built"),
    [
        ("6.1.0-18-amd64", True),  # Debian 12
        ("6.1.0-56-cloud-amd64", True),
        ("6.8.0-45-generic", True),  # Ubuntu 24.04
        ("6.12.9", True),
        ("6.100.1", True),
        ("7.0.0-rc1", True),
        ("10.2.3", True),
        ("6.0.19", False),
        ("5.15.0-91-generic", False),  # Ubuntu 22.04
        ("5.10.0-28-amd64", False),  # Debian 11
        ("4.18.0-513.el8.x86_64", False),
        ("16.1.0", True),
    ],
)
def test_dkms_builds_for_kernels_from_6_1(release: str, built: bool) -> None:
    pattern = dkms_conf()["BUILD_EXCLUSIVE_KERNEL"]
    assert pattern
    assert kernel_matches(release, pattern) is built


def test_dkms_source_tree_holds_what_qgpu_includes() -> None:
    # DKMS copies kmod/ to /usr/src/qgpu-<version>; qgpu's includes must resolve inside it.
    for source in (DKMS_CONF.parent / "qgpu").glob("*.[ch]"):
        for include in re.findall(r'#include "([^"]+)"', source.read_text()):
            target = (source.parent / include).resolve()
            assert target.is_file(), f"{source.name}: {include}"
            assert DKMS_CONF.parent.resolve() in target.parents


def systemd_unit() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (DEPLOY / "systemd" / "qpolicy.service").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def test_systemd_unit() -> None:
    service = systemd_unit()["Service"]
    assert service["ExecStart"] == ["/usr/local/bin/qpolicy daemon --enforcer auto"]
    assert service["Restart"] == ["on-failure"]
    assert service["StateDirectory"] == ["qpolicy"]  # QPOLICY_STATE_DIR's default
    # Hardening that would take the GPU devices, tracefs or the kernel headers away.
    for key in ("PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules", "DevicePolicy"):
        assert key not in service, key
    assert "User" not in service and "DynamicUser" not in service  # root
    capabilities = set(service["CapabilityBoundingSet"][0].split())
    assert {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_NET_ADMIN"} <= capabilities
    assert "AF_NETLINK" in service["RestrictAddressFamilies"][0].split()
    assert systemd_unit()["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_unit_verifies() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    run = subprocess.run(
        [analyze, "verify", str(DEPLOY / "systemd" / "qpolicy.service")],
        capture_output=True,
        text=True,
    )
    # qpolicy itself is not installed here: that is the one complaint allowed.
    complaints = [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if line.strip() and "/usr/local/bin/qpolicy" not in line
    ]
    assert not complaints, complaints


def test_module_loading_files() -> None:
    lines = [
        line
        for line in (DEPLOY / "modules-load.d" / "qgpu.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines == ["qgpu"]
    (install,) = [
        line
        for line in (DEPLOY / "modprobe.d" / "qgpu.conf").read_text().splitlines()
        if line.startswith("install ")
    ]
    assert "--ignore-install qgpu" in install  # else modprobe would run this line again
    assert 'rm_version="$(cat /sys/module/nvidia/version)"' in install


def test_dockerfile() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    instructions = [line.split()[0] for line in lines if line and not line[0].isspace()]
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM debian:bookworm-slim"]
    assert "python3-bpfcc" in "\n".join(lines)
    assert 'ENTRYPOINT ["qpolicy"]' in lines
    assert "ENTRYPOINT" in instructions
    # The files the image copies get past the .dockerignore of its build context.
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "README.md", "qpolicy/"):
        assert f"!{needed}" in ignore


def test_yaml_has_no_tabs_or_trailing_spaces() -> None:
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert "\t" not in line, f"{path.relative_to(ROOT)}:{number}"
            if path.name != "grafana-dashboard-configmap.yaml":
                assert line == line.rstrip(), f"{path.relative_to(ROOT)}:{number}"


# ------------------------------------------------------------------ examples

POD_MPS = DEPLOY / "examples" / "offline-pod-own-mps.yaml"

# Stand-ins for the pod's commands, each logging what it was run with. The control daemon
# insists that the pipe directory exists; torchrun, that the server was started before it.
FAKE_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then
    [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 7
    [ -z "$FAIL_START" ] || exit 1
    echo "started $CUDA_MPS_PIPE_DIRECTORY" >> "$LOG"
    exit 0
fi
read -r line
echo "$line" >> "$LOG"
"""
FAKE_TORCHRUN = """#!/bin/sh
grep -q "^started $CUDA_MPS_PIPE_DIRECTORY$" "$LOG" || exit 9
echo "torchrun $CUDA_MPS_PIPE_DIRECTORY $*" >> "$LOG"
exit 3
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_the_pod_own_mps_example_is_valid_kubernetes(version: str) -> None:
    (pod,) = load(POD_MPS)
    validate(pod, version)


def test_the_pod_own_mps_example_is_an_offline_gpu_pod() -> None:
    explained = subprocess.run(
        [sys.executable, "-m", "qpolicy", "kube", "explain", str(POD_MPS), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(explained.stdout)
    assert report["gpu_pod"] and not report["errors"] and not report["refused"]
    assert report["class"]["value"] == "offline" and report["share"]["value"] == 50


def run_pod_script(tmp_path: Path, **extra: str) -> tuple[int, list[str]]:
    """The example's container command, run with stand-ins for the MPS control and torchrun and
    its MPS directories moved under ``tmp_path``."""
    (pod,) = load(POD_MPS)
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    env = {e["name"]: e["value"] for e in container["env"]}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-cuda-mps-control", FAKE_CONTROL), ("torchrun", FAKE_TORCHRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    env.update(
        CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / env["CUDA_MPS_PIPE_DIRECTORY"].lstrip("/")),
        CUDA_MPS_LOG_DIRECTORY=str(tmp_path / env["CUDA_MPS_LOG_DIRECTORY"].lstrip("/")),
        PATH=f"{bin_dir}{os.pathsep}/usr/bin:/bin",
        LOG=str(log),
        **extra,
    )
    done = subprocess.run(["sh", "-c", *container["args"]], env=env, cwd=tmp_path, check=False)
    return done.returncode, log.read_text().splitlines() if log.exists() else []


def test_the_pod_own_mps_example_starts_its_server_first_and_stops_it_after(
    tmp_path: Path,
) -> None:
    status, log = run_pod_script(tmp_path)
    pipe = tmp_path / "tmp" / "nvidia-mps"
    assert log == [f"started {pipe}", f"torchrun {pipe} --nproc-per-node 2 train.py", "quit"]
    assert status == 3  # the workload's own exit status, not the quit's


def test_the_pod_own_mps_example_runs_nothing_without_its_server(tmp_path: Path) -> None:
    status, log = run_pod_script(tmp_path, FAIL_START="1")
    assert status == 1 and log == []
