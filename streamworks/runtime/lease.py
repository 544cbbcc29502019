"""The member's local assignment lease (E1).

A member may process its shards only until the send time of its last successful
heartbeat plus the lease TTL minus a safety margin (monotonic clock), so it stops
before the coordinator can hand its shards to someone else.
"""

from __future__ import annotations

import asyncio

from streamworks.clock import Clock

__all__ = ("Lease",)


class Lease:
    """A deadline on the monotonic clock, renewed by the assignment source."""

    def __init__(self, deadline: float = 0.0, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self._deadline = deadline
        self._renewed = asyncio.Event()
        self._changed = asyncio.Event()
        self.renewals = 0
        self.losses = 0

    @property
    def deadline(self) -> float:
        return self._deadline

    def valid(self) -> bool:
        return self.clock.monotonic() < self._deadline

    def remaining(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self._deadline - self.clock.monotonic()

    def renew(self, deadline: float) -> None:
        """Extend (or shorten) the lease to ``deadline`` (on :attr:`clock`)."""
        self._deadline = deadline
        self.renewals += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if self.valid():
            self._renewed.set()

    def expire(self) -> None:
        """End the lease now (e.g. the member was fenced)."""
        self._deadline = 0.0
        self._changed.set()
        self._changed = asyncio.Event()

    def recheck(self) -> None:
        """Wake whoever waits on this lease to look at the clock again (the clock was
        moved, e.g. ``TestRuntime.advance``)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self) -> None:
        """Wait for the next renewal or expiry."""
        await self._changed.wait()

    async def wait_valid(self) -> None:
        """Wait until the lease is valid again."""
        while not self.valid():
            self._renewed.clear()
            await self._renewed.wait()
