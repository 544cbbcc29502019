"""Who holds which shard: live members' assigned and pending-revocation shards, then
fenced members' quarantined ones that no live member holds (exclusive processing)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from streamworks.coordinator.core.maps import copy_map

if TYPE_CHECKING:
    from streamworks.coordinator.core.model import Group, Member


def patched_holders(
    original: Group, members: Mapping[str, Member], touched: Iterable[str]
) -> dict[str, str]:
    """``original.holders()`` with the records in ``touched`` replaced by ``members``'.

    Patched in O(what changed), including a tombstone holding nothing that is written,
    replaced (a member rejoining after it expired: after a mass expiry every rejoin
    would otherwise cost O(members)) or deleted. A step that involves a quarantine, or
    in which a live member stops being live (fenced, expired, left), recomputes,
    because a fenced member's quarantined shards yield to live holders and may
    reappear when those let go."""
    before = original.members
    ids = list(touched)
    for member_id in ids:
        old, new = before.get(member_id), members.get(member_id)
        if old is not None and (old.quarantined or (old.is_live and not _live(new))):
            return holders_of(members)
        if new is not None and new.quarantined:
            return holders_of(members)
    # Only live records hold anything now (tombstones with a quarantine recomputed).
    holders = copy_map(original.holders())
    for member_id in ids:
        record = before.get(member_id)
        if record is not None and record.is_live:
            for shard in record.held():
                if holders.get(shard) == member_id:
                    del holders[shard]
    for member_id in ids:
        record = members.get(member_id)
        if record is not None and record.is_live:
            for shard in record.held():
                holders[shard] = member_id
    return holders


def _live(member: Member | None) -> bool:
    return member is not None and member.is_live


def holders_of(members: Mapping[str, Member]) -> dict[str, str]:
    """Shard -> holder over every record: live members' assigned and pending
    revocation, then fenced members' quarantined shards nobody live holds."""
    holders: dict[str, str] = {}
    for member in members.values():
        if member.is_live:
            for shard in member.assigned:
                holders[shard] = member.member_id
            for shard in member.pending_revocation:
                holders[shard] = member.member_id
    for member in members.values():
        if not member.is_live:
            for shard in member.quarantined:
                holders.setdefault(shard, member.member_id)
    return holders
