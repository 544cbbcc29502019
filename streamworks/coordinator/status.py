"""What the coordinator reports: groups, streams and each group's position per shard.

Positions (``pending``/``lag`` per group, the shard's length) are read with
``XINFO``; the coordinator never reads messages themselves (E24). Everything here
is read-only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from streamworks.coordinator.core import Group, Member
from streamworks.coordinator.replica import live_subscriptions
from streamworks.coordinator.schedules import schedule_shard, with_schedules
from streamworks.coordinator.store import MetadataUnavailable, Store
from streamworks.coordinator.streams import Streams
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import GroupInfo, MemberInfo, StatusResponse, StreamInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("StatusReport",)

log = logging.getLogger("streamworks.coordinator")


class StatusReport:
    """Builds the ``group``, ``status`` answers of one replica."""

    def __init__(self, store: Store, streams: Streams) -> None:
        self.store = store
        self.streams = streams
        #: group -> (revision, its answer as built at that revision): see :meth:`group_info`.
        self._at_revision: dict[str, tuple[int, GroupInfo]] = {}

    async def group_info(self, group_id: str, *, dead_letters: bool = True) -> GroupInfo:
        """The group as recorded, with each member's lease (and its dead letters per
        stream); ``NOT_FOUND`` if absent."""
        loaded = await self.store.load_group(group_id)
        if loaded.group is None:
            self._at_revision.pop(group_id, None)
            raise CoordinatorError("NOT_FOUND", f"group {group_id!r} does not exist", status=404)
        leases = await self.store.lease_expiries(group_id)
        # Everything but the leases follows from the group at its revision: built once
        # per revision (a commit moves it); a later read of the same revision only puts
        # in the leases, which renewals move without a commit.
        cached = self._at_revision.get(group_id)
        if cached is None or cached[0] != loaded.rev:
            info = _group_info(loaded.group, leases, loaded.now_ms)
            self._at_revision[group_id] = (loaded.rev, info)
        else:
            info = _with_leases(cached[1], leases, loaded.now_ms)
        if not dead_letters:
            return info
        info = (await self._with_dead_letters([info]))[0]
        return (await self._with_schedules([info], None))[0]

    async def status(self, *, positions: bool = True) -> StatusResponse:
        """Streams and groups as recorded, with each group's ``pending``/``lag`` per shard
        (read with ``XINFO``; the coordinator never reads messages themselves, E24)."""
        streams = []
        for name in await self.store.registered_streams():
            try:
                info = await self.streams.info(name)
            except MetadataUnavailable as e:
                log.warning("status: %s", e)
                continue
            streams.append(await self._with_positions(info) if positions else info)
        groups = []
        for name in await self.store.registered_groups():
            try:
                groups.append(await self.group_info(name, dead_letters=False))
            except (MetadataUnavailable, CoordinatorError) as e:
                log.warning("status: %s", e)
        groups = await self._with_dead_letters(groups)
        schedules = next((s for s in streams if s.name == Keyspace.SCHEDULE_STREAM), None)
        groups = await self._with_schedules(groups, schedules)
        return StatusResponse(streams=_with_owners(streams, groups), groups=groups)

    async def _with_dead_letters(self, groups: list[GroupInfo]) -> list[GroupInfo]:
        """Each group with the length of its dead-letter stream of every stream it
        consumes (``XLEN``, one pipeline for all)."""
        pairs = [(g.group, s) for g in groups for s in g.subscriptions]
        lengths = await self.store.dead_letter_lengths(pairs)
        return [
            g.model_copy(
                update={"dead_letters": {s: lengths.get((g.group, s), 0) for s in g.subscriptions}}
            )
            for g in groups
        ]

    async def _with_schedules(
        self, groups: list[GroupInfo], stream: StreamInfo | None
    ) -> list[GroupInfo]:
        """Each group with its periodic schedules (``schedules.py``). ``status`` passes
        the schedule stream it read (every group is then asked, members or not); one
        group's info looks only when its live members subscribe to it (no extra read
        for a group without schedules)."""
        if stream is None:
            if not any(Keyspace.SCHEDULE_STREAM in g.subscriptions for g in groups):
                return groups
            try:
                stream = await self.streams.info(Keyspace.SCHEDULE_STREAM)
            except (MetadataUnavailable, CoordinatorError) as e:
                log.warning("status: schedules: %s", e)
                return groups
        store = self.store
        return await with_schedules(store.redis, store.keyspace, schedule_shard(stream), groups)

    async def _with_positions(self, info: StreamInfo) -> StreamInfo:
        live = [s for s in info.shards if s.state != "RETIRED"]
        if not live:
            return info
        ids = [ShardId.parse(s.shard) for s in live]
        read = await self.store.shard_positions(ids)
        positions = iter(read)  # in the order of ``live`` (list.index was O(shards²))
        delayed = iter(await self.store.delayed_counts(ids))
        out = []
        for shard in info.shards:
            position = None if shard.state == "RETIRED" else next(positions)
            waiting = None if shard.state == "RETIRED" else next(delayed)
            if waiting is not None:
                shard = shard.model_copy(
                    update={"delayed": waiting[0], "delayed_next_due_ms": waiting[1]}
                )
            if position is None:
                out.append(shard)  # retired, or Redis answered an error for it
                continue
            length, groups = position
            out.append(shard.model_copy(update={"length": length, "groups": groups}))
        return info.model_copy(update={"shards": out})


def _with_owners(streams: list[StreamInfo], groups: list[GroupInfo]) -> list[StreamInfo]:
    """Each shard's per-group position with the member that owns it in that group (its
    grant is in the member's ``assigned``), so ``status --json`` says who reads what."""
    owner = {
        (g.group, shard): m.member_id
        for g in groups
        for m in g.members
        if m.state not in _GONE
        for shard in m.assigned
    }
    out = []
    for stream in streams:
        shards = [
            shard.model_copy(
                update={
                    "groups": [
                        p.model_copy(update={"owner": owner.get((p.group, shard.shard))})
                        for p in shard.groups
                    ]
                }
            )
            for shard in stream.shards
        ]
        out.append(stream.model_copy(update={"shards": shards}))
    return out


#: Member states of records kept after a member left or expired.
_GONE = frozenset({"EXPIRED", "FENCED"})


def _group_info(group: Group, leases: Mapping[str, int], now_ms: int) -> GroupInfo:
    return GroupInfo(
        group=group.group_id,
        state=group.state.value,
        group_epoch=group.group_epoch,
        target_epoch=group.target_epoch,
        metadata_version=group.metadata_version,
        subscriptions=sorted(live_subscriptions(group.members.values())),
        members=[_member_info(m, leases.get(m.member_id), now_ms) for m in group.members.values()],
    )


def _with_leases(info: GroupInfo, leases: Mapping[str, int], now_ms: int) -> GroupInfo:
    """``info`` (built at the same revision) with each member's lease as
    :func:`_member_info` would report it now."""
    members = []
    for m in info.members:
        lease = leases.get(m.member_id)
        remaining = None if lease is None else lease - now_ms
        if remaining != m.lease_expires_in_ms:
            m = m.model_copy(update={"lease_expires_in_ms": remaining})
        members.append(m)
    return info.model_copy(update={"members": members})


def _member_info(member: Member, lease: int | None, now_ms: int) -> MemberInfo:
    return MemberInfo(
        member_id=member.member_id,
        epoch=member.epoch,
        state=member.state.value,
        assigned=sorted(member.assigned),
        pending_revocation=sorted(member.pending_revocation),
        target=sorted(member.target),
        lease_expires_in_ms=lease - now_ms if lease is not None else None,
        client=dict(member.client),
    )
