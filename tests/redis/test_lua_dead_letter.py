"""dead_letter.lua and retry_record.lua: dead letters at most once, retry records only
by the owner.

Contracts: dead_letter.lua {1, id} written now | {0, id or ''} written before;
retry_record.lua {1, value} | {-1, current_fence}.
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import keys_for, shard

GROUP = "billing"
TOKEN = "7:m-1"
TTL_MS = 60_000


def marker_and_dlq(keyspace: Keyspace, entry_id: str = "1-0") -> tuple[list[str], str]:
    """``dead_letter.lua``'s KEYS for an entry of the shard, and its ARGV[2]."""
    source = keyspace.stream(shard())
    keys = [
        keyspace.dead_letter_markers(GROUP, "orders"),
        keyspace.dead_letters(GROUP, "orders"),
        keyspace.dead_letter_marker(GROUP, "orders", source, entry_id),
    ]
    return keys, keyspace.dead_letter_marker_member(source, entry_id)


async def test_the_markers_share_the_dead_letter_streams_slot(keyspace: Keyspace) -> None:
    keys, _ = marker_and_dlq(keyspace)
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert key_slot(keys[0].encode()) != key_slot(keyspace.stream(shard()).encode())


async def test_a_dead_letter_is_written_once_per_entry(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys, member = marker_and_dlq(keyspace)
    markers, dlq = keys[0], keys[1]
    first = await scripts.dead_letter(keys=keys, args=[TTL_MS, member, "reason", "x", "n", "1"])
    again = await scripts.dead_letter(keys=keys, args=[TTL_MS, member, "reason", "x", "n", "2"])
    assert first[0] == 1 and again[0] == 0
    entries = await redis.xrange(dlq)
    assert [(i, f) for i, f in entries] == [(first[1], {b"reason": b"x", b"n": b"1"})]
    # One marker set per dead-letter stream, not a key per entry; it expires with its
    # last marker.
    assert await redis.zrange(markers, 0, -1) == [member.encode()]
    assert 0 < await redis.pttl(markers) <= TTL_MS
    assert not await redis.exists(keys[2])
    # Another entry of the shard has its own marker, in the same set.
    other, other_member = marker_and_dlq(keyspace, "2-0")
    assert (await scripts.dead_letter(keys=other, args=[TTL_MS, other_member, "n", "3"]))[0] == 1
    assert await redis.xlen(dlq) == 2
    assert await redis.zcard(markers) == 2


async def test_markers_are_dropped_when_their_time_ran_out(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """A poison storm leaves one key with one member per dead letter of the last
    MARKER_TTL, not millions of keys: each call drops the markers whose time ran out."""
    keys, member = marker_and_dlq(keyspace)
    markers = keys[0]
    for n in range(50):  # markers of entries dead-lettered long ago (score: kept until)
        await redis.zadd(markers, {f"{{old}}:stream|{n}-0": 1_000})
    assert (await scripts.dead_letter(keys=keys, args=[TTL_MS, member, "n", "1"]))[0] == 1
    assert await redis.zrange(markers, 0, -1) == [member.encode()]


async def test_an_entry_an_earlier_version_marked_is_not_written_again(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """Earlier versions wrote one string key per dead-lettered entry (holding the
    dead-letter entry's id): it still counts, so an upgrade writes no second copy."""
    keys, member = marker_and_dlq(keyspace)
    await redis.set(keys[2], "1700000000000-0", px=TTL_MS)
    assert await scripts.dead_letter(keys=keys, args=[TTL_MS, member, "n", "1"]) == [
        0,
        b"1700000000000-0",
    ]
    assert await redis.xlen(keys[1]) == 0


async def test_a_retry_record_is_written_only_under_the_callers_fence(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    _, fence, retries = keys_for(keyspace, shard(), GROUP)
    await redis.set(fence, TOKEN)
    keys = [fence, retries]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "set", "1-0", "1:5"]) == [1, 1]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]) == [1, 1]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]) == [1, 2]
    assert await redis.hgetall(retries) == {b"1-0": b"1:5", b"1-0:runs": b"2"}

    await redis.set(fence, "8:m-2")  # the shard moved on
    stale = [
        await scripts.retry_record(keys=keys, args=[TOKEN, "set", "1-0", "dlq:{}"]),
        await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]),
    ]
    assert stale == [[-1, b"8:m-2"], [-1, b"8:m-2"]]
    await redis.delete(fence)  # retired: no fence at all
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "set", "2-0", "1:5"]) == [-1, b""]
    assert await redis.hgetall(retries) == {b"1-0": b"1:5", b"1-0:runs": b"2"}
