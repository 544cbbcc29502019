"""Helpers shared by the Lua script tests: stream state read back from the server.

Everything here reads real Redis state; nothing is computed from what a script
returned, so a test comparing the two can fail.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import RedisCluster

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = (
    "add_entries",
    "consumers",
    "entry_ids",
    "groups",
    "keys_for",
    "pending_ids",
    "read_group",
    "set_key",
    "shard",
    "text",
    "true_lag",
    "undelivered_ids",
)


def shard(name: str = "orders", index: int = 0) -> ShardId:
    return ShardId(name, index)


def set_key(stream_key: str) -> str:
    """The group set of the shard whose stream key is ``stream_key`` (the tests hold
    stream keys; ``test_set_key_is_the_keyspace_s`` pins it to ``Keyspace.shard_groups``)."""
    assert stream_key.endswith(":stream"), stream_key
    return stream_key.removesuffix(":stream") + ":groups"


def text(value: Any) -> str:
    """A reply value as ``str`` (the client runs with ``decode_responses=False``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def groups(redis: Any, key: str) -> dict[str, dict[str, Any]]:
    """``XINFO GROUPS`` as ``{group name: {field: value}}``; ids and names as ``str``,
    ``lag``/``entries-read`` as ``int`` or ``None`` (nil)."""
    out: dict[str, dict[str, Any]] = {}
    for row in await redis.xinfo_groups(key):
        fields = {text(k): v for k, v in row.items()}
        info = {
            "name": text(fields["name"]),
            "consumers": int(fields["consumers"]),
            "pending": int(fields["pending"]),
            "last-delivered-id": text(fields["last-delivered-id"]),
            "entries-read": fields.get("entries-read"),
            "lag": fields.get("lag"),
        }
        out[info["name"]] = info
    return out


async def consumers(redis: Any, key: str, group: str) -> dict[str, int]:
    """``XINFO CONSUMERS`` as ``{consumer name: pending count}``."""
    out: dict[str, int] = {}
    for row in await redis.xinfo_consumers(key, group):
        fields = {text(k): v for k, v in row.items()}
        out[text(fields["name"])] = int(fields["pending"])
    return out


async def entry_ids(redis: Any, key: str) -> list[str]:
    """Ids of every entry still in the stream, oldest first."""
    return [text(i) for i, _ in await redis.xrange(key, "-", "+")]


async def undelivered_ids(redis: Any, key: str, group: str) -> list[str]:
    """Ids of the entries after the group's last-delivered-id (XRANGE, exclusive)."""
    last = (await groups(redis, key))[group]["last-delivered-id"]
    return [text(i) for i, _ in await redis.xrange(key, f"({last}", "+")]


async def true_lag(redis: Any, key: str, group: str) -> int:
    """The group's real lag: how many entries after its last-delivered-id exist."""
    return len(await undelivered_ids(redis, key, group))


async def pending_ids(redis: Any, key: str, group: str) -> dict[str, str]:
    """The group's pending entries as ``{entry id: consumer}``."""
    rows = await redis.xpending_range(key, group, "-", "+", 10_000)
    return {text(r["message_id"]): text(r["consumer"]) for r in rows}


async def add_entries(redis: Any, key: str, n: int, *, start: int = 1) -> list[str]:
    """Append ``n`` entries with explicit ids ``<start>-0``, ``<start+1>-0``...; the
    stream must already exist (``NOMKSTREAM``, like every producer)."""
    out: list[str] = []
    for i in range(start, start + n):
        added = await redis.xadd(key, {"n": str(i)}, id=f"{i}-0", nomkstream=True)
        assert added is not None, f"{key} does not exist"
        out.append(text(added))
    return out


async def read_group(redis: Any, key: str, group: str, consumer: str, count: int) -> list[str]:
    """Plain ``XREADGROUP ... >``: the ids delivered."""
    reply = await redis.xreadgroup(group, consumer, {key: ">"}, count=count)
    if not reply:
        return []
    return [text(i) for i, _ in reply[0][1]]


def keys_for(keyspace: Keyspace, sid: ShardId, group: str) -> tuple[str, str, str]:
    """(stream, fence, retries) of ``group`` on the shard."""
    return keyspace.stream(sid), keyspace.fence(sid, group), keyspace.retries(sid, group)


async def xread_blocked(redis: Any, stream: str) -> bool:
    """Whether a client is blocked in ``XREAD`` now (on a cluster: on ``stream``'s node)."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(stream)
        clients = await redis.execute_command("CLIENT", "LIST", "TYPE", "normal", target_nodes=node)
    else:
        clients = await redis.execute_command("CLIENT", "LIST", "TYPE", "normal")
    return any("cmd=xread " in line and " flags=b" in line for line in text(clients).splitlines())
