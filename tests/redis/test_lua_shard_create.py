"""shard_create.lua: the stream key and every group, created together.

Contract: 1 created | 0 the key already existed (groups left as they are).
"""

from __future__ import annotations

from typing import Any

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, groups, read_group, set_key, shard

GROUPS = ("billing", "shipping", "audit")


async def test_creates_the_key_and_every_group_with_valid_lag(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = keyspace.stream(shard())

    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", *GROUPS]) == 1

    assert await redis.exists(stream) == 1
    assert await redis.xlen(stream) == 0
    info = await groups(redis, stream)
    assert set(info) == set(GROUPS)
    for g in info.values():
        assert (g["last-delivered-id"], g["entries-read"], g["lag"], g["pending"]) == (
            "0-0",
            0,
            0,
            0,
        )

    await add_entries(redis, stream, 3)
    assert {name: g["lag"] for name, g in (await groups(redis, stream)).items()} == dict.fromkeys(
        GROUPS, 3
    )


async def test_lag_follows_length_as_entries_arrive(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """ENTRIESREAD 0 matters: lag is never nil, even with 2+ entries before any read."""
    stream = keyspace.stream(shard())
    assert (
        await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", "billing"]) == 1
    )
    for n in range(1, 6):
        await add_entries(redis, stream, 1, start=n)
        assert (await groups(redis, stream))["billing"]["lag"] == n
    await read_group(redis, stream, "billing", "c", 2)
    assert (await groups(redis, stream))["billing"]["lag"] == 3


async def test_existing_key_is_left_alone(redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
    stream = keyspace.stream(shard())
    assert (
        await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", "billing"]) == 1
    )
    await add_entries(redis, stream, 4)
    await read_group(redis, stream, "billing", "c", 3)
    before = await groups(redis, stream)

    assert (
        await scripts.shard_create(
            keys=[stream, set_key(stream)], args=["sealed", "billing", "shipping"]
        )
        == 0
    )

    assert await groups(redis, stream) == before
    assert await redis.xlen(stream) == 4


async def test_existing_key_without_groups_gets_none(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = keyspace.stream(shard())
    await redis.xadd(stream, {"n": "1"})

    assert (
        await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", "billing"]) == 0
    )
    assert await groups(redis, stream) == {}


async def test_shards_are_independent(redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
    first, second = keyspace.stream(shard(index=0)), keyspace.stream(shard(index=1))
    assert await scripts.shard_create(keys=[first, set_key(first)], args=["sealed", "billing"]) == 1
    assert (
        await scripts.shard_create(keys=[second, set_key(second)], args=["sealed", "billing"]) == 1
    )
    assert await scripts.shard_create(keys=[first, set_key(first)], args=["sealed", "billing"]) == 0
    assert set(await groups(redis, second)) == {"billing"}
