"""The member side of periodic schedules: who runs them, and when it stops.

An app with ``@app.schedule`` declarations declares the internal one-shard stream
``sw-schedules`` (:attr:`~streamworks.redis.keyspace.Keyspace.SCHEDULE_STREAM`) and its
workers subscribe their group to it. The coordinator assigns its shard 0 like any
shard (one owner per group, owner fence, takeover, lease, revocation), and never sends
a message command for it (E24). The member that owns it runs a
:class:`ScheduleShard`: one task per schedule (``runtime/ticks.py``), under the shard's
grant token, each a run under the worker's :class:`~streamworks.runtime.ownership.Runs`,
so it is cancelled at the lease's end like a handler.

The stream carries no entries: the shard is only an ownership. Draining it means
stopping the schedules (a tick cut short is finished by the next owner); losing it
(fenced, lease lost) the same. :class:`Scheduler` is the worker's side of that: it
takes the schedule shard's grants, drains and drops out of the worker's reader
bookkeeping (``Worker.apply_assignment`` hands them over).

Sleeps are on the worker's :class:`~streamworks.clock.Clock`, so ``TestRuntime.advance``
makes schedules tick; what a tick compares is Redis time plus the clock's offset.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import anyio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from streamworks.exceptions import StreamworksError
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime import history
from streamworks.runtime.metrics import FastHistogram
from streamworks.runtime.ownership import RunCancelled
from streamworks.runtime.reader import ReaderState
from streamworks.runtime.schedule_spec import ScheduleSpec
from streamworks.runtime.ticks import Fenced, NotDurable, ScheduleCounters, TickPublisher

if TYPE_CHECKING:
    from streamworks.runtime.worker import Worker

__all__ = ("ScheduleShard", "Scheduler")

log = logging.getLogger("streamworks.schedules")

#: Seconds: how late a tick was published (tick time to recorded done).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0)


class Scheduler:
    """A worker's schedules: runs them while it owns its group's schedule shard."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.specs: dict[str, ScheduleSpec] = dict(worker.app.schedules)
        self.runners: dict[ShardId, ScheduleShard] = {}
        self.counters = {name: ScheduleCounters() for name in self.specs}
        self.lateness = {name: FastHistogram(LATENESS_BUCKETS) for name in self.specs}
        worker.metrics.registry.register(_ScheduleCollector(self))

    @staticmethod
    def handles(shard: ShardId) -> bool:
        """Whether ``shard`` is a schedule shard (not one to read)."""
        return shard.stream == Keyspace.SCHEDULE_STREAM

    def owned(self) -> frozenset[ShardId]:
        """Schedule shards this member runs, or still stops."""
        return frozenset(self.runners)

    def grant(self, shard: ShardId, token: str) -> None:
        """Run the schedules under ``token`` (a newer grant continues under it)."""
        runner = self.runners.get(shard)
        if runner is not None:
            if runner.accepting:
                runner.token = token
            return  # stopping: granted again once it has stopped
        if shard in self.worker.revoking:
            return
        runner = ScheduleShard(self, shard, token)
        self.runners[shard] = runner
        assert self.worker._tg is not None
        self.worker._tg.start_soon(self._run, runner)
        log.info("running %d schedules (%s, grant %s)", len(self.specs), shard, token)

    def drain(self, shard: ShardId) -> bool:
        """Revoked: stop, then report it drained. False if not a schedule shard."""
        runner = self.runners.get(shard)
        if runner is None:
            return self.handles(shard)
        self.worker.revoking.add(shard)
        runner.stop(ReaderState.DRAINED)
        return True

    def drop(self, shards: Iterable[ShardId] | None) -> None:
        """Lost (fenced, unknown member, stop): stop at once."""
        for shard in list(self.runners) if shards is None else shards:
            runner = self.runners.get(shard)
            if runner is not None:
                runner.stop(ReaderState.STOPPED)

    async def _run(self, runner: ScheduleShard) -> None:
        try:
            await runner.run()
        finally:
            await self.worker.runs.wait_ended([runner.shard_name])
            # The handover is a protocol step like a read shard's (the trace check).
            history.released_shard(self.worker, runner.shard_name, runner.token, runner.stop_reason)
            if self.runners.get(runner.shard) is runner:
                del self.runners[runner.shard]
            self.worker.revoking.discard(runner.shard)
            if runner.stop_reason == ReaderState.FENCED:
                self.worker.fenced.add(runner.shard)
            self.worker.shard_released()

    async def wait_stopped(self) -> None:
        while self.runners:
            await self.worker.wait_changed()


class ScheduleShard:
    """The schedules of one grant of the schedule shard, one task each."""

    def __init__(self, scheduler: Scheduler, shard: ShardId, token: str) -> None:
        self.scheduler = scheduler
        self.worker = scheduler.worker
        self.shard = shard
        self.shard_name = str(shard)
        self.token = token
        self.accepting = True
        self.stop_reason: str | None = None
        self._scope = anyio.CancelScope()

    def __repr__(self) -> str:
        return f"ScheduleShard({self.shard_name}, token={self.token!r})"

    async def run(self) -> None:
        with self._scope:
            async with anyio.create_task_group() as tg:
                for spec in self.scheduler.specs.values():
                    tg.start_soon(self._run_schedule, spec)

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.accepting = False
        self._scope.cancel()
        self.worker.runs.cancel([self.shard_name])

    async def _run_schedule(self, spec: ScheduleSpec) -> None:
        scheduler = self.scheduler
        publisher = TickPublisher(self, spec, scheduler.counters[spec.name])
        clock, lease, runs = self.worker.clock, self.worker.lease, self.worker.runs
        errors = 0
        while self.accepting:
            if not lease.valid():
                await lease.wait_valid()
                continue
            wake = clock.monotonic()
            try:
                with runs.run(self.shard_name):
                    wake = await publisher.round()
                errors = 0
            except Fenced as e:
                log.warning("schedules: fenced out of %s (%s)", self.shard_name, e)
                self.stop(ReaderState.FENCED)
                return
            except RunCancelled:
                continue  # the lease ran out: wait for it, then look again
            except (RedisError, OSError, StreamworksError, NotDurable) as e:
                errors += 1
                wake = clock.monotonic() + min(30.0, 0.1 * 2 ** min(errors, 9))
                left = wake - clock.monotonic()
                log.warning("schedule %s: %s; again in %.1fs", spec.name, e, left)
            except Exception:
                # The schedule's own function failed: the tick stays pending (status
                # shows it) and is tried again, never skipped.
                errors += 1
                wake = clock.monotonic() + min(60.0, 0.5 * 2 ** min(errors, 7))
                log.exception("schedule %s: its function failed; tried again", spec.name)
            self._observe(spec.name)
            if wake > clock.monotonic():
                await clock.sleep_until(wake)  # an advance of the clock ends it too

    def _observe(self, name: str) -> None:
        counters = self.scheduler.counters[name]
        histogram = self.scheduler.lateness[name]
        for late in counters.lateness:
            histogram.observe(late)
        counters.lateness.clear()


class _ScheduleCollector(Collector):
    """The schedule metrics of one worker (only the owner's move)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        group = self.scheduler.worker.group
        labels = ("group", "schedule")
        ticks = CounterMetricFamily(
            "streamworks_schedule_ticks",
            "Schedule ticks recorded done by this worker: published, or duplicate (a "
            "tick an earlier owner had published before it crashed)",
            labels=(*labels, "outcome"),
        )
        skipped = CounterMetricFamily(
            "streamworks_schedule_ticks_skipped",
            "Missed ticks the catch-up policy did not publish",
            labels=labels,
        )
        failed = CounterMetricFamily(
            "streamworks_schedule_function_failures",
            "Calls of a schedule's function that raised (the tick is tried again)",
            labels=labels,
        )
        last = GaugeMetricFamily(
            "streamworks_schedule_last_tick_timestamp_seconds",
            "The last tick done (its nominal time)",
            labels=labels,
        )
        upcoming = GaugeMetricFamily(
            "streamworks_schedule_next_tick_timestamp_seconds",
            "The next tick (its nominal time)",
            labels=labels,
        )
        lateness = HistogramMetricFamily(
            "streamworks_schedule_tick_lateness_seconds",
            "How late a tick was published: recorded done minus its nominal time",
            labels=labels,
        )
        for name, c in sorted(self.scheduler.counters.items()):
            ticks.add_metric([group, name, "published"], c.published)
            ticks.add_metric([group, name, "duplicate"], c.duplicate)
            skipped.add_metric([group, name], c.skipped)
            failed.add_metric([group, name], c.failed)
            if c.last_tick_ms is not None:
                last.add_metric([group, name], c.last_tick_ms / 1000)
            if c.next_tick_ms is not None:
                upcoming.add_metric([group, name], c.next_tick_ms / 1000)
            h = self.scheduler.lateness[name]
            lateness.add_metric([group, name], h.buckets(), h.sum)
        yield from (ticks, skipped, failed, last, upcoming, lateness)
