"""The coordinator's state: groups, members, topology and configuration.

Everything here is an immutable value. The pure core computes new values from old
ones; the store persists them (one JSON document per member, plus a header
document for the group's other fields) and the service answers from them.

Times are integer milliseconds of the Redis server clock, supplied by the caller.
Shard ids are opaque strings ``stream/index@incarnation``; only the stream name (the
text before ``/``) is ever looked at here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from streamworks.coordinator.core.decoding import (
    optional_int,
    require_int,
    require_int_map,
    require_mapping,
    require_str,
    require_str_map,
    require_str_set,
)
from streamworks.coordinator.core.holders import holders_of, patched_holders
from streamworks.coordinator.core.maps import copy_map
from streamworks.exceptions import ConfigurationError

__all__ = (
    "CoreConfig",
    "FenceWrite",
    "Group",
    "GroupState",
    "Member",
    "MemberState",
    "Topology",
    "stream_of",
)

_K = TypeVar("_K")
_V = TypeVar("_V")


def _frozen_map(items: Mapping[_K, _V]) -> Mapping[_K, _V]:
    # A read-only view over a private copy: nobody holding the argument can mutate
    # the value afterwards, and equality still compares contents.
    return MappingProxyType(copy_map(items))


def _empty_map() -> Mapping[str, int]:
    return MappingProxyType({})


def stream_of(shard: str) -> str:
    """Return the stream name of a shard id (the text before the first ``/``)."""
    return shard.partition("/")[0]


class MemberState(StrEnum):
    """Server-side state of one member (KIP-848 ``MemberState`` plus two tombstones)."""

    #: Holds its whole target (or will once it heartbeats at a newer target epoch).
    STABLE = "STABLE"
    #: Must give up ``pending_revocation``; its epoch is frozen and a deadline runs.
    UNREVOKED = "UNREVOKED"
    #: At the target epoch, waiting for shards that other members still hold.
    UNRELEASED = "UNRELEASED"
    #: Fenced (revocation deadline passed). Kept so a stale heartbeat gets FENCED;
    #: a rejoin with epoch 0 replaces it.
    FENCED = "FENCED"
    #: Lease ran out or the member left. Kept for ``stale_member_retention_ms`` so a
    #: late heartbeat gets UNKNOWN_MEMBER, then removed.
    EXPIRED = "EXPIRED"

    @property
    def is_live(self) -> bool:
        """Whether a member in this state takes part in the group."""
        return self is not MemberState.FENCED and self is not MemberState.EXPIRED


class GroupState(StrEnum):
    """Derived state of a group (KIP-848 ``ConsumerGroup.maybeUpdateGroupState``)."""

    EMPTY = "EMPTY"
    ASSIGNING = "ASSIGNING"
    RECONCILING = "RECONCILING"
    STABLE = "STABLE"


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a group, as recorded in Redis.

    Attributes:
        member_id: client-generated id, stable for the member's process.
        epoch: the member epoch; 0 until its first reconciliation.
        previous_epoch: the epoch before the last change, accepted once more so a
            member whose response was lost can catch up.
        state: see :class:`MemberState`.
        subscriptions: stream names the member consumes.
        assigned: shard id -> fence token of its grant (``tokens.py``: above every token
            the group issued before, and above Redis time at the grant, so it never
            repeats one issued before a loss of writes). Keeping a shard across
            rebalances keeps its token, so its fence needs no rewrite.
        pending_revocation: shards the member must stop reading (DRAIN) before anyone
            else may receive them.
        target: this member's part of the group's target assignment.
        revocation_deadline_ms: while UNREVOKED, the time after which it is fenced.
        rebalance_timeout_ms: how long the member may take to revoke.
        client: free-form client information (host, pid, version).
        joined_at_ms: time of the join that created this record.
        expired_at_ms: when the record stopped being live (left, expired or fenced).
        quarantined: shards a FENCED tombstone still keeps from everyone else: the
            member was fenced while its lease was valid, so its handlers may still run
            until that lease would have expired (docs/guarantees.md#exclusive-processing).
        quarantined_until_ms: when ``quarantined`` is released (the fenced member's
            lease expiry, Redis time); None when nothing is quarantined.
    """

    member_id: str
    epoch: int
    previous_epoch: int
    state: MemberState
    subscriptions: frozenset[str]
    assigned: Mapping[str, int]
    pending_revocation: frozenset[str]
    target: frozenset[str]
    revocation_deadline_ms: int | None
    rebalance_timeout_ms: int
    client: Mapping[str, str]
    joined_at_ms: int
    expired_at_ms: int | None
    quarantined: frozenset[str] = frozenset()
    quarantined_until_ms: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", MemberState(self.state))
        object.__setattr__(self, "subscriptions", frozenset(self.subscriptions))
        object.__setattr__(self, "assigned", _frozen_map(self.assigned))
        object.__setattr__(self, "pending_revocation", frozenset(self.pending_revocation))
        object.__setattr__(self, "target", frozenset(self.target))
        object.__setattr__(self, "client", _frozen_map(self.client))
        object.__setattr__(self, "quarantined", frozenset(self.quarantined))
        if not self.member_id:
            raise ValueError("member_id must not be empty")
        if self.epoch < 0 or self.previous_epoch < 0:
            raise ValueError(f"member {self.member_id}: epochs must be >= 0")
        if self.rebalance_timeout_ms <= 0:
            raise ValueError(f"member {self.member_id}: rebalance_timeout_ms must be > 0")
        if not self.pending_revocation.isdisjoint(self.assigned):
            raise ValueError(f"member {self.member_id}: a shard is both assigned and revoked")
        if self.quarantined and (self.state.is_live or self.quarantined_until_ms is None):
            raise ValueError(
                f"member {self.member_id}: only a tombstone quarantines shards, until a time"
            )

    @classmethod
    def joining(
        cls,
        member_id: str,
        *,
        subscriptions: frozenset[str],
        rebalance_timeout_ms: int,
        client: Mapping[str, str],
        now_ms: int,
    ) -> Member:
        """A fresh record for a member joining with epoch 0: holds nothing yet."""
        return cls(
            member_id=member_id,
            epoch=0,
            previous_epoch=0,
            state=MemberState.STABLE,
            subscriptions=subscriptions,
            assigned={},
            pending_revocation=frozenset(),
            target=frozenset(),
            revocation_deadline_ms=None,
            rebalance_timeout_ms=rebalance_timeout_ms,
            client=client,
            joined_at_ms=now_ms,
            expired_at_ms=None,
        )

    @property
    def is_live(self) -> bool:
        """Whether the member takes part in the group (not FENCED or EXPIRED)."""
        return self.state.is_live

    def held(self) -> frozenset[str]:
        """Shards nobody else may receive because of this member: assigned, revoking,
        or quarantined by its tombstone."""
        return frozenset(self.assigned) | self.pending_revocation | self.quarantined

    def tombstone(
        self, state: MemberState, now_ms: int, *, quarantine_until_ms: int | None = None
    ) -> Member:
        """This record after the member stopped being live: it targets nothing and holds
        nothing, except, with ``quarantine_until_ms`` after ``now_ms``, the shards it
        held, until then (a member fenced while its lease was still valid)."""
        if state.is_live:
            raise ValueError(f"tombstone state must be FENCED or EXPIRED, not {state}")
        held = self.held()
        quarantine = quarantine_until_ms is not None and quarantine_until_ms > now_ms and held
        return replace(
            self,
            state=state,
            assigned={},
            pending_revocation=frozenset(),
            target=frozenset(),
            revocation_deadline_ms=None,
            expired_at_ms=now_ms,
            quarantined=held if quarantine else frozenset(),
            quarantined_until_ms=quarantine_until_ms if quarantine else None,
        )

    def released(self) -> Member:
        """This tombstone with its quarantine lifted."""
        return replace(self, quarantined=frozenset(), quarantined_until_ms=None)

    def to_dict(self) -> dict[str, object]:
        """A JSON-able document of this record, with sorted collections (stable output)."""
        return {
            "member_id": self.member_id,
            "epoch": self.epoch,
            "previous_epoch": self.previous_epoch,
            "state": self.state.value,
            "subscriptions": sorted(self.subscriptions),
            "assigned": {shard: self.assigned[shard] for shard in sorted(self.assigned)},
            "pending_revocation": sorted(self.pending_revocation),
            "target": sorted(self.target),
            "revocation_deadline_ms": self.revocation_deadline_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "client": {key: self.client[key] for key in sorted(self.client)},
            "joined_at_ms": self.joined_at_ms,
            "expired_at_ms": self.expired_at_ms,
            "quarantined": sorted(self.quarantined),
            "quarantined_until_ms": self.quarantined_until_ms,
        }

    @classmethod
    def from_dict(cls, data: object) -> Member:
        """Decode a document written by :meth:`to_dict`.

        Unknown keys are ignored (a newer coordinator may add fields).

        Raises:
            ValueError: the document is malformed; it is never repaired or guessed.
        """
        doc = require_mapping(data, "member")
        try:
            state = MemberState(require_str(doc, "state"))
        except ValueError:
            raise ValueError(f"member: unknown state {doc.get('state')!r}") from None
        return cls(
            member_id=require_str(doc, "member_id"),
            epoch=require_int(doc, "epoch"),
            previous_epoch=require_int(doc, "previous_epoch"),
            state=state,
            subscriptions=require_str_set(doc, "subscriptions"),
            assigned=require_int_map(doc, "assigned"),
            pending_revocation=require_str_set(doc, "pending_revocation"),
            target=require_str_set(doc, "target"),
            revocation_deadline_ms=optional_int(doc, "revocation_deadline_ms"),
            rebalance_timeout_ms=require_int(doc, "rebalance_timeout_ms"),
            client=require_str_map(doc, "client"),
            joined_at_ms=require_int(doc, "joined_at_ms"),
            expired_at_ms=optional_int(doc, "expired_at_ms"),
            # Absent in records written before quarantines existed.
            quarantined=(
                require_str_set(doc, "quarantined") if "quarantined" in doc else frozenset()
            ),
            quarantined_until_ms=(
                optional_int(doc, "quarantined_until_ms") if "quarantined_until_ms" in doc else None
            ),
        )


@dataclass(frozen=True, slots=True)
class Group:
    """A consumer group: its epochs and its members.

    Attributes:
        group_id: the group's name.
        group_epoch: bumped by every change of membership, subscriptions or the
            layout of a subscribed stream.
        target_epoch: the group epoch the current target assignment was computed at.
        metadata_version: what members must know about the group's streams; bumped
            with the group epoch on membership, subscription and topology changes.
        topology_version: stream -> layout version the current target was computed from.
        last_assignment_ms: when the current target was computed.
        members: member id -> record, including FENCED and EXPIRED tombstones.
        last_token: the highest fence token the group issued (``tokens.py``).
    """

    group_id: str
    group_epoch: int = 0
    target_epoch: int = 0
    metadata_version: int = 0
    topology_version: Mapping[str, int] = field(default_factory=_empty_map)
    last_assignment_ms: int = 0
    members: Mapping[str, Member] = field(default_factory=lambda: MappingProxyType({}))
    last_token: int = 0
    # Derived from ``members`` on first use (the group is immutable, so they never go
    # stale): a heartbeat on a large group must not rebuild them every time. A group
    # built by ``GroupEdit`` gets them patched from its original's (O(what changed)).
    _holders: Mapping[str, str] | None = field(default=None, init=False, compare=False, repr=False)
    # stream -> number of live members subscribing to it.
    _subscribers: Mapping[str, int] | None = field(
        default=None, init=False, compare=False, repr=False
    )
    _live_count: int | None = field(default=None, init=False, compare=False, repr=False)
    _deadline: tuple[int | None, ...] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "topology_version", _frozen_map(self.topology_version))
        object.__setattr__(self, "members", _frozen_map(self.members))
        if min(self.group_epoch, self.target_epoch, self.metadata_version, self.last_token) < 0:
            raise ValueError(f"group {self.group_id}: epochs, versions and tokens must be >= 0")
        if self.target_epoch > self.group_epoch:
            raise ValueError(f"group {self.group_id}: target epoch above group epoch")
        for member_id, member in self.members.items():
            if member_id != member.member_id:
                raise ValueError(
                    f"group {self.group_id}: member keyed {member_id!r} is {member.member_id!r}"
                )

    @property
    def state(self) -> GroupState:
        """The derived group state (KIP-848 §5)."""
        live = [m for m in self.members.values() if m.is_live]
        if not live:
            return GroupState.EMPTY
        if self.group_epoch > self.target_epoch:
            return GroupState.ASSIGNING
        for member in live:
            if member.state is not MemberState.STABLE or member.epoch != self.target_epoch:
                return GroupState.RECONCILING
        return GroupState.STABLE

    def live_members(self) -> dict[str, Member]:
        """Members taking part in the group (not FENCED or EXPIRED), by id."""
        return {mid: m for mid, m in self.members.items() if m.is_live}

    def live_count(self) -> int:
        """How many members are live (computed once per group state)."""
        if self._live_count is None:
            object.__setattr__(
                self, "_live_count", sum(1 for m in self.members.values() if m.is_live)
            )
        assert self._live_count is not None
        return self._live_count

    def live_subscriptions(self) -> frozenset[str]:
        """Streams any live member subscribes to (computed once per group state)."""
        return frozenset(self.subscribers())

    def subscribers(self) -> Mapping[str, int]:
        """Stream -> how many live members subscribe to it (computed once per group state)."""
        if self._subscribers is None:
            counts: dict[str, int] = {}
            for member in self.members.values():
                if member.is_live:
                    for stream in member.subscriptions:
                        counts[stream] = counts.get(stream, 0) + 1
            object.__setattr__(self, "_subscribers", MappingProxyType(counts))
        assert self._subscribers is not None
        return self._subscribers

    @classmethod
    def _trusted(
        cls,
        original: Group,
        members: Mapping[str, Member],
        touched: Iterable[str],
        *,
        group_epoch: int,
        target_epoch: int,
        metadata_version: int,
        topology_version: Mapping[str, int],
        last_assignment_ms: int,
        last_token: int,
    ) -> Group:
        """A group derived from ``original`` by replacing the records in ``touched``.

        ``members`` is a private dict nobody else writes (it is not copied), or
        ``original.members`` itself, in which
        only the ``touched`` records differ from ``original``'s, each keyed by its own
        id; so the checks of ``__post_init__`` hold except the epoch ones, which are
        re-checked here, and the derived maps are patched from ``original``'s in
        O(touched) instead of being rebuilt in O(members + shards).
        """
        if min(group_epoch, target_epoch, metadata_version, last_token) < 0:
            raise ValueError(f"group {original.group_id}: epochs, versions and tokens must be >= 0")
        if target_epoch > group_epoch:
            raise ValueError(f"group {original.group_id}: target epoch above group epoch")
        group = object.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(group, "group_id", original.group_id)
        setattr_(group, "group_epoch", group_epoch)
        setattr_(group, "target_epoch", target_epoch)
        setattr_(group, "metadata_version", metadata_version)
        setattr_(group, "topology_version", _frozen_map(topology_version))
        setattr_(group, "last_assignment_ms", last_assignment_ms)
        setattr_(group, "last_token", last_token)
        shared = members is original.members
        setattr_(group, "members", members if shared else MappingProxyType(members))
        setattr_(group, "_deadline", None)
        ids = list(touched)
        before = original.members
        setattr_(group, "_holders", None)
        if original._holders is not None:
            holders = patched_holders(original, members, ids)
            setattr_(group, "_holders", MappingProxyType(holders))
        setattr_(group, "_live_count", None)
        setattr_(group, "_subscribers", None)
        if original._live_count is not None and original._subscribers is not None:
            live = original._live_count
            counts = copy_map(original._subscribers)
            for member_id in ids:
                for record, sign in ((before.get(member_id), -1), (members.get(member_id), 1)):
                    if record is not None and record.is_live:
                        live += sign
                        for stream in record.subscriptions:
                            counts[stream] = counts.get(stream, 0) + sign
                            if not counts[stream]:
                                del counts[stream]
            setattr_(group, "_live_count", live)
            setattr_(group, "_subscribers", MappingProxyType(counts))
        return group

    def holders(self) -> Mapping[str, str]:
        """Shard -> id of the live member holding it, in ``assigned`` or ``pending_revocation``
        (computed once per group state)."""
        if self._holders is None:
            object.__setattr__(self, "_holders", MappingProxyType(self._compute_holders()))
        assert self._holders is not None
        return self._holders

    def _compute_holders(self) -> dict[str, str]:
        return holders_of(self.members)

    def timer_deadlines(self) -> tuple[int | None, ...]:
        """``(earliest revocation deadline, earliest tombstone expiry)``, None where
        there is none; computed once per group state, so the event loop tells an idle
        group from a due one without walking its members on every pass."""
        if self._deadline is None:
            revocation: int | None = None
            expiry: int | None = None
            for member in self.members.values():
                if member.state is MemberState.UNREVOKED:
                    d = member.revocation_deadline_ms
                    if d is not None and (revocation is None or d < revocation):
                        revocation = d
                elif not member.is_live and member.expired_at_ms is not None:
                    e = member.expired_at_ms
                    if expiry is None or e < expiry:
                        expiry = e
            object.__setattr__(self, "_deadline", (revocation, expiry))
        assert self._deadline is not None
        return self._deadline

    def to_header(self) -> dict[str, object]:
        """A JSON-able document of every field except ``members``."""
        return {
            "group_id": self.group_id,
            "group_epoch": self.group_epoch,
            "target_epoch": self.target_epoch,
            "metadata_version": self.metadata_version,
            "topology_version": {
                s: self.topology_version[s] for s in sorted(self.topology_version)
            },
            "last_assignment_ms": self.last_assignment_ms,
            "last_token": self.last_token,
        }

    @classmethod
    def from_header(cls, header: object, members: Iterable[Member] = ()) -> Group:
        """Rebuild a group from :meth:`to_header` output and its member records.

        Raises:
            ValueError: the header is malformed or a member id appears twice.
        """
        doc = require_mapping(header, "group header")
        by_id: dict[str, Member] = {}
        for member in members:
            if member.member_id in by_id:
                raise ValueError(f"duplicate member {member.member_id!r}")
            by_id[member.member_id] = member
        return cls(
            group_id=require_str(doc, "group_id"),
            group_epoch=require_int(doc, "group_epoch"),
            target_epoch=require_int(doc, "target_epoch"),
            metadata_version=require_int(doc, "metadata_version"),
            topology_version=require_int_map(doc, "topology_version"),
            last_assignment_ms=require_int(doc, "last_assignment_ms"),
            members=by_id,
            # Absent in headers written before fence tokens: the tokens issued then were
            # grant epochs, none above the group epoch.
            last_token=require_int(doc, "last_token" if "last_token" in doc else "group_epoch"),
        )


@dataclass(frozen=True, slots=True)
class Topology:
    """The assignable shards of every stream, as the coordinator currently sees them.

    Attributes:
        shards: stream -> its assignable shard ids (ACTIVE and DRAINING) in routing
            order. Retired shards are absent; a stream missing here has no shards.
        versions: stream -> version of its shard layout; a changed version of a
            subscribed stream triggers a new target assignment.
    """

    shards: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    versions: Mapping[str, int] = field(default_factory=_empty_map)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "shards", MappingProxyType({s: tuple(ids) for s, ids in self.shards.items()})
        )
        object.__setattr__(self, "versions", _frozen_map(self.versions))
        for stream, ids in self.shards.items():
            if len(set(ids)) != len(ids):
                raise ValueError(f"topology: duplicate shard id in stream {stream!r}")
            for shard in ids:
                if stream_of(shard) != stream:
                    raise ValueError(f"topology: shard {shard!r} listed under stream {stream!r}")

    def shards_of(self, stream: str) -> tuple[str, ...]:
        """Assignable shards of ``stream`` (empty if it has none)."""
        return self.shards.get(stream, ())

    def version_of(self, stream: str) -> int:
        """Layout version of ``stream`` (0 if unknown)."""
        return self.versions.get(stream, 0)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Timing knobs of the coordinator core (all milliseconds).

    Attributes:
        lease_ttl_ms: a member not heartbeating for this long is expired.
        rebalance_timeout_ms: default revocation timeout when the member sends none.
        heartbeat_interval_ms: interval told to members with nothing in flight.
        fast_heartbeat_interval_ms: interval told to members that have pending shards
            or revocations, so hand-offs finish quickly.
        stale_member_retention_ms: how long FENCED/EXPIRED records are kept.
        assignment_interval_ms: batching of target computation; when > 0 a new target
            is computed at most once per interval (members keep reconciling against
            the last one meanwhile). 0 computes on every change.
    """

    lease_ttl_ms: int = 10_000
    rebalance_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 1_000
    fast_heartbeat_interval_ms: int = 200
    stale_member_retention_ms: int = 600_000
    assignment_interval_ms: int = 0

    def __post_init__(self) -> None:
        for name in (
            "lease_ttl_ms",
            "rebalance_timeout_ms",
            "heartbeat_interval_ms",
            "fast_heartbeat_interval_ms",
            "stale_member_retention_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0")
        if self.assignment_interval_ms < 0:
            raise ConfigurationError("assignment_interval_ms must be >= 0")
        if self.heartbeat_interval_ms >= self.lease_ttl_ms:
            # A member must be able to renew its lease several times before it runs out.
            raise ConfigurationError("heartbeat_interval_ms must be below lease_ttl_ms")


@dataclass(frozen=True, slots=True)
class FenceWrite:
    """An owner fence the shell must write (monotonically) before answering.

    Attributes:
        shard: the shard id.
        member_id: the member the shard is granted to.
        token: the grant's fence token; the fence reads ``f"{token}:{member_id}"``.
    """

    shard: str
    member_id: str
    token: int
