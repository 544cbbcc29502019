"""trim.lua: head trimming below the low-water mark over all groups.

Contract: number trimmed | -1 no groups (nothing trimmed) | -2 missing key. Entries at
or above min over groups of (oldest pending id, else the entry after
last-delivered-id), and at or above the optional cap id, are never trimmed.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, entry_ids, groups, read_group, set_key, shard, true_lag

FAST = "fast"
SLOW = "slow"

pytestmark = pytest.mark.cluster  # also on a Redis Cluster (make test)


async def trim(scripts: Scripts, stream: str, cap: str = "") -> int:
    return int(await scripts.trim(keys=[stream, set_key(stream)], args=[cap]))


async def consume(redis: Any, stream: str, group: str, n: int, *, ack: bool = True) -> list[str]:
    """Read ``n`` entries for ``group`` (one consumer) and ack them unless told not to."""
    ids = await read_group(redis, stream, group, "c", n)
    assert len(ids) == n
    if ack:
        await redis.xack(stream, group, *ids)
    return ids


@pytest.fixture
async def stream(scripts: Scripts, keyspace: Keyspace) -> str:
    """A shard with the groups FAST and SLOW, no entries yet."""
    key = keyspace.stream(shard())
    assert await scripts.shard_create(keys=[key, set_key(key)], args=["sealed", FAST, SLOW]) == 1
    return key


async def test_trims_below_the_slowest_group_only(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 10)
    await consume(redis, stream, FAST, 10)
    await consume(redis, stream, SLOW, 4)

    assert await trim(scripts, stream) == 4

    assert await entry_ids(redis, stream) == ids[4:]
    lags = {name: g["lag"] for name, g in (await groups(redis, stream)).items()}
    assert lags == {FAST: 0, SLOW: 6}


async def test_a_group_that_read_nothing_keeps_everything(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 5)
    await consume(redis, stream, FAST, 5)

    assert await trim(scripts, stream) == 0
    assert await entry_ids(redis, stream) == ids


async def test_a_group_with_pending_entries_keeps_from_its_oldest_pending(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 8)
    await consume(redis, stream, FAST, 8)
    delivered = await consume(redis, stream, SLOW, 6, ack=False)
    await redis.xack(stream, SLOW, *(i for i in delivered if i != "3-0"))  # 3-0 in flight

    assert await trim(scripts, stream) == 2

    assert await entry_ids(redis, stream) == ids[2:]
    # The in-flight entry is still readable by its consumer (not a dangling id).
    own = await redis.xreadgroup(SLOW, "c", {stream: "0"})
    assert [(i, f) for i, f in own[0][1]] == [(b"3-0", {b"n": b"3"})]


async def test_pending_entries_of_a_fast_group_hold_back_the_trim(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 6)
    await consume(redis, stream, FAST, 6, ack=False)  # all delivered, none acked
    await consume(redis, stream, SLOW, 6)

    assert await trim(scripts, stream) == 0
    assert await entry_ids(redis, stream) == ids

    await redis.xack(stream, FAST, "1-0", "2-0", "4-0")
    assert await trim(scripts, stream) == 2
    assert await entry_ids(redis, stream) == ids[2:]


async def test_trims_everything_every_group_acknowledged(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    await add_entries(redis, stream, 5)
    await consume(redis, stream, FAST, 5)
    await consume(redis, stream, SLOW, 5)

    assert await trim(scripts, stream) == 5
    assert await redis.xlen(stream) == 0
    assert all(g["lag"] == 0 for g in (await groups(redis, stream)).values())
    assert await trim(scripts, stream) == 0


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        pytest.param("3-0", 2, id="cap-below-lwm-keeps-the-cap-entry"),
        pytest.param("1-5", 1, id="cap-between-entries"),
        pytest.param("1-0", 0, id="cap-at-first-entry"),
        pytest.param("9-0", 6, id="cap-above-lwm-is-ignored"),
        pytest.param("", 6, id="no-cap"),
    ],
)
async def test_honours_the_cap_id(
    redis: Any, scripts: Scripts, stream: str, cap: str, expected: int
) -> None:
    ids = await add_entries(redis, stream, 10)
    await consume(redis, stream, FAST, 10)
    await consume(redis, stream, SLOW, 6)

    assert await trim(scripts, stream, cap) == expected
    assert await entry_ids(redis, stream) == ids[expected:]


async def test_no_groups_trims_nothing(redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
    key = keyspace.stream(shard("nogroups"))
    ids = [await redis.xadd(key, {"n": str(i)}, id=f"{i}-0") for i in range(1, 4)]

    assert await trim(scripts, key) == -1
    assert await redis.xlen(key) == len(ids)
    assert await trim(scripts, key, "9-0") == -1
    assert await redis.xlen(key) == len(ids)


async def test_missing_key_is_reported_and_not_created(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    key = keyspace.stream(shard("missing"))
    assert await trim(scripts, key) == -2
    assert await redis.exists(key) == 0


async def test_slower_group_still_reads_every_entry_it_had_not_read(
    redis: Any, scripts: Scripts, stream: str
) -> None:
    ids = await add_entries(redis, stream, 6)
    await consume(redis, stream, FAST, 6)
    await consume(redis, stream, SLOW, 2)
    assert await trim(scripts, stream) == 2
    ids += await add_entries(redis, stream, 3, start=7)
    await consume(redis, stream, FAST, 3)
    assert await trim(scripts, stream) == 0  # SLOW still holds 3-0.. back
    assert await true_lag(redis, stream, SLOW) == 7

    got: list[str] = []
    while batch := await read_group(redis, stream, SLOW, "c", 2):
        got += batch
        await redis.xack(stream, SLOW, *batch)
        assert (await groups(redis, stream))[SLOW]["lag"] == len(ids) - 2 - len(got)
        await trim(scripts, stream)

    assert got == ids[2:]
    assert await redis.xlen(stream) == 0
