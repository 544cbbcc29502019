"""The event loop of one replica: the timers of every group, and migrations.

Every replica runs it; the write discipline makes concurrent runs safe. Each turn
runs the due timer steps of each registered group (lease expiry, revocation
deadlines, stale records, batched target computations; ``core/timers.py``) and
advances stream migrations (``resharding.py``). It wakes every ``loop_interval``,
or sooner at the next lease deadline, so a silent member is expired at its
deadline rather than up to an interval after it.
"""

from __future__ import annotations

import logging
import time

import anyio
from redis.exceptions import RedisError

from streamworks.coordinator.core import CoreConfig, Group
from streamworks.coordinator.core.changes import TimerResult
from streamworks.coordinator.core.model import Topology
from streamworks.coordinator.core.streams import topology_of
from streamworks.coordinator.core.tick import tick
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replica import ReplicaState
from streamworks.coordinator.resharding import Resharder
from streamworks.coordinator.store import Conflict, MetadataUnavailable, Store, Terminating
from streamworks.exceptions import CoordinatorError
from streamworks.redis.keyspace import Keyspace

__all__ = ("EventLoop",)

log = logging.getLogger("streamworks.coordinator")

#: Seconds between two log lines about the same loop problem.
_WARN_EVERY = 30.0


class EventLoop:
    """The timer loop of one replica (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        keyspace: Keyspace,
        config: CoreConfig,
        cas_retries: int,
        interval: float,
        metrics: CoordinatorMetrics,
        discipline: WriteDiscipline,
        replica: ReplicaState,
        resharder: Resharder,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.config = config
        self.cas_retries = cas_retries
        self.interval = interval
        self.metrics = metrics
        self.discipline = discipline
        self.replica = replica
        self.resharder = resharder
        self._warned: dict[str, float] = {}

    async def tick_group(self, group_id: str) -> bool:
        """Run the due timer steps of one group (expiry, revocation deadlines, stale
        records, batched targets). Decides on a plain read first and takes the mutex
        only when something is due. Returns whether anything was committed."""
        loaded = await self.store.load_group(group_id)
        if loaded.group is None:
            return False
        self.replica.saw_redis_time(loaded.now_ms)
        earliest = await self.store.earliest_lease(group_id)
        if earliest is None:
            self.replica.next_expiry.pop(group_id, None)
        else:
            self.replica.next_expiry[group_id] = earliest
        # The first lease still ahead means no lease ran out: no need to ask for them.
        expired_now = earliest is not None and earliest[1] <= loaded.now_ms
        if self._due(
            loaded.group,
            await self.store.expired_members(group_id, loaded.now_ms) if expired_now else [],
            await self._topology(loaded.group),
            loaded.now_ms,
        ).is_noop:
            return False
        async with self.discipline.critical(self.keyspace.group_mutex(group_id)):
            for _ in range(self.cas_retries):
                loaded = await self.store.load_group(group_id)
                if loaded.group is None:
                    return False
                expired = await self.store.expired_members(group_id, loaded.now_ms)
                result = self._due(
                    loaded.group, expired, await self._topology(loaded.group), loaded.now_ms
                )
                if result.is_noop:
                    return False
                newly_expired = [
                    m
                    for m in expired
                    if m in loaded.group.members and loaded.group.members[m].is_live
                ]
                rev = await self.store.commit_group(
                    loaded.rev,
                    result.group,
                    now_ms=loaded.now_ms,
                    header_changed=result.header_changed,
                    changed=result.changed_members,
                    removed=result.removed_members,
                    expect_expired=newly_expired,
                    lease_ttl_ms=self.config.lease_ttl_ms,
                )
                if rev is None:
                    self.metrics.conflicts.inc()
                    continue
                for member_id in newly_expired:
                    log.info("group %s: member %s expired (lease)", group_id, member_id)
                    self.metrics.expirations.labels(group_id, "lease").inc()
                if result.group.target_epoch != loaded.group.target_epoch:
                    self.metrics.rebalances.labels(group_id).inc()
                self.metrics.observe_group(
                    group_id,
                    group_epoch=result.group.group_epoch,
                    live_members=result.group.live_count(),
                )
                return True
        raise Conflict(f"group {group_id!r}: lost the compare-and-set repeatedly")

    def _due(
        self, group: Group, expired: list[str], topology: Topology, now_ms: int
    ) -> TimerResult:
        return tick(group, expired, topology, now_ms, self.config)

    async def _topology(self, group: Group) -> Topology:
        names = group.live_subscriptions()
        loaded = await self.store.load_streams(names)
        return topology_of({n: m for n, (_, m) in loaded.items() if m is not None})

    async def tick_streams(self) -> None:
        """Advance stream migrations: check and retire drained shards (resharding)."""
        await self.resharder.tick()

    async def run(self) -> None:
        """Run until cancelled or terminating."""
        while not self.discipline.terminating:
            try:
                for group_id in await self.store.registered_groups():
                    if self.discipline.terminating:
                        break
                    try:
                        await self.tick_group(group_id)
                    except MetadataUnavailable:
                        pass  # logged (rate-limited) where it is raised
                    except Conflict as e:
                        self._warning(f"group {group_id}: {e.message}")
                await self.tick_streams()
            except MetadataUnavailable:
                pass
            except CoordinatorError as e:
                if isinstance(e, Terminating):
                    break
                self._warning(str(e))
            except (OSError, RedisError) as e:
                self._warning(f"Redis unavailable: {e}")
            await anyio.sleep(self.sleep_time(self.interval))

    def sleep_time(self, interval: float) -> float:
        """Until the next loop turn: ``interval``, or less when a lease runs out
        sooner, so that the member is expired at its deadline, not up to an interval
        after it."""
        if not self.replica.next_expiry:
            return interval
        now = self.replica.estimated_now()
        upcoming = [d for _, d in self.replica.next_expiry.values() if d >= now]
        if not upcoming:
            return interval  # a deadline already passed is the normal turn's business
        return max(0.005, min(interval, (min(upcoming) - now + 5) / 1000))

    def _warning(self, message: str) -> None:
        """Log a loop problem at most once per 30 s (the loop runs every interval)."""
        now = time.monotonic()
        if now - self._warned.get(message, -_WARN_EVERY) >= _WARN_EVERY:
            if len(self._warned) > 1000:
                self._warned.clear()
            self._warned[message] = now
            log.warning("loop: %s", message)
