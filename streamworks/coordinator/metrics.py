"""Prometheus metrics of a coordinator replica (its own registry, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.migrations = Gauge(
            "streamworks_coordinator_migration_phase",
            "Migration in progress per stream (1 = this phase)",
            ["stream", "phase"],
            registry=r,
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
