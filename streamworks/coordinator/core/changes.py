"""What a step of the core changed, so the shell writes only that.

:class:`GroupChange` is the common result of every pure step: the new group plus
the member records to write or delete and whether the header changed. The store
persists one document per member, so a heartbeat touching one member writes
O(that member), not O(group).

:class:`GroupEdit` is the mutable scratch pad the steps use internally: it copies
the member map only on the first write and computes the change set by comparing
the result with the original, so a step that ends where it started reports no
change even if it touched records on the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from streamworks.coordinator.core.holders import patched_holders
from streamworks.coordinator.core.maps import copy_map
from streamworks.coordinator.core.model import (
    FenceWrite,
    Group,
    Member,
    MemberState,
)
from streamworks.coordinator.core.tokens import next_token

__all__ = ("GroupChange", "GroupEdit", "TimerResult", "apply_delta", "chain")


@dataclass(frozen=True, slots=True)
class GroupChange:
    """The outcome of one pure step.

    Attributes:
        group: the new group state.
        changed_members: ids whose record changed, was added, or must be deleted.
        removed_members: ids whose record must be deleted (a subset of the above).
        header_changed: whether any non-member field of the group changed.
        fences: owner fences to write, before answering, for every newly granted shard.
    """

    group: Group
    changed_members: frozenset[str]
    removed_members: frozenset[str]
    header_changed: bool
    fences: tuple[FenceWrite, ...]

    @property
    def is_noop(self) -> bool:
        """True when nothing needs to be written (not even a fence)."""
        return not (self.changed_members or self.header_changed or self.fences)


def chain(original: Group, steps: Sequence[GroupChange]) -> GroupChange:
    """What one commit writes for ``steps`` applied in turn, each to the previous one's
    group (the first to ``original``): the last group, every record any step changed
    (deleted if it is gone at the end: a record removed and written again is written),
    the header if any step changed it, and every step's fences in step order (a fence
    of a later step on the same shard is written after, as it would have been).

    Raises:
        ValueError: a step of another group.
    """
    group = original
    changed: set[str] = set()
    header_changed = False
    fences: list[FenceWrite] = []
    for step in steps:
        if step.group.group_id != group.group_id:
            raise ValueError(f"step of group {step.group.group_id!r} chained to {group.group_id!r}")
        changed |= step.changed_members
        header_changed = header_changed or step.header_changed
        fences += step.fences
        group = step.group
    removed = frozenset(mid for mid in changed if mid not in group.members)
    return GroupChange(group, frozenset(changed), removed, header_changed, tuple(fences))


@dataclass(frozen=True, slots=True)
class TimerResult(GroupChange):
    """The outcome of a timer step (``timers.py``); it never grants, so no fences."""


class GroupEdit:
    """A group being changed by one step. Internal to the core."""

    __slots__ = (
        "_built",
        "_members",
        "_touched",
        "group_epoch",
        "last_assignment_ms",
        "last_token",
        "metadata_version",
        "original",
        "target_epoch",
        "topology_version",
    )

    def __init__(self, group: Group) -> None:
        self.original = group
        self.group_epoch = group.group_epoch
        self.target_epoch = group.target_epoch
        self.metadata_version = group.metadata_version
        self.topology_version: Mapping[str, int] = group.topology_version
        self.last_assignment_ms = group.last_assignment_ms
        self.last_token = group.last_token
        self._members: dict[str, Member] | None = None
        self._touched: set[str] = set()
        self._built = False

    @property
    def members(self) -> Mapping[str, Member]:
        """The current member records (read-only view)."""
        return self.original.members if self._members is None else self._members

    def member(self, member_id: str) -> Member | None:
        """The current record of ``member_id``, if any."""
        return self.members.get(member_id)

    def live_members(self) -> dict[str, Member]:
        """Current live members by id."""
        return {mid: m for mid, m in self.members.items() if m.is_live}

    def holders(self) -> Mapping[str, str]:
        """Shard -> live holder, over the current records (see ``Group.holders``).

        The original group's map is computed once per group state; this patches it for
        the members touched in this step, so a heartbeat on a large group costs
        O(what changed), not O(members).
        """
        if not self._touched:
            return self.original.holders()
        return patched_holders(self.original, self.members, self._touched)

    def put(self, member: Member) -> None:
        """Add or replace a member record."""
        self._writable()[member.member_id] = member
        self._touched.add(member.member_id)

    def remove(self, member_id: str) -> None:
        """Delete a member record."""
        self._writable().pop(member_id, None)
        self._touched.add(member_id)

    def _writable(self) -> dict[str, Member]:
        # One C-level copy of the member map per step (on the first write), never a
        # per-member walk; a map handed to a built group is never written again.
        if self._members is None or self._built:
            self._members = copy_map(self.members)
            self._built = False
        return self._members

    def bump(self) -> None:
        """Bump the group epoch (and metadata version) for a change of membership,
        subscriptions or topology."""
        self.group_epoch += 1
        self.metadata_version += 1

    def peek_token(self, now_ms: int) -> int:
        """The fence token the next grant of this step gets (``tokens.py``); it is
        recorded only if :meth:`take_token` is called with it."""
        return next_token(self.last_token, now_ms)

    def take_token(self, token: int) -> None:
        """Record ``token`` as issued (every later token is above it)."""
        self.last_token = max(self.last_token, token)

    def raise_token_floor(self, token: int) -> None:
        """Make every token issued from now on exceed ``token``: a fence in Redis holds
        a token the metadata never recorded, so Redis lost writes of this group."""
        self.take_token(token)

    def retire(
        self,
        member_id: str,
        state: MemberState,
        now_ms: int,
        *,
        quarantine_until_ms: int | None = None,
    ) -> bool:
        """Turn a live member into a FENCED/EXPIRED tombstone holding nothing (or, with
        ``quarantine_until_ms``, keeping its shards from others until then).

        Returns:
            True if the member was live (the caller bumps the group epoch once).
        """
        member = self.member(member_id)
        if member is None or not member.is_live:
            return False
        self.put(member.tombstone(state, now_ms, quarantine_until_ms=quarantine_until_ms))
        return True

    def settle_if_empty(self) -> None:
        """With no live member left, clear every target and mark the (empty) target as
        computed at the current group epoch, so the group is EMPTY (E5)."""
        members = self.members
        if any(m.is_live for m in members.values()):
            return
        for member in list(members.values()):
            if member.target:
                self.put(_without_target(member))
        self.target_epoch = self.group_epoch
        self.topology_version = MappingProxyType({})

    def build(self) -> Group:
        """The edited group (its derived maps patched from the original's, so building
        costs O(what changed), not O(members))."""
        if self._members is None:
            if self._header() == _header_of(self.original):
                return self.original
            members: Mapping[str, Member] = self.original.members  # immutable: shared
        else:
            members = self._members
            self._built = True
        return Group._trusted(
            self.original,
            members,
            self._touched,
            group_epoch=self.group_epoch,
            target_epoch=self.target_epoch,
            metadata_version=self.metadata_version,
            topology_version=self.topology_version,
            last_assignment_ms=self.last_assignment_ms,
            last_token=self.last_token,
        )

    def finish(self) -> tuple[Group, frozenset[str], frozenset[str], bool]:
        """The edited group, changed ids, removed ids and whether the header changed."""
        group = self.build()
        before = self.original.members
        after = group.members
        changed = frozenset(mid for mid in self._touched if before.get(mid) != after.get(mid))
        removed = frozenset(mid for mid in changed if mid not in after)
        header_changed = self._header() != _header_of(self.original)
        if not changed and not header_changed:
            group = self.original
        return group, changed, removed, header_changed

    def timer_result(self) -> TimerResult:
        """Finish as a :class:`TimerResult`."""
        group, changed, removed, header_changed = self.finish()
        return TimerResult(group, changed, removed, header_changed, ())

    def _header(self) -> tuple[object, ...]:
        return (
            self.group_epoch,
            self.target_epoch,
            self.metadata_version,
            dict(self.topology_version),
            self.last_assignment_ms,
            self.last_token,
        )


def _header_of(group: Group) -> tuple[object, ...]:
    return (
        group.group_epoch,
        group.target_epoch,
        group.metadata_version,
        dict(group.topology_version),
        group.last_assignment_ms,
        group.last_token,
    )


def _without_target(member: Member) -> Member:
    return replace(member, target=frozenset())


def apply_delta(
    group: Group,
    header: object | None,
    upserts: Iterable[Member],
    removed: Iterable[str],
) -> Group:
    """``group`` with a stored change applied: a new header document (None: unchanged),
    member records written and member records deleted.

    This is how a replica catches up with commits of other replicas without reading
    the whole group: applied to the group at revision R, the changes of every commit
    after R give exactly what a full read at the newest revision gives, in O(what
    changed) (the derived maps are patched, not rebuilt).

    Raises:
        ValueError: the header is malformed or names another group.
    """
    edit = GroupEdit(group)
    for member in upserts:
        edit.put(member)
    for member_id in removed:
        edit.remove(member_id)
    if header is not None:
        fields = Group.from_header(header)
        if fields.group_id != group.group_id:
            raise ValueError(f"header of group {fields.group_id!r} applied to {group.group_id!r}")
        edit.group_epoch = fields.group_epoch
        edit.target_epoch = fields.target_epoch
        edit.metadata_version = fields.metadata_version
        edit.topology_version = fields.topology_version
        edit.last_assignment_ms = fields.last_assignment_ms
        edit.last_token = fields.last_token
    return edit.build()
