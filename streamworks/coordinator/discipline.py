"""The write discipline: every mutation runs in a critical section.

See docs/protocol.md#write-discipline.

A critical section is the local gate (refused with ``COORDINATOR_TERMINATING`` once
this replica terminates, E4), the Redis mutex, and a body that is shielded from
cancellation, so a terminating replica finishes what it started. Inside it the
caller loads the metadata and its ``storeRevision``, lets the core decide, and
commits with a compare-and-set; a lost CAS reloads and retries, bounded, then
answers ``CONFLICT`` (retryable).

The mutex expires (``mutex_ttl``) so that a replica that dies holding it does not
stop the others for long. A *long* operation — an unsubscribe over every shard of a
stream, a drain check of every removed shard, a scale-out creating thousands of shards —
can outlast that TTL, and its CAS does not protect the data-plane writes it makes step
by step (another replica's scale-out would create a consumer group on new shards
behind an unsubscribe's back). So a section opened with ``renew=True`` keeps its mutex
for as long as it runs: a task extends it every third of the TTL, only while it still
holds our token (``mutex_renew.lua``), and the operation calls
:meth:`Exclusion.check` before each step, which fails (:class:`MutexLost`, retryable)
once the mutex was lost or could not be confirmed in time — a fenced mutex: no step
starts without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio

from streamworks.clock import boottime
from streamworks.coordinator.store import Conflict, MutexHold, Store, Terminating

__all__ = ("Exclusion", "MutexLost", "WriteDiscipline")

log = logging.getLogger("streamworks.coordinator")

#: Share of the mutex TTL kept in hand: a step is not started later than this before
#: the expiry last confirmed (Redis may count the TTL from a little earlier than the
#: reply reaches us; a clock-rate difference too).
_MARGIN = 0.2


class MutexLost(Conflict):
    """A long operation lost its mutex (it expired during a pause, or could not be
    renewed in time): it stopped before its next step. Retry it."""


class Exclusion:
    """A mutex held by a critical section. :meth:`check` (no round trip) or
    :meth:`verify` (one, extending it) before each step of a long operation: they raise
    once the mutex is not known to be ours any more."""

    def __init__(self, hold: MutexHold, store: Store) -> None:
        self.key = hold.key
        self.token = hold.token
        self.ttl = hold.ttl
        self.lost = False
        self._valid_until = hold.sent + hold.ttl * (1 - _MARGIN)
        self._store = store
        self.renewals = 0

    async def renew(self) -> bool:
        """Extend the mutex if it is still ours (``mutex_renew.lua``); whether it was.
        Marks it lost when it was not."""
        sent = boottime()
        ours = await self._store.scripts.mutex_renew(
            keys=[self.key], args=[self.token, max(1, int(self.ttl * 1000))]
        )
        if not int(ours):
            if not self.lost:
                log.error("mutex %s was lost while held; the operation stops", self.key)
            self.lost = True
            return False
        self.confirm(sent)
        return True

    async def verify(self) -> None:
        """:meth:`check`, after confirming (and extending) the mutex in Redis: before a
        step that must not run without it.

        Raises:
            MutexLost: it is not ours.
        """
        await self.renew()
        self.check()

    def confirm(self, sent: float) -> None:
        """The mutex was extended by a request sent at ``sent`` (``boottime()``)."""
        self._valid_until = max(self._valid_until, sent + self.ttl * (1 - _MARGIN))
        self.renewals += 1

    def check(self) -> None:
        """Raise :class:`MutexLost` unless the mutex is still known to be ours."""
        if self.lost:
            raise MutexLost(f"{self.key}: the mutex was taken over; the operation stopped")
        if boottime() > self._valid_until:
            raise MutexLost(f"{self.key}: the mutex could not be renewed in time; stopped")


class WriteDiscipline:
    """The gate and critical sections of one replica."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.terminating = False
        self._inflight = 0
        self._drained = anyio.Event()
        self._local_locks: dict[str, anyio.Lock] = {}

    def lock(self, mutex_key: str) -> anyio.Lock:
        """The local lock of ``mutex_key``: requests for the same key queue on it first,
        so a burst (a fleet of workers joining at once) takes the Redis mutex one at a
        time instead of all polling it; the Redis mutex then only arbitrates between
        replicas. A holder may serve the requests queued behind it (``batching.py``)."""
        return self._local_locks.setdefault(mutex_key, anyio.Lock())

    @contextlib.asynccontextmanager
    async def critical(self, mutex_key: str, *, renew: bool = False) -> AsyncIterator[Exclusion]:
        """A critical section on ``mutex_key``: gate, local lock, mutex, shielded body,
        release.

        Args:
            renew: keep the mutex for as long as the body runs (a long operation, which
                calls :meth:`Exclusion.check` before each step).

        Raises:
            Terminating: the replica is terminating (nothing was started).
            MutexTimeout: the Redis mutex stayed taken.
        """
        if self.terminating:
            raise Terminating()
        async with self.lock(mutex_key), self.locked(mutex_key, renew=renew) as held:
            yield held

    @contextlib.asynccontextmanager
    async def locked(self, mutex_key: str, *, renew: bool = False) -> AsyncIterator[Exclusion]:
        """The rest of a critical section, for a caller holding :meth:`lock`: the gate
        once more (still before anything started), then the Redis mutex and the body,
        shielded from cancellation so a terminating replica finishes what it started.

        Raises:
            Terminating: the replica is terminating (nothing was started).
            MutexTimeout: the Redis mutex stayed taken.
        """
        if self.terminating:
            raise Terminating()
        self._inflight += 1
        try:
            with anyio.CancelScope(shield=True):
                async with self.store.mutex(mutex_key) as hold:
                    held = Exclusion(hold, self.store)
                    if not renew:
                        yield held
                        return
                    error: BaseException | None = None
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._renew, held)
                        try:
                            yield held
                        except BaseException as e:  # raised as itself, not in a group
                            error = e
                        finally:
                            tg.cancel_scope.cancel()
                    if error is not None:
                        raise error
        finally:
            self._inflight -= 1
            if self.terminating and self._inflight == 0:
                self._drained.set()

    async def _renew(self, held: Exclusion) -> None:
        """Extend ``held`` every third of its TTL while it is ours; mark it lost when it
        is not (never raises: the body decides, through :meth:`Exclusion.check`)."""
        while not held.lost:
            await self.store.clock.sleep(held.ttl / 3)
            try:
                await held.renew()
            except Exception as e:  # a failed renewal: the next may succeed in time
                log.warning("could not renew mutex %s: %s", held.key, e)

    async def terminate(self, timeout: float = 10.0) -> None:
        """Enter terminating mode (E4) and wait for in-flight critical sections."""
        self.terminating = True
        if self._inflight == 0:
            return
        with anyio.move_on_after(timeout):
            await self._drained.wait()
