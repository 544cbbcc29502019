"""The event loop's decisions, as pure steps (docs/protocol.md#leases-and-timers).

Every coordinator replica runs the loop; concurrent runs are safe because each
step is applied under the store's mutex and compare-and-set, and each is
idempotent: running it twice on the same state changes nothing the second time.
Timer steps never grant shards (grants need the member's report and happen only
in heartbeats), so their results carry no fences.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streamworks.coordinator.core.changes import GroupEdit, TimerResult
from streamworks.coordinator.core.model import CoreConfig, Group, Member, MemberState, Topology
from streamworks.coordinator.core.targets import compute_target, note_topology_change, target_due

__all__ = (
    "compute_target_if_due",
    "expire_members",
    "fence_overdue_revocations",
    "next_deadline_ms",
    "raise_token_floor",
    "release_quarantines",
    "remove_stale_members",
)


def expire_members(group: Group, expired_ids: Iterable[str], now_ms: int) -> TimerResult:
    """Expire members whose lease passed (E5, E8).

    Each live member in ``expired_ids`` becomes EXPIRED and its shards are freed;
    the group epoch and metadata version are bumped once. When no live member is
    left, every target is cleared and the group is EMPTY. Ids that are unknown or
    not live are ignored (the lease set may lag behind the metadata).

    Args:
        group: the group as loaded.
        expired_ids: members whose lease expiry (Redis time) is at or before now.
        now_ms: Redis server time.
    """
    edit = GroupEdit(group)
    expired = [
        mid for mid in sorted(set(expired_ids)) if edit.retire(mid, MemberState.EXPIRED, now_ms)
    ]
    if expired:
        edit.bump()
        edit.settle_if_empty()
    return edit.timer_result()


def fence_overdue_revocations(
    group: Group,
    now_ms: int,
    config: CoreConfig | None = None,
    leases: Mapping[str, int] | None = None,
) -> TimerResult:
    """Fence members that did not revoke by their deadline (E6, E8).

    Live UNREVOKED members with ``revocation_deadline_ms <= now_ms`` become FENCED and
    the group epoch is bumped once. Their shards (including the ones being revoked)
    are *quarantined*, not freed: such a member still holds a valid lease, so its
    handlers may still run until that lease would have expired, and nobody else may
    receive the shards before then (docs/guarantees.md#exclusive-processing). The quarantine
    ends at the member's recorded lease expiry (``leases``, Redis time ms) when it is
    known, else at ``now_ms + lease_ttl_ms`` — never earlier than the recorded expiry,
    since every renewal happened at or before now. :func:`release_quarantines` frees
    the shards then (or a rejoin of the member, which rejoins only after its runs
    ended, replaces the tombstone at once).

    Args:
        group: the group as loaded.
        now_ms: Redis server time.
        config: timing knobs (its ``lease_ttl_ms`` bounds the quarantine).
        leases: member id -> recorded lease expiry (Redis time ms), when known.
    """
    ttl_ms = (config or CoreConfig()).lease_ttl_ms
    edit = GroupEdit(group)
    overdue = [
        m.member_id
        for m in group.members.values()
        if m.state is MemberState.UNREVOKED
        and m.revocation_deadline_ms is not None
        and m.revocation_deadline_ms <= now_ms
    ]
    for member_id in sorted(overdue):
        recorded = None if leases is None else leases.get(member_id)
        until = recorded if recorded is not None else now_ms + ttl_ms
        edit.retire(member_id, MemberState.FENCED, now_ms, quarantine_until_ms=until)
    if overdue:
        edit.bump()
        edit.settle_if_empty()
    return edit.timer_result()


def release_quarantines(group: Group, now_ms: int) -> TimerResult:
    """Free the shards of fenced members whose lease would have expired by now.

    The freed shards go to their target owners on those members' next heartbeats;
    the group epoch is not bumped (the target is unchanged, only a holder is gone).
    """
    edit = GroupEdit(group)
    for member in group.members.values():
        until = member.quarantined_until_ms
        if member.quarantined and until is not None and until <= now_ms:
            edit.put(member.released())
    return edit.timer_result()


def remove_stale_members(group: Group, now_ms: int, config: CoreConfig) -> TimerResult:
    """Delete FENCED/EXPIRED records kept for ``stale_member_retention_ms`` (E5).

    Removing a tombstone changes neither epochs nor assignments: late heartbeats
    from such a member get UNKNOWN_MEMBER and it rejoins with epoch 0.
    """
    edit = GroupEdit(group)
    for member in group.members.values():
        stale_at = _stale_at(member, config)
        if stale_at is not None and stale_at <= now_ms:
            edit.remove(member.member_id)
    return edit.timer_result()


def compute_target_if_due(
    group: Group, topology: Topology, now_ms: int, config: CoreConfig
) -> TimerResult:
    """Compute a pending target assignment once its batching slot has come.

    First, if a subscribed stream's layout changed since the target was computed
    (e.g. a scale-out), bump the group epoch (once). Then, if the group epoch is
    ahead of the target epoch and the batching interval allows, compute the target.
    Members pick their part up on their next heartbeat.
    """
    edit = GroupEdit(group)
    note_topology_change(edit, topology)
    if target_due(edit, now_ms, config) and any(m.is_live for m in group.members.values()):
        compute_target(edit, topology, now_ms)
    return edit.timer_result()


def raise_token_floor(group: Group, token: int) -> TimerResult:
    """Make every fence token issued from now on exceed ``token``, a token found in an
    owner fence in Redis that the metadata does not know it issued.

    Such a fence was written from metadata Redis has since lost (failover, restore):
    the next grants, and the fence repairs that follow, must be newer than anything
    issued before the loss (E19, E20). The fence is Redis state, not a member report.
    No-op when the floor is already at or above ``token``.
    """
    edit = GroupEdit(group)
    edit.raise_token_floor(token)
    return edit.timer_result()


def next_deadline_ms(group: Group, config: CoreConfig) -> int | None:
    """The earliest time a timer step may change ``group``, or None.

    Covers revocation deadlines, quarantine releases, stale-record removal and a
    target computation deferred by batching. Lease expiries are not here: they live
    in the lease set.
    """
    deadlines: list[int] = []
    for member in group.members.values():
        if member.state is MemberState.UNREVOKED and member.revocation_deadline_ms is not None:
            deadlines.append(member.revocation_deadline_ms)
        stale = _stale_at(member, config)
        if stale is not None:
            deadlines.append(stale)
        if member.quarantined and member.quarantined_until_ms is not None:
            deadlines.append(member.quarantined_until_ms)
    has_live = any(m.is_live for m in group.members.values())
    if has_live and group.group_epoch > group.target_epoch:
        deadlines.append(group.last_assignment_ms + config.assignment_interval_ms)
    return min(deadlines, default=None)


def _stale_at(member: Member, config: CoreConfig) -> int | None:
    """When a tombstone may be removed; None for live members."""
    if member.is_live or member.expired_at_ms is None:
        return None
    stale = member.expired_at_ms + config.stale_member_retention_ms
    if member.quarantined_until_ms is not None:
        stale = max(stale, member.quarantined_until_ms)  # the quarantine goes with it
    return stale
