import json
import multiprocessing
import multiprocessing.synchronize
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpolicy.errors import PlanError, StateError, ValidationError
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.state import (
    DEFAULT_STATE_DIR,
    DesiredState,
    StateStore,
    decode_state,
    default_state_dir,
    encode_state,
)

GiB = 2**30

# The example of the file format documented in qpolicy/state.py and the brief.
DOCUMENTED = {
    "schema": 1,
    "gpus": {"0": {"policy": "burst-share", "period_ms": 50}},
    "pods": {
        "/kubepods/x": {"gpu": 0, "class": "online", "share": 30, "memory_bytes": 8 * GiB},
        "ml/batch-0": {"gpu": 0, "class": "offline", "share": 50, "memory_bytes": None},
    },
}


def documented_state() -> DesiredState:
    return (
        DesiredState()
        .with_gpu(GpuConfig(0, GpuPolicy.BURST_SHARE, 50))
        .with_pod(PodSpec("/kubepods/x", 0, PodClass.ONLINE, 30, 8 * GiB))
        .with_pod(PodSpec("ml/batch-0", 0, PodClass.OFFLINE, 50))
    )


def write_json(path: Path, document: object) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(document).encode()
    path.write_bytes(raw)
    return raw


def leftovers(directory: Path) -> list[str]:
    """Files in the state directory other than the state file and its lock."""
    own = ("state.json", ".state.lock")
    return sorted(p.name for p in directory.iterdir() if p.name not in own)


# --- DesiredState ---------------------------------------------------------------------------------


def test_empty_state_has_default_gpus_and_no_pods() -> None:
    state = DesiredState()
    assert state.gpu(3) == GpuConfig(3, GpuPolicy.BEST_EFFORT, 50)
    assert state.pods_on(3) == ()
    assert state.gpu_indices() == []
    with pytest.raises(ValidationError, match=r"invalid GPU index -1:"):
        state.gpu(-1)


def test_changes_return_new_states_and_leave_the_old_one() -> None:
    empty = DesiredState()
    configured = empty.with_gpu(GpuConfig(1, GpuPolicy.FIXED_SHARE, 20))
    with_pod = configured.with_pod(PodSpec("a", 1, share=40))
    assert empty == DesiredState()
    assert configured.pods == {}
    assert with_pod.gpu(1) == GpuConfig(1, GpuPolicy.FIXED_SHARE, 20)
    assert with_pod.pods_on(1) == (PodSpec("a", 1, share=40),)
    assert with_pod.without_pod("a") == configured


def test_state_cannot_be_changed_through_its_mappings_or_the_callers_dict() -> None:
    pods = {"a": PodSpec("a", 0)}
    state = DesiredState(pods=pods)
    pods["b"] = PodSpec("b", 0)
    assert list(state.pods) == ["a"]
    with pytest.raises(TypeError):
        state.pods["c"] = PodSpec("c", 0)  # type: ignore[index]


def test_mappings_must_be_keyed_by_their_values_ids() -> None:
    with pytest.raises(ValueError, match="filed under"):
        DesiredState(gpus={1: GpuConfig(2)})
    with pytest.raises(ValueError, match="filed under"):
        DesiredState(pods={"a": PodSpec("b", 0)})


def test_pods_on_and_gpu_indices_are_sorted_and_per_gpu() -> None:
    state = (
        DesiredState()
        .with_gpu(GpuConfig(5))
        .with_pod(PodSpec("z", 2))
        .with_pod(PodSpec("a", 2))
        .with_pod(PodSpec("m", 0))
    )
    assert [p.id for p in state.pods_on(2)] == ["a", "z"]
    assert state.gpu_indices() == [0, 2, 5]


def test_with_pod_replaces_a_pod_of_the_same_id() -> None:
    state = DesiredState().with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE))
    state = state.with_pod(PodSpec("a", 0, share=60)).with_pod(PodSpec("b", 0, share=40))
    # a's old 60 must not count against its new 50: 50 + 40 fits, 60 + 50 + 40 would not.
    state = state.with_pod(PodSpec("a", 0, PodClass.ONLINE, share=50))
    assert state.pods["a"] == PodSpec("a", 0, PodClass.ONLINE, share=50)
    assert len(state.pods) == 2


def test_moving_a_pod_to_another_gpu_frees_its_share() -> None:
    state = DesiredState().with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE))
    state = state.with_pod(PodSpec("a", 0, share=70))
    state = state.with_pod(PodSpec("a", 1, share=70)).with_pod(PodSpec("b", 0, share=70))
    assert [p.id for p in state.pods_on(0)] == ["b"]
    assert [p.id for p in state.pods_on(1)] == ["a"]


def test_with_pod_refuses_shares_over_100() -> None:
    state = DesiredState().with_gpu(GpuConfig(0, GpuPolicy.BURST_SHARE))
    state = state.with_pod(PodSpec("a", 0, share=50))
    with pytest.raises(PlanError, match=r"sum to 110 > 100"):
        state.with_pod(PodSpec("b", 0, share=60))


@pytest.mark.parametrize("policy", [GpuPolicy.FIXED_SHARE, GpuPolicy.BURST_SHARE])
def test_with_pod_refuses_a_pod_without_share_on_a_share_policy(policy: GpuPolicy) -> None:
    state = DesiredState().with_gpu(GpuConfig(0, policy))
    with pytest.raises(PlanError, match="have no share"):
        state.with_pod(PodSpec("a", 0))


def test_best_effort_accepts_any_shares() -> None:
    state = DesiredState().with_pod(PodSpec("a", 0, share=90)).with_pod(PodSpec("b", 0))
    assert len(state.with_pod(PodSpec("c", 0, share=90)).pods) == 3


def test_with_gpu_refuses_a_policy_its_pods_do_not_fit() -> None:
    state = DesiredState().with_pod(PodSpec("a", 0, share=60)).with_pod(PodSpec("b", 0, share=60))
    with pytest.raises(PlanError, match=r"sum to 120 > 100"):
        state.with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE))
    other_gpu = state.with_gpu(GpuConfig(1, GpuPolicy.FIXED_SHARE))
    assert other_gpu.gpu(1).policy is GpuPolicy.FIXED_SHARE


def test_without_pod_refuses_an_unknown_id() -> None:
    with pytest.raises(ValidationError, match=r"^no pod 'x'$"):
        DesiredState().with_pod(PodSpec("a", 0)).without_pod("x")


# --- JSON -----------------------------------------------------------------------------------------


def test_encoding_is_the_documented_schema() -> None:
    assert json.loads(encode_state(documented_state())) == DOCUMENTED


def test_round_trip() -> None:
    state = documented_state().with_gpu(GpuConfig(7, GpuPolicy.FIXED_SHARE, 5))
    state = state.with_pod(PodSpec("/kubepods.slice/p-1", 3, memory_limit=1))
    assert decode_state(encode_state(state), "x") == state


def test_decoding_accepts_policy_aliases_and_omitted_optional_values() -> None:
    raw = json.dumps(
        {"schema": 1, "gpus": {"2": {"policy": "fs"}}, "pods": {"a": {"gpu": 2, "share": 10}}}
    ).encode()
    state = decode_state(raw, "x")
    assert state.gpu(2) == GpuConfig(2, GpuPolicy.FIXED_SHARE, 50)
    assert state.pods["a"] == PodSpec("a", 2, PodClass.OFFLINE, 10, None)


@pytest.mark.parametrize("spelling", ["burst", "bs", "Burst_Share", "burstshare"])
def test_a_hand_written_policy_alias_is_read_and_written_back_long(spelling: str) -> None:
    raw = json.dumps({"schema": 1, "gpus": {"0": {"policy": spelling}}, "pods": {}}).encode()
    state = decode_state(raw, "x")
    assert state.gpu(0).policy is GpuPolicy.BURST_SHARE
    assert json.loads(encode_state(state))["gpus"]["0"]["policy"] == "burst-share"


def with_pod_field(key: str, value: object) -> dict[str, object]:
    pod: dict[str, object] = {"gpu": 0, "class": "online", "share": 30, "memory_bytes": None}
    pod[key] = value
    return {"schema": 1, "gpus": {}, "pods": {"a": pod}}


INVALID_DOCUMENTS: list[tuple[str, object, str]] = [
    ("not an object", [1, 2], "expected a JSON object, found a list"),
    ("newer schema", {"schema": 2, "whatever": True}, "written by a newer qpolicy (schema 2)"),
    ("no schema", {"gpus": {}, "pods": {}}, "unknown schema None"),
    ("schema as a string", {"schema": "1", "gpus": {}, "pods": {}}, "unknown schema '1'"),
    ("missing pods", {"schema": 1, "gpus": {}}, "missing 'pods'"),
    ("unknown top key", {"schema": 1, "gpus": {}, "pods": {}, "x": 1}, "unknown key(s) 'x'"),
    ("share too big", with_pod_field("share", 150), "invalid share 150"),
    ("share a string", with_pod_field("share", "30"), "share: expected an integer"),
    ("share a float", with_pod_field("share", 30.5), "30.5"),
    ("gpu a boolean", with_pod_field("gpu", True), "gpu: expected an integer, found a boolean"),
    ("bad class", with_pod_field("class", "batch"), "invalid class 'batch'"),
    ("bad memory", with_pod_field("memory_bytes", 0), "invalid memory limit 0"),
    ("misspelt key", with_pod_field("shares", 30), "unknown key(s) 'shares'"),
    (
        "bad pod id",
        {"schema": 1, "gpus": {}, "pods": {"a b": {"gpu": 0}}},
        "invalid pod id 'a b'",
    ),
    (
        "bad gpu key",
        {"schema": 1, "gpus": {"x": {"policy": "be"}}, "pods": {}},
        "invalid GPU index 'x'",
    ),
    (
        "gpu key not plain",
        {"schema": 1, "gpus": {"01": {"policy": "be"}}, "pods": {}},
        "GPU index '01' is not written as a plain number",
    ),
    (
        "bad policy",
        {"schema": 1, "gpus": {"0": {"policy": "xx"}}, "pods": {}},
        "invalid policy 'xx'",
    ),
    (
        "bad period",
        {"schema": 1, "gpus": {"0": {"policy": "be", "period_ms": 0}}, "pods": {}},
        "invalid period 0 ms",
    ),
]


@pytest.mark.parametrize(
    ("document", "message"),
    [pytest.param(doc, msg, id=name) for name, doc, msg in INVALID_DOCUMENTS],
)
def test_decoding_names_the_source_and_the_bad_value(document: object, message: str) -> None:
    with pytest.raises(StateError) as caught:
        decode_state(json.dumps(document).encode(), "/some/state.json")
    assert str(caught.value).startswith("/some/state.json: ")
    assert message in str(caught.value)


_POLICIES = st.sampled_from(["best-effort", "fixed-share", "burst-share", "bs", "weird", ""])
_GPU = st.fixed_dictionaries({"policy": _POLICIES}, optional={"period_ms": st.integers(-9, 10**7)})
_POD = st.fixed_dictionaries(
    {"gpu": st.integers(-1, 5)},
    optional={
        "class": st.sampled_from(["online", "offline", "Online", "x"]),
        "share": st.integers(-5, 150) | st.none(),
        "memory_bytes": st.integers(-5, 2**66) | st.none(),
    },
)
_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_DOCUMENTS = st.fixed_dictionaries(
    {
        "schema": st.just(1) | _ANY,
        "gpus": st.dictionaries(
            st.sampled_from(["0", "1", "01", "-1", "x"]), _GPU | _ANY, max_size=3
        ),
        "pods": st.dictionaries(
            st.sampled_from(["/a", "/b", "/a/b", "a/b", "/", "/a/", ""]), _POD | _ANY, max_size=4
        ),
    }
)


@settings(max_examples=400, deadline=None)
@given(_DOCUMENTS)
def test_any_document_of_the_files_shape_decodes_or_is_refused_with_a_state_error(
    document: dict[str, object],
) -> None:
    """What the daemon reads at run time never raises anything but StateError (which it logs,
    keeping the last good state): hand edits, sums over 100, unknown values, wrong types."""
    try:
        raw = json.dumps(document).encode()
    except ValueError:  # a float JSON cannot hold
        return
    try:
        state = decode_state(raw, "x")
    except StateError as error:
        assert str(error).startswith("x: ")
    else:
        assert decode_state(encode_state(state), "x") == state


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_are_refused_with_a_state_error(raw: bytes) -> None:
    try:
        state = decode_state(raw, "x")
    except StateError as error:
        assert str(error).startswith("x: ")  # names the file
    else:
        assert isinstance(state, DesiredState)


def test_decoding_refuses_a_key_given_twice() -> None:
    raw = b'{"schema": 1, "gpus": {}, "pods": {"a": {"gpu": 0}, "a": {"gpu": 1}}}'
    with pytest.raises(StateError, match="key 'a' appears twice"):
        decode_state(raw, "x")


# --- StateStore -----------------------------------------------------------------------------------


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QPOLICY_STATE_DIR", str(tmp_path))
    assert default_state_dir() == tmp_path
    assert StateStore().path == tmp_path / "state.json"
    monkeypatch.setenv("QPOLICY_STATE_DIR", "")
    assert default_state_dir() == DEFAULT_STATE_DIR == Path("/var/lib/qpolicy")
    monkeypatch.delenv("QPOLICY_STATE_DIR")
    assert default_state_dir() == Path("/var/lib/qpolicy")


def test_missing_file_loads_as_empty_state_without_creating_anything(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "absent")
    assert store.load() == DesiredState()
    assert not (tmp_path / "absent").exists()


def test_update_writes_and_load_reads_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    saved = store.update(lambda _: documented_state())
    assert saved == documented_state()
    assert store.load() == documented_state()
    assert json.loads(store.path.read_bytes()) == DOCUMENTED
    assert StateStore(tmp_path).load() == saved


def test_update_creates_the_directory_and_writes_world_readable_files(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)
    try:
        store = StateStore(tmp_path / "a" / "b")
        store.update(lambda s: s.with_pod(PodSpec("a", 0)))
    finally:
        os.umask(old_umask)
    assert store.path.is_file()
    # mkstemp creates 0600 and the umask would make it 0600 too; the daemon and other users'
    # `qpolicy status` must be able to read it.
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o644
    assert store.lock_path.parent == store.path.parent
    assert leftovers(store.directory) == []


def test_new_directory_is_0755_under_the_usual_umask(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        store = StateStore(tmp_path / "state")
        store.update(lambda s: s)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o755


def test_a_failing_change_writes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.update(lambda _: documented_state())
    before = store.path.read_bytes()
    with pytest.raises(PlanError):
        store.update(lambda s: s.with_pod(PodSpec("big", 0, share=90)))
    assert store.path.read_bytes() == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("crash", [OSError(5, "Input/output error"), KeyboardInterrupt()])
def test_crash_before_rename_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: BaseException
) -> None:
    store = StateStore(tmp_path)
    store.update(lambda _: documented_state())
    before = store.path.read_bytes()
    written: list[bytes] = []

    def crashing_replace(src: str, dst: object) -> None:
        written.append(Path(src).read_bytes())
        raise crash

    monkeypatch.setattr(os, "replace", crashing_replace)
    expected = StateError if isinstance(crash, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        store.update(lambda s: s.without_pod("ml/batch-0"))
    monkeypatch.undo()

    # The new state was complete in the temp file, but the file in place is the old one.
    assert decode_state(written[0], "tmp") == documented_state().without_pod("ml/batch-0")
    assert store.path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_a_temp_file_left_by_a_real_crash_does_not_disturb(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.update(lambda _: documented_state())
    (tmp_path / ".state.abc.tmp").write_bytes(b'{"schema": 1, "gp')
    assert store.load() == documented_state()
    assert store.update(lambda s: s.without_pod("/kubepods/x")).pods.keys() == {"ml/batch-0"}


CORRUPT: list[tuple[str, bytes, str]] = [
    ("garbage", b"\x00\xffnot json at all", "not UTF-8 text"),
    ("garbage text", b"hello", "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("truncated", json.dumps(DOCUMENTED).encode()[:40], "not valid JSON"),
    ("bad share", json.dumps(with_pod_field("share", 150)).encode(), "invalid share 150"),
    (
        "newer schema",
        json.dumps({"schema": 2, "gpus": {}, "pods": {}}).encode(),
        "written by a newer qpolicy (schema 2); this one reads schema 1",
    ),
]


@pytest.mark.parametrize(
    ("raw", "message"), [pytest.param(raw, msg, id=name) for name, raw, msg in CORRUPT]
)
def test_an_unusable_file_is_reported_and_never_overwritten(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    store = StateStore(tmp_path)
    store.path.write_bytes(raw)
    for attempt in (store.load, lambda: store.update(lambda _: documented_state())):
        with pytest.raises(StateError) as caught:
            attempt()
        text = str(caught.value)
        assert message in text
        assert str(store.path) in text
        assert "left untouched" in text
        assert "\n" not in text
    assert store.path.read_bytes() == raw
    assert leftovers(tmp_path) == []


def test_state_dir_that_is_a_regular_file(tmp_path: Path) -> None:
    # Works as root too, unlike chmod: the path exists but cannot hold a state file.
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"precious")
    store = StateStore(not_a_dir)
    with pytest.raises(StateError, match="QPOLICY_STATE_DIR") as caught:
        store.load()
    assert "Not a directory" in str(caught.value)
    with pytest.raises(StateError, match="QPOLICY_STATE_DIR"):
        store.update(lambda s: s.with_pod(PodSpec("a", 0)))
    assert not_a_dir.read_bytes() == b"precious"


def test_state_file_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    with pytest.raises(StateError, match=r"cannot read .*state.json: Is a directory"):
        StateStore(tmp_path).load()


def chmod_restricts(path: Path) -> bool:
    """Whether permission bits stop this process (they do not stop root)."""
    return not os.access(path, os.R_OK)


def test_unreadable_file_and_unwritable_directory(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.update(lambda _: documented_state())
    before = store.path.read_bytes()
    store.path.chmod(0)
    store.directory.chmod(0o555)
    try:
        if not chmod_restricts(store.path):
            pytest.skip("running as root: permission bits do not restrict (see the file test)")
        with pytest.raises(StateError, match=r"cannot read .*Permission denied.*QPOLICY_STATE_DIR"):
            store.load()
        store.path.chmod(0o644)
        denied = r"cannot write .*Permission denied.*QPOLICY_STATE_DIR"
        with pytest.raises(StateError, match=denied):
            store.update(lambda s: s.without_pod("/kubepods/x"))
    finally:
        store.directory.chmod(0o755)
        store.path.chmod(0o644)
    assert store.path.read_bytes() == before


# --- concurrency ----------------------------------------------------------------------------------

WORKERS = 8
PODS_PER_WORKER = 10


def add(pod: PodSpec) -> Callable[[DesiredState], DesiredState]:
    return lambda state: state.with_pod(pod)


def add_pods(directory: str, worker: int, start: multiprocessing.synchronize.Barrier) -> None:
    store = StateStore(directory)
    start.wait()
    for n in range(PODS_PER_WORKER):
        store.update(add(PodSpec(f"w{worker}-p{n}", 0, share=1)))


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    # Every update also runs check_pods_fit over all the pods so far (80 x 1 % fits in 100 %).
    store.update(lambda s: s.with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE)))
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WORKERS)
    workers = [
        context.Process(target=add_pods, args=(str(tmp_path), n, start)) for n in range(WORKERS)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=60)
    assert [p.exitcode for p in workers] == [0] * WORKERS
    expected = {f"w{w}-p{n}" for w in range(WORKERS) for n in range(PODS_PER_WORKER)}
    final = store.load()
    assert set(final.pods) == expected
    assert final.gpu(0).policy is GpuPolicy.FIXED_SHARE
    assert leftovers(tmp_path) == []
