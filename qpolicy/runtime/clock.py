"""The protocols of time: what a control loop or a slice scheduler needs of the loop it runs on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Timer:
    """A scheduled callback; cancelling it leaves a tombstone the loop skips.

    ``slack`` is how much earlier than ``when`` it may run if the loop is awake anyway (a loop
    that honours it saves a wake-up; the virtual loop runs everything on time)."""

    __slots__ = ("callback", "slack", "when")

    def __init__(self, when: float, callback: Callable[[], None], slack: float = 0.0) -> None:
        self.when = when
        self.callback: Callable[[], None] | None = callback
        self.slack = slack

    def cancel(self) -> None:
        self.callback = None

    @property
    def pending(self) -> bool:
        return self.callback is not None


class Repeating:
    """A handle on a loop's ``every``; :meth:`cancel` stops it."""

    def __init__(self) -> None:
        self.cancelled = False
        self.timer: Timer | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time in microseconds and one-shot timers."""

    @property
    def now(self) -> float: ...

    def at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...


class Loop(Protocol):
    """What runs on a loop thread needs of it (the real one, or a virtual one in tests)."""

    @property
    def now(self) -> float: ...

    def at(self, when: float, callback: Callable[[], None]) -> Timer: ...

    def every(self, interval_us: float, callback: Callable[[], None]) -> Repeating: ...
