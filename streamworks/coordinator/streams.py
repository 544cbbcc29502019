"""Streams: creation, live scaling, routing and their description.

See docs/protocol.md#producer-routing and docs/protocol.md#migrations.

A stream is created in its critical section: its shard keys (with a consumer group
for every group already registered on it, including groups whose members joined
before the stream existed) first, then its metadata by compare-and-set, then the
shards' group sets are confirmed from the registry read again (a group registered
in between is listed, so nothing is trimmed before its consumer group exists).
Shard keys found without metadata are evidence that the stream existed and its
metadata was lost (E21), unless they are exactly what a creation of the same layout
provisions and never received an entry (a replica died between the two steps, E2).
Scaling is ``resharding.py``'s.
"""

from __future__ import annotations

import logging

from streamworks.coordinator import provision
from streamworks.coordinator.core.migrations import migration_phase
from streamworks.coordinator.core.streams import ShardState, StreamMeta, new_stream
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.replica import ReplicaState
from streamworks.coordinator.resharding import Resharder
from streamworks.coordinator.store import Conflict, Store
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import RoutingResponse, RoutingShard, ShardInfo, StreamInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("Streams",)

log = logging.getLogger("streamworks.coordinator")


class Streams:
    """The stream operations of one replica."""

    def __init__(
        self,
        *,
        store: Store,
        keyspace: Keyspace,
        routing_lease_ms: int,
        discipline: WriteDiscipline,
        replica: ReplicaState,
        resharder: Resharder,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.routing_lease_ms = routing_lease_ms
        self.discipline = discipline
        self.replica = replica
        self.resharder = resharder

    async def ensure(self, name: str, shards: int) -> StreamInfo:
        """Create ``name`` with ``shards`` shards unless it exists (never rescales)."""
        _, meta = await self.store.load_stream(name)
        if meta is not None:
            if meta.shard_count != shards and meta.migration is None:
                log.warning(
                    "stream %s has %d shards; a declaration asked for %d (use `streams scale`)",
                    name,
                    meta.shard_count,
                    shards,
                )
            return self.describe(meta)
        return await self.create(name, shards, exist_ok=True)

    async def create(self, name: str, shards: int, *, exist_ok: bool = False) -> StreamInfo:
        """Create ``name``; an existing stream is answered as is when ``exist_ok`` or
        its shard count matches, else ``ALREADY_EXISTS``."""
        async with self.discipline.critical(self.keyspace.stream_mutex(name)):
            rev, meta = await self.store.load_stream(name)
            if meta is not None:
                if exist_ok or meta.shard_count == shards:
                    return self.describe(meta)
                raise CoordinatorError(
                    "ALREADY_EXISTS",
                    f"stream {name!r} exists with {meta.shard_count} shards; "
                    "use `streams scale` to change it",
                    status=409,
                )
            leftovers = await self.store.existing_shard_keys(name)
            if leftovers and not await self._aborted_creation(name, shards, leftovers):
                raise self.store.unavailable(
                    f"stream {name!r} has shard keys in Redis ({len(leftovers)}) but no "
                    "metadata: it existed and its metadata was lost; an operator must "
                    "re-initialise it (streamworks admin reinit stream)"
                )
            now = await self.store.now_ms()
            meta = new_stream(name, shards, now)
            groups = sorted(await self.store.subscribed_groups(name))
            ids = [ShardId.parse(s) for s in meta.shard_ids()]
            # Provisional, as in a scale-out: a member joining right now may record its
            # group's subscription after the read above and load no stream yet; nothing
            # is trimmed on the shards until the registry, read again after the commit,
            # is written into their group sets.
            await provision.create_shards(
                self.store.scripts, self.keyspace, ids, groups, provisional=True
            )
            if await self.store.commit_stream(rev, meta) is None:
                raise Conflict(f"stream {name!r} was created concurrently; retry")
            after = sorted(await self.store.subscribed_groups(name))
            await provision.record_shard_groups(self.store.scripts, self.keyspace, ids, after)
            log.info("created stream %s with %d shards", name, shards)
            return self.describe(meta, created=True)

    async def _aborted_creation(self, name: str, shards: int, keys: list[str]) -> bool:
        """Whether shard keys found without metadata are what a creation of this very
        layout provisions before its commit, and never received an entry: a replica
        died between the two (E2), nothing of the stream ever existed. Any other
        leftover is evidence that the stream existed and its metadata was lost (E21)."""
        fresh = {self.keyspace.stream(s): s for s in (ShardId(name, i, 0) for i in range(shards))}
        if not set(keys) <= fresh.keys():
            return False
        for key in keys:
            if await self.store.entries_added(fresh[key]) != 0:
                return False
        log.warning(
            "stream %s: %d shard keys left by a creation that did not commit; creating it",
            name,
            len(keys),
        )
        return True

    async def scale(self, name: str, shards: int) -> StreamInfo:
        """Change a stream's shard count live (``resharding.py``).

        Raises:
            CoordinatorError: ``INVALID_REQUEST`` for the internal schedule stream, whose
                shard 0 is the ownership every group's schedules run under.
        """
        if name == self.keyspace.SCHEDULE_STREAM:
            raise CoordinatorError(
                "INVALID_REQUEST",
                f"stream {name!r} is internal: its one shard is the ownership of the "
                "groups' periodic schedules (docs/schedules.md); it cannot be scaled",
                status=400,
            )
        return self.describe(await self.resharder.scale(name, shards))

    async def routing(self, stream: str) -> RoutingResponse:
        """The stream's routing table, leased to the producer for ``routing_lease``."""
        _, meta = await self.store.load_stream(stream)
        if meta is None:
            raise CoordinatorError("NOT_FOUND", f"stream {stream!r} does not exist", status=404)
        routable = meta.routable()
        return RoutingResponse(
            stream=stream,
            routing_version=meta.routing_version,
            protocol=meta.protocol,
            shard_count=len(routable),
            shards=[
                RoutingShard(
                    shard=s.shard_id(stream),
                    key=self.keyspace.stream(ShardId(stream, s.index, s.incarnation)),
                )
                for s in routable
            ],
            lease_ms=self.routing_lease_ms,
            namespace_id=self.replica.namespace_id,
        )

    async def info(self, name: str) -> StreamInfo:
        """The stream as recorded; ``NOT_FOUND`` if it does not exist."""
        _, meta = await self.store.load_stream(name)
        if meta is None:
            raise CoordinatorError("NOT_FOUND", f"stream {name!r} does not exist", status=404)
        return self.describe(meta)

    def describe(self, meta: StreamMeta, *, created: bool = False) -> StreamInfo:
        """The API view of ``meta``: live shards, and the migration with its phase and
        why draining shards are not retired yet (this replica's last check)."""
        migration: dict[str, object] | None = None
        if meta.migration is not None:
            migration = dict(meta.migration)
            migration.pop("created", None)
            migration["phase"] = migration_phase(meta, self.replica.estimated_now()).value
            draining = set(migration.get("draining", []))  # type: ignore[call-overload]
            blocked = {s: r for s, r in self.resharder.blockers.items() if s in draining}
            if blocked:
                migration["blocked"] = blocked
        return StreamInfo(
            name=meta.name,
            shard_count=meta.shard_count,
            routing_version=meta.routing_version,
            protocol=meta.protocol,
            shards=[
                ShardInfo(shard=s.shard_id(meta.name), state=s.state.value)
                for s in meta.shards
                if s.state is not ShardState.RETIRED
            ],
            migration=migration,
            created=created,
        )
