"""tools/gpu/online_summary.py: the README's summary of the online rows is the whole table's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.gpu import online_summary

ROOT = Path(__file__).parents[2]

TABLE = "\n".join(
    [
        "text before",
        "",
        online_summary.HEADER,
        "|---|---|---|---|---|---|",
        "| H200, 8192 trainer | 0.65 / 0.79 | 0.42 / 0.54 | 1.73 / 3.23 | 1.19 / 1.33 | 101 % |",
        "| H200, 8192 trainer (39C, two runs) | 0.66 / 0.95, 0.68 / 1.35 "
        "| 0.41 / 0.56, 0.44 / 0.57 | 1.67 / 2.75, 1.71 / 3.19 | 1.19 / 1.34, 1.19 / 1.44 "
        "| 99 %, 100 % |",
        "| H100, 2048 trainer (41B2) | 0.61 / 2.21 | 0.42 / 1.87, unstable | 0.60 / 2.71 "
        "| 1.12 / 4.07 | 96 % |",
        "| H100, 2048 trainer (29A) | 0.56 / 0.74 | 0.38 / 0.58 | 0.60 / 0.85 | - | 97 % |",
        "| H100, 2048 trainer | 0.63 / 0.79 | 0.37 / 0.61 | 0.63 / 0.84 | 1.05 / 1.23 | 97 % |",
        "",
        "text after",
    ]
)


def dash(text: str) -> str:
    """Ranges and ratios as the README writes them; "~" and " x" here keep the source ASCII."""
    return text.replace("~", online_summary.DASH).replace(" x", f" {online_summary.TIMES}")


def test_the_readme_holds_the_summary_of_docs_online_table() -> None:
    """A run added to docs/online.md and not summed up in the README (or a hand-edited range)
    fails here: `python3 tools/gpu/online_summary.py` prints what the README must hold."""
    runs = online_summary.parse((ROOT / "docs" / "online.md").read_text())
    assert len(runs) >= 36
    summary = online_summary.table(online_summary.groups(runs))
    assert summary in (ROOT / "README.md").read_text()


def test_the_readme_quotes_the_tables_counts_and_ranges() -> None:
    """The sentences under the README's summary count runs (behind native, ahead of MPS, ...):
    a run added to the table that changes a count fails here until the README says it."""
    runs = online_summary.parse((ROOT / "docs" / "online.md").read_text())
    readme = " ".join((ROOT / "README.md").read_text().split())
    for sentence in online_summary.sentences(runs):
        assert sentence in readme


def test_the_sentences_follow_the_table() -> None:
    runs = online_summary.parse(TABLE)
    assert online_summary.sentences(runs) == [
        dash("p50 ≤ 1.2 x solo was missed in every run above (1.45~1.70 x)"),
        dash("(0.23~0.25 ms in every 8192 run on H200s)"),
        "at p50 and p99 next to the 8192 trainer in every run",
        "qpolicy's p50 is native's, give or take 0.04 ms",
        "behind it in one of 3 runs, all on H100s (by 0.01 ms), level with it in one, "
        "ahead in the others",
        "its p99 was never behind native's",
        "ahead of MPS at both in all 2 runs that measured it",
    ]
    # One more run behind native and MPS next to each trainer, and one that meets p50.
    worse = TABLE.replace(
        "text after",
        "| H100, 8192 trainer | 0.50 / 3.00 | 0.45 / 0.54 | 1.73 / 2.90 | 1.19 / 1.33 | 99 % |\n"
        "| H200, 2048 trainer | 0.70 / 1.00 | 0.40 / 0.50 | 0.60 / 0.80 | 0.65 / 1.20 | 97 % |\n",
    ).replace("|\n\n|", "|\n|")
    sentences = online_summary.sentences(online_summary.parse(worse))
    assert sentences[0] == dash("p50 ≤ 1.2 x solo was met in one of 8 runs")
    assert sentences[1] == dash("(0.05~0.25 ms in every 8192 run on both GPUs)")
    assert sentences[2] == "at p50 and p99 next to the 8192 trainer in every run but one"
    assert sentences[4] == dash(
        "behind it in two of 4 runs (by 0.01~0.10 ms), level with it in one, ahead in the others"
    )
    assert sentences[5] == "its p99 was behind native's in one (by 0.20 ms)"
    assert sentences[6] == "ahead of MPS at both in 2 of the 3 runs that measured it"


def test_runs_are_grouped_and_spanned() -> None:
    runs = online_summary.parse(TABLE)
    assert len(runs) == 6  # the line of two runs counts twice
    assert [r.unstable for r in runs] == [False, False, False, True, False, False]
    assert runs[4].mps is None
    assert online_summary.table(online_summary.groups(runs)).splitlines()[2:] == [
        dash(line)
        for line in [
            "| 8192 trainer (1.4 ms kernels) | H200, 3 runs | 0.65~0.68 / 0.79~1.35 "
            "| 0.41~0.44 / 0.54~0.57 | 1.67~1.73 / 2.75~3.23 | 1.19 / 1.33~1.44 | 99~101 % |",
            "| 2048 trainer (24 µs kernels) | H100, 2 runs | 0.56~0.63 / 0.74~0.79 "
            "| 0.37~0.38 / 0.58~0.61 | 0.60~0.63 / 0.84~0.85 | 1.05 / 1.23 (1 run) | 97 % |",
            "| 2048 trainer (24 µs kernels) | H100, 1 run, solo unstable | 0.61 / 2.21 "
            "| 0.42 / 1.87 | 0.60 / 2.71 | 1.12 / 4.07 | 96 % |",
        ]
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("| H200, 8192 trainer | 0.65 / 0.79 | 0.42 | 1.73 / 3.23 | - | 101 % |", "'0.42' is not"),
        (
            "| H200, 8192 trainer | 0.65 / 0.79, 0.6 / 0.7 | 0.42 / 0.54 | 1.73 / 3.23 | - | 1 % |",
            "holds 1 run, the line 2",
        ),
        ("| A100, 8192 trainer | 0.65 / 0.79 | 0.42 / 0.54 | 1.7 / 3.2 | - | 101 % |", "not 'GPU"),
        ("| H200, 8192 trainer | 0.65 / 0.79 | 0.42 / 0.54 | 1.73 / 3.23 | 101 % |", "5 cells"),
    ],
)
def test_a_malformed_line_is_named(line: str, message: str) -> None:
    text = f"{online_summary.HEADER}\n|---|\n{line}\n"
    with pytest.raises(ValueError, match=message):
        online_summary.parse(text)


def test_the_command_prints_the_table_or_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "online.md"
    good.write_text(TABLE)
    assert online_summary.main([str(good)]) == 0
    assert capsys.readouterr().out.startswith("| next to | GPU, runs |")
    bad = tmp_path / "bad.md"
    bad.write_text("no table\n")
    assert online_summary.main([str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "no table headed" in err[0]
