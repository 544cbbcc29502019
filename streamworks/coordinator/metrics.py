"""Prometheus metrics of a coordinator replica (its own registry, no globals).

Two kinds: counters and histograms this replica updates as it works, and *status
gauges* — pending and lag per shard and group, stream lengths, the migration phase,
dead-letter lengths — computed from the latest observation
(``coordinator/observation.py``), which the ``/metrics`` route takes just before it
renders, so a scrape always sees Redis as it is, whichever replica committed last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamworks.protocol.control import StatusResponse

__all__ = ("CoordinatorMetrics",)


class CoordinatorMetrics:
    """Counters and histograms of one replica."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.heartbeats = Counter(
            "streamworks_coordinator_heartbeats_total",
            "Heartbeats answered, by path and status",
            ["path", "status"],
            registry=r,
        )
        self.heartbeat_seconds = Histogram(
            "streamworks_coordinator_heartbeat_seconds",
            "Heartbeat handling time",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.heartbeat_batch = Histogram(
            "streamworks_coordinator_heartbeat_batch_size",
            "Heartbeats decided by one critical section (one load, one commit): its count "
            "is the critical sections heartbeats took, its sum the heartbeats they served",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.conflicts = Counter(
            "streamworks_coordinator_cas_conflicts_total",
            "Compare-and-set commits lost to another writer",
            registry=r,
        )
        self.rebalances = Counter(
            "streamworks_coordinator_target_assignments_total",
            "Target assignments computed",
            ["group"],
            registry=r,
        )
        self.expirations = Counter(
            "streamworks_coordinator_member_expirations_total",
            "Members expired by lease or fenced by revocation deadline",
            ["group", "reason"],
            registry=r,
        )
        self.group_epoch = Gauge(
            "streamworks_coordinator_group_epoch", "Group epoch", ["group"], registry=r
        )
        self.members = Gauge(
            "streamworks_coordinator_live_members", "Live members", ["group"], registry=r
        )
        self.unavailable = Counter(
            "streamworks_coordinator_metadata_unavailable_total",
            "Requests refused with METADATA_UNAVAILABLE (fail closed)",
            registry=r,
        )
        self.drain_repairs = Counter(
            "streamworks_drain_repairs_total",
            "Drain checks that repaired a group's lag lost by a Redis < 7.4 restart "
            "(pending 0, last-delivered-id equal to last-generated-id)",
            ["stream"],
            registry=r,
        )
        self.stale_heartbeats = Counter(
            "streamworks_coordinator_stale_heartbeats_total",
            "Heartbeats whose sequence number was already acted on (duplicated, re-sent or "
            "delayed requests): answered from the record, nothing acted on",
            registry=r,
        )
        self.regressions = Counter(
            "streamworks_coordinator_metadata_regressions_total",
            "Grants refused by an owner fence the metadata never recorded (Redis lost "
            "writes): the member fenced, its shards quarantined",
            ["group"],
            registry=r,
        )
        self.clock_steps = Counter(
            "streamworks_coordinator_redis_clock_steps_total",
            "Steps of the Redis clock beyond the drift allowance (grants and expiries are "
            "held until it settles)",
            registry=r,
        )
        self.clock_hold = Gauge(
            "streamworks_coordinator_redis_clock_hold",
            "1 while grants and expiries are held after a Redis clock step",
            registry=r,
        )
        self.not_replicated = Counter(
            "streamworks_coordinator_not_replicated_total",
            "Control-plane writes fewer replicas acknowledged in time than required "
            "(treated as not done)",
            registry=r,
        )
        self.status = StatusCollector()
        r.register(self.status)
        from streamworks.coordinator.delayed_metrics import DelayedCollector  # imports this

        r.register(DelayedCollector(self.status))

    def observe_group(self, group_id: str, *, group_epoch: int, live_members: int) -> None:
        """Record a group's epoch and live member count after a commit."""
        self.group_epoch.labels(group_id).set(group_epoch)
        self.members.labels(group_id).set(live_members)

    def observe_status(
        self,
        status: StatusResponse | None,
        dead_letters: Mapping[tuple[str, str], int],
    ) -> None:
        """Publish an observation through the status gauges (None: Redis could not be
        read, the status series disappear rather than show stale values)."""
        self.status.snapshot = None if status is None else _Snapshot(status, dict(dead_letters))
        if status is None:
            return
        for group in status.groups:
            # From Redis, so they are right on a replica that has not committed lately.
            self.group_epoch.labels(group.group).set(group.group_epoch)
            live = [m for m in group.members if m.state not in _TOMBSTONES]
            self.members.labels(group.group).set(len(live))


_TOMBSTONES = frozenset({"EXPIRED", "FENCED"})

#: Every phase a stream reports, so each has a series (1 for the current one).
PHASES = ("NONE", "FENCING", "DRAINING")


@dataclass(frozen=True, slots=True)
class _Snapshot:
    status: StatusResponse
    dead_letters: dict[tuple[str, str], int]


class StatusCollector(Collector):
    """The status gauges, rendered from the latest snapshot at collection time."""

    def __init__(self) -> None:
        self.snapshot: _Snapshot | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        pending, lag, group_pending, group_lag, length, shards, phase, draining, dlq = families
        snapshot = self.snapshot
        if snapshot is None:
            return families
        per_group: dict[tuple[str, str], list[int]] = {}
        for stream in snapshot.status.streams:
            name = stream.name
            routable = sum(1 for s in stream.shards if s.state == "ACTIVE")
            shards.add_metric([name], routable)
            current = str((stream.migration or {}).get("phase", "NONE"))
            for value in PHASES:
                phase.add_metric([name, value], 1.0 if value == current else 0.0)
            draining.add_metric([name], sum(1 for s in stream.shards if s.state == "DRAINING"))
            for shard in stream.shards:
                if shard.length is not None:
                    length.add_metric([name, shard.shard], shard.length)
                for position in shard.groups:
                    labels = [position.group, name, shard.shard]
                    pending.add_metric(labels, position.pending)
                    totals = per_group.setdefault((position.group, name), [0, 0])
                    totals[0] += position.pending
                    if position.lag is not None:
                        lag.add_metric(labels, position.lag)
                        totals[1] += position.lag
        for (group, name), (p, lg) in sorted(per_group.items()):
            group_pending.add_metric([group, name], p)
            group_lag.add_metric([group, name], lg)
        for (group, name), entries in sorted(snapshot.dead_letters.items()):
            dlq.add_metric([group, name], entries)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        shard, per_group = ["group", "stream", "shard"], ["group", "stream"]
        return [
            GaugeMetricFamily(
                "streamworks_coordinator_shard_pending",
                "Entries delivered to the group and not acknowledged, per shard",
                labels=shard,
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_shard_lag",
                "Entries not yet delivered to the group, per shard (absent when Redis "
                "cannot compute it)",
                labels=shard,
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_group_pending",
                "Entries delivered and not acknowledged, summed over the stream's shards",
                labels=per_group,
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_group_lag",
                "Entries not yet delivered, summed over the stream's shards (known lags)",
                labels=per_group,
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_shard_length",
                "Entries in the shard's Redis Stream (XLEN)",
                labels=["stream", "shard"],
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_stream_shards",
                "Routable (ACTIVE) shards of the stream",
                labels=["stream"],
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_migration_phase",
                "Migration phase per stream (1 for the current phase, 0 for the others)",
                labels=["stream", "phase"],
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_draining_shards",
                "Shards of the stream still draining after a scale-in",
                labels=["stream"],
            ),
            GaugeMetricFamily(
                "streamworks_coordinator_dead_letters",
                "Entries in the group's dead-letter stream of the stream (XLEN)",
                labels=per_group,
            ),
        ]
