"""The policy engine: table tests of each policy, then properties that must hold for any input."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qpolicy.engine import OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US, Plan, plan, waterfill
from qpolicy.errors import PlanError
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec

BE, FS, BS = GpuPolicy.BEST_EFFORT, GpuPolicy.FIXED_SHARE, GpuPolicy.BURST_SHARE
ON, OFF = PodClass.ONLINE, PodClass.OFFLINE
EPS = 1e-9


def pods_of(*specs: tuple[str, PodClass, int | None]) -> list[PodSpec]:
    return [PodSpec(name, 0, cls, share) for name, cls, share in specs]


def allocations(result: Plan) -> dict[str, float]:
    return {s.pod: round(s.allocation, 6) for s in result.slices}


TABLE = [
    # (description, policy, pods, demand, expected allocations)
    (
        "fixed-share caps every pod at its share, even on an idle GPU",
        FS,
        [("a", OFF, 50), ("b", OFF, 30), ("c", OFF, 20)],
        {"a": 1, "b": 1, "c": 0},
        {"a": 0.5, "b": 0.3, "c": 0.0},
    ),
    (
        "a lone fixed-share pod gets its share and nothing more",
        FS,
        [("a", OFF, 30)],
        {"a": 1},
        {"a": 0.3},
    ),
    (
        "fixed-share gives a light pod what it wants",
        FS,
        [("a", OFF, 50), ("b", ON, 30)],
        {"a": 0.2, "b": 0.1},
        {"a": 0.2, "b": 0.1},
    ),
    (
        "burst-share splits an idle pod's share by share (62.5/37.5)",
        BS,
        [("a", OFF, 50), ("b", OFF, 30), ("c", OFF, 20)],
        {"a": 1, "b": 1, "c": 0},
        {"a": 0.625, "b": 0.375, "c": 0.0},
    ),
    (
        "burst-share with everyone busy is the shares",
        BS,
        [("a", OFF, 50), ("b", OFF, 30), ("c", OFF, 20)],
        {"a": 1, "b": 1, "c": 1},
        {"a": 0.5, "b": 0.3, "c": 0.2},
    ),
    (
        "burst-share hands unallocated time out too",
        BS,
        [("a", OFF, 40), ("b", OFF, 20)],
        {"a": 1, "b": 1},
        {"a": 0.666667, "b": 0.333333},
    ),
    (
        "burst-share: a light pod keeps what it uses, the rest goes to the busy one",
        BS,
        [("a", OFF, 50), ("b", OFF, 50)],
        {"a": 1, "b": 0.1},
        {"a": 0.9, "b": 0.1},
    ),
    (
        "burst-share: online takes idle time before offline, offline keeps its guarantee",
        BS,
        [("web", ON, 20), ("train", OFF, 50)],
        {"web": 1, "train": 1},
        {"web": 0.5, "train": 0.5},
    ),
    (
        "burst-share: offline bursts into what online leaves",
        BS,
        [("web", ON, 30), ("train", OFF, 70)],
        {"web": 0.015, "train": 1},
        {"web": 0.015, "train": 0.985},
    ),
    (
        "best-effort: busy pods split equally, idle ones get nothing",
        BE,
        [("a", OFF, None), ("b", OFF, None), ("c", OFF, None), ("d", OFF, None)],
        {"a": 1, "b": 1, "c": 1},
        {"a": 0.333333, "b": 0.333333, "c": 0.333333, "d": 0.0},
    ),
    (
        "best-effort ignores shares",
        BE,
        [("a", OFF, 90), ("b", OFF, 10)],
        {"a": 1, "b": 1},
        {"a": 0.5, "b": 0.5},
    ),
    (
        "best-effort: online first, offline split what is left",
        BE,
        [("web", ON, None), ("x", OFF, None), ("y", OFF, None)],
        {"web": 0.4, "x": 1, "y": 1},
        {"web": 0.4, "x": 0.3, "y": 0.3},
    ),
    (
        "best-effort: a saturating online pod leaves offline nothing",
        BE,
        [("web", ON, None), ("x", OFF, None)],
        {"web": 1, "x": 1},
        {"web": 1.0, "x": 0.0},
    ),
    (
        "best-effort is work conserving around a light pod",
        BE,
        [("a", OFF, None), ("b", OFF, None), ("c", OFF, None)],
        {"a": 0.1, "b": 1, "c": 1},
        {"a": 0.1, "b": 0.45, "c": 0.45},
    ),
]


@pytest.mark.parametrize(
    ("policy", "specs", "demand", "expected"),
    [case[1:] for case in TABLE],
    ids=[case[0] for case in TABLE],
)
def test_policy_table(
    policy: GpuPolicy,
    specs: list[tuple[str, PodClass, int | None]],
    demand: dict[str, float],
    expected: dict[str, float],
) -> None:
    result = plan(GpuConfig(0, policy), pods_of(*specs), demand)
    assert allocations(result) == expected


def test_plan_orders_online_first_then_by_id() -> None:
    pods = pods_of(("z", OFF, 10), ("b", ON, 10), ("a", OFF, 10), ("c", ON, 10))
    result = plan(GpuConfig(0, BS), pods, {})
    assert [s.pod for s in result.slices] == ["b", "c", "a", "z"]


def test_caps_by_policy() -> None:
    pods = pods_of(("web", ON, 20), ("a", OFF, 50), ("b", OFF, 30))
    demand = {"web": 0.05, "a": 1, "b": 1}
    fs = {s.pod: s.cap for s in plan(GpuConfig(0, FS), pods, demand).slices}
    assert fs == {"web": 0.2, "a": 0.5, "b": 0.3}
    be = {s.pod: s.cap for s in plan(GpuConfig(0, BE), pods, demand).slices}
    assert be == {"web": None, "a": None, "b": None}
    bs = plan(GpuConfig(0, BS), pods, demand)
    # Online may grow into everything not guaranteed to busy offline pods (1 - 0.5 - 0.3).
    assert bs.slice("web").cap == pytest.approx(0.2)
    assert bs.slice("a").cap is None


def test_online_cap_under_burst_share_includes_idle_offline_share() -> None:
    pods = pods_of(("web", ON, 20), ("a", OFF, 50), ("b", OFF, 30))
    result = plan(GpuConfig(0, BS), pods, {"web": 0.05, "a": 1, "b": 0})
    assert result.slice("web").cap == pytest.approx(0.5)


def test_timeslices_only_when_online_pods_share_the_gpu() -> None:
    mixed = plan(GpuConfig(0, BS), pods_of(("web", ON, 20), ("a", OFF, 50)), {})
    assert mixed.slice("web").timeslice_us == ONLINE_TIMESLICE_US
    assert mixed.slice("a").timeslice_us == OFFLINE_TIMESLICE_US
    batch = plan(GpuConfig(0, BS), pods_of(("a", OFF, 50), ("b", OFF, 50)), {})
    assert all(s.timeslice_us is None for s in batch.slices)


def test_pods_of_other_gpus_are_ignored() -> None:
    pods = [PodSpec("a", 0, share=80), PodSpec("b", 1, share=80)]
    result = plan(GpuConfig(0, FS), pods, {"a": 1, "b": 1})
    assert [s.pod for s in result.slices] == ["a"]


def test_oversubscribed_shares_name_gpu_and_pods() -> None:
    pods = pods_of(("a", OFF, 50), ("b", OFF, 60))
    for policy in (FS, BS):
        with pytest.raises(PlanError, match=r"GPU 0 .*110.*a=50, b=60"):
            plan(GpuConfig(0, policy), pods, {})
    plan(GpuConfig(0, BE), pods, {})


def test_demand_is_clamped_and_nan_rejected() -> None:
    pods = pods_of(("a", OFF, None))
    assert plan(GpuConfig(0, BE), pods, {"a": 7.0}).slice("a").allocation == 1.0
    assert plan(GpuConfig(0, BE), pods, {"a": -1.0}).slice("a").allocation == 0.0
    with pytest.raises(ValueError, match="NaN"):
        plan(GpuConfig(0, BE), pods, {"a": float("nan")})


def test_waterfill_respects_wants_and_weights() -> None:
    result = waterfill(1.0, [("a", 1, 0.1), ("b", 1, 1.0), ("c", 2, 1.0)])
    assert result["a"] == pytest.approx(0.1)
    assert result["b"] == pytest.approx(0.3)
    assert result["c"] == pytest.approx(0.6)
    assert waterfill(0.0, [("a", 1, 1.0)]) == {"a": 0.0}


# -- properties ----------------------------------------------------------------------------------


@st.composite
def scenarios(
    draw: st.DrawFn, policy: GpuPolicy | None = None
) -> tuple[GpuConfig, list[PodSpec], dict[str, float]]:
    chosen = policy or draw(st.sampled_from(list(GpuPolicy)))
    count = draw(st.integers(min_value=1, max_value=12))
    names = [f"pod{i}" for i in range(count)]
    classes = draw(st.lists(st.sampled_from([ON, OFF]), min_size=count, max_size=count))
    if chosen is BE:
        shares: list[int | None] = draw(
            st.lists(st.one_of(st.none(), st.integers(1, 100)), min_size=count, max_size=count)
        )
    else:
        # Shares that fit in 100: cut [0, 100] at count-1 points, keep every piece >= 1.
        budget = draw(st.integers(min_value=count, max_value=100))
        cuts = (
            sorted(
                draw(
                    st.lists(
                        st.integers(1, budget - 1),
                        min_size=count - 1,
                        max_size=count - 1,
                        unique=True,
                    )
                )
            )
            if count > 1
            else []
        )
        edges = [0, *cuts, budget]
        shares = [b - a for a, b in itertools.pairwise(edges)]
    demand_values = draw(
        st.lists(
            st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)),
            min_size=count,
            max_size=count,
        )
    )
    pods = [PodSpec(n, 0, c, s) for n, c, s in zip(names, classes, shares, strict=True)]
    return GpuConfig(0, chosen), pods, dict(zip(names, demand_values, strict=True))


@given(scenarios())
def test_nobody_gets_more_than_it_wants_and_the_gpu_is_not_overbooked(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]],
) -> None:
    gpu, pods, demand = case
    result = plan(gpu, pods, demand)
    for s in result.slices:
        assert -EPS <= s.allocation <= demand[s.pod] + EPS
    assert result.allocated <= 1.0 + EPS


@given(scenarios(FS))
def test_fixed_share_never_exceeds_a_share(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]],
) -> None:
    gpu, pods, demand = case
    result = plan(gpu, pods, demand)
    for s in result.slices:
        assert s.share is not None
        assert s.allocation <= s.share / 100 + EPS
        assert s.cap == pytest.approx(s.share / 100)


@given(scenarios(BS))
def test_burst_share_gives_every_busy_pod_at_least_its_share(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]],
) -> None:
    gpu, pods, demand = case
    result = plan(gpu, pods, demand)
    for s in result.slices:
        assert s.share is not None
        assert s.allocation >= min(s.share / 100, demand[s.pod]) - EPS


@given(st.one_of(scenarios(BE), scenarios(BS)))
def test_work_conserving_policies_leave_no_idle_time_while_a_pod_is_busy(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]],
) -> None:
    gpu, pods, demand = case
    result = plan(gpu, pods, demand)
    assert result.allocated == pytest.approx(min(1.0, sum(demand.values())), abs=1e-9)


@given(scenarios())
def test_offline_never_delays_online(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]],
) -> None:
    gpu, pods, demand = case
    result = plan(gpu, pods, demand)
    classes = [s.pod_class for s in result.slices]
    # Online pods come first in every period.
    assert classes == sorted(classes, key=lambda c: c is not ON)
    # More offline demand never takes time from an online pod: under best-effort and fixed-share at
    # all, under burst-share beyond the offline pods' guarantees (raising it to 1 only adds
    # demand above each share, which online pods outrank).
    hungrier = {
        p.id: (
            1.0
            if p.pod_class is OFF and (gpu.policy is not BS or demand[p.id] >= (p.share or 0) / 100)
            else demand[p.id]
        )
        for p in pods
    }
    again = plan(gpu, pods, hungrier)
    for s in result.slices:
        if s.pod_class is ON:
            assert again.slice(s.pod).allocation >= s.allocation - EPS


@given(scenarios(), st.randoms(use_true_random=False))
def test_plan_is_deterministic_and_independent_of_input_order(
    case: tuple[GpuConfig, list[PodSpec], dict[str, float]], rnd: object
) -> None:
    gpu, pods, demand = case
    shuffled = list(pods)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert plan(gpu, pods, demand) == plan(gpu, shuffled, dict(reversed(list(demand.items()))))
    assert plan(gpu, pods, demand) == plan(gpu, pods, demand)
