"""Which GPUs the kubelet gave each pod: its pod-resources API, gRPC on a unix socket.

``v1.PodResourcesLister/List`` answers, for every pod on the node, each container's devices by
resource name; the NVIDIA device plugin's ``nvidia.com/gpu`` devices are GPU UUIDs
(``GPU-8f6f...``), or indexes where it runs with ``deviceIDStrategy=index``; a shared GPU
(time-slicing replicas) has a ``::N`` suffix. The messages are qpolicy's own
(``podresources.proto``), wire-compatible with the kubelet's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from qpolicy.errors import QPolicyError
from qpolicy.kube import podresources_pb2 as pb
from qpolicy.kube.pods import GPU_RESOURCE, resolve_gpus
from qpolicy.telemetry.gpus import GpuInfo

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SERVICE = "v1.PodResourcesLister"
LIST = f"/{SERVICE}/List"
# The kubelet answers from memory; a List that takes longer is a kubelet in trouble.
TIMEOUT_S = 5.0
# The kubelet's own limit on what it sends (podresources.DefaultMaxMsgSize, 16 MiB).
MAX_MESSAGE = 16 * 1024 * 1024


class PodResourcesError(QPolicyError):
    """The kubelet's pod-resources socket could not be asked."""


@dataclass(frozen=True, slots=True)
class PodGpus:
    """The GPUs of one pod, by index, and the device ids that name no GPU of this node."""

    indexes: tuple[int, ...]
    unresolved: tuple[str, ...] = ()


def gpu_devices(response: pb.ListPodResourcesResponse) -> dict[tuple[str, str], list[str]]:
    """(namespace, name) -> the ``nvidia.com/gpu`` device ids of its containers."""
    found: dict[tuple[str, str], list[str]] = {}
    for pod in response.pod_resources:
        ids = [
            device_id
            for container in pod.containers
            for device in container.devices
            if device.resource_name == GPU_RESOURCE
            for device_id in device.device_ids
        ]
        if ids:
            found[(pod.namespace, pod.name)] = ids
    return found


def pod_gpus(
    devices: Mapping[tuple[str, str], Sequence[str]], gpus: Sequence[GpuInfo]
) -> dict[tuple[str, str], PodGpus]:
    """Device ids mapped to this node's GPU indexes (UUIDs through ``gpus``)."""
    mapped: dict[tuple[str, str], PodGpus] = {}
    for key, ids in devices.items():
        indexes, problems = resolve_gpus(ids, gpus)
        mapped[key] = PodGpus(tuple(indexes), tuple(problems))
    return mapped


class PodResourcesClient:
    """Asks the kubelet's pod-resources socket; one channel, reused."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout_s: float = TIMEOUT_S) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE)],
        )
        self._list: Callable[..., pb.ListPodResourcesResponse] = self._channel.unary_unary(
            LIST,
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )

    def list_resources(self) -> pb.ListPodResourcesResponse:
        if not self.socket.exists():
            raise PodResourcesError(f"no kubelet pod-resources socket at {self.socket}")
        try:
            return self._list(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            details = error.details() if isinstance(error, grpc.Call) else str(error)
            name = code.name if code is not None else "error"
            raise PodResourcesError(
                f"pod-resources List on {self.socket}: {name}: {details}"
            ) from None

    def gpu_devices(self) -> dict[tuple[str, str], list[str]]:
        return gpu_devices(self.list_resources())

    def close(self) -> None:
        self._channel.close()
