"""group_create.lua: one group on an existing shard, ENTRIESREAD seeded.

Contract: 1 created | 0 already existed | -2 the shard key does not exist (not created).
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, groups, read_group, set_key, shard, true_lag

NEW = "analytics"


async def create(scripts: Scripts, stream: str, start: str, group: str = NEW) -> int:
    return int(await scripts.group_create(keys=[stream, set_key(stream)], args=[group, start]))


@pytest.fixture
async def stream(scripts: Scripts, keyspace: Keyspace) -> str:
    key = keyspace.stream(shard())
    assert await scripts.shard_create(keys=[key, set_key(key)], args=["sealed", "billing"]) == 1
    return key


async def drain(redis: Any, stream: str, group: str) -> list[str]:
    got: list[str] = []
    while batch := await read_group(redis, stream, group, "c", 3):
        got += batch
    return got


@pytest.mark.parametrize("start", ["earliest", "latest"])
async def test_never_creates_the_shard_key(
    redis: Any, scripts: Scripts, keyspace: Keyspace, start: str
) -> None:
    key = keyspace.stream(shard("gone"))
    assert await create(scripts, key, start) == -2
    assert await redis.exists(key) == 0


async def test_earliest_on_a_stream_with_entries(redis: Any, scripts: Scripts, stream: str) -> None:
    ids = await add_entries(redis, stream, 5)

    assert await create(scripts, stream, "earliest") == 1

    g = (await groups(redis, stream))[NEW]
    assert g["lag"] == 5 == await true_lag(redis, stream, NEW)
    assert await drain(redis, stream, NEW) == ids
    assert (await groups(redis, stream))[NEW]["lag"] == 0


async def test_earliest_after_a_head_trim_counts_only_readable_entries(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 8)
    await read_group(redis, stream, "billing", "c", 3)
    await redis.xack(stream, "billing", *ids[:3])
    assert await scripts.trim(keys=[stream, set_key(stream)], args=[""]) == 3

    assert await create(scripts, stream, "earliest") == 1

    g = (await groups(redis, stream))[NEW]
    assert g["lag"] == 5 == await true_lag(redis, stream, NEW)
    ids += await add_entries(redis, stream, 1, start=9)
    assert (await groups(redis, stream))[NEW]["lag"] == 6
    await read_group(redis, stream, NEW, "c", 2)
    assert (await groups(redis, stream))[NEW]["lag"] == 4
    assert await drain(redis, stream, NEW) == ids[5:]
    assert (await groups(redis, stream))[NEW]["lag"] == 0


async def test_earliest_on_an_empty_stream(redis: Any, scripts: Scripts, stream: str) -> None:
    assert await create(scripts, stream, "earliest") == 1
    assert (await groups(redis, stream))[NEW]["lag"] == 0
    await add_entries(redis, stream, 2)
    assert (await groups(redis, stream))[NEW]["lag"] == 2


@pytest.mark.parametrize("existing", [0, 1, 2, 5])
async def test_latest_starts_at_the_tail_with_lag_zero(
    redis: Any, scripts: Scripts, stream: str, existing: int
) -> None:
    """With 2+ entries a plain `$` group would show lag nil after one XADD (1.3 B)."""
    await add_entries(redis, stream, existing)

    assert await create(scripts, stream, "latest") == 1

    g = (await groups(redis, stream))[NEW]
    assert (g["lag"], g["entries-read"]) == (0, existing)
    (new_id,) = await add_entries(redis, stream, 1, start=existing + 1)
    assert (await groups(redis, stream))[NEW]["lag"] == 1
    assert await drain(redis, stream, NEW) == [new_id]
    assert (await groups(redis, stream))[NEW]["lag"] == 0


async def test_latest_after_a_head_trim(redis: Any, scripts: Scripts, stream: str) -> None:
    ids = await add_entries(redis, stream, 4)
    await read_group(redis, stream, "billing", "c", 2)
    await redis.xack(stream, "billing", *ids[:2])
    assert await scripts.trim(keys=[stream, set_key(stream)], args=[""]) == 2

    assert await create(scripts, stream, "latest") == 1

    assert (await groups(redis, stream))[NEW]["lag"] == 0
    await add_entries(redis, stream, 2, start=5)
    assert (await groups(redis, stream))[NEW]["lag"] == 2


@pytest.mark.parametrize("start", ["earliest", "latest"])
async def test_existing_group_is_left_alone(
    redis: Any, scripts: Scripts, stream: str, start: str
) -> None:
    await add_entries(redis, stream, 3)
    await read_group(redis, stream, "billing", "c", 1)
    before = await groups(redis, stream)

    assert await create(scripts, stream, start, group="billing") == 0

    assert await groups(redis, stream) == before
