"""The coordinator's delayed-message gauges, per shard, from the latest observation.

Rendered from the same snapshot as the other status gauges (``coordinator/metrics.py``,
``coordinator/observation.py``): ``ZCARD`` and the head's due time of each shard's
delayed set, never a payload (E24).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamworks.coordinator.metrics import StatusCollector

__all__ = ("DelayedCollector",)


class DelayedCollector(Collector):
    """``streamworks_delayed`` and ``streamworks_delayed_next_due_timestamp_seconds``."""

    def __init__(self, status: StatusCollector) -> None:
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = waiting, next_due = self._families()
        snapshot = self._status.snapshot
        if snapshot is None:
            return families
        for stream in snapshot.status.streams:
            for shard in stream.shards:
                if shard.delayed is None:
                    continue  # retired, or not read
                waiting.add_metric([stream.name, shard.shard], shard.delayed)
                if shard.delayed_next_due_ms is not None:
                    next_due.add_metric(
                        [stream.name, shard.shard], shard.delayed_next_due_ms / 1000
                    )
        return families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "streamworks_delayed",
                "Delayed messages waiting in the shard's slot, not in its stream yet",
                labels=["stream", "shard"],
            ),
            GaugeMetricFamily(
                "streamworks_delayed_next_due_timestamp_seconds",
                "Due time of the shard's earliest delayed message (Redis clock, Unix time)",
                labels=["stream", "shard"],
            ),
        )
