"""Prometheus metrics of one worker, read at scrape time (``docs/operations.md``).

Every worker has its own :class:`WorkerMetrics` and its own ``CollectorRegistry``, so
several workers in one process (``TestRuntime``) never share a series. Nearly
everything is *collected*: the handlers' counters (``HandlerStatistics``), the
dispatchers' running counts, the lease and the owned shards are read when a scraper
asks, so the message path does no extra work for them. The histograms are the
exception; they are :class:`FastHistogram` objects — a bucket list and a sum, filled
with one ``bisect`` per observation, no lock and no allocation (the event loop is the
only writer) — instead of ``prometheus_client.Histogram``, whose ``observe`` takes a
lock per bucket.

Pending and lag per owned shard come from ``XINFO GROUPS`` on those shards, run by
:meth:`WorkerMetrics.refresh_positions` before each scrape (bounded in shards and
time).
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from streamworks.runtime.scheduling_metrics import scheduling_families

if TYPE_CHECKING:
    from streamworks.runtime.batch_dispatcher import BatchStatistics
    from streamworks.runtime.producer import Producer
    from streamworks.runtime.rate_gate import ThrottleStatistics
    from streamworks.runtime.worker import Worker

__all__ = ("FastHistogram", "HandlerStatistics", "PublishMetrics", "WorkerMetrics")

log = logging.getLogger("streamworks.metrics")

#: Seconds: handler runs, from sub-millisecond to a minute.
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
#: Seconds: Redis round trips (ack flushes, publishes).
ROUND_TRIP_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
#: Entries per read.
BATCH_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)

#: At most this many owned shards are asked for their position per scrape.
MAX_POSITION_SHARDS = 1024
#: A scrape waits at most this long for positions (then serves the last ones known).
POSITION_TIMEOUT = 2.0


class HandlerStatistics:
    """Counters of one handler in one worker."""

    __slots__ = (
        "crashed",
        "dead_lettered",
        "duplicates",
        "failed",
        "handled",
        "poison",
        "retried",
        "skipped",
    )

    def __init__(self) -> None:
        self.handled = 0  # handler returned (or Skip): acked
        self.failed = 0  # attempts that raised (including Retry and timeouts)
        self.retried = 0  # re-runs scheduled
        self.dead_lettered = 0
        self.poison = 0  # dead-lettered because undecodable
        self.crashed = 0  # dead-lettered because every run died with its worker
        self.duplicates = 0  # skipped by the idempotency store
        self.skipped = 0  # handler raised Skip

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class FastHistogram:
    """A cumulative-bucket histogram for one label set, cheap to observe."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        if not self.bounds:
            raise ValueError("a histogram needs at least one bucket bound")
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound lands in that bucket (``le`` is <=); the
        # first bucket (the usual one for fast handlers) without it.
        bounds = self.bounds
        self.counts[0 if value <= bounds[0] else bisect_left(bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last (the exposition's shape)."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(total)))
        return out


class PublishMetrics:
    """Publish counts and latencies of one producer, per stream."""

    __slots__ = ("seconds", "total")

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.seconds: dict[str, FastHistogram] = {}

    def observe(self, stream: str, messages: int, seconds: float) -> None:
        """One ``publish`` (or ``publish_many`` of ``messages``) that took ``seconds``."""
        histogram = self.seconds.get(stream)
        if histogram is None:
            histogram = self.seconds[stream] = FastHistogram(ROUND_TRIP_BUCKETS)
        histogram.observe(seconds)
        self.total[stream] = self.total.get(stream, 0) + messages


class WorkerMetrics:
    """The metrics of one worker: histograms it fills, and a collector for the rest.

    Args:
        worker: the worker whose counters are collected at scrape time.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.handler_seconds: dict[str, FastHistogram] = {}  # by stream
        self.read_batch: dict[str, FastHistogram] = {}  # by stream
        self.ack_flush = FastHistogram(ROUND_TRIP_BUCKETS)
        # shard name -> (pending, lag or None), as of the last refresh.
        self.positions: dict[str, tuple[int, int | None]] = {}
        #: (stream, reason) -> reads that failed (``reader.read_error_reason``).
        self.read_errors: dict[tuple[str, str], int] = {}
        #: Rate limits and batch handlers, by stream (scheduling_metrics.py).
        self.throttles: dict[str, ThrottleStatistics] = {}
        self.batches: dict[str, BatchStatistics] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_WorkerCollector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def handler_histogram(self, stream: str) -> FastHistogram:
        """The duration histogram of ``stream``'s handler (bound once, observed per run)."""
        return self.handler_seconds.setdefault(stream, FastHistogram(DURATION_BUCKETS))

    def batch_histogram(self, stream: str) -> FastHistogram:
        """The read batch size histogram of ``stream``'s shards."""
        return self.read_batch.setdefault(stream, FastHistogram(BATCH_BUCKETS))

    def count_read_error(self, stream: str, reason: str) -> None:
        """Count one failed read of a shard of ``stream``."""
        key = (stream, reason)
        self.read_errors[key] = self.read_errors.get(key, 0) + 1

    def producer(self) -> Producer | None:
        """The producer of the app's open connection (publish metrics), if any."""
        connection = self.worker.app.current_connection
        return None if connection is None else connection.producer

    async def refresh_positions(self) -> None:
        """Read pending and lag of this group on each owned shard (``XINFO GROUPS``)."""
        worker = self.worker
        readers = list(worker.readers.values())[:MAX_POSITION_SHARDS]
        positions: dict[str, tuple[int, int | None]] = {}
        if readers:
            try:
                with anyio.fail_after(POSITION_TIMEOUT):
                    async with worker.redis.pipeline(transaction=False) as pipe:
                        for reader in readers:
                            pipe.xinfo_groups(reader.stream_key)
                        replies = await pipe.execute(raise_on_error=False)
            except (RedisError, OSError, TimeoutError) as e:
                log.warning("metrics: shard positions not read: %s", e)
                return  # keep the last ones known
            group = worker.group.encode()
            for reader, groups in zip(readers, replies, strict=True):
                if isinstance(groups, Exception):
                    continue
                for g in groups:
                    if g.get("name") == group:
                        lag = g.get("lag")
                        positions[reader.shard_name] = (
                            int(g.get("pending") or 0),
                            None if lag is None else int(lag),
                        )
        self.positions = positions

    async def exposition(self) -> bytes:
        """The text exposition of every metric, positions freshly read."""
        await self.refresh_positions()
        return generate_latest(self.registry)


_COUNTERS = (
    (
        "handled",
        "streamworks_messages_handled_total",
        "Messages whose handler returned (or raised Skip): acked",
    ),
    ("failed", "streamworks_messages_failed_total", "Handler attempts that failed"),
    ("retried", "streamworks_messages_retried_total", "Re-runs scheduled after a failure"),
    (
        "dead_lettered",
        "streamworks_messages_dead_lettered_total",
        "Messages written to the dead-letter stream",
    ),
    ("skipped", "streamworks_messages_skipped_total", "Messages whose handler raised Skip"),
    (
        "duplicates",
        "streamworks_messages_duplicates_total",
        "Messages acked without a run: their idempotency key was already completed",
    ),
)
_HANDLER_LABELS = ("group", "stream", "handler")


class _WorkerCollector(Collector):
    """Reads the worker's counters when the registry is collected."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are only known at scrape time (one per handler)

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        worker = metrics.worker
        group = worker.group
        runtimes = list(worker.handlers.items())
        labels = {stream: [group, stream, rt.spec.name] for stream, rt in runtimes}
        for attribute, name, doc in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=_HANDLER_LABELS)
            for stream, rt in runtimes:
                family.add_metric(labels[stream], getattr(rt.statistics, attribute))
            yield family
        running = GaugeMetricFamily(
            "streamworks_messages_in_flight",
            "Handler runs in progress now",
            labels=_HANDLER_LABELS,
        )
        for stream, rt in runtimes:
            running.add_metric(labels[stream], rt.dispatcher.running)
        yield running
        duration = HistogramMetricFamily(
            "streamworks_handler_duration_seconds",
            "Time of one handler run, its middleware included (any outcome)",
            labels=_HANDLER_LABELS,
        )
        for stream, _ in runtimes:
            h = metrics.handler_seconds.get(stream)
            if h is not None:
                duration.add_metric(labels[stream], h.buckets(), h.sum)
        yield duration
        batch = HistogramMetricFamily(
            "streamworks_read_batch_size",
            "Entries per non-empty read of a shard (live reads and takeover rounds)",
            labels=("group", "stream"),
        )
        for stream, h in sorted(metrics.read_batch.items()):
            batch.add_metric([group, stream], h.buckets(), h.sum)
        yield batch
        errors = CounterMetricFamily(
            "streamworks_read_errors_total",
            "Shard reads that failed and were retried, by reason: tryagain (a Redis "
            "Cluster slot migration), denied (an ACL refusal), not_atomic (MULTI refused), "
            "refused (another error reply), connection",
            labels=("group", "stream", "reason"),
        )
        for (stream, reason), n in sorted(metrics.read_errors.items()):
            errors.add_metric([group, stream, reason], n)
        yield errors
        flush = HistogramMetricFamily(
            "streamworks_ack_flush_seconds",
            "Time of one ack flush (one pipeline of XACKs)",
            labels=("group",),
        )
        flush.add_metric([group], metrics.ack_flush.buckets(), metrics.ack_flush.sum)
        yield flush
        lease = GaugeMetricFamily(
            "streamworks_lease_remaining_seconds",
            "Time left on the assignment lease (0 when expired; reading stops then)",
            labels=("group",),
        )
        lease.add_metric([group], max(0.0, worker.lease.remaining()))
        yield lease
        owned = GaugeMetricFamily(
            "streamworks_shards_owned",
            "Shards this worker reads or still drains",
            labels=("group",),
        )
        owned.add_metric([group], len(worker.readers))
        yield owned
        pending = GaugeMetricFamily(
            "streamworks_shard_pending",
            "Entries delivered to the group and not acked yet, per owned shard",
            labels=("group", "stream", "shard"),
        )
        lag = GaugeMetricFamily(
            "streamworks_shard_lag",
            "Entries not yet delivered to the group, per owned shard",
            labels=("group", "stream", "shard"),
        )
        for shard, (n_pending, n_lag) in sorted(metrics.positions.items()):
            stream = shard.split("/", 1)[0]
            pending.add_metric([group, stream, shard], n_pending)
            if n_lag is not None:  # Redis cannot always tell (never reported as 0)
                lag.add_metric([group, stream, shard], n_lag)
        yield pending
        yield lag
        yield from scheduling_families(group, metrics.throttles, metrics.batches)
        yield from _publish_families(metrics.producer())


def _publish_families(producer: Any) -> Iterator[Metric]:
    total = CounterMetricFamily(
        "streamworks_publish_total", "Messages published", labels=("stream",)
    )
    seconds = HistogramMetricFamily(
        "streamworks_publish_seconds",
        "Time of one publish call (publish_many counts once)",
        labels=("stream",),
    )
    publish: PublishMetrics | None = getattr(producer, "metrics", None)
    if publish is not None:
        for stream, n in sorted(publish.total.items()):
            total.add_metric([stream], n)
        for stream, h in sorted(publish.seconds.items()):
            seconds.add_metric([stream], h.buckets(), h.sum)
    yield total
    yield seconds
