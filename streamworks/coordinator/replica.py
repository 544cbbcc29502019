"""What one replica remembers between requests: estimates and caches, never truth.

Redis stays the only source of truth. A replica keeps only what it can check or
re-derive: an estimate of Redis time (the last server time it saw, advanced by the
local clock), each group's next lease deadline as its loop last saw it, and
caches keyed by the revisions they were derived from, so a cached value is used
only while those revisions are current.

It also watches the Redis clock: every ``TIME`` the store reads goes through
:meth:`ReplicaState.observe_time` to the clock-step detector
(``core/clock_steps.py``); while it holds, the replica grants nothing and its loop
expires and frees nothing (fail safe; logged and counted).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from streamworks.clock import Clock, boottime
from streamworks.coordinator.core import Member
from streamworks.coordinator.core.clock_steps import ClockReading, ClockStepDetector
from streamworks.coordinator.core.model import Topology
from streamworks.coordinator.core.streams import StreamMeta, topology_of
from streamworks.coordinator.metrics import CoordinatorMetrics

__all__ = ("ReplicaState", "live_subscriptions")

log = logging.getLogger("streamworks.coordinator")

#: Entries a revision-keyed cache holds before it is cleared (bounds memory).
_CACHE_LIMIT = 1024


class ReplicaState:
    """The in-memory state of one coordinator replica (see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        *,
        clock_steps: ClockStepDetector | None = None,
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        self.clock = clock
        #: Steps of the Redis clock (default: 250 ms beyond 1 % drift, held 10 s).
        self.clock_steps = clock_steps or ClockStepDetector(
            tolerance_ms=250, drift=0.01, settle_s=10.0
        )
        self.metrics = metrics
        self._held = False
        # The namespace id (``redis/namespace.py``), claimed at start or on the first
        # heartbeat or routing request; sent in every such answer.
        self.namespace_id: str | None = None
        # Per group, the member whose lease runs out first and when (Redis time, ms),
        # as the loop last saw the lease set.
        self.next_expiry: dict[str, tuple[str, int]] = {}
        # Last Redis time seen (without the test offset) and the monotonic time it was
        # seen at: the fast path's estimate of Redis time.
        self._redis_time: tuple[int, float] = (0, 0.0)
        self._topology_cache: dict[tuple[tuple[str, int], ...], Topology] = {}

    def saw_redis_time(self, now_ms: int) -> None:
        """Note Redis time ``now_ms`` (as the store reports it, with the clock offset)."""
        self._redis_time = (now_ms - self.clock.offset_ms, boottime())

    def estimated_now(self) -> int:
        """Redis time now, estimated from the last time seen (ms, with the offset)."""
        redis_ms, at = self._redis_time
        if not redis_ms:
            redis_ms, at = self.clock.time_ms() - self.clock.offset_ms, boottime()
        return redis_ms + int((boottime() - at) * 1000) + self.clock.offset_ms

    def observe_time(self, reading: ClockReading) -> None:
        """A reading of Redis ``TIME`` (the store's hook): a step starts a hold."""
        step = self.clock_steps.observe(reading)
        if step is None:
            return
        log.warning(
            "the Redis clock stepped by about %+d ms (beyond the drift allowance): no "
            "grants, expiries or quarantine releases until it settles (%.0f s)",
            step.step_ms,
            self.clock_steps.settle_s,
        )
        if self.metrics is not None:
            self.metrics.clock_steps.inc()
        self.holding_grants()

    def holding_grants(self) -> bool:
        """Whether grants, expiries and quarantine releases are held now (a Redis
        clock step has not settled)."""
        held = self.clock_steps.holding(boottime())
        if held != self._held:
            self._held = held
            if self.metrics is not None:
                self.metrics.clock_hold.set(1 if held else 0)
            if not held:
                log.warning("the Redis clock settled: grants and expiries resume")
        return held

    def topology_of(self, revs: Mapping[str, int], metas: Mapping[str, StreamMeta]) -> Topology:
        """The core's topology of these streams (cached per stream revisions)."""
        key = tuple(sorted(revs.items()))
        cached = self._topology_cache.get(key)
        if cached is None:
            cached = topology_of(metas)
            if len(self._topology_cache) > _CACHE_LIMIT:
                self._topology_cache.clear()
            self._topology_cache[key] = cached
        return cached


def live_subscriptions(members: Iterable[Member]) -> set[str]:
    """The streams any live member of ``members`` subscribes to."""
    out: set[str] = set()
    for member in members:
        if member.is_live:
            out |= member.subscriptions
    return out
