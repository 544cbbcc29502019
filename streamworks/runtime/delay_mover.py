"""Moving a shard's due delayed messages into its stream: the owner's side.

A delayed message waits in its shard's slot (``delay_add.lua``) until the member that
owns the shard moves it into the stream with ``delay_move.lua``, under the group's
owner fence, in one script per batch: no second copy, nothing lost if the owner dies
before or after (docs/design/scheduling.md §2). Once in the stream it is an entry
like any other: the shard's reader reads it, and it takes its place in its key's
order *then*.

One :class:`DelayMover` runs beside each :class:`~streamworks.runtime.reader.ShardReader`
(:func:`read_and_move`), only while the reader reads and the lease is valid. It keeps
one timer, the next due time the last move returned, and sleeps on the worker's
:class:`~streamworks.clock.Clock` until then (so ``TestRuntime.advance`` makes
messages due at once). A publish that becomes the shard's earliest writes the shard's
wake stream (``delay_add.lua``); the mover waits on it through the worker's shared
idle waiter (``runtime/waiter.py``: one ``XREAD BLOCK`` per node for every waiting
key, no connection per shard), so an earlier message is seen at once, not at the next
poll. ``worker.delay_poll`` bounds a wait anyway (a safety net, not the mechanism).

Precision: a message enters the stream at its due time plus the timer's lateness and
one script round trip (the move compares with Redis ``TIME``, so never early); then
it is read and handled like any entry. ``bench/delays.py`` measures due -> handled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import RedisCluster
from redis.exceptions import RedisError

from streamworks.runtime.metrics import FastHistogram

if TYPE_CHECKING:
    from collections.abc import Iterator

    from streamworks.runtime.reader import ShardReader
    from streamworks.runtime.worker import Worker

__all__ = ("DelayMetrics", "DelayMover", "read_and_move")

log = logging.getLogger("streamworks.delays")

#: Most messages moved by one ``delay_move.lua`` call (then it is called again at once).
MOVE_BATCH = 500
#: A next due time closer than this (s) is slept for without joining the shared waiter:
#: a publish that becomes the earliest meanwhile is then at most this late. Joining costs
#: a CLIENT UNBLOCK and a new XREAD of the shared wait, per move: a busy shard (a message
#: due every few ms) would churn it continuously (docs/performance.md, delayed messages).
NEAR = 0.05
#: Lateness of a move (s): its earliest message's due time to the move, Redis clock.
LATENESS_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


async def read_and_move(worker: Worker, reader: ShardReader) -> None:
    """Run ``reader`` with its shard's :class:`DelayMover` beside it; the mover stops
    when the reader does (drained, fenced, retired, stopped)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(DelayMover(worker, reader).run)
        await reader.run()
        tg.cancel_scope.cancel()


class DelayMover:
    """Moves one owned shard's due delayed messages into its stream."""

    def __init__(self, worker: Worker, reader: ShardReader) -> None:
        keyspace, shard = worker.keyspace, reader.shard
        self.worker = worker
        self.reader = reader
        self.stream = shard.stream
        self.keys: list[Any] = [
            reader.stream_key,
            reader.fence_key,
            keyspace.delayed(shard),
            keyspace.delayed_entries(shard),
        ]
        self.wake_key = keyspace.delayed_wake(shard)
        self.poll = worker.settings.worker.delay_poll
        self._errors = 0
        self._cluster = isinstance(worker.redis, RedisCluster)

    async def run(self) -> None:
        """Move due messages until the reader stops reading."""
        lease, clock = self.worker.lease, self.worker.clock
        while self.reader.accepting:
            if not lease.valid():
                # Moves are fenced in Redis, and are made under a valid lease too (E1).
                await lease.wait_valid()
                continue
            try:
                reply = await self.worker.scripts.delay_move(
                    keys=self.keys, args=[self.reader.token, clock.offset_ms, MOVE_BATCH]
                )
                self._errors = 0
            except (RedisError, OSError) as e:
                self._errors += 1
                delay = min(2.0, 0.05 * 2 ** min(self._errors, 6))
                log.warning("moving delayed messages of %s failed (%s)", self.reader.shard_name, e)
                await clock.sleep(delay)
                continue
            status = int(reply[0])
            if status in (-1, -2):
                # Fenced, or the shard key is gone (retired): the reader's next read
                # says so and stops, and this task with it. Until then (or a newer
                # grant on the reader) look again now and then, never give up alone.
                await clock.sleep(self.worker.settings.worker.block)
                continue
            moved, next_due, now, oldest = (int(reply[i]) for i in (1, 3, 4, 5))
            self.worker.delays.moved(self.stream, moved, (now - oldest) / 1000)
            if moved >= MOVE_BATCH:
                continue  # more may be due already
            await self._wait(next_due, now)

    async def _wait(self, next_due: int, now: int) -> None:
        """Until ``next_due`` (Redis ms; -1: none), a publish that became the earliest,
        a clock advance past it, or ``delay_poll``, whichever comes first."""
        clock = self.worker.clock
        # Redis ms -> this clock: the reply came after the script read TIME, so this
        # deadline is, if anything, late, never early (and the script checks anyway).
        started = clock.monotonic()
        deadline = started + self.poll
        if next_due >= 0:
            deadline = min(deadline, started + max(0, next_due - now) / 1000)
        # On a Redis Cluster the mover waits on its timer and ``delay_poll`` only: in
        # the shared idle wait, its wake key answers ASK to every poll while the slot
        # migrates, and the moves and slot-map reloads that follow broke the shard's
        # own reads (tests/cluster/test_data_plane.py). A delayed message that becomes
        # a shard's earliest is then seen within ``delay_poll``, not at once.
        if deadline - started < NEAR or self._cluster:
            await clock.sleep_until(deadline)
            return
        # Wake entries are added with Redis-generated ids ('*'): any after the
        # script's now (without the test offset) is a publish since this move.
        after = f"{now - clock.offset_ms}-0".encode()
        with clock.move_on_at(deadline):
            await self.worker.waiter.wait(self.wake_key, after, self.poll)
            # Woken by a wake entry (or the waiter failed: look now).


class DelayMetrics(Collector):
    """The worker's delayed-message counters: messages moved per stream and the
    lateness of each move (registered on the worker's registry)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.moved_total: dict[str, int] = {}
        self.lateness: dict[str, FastHistogram] = {}

    def moved(self, stream: str, moved: int, lateness: float) -> None:
        """Count a move of ``moved`` messages, the earliest due ``lateness`` s before."""
        if moved <= 0:
            return
        self.moved_total[stream] = self.moved_total.get(stream, 0) + moved
        histogram = self.lateness.get(stream)
        if histogram is None:
            histogram = self.lateness[stream] = FastHistogram(LATENESS_BUCKETS)
        histogram.observe(max(0.0, lateness))

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        moved = CounterMetricFamily(
            "streamworks_delayed_moved",
            "Delayed messages this worker moved into their shard's stream when due",
            labels=["group", "stream"],
        )
        for stream, n in sorted(self.moved_total.items()):
            moved.add_metric([self.group, stream], n)
        yield moved
        lateness = HistogramMetricFamily(
            "streamworks_delayed_move_lateness_seconds",
            "Per move: how long after its earliest message was due it entered the stream "
            "(Redis clock)",
            labels=["group", "stream"],
        )
        for stream, h in sorted(self.lateness.items()):
            lateness.add_metric([self.group, stream], h.buckets(), h.sum)
        yield lateness
