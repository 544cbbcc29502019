"""The member heartbeat, as a pure step (docs/protocol.md#heartbeat, KIP-848 §3 and §7).

``heartbeat(group, topology, request, now_ms, config)`` validates the request,
applies it to the group and says what to write and answer:

0. **Stale** (its sequence number is not above the newest one the coordinator acted
   on for this member: a delayed, duplicated or re-sent request): nothing is acted on
   (no write, no lease, no grant, no revocation completed by its report); the result
   is the record as it stands, marked ``stale``, and the shell refuses the request
   (retryable: the member sends a new one).
1. **Leave** (epoch -1): the member's record is removed, its shards are freed at once,
   the group epoch is bumped. Leaving twice, or as an unknown member, is a no-op.
2. **Join** (epoch 0): a fresh record replaces any previous one with the same id
   (live, FENCED or EXPIRED: the member dropped everything before rejoining), and
   the group epoch is bumped.
3. **Known member** (epoch > 0): unknown or EXPIRED -> ``UNKNOWN_MEMBER``; FENCED ->
   ``FENCED``. A metadata version above the recorded one means Redis lost writes:
   ``SYNC_METADATA``, which grants nothing (the member drops every shard and rejoins;
   E19). An epoch above the group epoch was never issued from this metadata:
   ``FENCED``. Otherwise the epoch must be the stored one, or the previous one with
   nothing owned beyond ``assigned`` (a lost response), else ``FENCED``. Subscription
   and client changes are applied.
4. A subscription change, or a new layout of a subscribed stream, bumps the group
   epoch once; a pending target is computed if due (``targets.py``); the member is
   reconciled (``reconcile.py``); every newly granted shard gets a fence token
   (``tokens.py``) and a :class:`FenceWrite`.

Only a request valid for its member changes anything: refusals (``UNKNOWN_MEMBER``,
``FENCED``, ``SYNC_METADATA``) and stale requests write nothing at all, so no number a
request carries can move the group's epochs. Member reports are used for
reconciliation and fencing only, never copied into group metadata (E20). What a loss
of Redis writes must not repeat — the fence tokens handed to members — does not
depend on epochs (``tokens.py``).

While a target computation is deferred by batching, members keep reconciling
(and receiving freed shards) against the last target, as in Kafka. While grants are
held (``hold_grants``: the Redis clock stepped, ``clock_steps.py``) members keep their
shards and revoke, but receive nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from streamworks.coordinator.core.changes import GroupChange, GroupEdit
from streamworks.coordinator.core.model import (
    CoreConfig,
    FenceWrite,
    Group,
    Member,
    MemberState,
    Topology,
)
from streamworks.coordinator.core.reconcile import reconcile_member
from streamworks.coordinator.core.targets import compute_target, note_topology_change, target_due
from streamworks.exceptions import StreamworksError
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import NAME_PATTERN

__all__ = (
    "MAX_EPOCH",
    "MAX_SEQUENCE",
    "HeartbeatInput",
    "HeartbeatResult",
    "HeartbeatStatus",
    "InvalidHeartbeat",
    "heartbeat",
)

#: Largest epoch or version a request may carry (int32, as in Kafka); keeps every
#: number exact in Lua (doubles). A report above what the group issued is refused anyway.
MAX_EPOCH = 2**31 - 1

#: Largest request sequence number (exact in Lua's doubles and in JSON).
MAX_SEQUENCE = 2**53 - 1

_NO_SHARDS: Mapping[str, int] = MappingProxyType({})


class InvalidHeartbeat(StreamworksError, ValueError):
    """The heartbeat request breaks the protocol (HTTP 400 ``INVALID_REQUEST``)."""


@dataclass(frozen=True, slots=True)
class HeartbeatInput:
    """A member's heartbeat request.

    Attributes:
        member_id: client-generated id, stable for the process.
        member_epoch: 0 to join, the current epoch otherwise, -1 to leave.
        metadata_version: the last metadata version the member saw (0 on join).
        subscriptions: streams to consume; None = unchanged. Required on join.
        owned: shards the member reads or has in-flight work for; None = not reported.
        revoking: shards it was told to drain and still drains.
        rebalance_timeout_ms: its revocation timeout; None = unchanged / default.
        client: client information; None = unchanged.
        fence_failed: shards whose fenced read failed (or whose grant the member
            refused, its token being below one it saw) although the member was told
            it holds them; the coordinator re-grants those it still lists as the
            member's under a fresh token and rewrites their fences.
        sequence: the request's sequence number; the member numbers every new request
            and re-sends a request with its number. None: a client that does not
            number its requests (nothing is then recognised as stale).
        last_sequence: the newest sequence number the coordinator acted on for this
            member (supplied by the shell from the store; 0: none).
    """

    member_id: str
    member_epoch: int
    metadata_version: int
    subscriptions: frozenset[str] | None = None
    owned: frozenset[str] | None = None
    revoking: frozenset[str] = frozenset()
    rebalance_timeout_ms: int | None = None
    client: Mapping[str, str] | None = None
    fence_failed: frozenset[str] = frozenset()
    sequence: int | None = None
    last_sequence: int = 0

    @property
    def stale(self) -> bool:
        """Whether the coordinator acted on this request, or a newer one, already."""
        return self.sequence is not None and self.sequence <= self.last_sequence

    def reported(self) -> frozenset[str] | None:
        """Everything the member still reads or drains (owned | revoking), if reported."""
        if self.owned is None:
            return None
        return self.owned | self.revoking


@dataclass(frozen=True, slots=True)
class HeartbeatResult(GroupChange):
    """What to write and what to answer.

    Attributes:
        status: see :class:`HeartbeatStatus`.
        member_epoch: the member's epoch (-1 after leaving, 0 with FENCED,
            UNKNOWN_MEMBER or SYNC_METADATA: drop every shard and rejoin with epoch 0).
        assigned: shard -> fence token; the member may read these now (their
            fences are among ``fences`` or already written).
        pending: target shards not granted yet (another member still holds them,
            or this member must finish revoking first).
        revoke: shards to DRAIN and then stop reporting.
        heartbeat_interval_ms: when to heartbeat next; short while anything is
            pending or revoking.
        lease_ttl_ms: the member's lease.
        stale: the request was stale: answered from the record, nothing acted on.
    """

    status: HeartbeatStatus
    member_epoch: int
    assigned: Mapping[str, int]
    pending: frozenset[str]
    revoke: frozenset[str]
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    stale: bool = False

    @property
    def renews_lease(self) -> bool:
        """Whether the shell renews the member's lease: the request acted, the member
        is live afterwards and was answered OK (after a leave the lease is dropped;
        SYNC_METADATA renews nothing: the member drops its shards and rejoins)."""
        return not self.stale and self.status is HeartbeatStatus.OK and self.member_epoch >= 0


def heartbeat(
    group: Group,
    topology: Topology,
    request: HeartbeatInput,
    now_ms: int,
    config: CoreConfig,
    *,
    hold_grants: bool = False,
) -> HeartbeatResult:
    """Apply one heartbeat to ``group``.

    Args:
        group: the group as loaded from Redis.
        topology: assignable shards of every stream, with layout versions.
        request: the member's request.
        now_ms: Redis server time.
        config: timing knobs.
        hold_grants: grant nothing new (shards stay pending; fence repairs wait).

    Returns:
        The new state, what changed (the shell writes only that, fences first), and
        the answer. A heartbeat that changes nothing has no changed members, no
        header change and no fences: the shell only renews the lease.

    Raises:
        InvalidHeartbeat: the request breaks the protocol.
    """
    _validate(request)
    edit = GroupEdit(group)
    if request.stale:
        return _stale(edit, request.member_id, config)
    if request.member_epoch == -1:
        return _leave(edit, request.member_id, now_ms, config)
    if request.member_epoch == 0:
        _join(edit, request, now_ms, config)
        bumped = True
    else:
        current = edit.member(request.member_id)
        if current is None or current.state is MemberState.EXPIRED:
            return _refusal(edit, HeartbeatStatus.UNKNOWN_MEMBER, config)
        if current.state is MemberState.FENCED:
            return _refusal(edit, HeartbeatStatus.FENCED, config)
        if request.metadata_version > group.metadata_version:
            # The member saw metadata Redis no longer has (a failover or restore lost
            # writes): what it holds was granted under that metadata. Nothing of the
            # report is trusted or written; it drops every shard and rejoins, and gets
            # its shards again only as fresh grants, under new tokens (E19).
            return _refusal(edit, HeartbeatStatus.SYNC_METADATA, config)
        if request.member_epoch > group.group_epoch or not _epoch_accepted(current, request):
            # An epoch above the group epoch was never issued from this metadata: the
            # same loss of writes, or a request that lies. Refused, nothing written.
            return _refusal(edit, HeartbeatStatus.FENCED, config)
        bumped = _apply_updates(edit, current, request)
    if bumped:
        edit.bump()
    else:
        note_topology_change(edit, topology)
    if target_due(edit, now_ms, config):
        compute_target(edit, topology, now_ms)
    member = edit.member(request.member_id)
    assert member is not None  # put by _join or present since the checks above
    reconciled = _reconcile(edit, member, request, now_ms, hold_grants)
    repair = frozenset() if hold_grants else request.fence_failed
    reconciled, fences = _fences(edit, member, reconciled, repair, now_ms)
    if reconciled != member:
        edit.put(reconciled)
    return _answer(edit, HeartbeatStatus.OK, reconciled, fences, config)


def _validate(request: HeartbeatInput) -> None:
    if not isinstance(request.member_id, str) or not request.member_id:
        raise InvalidHeartbeat("member_id must be a non-empty string")
    if request.member_epoch < -1 or request.member_epoch > MAX_EPOCH:
        raise InvalidHeartbeat(
            f"member_epoch must be -1, 0 or a current epoch, not {request.member_epoch}"
        )
    if request.metadata_version < 0 or request.metadata_version > MAX_EPOCH:
        raise InvalidHeartbeat(f"metadata_version out of range: {request.metadata_version}")
    if request.sequence is not None and not 0 < request.sequence <= MAX_SEQUENCE:
        raise InvalidHeartbeat(f"sequence must be in 1..2**53-1, not {request.sequence}")
    if request.rebalance_timeout_ms is not None and request.rebalance_timeout_ms <= 0:
        raise InvalidHeartbeat("rebalance_timeout_ms must be > 0")
    if request.subscriptions is not None:
        for stream in request.subscriptions:
            if not NAME_PATTERN.fullmatch(stream):
                raise InvalidHeartbeat(f"invalid stream name in subscriptions: {stream!r}")
    if request.member_epoch == 0:
        if not request.subscriptions:
            raise InvalidHeartbeat("a join (epoch 0) needs non-empty subscriptions")
        if request.owned or request.revoking:
            raise InvalidHeartbeat("a join (epoch 0) must not own or revoke shards")


def _leave(edit: GroupEdit, member_id: str, now_ms: int, config: CoreConfig) -> HeartbeatResult:
    if edit.retire(member_id, MemberState.EXPIRED, now_ms):
        # A member that left needs no tombstone: a late heartbeat from it finds no
        # record and gets UNKNOWN_MEMBER all the same, and operators do not see it as
        # EXPIRED for the retention period. Its shards were freed by the retirement.
        edit.remove(member_id)
        edit.bump()
        edit.settle_if_empty()
    group, changed, removed, header_changed = edit.finish()
    return HeartbeatResult(
        group=group,
        changed_members=changed,
        removed_members=removed,
        header_changed=header_changed,
        fences=(),
        status=HeartbeatStatus.OK,
        member_epoch=-1,
        assigned=_NO_SHARDS,
        pending=frozenset(),
        revoke=frozenset(),
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        lease_ttl_ms=config.lease_ttl_ms,
    )


def _join(edit: GroupEdit, request: HeartbeatInput, now_ms: int, config: CoreConfig) -> None:
    assert request.subscriptions is not None  # checked by _validate
    edit.put(
        Member.joining(
            request.member_id,
            subscriptions=request.subscriptions,
            rebalance_timeout_ms=request.rebalance_timeout_ms or config.rebalance_timeout_ms,
            client=request.client or {},
            now_ms=now_ms,
        )
    )


def _epoch_accepted(member: Member, request: HeartbeatInput) -> bool:
    """KIP-848 ``throwIfConsumerGroupMemberEpochIsInvalid``."""
    if request.member_epoch == member.epoch:
        return True
    if request.member_epoch > member.epoch:
        return False
    # Below the stored epoch: only the previous epoch, and only if the member owns
    # nothing it has not been granted, i.e. it merely missed the last response.
    reported = request.reported()
    return (
        request.member_epoch == member.previous_epoch
        and reported is not None
        and reported.issubset(member.assigned)
    )


def _apply_updates(edit: GroupEdit, member: Member, request: HeartbeatInput) -> bool:
    """Apply changed subscriptions, timeout and client info; True if subscriptions changed."""
    updated = member
    subscriptions_changed = (
        request.subscriptions is not None and request.subscriptions != member.subscriptions
    )
    if subscriptions_changed:
        assert request.subscriptions is not None
        updated = replace(updated, subscriptions=request.subscriptions)
    if request.rebalance_timeout_ms is not None:
        updated = replace(updated, rebalance_timeout_ms=request.rebalance_timeout_ms)
    if request.client is not None:
        updated = replace(updated, client=request.client)
    if updated != member:
        edit.put(updated)
    return subscriptions_changed


def _reconcile(
    edit: GroupEdit, member: Member, request: HeartbeatInput, now_ms: int, hold_grants: bool
) -> Member:
    if member.state is MemberState.STABLE and member.epoch == edit.target_epoch:
        return member  # reconciled already; skip building the holders map
    token = None if hold_grants else edit.peek_token(now_ms)
    reconciled = reconcile_member(
        member,
        edit.target_epoch,
        member.target,
        request.reported(),
        edit.holders(),
        now_ms,
        token,
    )
    if token is not None and token in reconciled.assigned.values():
        edit.take_token(token)  # above every earlier token: only a new grant has it
    return reconciled


def _fences(
    edit: GroupEdit, before: Member, after: Member, fence_failed: frozenset[str], now_ms: int
) -> tuple[Member, tuple[FenceWrite, ...]]:
    """Fences for newly granted shards, and repairs of fences the member reported failed.

    A repair re-grants the shard under a fresh token, above every token the group
    issued, so the rewrite is accepted by the monotonic fence script, and the member's
    readers (and its handlers' ``ctx.fencing_token``) move up, never down. A repair is
    a grant: it waits while grants are held (the reconciled step then took no token,
    and the member keeps reporting the shard).
    """
    assigned = dict(after.assigned)
    repair = sorted(shard for shard in fence_failed if shard in assigned)
    if repair:
        token = edit.peek_token(now_ms)
        edit.take_token(token)
        for shard in repair:
            assigned[shard] = token
        after = replace(after, assigned=assigned)
    fences = tuple(
        FenceWrite(shard, after.member_id, token)
        for shard, token in sorted(assigned.items())
        if before.assigned.get(shard) != token
    )
    return after, fences


def _stale(edit: GroupEdit, member_id: str, config: CoreConfig) -> HeartbeatResult:
    """The answer to a stale request: the record as it stands, nothing acted on."""
    member = edit.member(member_id)
    if member is None or member.state is MemberState.EXPIRED:
        return _refusal(edit, HeartbeatStatus.UNKNOWN_MEMBER, config)
    if member.state is MemberState.FENCED:
        return _refusal(edit, HeartbeatStatus.FENCED, config)
    return replace(_answer(edit, HeartbeatStatus.OK, member, (), config), stale=True)


def _refusal(edit: GroupEdit, status: HeartbeatStatus, config: CoreConfig) -> HeartbeatResult:
    group, changed, removed, header_changed = edit.finish()
    return HeartbeatResult(
        group=group,
        changed_members=changed,
        removed_members=removed,
        header_changed=header_changed,
        fences=(),
        status=status,
        member_epoch=0,
        assigned=_NO_SHARDS,
        pending=frozenset(),
        revoke=frozenset(),
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        lease_ttl_ms=config.lease_ttl_ms,
    )


def _answer(
    edit: GroupEdit,
    status: HeartbeatStatus,
    member: Member,
    fences: tuple[FenceWrite, ...],
    config: CoreConfig,
) -> HeartbeatResult:
    group, changed, removed, header_changed = edit.finish()
    pending = member.target.difference(member.assigned)
    busy = bool(pending or member.pending_revocation)
    return HeartbeatResult(
        group=group,
        changed_members=changed,
        removed_members=removed,
        header_changed=header_changed,
        fences=fences,
        status=status,
        member_epoch=member.epoch,
        assigned=member.assigned,
        pending=pending,
        revoke=member.pending_revocation,
        heartbeat_interval_ms=(
            config.fast_heartbeat_interval_ms if busy else config.heartbeat_interval_ms
        ),
        lease_ttl_ms=config.lease_ttl_ms,
    )
