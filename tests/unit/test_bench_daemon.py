"""`make bench daemon`'s rows: which measurements run() asks for (each row's pods and loop),
checked without running any (measure and the virtual-time rows stubbed)."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import daemon


def test_run_asks_for_every_row_with_its_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, dict[str, Any]]] = []

    def measure(pods: int, **kwargs: Any) -> dict[str, float]:
        asked.append((pods, kwargs))
        return {"cpu_percent": 1.0}

    monkeypatch.setattr(daemon, "measure", measure)
    monkeypatch.setattr(daemon, "virtual", lambda: {})
    results = daemon.run(seconds=7.0, gsp_us=900.0, map_read_us=40.0)
    rows = dict(zip(results["runs"], asked, strict=True))
    assert all(
        (k["seconds"], k["gsp_us"], k["map_read_us"]) == (7.0, 900.0, 40.0) for _, k in asked
    )
    # The three loops, for ten pods and for two.
    for pods in (10, 2):
        for label, fixed in daemon.MODES.items():
            assert rows[f"{pods} pods, {label}"] == (
                pods,
                {"seconds": 7.0, "gsp_us": 900.0, "map_read_us": 40.0, "fixed_poll_us": fixed},
            )
    # Ten pods with the tracker moved from outside, and at the turns before 2026-11-26.
    churn = rows["10 pods, after, tracker moved 6 times a second"]
    assert churn[0] == 10 and churn[1]["churn_per_s"] == 6.0 and churn[1]["fixed_poll_us"] is None
    short = rows["10 pods, after, 200 ms turns"]
    assert short[0] == 10 and short[1]["min_turn_ms"] == 200.0
    # The online rows' shape: the loop as it is and the probe alone, not the loop of before.
    online = {k: v for k, v in rows.items() if k.startswith("online + trainer")}
    assert sorted(online) == [
        "online + trainer, after: looks when due",
        "online + trainer, probe only (--enforcer none)",
    ]
    assert all(pods == 2 and kwargs["online"] for pods, kwargs in online.values())
    assert len(asked) == 2 * len(daemon.MODES) + 2 + 2
    assert results["meets_target"] is True
