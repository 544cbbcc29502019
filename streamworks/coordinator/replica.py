"""What one replica remembers between requests: estimates and caches, never truth.

Redis stays the only source of truth. A replica keeps only what it can check or
re-derive: an estimate of Redis time (the last server time it saw, advanced by the
monotonic clock), each group's next lease deadline as its loop last saw it, and
caches keyed by the revisions they were derived from, so a cached value is used
only while those revisions are current.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from streamworks.clock import Clock
from streamworks.coordinator.core import Group, Member
from streamworks.coordinator.core.model import Topology
from streamworks.coordinator.core.streams import StreamMeta, topology_of

__all__ = ("ReplicaState", "live_subscriptions")

#: Entries a revision-keyed cache holds before it is cleared (bounds memory).
_CACHE_LIMIT = 1024


class ReplicaState:
    """The in-memory state of one coordinator replica (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # The namespace id (``redis/namespace.py``), claimed at start or on the first
        # heartbeat or routing request; sent in every such answer.
        self.namespace_id: str | None = None
        # Per group, the member whose lease runs out first and when (Redis time, ms),
        # as the loop last saw the lease set.
        self.next_expiry: dict[str, tuple[str, int]] = {}
        # Last Redis time seen (without the test offset) and the monotonic time it was
        # seen at: the fast path's estimate of Redis time.
        self._redis_time: tuple[int, float] = (0, 0.0)
        self._streams_cache: dict[tuple[str, int], frozenset[str]] = {}
        self._topology_cache: dict[tuple[tuple[str, int], ...], Topology] = {}

    def saw_redis_time(self, now_ms: int) -> None:
        """Note Redis time ``now_ms`` (as the store reports it, with the clock offset)."""
        self._redis_time = (now_ms - self.clock.offset_ms, time.monotonic())

    def estimated_now(self) -> int:
        """Redis time now, estimated from the last time seen (ms, with the offset)."""
        redis_ms, at = self._redis_time
        if not redis_ms:
            redis_ms, at = int(time.time() * 1000), time.monotonic()
        return redis_ms + int((time.monotonic() - at) * 1000) + self.clock.offset_ms

    def group_streams(self, group_id: str, rev: int, group: Group) -> frozenset[str]:
        """Streams the group's live members subscribe to (cached per group revision)."""
        key = (group_id, rev)
        cached = self._streams_cache.get(key)
        if cached is None:
            cached = frozenset(live_subscriptions(group.members.values()))
            if len(self._streams_cache) > _CACHE_LIMIT:
                self._streams_cache.clear()
            self._streams_cache[key] = cached
        return cached

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
