"""Creating shard keys, consumer groups and owner fences in Redis.

These are the only writes that create data-plane keys: the coordinator calls them
when a stream is created or scaled out, when a group first subscribes to a stream,
and when it grants a shard. The data plane never creates a key or a group, so a
retired shard cannot be resurrected (SPEC §5). ``TestRuntime``'s static mode uses
them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

__all__ = ("create_group", "create_shards", "destroy_group", "write_fence")


async def create_shards(
    scripts: Scripts, keyspace: Keyspace, shards: Iterable[ShardId], groups: Sequence[str]
) -> int:
    """Create each shard key with a consumer group per name in ``groups`` (atomically
    per shard; existing shards are left alone). Returns how many were created."""
    created = 0
    for shard in shards:
        created += int(await scripts.shard_create(keys=[keyspace.stream(shard)], args=list(groups)))
    return created


async def create_group(
    scripts: Scripts,
    keyspace: Keyspace,
    shards: Iterable[ShardId],
    group: str,
    start: Literal["earliest", "latest"] = "earliest",
) -> list[ShardId]:
    """Create ``group`` on every existing shard (never the shard key); returns the
    shards whose key is missing."""
    missing = []
    for shard in shards:
        created = await scripts.group_create(keys=[keyspace.stream(shard)], args=[group, start])
        if int(created) == -2:
            missing.append(shard)
    return missing


async def destroy_group(scripts: Scripts, keyspace: Keyspace, shard: ShardId, group: str) -> bool:
    """Unsubscribe ``group`` from one shard: destroy its consumer group (positions and
    pending entries) and delete its owner fence and retry records. Returns whether a
    consumer group was destroyed (False when it or the shard key was gone already).

    The one place that removes a group from a shard (``admin.py``'s unsubscribe calls
    it per shard), so that an atomic script that also takes the group off the shard's
    list of groups that must exist replaces these commands here and nowhere else.
    """
    client: Any = scripts.client
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("XGROUP", "DESTROY", keyspace.stream(shard), group)
    pipe.delete(keyspace.fence(shard, group), keyspace.retries(shard, group))
    destroyed, _ = await pipe.execute(raise_on_error=False)
    return not isinstance(destroyed, Exception) and int(destroyed) == 1


async def write_fence(
    scripts: Scripts, keyspace: Keyspace, shard: ShardId, group: str, epoch: int, member_id: str
) -> tuple[bool, str]:
    """Write the owner fence ``<epoch>:<member>``; refused when the current fence has a
    newer (or equal, other member) epoch, or not written when the shard does not exist.
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
