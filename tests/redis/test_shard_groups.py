"""The groups that must exist on a shard, known in the shard's own slot.

See docs/resharding.md#shards-created-before-the-group-set-existed.

shard_create.lua and group_create.lua write the shard's group set in the same script
as the consumer groups; shard_groups.lua confirms it (drops '!unsealed') after a
scale-out's commit, or backfills a shard created before the set existed;
group_destroy.lua removes a group and its set entry together. trim.lua refuses (-3)
while a group in the set is missing on the shard and (-4) while the set is unknown.
"""

from __future__ import annotations

from typing import Any

from streamworks.coordinator import provision
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, entry_ids, groups, read_group, set_key, shard

EARLY, LATE = "billing", "audit"
UNSEALED = Keyspace.SHARD_GROUPS_UNSEALED


async def members(redis: Any, key: str) -> set[str]:
    return {m.decode() for m in await redis.smembers(key)}


async def trim(scripts: Scripts, stream: str) -> int:
    return int(await scripts.trim(keys=[stream, set_key(stream)], args=[""]))


async def read_all(redis: Any, stream: str, group: str) -> list[str]:
    """Read and ack everything the group can still get."""
    got: list[str] = []
    while batch := await read_group(redis, stream, group, "c", 100):
        await redis.xack(stream, group, *batch)
        got += batch
    return got


def test_set_key_is_the_keyspace_s(keyspace: Keyspace) -> None:
    sid = shard("orders", 3)
    assert set_key(keyspace.stream(sid)) == keyspace.shard_groups(sid)
    # Same hash tag as the stream: the scripts touch both in one slot.
    assert keyspace.shard_groups(sid).startswith(keyspace.shard_tag(sid))


async def test_shard_create_writes_the_set_sealed_or_provisional(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sealed, provisional, empty = (shard(index=i) for i in range(3))
    await provision.create_shards(scripts, keyspace, [sealed], [EARLY, LATE])
    await provision.create_shards(scripts, keyspace, [provisional], [EARLY], provisional=True)
    await provision.create_shards(scripts, keyspace, [empty], [])

    assert await members(redis, keyspace.shard_groups(sealed)) == {EARLY, LATE}
    assert await members(redis, keyspace.shard_groups(provisional)) == {EARLY, UNSEALED}
    assert await redis.exists(keyspace.shard_groups(empty)) == 0
    # An existing shard is left alone, set included.
    assert await provision.create_shards(scripts, keyspace, [sealed], ["other"]) == 0
    assert await members(redis, keyspace.shard_groups(sealed)) == {EARLY, LATE}


async def test_a_provisional_shard_is_not_trimmed_until_sealed(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    stream = keyspace.stream(sid)
    await provision.create_shards(scripts, keyspace, [sid], [EARLY], provisional=True)
    await add_entries(redis, stream, 4)
    await read_all(redis, stream, EARLY)

    assert await trim(scripts, stream) == -4
    assert await redis.xlen(stream) == 4

    assert await provision.record_shard_groups(scripts, keyspace, [sid], [EARLY]) == []
    assert await members(redis, keyspace.shard_groups(sid)) == {EARLY}
    assert await trim(scripts, stream) == 4


async def test_scale_out_racing_a_first_subscription_loses_nothing(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """The race of issue 10 (2), step by step: the scale-out read the registry before
    LATE subscribed, so the new shard is created without LATE's consumer group; LATE
    registers before the scale-out confirms the list after its commit; EARLY reads and
    acks everything on the new shard. Trimming refuses until LATE's consumer group is
    created, and LATE then reads every entry."""
    sid = shard(index=4)
    stream = keyspace.stream(sid)
    registry = [EARLY]  # what the scale-out read before creating the shard
    await provision.create_shards(scripts, keyspace, [sid], registry, provisional=True)
    registry.append(LATE)  # LATE's first subscription registers it meanwhile
    ids = await add_entries(redis, stream, 40)  # routable after the commit
    # After its commit, the scale-out confirms the list from a fresh registry read.
    await provision.record_shard_groups(scripts, keyspace, [sid], registry)
    assert await read_all(redis, stream, EARLY) == ids

    assert await trim(scripts, stream) == -3  # LATE must exist here, and does not yet
    assert await entry_ids(redis, stream) == ids

    # LATE's next check of the new layout creates its consumer group (from the earliest).
    assert await provision.create_group(scripts, keyspace, [sid], LATE) == []
    assert await read_all(redis, stream, LATE) == ids
    assert await trim(scripts, stream) == 40


async def test_without_the_late_group_on_the_list_its_entries_are_trimmed(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """The same steps with LATE registered only after the list was confirmed (and after
    the new layout it loaded was committed, so it creates its group here itself): what
    EARLY acked before LATE's group exists is trimmed. This is why a subscription must
    register before it loads the layout it provisions (the coordinator's order)."""
    sid = shard(index=4)
    stream = keyspace.stream(sid)
    await provision.create_shards(scripts, keyspace, [sid], [EARLY], provisional=True)
    await provision.record_shard_groups(scripts, keyspace, [sid], [EARLY])
    ids = await add_entries(redis, stream, 40)
    await read_all(redis, stream, EARLY)
    assert await trim(scripts, stream) == 40

    await provision.create_group(scripts, keyspace, [sid], LATE)
    assert await read_all(redis, stream, LATE) == []  # the 40 entries are gone for LATE
    assert len(ids) == 40


async def test_a_shard_from_before_the_set_is_not_trimmed_until_backfilled(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    stream = keyspace.stream(sid)
    # As an older version created it: consumer groups, no set.
    await redis.execute_command("XGROUP", "CREATE", stream, EARLY, "0", "MKSTREAM")
    await redis.execute_command("XGROUP", "CREATE", stream, LATE, "0")
    await add_entries(redis, stream, 3)
    for g in (EARLY, LATE):
        await read_all(redis, stream, g)

    assert await trim(scripts, stream) == -4
    assert await redis.xlen(stream) == 3

    assert await provision.record_shard_groups(scripts, keyspace, [sid], [EARLY, LATE]) == []
    assert await members(redis, keyspace.shard_groups(sid)) == {EARLY, LATE}
    assert await trim(scripts, stream) == 3


async def test_group_create_adds_the_group_to_the_set(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    await provision.create_shards(scripts, keyspace, [sid], [EARLY])
    await provision.create_group(scripts, keyspace, [sid], LATE, "latest")
    assert await members(redis, keyspace.shard_groups(sid)) == {EARLY, LATE}
    # Already existing: still (re)recorded, so a backfill by group creation works too.
    await redis.srem(keyspace.shard_groups(sid), EARLY)
    await provision.create_group(scripts, keyspace, [sid], EARLY)
    assert await members(redis, keyspace.shard_groups(sid)) == {EARLY, LATE}


async def test_a_group_on_the_set_that_was_lost_blocks_trimming(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    stream = keyspace.stream(sid)
    await provision.create_shards(scripts, keyspace, [sid], [EARLY, LATE])
    await add_entries(redis, stream, 3)
    await read_all(redis, stream, EARLY)
    await redis.execute_command("XGROUP", "DESTROY", stream, LATE)  # behind our back

    assert await trim(scripts, stream) == -3
    assert await redis.xlen(stream) == 3


async def test_destroy_group_removes_the_group_its_keys_and_its_set_entry(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    stream = keyspace.stream(sid)
    await provision.create_shards(scripts, keyspace, [sid], [EARLY, LATE])
    await redis.set(keyspace.fence(sid, LATE), "3:m1")
    await redis.hset(keyspace.retries(sid, LATE), "1-0", "1:0")
    await redis.set(keyspace.fence(sid, EARLY), "3:m2")
    # A dead letter replayed to LATE and not handled yet, with its retry record.
    await redis.xadd(keyspace.redelivery(sid, LATE), {"v": "1"})
    await redis.hset(keyspace.redelivery_retries(sid, LATE), "1-0", "1:0")
    await redis.xadd(keyspace.redelivery(sid, EARLY), {"v": "1"})
    await add_entries(redis, stream, 3)
    await read_all(redis, stream, EARLY)
    assert await trim(scripts, stream) == 0  # LATE has read nothing

    assert await provision.destroy_group(scripts, keyspace, [sid], LATE) == 1

    assert set(await groups(redis, stream)) == {EARLY}
    assert await members(redis, keyspace.shard_groups(sid)) == {EARLY}
    late_keys = [
        keyspace.fence(sid, LATE),
        keyspace.retries(sid, LATE),
        keyspace.redelivery(sid, LATE),
        keyspace.redelivery_retries(sid, LATE),
    ]
    assert await redis.exists(*late_keys) == 0
    assert await redis.xlen(keyspace.redelivery(sid, EARLY)) == 1  # another group's
    assert await redis.get(keyspace.fence(sid, EARLY)) == b"3:m2"
    assert await trim(scripts, stream) == 3
    # Again: nothing left to destroy, still consistent.
    assert await provision.destroy_group(scripts, keyspace, [sid], LATE) == 0


async def test_scripts_on_a_missing_shard_write_no_set(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard("gone")
    assert await provision.record_shard_groups(scripts, keyspace, [sid], [EARLY]) == [sid]
    assert await provision.create_group(scripts, keyspace, [sid], EARLY) == [sid]
    assert await provision.destroy_group(scripts, keyspace, [sid], EARLY) == 0
    assert await trim(scripts, keyspace.stream(sid)) == -2
    assert await redis.exists(keyspace.stream(sid), keyspace.shard_groups(sid)) == 0
