"""The README's summary of the online rows, computed from the whole table in docs/online.md.

docs/online.md keeps one line per `make bench-gpu` run of the two online rows (qpolicy, solo,
native and MPS p50 / p99 in ms, the trainer's throughput against native's). The README gives
the operator ranges instead: per trainer, per GPU, and apart for runs whose solo was unstable
(p99 over twice p50: the bench does not divide by such a solo, so neither does a summary that
sets qpolicy beside it). Adding a run to the table and not to the summary, or the reverse, is
what this tool and its test catch.

    python3 tools/gpu/online_summary.py [docs/online.md]

prints the summary table (markdown) as the README must hold it, and the counts and ranges its
sentences under the table quote (how many runs, how many behind native), worded as the README
words them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| Row | qpolicy p50 / p99 (ms) | Solo | Native | MPS | Trainer vs native |"
KERNELS = {8192: "1.4 ms kernels", 2048: "24 µs kernels"}  # tools/gpu/kernel_shapes.py, 12F
DASH = "\N{EN DASH}"  # ranges, as the README writes them
TIMES = "\N{MULTIPLICATION SIGN}"
PAIR = re.compile(r"^(\d+\.\d+) / (\d+\.\d+)(, unstable)?$")


@dataclass
class Run:
    gpu: str
    trainer: int
    qpolicy: tuple[float, float]
    solo: tuple[float, float]
    unstable: bool
    native: tuple[float, float]
    mps: tuple[float, float] | None
    trainer_pct: int


@dataclass
class Group:
    trainer: int
    gpu: str
    unstable: bool
    runs: list[Run] = field(default_factory=list)


def _pairs(cell: str, n: int | None, where: str) -> list[tuple[float, float, bool]]:
    """One cell holds one run's "p50 / p99" or, for a line of several runs, theirs by commas;
    ``n``: how many runs the line holds (None for the cell that says so, qpolicy's)."""
    parts = re.split(r", (?=\d)", cell.strip())
    if n is not None and len(parts) != n:
        raise ValueError(f"{where}: {cell!r} holds {_runs(len(parts))}, the line {n}")
    out = []
    for part in parts:
        m = PAIR.match(part)
        if not m:
            raise ValueError(f"{where}: {part!r} is not 'p50 / p99'")
        out.append((float(m[1]), float(m[2]), bool(m[3])))
    return out


def parse(text: str) -> list[Run]:
    """Every run of the table under HEADER, in its order."""
    lines = text.splitlines()
    try:
        at = lines.index(HEADER)
    except ValueError:
        raise ValueError(f"no table headed {HEADER!r}") from None
    runs: list[Run] = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6:
            raise ValueError(f"{line!r}: {len(cells)} cells, not 6")
        m = re.match(r"(H100|H200), (\d+) trainer", cells[0])
        if not m:
            raise ValueError(f"{cells[0]!r}: not 'GPU, N trainer'")
        qp = _pairs(cells[1], None, cells[0])
        n = len(qp)
        solo = _pairs(cells[2], n, cells[0])
        native = _pairs(cells[3], n, cells[0])
        mps = [None] * n if cells[4] == "-" else _pairs(cells[4], n, cells[0])
        pcts = [int(p) for p in re.findall(r"(\d+) %", cells[5])]
        if len(pcts) != n:
            raise ValueError(f"{cells[0]}: {cells[5]!r} holds {_runs(len(pcts))}, the line {n}")
        for i in range(n):
            m_i = mps[i]
            runs.append(
                Run(
                    gpu=m[1],
                    trainer=int(m[2]),
                    qpolicy=qp[i][:2],
                    solo=solo[i][:2],
                    unstable=solo[i][2],
                    native=native[i][:2],
                    mps=None if m_i is None else m_i[:2],
                    trainer_pct=pcts[i],
                )
            )
    return runs


def groups(runs: Iterable[Run]) -> list[Group]:
    """By trainer (long kernels first), GPU (H200 first), stable solos before unstable ones."""
    by: dict[tuple[int, str, bool], Group] = {}
    for run in runs:
        key = (run.trainer, run.gpu, run.unstable)
        by.setdefault(key, Group(run.trainer, run.gpu, run.unstable)).runs.append(run)
    return [by[k] for k in sorted(by, key=lambda k: (-k[0], k[1] != "H200", k[2]))]


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _span(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}{DASH}{fmt.format(hi)}"


def _pair_span(pairs: Sequence[tuple[float, float]]) -> str:
    return f"{_span([p[0] for p in pairs])} / {_span([p[1] for p in pairs])}"


def table(gs: Sequence[Group]) -> str:
    out = [
        "| next to | GPU, runs | qpolicy | solo | native | MPS | trainer, of native |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in gs:
        runs = g.runs
        who = f"{g.gpu}, {_runs(len(runs))}"
        if g.unstable:
            who += ", solo unstable"
        mps = [r.mps for r in runs if r.mps is not None]
        mps_cell = _pair_span(mps) if mps else "-"
        if mps and len(mps) < len(runs):
            mps_cell += f" ({_runs(len(mps))})"
        pct = _span([float(r.trainer_pct) for r in runs], "{:.0f}")
        out.append(
            f"| {g.trainer} trainer ({KERNELS.get(g.trainer, 'kernels not measured')}) | {who} "
            f"| {_pair_span([r.qpolicy for r in runs])} | {_pair_span([r.solo for r in runs])} "
            f"| {_pair_span([r.native for r in runs])} | {mps_cell} | {pct} % |"
        )
    return "\n".join(out)


_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _count(n: int) -> str:
    return _WORDS[n] if n < len(_WORDS) else str(n)


def _ms(values: Sequence[float]) -> str:
    """Amounts in ms as the README lists them: "0.07, 0.09 and 0.26"."""
    parts = [f"{v:.2f}" for v in sorted(values)]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _ahead(run: Run) -> bool:
    """qpolicy ahead of native, and of MPS where it ran, at p50 and at p99."""
    others = [run.native] if run.mps is None else [run.native, run.mps]
    return all(run.qpolicy[0] < o[0] and run.qpolicy[1] < o[1] for o in others)


def sentences(runs: Sequence[Run]) -> list[str]:
    """The counts and ranges of the README's sentences under the summary that a new run can
    make stale, as the README words them, from the table's values (two decimals: a difference
    the table rounds away is "level")."""
    out = []
    ratios = [r.qpolicy[0] / r.solo[0] for r in runs]
    met = sum(ratio <= 1.2 for ratio in ratios)
    if met:
        out.append(f"p50 ≤ 1.2 {TIMES} solo was met in {_count(met)} of {len(runs)} runs")
    else:
        out.append(
            f"p50 ≤ 1.2 {TIMES} solo was missed in every run above ({_span(ratios)} {TIMES})"
        )
    long = [r for r in runs if r.trainer == 8192]
    if long:
        over = [r.qpolicy[0] - r.solo[0] for r in long]
        gpus = "both GPUs" if {r.gpu for r in long} == {"H100", "H200"} else f"{long[0].gpu}s"
        out.append(f"({_span(over)} ms in every 8192 run on {gpus})")
        behind = sum(not _ahead(r) for r in long)
        out.append(
            "at p50 and p99 next to the 8192 trainer in every run"
            + (f" but {_count(behind)}" if behind else "")
        )
    short = [r for r in runs if r.trainer == 2048]
    if short:
        spread = max(abs(r.qpolicy[0] - r.native[0]) for r in short)
        out.append(f"qpolicy's p50 is native's, give or take {spread:.2f} ms")
        late = [r for r in short if r.qpolicy[0] > r.native[0]]
        level = sum(r.qpolicy[0] == r.native[0] for r in short)
        text = f"behind it in {_count(len(late))} of {len(short)} runs"
        if late:
            where = {r.gpu for r in late}
            if len(where) == 1:
                text += f", all on {where.pop()}s"
            text += f" (by {_span([r.qpolicy[0] - r.native[0] for r in late])} ms)"
        out.append(f"{text}, level with it in {_count(level)}, ahead in the others")
        tail = [r.qpolicy[1] - r.native[1] for r in short if r.qpolicy[1] > r.native[1]]
        if tail:
            out.append(f"its p99 was behind native's in {_count(len(tail))} (by {_ms(tail)} ms)")
        else:
            out.append("its p99 was never behind native's")
        mps = [r for r in short if r.mps is not None]
        ahead = sum(r.qpolicy[0] < r.mps[0] and r.qpolicy[1] < r.mps[1] for r in mps if r.mps)
        if ahead == len(mps):
            out.append(f"ahead of MPS at both in all {len(mps)} runs that measured it")
        else:
            out.append(f"ahead of MPS at both in {ahead} of the {len(mps)} runs that measured it")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else ROOT / "docs" / "online.md"
    try:
        runs = parse(path.read_text())
    except (OSError, ValueError) as e:
        print(f"online_summary: {path}: {e}", file=sys.stderr)
        return 1
    print(table(groups(runs)))
    print("\nand, in the sentences under it:")
    for sentence in sentences(runs):
        print(f"- {sentence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
