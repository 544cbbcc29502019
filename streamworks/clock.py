"""Time sources, injectable so tests can fast-forward (``TestRuntime.advance``).

In production every clock's offset stays 0. Every protocol time of the runtime is
read through the worker's :class:`Clock`: member leases, routing leases, retry
backoffs, the dispatcher's parks and the reader's error backoff are
``Clock.monotonic()``; retry records, retention cut-offs and dead-letter timestamps
are ``Clock.time()`` (wall clock, shared with other members); coordinator deadlines
are Redis server time plus :attr:`Clock.offset_ms`; the coordinator's loop, its sleeps
and backoffs are its ``Clock``'s too. What bounds real work stays in real time: handler
timeouts, the shutdown timeout, connection attempts; what Redis times itself (a mutex's
TTL, the brackets of a ``TIME`` reading) is measured with :func:`boottime`. Ruff's
banned-API rule (``pyproject.toml``) keeps ``time.monotonic``, ``time.time`` and
``anyio.sleep`` out of the coordinator and the runtime.

``Clock.monotonic()`` counts the time a host spends suspended (:func:`boottime`):
``time.monotonic()`` stops while a laptop, a VM or a container host sleeps, and a
member resumed after its lease would believe the lease still valid. Linux:
``CLOCK_BOOTTIME``. macOS (and other systems with ``clock_gettime`` but no
``CLOCK_BOOTTIME``): ``CLOCK_MONOTONIC``, which macOS keeps counting in sleep.
Elsewhere (Windows): ``time.monotonic()``, which may not; the coordinator's expiry and
the fenced reads then bound what a resumed member can do (``docs/guarantees.md``).

Moving the offset forward (:meth:`Clock.advance`) makes every lease, deadline and
backoff come due at once, without sleeping. Waiting respects that: code that waits
for a point in clock time uses :meth:`Clock.sleep_until` / :meth:`Clock.move_on_at`
or registers an :meth:`Clock.on_advance` callback that re-checks its timers, so an
advance past the deadline ends the wait at once. Reading the clock costs one
``clock_gettime`` (or ``time.time()``) call plus an addition, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial

import anyio

__all__ = ("Clock", "boottime")


def _suspend_aware() -> Callable[[], float]:
    """The reader of the clock that counts suspend (a partial: one C call per read)."""
    if not hasattr(time, "clock_gettime"):
        return time.monotonic
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        clock_id = getattr(time, "CLOCK_MONOTONIC", None)
    return time.monotonic if clock_id is None else partial(time.clock_gettime, clock_id)


#: Seconds since an arbitrary point, counting suspend (see the module docstring).
boottime: Callable[[], float] = _suspend_aware()


class Clock:
    """Monotonic and wall time with an adjustable offset (seconds)."""

    __slots__ = ("_listeners", "offset")

    def __init__(self) -> None:
        self.offset = 0.0
        # Called on every advance: timers of parked work and sleepers re-check the clock.
        self._listeners: set[Callable[[], None]] = set()

    def monotonic(self) -> float:
        """:func:`boottime` plus the offset: leases, backoffs, parks."""
        return boottime() + self.offset

    def time(self) -> float:
        """``time.time()`` plus the offset: wall-clock times written to Redis."""
        return time.time() + self.offset

    def time_ms(self) -> int:
        """:meth:`time` in whole milliseconds."""
        return int((time.time() + self.offset) * 1000)

    @property
    def offset_ms(self) -> int:
        return int(self.offset * 1000)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (tests only) and wake everything waiting on
        this clock, so it re-checks its deadlines."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.offset += seconds
        for listener in tuple(self._listeners):
            listener()

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously, in the advancing task) after every
        :meth:`advance`. Returns a function that unregisters it."""
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    @contextmanager
    def move_on_at(self, deadline: float) -> Iterator[anyio.CancelScope]:
        """A cancel scope that ends its block when :meth:`monotonic` reaches
        ``deadline``, in real time or because the clock was advanced past it."""
        left = deadline - self.monotonic()
        scope = anyio.CancelScope(deadline=anyio.current_time() + max(0.0, left))

        def check() -> None:
            if self.monotonic() >= deadline:
                scope.cancel()

        self._listeners.add(check)
        try:
            with scope:
                yield scope
        finally:
            self._listeners.discard(check)

    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        """:meth:`move_on_at` ``seconds`` from now."""
        return self.move_on_at(self.monotonic() + seconds)

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until :meth:`monotonic` reaches ``deadline``; an :meth:`advance` past it
        ends the sleep at once."""
        with self.move_on_at(deadline):
            await anyio.sleep_forever()

    async def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` of this clock's time (see :meth:`sleep_until`)."""
        await self.sleep_until(self.monotonic() + seconds)
