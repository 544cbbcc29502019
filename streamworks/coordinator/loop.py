"""The event loop of one replica: the timers of every group, and migrations.

Every replica runs it; the write discipline makes concurrent runs safe. Each turn
runs the due timer steps of each registered group (lease expiry, revocation
deadlines, stale records, batched target computations; ``core/timers.py``) and
advances stream migrations (``resharding.py``). It wakes every ``loop_interval``,
or sooner at the next lease deadline, so a silent member is expired at its
deadline rather than up to an interval after it.

While a step of the Redis clock has not settled (``core/clock_steps.py``), no timer
step runs: nothing is expired, fenced or released on deadlines the step moved.

A turn costs a constant number of round trips however many groups and streams were
ever registered: one pipelined survey of their revisions and earliest leases, then
work only for the groups and streams where something can be due.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from streamworks.clock import boottime
from streamworks.coordinator.core import CoreConfig, Group
from streamworks.coordinator.core.changes import TimerResult
from streamworks.coordinator.core.model import Topology
from streamworks.coordinator.core.streams import topology_of
from streamworks.coordinator.core.tick import tick
from streamworks.coordinator.core.timers import next_deadline_ms
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replica import ReplicaState
from streamworks.coordinator.resharding import Resharder
from streamworks.coordinator.store import (
    Conflict,
    MetadataUnavailable,
    Store,
    Survey,
    Terminating,
)
from streamworks.exceptions import CoordinatorError
from streamworks.redis.keyspace import Keyspace

__all__ = ("EventLoop",)

log = logging.getLogger("streamworks.coordinator")

#: Seconds between two log lines about the same loop problem.
_WARN_EVERY = 30.0

#: "No deadline" for an idle group.
_NEVER = 2**63


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
        # group -> (revision, stream revisions, time) of a pass that found nothing due:
        # until that time, with those revisions and no lease run out, nothing can be.
        self._idle: dict[str, tuple[int, tuple[tuple[str, int], ...], int]] = {}

    async def tick_group(self, group_id: str) -> bool:
        """Run the due timer steps of one group (expiry, revocation deadlines, stale
        records, batched targets). Decides on a plain read first and takes the mutex
        only when something is due. Returns whether anything was committed."""
        loaded = await self.store.load_group(group_id)
        if loaded.group is None:
            return False
        self.replica.saw_redis_time(loaded.now_ms)
        if self.replica.holding_grants():
            # The Redis clock stepped and has not settled: lease expiries, revocation
            # deadlines and quarantine ends are Redis times the step moved. Expire,
            # fence and free nothing until it settles (fail safe; replica.py logs it).
            self._idle.pop(group_id, None)
            return False
        earliest = await self.store.earliest_lease(group_id)
        if earliest is None:
            self.replica.next_expiry.pop(group_id, None)
        else:
            self.replica.next_expiry[group_id] = earliest
        # The first lease still ahead means no lease ran out: no need to ask for them.
        expired_now = earliest is not None and earliest[1] <= loaded.now_ms
        stream_revs, topology = await self._topology_and_revs(loaded.group)
        if self._due(
            loaded.group,
            await self.store.expired_members(group_id, loaded.now_ms) if expired_now else [],
            topology,
            loaded.now_ms,
        ).is_noop:
            if not expired_now:
                wake = next_deadline_ms(loaded.group, self.config)
                self._idle[group_id] = (loaded.rev, stream_revs, _NEVER if wake is None else wake)
            return False
        self._idle.pop(group_id, None)
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
        return (await self._topology_and_revs(group))[1]

    async def _topology_and_revs(
        self, group: Group
    ) -> tuple[tuple[tuple[str, int], ...], Topology]:
        """The topology of the group's subscribed streams, and their revisions."""
        loaded = await self.store.load_streams(group.live_subscriptions())
        revs = tuple(sorted((n, r) for n, (r, _) in loaded.items()))
        return revs, topology_of({n: m for n, (_, m) in loaded.items() if m is not None})

    async def tick_streams(self) -> None:
        """Advance stream migrations: check and retire drained shards (resharding)."""
        await self.resharder.tick()

    async def tick_all(self) -> None:
        """One pass over every registered group and stream.

        Every group's and stream's revision and every group's earliest lease are read
        in one pipelined round trip (``Store.survey``); a group whose revision, stream
        revisions and deadlines show that nothing can be due since its last pass is
        skipped without another round trip or a walk over its members, so an idle
        group (or one of thousands ever registered) costs a few bytes per pass.
        """
        groups = await self.store.registered_groups()
        streams = await self.store.registered_streams()
        survey = await self.store.survey(groups, streams)
        now = await self.store.now_ms()
        self.replica.saw_redis_time(now)
        for group_id in groups:
            if self.discipline.terminating:
                return
            earliest = survey.earliest_leases.get(group_id)
            if earliest is None:
                self.replica.next_expiry.pop(group_id, None)
            else:
                self.replica.next_expiry[group_id] = earliest
            if self._still_idle(group_id, survey, now):
                continue
            try:
                await self.tick_group(group_id)
            except MetadataUnavailable:
                pass  # logged (rate-limited) where it is raised
            except Conflict as e:
                self._warning(f"group {group_id}: {e.message}")
        for gone in self._idle.keys() - set(groups):
            del self._idle[gone]
        await self.resharder.tick(survey.stream_revs, now)

    def _still_idle(self, group_id: str, survey: Survey, now_ms: int) -> bool:
        """Whether a pass over ``group_id`` would change nothing: its last pass found
        nothing due, the group and its streams are at the revisions it saw, no lease has
        run out and no deadline (revocation, tombstone, batched target) has come."""
        idle = self._idle.get(group_id)
        if idle is None:
            return False
        rev, stream_revs, until = idle
        if survey.group_revs.get(group_id) != rev or now_ms >= until:
            return False
        earliest = survey.earliest_leases.get(group_id)
        if earliest is not None and earliest[1] <= now_ms:
            return False
        return all(survey.stream_revs.get(name) == r for name, r in stream_revs)

    async def run(self) -> None:
        """Run until cancelled or terminating."""
        while not self.discipline.terminating:
            try:
                await self.tick_all()
            except MetadataUnavailable:
                pass
            except CoordinatorError as e:
                if isinstance(e, Terminating):
                    break
                self._warning(str(e))
            except (OSError, RedisError) as e:
                self._warning(f"Redis unavailable: {e}")
            await self.store.clock.sleep(self.sleep_time(self.interval))

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
        now = boottime()
        if now - self._warned.get(message, -_WARN_EVERY) >= _WARN_EVERY:
            if len(self._warned) > 1000:
                self._warned.clear()
            self._warned[message] = now
            log.warning("loop: %s", message)
