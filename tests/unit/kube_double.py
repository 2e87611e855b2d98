"""A stand-in for the Kubernetes API server, for the parts qpolicy's agent uses.

No kube-apiserver (nor kubelet) can be installed here, so the tests talk to this double through
the real ``kubernetes`` client. It serves what the API server serves for these requests, in its
wire format:

* ``GET /api/v1/pods?fieldSelector=spec.nodeName=N``: a PodList with ``metadata.resourceVersion``;
  with ``watch=true&resourceVersion=V``: a chunked stream of watch events (one JSON object per
  line) after V: ADDED, MODIFIED, DELETED, and BOOKMARK (``allowWatchBookmarks=true``) carrying
  the current version; a version older than the history kept gets an ERROR event with a
  ``Status`` of code 410 (Gone), as the API server answers a watch from a compacted version;
* the same for ``GET /api/v1/namespaces/NS/configmaps?fieldSelector=metadata.name=NAME``;
* ``GET /api/v1/nodes/NAME``;
* ``POST /api/v1/namespaces/NS/events``: recorded in :attr:`FakeApiServer.events`.

Faults on demand: :meth:`FakeApiServer.gone` sends ERROR 410 on every open watch and forgets the
history (the next watch from an old version is Gone too, so the client must list again);
:meth:`FakeApiServer.drop` cuts every open watch in the middle of a chunk; :attr:`down` makes
every request fail with the connection closed before an answer.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NODE = "gpu-node-1"


def pod_json(
    name: str,
    *,
    namespace: str = "ml",
    node: str = NODE,
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    qos: str = "Burstable",
    phase: str = "Running",
    created: str = "2026-11-24T10:00:00Z",
) -> dict[str, Any]:
    """A Pod as the API server serves it (the fields a real one has, trimmed of the noise)."""
    resources: dict[str, Any] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    if limits:
        resources["limits"] = dict(limits)
        resources["requests"].update({k: v for k, v in limits.items() if k.startswith("nvidia")})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": "0",
            "creationTimestamp": created,
            "labels": dict(labels or {"app": name}),
            "annotations": dict(annotations or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": name.rsplit("-", 1)[0],
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "imagePullPolicy": "IfNotPresent",
                    "resources": resources,
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "status": {
            "phase": phase,
            "qosClass": qos,
            "hostIP": "10.0.0.7",
            "podIP": "10.244.1.9",
            "startTime": created,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": created}],
        },
    }


def configmap_json(name: str, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "0",
            "creationTimestamp": "2026-11-24T09:00:00Z",
        },
        "data": dict(data),
    }


def node_json(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "5",
            "labels": {"kubernetes.io/hostname": name, **labels},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": url}}],
                "users": [{"name": "agent", "user": {"token": "test-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "double", "user": "agent"}}],
                "current-context": "test",
            }
        )
    )
    return path


class _Watcher:
    """One open watch: its connection, what it selects, and faults sent to it."""

    def __init__(self, kind: str, key: str, handler: BaseHTTPRequestHandler) -> None:
        self.kind, self.key, self.handler = kind, key, handler
        self.fault: str | None = None


class FakeApiServer:
    def __init__(self, *, bookmark_every_s: float = 0.2) -> None:
        self.bookmark_every_s = bookmark_every_s
        self.lock = threading.Condition()
        self.rv = 100
        # kind -> key -> object; kind is "pods" or "configmaps"
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"pods": {}, "configmaps": {}}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.oldest = self.rv  # watches from before this version are Gone
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.watchers: list[_Watcher] = []
        self.down = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def close(self) -> None:
        with self.lock:
            self.down = True
            self.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- state ----------------------------------------------------------------------------------

    def _put(self, kind: str, obj: dict[str, Any], event: str, record: bool = True) -> None:
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
            if event == "DELETED":
                self.objects[kind].pop(key, None)
            else:
                self.objects[kind][key] = obj
            if record:
                self.history.append((self.rv, kind, event, obj))
            self.lock.notify_all()

    def add_pod(self, pod: dict[str, Any]) -> None:
        self._put("pods", pod, "ADDED")

    def modify_pod(self, pod: dict[str, Any], *, record: bool = True) -> None:
        """A change; ``record=False``: one a watch never sees (it happened in a compacted past)."""
        self._put("pods", pod, "MODIFIED", record)

    def delete_pod(self, pod: dict[str, Any]) -> None:
        self._put("pods", pod, "DELETED")

    def put_configmap(self, configmap: dict[str, Any]) -> None:
        key = f"{configmap['metadata']['namespace']}/{configmap['metadata']['name']}"
        self._put(
            "configmaps", configmap, "MODIFIED" if key in self.objects["configmaps"] else "ADDED"
        )

    def delete_configmap(self, namespace: str, name: str) -> None:
        configmap = self.objects["configmaps"][f"{namespace}/{name}"]
        self._put("configmaps", configmap, "DELETED")

    def gone(self) -> None:
        """The API server compacts its history: open watches get 410 Gone."""
        with self.lock:
            self.oldest = self.rv
            self.history.clear()
            for watcher in self.watchers:
                watcher.fault = "gone"
            self.lock.notify_all()

    def drop(self) -> None:
        """Every open watch is cut in the middle of a chunk."""
        with self.lock:
            for watcher in self.watchers:
                watcher.fault = "drop"
            self.lock.notify_all()

    def watches(self, kind: str) -> list[dict[str, list[str]]]:
        with self.lock:
            return [
                q for k, path, q in self.requests if k == "GET" and kind in path and "watch" in q
            ]

    def lists(self, kind: str) -> list[dict[str, list[str]]]:
        with self.lock:
            return [
                q
                for k, path, q in self.requests
                if k == "GET" and kind in path and "watch" not in q
            ]

    # -- HTTP ------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _refuse_if_down(self) -> bool:
                if api.down:
                    # An API server that does not answer: the connection closes unanswered.
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return True
                return False

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": message, "reason": reason, "code": code},
                )  # fmt: skip

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                with api.lock:
                    api.requests.append(("GET", url.path, query))
                if self._refuse_if_down():
                    return
                parts = url.path.strip("/").split("/")
                if parts[:3] == ["api", "v1", "pods"] and len(parts) == 3:
                    self._collection("pods", query, lambda key: True)
                elif parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["configmaps"]:
                    namespace = parts[3]
                    self._collection(
                        "configmaps", query, lambda key: key.startswith(namespace + "/")
                    )
                elif parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                    node = api.nodes.get(parts[3])
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
                    else:
                        self._send(200, node)
                else:
                    self._status(404, "NotFound", f"no route for {url.path}")

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with api.lock:
                    api.requests.append(("POST", url.path, {}))
                if self._refuse_if_down():
                    return
                parts = url.path.strip("/").split("/")
                if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["events"]:
                    if body.get("metadata", {}).get("namespace") not in (None, parts[3]):
                        self._status(400, "BadRequest", "namespace mismatch")
                        return
                    for field in ("involvedObject", "reason", "message", "type"):
                        if not body.get(field):
                            self._status(422, "Invalid", f"{field}: Required value")
                            return
                    with api.lock:
                        api.events.append(body)
                    self._send(201, body)
                else:
                    self._status(404, "NotFound", f"no route for {url.path}")

            def _selected(self, kind: str, query: dict[str, list[str]], scope: Any) -> Any:
                selector = (query.get("fieldSelector") or [""])[0]
                field, _, value = selector.partition("=")

                def matches(key: str, obj: dict[str, Any]) -> bool:
                    if not scope(key):
                        return False
                    if field == "spec.nodeName":
                        return obj.get("spec", {}).get("nodeName") == value
                    if field == "metadata.name":
                        return obj["metadata"]["name"] == value
                    return not field

                return matches

            def _collection(self, kind: str, query: dict[str, list[str]], scope: Any) -> None:
                matches = self._selected(kind, query, scope)
                if (query.get("watch") or [""])[0] not in ("true", "1"):
                    with api.lock:
                        items = [o for k, o in api.objects[kind].items() if matches(k, o)]
                        rv = api.rv
                    list_kind = "PodList" if kind == "pods" else "ConfigMapList"
                    self._send(
                        200,
                        {"kind": list_kind, "apiVersion": "v1",
                         "metadata": {"resourceVersion": str(rv)}, "items": items},
                    )  # fmt: skip
                    return
                self._watch(kind, query, matches)

            def _chunk(self, event: dict[str, Any]) -> None:
                data = (json.dumps(event) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, kind: str, query: dict[str, list[str]], matches: Any) -> None:
                since = int((query.get("resourceVersion") or ["0"])[0] or 0)
                timeout = float((query.get("timeoutSeconds") or ["30"])[0])
                bookmarks = (query.get("allowWatchBookmarks") or [""])[0] == "true"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.close_connection = True
                watcher = _Watcher(kind, "", self)
                end = time.monotonic() + timeout
                next_bookmark = time.monotonic() + api.bookmark_every_s
                with api.lock:
                    api.watchers.append(watcher)
                    if since < api.oldest:
                        watcher.fault = "gone"
                try:
                    while True:
                        with api.lock:
                            fault, watcher.fault = watcher.fault, None
                            pending = [
                                (rv, event, obj)
                                for rv, k, event, obj in api.history
                                if k == kind and rv > since
                            ]
                            current = api.rv
                            if api.down and fault is None:
                                fault = "drop"
                        if fault == "gone":
                            self._chunk(
                                {"type": "ERROR",
                                 "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                            "status": "Failure", "reason": "Expired", "code": 410,
                                            "message": f"too old resource version: {since} "
                                                       f"({api.oldest})"}}
                            )  # fmt: skip
                            break
                        if fault == "drop":
                            # A chunk that promises more than it brings, and the connection goes.
                            self.wfile.write(b'400\r\n{"type":"MODIF')
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        for rv, event, obj in pending:
                            key = (
                                f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
                            )
                            if matches(key, obj):
                                self._chunk({"type": event, "object": obj})
                            since = rv
                        now = time.monotonic()
                        if now >= end:
                            break
                        if bookmarks and now >= next_bookmark:
                            since = max(since, current)
                            self._chunk(
                                {"type": "BOOKMARK",
                                 "object": {"kind": "Pod" if kind == "pods" else "ConfigMap",
                                            "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(since)}}}
                            )  # fmt: skip
                            next_bookmark = now + api.bookmark_every_s
                        with api.lock:
                            api.lock.wait(timeout=0.05)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass  # the client went away
                finally:
                    with api.lock:
                        api.watchers.remove(watcher)

        return Handler
