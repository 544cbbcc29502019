"""Operator actions (``streamworks admin``): unsubscribing a group from a stream, and
re-initialising the metadata of an entity whose metadata was lost (E21).

Each runs in the entity's critical section. Nothing is inferred from member
reports, producer caches or the monitoring projection: the operator states what
the coordinator cannot know.
"""

from __future__ import annotations

import logging

from streamworks.coordinator import provision
from streamworks.coordinator.core import CoreConfig
from streamworks.coordinator.core.recovery import empty_group
from streamworks.coordinator.core.streams import ShardRecord, ShardState, StreamMeta, new_stream
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.status import StatusReport
from streamworks.coordinator.store import Conflict, Store
from streamworks.coordinator.subscriptions import Subscriptions
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import ReinitializeRequest, StatusResponse, UnsubscribeRequest
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("OperatorActions",)

log = logging.getLogger("streamworks.coordinator")

#: Shards an unsubscribe removes the group from per step (one round trip per node).
UNSUBSCRIBE_BATCH = 500


class OperatorActions:
    """The operator's actions on one replica; each answers the status afterwards."""

    def __init__(
        self,
        *,
        store: Store,
        keyspace: Keyspace,
        config: CoreConfig,
        discipline: WriteDiscipline,
        subscriptions: Subscriptions,
        report: StatusReport,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.config = config
        self.discipline = discipline
        self.subscriptions = subscriptions
        self.report = report

    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        """A group stops consuming a stream for good: it leaves the stream's subscription
        registry and its consumer groups (positions, pending entries, fences, retry
        records) are removed from every shard. Refused while a live member of the
        group subscribes to the stream. Until this is done, a scale-in of the stream
        waits for the group to drain the removed shards.

        Runs in the group's critical section (no heartbeat of the group, on any
        replica, runs meanwhile) and inside it the stream's (no scale-out, creation or
        retirement of the stream runs meanwhile: a scale-out cannot create the group on
        new shards behind the unsubscribe's back, leaving an orphan consumer group
        that would block trimming and retirement for good). Both mutexes are held for
        as long as it runs, however many shards (renewed, and checked before each
        batch of shards: ``discipline.py``); one lost stops it with a retryable
        ``CONFLICT`` before its next step, the group still subscribed."""
        group_id, stream = request.group, request.stream
        group_mutex = self.keyspace.group_mutex(group_id)
        async with self.discipline.critical(group_mutex, renew=True) as group_held:
            loaded = await self.store.load_group(group_id)
            if loaded.group is not None:
                users = [
                    m.member_id
                    for m in loaded.group.members.values()
                    if m.is_live and stream in m.subscriptions
                ]
                if users:
                    raise CoordinatorError(
                        "IN_USE",
                        f"group {group_id!r} has {len(users)} live member(s) consuming "
                        f"{stream!r}; stop them (or remove the handler) first",
                        status=409,
                    )
            stream_mutex = self.keyspace.stream_mutex(stream)
            async with self.discipline.critical(stream_mutex, renew=True) as stream_held:
                if group_id not in await self.store.subscribed_groups(stream):
                    raise CoordinatorError(
                        "NOT_FOUND",
                        f"group {group_id!r} is not subscribed to {stream!r}",
                        status=404,
                    )
                meta = await self._touch_stream(stream)
                shards = (
                    []
                    if meta is None
                    else [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
                )
                for start in range(0, len(shards), UNSUBSCRIBE_BATCH):
                    await group_held.verify()
                    await stream_held.verify()
                    await provision.destroy_group(
                        self.store.scripts,
                        self.keyspace,
                        shards[start : start + UNSUBSCRIBE_BATCH],
                        group_id,
                    )
                await group_held.verify()
                await stream_held.verify()
                await self.store.remove_subscription(stream, group_id)
                self.subscriptions.forget(stream, group_id)
            log.warning("operator unsubscribed group %s from stream %s", group_id, stream)
        return await self.report.status(positions=False)

    async def _touch_stream(self, stream: str) -> StreamMeta | None:
        """Commit the stream's metadata unchanged, so its revision moves: every replica
        keys what it checked about a group's consumer groups by that revision
        (``subscriptions.py``), so none trusts, after this unsubscribe, what it checked
        before. Done first: no heartbeat of the group runs until the unsubscribe ends
        (its critical section is held), so nothing re-checks at the new revision
        meanwhile, and a crash half-way leaves the group subscribed (retry the
        unsubscribe). None when the stream does not exist (nothing was checked)."""
        for _ in range(3):
            rev, meta = await self.store.load_stream(stream)
            if meta is None:
                return None
            if await self.store.commit_stream(rev, meta) is not None:
                return meta
        raise Conflict(f"stream {stream!r} was written concurrently; retry")

    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        """Re-create the metadata of one entity whose metadata was lost.

        For a stream, the operator states the shard count: fresh shards are created
        under a new incarnation, and every shard key of the stream still in Redis is
        adopted as DRAINING, so its entries are read to the end and it is retired by
        the normal drain check. For a group, the metadata starts empty with fence
        tokens above every token found in its owner fences; members rejoin.
        """
        if request.kind == "stream":
            if request.shards is None:
                raise CoordinatorError(
                    "INVALID_REQUEST", "re-initialising a stream needs its shard count", status=400
                )
            await self._reinitialize_stream(request.name, request.shards)
        else:
            await self._reinitialize_group(request.name)
        return await self.report.status(positions=False)

    async def _reinitialize_stream(self, name: str, shards: int) -> None:
        async with self.discipline.critical(self.keyspace.stream_mutex(name), renew=True) as held:
            rev = await self.store.stream_revs([name])
            if rev[name]:
                raise CoordinatorError(
                    "ALREADY_EXISTS",
                    f"stream {name!r} has metadata; nothing to re-initialise",
                    status=409,
                )
            found = await self.store.existing_shards(name)
            first = max((s.incarnation for s in found), default=-1) + 1
            now = await self.store.now_ms()
            meta = new_stream(name, shards, now, first_incarnation=first)
            adopted = [ShardRecord(s.index, s.incarnation, ShardState.DRAINING) for s in found]
            meta = meta.with_shards(
                [*meta.shards, *adopted], routing_version=now, layout_version=now
            )
            groups = sorted(await self.store.subscribed_groups(name))
            ids = [ShardId.parse(s) for s in meta.shard_ids(meta.routable())]
            held.check()
            await provision.create_shards(self.store.scripts, self.keyspace, ids, groups)
            held.check()
            if await self.store.commit_stream(0, meta) is None:
                raise Conflict(f"stream {name!r} was written concurrently; retry")
            log.warning(
                "operator re-initialised stream %s: %d new shards, %d old shard keys draining",
                name,
                shards,
                len(adopted),
            )

    async def _reinitialize_group(self, group_id: str) -> None:
        async with self.discipline.critical(self.keyspace.group_mutex(group_id)):
            has_rev, has_header = await self.store.group_meta_fields(group_id)
            if has_rev and has_header:
                # Present (maybe corrupt): the operator deletes it first, deliberately.
                raise CoordinatorError(
                    "ALREADY_EXISTS",
                    f"group {group_id!r} has metadata; delete the key first if it is corrupt",
                    status=409,
                )
            floor = await self.store.highest_fence_token(group_id)
            now = await self.store.now_ms()
            group = empty_group(group_id, floor)
            await self.store.delete_group_meta(group_id)
            if (
                await self.store.commit_group(
                    0,
                    group,
                    now_ms=now,
                    header_changed=True,
                    changed=(),
                    removed=(),
                    lease_ttl_ms=self.config.lease_ttl_ms,
                )
                is None
            ):
                raise Conflict(f"group {group_id!r} was written concurrently; retry")
            log.warning(
                "operator re-initialised group %s: fence tokens restart above %d", group_id, floor
            )
