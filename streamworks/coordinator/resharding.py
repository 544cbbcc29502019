"""Live resharding: the shell around ``core/migrations.py`` (docs/protocol.md#migrations).

Two entry points, each a critical section on the stream's mutex (so any replica can
pick a migration up after a crash, E2):

* :meth:`Resharder.scale` — apply a scale request: commit the new shards
  PROVISIONING (on the replicas), create their keys with every registered group's
  consumer group, then commit them ACTIVE (routing points at them only then); mark
  removed shards DRAINING and record the routing fence.
* :meth:`Resharder.tick` — run by every replica's event loop: finishes a scale-out
  left with PROVISIONING shards; confirms the shards'
  group sets once per stream revision (a replica that died between a commit and its
  confirmation leaves them provisional); once a stream's routing
  fence has passed, check each draining shard with ``retire.lua`` (which deletes it
  in the same step when every registered group shows pending 0, lag 0 and nothing
  undelivered) and record the retired shards.

The coordinator never moves, reads or acknowledges messages here (E13, E24): it only
asks Redis for evidence and deletes a key that is proven drained.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from streamworks.clock import boottime
from streamworks.coordinator import provision
from streamworks.coordinator.core.migrations import (
    MigrationPhase,
    activate,
    due_for_drain_check,
    migration_phase,
    retire_shards,
    scale,
)
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.discipline import Exclusion, WriteDiscipline
from streamworks.coordinator.lag_repair import ActiveLagRepair
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replication import NotReplicated
from streamworks.coordinator.store import Conflict, MetadataUnavailable, Store
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings

__all__ = ("Resharder",)

log = logging.getLogger("streamworks.coordinator.resharding")

#: Added to the routing lease when computing the routing fence: producers count their
#: lease from when they asked, on their own clock; this covers clock-rate skew.
FENCE_MARGIN_MS = 1_000

#: Removed shards checked (and retired) per step of a drain check: one round trip per
#: node; the stream's mutex is confirmed before each.
RETIRE_BATCH = 500


class Resharder:
    """Migrations of one coordinator replica."""

    def __init__(
        self,
        store: Store,
        keyspace: Keyspace,
        settings: Settings,
        discipline: WriteDiscipline,
        metrics: CoordinatorMetrics,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.keyspace = keyspace
        self.settings = settings
        self.discipline = discipline
        # Why each draining shard is not retired yet (last check, this replica): shown
        # by `streamworks status` so an operator sees e.g. "lag unknown (nil)".
        self.blockers: dict[str, str] = {}
        self._logged: dict[str, float] = {}
        # (stream, revision) whose shards' group sets this replica confirmed.
        self._sealed: set[tuple[str, int]] = set()
        # Lag of ACTIVE shards lost by a Redis < 7.4 restart (``lag_repair.py``).
        self.lag_repair = ActiveLagRepair(store, keyspace, metrics)

    async def scale(self, name: str, shards: int) -> StreamMeta:
        """Change ``name`` to ``shards`` routable shards (see the module docstring)."""
        settings = self.settings
        lease_ms = int(settings.routing_lease * 1000) + FENCE_MARGIN_MS
        mutex = self.keyspace.stream_mutex(name)
        async with self.discipline.critical(mutex, renew=True) as held:
            # A scale-out a failover (or a dead replica) left half done comes first.
            await self._finish_provisioning(name, held)
            for _ in range(settings.coordinator.cas_retries):
                rev, meta = await self.store.load_stream(name)
                if meta is None:
                    raise CoordinatorError(
                        "NOT_FOUND", f"stream {name!r} does not exist", status=404
                    )
                now = await self.store.now_ms()
                try:
                    updated = scale(meta, shards, now, lease_ms)
                except ValueError as e:
                    raise CoordinatorError("INVALID_REQUEST", str(e), status=400) from e
                # A scale-out commits its new shards PROVISIONING first (neither routable
                # nor assignable; on the replicas before any key exists), then creates
                # their keys, then makes them ACTIVE: no acknowledged publish can land on
                # a key the committed layout does not know (docs/protocol.md#migrations).
                held.check()
                new_rev = await self.store.commit_stream(rev, updated)
                if new_rev is None:
                    continue
                created = [s.shard_id(name) for s in updated.provisioning()]
                if created:
                    updated = await self._provision(name, new_rev, updated, held)
                log.info(
                    "stream %s: %d -> %d shards (routing v%d)%s",
                    name,
                    meta.shard_count,
                    shards,
                    updated.routing_version,
                    f", created {', '.join(created)}" if created else "",
                )
                return updated
        raise Conflict(f"stream {name!r}: lost the compare-and-set repeatedly; retry")

    async def _provision(
        self, name: str, rev: int, meta: StreamMeta, held: Exclusion
    ) -> StreamMeta:
        """Create the keys of ``meta``'s PROVISIONING shards (committed at ``rev``, and
        replicated) and commit them ACTIVE; then confirm their group sets. In the
        stream's critical section.

        Raises:
            Conflict: another writer committed the stream meanwhile (its mutex expired).
            MutexLost: the stream's mutex was lost before a step (a Conflict too).
            NotReplicated: a key or the commit was not acknowledged by the replicas in
                time: the shards stay PROVISIONING, a later scale or tick finishes.
        """
        shards = [ShardId.parse(s.shard_id(name)) for s in meta.provisioning()]
        groups = sorted(await self.store.subscribed_groups(name))
        # Provisional: a group subscribing right now may be missing from `groups`;
        # nothing is trimmed on these shards until the list is confirmed below, from a
        # registry read after the commit.
        await held.verify()
        await self.store.create_shard_keys(shards, groups, provisional=True)
        active = activate(meta)
        held.check()
        if await self.store.commit_stream(rev, active) is None:
            raise Conflict(f"stream {name!r} changed while its new shards were created; retry")
        # A group registered from now on loads this layout and creates its consumer
        # group on the new shards itself (adding it to their set).
        after = sorted(await self.store.subscribed_groups(name))
        await provision.record_shard_groups(self.store.scripts, self.keyspace, shards, after)
        return active

    async def _finish_provisioning(self, name: str, held: Exclusion) -> None:
        """Finish a scale-out left with PROVISIONING shards (its replica died, a failover
        lost its last commit, or the replicas did not acknowledge a step in time). In
        the stream's critical section. The layout is committed once more, so that it is
        on the replicas (``WAIT``) before any key is created."""
        rev, meta = await self.store.load_stream(name)
        if meta is None or not meta.provisioning():
            return
        new_rev = await self.store.commit_stream(rev, meta)
        if new_rev is None:
            raise Conflict(f"stream {name!r} changed while finishing its scale-out; retry")
        log.warning(
            "stream %s: finishing a scale-out left half done (%s)",
            name,
            ", ".join(meta.shard_ids(meta.provisioning())),
        )
        await self._provision(name, new_rev, meta, held)

    async def tick(self, revs: Mapping[str, int] | None = None, now_ms: int | None = None) -> None:
        """Advance every stream's migration that is due. Each stream on its own: one
        that fails closed (lost metadata, E21) or whose mutex is held does not hold up
        the others.

        Args:
            revs: every registered stream's revision, as the loop just read them
                (``Store.survey``): a stream whose cached metadata is at that revision
                is decided on without a round trip. Read here when omitted.
            now_ms: Redis time of the loop's pass; read here when omitted.
        """
        if revs is None:
            names = await self.store.registered_streams()
            revs = await self.store.stream_revs(names)
        now = await self.store.now_ms() if now_ms is None else now_ms
        for name, rev in revs.items():
            try:
                cached = self.store.cached_stream(name)
                if cached is not None and cached[0] == rev:
                    meta: StreamMeta | None = cached[1]
                else:
                    rev, meta = await self.store.load_stream(name)
                if meta is None:
                    continue
                if meta.provisioning():
                    mutex = self.keyspace.stream_mutex(name)
                    async with self.discipline.critical(mutex, renew=True) as held:
                        await self._finish_provisioning(name, held)
                    continue
                if (name, rev) not in self._sealed:
                    await self._seal(name)
                await self.lag_repair.maybe_repair(name, meta)
                if not due_for_drain_check(meta, now):
                    continue
                await self._check_and_retire(name)
            except MetadataUnavailable as e:
                log.debug("stream %s: %s", name, e.message)  # the store logs it, rate-limited
            except (Conflict, NotReplicated) as e:
                log.warning("stream %s: %s", name, e.message)

    async def _seal(self, name: str) -> None:
        """Confirm the group sets of the stream's shards from the registry, once per
        stream revision on each replica: repairs shards left provisional (trimming
        refused) by a creation or a scale-out whose replica died between its commit and
        its own confirmation. In the stream's critical section, so no unsubscribe runs
        between the registry read and the write (it would list a destroyed group)."""
        async with self.discipline.critical(self.keyspace.stream_mutex(name), renew=True) as held:
            rev, meta = await self.store.load_stream(name)
            if meta is None:
                return
            groups = sorted(await self.store.subscribed_groups(name))
            shards = [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
            held.check()
            await provision.record_shard_groups(self.store.scripts, self.keyspace, shards, groups)
            if len(self._sealed) > 4096:
                self._sealed.clear()
            self._sealed.add((name, rev))

    async def _check_and_retire(self, name: str) -> None:
        async with self.discipline.critical(self.keyspace.stream_mutex(name), renew=True) as held:
            rev, meta = await self.store.load_stream(name)
            if meta is None:
                return
            now = await self.store.now_ms()
            due = due_for_drain_check(meta, now)
            if not due:
                return
            groups = sorted(await self.store.subscribed_groups(name))
            retired: list[str] = []
            checks: list[provision.DrainCheck] = []
            ids = [record.shard_id(name) for record in due]
            for start in range(0, len(ids), RETIRE_BATCH):
                held.check()  # the registry read above still holds: no unsubscribe ran
                batch = [ShardId.parse(s) for s in ids[start : start + RETIRE_BATCH]]
                checks += await provision.drain_checks(
                    self.store.scripts, self.keyspace, batch, groups
                )
            for shard_id, check in zip(ids, checks, strict=True):
                if check.status in (provision.DrainStatus.DRAINED, provision.DrainStatus.GONE):
                    retired.append(shard_id)
                    self.blockers.pop(shard_id, None)
                    continue
                self.blockers[shard_id] = check.reason
                if check.status is provision.DrainStatus.REPAIRED:
                    # Redis < 7.4 lost entries-read on a restart; the proof (pending 0,
                    # last-delivered-id == last-generated-id) held, lag is exact again.
                    self.metrics.drain_repairs.labels(name).inc()
                    log.warning("stream %s: %s: %s", name, shard_id, check.reason)
                else:
                    self._log_blocked(name, shard_id, check.reason)
            if not retired:
                return
            updated = retire_shards(meta, retired, now)
            held.check()
            if await self.store.commit_stream(rev, updated) is None:
                # Someone else committed first; the keys are gone either way and the
                # next tick (here or on another replica) records them (script returns 2).
                return
            log.info("stream %s: retired %s", name, ", ".join(retired))
            if migration_phase(updated, now) is MigrationPhase.NONE:
                log.info("stream %s: migration complete (%d shards)", name, updated.shard_count)

    def _log_blocked(self, name: str, shard: str, reason: str) -> None:
        last = self._logged.get(shard, 0.0)
        if boottime() - last > 30:
            self._logged[shard] = boottime()
            log.info("stream %s: %s not drained yet: %s", name, shard, reason)
