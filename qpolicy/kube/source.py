"""``qpolicy daemon --kubernetes``: the pods of this node, from the API server, as candidates.

Background threads talk to the outside; the daemon's loop thread never waits on them:

* **pods**: list the pods whose ``spec.nodeName`` is this node, then watch from the list's
  ``resourceVersion`` with bookmarks (which keep the version fresh on a quiet node). A watch that
  ends is resumed from the last version seen; a dropped connection is resumed at once, then with
  exponential backoff while the API server cannot be reached (:attr:`KubernetesSource.up` is
  False meanwhile); ``410 Gone`` (the version is too old for the API server's cache) starts over
  with a new list.
* **policy** (``--policy-configmap``): the node's ``qpolicy.io/config`` label picks a key of the
  ConfigMap (:mod:`qpolicy.kube.policy`); the ConfigMap is listed and watched the same way, and
  the node is read again each time its watch is renewed (every minute). A value that does not
  parse is logged once and the last good policy is kept.
* **kubelet and events**: the kubelet's pod-resources socket is asked which GPUs the pods hold
  when a GPU pod's are not known yet (and every half minute); Events are posted on pods.

:meth:`KubernetesSource.refresh`, on the loop thread, turns what the threads collected into
candidates: each GPU pod's settings (:func:`qpolicy.kube.pods.derive`), its cgroup found on disk
(:func:`qpolicy.kube.podcgroup.find_cgroup`; a pod whose cgroup is not there yet is looked for
again at the next refresh), and its GPU (pod-resources, else the pod's ``NVIDIA_VISIBLE_DEVICES``,
else the node's only GPU). A pod on several GPUs is governed on the lowest (a pod spec has one
GPU) and the log says so. A pod with a bad value is left unmanaged, or at its last good settings,
and gets an Event (reason ``QpolicyRefused``), as does a pod that admission refuses; keys that
disagree get one too (``QpolicyConflict``). Each Event is posted once per pod and message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from qpolicy.desired.admission import Candidate, Origin, Refusal
from qpolicy.errors import QPolicyError, StateError
from qpolicy.kube.podcgroup import find_cgroup
from qpolicy.kube.pods import PodFacts, derive, resolve_gpus, visible_device_tokens
from qpolicy.kube.policy import config_key, parse_policy
from qpolicy.model import GpuConfig, PodClass, PodSpec
from qpolicy.runtime.threads import NamedThread
from qpolicy.telemetry.gpus import GpuInfo, node_gpus

log = logging.getLogger(__name__)

COMPONENT = "qpolicy"
REFUSED = "QpolicyRefused"
CONFLICT = "QpolicyConflict"
# The API server ends a watch after this long (it is renewed from the last version).
WATCH_TIMEOUT_S = 240
# Reads of a watch wait this much longer than its timeout before the connection is called dead.
READ_SLACK_S = 30.0
REQUEST_TIMEOUT_S = 30.0
BACKOFF_S = (0.5, 30.0)
# The node (its qpolicy.io/config label) is read again each time the policy watch is renewed.
NODE_EVERY_S = 60
DEVICES_EVERY_S = 30.0
# At most this often while a GPU pod's devices are unknown.
DEVICES_MIN_S = 1.0
# With a policy ConfigMap, pods are handed to admission once the policy is known, or after this
# long without it: admitted under the default policy first, some would be dropped a moment later.
POLICY_WAIT_S = 10.0
# Pods waiting for their cgroup or GPU are looked at again at most this often.
PENDING_EVERY_S = 0.25
MAX_EVENT_MESSAGE = 1024
EVENT_TRIES = 5


class DeviceLister(Protocol):
    """The kubelet's pod-resources API: (namespace, name) -> ``nvidia.com/gpu`` device ids."""

    def gpu_devices(self) -> dict[tuple[str, str], list[str]]: ...

    def close(self) -> None: ...


class KubernetesError(QPolicyError):
    """The Kubernetes client could not be configured."""


def api_client(kubeconfig: Path | None) -> Any:
    """A client of the API server: from ``kubeconfig`` where given, else the pod's service
    account (in-cluster)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except (config.ConfigException, OSError, ValueError) as error:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        hint = "" if kubeconfig else " (outside a cluster, pass --kubeconfig)"
        raise KubernetesError(
            f"cannot configure the Kubernetes client from {where}: {error}{hint}"
        ) from None
    return client.ApiClient(configuration)


@dataclass(frozen=True, slots=True)
class _Event:
    namespace: str
    name: str
    uid: str | None
    reason: str
    kind: str  # Warning or Normal
    message: str
    tries: int = 0


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def _describe(error: BaseException) -> str:
    status = _status(error)
    if status:
        reason = getattr(error, "reason", "") or ""
        return f"HTTP {status} {reason}".strip()
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


class KubernetesSource:
    """The pods of node ``node`` (a :class:`~qpolicy.desired.source.PodSource`)."""

    name = "kubernetes"

    def __init__(
        self,
        api: Any,
        node: str,
        *,
        cgroup_root: Callable[[], Path | None],
        policy_configmap: tuple[str, str] | None = None,
        pod_resources: DeviceLister | None = None,
        gpus: Callable[[], Sequence[GpuInfo]] = node_gpus,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
        node_every_s: int = NODE_EVERY_S,
        devices_every_s: float = DEVICES_EVERY_S,
    ) -> None:
        from kubernetes import client

        self.node = node
        self._api = api
        self._core = client.CoreV1Api(api)
        self._cgroup_root = cgroup_root
        self._configmap = policy_configmap
        self._pod_resources = pod_resources
        self._read_gpus = gpus
        self._clock = clock
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._backoff = backoff_s
        self._node_every_s = node_every_s
        self._devices_every_s = devices_every_s
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._outbox: queue.Queue[tuple[float, _Event]] = queue.Queue()
        self._streams: set[Any] = set()
        # Filled by the threads, read by refresh() (under the lock).
        self._lock = threading.Lock()
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._pods_version = 0
        self._pods_rv: str | None = None
        self._policy: dict[int, GpuConfig] = {}
        self._policy_version = 0
        self._devices: dict[tuple[str, str], list[str]] | None = None
        self._devices_version = 0
        self._node_gpus: list[GpuInfo] = []
        self._pods_up = False
        self._policy_up = policy_configmap is None
        self._policy_known = policy_configmap is None
        self._started_at: float | None = None
        self._devices_wanted = threading.Event()
        self.relists = 0
        self.events_posted = 0
        # The loop thread's own.
        self._seen: tuple[int, int, int] | None = None
        self._pending_at: float | None = None
        self._facts: dict[str, tuple[str, PodFacts]] = {}
        self._cgroups: dict[str, str] = {}
        self._last_good: dict[str, PodSpec] = {}
        self._candidates: dict[str, Candidate] = {}
        self._gpus: dict[int, GpuConfig] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self._owners: dict[str, tuple[str, str, str]] = {}
        self._problems: dict[str, str] = {}
        self._told: set[tuple[str, str, str]] = set()
        self._logged: set[tuple[str, str]] = set()

    # -- threads ------------------------------------------------------------------------------

    def start(self) -> KubernetesSource:
        self._started_at = self._clock()
        targets: list[tuple[str, Callable[[], None]]] = [
            ("pods", self._pods_loop),
            ("worker", self._worker_loop),
        ]
        if self._configmap is not None:
            targets.append(("policy", self._policy_loop))
        for name, target in targets:
            thread = NamedThread(target, f"qpolicy-kube-{name}")
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        """Stop the threads (open watches are cut) and wait for them."""
        self._stopping.set()
        self._devices_wanted.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            _cut(stream)
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        if self._pod_resources is not None:
            self._pod_resources.close()

    def _backoff_wait(self, delay: float) -> float:
        self._stopping.wait(delay)
        return min(max(delay * 2, self._backoff[0]), self._backoff[1])

    def _watch(self, call: Callable[..., Any], rv: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """The events of one watch from ``rv``, until the API server ends it; raises _Gone on
        410 and whatever the connection raises when it breaks."""
        from kubernetes.watch.watch import iter_resp_lines

        response = call(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=int(kwargs.pop("timeout_seconds", self._watch_timeout_s)),
            _preload_content=False,
            _request_timeout=(
                self._request_timeout_s,
                self._watch_timeout_s + READ_SLACK_S,
            ),
            **kwargs,
        )
        with self._lock:
            self._streams.add(response)
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stopping.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise _Gone(status.get("message", "410 Gone"))
                    raise QPolicyError(
                        f"watch error {status.get('code')}: {status.get('message', '')}"
                    )
                yield event
        finally:
            with self._lock:
                self._streams.discard(response)
            with contextlib.suppress(Exception):
                response.release_conn()

    def _get_json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = call(
            *args, _preload_content=False, _request_timeout=self._request_timeout_s, **kwargs
        )
        try:
            document = json.loads(response.data)
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()
        if not isinstance(document, dict):
            raise QPolicyError("the API server answered with something that is not an object")
        return document

    def _pods_loop(self) -> None:
        selector = f"spec.nodeName={self.node}"
        rv: str | None = None
        delay = 0.0
        failures = 0
        while not self._stopping.is_set():
            try:
                if rv is None:
                    listed = self._get_json(
                        self._core.list_pod_for_all_namespaces, field_selector=selector
                    )
                    rv = str(listed.get("metadata", {}).get("resourceVersion", ""))
                    items = [i for i in listed.get("items") or [] if isinstance(i, dict)]
                    with self._lock:
                        self._pods = {_uid(i): i for i in items if _uid(i)}
                        self._pods_version += 1
                        self._pods_rv = rv
                        self.relists += 1
                    self._set_pods_up(True)
                    failures, delay = 0, 0.0
                for event in self._watch(
                    self._core.list_pod_for_all_namespaces, rv, field_selector=selector
                ):
                    rv = self._apply_pod_event(event) or rv
                    self._set_pods_up(True)
                    failures, delay = 0, 0.0
            except _Gone as gone:
                log.info("pod watch expired (%s): listing the pods again", gone)
                rv = None
            except Exception as error:
                if self._stopping.is_set():
                    return
                if _status(error) == 410:
                    log.info("pod watch expired (410 Gone): listing the pods again")
                    rv = None
                    continue
                failures += 1
                # A watch cut once (a restarted API server, a load balancer) is resumed at once;
                # an API server that does not answer again is down.
                if failures >= 2:
                    self._set_pods_up(False, _describe(error))
                log.debug("pod list/watch failed: %s", _describe(error))
                delay = self._backoff_wait(delay)

    def _apply_pod_event(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return None
        rv = obj.get("metadata", {}).get("resourceVersion")
        rv = str(rv) if rv is not None else None
        if kind == "BOOKMARK":
            with self._lock:
                self._pods_rv = rv or self._pods_rv
            return rv
        uid = _uid(obj)
        if not uid:
            return rv
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._pods[uid] = obj
            elif kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                return rv
            self._pods_version += 1
            self._pods_rv = rv or self._pods_rv
        return rv

    def _set_pods_up(self, up: bool, why: str = "") -> None:
        with self._lock:
            was, self._pods_up = self._pods_up, up
        if was and not up:
            log.warning("the API server cannot be reached (%s): keeping the pods known", why)
        elif up and not was and self.relists > 1:
            log.info("the API server answers again")

    def _policy_loop(self) -> None:
        assert self._configmap is not None
        namespace, name = self._configmap
        selector = f"metadata.name={name}"
        delay = 0.0
        last_error: str | None = None
        while not self._stopping.is_set():
            try:
                node = self._get_json(self._core.read_node, self.node)
                labels = node.get("metadata", {}).get("labels") or {}
                listed = self._get_json(
                    self._core.list_namespaced_config_map, namespace, field_selector=selector
                )
                items = [i for i in listed.get("items") or [] if isinstance(i, dict)]
                self._apply_configmap(items[0] if items else None, labels)
                with self._lock:
                    self._policy_up = self._policy_known = True
                delay, last_error = 0.0, None
                rv = str(listed.get("metadata", {}).get("resourceVersion", ""))
                for event in self._watch(
                    self._core.list_namespaced_config_map,
                    rv,
                    namespace=namespace,
                    field_selector=selector,
                    timeout_seconds=self._node_every_s,
                ):
                    obj = event.get("object")
                    if event.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                        self._apply_configmap(obj, labels)
                    elif event.get("type") == "DELETED":
                        self._apply_configmap(None, labels)
            except _Gone:
                continue
            except Exception as error:
                if self._stopping.is_set():
                    return
                if _status(error) == 410:
                    continue
                message = _describe(error)
                if message != last_error:
                    log.warning(
                        "cannot read the policy ConfigMap %s/%s or node %s: %s; keeping the "
                        "last policy",
                        namespace,
                        name,
                        self.node,
                        message,
                    )
                    last_error = message
                with self._lock:
                    self._policy_up = False
                delay = self._backoff_wait(delay)

    def _apply_configmap(self, obj: Mapping[str, Any] | None, labels: Mapping[str, str]) -> None:
        assert self._configmap is not None
        ref = "/".join(self._configmap)
        if obj is None:
            self._log_once("policy", f"ConfigMap {ref} not found: GPUs it would configure run "
                           "best-effort (unless the state file says otherwise)")  # fmt: skip
            policy: dict[int, GpuConfig] = {}
        else:
            data = obj.get("data") or {}
            data = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
            key = config_key(data, labels)
            if key not in data:
                self._log_once("policy", f"ConfigMap {ref} has no key {key!r}: GPUs run "
                               "best-effort (unless the state file says otherwise)")  # fmt: skip
                policy = {}
            else:
                try:
                    policy = parse_policy(data[key], f"ConfigMap {ref}[{key}]")
                except StateError as error:
                    self._log_once("policy", f"{error}; keeping the last good policy")
                    return
        with self._lock:
            if policy != self._policy:
                self._policy = policy
                self._policy_version += 1
                log.info(
                    "policy from ConfigMap %s: %s",
                    ref,
                    ", ".join(
                        f"GPU {i} {g.policy.value} {g.period_ms} ms" for i, g in policy.items()
                    )
                    or "none",
                )

    def _log_once(self, topic: str, message: str) -> None:
        if (topic, message) not in self._logged:
            self._logged.add((topic, message))
            log.warning("%s", message)

    def _worker_loop(self) -> None:
        polled_at: float | None = None
        self._poll_devices()
        polled_at = self._clock()
        while not self._stopping.is_set():
            try:
                due, event = self._outbox.get(timeout=0.2)
            except queue.Empty:
                pass
            else:
                if due > self._clock():
                    self._outbox.put((due, event))
                    self._stopping.wait(0.05)
                else:
                    self._post(event)
            now = self._clock()
            since = now - polled_at
            if (self._devices_wanted.is_set() and since >= DEVICES_MIN_S) or (
                since >= self._devices_every_s
            ):
                self._devices_wanted.clear()
                self._poll_devices()
                polled_at = self._clock()

    def _poll_devices(self) -> None:
        gpus = list(self._read_gpus())
        devices: dict[tuple[str, str], list[str]] | None = None
        if self._pod_resources is not None:
            try:
                devices = self._pod_resources.gpu_devices()
            except QPolicyError as error:
                self._log_once(
                    "pod-resources",
                    f"{error}: pods' GPUs are taken from their NVIDIA_VISIBLE_DEVICES instead",
                )
        with self._lock:
            if devices != self._devices or gpus != self._node_gpus:
                self._devices, self._node_gpus = devices, gpus
                self._devices_version += 1

    def _post(self, event: _Event) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{event.name}.{uuid.uuid4().hex[:16]}",
                "namespace": event.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": event.name,
                "namespace": event.namespace,
                **({"uid": event.uid} if event.uid else {}),
            },
            "reason": event.reason,
            "message": event.message[:MAX_EVENT_MESSAGE],
            "type": event.kind,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._get_json(self._core.create_namespaced_event, event.namespace, body)
        except Exception as error:
            if event.tries + 1 < EVENT_TRIES and not self._stopping.is_set():
                retry = _Event(**{**_fields(event), "tries": event.tries + 1})
                self._outbox.put((self._clock() + 2.0**event.tries, retry))
            else:
                log.warning(
                    "cannot post an Event on pod %s/%s: %s",
                    event.namespace,
                    event.name,
                    _describe(error),
                )
            return
        self.events_posted += 1

    # -- PodSource (the loop thread) ----------------------------------------------------------

    @property
    def up(self) -> bool:
        with self._lock:
            return self._pods_up and self._policy_up

    def refresh(self) -> bool:
        with self._lock:
            versions = (self._pods_version, self._policy_version, self._devices_version)
            pods = dict(self._pods)
            policy = dict(self._policy)
            devices = None if self._devices is None else dict(self._devices)
            gpus = list(self._node_gpus)
            policy_known = self._policy_known
        now = self._clock()
        started = self._started_at if self._started_at is not None else now
        if not policy_known and now - started < POLICY_WAIT_S:
            return False
        if versions == self._seen and (
            self._pending_at is None or now - self._pending_at < PENDING_EVERY_S
        ):
            return False
        self._seen = versions
        before = (self._candidates, self._gpus, self._problems)
        self._derive(pods, devices, gpus, now)
        self._gpus = policy
        return (self._candidates, self._gpus, self._problems) != before

    def _derive(
        self,
        pods: Mapping[str, Mapping[str, Any]],
        devices: Mapping[tuple[str, str], list[str]] | None,
        gpus: Sequence[GpuInfo],
        now: float,
    ) -> None:
        root = self._cgroup_root()
        if root is None:
            self._log_once("cgroup", "no cgroup v2 hierarchy found: pods cannot be governed")
        candidates: dict[str, Candidate] = {}
        names: dict[str, tuple[str, str]] = {}
        owners: dict[str, tuple[str, str, str]] = {}
        problems: dict[str, str] = {}
        pending = False
        want_devices = False
        for uid, obj in pods.items():
            facts = self._facts_of(uid, obj)
            if not facts.gpu_pod or facts.phase in ("Succeeded", "Failed"):
                continue
            for conflict in facts.conflicts:
                self._tell(facts, CONFLICT, "Warning", f"qpolicy: {conflict.message}")
            cgroup = self._cgroups.get(uid)
            if cgroup is None and root is not None:
                cgroup = find_cgroup(root, uid, facts.qos)
                if cgroup is not None:
                    self._cgroups[uid] = cgroup
                    log.debug("pod %s: cgroup %s", facts.key, cgroup)
            pod_id = cgroup or facts.key
            names[pod_id] = (facts.namespace, facts.name)
            owners[pod_id] = (uid, facts.namespace, facts.name)
            if facts.errors:
                message = "; ".join(facts.errors)
                kept = self._last_good.get(uid)
                self._tell(
                    facts,
                    REFUSED,
                    "Warning",
                    f"qpolicy: bad value, "
                    f"{'keeping the last good settings' if kept else 'pod not managed'}: "
                    f"{message}",
                )
                if kept is not None:
                    candidates[kept.id] = Candidate(kept, Origin.KUBERNETES, facts.created or 0.0)
                else:
                    problems[pod_id] = f"pod {facts.key}: {message}"
                continue
            gpu, wanted = self._gpu_of(facts, devices, gpus)
            want_devices = want_devices or wanted
            if cgroup is None or gpu is None:
                pending = True
                continue
            spec = spec_of(facts, cgroup, gpu)
            self._last_good[uid] = spec
            candidates[cgroup] = Candidate(spec, Origin.KUBERNETES, facts.created or 0.0)
        gone = set(self._facts) - set(pods)
        for uid in gone:
            self._facts.pop(uid, None)
            self._cgroups.pop(uid, None)
            self._last_good.pop(uid, None)
        self._told = {t for t in self._told if t[0] not in gone}
        self._pending_at = now if pending else None
        if want_devices:
            self._devices_wanted.set()
        self._candidates, self._names, self._owners, self._problems = (
            candidates,
            names,
            owners,
            problems,
        )

    def _facts_of(self, uid: str, obj: Mapping[str, Any]) -> PodFacts:
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        cached = self._facts.get(uid)
        if cached is not None and cached[0] == version and version:
            return cached[1]
        facts = derive(obj)
        self._facts[uid] = (version, facts)
        return facts

    def _gpu_of(
        self,
        facts: PodFacts,
        devices: Mapping[tuple[str, str], list[str]] | None,
        gpus: Sequence[GpuInfo],
    ) -> tuple[int | None, bool]:
        """The GPU the pod is governed on, and whether the kubelet should be asked again."""
        indexes: list[int] = []
        source = ""
        ids = (devices or {}).get((facts.namespace, facts.name))
        if ids:
            indexes, problems = resolve_gpus(ids, gpus)
            source = "the kubelet's pod-resources"
            for problem in problems:
                self._log_once(facts.key, f"pod {facts.key}: device {problem}")
        if not indexes:
            tokens = [t for _, v in facts.visible_devices for t in visible_device_tokens(v)]
            indexes, problems = resolve_gpus(tokens, gpus)
            source = "NVIDIA_VISIBLE_DEVICES"
            for problem in problems:
                self._log_once(facts.key, f"pod {facts.key}: NVIDIA_VISIBLE_DEVICES: {problem}")
        if not indexes and len(gpus) == 1:
            indexes, source = [gpus[0].index], "the node's only GPU"
        if not indexes:
            self._log_once(
                facts.key, f"pod {facts.key}: its GPU is not known yet (waiting for the kubelet)"
            )
            return None, devices is not None or self._pod_resources is not None
        if len(indexes) > 1:
            self._log_once(
                facts.key,
                f"pod {facts.key} holds GPUs {', '.join(map(str, indexes))} ({source}): "
                f"governed on GPU {indexes[0]} only",
            )
        return indexes[0], False

    def _tell(self, facts: PodFacts, reason: str, kind: str, message: str) -> None:
        uid = facts.uid or facts.key
        key = (uid, reason, message)
        if key in self._told:
            return
        self._told.add(key)
        log.warning("pod %s: %s", facts.key, message)
        self._outbox.put(
            (0.0, _Event(facts.namespace, facts.name, facts.uid, reason, kind, message))
        )

    def candidates(self) -> Sequence[Candidate]:
        return list(self._candidates.values())

    def gpus(self) -> Mapping[int, GpuConfig]:
        return self._gpus

    def refused(self, refusals: Mapping[str, Refusal]) -> None:
        """An Event on each pod admission refused, once per pod and reason (the reason's code:
        a refusal whose numbers change as neighbours come and go is not news)."""
        refused_now: set[str] = set()
        for pod_id, refusal in refusals.items():
            owner = self._owners.get(pod_id)
            if owner is None:
                continue
            uid, namespace, name = owner
            refused_now.add(uid)
            key = (uid, REFUSED, f"admission:{refusal.reason}:{refusal.kept}")
            if key in self._told:
                continue
            self._told.add(key)
            message = f"qpolicy: {self._readable(refusal.message)}"
            self._outbox.put((0.0, _Event(namespace, name, uid, REFUSED, "Warning", message)))
        # A pod admitted since is told again if it is refused again later.
        self._told = {
            t for t in self._told if not t[2].startswith("admission:") or t[0] in refused_now
        }

    def _readable(self, message: str) -> str:
        """Admission's message with pods named namespace/name rather than by cgroup."""
        for pod_id, (_, namespace, name) in sorted(
            self._owners.items(), key=lambda item: len(item[0]), reverse=True
        ):
            if pod_id.startswith("/"):
                message = message.replace(pod_id, f"{namespace}/{name}")
        return message

    def names(self) -> Mapping[str, tuple[str, str]]:
        """Pod id -> (namespace, name) of the Kubernetes pods this source knows."""
        return self._names

    def problems(self) -> Mapping[str, str]:
        """Pod id -> why its settings were not taken (bad values)."""
        return self._problems


def spec_of(facts: PodFacts, cgroup: str, gpu: int) -> PodSpec:
    """The pod spec of a GPU pod without errors, on its cgroup and GPU."""
    pod_class = facts.pod_class.value
    share, memory = facts.share.value, facts.memory.value
    return PodSpec(
        cgroup,
        gpu,
        pod_class if isinstance(pod_class, PodClass) else PodClass.OFFLINE,
        share if isinstance(share, int) and not isinstance(share, PodClass) else None,
        memory if isinstance(memory, int) and not isinstance(memory, PodClass) else None,
    )


def _uid(obj: Mapping[str, Any]) -> str:
    uid = obj.get("metadata", {}).get("uid")
    return str(uid) if uid else ""


def _fields(event: _Event) -> dict[str, Any]:
    return {
        "namespace": event.namespace,
        "name": event.name,
        "uid": event.uid,
        "reason": event.reason,
        "kind": event.kind,
        "message": event.message,
    }


def _cut(response: Any) -> None:
    """Unblock a thread reading a watch: shut its socket down."""
    with contextlib.suppress(Exception):
        response.shutdown()
        return
    with contextlib.suppress(Exception):
        import socket

        response.connection.sock.shutdown(socket.SHUT_RDWR)
