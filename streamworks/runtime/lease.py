"""The member's local assignment lease (E1, docs/guarantees.md#exclusive-processing).

A member may *start* handler runs on its shards only until a deadline counted from
the send time of its last successful heartbeat (monotonic clock), and every run must
have ended before the coordinator can expire it and hand its shards to someone else:
``deadlines.py`` has the arithmetic, ``ownership.py`` enforces it.
"""

from __future__ import annotations

import asyncio

from streamworks.clock import Clock
from streamworks.runtime.deadlines import Deadlines

__all__ = ("Lease",)


class Lease:
    """The deadlines of the current lease, renewed by the assignment source.

    Args:
        deadline: the initial start-work deadline (0: not valid until renewed).
        clock: the monotonic clock the deadlines are on.
        grace: ``worker.lease_grace``: how long before the cancel point no new run
            starts (and how long a hand-set lease lets runs go on past its deadline);
            None: ``deadlines.DEFAULT_GRACE`` where it fits.
        drift: ``worker.lease_drift``: the clock-rate difference allowed for.
    """

    def __init__(
        self,
        deadline: float = 0.0,
        clock: Clock | None = None,
        *,
        grace: float | None = None,
        drift: float = 0.01,
    ) -> None:
        self.clock = clock or Clock()
        self.grace = grace
        self.drift = drift
        #: The current lease's deadlines (replaced, never changed, on renewal or expiry):
        #: a plain attribute, read per handler run on the hot path (execution.py).
        self.deadlines = Deadlines.fixed(deadline, grace)
        self._renewed = asyncio.Event()
        self._changed = asyncio.Event()
        self.renewals = 0
        self.losses = 0
        self.fail_stops = 0

    @property
    def deadline(self) -> float:
        """Until when new runs may start (and shards be read)."""
        return self.deadlines.start_until

    def valid(self) -> bool:
        """Whether new runs may start now."""
        return self.clock.monotonic() < self.deadlines.start_until

    def held(self) -> bool:
        """Whether the lease has not expired yet (the coordinator cannot have moved the
        shards): a run ending now may still settle its message."""
        return self.clock.monotonic() < self.deadlines.expires_at

    def remaining(self) -> float:
        """Seconds until the start-work deadline (negative once passed)."""
        return self.deadlines.start_until - self.clock.monotonic()

    def renew(self, deadline: float) -> None:
        """Set a hand-made lease: start work until ``deadline`` (on :attr:`clock`),
        cancel running async handlers ``grace`` later, never fail-stop."""
        self._set(Deadlines.fixed(deadline, self.grace))

    def renew_after_heartbeat(self, sent: float, ttl: float, margin: float) -> None:
        """Renew from a successful heartbeat sent at ``sent`` that granted a lease of
        ``ttl`` seconds (``margin``: one heartbeat interval)."""
        self._set(
            Deadlines.after_heartbeat(sent, ttl, margin=margin, grace=self.grace, drift=self.drift)
        )

    def _set(self, deadlines: Deadlines) -> None:
        self.deadlines = deadlines
        self.renewals += 1
        self._signal()
        if self.valid():
            self._renewed.set()

    def expire(self) -> None:
        """End the lease now (the member was fenced or is unknown): nothing starts,
        running async handlers are cancelled, and the old lease's fail-stop point
        stays (the coordinator may hand the shards on when that lease expires)."""
        self.deadlines = self.deadlines.ended(self.clock.monotonic())
        self._signal()

    def recheck(self) -> None:
        """Wake whoever waits on this lease to look at the clock again (the clock was
        moved, e.g. ``TestRuntime.advance``)."""
        self._signal()

    def _signal(self) -> None:
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
