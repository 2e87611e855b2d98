"""``qpolicy doctor``: measure which preemption levers act on this node's GPU."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from qpolicy.cli.output import JsonOption, print_json
from qpolicy.doctor import promise
from qpolicy.doctor.levers import LEVERS
from qpolicy.doctor.report import read_cache, table
from qpolicy.doctor.run import DoctorConfig
from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.state import default_state_dir
from qpolicy.telemetry.gpus import parse_gpu


def _positive(text: str, what: str, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid {what} {text!r}: expected a number") from None
    if not 0 < value <= high:
        raise ValidationError(f"invalid {what} {text!r}: must be more than 0 and at most {high:g}")
    return value


def doctor(
    *,
    gpu: Annotated[
        str, typer.Option("--gpu", metavar="N|UUID", help="The GPU to examine (index or UUID).")
    ] = "0",
    phase_s: Annotated[
        str, typer.Option("--phase-s", metavar="S", help="Seconds each lever is measured.")
    ] = "4",
    hz: Annotated[
        str, typer.Option("--hz", metavar="N", help="Online requests per second.")
    ] = "150",
    trainer_n: Annotated[
        str,
        typer.Option(
            "--trainer-n",
            metavar="N",
            help="Side of the trainer's bf16 matmul: 8192 runs ~2 ms kernels, 2048 a trainer of "
            "short kernels. Below 8192, a CTA lever is measured next to an 8192 trainer too, and "
            "recommended only if it does no worse there than the engine's pair.",
        ),
    ] = "8192",
    levers: Annotated[
        str | None,
        typer.Option(
            "--levers",
            metavar="A,B",
            help="Only these levers, besides the solo and native baselines, which are always "
            "measured (comma-separated; default all): " + ", ".join(lever.name for lever in LEVERS),
            show_default=False,
        ),
    ] = None,
    no_mps: Annotated[
        bool,
        typer.Option(
            "--no-mps",
            help="Leave out the MPS comparison (both workloads as clients of a private MPS "
            "server; needs nvidia-cuda-mps-control).",
        ),
    ] = False,
    no_fecs: Annotated[
        bool,
        typer.Option(
            "--no-fecs",
            help="Do not read the GPU's context-switch log (FECS trace), which the doctor binds "
            "to GR for all users while it runs.",
        ),
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Do not keep the result for the daemon.")
    ] = False,
    show: Annotated[
        bool,
        typer.Option(
            "--show",
            help="Print the GPU's last kept result, as the daemon reads it, and what qpolicy "
            "can promise there; measures nothing.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Measure, on this node's GPU and driver, which preemption levers act.

    Runs its own workloads (a bf16 matmul trainer and an online request stream, PyTorch), tries
    each lever on them (timeslices, CILP and CTA preemption, interleave levels, realtime TSGs,
    per-request PREEMPT and channel disabling) and prints, per lever: RM's answers, the cost per
    call, the online p50 / p90 / p99, the trainer's throughput and context switches. Restores
    everything it set. Last, for comparison, it runs both workloads under an MPS server of its
    own (not a lever qpolicy sets; --no-mps leaves it out). Under the table: what qpolicy can
    promise online work on this GPU, the lever the daemon will run held against each online
    target (against solo, the trainer's throughput, native and MPS), and why a missed one is
    missed. The result is kept in
    $QPOLICY_STATE_DIR/doctor-gpuN.json, where the daemon chooses its online lever from it. Needs
    root, the eBPF probe and PyTorch; takes under two minutes (the MPS comparison included).
    --show prints the kept result again without measuring.
    """
    if show:
        _show(parse_gpu(gpu), as_json)
        return
    known = {lever.name for lever in LEVERS}
    chosen = tuple(known) if levers is None else tuple(x.strip() for x in levers.split(","))
    unknown = sorted(set(chosen) - known)
    if unknown:
        raise ValidationError(
            f"invalid lever(s) {', '.join(map(repr, unknown))}: expected {', '.join(sorted(known))}"
        )
    side = _positive(trainer_n, "trainer matmul side", 32768)
    if side != int(side) or side < 256:
        raise ValidationError(
            f"invalid trainer matmul side {trainer_n!r}: must be a whole number from 256 to 32768"
        )
    config = DoctorConfig(
        gpu=parse_gpu(gpu),
        trainer_n=int(side),
        phase_s=_positive(phase_s, "phase length", 120),
        hz=_positive(hz, "request rate", 2000),
        levers=chosen,
        mps=not no_mps,
        fecs=not no_fecs,
    )
    from qpolicy.doctor.checkup import checkup  # the probe and torch checks only when run

    report = checkup(config, None if no_cache else default_state_dir())
    _print(report, as_json)


def _show(gpu: int, as_json: bool) -> None:
    """The GPU's cached result; a result of before the promise gets it from its own phases and
    the recommendation the daemon reads. Rendered before anything is printed, so that a damaged
    result is one error line."""
    state_dir = default_state_dir()
    report = read_cache(state_dir, gpu)
    if report is None:
        raise QPolicyError(
            f"no doctor result kept for GPU {gpu} in {state_dir}: run `qpolicy doctor --gpu {gpu}`"
        )
    try:
        if "promise" not in report:
            report["promise"] = promise.promise(report["phases"], report["recommendation"])
        text = _text(report)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise QPolicyError(
            f"the doctor result kept for GPU {gpu} in {state_dir} is not readable "
            f"({type(error).__name__}: {error}): run `qpolicy doctor --gpu {gpu}` again"
        ) from None
    _print(report, as_json, text)


def _text(report: dict[str, Any]) -> str:
    return "\n".join(table(report) + promise.lines(report.get("promise"))) + "\n"


def _print(report: dict[str, Any], as_json: bool, text: str | None = None) -> None:
    if as_json:
        print_json(report)
    else:
        sys.stdout.write(_text(report) if text is None else text)
