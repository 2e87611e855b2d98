"""Timers for tests of work done in slices: time that moves by the reading, not by this
machine's speed."""

from __future__ import annotations


class Stepping:
    """A timer that moves ``step`` seconds each time it is read: work measured in reads."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now
