"""The desired-state file as the daemon reads it: re-read when it changes, never trusted blindly.

The CLI replaces the file atomically and refuses what does not fit, but the file can still be
edited by hand, truncated by a full disk, or written by a newer qpolicy. A file that cannot be read
marks the source down, keeps the last good state and is logged once per distinct problem (not at
every tick); the next good version is taken as soon as it appears.
"""

from __future__ import annotations

import logging

from qpolicy.errors import QPolicyError
from qpolicy.state import DesiredState, StateStore

log = logging.getLogger(__name__)


class StateFileSource:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.state = DesiredState()
        self.up = False
        self.error: str | None = None
        self._seen: tuple[float, int, int] | None = None

    def refresh(self) -> bool:
        """Re-read if the file changed; True when the state may have changed."""
        try:
            stat = self.store.path.stat()
            stamp = (stat.st_mtime, stat.st_ino, stat.st_size)
        except FileNotFoundError:
            stamp = (0.0, 0, 0)
        except OSError as error:
            return self._failed(f"cannot read {self.store.path}: {error.strerror}")
        if stamp == self._seen and self.up:
            return False
        try:
            state = self.store.load()
        except QPolicyError as error:
            return self._failed(str(error))
        if self.error is not None:
            log.info("%s can be read again", self.store.path)
        self.state, self.up, self.error, self._seen = state, True, None, stamp
        return True

    def _failed(self, message: str) -> bool:
        if message != self.error:
            log.warning("%s; keeping the last good desired state", message)
        self.up, self.error = False, message
        return False
