"""Creating shard keys, consumer groups and owner fences in Redis, and removing groups.

These are the only writes that create data-plane keys: the coordinator calls them
when a stream is created or scaled out, when a group first subscribes to a stream,
and when it grants a shard. The data plane never creates a key or a group, so a
retired shard cannot be resurrected (docs/guarantees.md#scaling-in-and-removed-shards).
``TestRuntime``'s static mode uses them directly.

Each shard also carries the set of groups that must exist on it
(:meth:`~streamworks.redis.keyspace.Keyspace.shard_groups`), written in the same script
as the consumer groups: trimming and retirement refuse while a group on it is missing,
so a group whose consumer group is created late loses nothing
(docs/resharding.md#shards-created-before-the-group-set-existed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

__all__ = (
    "DrainCheck",
    "DrainStatus",
    "create_group",
    "create_shards",
    "destroy_group",
    "drain_check",
    "drain_checks",
    "record_shard_groups",
    "write_fence",
)


async def create_shards(
    scripts: Scripts,
    keyspace: Keyspace,
    shards: Iterable[ShardId],
    groups: Sequence[str],
    *,
    provisional: bool = False,
) -> int:
    """Create each shard key with a consumer group per name in ``groups`` (atomically
    per shard; existing shards are left alone), pipelined. Returns how many were
    created.

    Args:
        provisional: the group list is not final (``groups`` was read before the layout
            holding these shards was committed): trimming on them refuses until
            :func:`record_shard_groups` confirms the list from a registry read taken
            after the commit.
    """
    mode = "provisional" if provisional else "sealed"
    replies = await scripts.call_many(
        "shard_create",
        [([keyspace.stream(s), keyspace.shard_groups(s)], [mode, *groups]) for s in shards],
    )
    return sum(int(reply) for reply in replies)


async def record_shard_groups(
    scripts: Scripts, keyspace: Keyspace, shards: Iterable[ShardId], groups: Sequence[str]
) -> list[ShardId]:
    """Add ``groups`` to each shard's group set and confirm (seal) the set, so trimming
    runs again. ``groups`` must come from a registry read taken *after* the layout
    holding the shards was committed. Also backfills shards created before the set
    existed. Pipelined. Returns the shards whose key is missing (nothing written for
    them)."""
    shards = list(shards)
    replies = await scripts.call_many(
        "shard_groups",
        [([keyspace.stream(s), keyspace.shard_groups(s)], list(groups)) for s in shards],
    )
    return [shard for shard, reply in zip(shards, replies, strict=True) if int(reply) == -2]


async def create_group(
    scripts: Scripts,
    keyspace: Keyspace,
    shards: Iterable[ShardId],
    group: str,
    start: Literal["earliest", "latest"] = "earliest",
) -> list[ShardId]:
    """Create ``group`` on every existing shard (never the shard key) and add it to the
    shard's group set; returns the shards whose key is missing.

    Pipelined (``Scripts.call_many``): it runs inside a heartbeat's critical section,
    and one round trip per shard would take seconds at 10,000 shards, longer than the
    mutex TTL.
    """
    shards = list(shards)
    replies = await scripts.call_many(
        "group_create",
        [([keyspace.stream(s), keyspace.shard_groups(s)], [group, start]) for s in shards],
    )
    return [shard for shard, reply in zip(shards, replies, strict=True) if int(reply) == -2]


async def destroy_group(
    scripts: Scripts, keyspace: Keyspace, shards: Iterable[ShardId], group: str
) -> int:
    """Unsubscribe ``group`` from each shard, one script per shard (pipelined, one round
    trip per 1,000 shards): destroy its consumer group, take it off the shard's group
    set, delete its owner fence, retry records and redelivery stream (replayed dead
    letters it will not read now). Returns how many consumer groups were destroyed."""
    replies = await scripts.call_many(
        "group_destroy",
        [
            (
                [
                    keyspace.stream(shard),
                    keyspace.shard_groups(shard),
                    keyspace.fence(shard, group),
                    keyspace.retries(shard, group),
                    keyspace.redelivery(shard, group),
                    keyspace.redelivery_retries(shard, group),
                ],
                [group],
            )
            for shard in shards
        ],
    )
    return sum(1 for reply in replies if int(reply) == 1)


class DrainStatus(Enum):
    """Outcome of :func:`drain_check`."""

    DRAINED = "drained"  # proven drained (and retired, in mode "retire")
    GONE = "gone"  # the shard key no longer exists (retired earlier)
    BLOCKED = "blocked"  # not proven drained: see the reason
    REPAIRED = "repaired"  # lag repaired (Redis < 7.4 after a restart); check again later


@dataclass(frozen=True, slots=True)
class DrainCheck:
    """What ``retire.lua`` found on one shard."""

    status: DrainStatus
    reason: str = ""


def _retire_call(
    keyspace: Keyspace, shard: ShardId, groups: Sequence[str], mode: str
) -> tuple[list[Any], list[Any]]:
    keys: list[Any] = [keyspace.stream(shard), keyspace.shard_groups(shard)]
    # Must be empty: each group's replayed dead letters, and the shard's delayed
    # messages (they enter the stream when due and are handled there first).
    keys += [keyspace.redelivery(shard, group) for group in groups]
    keys.append(keyspace.delayed(shard))
    for group in groups:
        keys += [
            keyspace.fence(shard, group),
            keyspace.retries(shard, group),
            keyspace.redelivery_retries(shard, group),
        ]
    # Deleted with the shard (empty by then, but for the id counter and wake stream).
    keys += [keyspace.delayed_entries(shard), keyspace.delayed_counter(shard)]
    keys.append(keyspace.delayed_wake(shard))
    return keys, [mode, len(groups) + 1, *groups]


def _drain_status(reply: Any) -> DrainCheck:
    code = int(reply[0])
    if code == 1:
        return DrainCheck(DrainStatus.DRAINED)
    if code == 2:
        return DrainCheck(DrainStatus.GONE)
    reason = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
    return DrainCheck(DrainStatus.REPAIRED if code == 3 else DrainStatus.BLOCKED, reason)


async def drain_check(
    scripts: Scripts,
    keyspace: Keyspace,
    shard: ShardId,
    groups: Sequence[str],
    *,
    mode: Literal["check", "retire", "repair"] = "retire",
) -> DrainCheck:
    """Check a shard's drain evidence (``retire.lua``) for every group in ``groups``
    (the registry's) and in the shard's own group set.

    Args:
        mode: ``retire`` deletes the shard in the same script when proven drained, and
            repairs a lag that Redis < 7.4 lost on a restart (reported as REPAIRED:
            a later check retires it); ``repair`` only repairs (for a shard that
            stays, e.g. ACTIVE); ``check`` writes nothing.
    """
    [check] = await drain_checks(scripts, keyspace, [shard], groups, mode=mode)
    return check


async def drain_checks(
    scripts: Scripts,
    keyspace: Keyspace,
    shards: Sequence[ShardId],
    groups: Sequence[str],
    *,
    mode: Literal["check", "retire", "repair"] = "retire",
) -> list[DrainCheck]:
    """:func:`drain_check` of each of ``shards``, one script per shard, pipelined (one
    round trip per node for up to 1,000 shards, not one per shard); in order."""
    replies = await scripts.call_many(
        "retire", [_retire_call(keyspace, shard, groups, mode) for shard in shards]
    )
    return [_drain_status(reply) for reply in replies]


async def write_fence(
    scripts: Scripts, keyspace: Keyspace, shard: ShardId, group: str, epoch: int, member_id: str
) -> tuple[bool, str]:
    """Write the owner fence ``<token>:<member>``; refused when the current fence has a
    newer (or equal, other member) token, or not written when the shard does not exist.
    Returns ``(written, fence now)``."""
    reply = await scripts.fence(
        keys=[keyspace.fence(shard, group), keyspace.stream(shard)], args=[epoch, member_id]
    )
    if reply[0] == -2:
        return False, ""
    value = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
    return reply[0] == 1, value


def grant_token(epoch: int, member_id: str) -> str:
    """The token a fenced read presents: the fence value of the grant."""
    return f"{epoch}:{member_id}"
