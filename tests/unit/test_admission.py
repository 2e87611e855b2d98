"""Admission: what enters the desired state always plans, and running pods keep their place."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qpolicy.desired.admission import Admission, Candidate, Origin
from qpolicy.engine import plan_node
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec

FIXED = {0: GpuConfig(0, GpuPolicy.FIXED_SHARE)}


def pod(name: str, share: int | None, gpu: int = 0, klass: PodClass = PodClass.OFFLINE) -> PodSpec:
    return PodSpec(name, gpu, klass, share)


def annotated(spec: PodSpec, arrived: float = 0.0) -> Candidate:
    return Candidate(spec, Origin.ANNOTATIONS, arrived)


def test_pods_that_do_not_fit_are_refused_not_planned() -> None:
    admission = Admission()
    result = admission.admit(FIXED, [annotated(pod("/a", 60), 1.0), annotated(pod("/b", 60), 2.0)])
    assert list(result.state.pods) == ["/a"]
    refusal = result.refused["/b"]
    assert (refusal.reason, refusal.origin, refusal.kept) == (
        "oversubscribed",
        Origin.ANNOTATIONS,
        False,
    )
    assert refusal.message == (
        "pod /b refused: shares on GPU 0 (fixed-share) sum to 120 > 100: /a=60, /b=60"
    )
    plan_node(result.state.gpus, result.state.pods.values(), {})  # plans


def test_running_pods_keep_their_place_against_newcomers_of_any_source() -> None:
    admission = Admission()
    admission.admit(FIXED, [annotated(pod("/a", 60))])
    # The administrator now asks for /b at 60: /a runs, so /b waits.
    result = admission.admit(
        FIXED, [annotated(pod("/a", 60)), Candidate(pod("/b", 60), Origin.STATE_FILE)]
    )
    assert list(result.state.pods) == ["/a"] and result.refused["/b"].origin is Origin.STATE_FILE
    # Once /a is gone, /b gets in.
    result = admission.admit(FIXED, [Candidate(pod("/b", 60), Origin.STATE_FILE)])
    assert list(result.state.pods) == ["/b"] and result.refused == {}


def test_newcomers_go_by_source_then_arrival() -> None:
    result = Admission().admit(
        FIXED,
        [
            annotated(pod("/early", 50), 1.0),
            annotated(pod("/late", 50), 2.0),
            Candidate(pod("/kube", 50), Origin.KUBERNETES, 3.0),
        ],
    )
    assert list(result.state.pods) == ["/early", "/kube"]
    assert list(result.refused) == ["/late"]


def test_a_change_that_does_not_fit_is_refused_and_the_pod_keeps_its_last_spec() -> None:
    admission = Admission()
    admission.admit(FIXED, [annotated(pod("/a", 30), 1), annotated(pod("/b", 50), 2)])
    result = admission.admit(FIXED, [annotated(pod("/a", 80), 1), annotated(pod("/b", 50), 2)])
    assert result.state.pods == {"/a": pod("/a", 30), "/b": pod("/b", 50)}
    refusal = result.refused["/a"]
    assert refusal.kept and refusal.message.startswith("pod /a: change refused: shares on GPU 0")
    # The running /b was not pushed out by /a's growth.
    assert "/b" not in result.refused


def test_a_policy_change_drops_the_pods_that_no_longer_fit() -> None:
    admission = Admission()
    best = {0: GpuConfig(0, GpuPolicy.BEST_EFFORT)}
    admission.admit(best, [annotated(pod("/a", None)), annotated(pod("/b", 40))])
    result = admission.admit(FIXED, [annotated(pod("/a", None)), annotated(pod("/b", 40))])
    assert list(result.state.pods) == ["/b"]
    assert result.refused["/a"].reason == "no-share"
    assert "GPU 0 is fixed-share but pod(s) /a have no share" in result.refused["/a"].message


def test_the_enforcer_says_what_it_cannot_enforce() -> None:
    def names_only_through_kubernetes(spec: PodSpec) -> str | None:
        return None if spec.id.startswith("/") else "not a cgroup path"

    result = Admission().admit(
        FIXED,
        [Candidate(pod("ml/trainer-0", 10), Origin.STATE_FILE), annotated(pod("/a", 10))],
        names_only_through_kubernetes,
    )
    assert list(result.state.pods) == ["/a"]
    assert result.refused["ml/trainer-0"].reason == "unenforceable"
    assert result.refused["ml/trainer-0"].message == "pod ml/trainer-0: not a cgroup path"


def test_annotations_below_a_configured_pod_cannot_promote_a_tenant() -> None:
    parent = Candidate(pod("/kubepods/pod-x", 10), Origin.KUBERNETES)
    child = annotated(pod("/kubepods/pod-x/ctr", 90, klass=PodClass.ONLINE))
    grandchild = annotated(pod("/kubepods/pod-x/ctr/sub", 5))
    result = Admission().admit(FIXED, [parent, child, grandchild])
    assert list(result.state.pods) == ["/kubepods/pod-x"]
    assert result.refused["/kubepods/pod-x/ctr"].reason == "nested"
    assert (
        "inside pod /kubepods/pod-x, which governs" in result.refused["/kubepods/pod-x/ctr"].message
    )
    assert "inside pod /kubepods/pod-x/ctr" in result.refused["/kubepods/pod-x/ctr/sub"].message
    # The administrator may subdivide a pod: nested pods in the state file are taken.
    admin_child = Candidate(pod("/kubepods/pod-x/ctr", 5), Origin.STATE_FILE)
    result = Admission().admit(FIXED, [parent, admin_child])
    assert list(result.state.pods) == ["/kubepods/pod-x", "/kubepods/pod-x/ctr"]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 2), st.sampled_from(list(GpuPolicy)), max_size=3),
    st.lists(
        st.tuples(
            st.integers(0, 9),
            st.integers(0, 2),
            st.one_of(st.none(), st.integers(1, 100)),
            st.sampled_from(list(Origin)),
            st.sampled_from(list(PodClass)),
        ),
        max_size=12,
    ),
    st.lists(st.integers(0, 9), max_size=5),
)
def test_what_is_admitted_always_plans_and_running_pods_stay(
    policies: dict[int, GpuPolicy],
    asked: list[tuple[int, int, int | None, Origin, PodClass]],
    leaving: list[int],
) -> None:
    gpus = {index: GpuConfig(index, policy) for index, policy in policies.items()}
    candidates = {
        f"/p{n}": Candidate(PodSpec(f"/p{n}", gpu, klass, share), origin, float(i))
        for i, (n, gpu, share, origin, klass) in enumerate(asked)
    }
    admission = Admission()
    first = admission.admit(gpus, candidates.values())
    plan_node(gpus, first.state.pods.values(), {})
    assert set(first.state.pods) | set(first.refused) == set(candidates)
    # Some pods leave, the rest ask again: every pod admitted before is admitted again.
    again = [c for p, c in candidates.items() if int(p[2:]) not in leaving]
    second = admission.admit(gpus, again)
    plan_node(gpus, second.state.pods.values(), {})
    assert {c.spec.id for c in again} & set(first.state.pods) <= set(second.state.pods)
