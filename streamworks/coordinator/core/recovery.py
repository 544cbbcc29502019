"""Recovery steps: after Redis lost writes, and after an operator re-initialises.

When an owner fence refuses a grant because it holds a grant the group's metadata
never recorded (another member's, or a newer token), the metadata went back in time
(a failover or restore lost writes) while the shard's slot kept its fence. Two runs
may then be going that the metadata knows nothing about:

* the lost grant's owner (the member the fence names) may still be running the
  shard, under a lease renewed by writes that were lost too, for up to a lease TTL;
* the member whose grant was refused holds a valid lease for its other shards.

So, as at a revocation timeout, the member is fenced with its shards *quarantined*
until its lease would have expired, and the refused shards are quarantined for a
whole lease TTL under a record of the lost grant's owner (a tombstone with a member
id no client can use, ``~lost:<owner>``, since ids on the wire are ``[A-Za-z0-9_-]``):
nobody receives them before then, not even the fenced member after it rejoined. The
group's token floor is raised above the fences' tokens, so every grant from now on is
newer than anything issued before the loss.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamworks.coordinator.core.changes import GroupEdit, TimerResult
from streamworks.coordinator.core.model import Group, Member, MemberState
from streamworks.coordinator.core.tokens import parse_token

__all__ = ("LOST_GRANT_PREFIX", "empty_group", "fence_after_regression")

#: Member ids of the records quarantining shards of grants Redis lost.
LOST_GRANT_PREFIX = "~lost:"


def fence_after_regression(
    group: Group,
    member_id: str,
    refused: Mapping[str, str],
    now_ms: int,
    *,
    member_until_ms: int,
    lost_until_ms: int,
) -> TimerResult:
    """Fence ``member_id``, whose grants of ``refused`` (shard -> the fence found,
    ``"<token>:<owner>"``) were refused: its shards quarantined until
    ``member_until_ms`` (its lease), the refused ones also until ``lost_until_ms``
    (a lease TTL from now) under their owners' records; the token floor raised above
    every token found."""
    edit = GroupEdit(group)
    by_owner: dict[str, set[str]] = {}
    for shard, fence in refused.items():
        token = parse_token(fence)
        if token is not None:
            edit.raise_token_floor(token)
        owner = fence.split(":", 1)[1] if ":" in fence else ""
        by_owner.setdefault(owner, set()).add(shard)
    for owner, shards in sorted(by_owner.items()):
        if owner != member_id:
            _quarantine_lost(edit, owner, frozenset(shards), now_ms, lost_until_ms)
    if edit.retire(member_id, MemberState.FENCED, now_ms, quarantine_until_ms=member_until_ms):
        edit.bump()
        edit.settle_if_empty()
    return edit.timer_result()


def _quarantine_lost(
    edit: GroupEdit, owner: str, shards: frozenset[str], now_ms: int, until_ms: int
) -> None:
    record_id = f"{LOST_GRANT_PREFIX}{owner}"
    record = edit.member(record_id)
    if record is not None and record.quarantined_until_ms is not None:
        shards |= record.quarantined
        until_ms = max(until_ms, record.quarantined_until_ms)
    edit.put(
        Member(
            member_id=record_id,
            epoch=0,
            previous_epoch=0,
            state=MemberState.FENCED,
            subscriptions=frozenset(),
            assigned={},
            pending_revocation=frozenset(),
            target=frozenset(),
            revocation_deadline_ms=None,
            rebalance_timeout_ms=1,
            client={"reason": "a grant Redis lost (failover or restore)"},
            joined_at_ms=now_ms,
            expired_at_ms=now_ms,
            quarantined=shards,
            quarantined_until_ms=until_ms,
        )
    )


def empty_group(group_id: str, token_floor: int = 0) -> Group:
    """A group with no members whose fence tokens start above ``token_floor`` (the
    highest token found in its owner fences when it is re-initialised, E21)."""
    return Group(group_id, last_token=token_floor)
