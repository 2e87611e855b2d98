"""The kubelet's pod-resources API: qpolicy's proto, its generated module, and the client against
a real gRPC server on a unix socket (the kubelet's own cannot run here)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from qpolicy.kube import podresources_pb2 as pb
from qpolicy.kube.podresources import (
    LIST,
    SERVICE,
    PodGpus,
    PodResourcesClient,
    PodResourcesError,
    pod_gpus,
)
from qpolicy.kube.source import KubernetesSource
from qpolicy.telemetry.gpus import GpuInfo
from tests.unit.kube_double import FakeApiServer, pod_json
from tests.unit.test_kube_source import GPUS, UUID0, UUID1, client, make_cgroup, specs, until

ROOT = Path(__file__).resolve().parents[2]
PROTO = "qpolicy/kube/podresources.proto"


# ------------------------------------------------------------------ the generated module


def test_the_committed_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={out}",
         f"--pyi_out={out}", PROTO],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name in ("podresources_pb2.py", "podresources_pb2.pyi"):
        generated = (out / "qpolicy" / "kube" / name).read_text()
        committed = (ROOT / "qpolicy" / "kube" / name).read_text()
        assert committed == generated, (
            f"qpolicy/kube/{name} is not what {PROTO} generates: regenerate it (the command is "
            "in the proto's header)"
        )


# ------------------------------------------------------------------ wire compatibility


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    """One protobuf field: a varint (wire type 0) or length-delimited bytes (wire type 2)."""
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def kubelet_answer() -> bytes:
    """A ListPodResourcesResponse as the kubelet encodes it, written field by field from the
    field numbers of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, including fields
    qpolicy's proto leaves out (CPU ids, memory, topology, dynamic resources, pod-level CPUs).
    Checked once against the module protoc generates from the kubelet's api.proto (at
    kubernetes/kubelet 63b3249): it decodes these bytes to the message meant and encodes that
    message back to the same bytes."""
    numa = _field(1, _field(1, 1))  # TopologyInfo{nodes: [NUMANode{ID: 1}]}
    cpus = _varint(4) + _varint(5)  # repeated int64, packed as proto3 packs it
    gpu = (
        _field(1, b"nvidia.com/gpu")
        + _field(2, UUID1.encode())
        + _field(2, UUID0.encode())
        + _field(3, numa)
    )
    nic = _field(1, b"example.com/nic") + _field(2, b"nic-3")
    memory = _field(1, b"memory") + _field(2, 1 << 30) + _field(3, numa)  # ContainerMemory
    dynamic = _field(2, b"claim") + _field(3, b"ml")  # DynamicResource
    container = (
        _field(1, b"main")
        + _field(2, nic)
        + _field(2, gpu)
        + _field(3, cpus)  # cpu_ids
        + _field(4, memory)
        + _field(5, dynamic)
    )
    pod = _field(1, b"train-0") + _field(2, b"ml") + _field(3, container) + _field(4, cpus)
    other = _field(1, b"web-0") + _field(2, b"default") + _field(3, _field(1, b"nginx"))
    return _field(1, pod) + _field(1, other)


def test_the_kubelets_encoding_decodes_with_qpolicys_proto() -> None:
    answer = pb.ListPodResourcesResponse.FromString(kubelet_answer())
    train, web = answer.pod_resources
    assert (train.namespace, train.name, web.name) == ("ml", "train-0", "web-0")
    (container,) = train.containers
    assert container.name == "main"
    assert [(d.resource_name, list(d.device_ids)) for d in container.devices] == [
        ("example.com/nic", ["nic-3"]),
        ("nvidia.com/gpu", [UUID1, UUID0]),
    ]
    # And qpolicy's request is the kubelet's: an empty message, on the kubelet's method.
    assert pb.ListPodResourcesRequest().SerializeToString() == b""
    assert LIST == "/v1.PodResourcesLister/List"
    assert pb.DESCRIPTOR.package == "v1"
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == SERVICE
    assert service.methods_by_name["List"].input_type.full_name == "v1.ListPodResourcesRequest"


# ------------------------------------------------------------------ a kubelet on a unix socket


class Kubelet:
    """A gRPC server implementing List from qpolicy's proto, on a unix socket."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.answer = pb.ListPodResourcesResponse()
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def list_resources(request: Any, context: Any) -> pb.ListPodResourcesResponse:
            self.calls += 1
            return self.answer

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    list_resources,
                    request_deserializer=pb.ListPodResourcesRequest.FromString,
                    response_serializer=pb.ListPodResourcesResponse.SerializeToString,
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{socket}")

    def start(self) -> Kubelet:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    server = Kubelet(tmp_path / "kubelet.sock").start()
    yield server
    server.stop()


def devices(*ids: str, resource: str = "nvidia.com/gpu") -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids))


def test_the_client_maps_each_pods_gpu_uuids_to_indexes(kubelet: Kubelet) -> None:
    kubelet.answer = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="train-0",
                namespace="ml",
                containers=[
                    pb.ContainerResources(name="main", devices=[devices(UUID1)]),
                    pb.ContainerResources(
                        name="side", devices=[devices("nic-1", resource="example.com/nic")]
                    ),
                ],
            ),
            pb.PodResources(
                name="big-0",
                namespace="ml",
                containers=[pb.ContainerResources(name="a", devices=[devices(UUID1, UUID0)])],
            ),
            # Shared GPUs (time-slicing replicas) and index ids.
            pb.PodResources(
                name="shared-0",
                namespace="ml",
                containers=[pb.ContainerResources(name="a", devices=[devices(f"{UUID0}::3")])],
            ),
            pb.PodResources(
                name="by-index",
                namespace="ml",
                containers=[pb.ContainerResources(name="a", devices=[devices("1")])],
            ),
            pb.PodResources(
                name="elsewhere",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="a",
                        devices=[devices("GPU-" + "f" * 8 + "-ffff-ffff-ffff-" + "f" * 12)],
                    )
                ],
            ),
            pb.PodResources(name="web-0", namespace="default", containers=[]),
        ]
    )
    lister = PodResourcesClient(kubelet.socket)
    try:
        found = lister.gpu_devices()
    finally:
        lister.close()
    assert found[("ml", "train-0")] == [UUID1]
    assert ("default", "web-0") not in found
    mapped = pod_gpus(found, GPUS)
    assert mapped[("ml", "train-0")] == PodGpus((1,))
    assert mapped[("ml", "big-0")] == PodGpus((0, 1))
    assert mapped[("ml", "shared-0")] == PodGpus((0,))
    assert mapped[("ml", "by-index")] == PodGpus((1,))
    assert mapped[("ml", "elsewhere")].indexes == ()
    assert "no GPU of UUID" in mapped[("ml", "elsewhere")].unresolved[0]


def test_no_kubelet_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with pytest.raises(PodResourcesError, match="no kubelet pod-resources socket at"):
        PodResourcesClient(tmp_path / "none.sock").gpu_devices()
    # A socket nobody listens on (a kubelet that is down).
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead.sock"))
    lister = PodResourcesClient(tmp_path / "dead.sock", timeout_s=1)
    try:
        with pytest.raises(PodResourcesError, match=r"pod-resources List on .*: UNAVAILABLE"):
            lister.gpu_devices()
    finally:
        lister.close()
        dead.close()


def test_the_pod_source_takes_gpus_from_the_kubelet(kubelet: Kubelet, tmp_path: Path) -> None:
    api = FakeApiServer().start()
    cgroups = tmp_path / "cgroup"
    cgroups.mkdir()
    # No NVIDIA_VISIBLE_DEVICES: the kubelet alone says where these run.
    one = pod_json("one-0", annotations={"qpolicy.io/share": "30"}, limits={"nvidia.com/gpu": "1"})
    two = pod_json("two-0", annotations={"qpolicy.io/share": "30"}, limits={"nvidia.com/gpu": "2"})
    for pod in (one, two):
        api.add_pod(pod)
    one_cgroup, two_cgroup = make_cgroup(cgroups, one), make_cgroup(cgroups, two)
    kubelet.answer = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="one-0", namespace="ml",
                containers=[pb.ContainerResources(name="main", devices=[devices(UUID1)])],
            ),
        ]
    )  # fmt: skip
    gpus: list[GpuInfo] = list(GPUS)
    kube = KubernetesSource(
        client(api),
        "gpu-node-1",
        cgroup_root=lambda: cgroups,
        pod_resources=PodResourcesClient(kubelet.socket),
        gpus=lambda: gpus,
        backoff_s=(0.05, 0.3),
    ).start()
    try:
        until(lambda: one_cgroup in specs(kube), kube.refresh, "the first pod's GPU")
        assert specs(kube)[one_cgroup].gpu == 1
        # The second pod's devices are not known yet: it waits, and the kubelet is asked again.
        calls = kubelet.calls
        time.sleep(1.5)
        kube.refresh()
        assert two_cgroup not in specs(kube) and kubelet.calls > calls
        kubelet.answer.pod_resources.append(
            pb.PodResources(
                name="two-0", namespace="ml",
                containers=[pb.ContainerResources(name="main", devices=[devices(UUID1, UUID0)])],
            )
        )  # fmt: skip
        until(lambda: two_cgroup in specs(kube), kube.refresh, "the second pod's GPUs")
        assert specs(kube)[two_cgroup].gpu == 0  # two GPUs: governed on the lowest
    finally:
        kube.close()
        api.close()
