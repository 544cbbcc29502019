"""publish_dedup.lua: XADD NOMKSTREAM once per event id per shard.

Contract: {1, id} added | {0, id} duplicate of entry id | {-1} the shard key is gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import set_key, shard

WINDOW_MS = 60_000


async def publish(
    scripts: Scripts, keyspace: Keyspace, event_id: str, *fields: str, window: int = WINDOW_MS
) -> list[Any]:
    sid = shard()
    return await scripts.publish_dedup(
        keys=[keyspace.stream(sid), keyspace.dedup(sid, event_id)], args=[window, *fields]
    )


@pytest.fixture
async def stream(scripts: Scripts, keyspace: Keyspace) -> str:
    key = keyspace.stream(shard())
    assert await scripts.shard_create(keys=[key, set_key(key)], args=["sealed", "billing"]) == 1
    return key


async def test_adds_the_entry_and_records_the_event(
    redis: Any, scripts: Scripts, keyspace: Keyspace, stream: str
) -> None:
    status, entry_id = await publish(scripts, keyspace, "ev-1", "k", "v", "n", "1")

    assert status == 1
    assert await redis.xrange(stream) == [(entry_id, {b"k": b"v", b"n": b"1"})]
    dedup = keyspace.dedup(shard(), "ev-1")
    assert await redis.get(dedup) == entry_id
    assert 0 < await redis.pttl(dedup) <= WINDOW_MS


async def test_second_publish_of_the_same_event_is_a_duplicate(
    redis: Any, scripts: Scripts, keyspace: Keyspace, stream: str
) -> None:
    _, first = await publish(scripts, keyspace, "ev-1", "k", "v")

    assert await publish(scripts, keyspace, "ev-1", "k", "v") == [0, first]
    assert await publish(scripts, keyspace, "ev-1", "k", "other") == [0, first]
    assert await redis.xlen(stream) == 1
    assert (await redis.xinfo_stream(stream))["entries-added"] == 1


async def test_other_event_ids_are_added(
    redis: Any, scripts: Scripts, keyspace: Keyspace, stream: str
) -> None:
    s1, id1 = await publish(scripts, keyspace, "ev-1", "k", "v")
    s2, id2 = await publish(scripts, keyspace, "ev-2", "k", "v")

    assert (s1, s2) == (1, 1)
    assert [i for i, _ in await redis.xrange(stream)] == [id1, id2]


async def test_missing_key_is_reported_and_not_created(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    assert await publish(scripts, keyspace, "ev-1", "k", "v") == [-1]
    assert await redis.exists(keyspace.stream(shard())) == 0
    # Nothing was written, so nothing is recorded: a retry on the new route is not
    # mistaken for a duplicate.
    assert await redis.exists(keyspace.dedup(shard(), "ev-1")) == 0


@pytest.mark.seed("E18")
async def test_dedup_record_survives_the_shards_deletion(
    redis: Any, scripts: Scripts, keyspace: Keyspace, stream: str
) -> None:
    _, first = await publish(scripts, keyspace, "ev-1", "k", "v")
    await redis.delete(stream)

    assert await publish(scripts, keyspace, "ev-1", "k", "v") == [0, first]
    assert await redis.exists(stream) == 0
    # A new event on the retired shard is refused, not added to a resurrected key.
    assert await publish(scripts, keyspace, "ev-2", "k", "v") == [-1]
    assert await redis.exists(stream) == 0


async def test_once_the_record_is_gone_the_event_is_added_again(
    redis: Any, scripts: Scripts, keyspace: Keyspace, stream: str
) -> None:
    """Dedup is the record only (no hidden state): outside the window, a new entry."""
    _, first = await publish(scripts, keyspace, "ev-1", "k", "v")
    dedup = keyspace.dedup(shard(), "ev-1")
    assert await redis.get(dedup) == first
    await redis.delete(dedup)  # what expiry at the end of the window does

    status, second = await publish(scripts, keyspace, "ev-1", "k", "v")
    assert status == 1
    assert second != first
    assert await redis.xlen(stream) == 2
