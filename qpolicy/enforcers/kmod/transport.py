"""Carrying qgpu messages to the module: the generic netlink socket, or a stand-in in tests."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any, Protocol

from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.uapi import GENL_NAME, QgpuMsg


class Transport(Protocol):
    """Carries qgpu messages to the module and its answers back.

    Refusals are raised as pyroute2's ``NetlinkError`` (``code`` is the errno), as the kernel's
    netlink acknowledgements carry them.
    """

    def request(self, message: QgpuMsg, *, dump: bool) -> Sequence[QgpuMsg]:
        """Send ``message``: a dump returns every answer, anything else is acknowledged."""
        ...

    def subscribe(self, group: str) -> None: ...

    def receive(self) -> Sequence[QgpuMsg]:
        """Wait for multicast messages of the groups subscribed to."""
        ...

    def close(self) -> None: ...


class NetlinkTransport:
    """A generic netlink socket bound to the ``qgpu`` family.

    ``family`` and ``message_class`` default to qgpu's; the tests point them at the kernel's own
    ``nlctrl`` family to exercise the socket without the module.
    """

    def __init__(self, family: str = GENL_NAME, message_class: type[Any] = QgpuMsg) -> None:
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.generic import GenericNetlinkSocket

        try:
            # Extended acks carry the module's reason for a refusal (NL_SET_ERR_MSG).
            self._socket: Any = GenericNetlinkSocket(ext_ack=True)
        except OSError as error:
            raise KmodError(f"cannot open a generic netlink socket: {error}") from None
        # pyroute2 logs a missing family as an error of its own; KmodError says it better.
        self._socket.asyncore.module_err_level = "debug"
        try:
            self._socket.bind(family, message_class)
        except NetlinkError as error:
            self._socket.close()
            if error.code == errno.ENOENT:
                raise KmodError(
                    f"qgpu.ko is not loaded: no generic netlink family {family!r}",
                    errno.ENOENT,
                ) from None
            raise KmodError(f"cannot look up generic netlink family {family!r}: {error}") from None

    def request(self, message: QgpuMsg, *, dump: bool) -> Sequence[QgpuMsg]:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST

        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        prid = self._socket.prid
        answers = self._socket.nlm_request(message, msg_type=prid, msg_flags=flags)
        return [answer for answer in answers if answer["header"]["type"] == prid]

    def subscribe(self, group: str) -> None:
        try:
            self._socket.add_membership(group)
        except KeyError:
            raise KmodError(f"qgpu.ko has no multicast group {group!r}") from None

    def receive(self) -> Sequence[QgpuMsg]:
        prid = self._socket.prid
        return [answer for answer in self._socket.get() if answer["header"]["type"] == prid]

    def close(self) -> None:
        self._socket.close()
