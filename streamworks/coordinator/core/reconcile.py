"""Reconciliation of one member with its target (KIP-848 ``CurrentAssignmentBuilder``).

A literal port of Kafka's ``CurrentAssignmentBuilder.build`` (apache/kafka,
``group-coordinator``; docs/protocol.md#epochs-and-reconciliation), with shards for
partitions and the ``holders`` map standing in for partition epochs:

* STABLE at the target epoch: nothing to do.
* STABLE below the target epoch: compute the next step (:func:`_next`).
* UNREVOKED: wait until the member's report (``owned`` = its owned and revoking
  shards) no longer contains any shard it must revoke; then move on with
  ``epoch + 1`` as the epoch to stay at if it must revoke again.
* UNRELEASED: retry the shards held back because others still held them.

The next step revokes before it assigns: a member that must give shards up gets
only the revocation (epoch frozen, revocation deadline armed) and receives new
shards on a later heartbeat. A shard is granted only when no *other* live member
holds it, in ``assigned`` or ``pending_revocation``; otherwise it stays in the
target and is reported as pending.

Newly granted shards get the step's fence token (``tokens.py``), which is above
every token the group issued before: a shard's token strictly increases whenever it
changes owner, and never repeats one issued before a loss of Redis writes. The
owner-fence script relies on it (it refuses a token at or below the one it holds).
While grants are held (a Redis clock step, ``clock_steps.py``) nothing new is granted:
the shards stay in the target, pending, and the member UNRELEASED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from streamworks.coordinator.core.model import Member, MemberState

__all__ = ("reconcile_member",)


def reconcile_member(
    member: Member,
    target_epoch: int,
    target: frozenset[str],
    owned: frozenset[str] | None,
    holders: Mapping[str, str],
    now_ms: int,
    grant_token: int | None,
) -> Member:
    """Advance ``member`` towards ``target`` as far as the protocol allows now.

    Args:
        member: a live member record.
        target_epoch: the epoch of the group's current target assignment.
        target: the member's part of that target.
        owned: shards the member reported it still reads or drains (its owned and
            revoking shards), or None when it reported nothing.
        holders: shard -> live member holding it (``Group.holders()``); shards held
            by the member itself do not block it.
        now_ms: the current time, used to arm the revocation deadline.
        grant_token: the fence token of shards granted in this step; None grants
            nothing (they stay pending).

    Returns:
        The new record; ``member`` itself when nothing changes.

    Raises:
        ValueError: the member is FENCED or EXPIRED.
    """
    if not member.is_live:
        raise ValueError(f"cannot reconcile member {member.member_id} in state {member.state}")
    if member.state is MemberState.STABLE and member.epoch == target_epoch:
        return member
    if member.state is MemberState.UNREVOKED:
        if owned is None or not owned.isdisjoint(member.pending_revocation):
            # No acknowledgement yet: the epoch stays frozen and the deadline runs.
            return member
        revoke_epoch = member.epoch + 1
    else:
        revoke_epoch = member.epoch
    return _next(member, revoke_epoch, target_epoch, target, owned, holders, now_ms, grant_token)


def _next(
    member: Member,
    revoke_epoch: int,
    target_epoch: int,
    target: frozenset[str],
    owned: frozenset[str] | None,
    holders: Mapping[str, str],
    now_ms: int,
    grant_token: int | None,
) -> Member:
    keep = {shard: epoch for shard, epoch in member.assigned.items() if shard in target}
    revoke = frozenset(shard for shard in member.assigned if shard not in target)
    if revoke and (owned is None or not owned.isdisjoint(revoke)):
        # Revoke first: new shards are not granted in the same step, and the epoch
        # stays where it is until the member acknowledges.
        return _result(
            member,
            state=MemberState.UNREVOKED,
            epoch=revoke_epoch,
            assigned=keep,
            pending_revocation=revoke,
            revocation_deadline_ms=now_ms + member.rebalance_timeout_ms,
        )
    unreleased = False
    assigned = dict(keep)
    for shard in target:
        if shard in keep:
            continue
        if grant_token is not None and holders.get(shard, member.member_id) == member.member_id:
            assigned[shard] = grant_token
        else:
            unreleased = True
    return _result(
        member,
        state=MemberState.UNRELEASED if unreleased else MemberState.STABLE,
        epoch=target_epoch,
        assigned=assigned,
        pending_revocation=frozenset(),
        revocation_deadline_ms=None,
    )


def _result(
    member: Member,
    *,
    state: MemberState,
    epoch: int,
    assigned: Mapping[str, int],
    pending_revocation: frozenset[str],
    revocation_deadline_ms: int | None,
) -> Member:
    if (
        state is member.state
        and epoch == member.epoch
        and assigned == member.assigned
        and pending_revocation == member.pending_revocation
        and revocation_deadline_ms == member.revocation_deadline_ms
    ):
        return member
    return replace(
        member,
        state=state,
        epoch=epoch,
        previous_epoch=member.epoch if epoch != member.epoch else member.previous_epoch,
        assigned=assigned,
        pending_revocation=pending_revocation,
        revocation_deadline_ms=revocation_deadline_ms,
    )
