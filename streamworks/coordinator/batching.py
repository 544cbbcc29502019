"""Group commit: the requests of one key that queue up behind its critical section are
served together by whoever takes the section next.

A request joins its key's queue and waits on the key's local lock
(``WriteDiscipline.lock``). The task that gets the lock and finds its own request still
queued takes the queue (at most ``max_batch`` requests, oldest first; its own is among
them, since everything older was taken by earlier holders) and runs *one* critical
section for all of them: the gate (E4: a terminating replica refuses the whole batch
with ``COORDINATOR_TERMINATING``), the Redis mutex, and the caller's batch function,
shielded from cancellation. Each request then gets its own outcome; the waiters it
served are woken at once (their wait on the lock is cancelled), so none of them
queues on the lock just to find it was answered.

A request whose caller gives up before a holder took it leaves the queue and was
never started; once taken, it is finished like any section past the gate.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio

from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.store import Conflict, Terminating

__all__ = ("Combiner",)

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

#: Requests served by one critical section at most, so one section stays well under the
#: mutex TTL however long the queue grows (the rest are served by the next holder).
DEFAULT_MAX_BATCH = 256


class _Waiter(Generic[Item, Outcome]):
    __slots__ = ("error", "item", "result", "scope", "taken")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.scope = anyio.CancelScope()
        self.taken = False
        self.result: Outcome | None = None
        self.error: BaseException | None = None

    def outcome(self) -> Outcome:
        if self.error is not None:
            raise self.error
        assert self.taken  # a served waiter has its result or its error
        return self.result  # type: ignore[return-value]


BatchFunction = Callable[[str, Sequence[Item]], Awaitable[Sequence[Outcome | Exception]]]


class Combiner(Generic[Item, Outcome]):
    """Serves the requests of each key in batches, one critical section per batch."""

    def __init__(
        self,
        discipline: WriteDiscipline,
        run: BatchFunction[Item, Outcome],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        """
        Args:
            discipline: the replica's write discipline (gate, locks, mutexes).
            run: ``run(key, items)`` runs inside the critical section and returns one
                outcome per item, in order: a result, or the exception that item's
                caller gets. An exception it raises goes to every item.
            max_batch: the most items one critical section serves.
            on_batch: called with the size of every batch (metrics).
        """
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.discipline = discipline
        self.run = run
        self.max_batch = max_batch
        self.on_batch = on_batch
        self._queues: dict[str, deque[_Waiter[Item, Outcome]]] = {}

    def queued(self, key: str) -> int:
        """How many requests of ``key`` wait to be taken by a holder."""
        return len(self._queues.get(key, ()))

    async def submit(self, key: str, mutex_key: str, item: Item) -> Outcome:
        """``item``'s outcome, decided in a critical section on ``mutex_key`` together
        with the items of ``key`` queued at the same time.

        Raises:
            Terminating: the replica is terminating (``item`` was not started).
            Exception: whatever the batch function gave ``item``, or raised.
        """
        if self.discipline.terminating:
            raise Terminating()
        queue = self._queues.setdefault(key, deque())
        waiter: _Waiter[Item, Outcome] = _Waiter(item)
        queue.append(waiter)
        try:
            # Cancelled by the holder that serves this item, while it waits on the lock.
            with waiter.scope:
                async with self.discipline.lock(mutex_key):
                    if not waiter.taken:
                        await self._serve(key, mutex_key, queue, waiter)
        finally:
            if not waiter.taken:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)  # its caller gave up: it never started
            if not queue and self._queues.get(key) is queue:
                del self._queues[key]
        return waiter.outcome()

    async def _serve(
        self,
        key: str,
        mutex_key: str,
        queue: deque[_Waiter[Item, Outcome]],
        holder: _Waiter[Item, Outcome],
    ) -> None:
        batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
        for waiter in batch:
            waiter.taken = True
        assert holder in batch  # everything queued before it was taken by earlier holders
        if self.on_batch is not None:
            self.on_batch(len(batch))
        outcomes: Sequence[Outcome | Exception] | None = None
        try:
            async with self.discipline.locked(mutex_key):
                outcomes = await self.run(key, [w.item for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"batch of {len(batch)} got {len(outcomes)} outcomes")
        except Exception as e:  # Terminating, MutexTimeout, Redis errors: for every item
            outcomes = [e] * len(batch)
        finally:
            if outcomes is None:  # interrupted (not an Exception): the others may retry
                outcomes = [Conflict("the critical section was interrupted; retry")] * len(batch)
            for waiter, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    waiter.error = outcome
                else:
                    waiter.result = outcome
                if waiter is not holder:
                    waiter.scope.cancel()
