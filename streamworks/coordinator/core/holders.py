"""Who holds which shard: live members' assigned and pending-revocation shards, then
fenced members' quarantined ones that no live member holds (exclusive processing)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamworks.coordinator.core.model import Group, Member


def patched_holders(
    original: Group, members: Mapping[str, Member], touched: Iterable[str]
) -> dict[str, str]:
    """``original.holders()`` with the records in ``touched`` replaced by ``members``'.

    Patched in O(what changed) while only live records changed; a step that touches a
    tombstone (fenced, expired, removed: rare) recomputes, because a fenced member's
    quarantined shards yield to live holders and may reappear when those let go."""
    before = original.members
    ids = list(touched)
    for member_id in ids:
        old, new = before.get(member_id), members.get(member_id)
        if (old is not None and (not old.is_live or new is None)) or (
            new is not None and not new.is_live
        ):
            return holders_of(members)
    holders = dict(original.holders())
    for member_id in ids:
        record = before.get(member_id)
        if record is not None:
            for shard in record.held():
                if holders.get(shard) == member_id:
                    del holders[shard]
    for member_id in ids:
        record = members.get(member_id)
        if record is not None:
            for shard in record.held():
                holders[shard] = member_id
    return holders


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
