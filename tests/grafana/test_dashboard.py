"""The Grafana dashboard (tools/grafana/dashboards/): its structure, and every query it makes
evaluated by a real Prometheus scraping the daemon's exporter fed by the simulated node.

Grafana itself is not run: what can break between the JSON and an operator's screen is a query that
does not parse, names a metric or label the exporter does not have, or selects nothing once the
template variables are expanded. Those are checked against Prometheus' HTTP API, with variables
expanded the way Grafana expands them.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from qpolicy.sim.node import SimulatedNode
from qpolicy.sim.scenarios import builtin
from qpolicy.telemetry.exporter import SOURCES, NodeCollector
from qpolicy.telemetry.view import RefusedPod

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "tools" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "qpolicy-overview.json"
# Where the Debian package puts it; elsewhere, point QPOLICY_TEST_PROMETHEUS at a binary.
PROMETHEUS = os.environ.get("QPOLICY_TEST_PROMETHEUS", "/usr/bin/prometheus")
DATASOURCE = "${datasource}"

# Grafana's built-in interval variables, as they come out for a 1 s scrape interval and a short
# time range: $__rate_interval is max(4 x scrape interval, $__interval + scrape interval), which
# the 10 s here comfortably covers.
BUILTINS = {
    "__rate_interval": "10s",
    "__interval": "5s",
    "__interval_ms": "5000",
    "__range": "30s",
    "__range_s": "30",
    "__range_ms": "30000",
}
# $var, ${var}, ${var:format}, [[var]]: the reference forms Grafana expands.
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]")
# PromQL string literals, so metric names are not looked for inside label values.
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
IDENTIFIER = re.compile(r"(?<![\w:])qpolicy_\w+")
NAME_REGEX = re.compile(r'__name__\s*=~\s*"((?:[^"\\]|\\.)*)"')
LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Query:
    where: str
    expr: str
    # For a label_values() variable query: the label; None for a panel target.
    label: str | None = None


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        # A collapsed row keeps its panels inside it.
        yield from panel.get("panels", [])


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard["templating"]["list"])


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    # Grafana 10+ stores a Prometheus variable query as an object; older ones as a string.
    return str(query["query"] if isinstance(query, dict) else query)


def queries(dashboard: dict[str, Any]) -> list[Query]:
    found = []
    for variable in variables(dashboard):
        if variable["type"] == "query":
            text = variable_query(variable)
            match = LABEL_VALUES.match(text)
            assert match, f"variable {variable['name']}: only label_values() is checked: {text}"
            selector, label = match.group(1), match.group(2)
            found.append(Query(f"variable {variable['name']}", (selector or "").strip(), label))
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target['refId']}"
            found.append(Query(where, target["expr"]))
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    def expand(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        # Grafana leaves a reference to no variable as it is: label_replace's "$1" stays.
        if name.isdigit():
            return match.group(0)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(expand, expr)


def regex_value(choices: list[str]) -> str:
    """A multi-value selection as Grafana writes it into a Prometheus ``=~`` matcher: each value
    regex-escaped (backslash doubled for the PromQL string), joined as ``(a|b)``."""
    escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value) for value in choices]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def exporter_names() -> set[str]:
    """Every sample name the exporter writes for the demo scenario, a few seconds in."""
    now = [0.0]
    node = SimulatedNode(builtin("demo"), clock=lambda: now[0])
    now[0] = 10.0  # past train-b's start at 8 s, so every pod has driver activity
    node.advance()
    view = node.view()
    # The daemon adds the state file's source to the simulator's; the other sources exist on
    # real nodes, as do refused pods and a probe's lost events. The dashboard may name any of them.
    view = replace(
        view,
        sources=dict.fromkeys(SOURCES, True),
        refused=(RefusedPod("0", "/x", "offline", "annotations", "oversubscribed", "..."),),
        probe_lost_events=0,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: view))
    text = generate_latest(registry).decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def metric_names(expr: str) -> tuple[set[str], list[str]]:
    """Names used bare in ``expr`` and the regexes of its ``__name__=~`` matchers."""
    regexes = NAME_REGEX.findall(expr)
    return set(IDENTIFIER.findall(STRING.sub('""', expr))), regexes


# ------------------------------------------------------------------ structure (no Prometheus)


def test_dashboard_identity_and_schema() -> None:
    dashboard = load()
    assert dashboard["uid"] == "qpolicy-overview"
    assert dashboard["id"] is None
    assert dashboard["schemaVersion"] >= 39
    # __inputs/__requires are for the import dialog; file provisioning does not resolve them.
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    assert "DS_" not in DASHBOARD.read_text()
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_datasource_is_a_template_variable_used_everywhere() -> None:
    dashboard = load()
    by_name = {variable["name"]: variable for variable in variables(dashboard)}
    source = by_name["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name in ("gpu", "pod"):
        variable = by_name[name]
        assert variable["type"] == "query"
        assert variable["multi"] and variable["includeAll"], name
        assert variable_query(variable).startswith("label_values(")
    for variable in variables(dashboard):
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": DATASOURCE}
    with_targets = [panel for panel in panels(dashboard) if panel.get("targets")]
    assert len(with_targets) >= 12
    for panel in with_targets:
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, panel["title"]
        assert panel.get("description"), f"panel {panel['title']!r} needs a description"
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, panel["title"]


# Series per node (no GPU), per GPU (no pod), and about pods that do not run (so no pod variable
# can offer them).
NODE_METRICS = {"qpolicy_probe_lost_events_total"}
GPU_METRICS = {"qpolicy_gpu_info", "qpolicy_gpu_period_seconds", "qpolicy_gpu_busy_ratio"}
NOT_RUNNING = {"qpolicy_pod_refused"}


def test_every_pod_query_follows_the_template_variables() -> None:
    for query in queries(load()):
        if query.label is not None:
            continue
        names, regexes = metric_names(query.expr)
        if regexes:  # the _up gauges: per node, not per pod
            assert '$instance"' in query.expr, query.where
            continue
        matchers = ("instance",) if names <= NODE_METRICS else ("instance", "gpu")
        for matcher in matchers:
            assert f'{matcher}=~"${matcher}"' in query.expr, (query.where, matcher)
        pod_metrics = names - GPU_METRICS - NODE_METRICS
        if pod_metrics:
            assert 'class=~"$class"' in query.expr, query.where
        if pod_metrics - NOT_RUNNING:
            assert 'pod=~"$pod"' in query.expr, query.where


def test_rates_use_the_rate_interval() -> None:
    for query in queries(load()):
        for window in re.findall(r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", query.expr):
            assert window in ("$__rate_interval", "$__range"), (query.where, window)


def test_every_metric_the_dashboard_names_is_exported() -> None:
    exported = exporter_names()
    used: set[str] = set()
    for query in queries(load()):
        names, regexes = metric_names(query.expr)
        missing = names - exported
        assert not missing, f"{query.where}: not exported: {sorted(missing)}"
        used |= names
        for regex in regexes:
            matched = {name for name in exported if re.fullmatch(regex, name)}
            assert matched, f"{query.where}: __name__=~{regex!r} matches no exported metric"
            used |= matched
    # The dashboard shows every family the exporter has (histograms through their buckets).
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    shown = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert families - shown == set(), f"exported but not on the dashboard: {families - shown}"


def test_variable_expansion_matches_grafana() -> None:
    values = {**BUILTINS, "pod": regex_value(["train-a", "/kubepods/a.b"])}
    assert substitute('x{pod=~"$pod"}[$__rate_interval]', values) == (
        r'x{pod=~"(train-a|/kubepods/a\\.b)"}[10s]'
    )
    assert substitute("${__range_s} [[__interval]]", values) == "30 5s"
    assert substitute('label_replace(x, "a", "$1", "b", "(.*)")', values).count("$1") == 1


def test_provisioning_files_point_at_the_dashboard() -> None:
    import yaml

    dashboards = yaml.safe_load((GRAFANA / "provisioning/dashboards/qpolicy.yaml").read_text())
    (provider,) = dashboards["providers"]
    assert dashboards["apiVersion"] == 1 and provider["type"] == "file"
    assert provider["options"]["path"]
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    assert sources["apiVersion"] == 1
    assert {source["type"] for source in sources["datasources"]} == {"prometheus"}


# ------------------------------------------------------------------ a real Prometheus


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, params: dict[str, str] | list[tuple[str, str]]) -> Any:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}?{query}", timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        # Prometheus answers a bad query with 400 and a JSON body that says why; while it starts
        # it answers 503 with a line of text (CI's run at c7a6a39 read that as JSON and erred).
        body = error.read()
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {error.code}: {body[:200]!r}"}


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float, process: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited with {process.returncode}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{what}: not ready after {timeout_s} s")


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def exporter(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """``qpolicy daemon --enforcer sim --scenario demo`` on a free port; its address."""
    addr = f"127.0.0.1:{free_port()}"
    log = tmp_path / "daemon.log"
    env = {**os.environ, "QPOLICY_STATE_DIR": str(tmp_path / "state")}
    # A hand-edited state file whose pods do not fit together: the daemon refuses the second one,
    # whatever backend runs, so the refused-pods panel has a row to show.
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "gpus": {"0": {"policy": "fixed-share"}},
                "pods": {
                    "/kubepods/first": {"gpu": 0, "share": 60},
                    "/kubepods/second": {"gpu": 0, "share": 60},
                },
            }
        )
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "qpolicy", "daemon"),
                *("--enforcer", "sim", "--scenario", "demo", "--speed", "1"),
                *("--metrics-addr", addr),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    request.addfinalizer(lambda: stop(process))

    def answers() -> bool:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=2) as response:
            return b"qpolicy_gpu_info" in response.read()

    try:
        wait_for("qpolicy daemon", answers, 20, process)
    except BaseException:
        print(tail(log))
        raise
    return addr


# The labels the Prometheus Operator gives an agent's target (tools/deploy/kubernetes).
AGENT_TARGET = {"namespace": "qpolicy-system", "pod": "qpolicy-agent-x7k2p", "container": "agent"}


@pytest.fixture
def prometheus_binary() -> str:
    if not Path(PROMETHEUS).exists():
        # As root `make test` installs it (tools/setup-prometheus.sh), so missing is an error.
        if os.geteuid() != 0:
            pytest.skip(
                f"{PROMETHEUS} missing and not root to install it: run tools/setup-prometheus.sh"
                " as root, or set QPOLICY_TEST_PROMETHEUS"
            )
        pytest.fail(f"{PROMETHEUS} missing: run tools/setup-prometheus.sh (make test does)")
    return PROMETHEUS


@pytest.fixture
def prometheus(
    prometheus_binary: str, tmp_path: Path, exporter: str, request: pytest.FixtureRequest
) -> str:
    """A Prometheus scraping the exporter every second; its base URL."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is YAML, and needs no quoting care
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "qpolicy",
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        # As the ServiceMonitor scrapes it: the target carries the agent's own
                        # namespace, pod and container, and qpolicy's labels are honored.
                        "honor_labels": True,
                        "static_configs": [{"targets": [exporter], "labels": AGENT_TARGET}],
                    }
                ],
            }
        )
    )
    listen = f"127.0.0.1:{free_port()}"
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={listen}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    request.addfinalizer(lambda: stop(process))
    url = f"http://{listen}"

    # Enough scrapes that every rate over $__rate_interval has two samples in its window.
    def scraped() -> bool:
        answer = get_json(
            f"{url}/api/v1/query", {"query": 'count_over_time(up{job="qpolicy"}[1m]) >= 5'}
        )
        return answer.get("status") == "success" and bool(answer["data"]["result"])

    try:
        wait_for("prometheus", scraped, 30, process)
    except BaseException:
        print(tail(log))
        raise
    return url


def evaluate(url: str, query: Query, values: dict[str, str]) -> tuple[dict[str, Any], list[Any]]:
    """The API's answer and the result rows (label values for a label_values() query)."""
    expr = substitute(query.expr, values)
    if query.label is not None:
        params = [("match[]", expr)] if expr else []
        answer = get_json(f"{url}/api/v1/label/{query.label}/values", params)
        return answer, list(answer.get("data") or [])
    answer = get_json(f"{url}/api/v1/query", {"query": expr})
    return answer, list((answer.get("data") or {}).get("result") or [])


def finite(rows: list[Any]) -> bool:
    """Whether any value is a number: a histogram_quantile over a window without observations
    gives NaN, which Grafana shows as no data."""
    for row in rows:
        if isinstance(row, str):
            return True
        value = row.get("value", [0, "NaN"])[1]
        if not math.isnan(float(value)):
            return True
    return False


# What the simulated node cannot produce, and why; these queries must still be valid PromQL.
ONLY_ON_REAL_NODES = {
    "qpolicy_probe_lost_events_total": "the simulated node runs no eBPF probe",
}


def only_on_real_nodes(expr: str) -> bool:
    return bool(metric_names(expr)[0] & set(ONLY_ON_REAL_NODES))


@pytest.mark.prometheus
def test_every_dashboard_query_returns_data_from_a_real_prometheus(prometheus: str) -> None:
    dashboard = load()
    all_queries = queries(dashboard)
    # First pass: every variable at All (allValue ".*"), as a fresh dashboard opens.
    values = {**BUILTINS, **{v["name"]: ".*" for v in variables(dashboard) if v["type"] == "query"}}
    # Second pass: each variable set to every value its own query offers, in dashboard order so
    # each sees the ones before it, expanded the way Grafana writes a multi-value selection.
    chosen = dict(BUILTINS)
    for variable in variables(dashboard):
        if variable["type"] != "query":
            continue
        query = next(q for q in all_queries if q.where == f"variable {variable['name']}")
        answer, rows = evaluate(prometheus, query, {**values, **chosen})
        assert answer["status"] == "success", (query.where, answer)
        assert rows, f"{query.where}: no values"
        chosen[variable["name"]] = regex_value(sorted(rows))
    assert "train-a" in chosen["pod"] and "infer" in chosen["pod"]

    # Gauges answer at once; ioctl latency has observations only in windows around a process
    # start (train-b at 8 s, every pod again when the scenario restarts at 20 s).
    deadline = time.monotonic() + 35
    pending = [(query, "all", values) for query in all_queries] + [
        (query, "chosen", chosen) for query in all_queries
    ]
    failures: dict[str, str] = {}
    while pending:
        still = []
        for query, label, using in pending:
            answer, rows = evaluate(prometheus, query, using)
            key = f"{query.where} [{label}]: {substitute(query.expr, using)}"
            if answer.get("status") != "success":
                failures[key] = f"{answer.get('errorType')}: {answer.get('error')}"
            elif not rows and not only_on_real_nodes(query.expr):
                still.append((query, label, using))
                failures[key] = "empty result"
            elif not finite(rows) and not only_on_real_nodes(query.expr):
                still.append((query, label, using))
                failures[key] = "only NaN"
            else:
                failures.pop(key, None)
        if any("empty" not in why and "NaN" not in why for why in failures.values()):
            break
        if not still or time.monotonic() > deadline:
            break
        pending = still
        time.sleep(1)
    assert not failures, "\n".join(f"{key}\n    -> {why}" for key, why in failures.items())


@pytest.mark.prometheus
def test_pod_labels_survive_the_scrape_as_the_service_monitor_scrapes(prometheus: str) -> None:
    """qpolicy's namespace, pod and container labels win over the target's (honor_labels), and
    the empty ones it writes for pods that are not Kubernetes pods stay empty: Prometheus does not
    fill in the scraped agent's own namespace, pod and container."""
    query = {"query": 'qpolicy_share_target_ratio{job="qpolicy"}'}
    rows = get_json(f"{prometheus}/api/v1/query", query)["data"]["result"]
    assert rows
    for row in rows:
        labels = row["metric"]
        assert labels["pod"] in ("train-a", "train-b", "infer"), labels
        assert "namespace" not in labels and "container" not in labels, labels
    # The target's labels are still on the scrape's own series.
    up = get_json(f"{prometheus}/api/v1/query", {"query": 'up{job="qpolicy"}'})["data"]["result"]
    assert up and up[0]["metric"]["namespace"] == "qpolicy-system"
