"""The one error of the kmod enforcer's layers."""

from __future__ import annotations

from qpolicy.errors import QPolicyError


class KmodError(QPolicyError):
    """qgpu.ko is absent, refused a command, or answered what this qpolicy cannot read.

    ``errno`` is the kernel's error number when the module refused a command.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.errno = code
