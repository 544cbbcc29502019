"""Forming a batch handler's batches from its ordering lanes.

The batch counterpart of :class:`~streamworks.runtime.dispatcher.Dispatcher` (the same
interface for the readers and the worker: ``submit``, ``discard``, ``run``,
``wait_quiet``). Messages queue per lane (a key, or a shard with ``ordering="shard"``;
none with ``ordering="none"`` or no key). A batch takes, lane after lane, the messages
at the front of every lane that has none in flight, consecutive and in stream order,
skipping a lane at its first message that must still wait (a retry's backoff): so a
lane's later messages never run before, or beside, an earlier one (per-key order
across batches), and shard-ordered batching is not one message per shard.

A batch starts when ``max_size`` messages are ready, or ``max_wait`` after the first
of them became ready (on the worker's clock: ``TestRuntime.advance`` moves it), with at
most ``concurrency`` batches in flight. After the run, each item is settled, or put
back at the front of its lane: a failed item with its retry due time, a *released* one
(after its lane's failure, not run as its turn) as it is.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

import anyio

from streamworks.batch import Batch
from streamworks.clock import Clock
from streamworks.runtime.dispatcher import Outcome
from streamworks.runtime.handler import Ordering
from streamworks.runtime.metrics import BATCH_BUCKETS, FastHistogram

if TYPE_CHECKING:
    from streamworks.runtime.message import Message

__all__ = ("RELEASED", "BatchDispatcher", "BatchStatistics", "ItemResult")

log = logging.getLogger("streamworks.batch")


class _Released:
    def __repr__(self) -> str:
        return "RELEASED"


#: An item's result: run again after its lane's failed item, not as an attempt.
RELEASED = _Released()
#: What processing a batch tells about each item: settled (None), a due time, or RELEASED.
ItemResult = Outcome | _Released
#: Bounds (s) of the batch-wait histogram.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class BatchStatistics:
    """Batch sizes, waits and item outcomes of one batch handler (``streamworks_batch_*``)."""

    __slots__ = ("items", "sizes", "waits")

    def __init__(self) -> None:
        self.sizes = FastHistogram(BATCH_BUCKETS)
        self.waits = FastHistogram(WAIT_BUCKETS)  # first item ready -> batch start
        self.items: dict[str, int] = {"ack": 0, "failed": 0, "released": 0}


class BatchDispatcher:
    """Runs one batch handler's messages in batches, lanes in order."""

    def __init__(
        self,
        ordering: Ordering,
        batch: Batch,
        concurrency: int,
        process: Callable[[list[Message]], Awaitable[Sequence[ItemResult]]],
        drop: Callable[[Message], None],
        clock: Clock,
    ) -> None:
        self._ordering = ordering
        self._batch = batch
        self._concurrency = concurrency
        self._process = process
        self._drop = drop
        self._clock = clock
        self._lanes: dict[Hashable, deque[Message]] = {}
        self._free: deque[Message] = deque()  # messages of no lane
        self._in_flight: set[Hashable] = set()  # lanes with a message in a running batch
        self._running: set[Message] = set()
        self._batches = 0
        self._first_ready: float | None = None
        self._changed = asyncio.Event()
        self._quiet = asyncio.Event()
        self.statistics = BatchStatistics()

    @property
    def running(self) -> int:
        """Messages in a batch whose handler is running now."""
        return len(self._running)

    @property
    def parked(self) -> int:
        """Queued messages waiting for a due time (a retry backoff)."""
        now = self._clock.monotonic()
        queued = [*self._free, *(m for q in self._lanes.values() for m in q)]
        return sum(1 for m in queued if m.due > now)

    def _lane(self, message: Message) -> Hashable | None:
        if self._ordering == "key":
            return message.key
        if self._ordering == "shard":
            return message.shard
        return None

    # -- feeding -------------------------------------------------------------------
    def submit(self, messages: Iterable[Message]) -> None:
        """Queue messages; within a lane they run in this order."""
        for message in messages:
            lane = self._lane(message)
            if lane is None:
                self._free.append(message)
            else:
                self._lanes.setdefault(lane, deque()).append(message)
        self._changed.set()

    def discard(self, keep: Callable[[Message], bool]) -> int:
        """Drop every queued message for which ``keep`` is false (they stay pending in
        Redis); messages of a running batch finish as usual. Returns how many."""
        dropped = 0
        for queue in [self._free, *self._lanes.values()]:
            kept = [m for m in queue if keep(m)]
            if len(kept) != len(queue):
                for message in queue:
                    if not keep(message):
                        self._drop(message)
                        dropped += 1
                queue.clear()
                queue.extend(kept)
        for lane in [lane for lane, q in self._lanes.items() if not q]:
            del self._lanes[lane]
        self._changed.set()
        return dropped

    # -- forming batches -------------------------------------------------------------
    def _ready(self, now: float, limit: int) -> tuple[int, float]:
        """How many messages could go in a batch now (at most ``limit``), and when the
        earliest one that must wait is due (inf: none)."""
        ready, next_due = 0, math.inf
        for message in self._free:
            if message.due > now:
                next_due = min(next_due, message.due)
            else:
                ready += 1
                if ready >= limit:
                    return ready, next_due
        for lane, queue in self._lanes.items():
            if lane in self._in_flight:
                continue
            for message in queue:
                if message.due > now:
                    next_due = min(next_due, message.due)
                    break
                ready += 1
                if ready >= limit:
                    return ready, next_due
        return ready, next_due

    def _take(self, now: float) -> list[Message]:
        size = self._batch.max_size
        batch: list[Message] = []
        if self._free:
            later: deque[Message] = deque()
            for message in self._free:
                if len(batch) < size and message.due <= now:
                    batch.append(message)
                else:
                    later.append(message)
            self._free = later
        for lane, queue in list(self._lanes.items()):
            if len(batch) >= size:
                break
            if lane in self._in_flight:
                continue
            taken = False
            while queue and len(batch) < size and queue[0].due <= now:
                batch.append(queue.popleft())
                taken = True
            if taken:
                self._in_flight.add(lane)
            if not queue:
                del self._lanes[lane]
        return batch

    async def run(self) -> None:
        """Form and run batches until cancelled."""
        stop = self._clock.on_advance(self._changed.set)
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    await self._next_batch(tg)
        finally:
            stop()

    async def _next_batch(self, tg: anyio.abc.TaskGroup) -> None:
        clock = self._clock
        self._changed.clear()
        now = clock.monotonic()
        size = self._batch.max_size
        ready, next_due = self._ready(now, size)
        if not ready:
            self._first_ready = None
            await self._wait(next_due)
            return
        if self._first_ready is None:
            self._first_ready = now
        starts_at = self._batch.starts_at(self._first_ready)
        if self._batches >= self._concurrency or (ready < size and now < starts_at):
            await self._wait(next_due if self._batches >= self._concurrency else starts_at)
            return
        batch = self._take(now)
        self.statistics.waits.observe(max(0.0, now - self._first_ready))
        self._first_ready = None
        self._batches += 1
        self._running.update(batch)
        self._quiet.clear()
        tg.start_soon(self._run_batch, batch)

    async def _wait(self, deadline: float) -> None:
        if math.isinf(deadline):
            await self._changed.wait()
            return
        with self._clock.move_on_at(deadline):
            await self._changed.wait()

    async def _run_batch(self, batch: list[Message]) -> None:
        self.statistics.sizes.observe(len(batch))
        try:
            results: Sequence[ItemResult] = await self._process(batch)
        except Exception:
            # A bug in the processing path (the handler's own failures are settled by
            # ``process``): keep the messages, log, try again later.
            log.exception("processing a batch of %d failed; again in 1 s", len(batch))
            due = self._clock.monotonic() + 1.0
            results = [due] * len(batch)
        finally:
            self._running.difference_update(batch)
            self._batches -= 1
            for message in batch:
                self._in_flight.discard(self._lane(message))
            if not self._running:
                self._quiet.set()
        back: dict[Hashable, list[Message]] = {}
        for message, result in zip(batch, results, strict=True):
            if result is None:
                continue
            if isinstance(result, float):
                message.due = result
            back.setdefault(self._lane(message), []).append(message)
        for lane, messages in back.items():
            queue = self._free if lane is None else self._lanes.setdefault(lane, deque())
            queue.extendleft(reversed(messages))  # before what arrived meanwhile
        self._changed.set()

    async def wait_quiet(self) -> None:
        """Wait until no batch is running."""
        while self._running:
            await self._quiet.wait()
