"""The metrics of rate limits and batch handlers (issue 21), in a worker's ``/metrics``.

* ``streamworks_throttled_seconds_total`` — time messages waited for their rate-limit
  slot (``runtime/rate_gate.py``); ``streamworks_throttle_wait_seconds`` — that wait per
  message; ``streamworks_rate_limit_asks_total`` — script calls asking for slots.
* ``streamworks_batch_size`` — messages per batch (``runtime/batch_dispatcher.py``);
  ``streamworks_batch_items_total{outcome=ack|failed|released}``;
  ``streamworks_batch_wait_seconds`` — first message ready to batch start.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from streamworks.runtime.batch_dispatcher import BatchStatistics
    from streamworks.runtime.rate_gate import ThrottleStatistics

__all__ = ("scheduling_families",)

_LABELS = ("group", "stream")


def scheduling_families(
    group: str,
    throttles: Mapping[str, ThrottleStatistics],
    batches: Mapping[str, BatchStatistics],
) -> Iterator[Metric]:
    """The families of the handlers that have a rate limit or batches (none: nothing)."""
    if throttles:
        seconds = CounterMetricFamily(
            "streamworks_throttled_seconds",
            "Time messages waited for their rate-limit slot (not failed, not counted as attempts)",
            labels=_LABELS,
        )
        asks = CounterMetricFamily(
            "streamworks_rate_limit_asks",
            "Calls of rate_take.lua (one per group of messages reaching their turn)",
            labels=_LABELS,
        )
        waits = HistogramMetricFamily(
            "streamworks_throttle_wait_seconds",
            "Wait of one message for its rate-limit slot",
            labels=_LABELS,
        )
        for stream, t in sorted(throttles.items()):
            seconds.add_metric([group, stream], t.seconds)
            asks.add_metric([group, stream], t.asks)
            waits.add_metric([group, stream], t.waits.buckets(), t.waits.sum)
        yield from (seconds, asks, waits)
    if batches:
        sizes = HistogramMetricFamily(
            "streamworks_batch_size", "Messages per batch of a batch handler", labels=_LABELS
        )
        items = CounterMetricFamily(
            "streamworks_batch_items",
            "Items of batches by outcome: ack, failed (an attempt), released (run again "
            "after its key's failed item)",
            labels=(*_LABELS, "outcome"),
        )
        waits = HistogramMetricFamily(
            "streamworks_batch_wait_seconds",
            "Time from the first message of a batch being ready to the batch's start",
            labels=_LABELS,
        )
        for stream, b in sorted(batches.items()):
            sizes.add_metric([group, stream], b.sizes.buckets(), b.sizes.sum)
            waits.add_metric([group, stream], b.waits.buckets(), b.waits.sum)
            for outcome, n in sorted(b.items.items()):
                items.add_metric([group, stream, outcome], n)
        yield from (sizes, items, waits)
