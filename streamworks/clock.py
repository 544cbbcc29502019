"""Time sources, injectable so tests can fast-forward (``TestRuntime.advance``).

Production code uses one shared :class:`Clock` whose offset stays 0. Coordinator
deadlines are Redis server time plus the offset; member leases and routing leases
are ``time.monotonic()`` plus the offset. Moving the offset forward makes every
lease and deadline come due at once, without sleeping.
"""

from __future__ import annotations

import time

__all__ = ("Clock",)


class Clock:
    """Monotonic time with an adjustable offset (seconds)."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    @property
    def offset_ms(self) -> int:
        return int(self.offset * 1000)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (tests only)."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.offset += seconds
