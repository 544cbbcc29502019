"""The write discipline: every mutation runs in a critical section (PROTOCOL §3).

A critical section is the local gate (refused with ``COORDINATOR_TERMINATING`` once
this replica terminates, E4), the Redis mutex, and a body that is shielded from
cancellation, so a terminating replica finishes what it started. Inside it the
caller loads the metadata and its ``storeRevision``, lets the core decide, and
commits with a compare-and-set; a lost CAS reloads and retries, bounded, then
answers ``CONFLICT`` (retryable).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from streamworks.coordinator.store import Store, Terminating

__all__ = ("WriteDiscipline",)


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
    async def critical(self, mutex_key: str) -> AsyncIterator[None]:
        """A critical section on ``mutex_key``: gate, local lock, mutex, shielded body,
        release.

        Raises:
            Terminating: the replica is terminating (nothing was started).
            MutexTimeout: the Redis mutex stayed taken.
        """
        if self.terminating:
            raise Terminating()
        async with self.lock(mutex_key), self.locked(mutex_key):
            yield

    @contextlib.asynccontextmanager
    async def locked(self, mutex_key: str) -> AsyncIterator[None]:
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
                async with self.store.mutex(mutex_key):
                    yield
        finally:
            self._inflight -= 1
            if self.terminating and self._inflight == 0:
                self._drained.set()

    async def terminate(self, timeout: float = 10.0) -> None:
        """Enter terminating mode (E4) and wait for in-flight critical sections."""
        self.terminating = True
        if self._inflight == 0:
            return
        with anyio.move_on_after(timeout):
            await self._drained.wait()
