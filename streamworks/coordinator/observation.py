"""What one replica sees of the namespace, for people: snapshots of the status (with
each shard's ``pending``/``lag``), the dead-letter lengths, and a short per-shard
history of both.

The dashboard (``/ui``) and the status gauges of ``/metrics`` read the same snapshot,
taken at most once per ``max_age`` however many browsers and scrapers ask, so a room
full of open dashboards costs Redis one status read per second. Everything comes from
the service's public reads (``status()``) and the store's ``XLEN`` of dead-letter
streams: lengths and ``XINFO`` only, never a message (E24).

The history is in memory and per replica: each replica samples what it is asked to
show, so two replicas behind a load balancer show slightly different sparklines.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from redis.exceptions import RedisError

from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import StatusResponse

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService

__all__ = ("Observation", "Observer", "Sample")

log = logging.getLogger("streamworks.coordinator.observation")


@dataclass(frozen=True, slots=True)
class Sample:
    """One shard's position for one group at one time (``clock.monotonic()`` s)."""

    at: float
    pending: int
    lag: int | None  # None: Redis could not compute it


@dataclass(frozen=True, slots=True)
class Observation:
    """One snapshot. ``status`` is None when it could not be read (``error`` says why)."""

    taken: float  # clock.monotonic() when it was taken
    now_ms: int  # Redis time then (0 when Redis did not answer)
    status: StatusResponse | None
    #: (group, stream) -> entries in the group's dead-letter stream of that stream.
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    error: str | None = None


class Observer:
    """Takes (and caches) observations of one replica, and keeps the history.

    Args:
        service: the replica.
        max_age: an observation younger than this (s) is reused.
        sample_every: the history takes at most one sample per this many seconds.
        samples: samples kept per (group, shard).
    """

    def __init__(
        self,
        service: CoordinatorService,
        *,
        max_age: float = 1.0,
        sample_every: float = 2.0,
        samples: int = 60,
    ) -> None:
        self.service = service
        self.max_age = max_age
        self.sample_every = sample_every
        self.samples = samples
        self._last: Observation | None = None
        self._lock = anyio.Lock()
        self._history: dict[tuple[str, str], deque[Sample]] = {}
        self._sampled = float("-inf")

    @property
    def last(self) -> Observation | None:
        """The latest observation taken, if any."""
        return self._last

    async def observe(self) -> Observation:
        """A fresh observation (at most ``max_age`` old); also updates the status
        gauges of ``/metrics``. Never raises for Redis or metadata trouble: the
        observation carries the error instead."""
        clock = self.service.clock
        async with self._lock:  # concurrent callers share one read
            last = self._last
            if last is not None and clock.monotonic() - last.taken < self.max_age:
                return last
            observation = await self._take()
            self._last = observation
            if observation.status is not None:
                self._sample(observation)
            self.service.metrics.observe_status(observation.status, observation.dead_letters)
            return observation

    def history(self, group: str, shard: str) -> list[Sample]:
        """The samples of ``group`` on ``shard``, oldest first."""
        return list(self._history.get((group, shard), ()))

    async def _take(self) -> Observation:
        service = self.service
        taken = service.clock.monotonic()
        try:
            now_ms = await service.store.now_ms()
            status = await service.status()
            pairs: set[tuple[str, str]] = set()
            for stream in status.streams:
                pairs |= {
                    (g, stream.name) for g in await service.store.subscribed_groups(stream.name)
                }
            for group in status.groups:
                pairs |= {(group.group, s) for s in group.subscriptions}
            dead_letters = await service.store.dead_letter_lengths(sorted(pairs))
        except (RedisError, OSError, CoordinatorError) as e:
            # Shown on the page and as missing status series; the loop logs outages.
            log.debug("observation failed: %r", e)
            return Observation(taken, 0, None, error=f"status unavailable: {_describe(e)}")
        return Observation(taken, now_ms, status, dead_letters)

    def _sample(self, observation: Observation) -> None:
        assert observation.status is not None
        if observation.taken - self._sampled < self.sample_every:
            return
        self._sampled = observation.taken
        seen: set[tuple[str, str]] = set()
        for stream in observation.status.streams:
            for shard in stream.shards:
                for position in shard.groups:
                    key = (position.group, shard.shard)
                    seen.add(key)
                    samples = self._history.setdefault(key, deque(maxlen=self.samples))
                    samples.append(Sample(observation.taken, position.pending, position.lag))
        for key in set(self._history) - seen:  # retired shards, removed groups
            del self._history[key]


def _describe(e: BaseException) -> str:
    if isinstance(e, CoordinatorError):
        return f"{e.code}: {e.message}"
    return type(e).__name__
