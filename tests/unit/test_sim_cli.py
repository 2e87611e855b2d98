"""``qpolicy sim`` / ``qpolicy demo`` and the scenario schema they read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from qpolicy.cli import main
from qpolicy.errors import ValidationError
from qpolicy.model import GpuPolicy, PodClass
from qpolicy.sim.scenario import RequestsLoad, SaturateLoad, parse_scenario, parse_scenario_text
from qpolicy.sim.scenarios import builtin
from qpolicy.sim.scenarios import text as scenario_text

ISSUE_EXAMPLE = """
gpu: {policy: burst-share, period_ms: 50}   # period optional
duration_s: 20
pods:
  - name: infer
    class: online                # default offline
    share: 30                    # percent; optional under best-effort
    load: {kind: requests, rate_hz: 50, kernels: 1, kernel_ms: 0.3}
    active: [[0, 20]]
  - name: train
    share: 70
    load: {kind: saturate, kernel_ms: 2, sync_every: 8}
"""


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_issue_example_parses_with_defaults() -> None:
    scenario = parse_scenario_text(ISSUE_EXAMPLE, "example.yaml")
    assert scenario.gpu.policy is GpuPolicy.BURST_SHARE and scenario.gpu.period_ms == 50
    infer, train = scenario.pods
    assert infer.pod_class is PodClass.ONLINE and infer.share == 30
    assert infer.load == RequestsLoad(rate_hz=50, kernel_ms=0.3, kernels=1, poisson=False)
    assert train.pod_class is PodClass.OFFLINE and train.active == ((0.0, 20.0),)
    assert train.load == SaturateLoad(kernel_ms=2, sync_every=8)


def base() -> dict[str, Any]:
    document = yaml.safe_load(ISSUE_EXAMPLE)
    assert isinstance(document, dict)
    return document


def mutate(path: str, value: Any) -> dict[str, Any]:
    document = base()
    node: Any = document
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return document


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("pods.0.share", 150, r"pods\[0\]\.share: invalid share 150"),
        (
            "pods.1.load.kernel_ms",
            "two",
            r"pods\[1\]\.load\.kernel_ms: expected a number, got 'two'",
        ),
        ("pods.1.load.kernel_ms", 0, r"pods\[1\]\.load\.kernel_ms: 0 is out of range"),
        ("pods.1.load.kind", "burst", r"pods\[1\]\.load\.kind: expected saturate or requests"),
        ("pods.0.load.rate_hz", -5, r"rate_hz: -5 is out of range"),
        ("pods.0.load.poisson", "yes", r"poisson: expected true or false, got 'yes'"),
        ("pods.0.class", "batch", r"pods\[0\]\.class: invalid class 'batch'"),
        ("pods.0.active", [[5, 2]], r"active\[0\]: window \[5, 2\] ends before it starts"),
        ("pods.0.active", [[0, 25]], r"active\[0\]: 25 is out of range"),
        ("pods.0.active", [[0, 10], [5, 15]], r"must not overlap"),
        ("pods.1.share", 80, r"shares on GPU 0 \(burst-share\) sum to 110"),
        ("pods.1.share", _DELETE, r"pod\(s\) train have no share"),
        ("pods.1.name", "infer", r"duplicate pod name 'infer'"),
        ("pods.1.sync", 8, r"pods\[1\]: unknown key\(s\) sync"),
        ("gpu.policy", "fair", r"gpu\.policy: invalid policy 'fair'"),
        ("gpu.period_ms", 1, r"gpu\.period_ms: invalid period 1"),
        ("duration_s", 0, r"duration_s: 0 is out of range"),
        ("duration_s", True, r"duration_s: expected a number, got True"),
        ("pods", [], r"pods: expected a list of 1 to 64 pods"),
    ],
)
def test_bad_scenarios_name_the_bad_value_and_where_it_is(
    path: str, value: Any, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_scenario(mutate(path, value), "s.yaml")


def test_not_yaml_and_not_a_mapping() -> None:
    with pytest.raises(ValidationError, match="not valid YAML at line"):
        parse_scenario_text("pods: [\n", "s.yaml")
    with pytest.raises(ValidationError, match="top level: expected a mapping"):
        parse_scenario_text("- 1\n", "s.yaml")


def test_builtin_demo_scenario_is_valid() -> None:
    demo = builtin("demo")
    assert [p.name for p in demo.pods] == ["infer", "train-a", "train-b"]
    assert demo.gpu.policy is GpuPolicy.BURST_SHARE


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    text = ISSUE_EXAMPLE.replace("duration_s: 20", "duration_s: 4").replace("[[0, 20]]", "[[0, 4]]")
    path.write_text(text)
    return path


def test_sim_json_has_the_documented_fields(
    capsys: pytest.CaptureFixture[str], scenario_file: Path
) -> None:
    code, out, err = cli(capsys, "sim", str(scenario_file), "--json", "--window-s", "0.5")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["gpu"]["policy"] == "burst-share" and doc["gpu"]["period_ms"] == 50
    assert 0.9 < doc["gpu"]["utilization"] <= 1.0
    infer, train = doc["pods"]["infer"], doc["pods"]["train"]
    for pod in (infer, train):
        assert {
            "class",
            "share_target",
            "gpu_time_fraction",
            "kernels_done",
            "throughput_per_s",
            "latency_ms",
            "solo_latency_ms",
        } <= set(pod)
    assert infer["class"] == "online" and infer["share_target"] == 30
    assert infer["kernels_done"] == pytest.approx(200, abs=2)
    assert infer["throughput_per_s"] == pytest.approx(50, abs=0.5)
    assert set(infer["latency_ms"]) == {"p50", "p99"} and set(infer["solo_latency_ms"]) == {
        "p50",
        "p99",
    }
    assert infer["latency_ms"]["p99"] >= infer["solo_latency_ms"]["p99"]
    assert train["latency_ms"] is None and train["solo_latency_ms"] is None
    assert len(doc["windows"]) == 8
    first = doc["windows"][0]
    assert first["start_s"] == 0 and first["end_s"] == 0.5
    assert set(first["gpu_time_fraction"]) == {"infer", "train"}
    assert doc["phases"][0]["expected"]["train"] == pytest.approx(0.985)


def test_sim_is_deterministic_for_a_seed_and_varies_across_seeds(
    capsys: pytest.CaptureFixture[str], scenario_file: Path
) -> None:
    runs = [cli(capsys, "sim", str(scenario_file), "--json", "--seed", s)[1] for s in "112"]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_sim_native_runs_without_controls(
    capsys: pytest.CaptureFixture[str], scenario_file: Path
) -> None:
    code, out, _ = cli(capsys, "sim", str(scenario_file), "--json", "--native")
    doc = json.loads(out)
    assert code == 0 and doc["enforcer"] == "native" and doc["gpu"]["channel_controls"] == 0


def test_sim_table_and_plot(
    capsys: pytest.CaptureFixture[str], scenario_file: Path, tmp_path: Path
) -> None:
    chart = tmp_path / "chart.png"
    code, out, _ = cli(capsys, "sim", str(scenario_file), "--plot", str(chart))
    assert code == 0
    assert "infer" in out and "expected" in out and f"chart written to {chart}" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--window-s", "0"], "invalid window '0'"),
        (["--window-s", "abc"], "invalid window 'abc'"),
        (["--window-s", "99"], "invalid window '99'"),
        (["--seed", "-3"], "invalid seed '-3'"),
        (["--plot", "chart.jpg"], "invalid plot file 'chart.jpg'"),
        (["--plot", "/nonexistent/dir/c.png"], "invalid plot file '/nonexistent/dir/c.png'"),
    ],
)
def test_sim_bad_options_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], scenario_file: Path, args: list[str], needle: str
) -> None:
    code, out, err = cli(capsys, "sim", str(scenario_file), *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_sim_bad_or_missing_scenario_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = cli(capsys, "sim", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read scenario" in err and err.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(ISSUE_EXAMPLE.replace("share: 70", "share: 700"))
    code, _, err = cli(capsys, "sim", str(bad))
    assert code == 2 and "pods[1].share: invalid share 700" in err and err.count("\n") == 1


def test_demo_shows_the_policy_working_and_writes_a_chart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    chart = tmp_path / "demo.png"
    code, out, _ = cli(capsys, "demo", "--json", "--plot", str(chart))
    assert code == 0
    doc = json.loads(out)
    gated, native = doc["qpolicy"], doc["native"]
    late = gated["phases"][-1]
    assert late["start_s"] == 8 and set(late["active"]) == {"infer", "train-a", "train-b"}
    for pod in ("train-a", "train-b"):
        assert late["achieved"][pod] == pytest.approx(late["expected"][pod], abs=0.03)
    # The demo shows the gap to native time-slicing; the 1.5 x target itself is checked on the
    # online-offline scenario (test_sim_targets), one trainer where the demo has two.
    infer = gated["pods"]["infer"]
    assert infer["latency_ms"]["p99"] <= 1.6 * infer["solo_latency_ms"]["p99"]
    assert native["pods"]["infer"]["latency_ms"]["p99"] > 3 * infer["solo_latency_ms"]["p99"]
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_demo_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = cli(capsys, "demo", "--plot", str(tmp_path / "d.png"))
    assert code == 0
    for needle in ("share of GPU time, by phase", "qpolicy", "native", "train-b", "p99 / solo"):
        assert needle in out


def test_daemon_refuses_an_unknown_log_level(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPOLICY_STATE_DIR", str(tmp_path))
    code, _, err = cli(capsys, "daemon", "--log-level", "loud", "--no-metrics")
    assert code == 2
    assert err.strip() == (
        "qpolicy: error: invalid log level 'loud': expected one of debug, info, warning"
    )
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    ("spelling", "policy"), [("burst", "burst-share"), ("fixed", "fixed-share")]
)
def test_scenarios_take_the_policy_aliases_too(spelling: str, policy: str) -> None:
    text = scenario_text("demo").replace("policy: burst-share", f"policy: {spelling}")
    assert f"policy: {spelling}" in text
    assert parse_scenario_text(text, "s.yaml").gpu.policy.value == policy
