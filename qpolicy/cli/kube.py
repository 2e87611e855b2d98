"""``qpolicy kube``: Kubernetes pods as qpolicy sees them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape

from qpolicy.cli.output import JsonOption, console, print_json
from qpolicy.errors import ValidationError
from qpolicy.kube.pods import derive, explain
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec, fit_problem, format_bytes

kube_app = typer.Typer(
    help="Kubernetes pods as qpolicy sees them.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _load(path: str) -> dict[str, Any]:
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise ValidationError(f"cannot read {where}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValidationError(f"cannot read {where}: not UTF-8 text") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ValidationError(
            f"{where}: not YAML or JSON: {' '.join(str(error).split())}"
        ) from None
    pods = [d for d in documents if isinstance(d, dict) and d.get("kind", "Pod") == "Pod"]
    if len(pods) != 1:
        kinds = ", ".join(
            str(d.get("kind")) if isinstance(d, dict) else type(d).__name__ for d in documents
        )
        raise ValidationError(
            f"{where}: expected one Pod manifest, found {len(pods)} Pod(s)"
            + (f" among {kinds}" if kinds else "")
        )
    return pods[0]


def explain_pod(
    path: Annotated[str, typer.Argument(metavar="POD.yaml", help="A Pod manifest; - for stdin.")],
    *,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="POLICY",
            help="Also say whether the pod alone would be admitted on a GPU of this policy.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show what qpolicy derives from a Pod manifest (YAML or JSON), as the daemon would.

    Class, share and memory limit, and which annotation, label or limit each came from; keys that
    disagree; the pod's cgroup under the systemd and cgroupfs drivers; the GPUs its
    NVIDIA_VISIBLE_DEVICES names; and what would be refused and why. A bad value is an error
    (exit 2): the daemon would leave such a pod unmanaged.
    """
    gpu_policy = None if policy is None else GpuPolicy.parse(policy)
    facts = derive(_load(path))
    if facts.errors:
        raise ValidationError(f"pod {facts.key}: {facts.errors[0]}")
    report = explain(facts)
    if gpu_policy is not None and facts.gpu_pod:
        gpu = report["gpus"]["governed_on"] or 0
        share, memory = facts.share.value, facts.memory.value
        spec = PodSpec(
            facts.key,
            gpu,
            facts.pod_class.value
            if isinstance(facts.pod_class.value, PodClass)
            else PodClass.OFFLINE,
            share if isinstance(share, int) else None,
            memory if isinstance(memory, int) else None,
        )
        problem = fit_problem(GpuConfig(gpu, gpu_policy), [spec])
        report["policy"] = gpu_policy.value
        if problem is not None:
            report["refused"].append(f"on a {gpu_policy.value} GPU: {problem[1]}")
    if as_json:
        print_json(report)
        return
    _render(report, facts.share.value, facts.memory.value)


def _render(report: dict[str, Any], share: object, memory: object) -> None:
    def line(label: str, text: str) -> None:
        console.print(f"{label:<9}{text}", soft_wrap=True, highlight=False)

    uid = f" (uid {report['uid']})" if report["uid"] else ""
    console.print(f"pod [b]{escape(report['pod'])}[/b]{escape(uid)}", soft_wrap=True)
    if report["gpu_pod"]:
        line("GPU pod", "yes: " + escape("; ".join(report["gpu_reasons"])))
    else:
        line("GPU pod", "no (no nvidia.com/gpu, qpolicy.io/ annotation or NVIDIA_VISIBLE_DEVICES)")
    cls = report["class"]
    line("class", f"{cls['value']:<12} from {escape(cls['from'])}")
    share_text = "-" if share is None else f"{share} %"
    line("share", f"{share_text:<12} from {escape(report['share']['from'])}")
    memory_text = format_bytes(memory) if isinstance(memory, int) else "-"
    line("memory", f"{memory_text:<12} from {escape(report['memory_bytes']['from'])}")
    for conflict in report["conflicts"]:
        line("conflict", escape(conflict))
    for note in report["notes"]:
        line("note", escape(note))
    line("QoS", f"{report['qos']['value']:<12} ({report['qos']['from']})")
    for index, (driver, path) in enumerate(report["cgroups"].items()):
        line("cgroup" if index == 0 else "", f"{driver:<12} {escape(path)}")
    gpus = report["gpus"]
    if gpus["indexes"]:
        text = ", ".join(map(str, gpus["indexes"])) + " (NVIDIA_VISIBLE_DEVICES)"
        if len(gpus["indexes"]) > 1:
            text += f": governed on GPU {gpus['governed_on']} only (a pod spec has one GPU)"
        line("GPUs", text)
    elif gpus["requested"]:
        line("GPUs", "given by the kubelet when the pod starts (pod-resources)")
    for problem in gpus["unresolved"]:
        line("", escape(problem))
    if report["refused"]:
        for reason in report["refused"]:
            line("refused", escape(reason))
    elif "policy" in report:
        line("admitted", f"alone on a {report['policy']} GPU: yes")


kube_app.command("explain")(explain_pod)
