"""retire.lua: drain check of a removed shard and its atomic retirement.

Contract: {2} already gone | {1} drained (and retired when asked) | {0, reason}.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, groups, read_group, set_key, shard, text

GROUPS = ("billing", "shipping")


class Shard:
    """A shard with GROUPS, a fence and a retry hash per group, and a dedup record."""

    def __init__(self, redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
        self.redis = redis
        self.scripts = scripts
        self.sid = shard()
        self.stream = keyspace.stream(self.sid)
        self.groups = keyspace.shard_groups(self.sid)
        self.extra = [keyspace.fence(self.sid, g) for g in GROUPS] + [
            keyspace.retries(self.sid, g) for g in GROUPS
        ]
        self.redeliveries = [keyspace.redelivery(self.sid, g) for g in GROUPS]
        self.dedup = keyspace.dedup(self.sid, "ev-1")
        self.other_shard = keyspace.stream(shard(index=1))

    async def setup(self, entries: int) -> list[str]:
        assert (
            await self.scripts.shard_create(
                keys=[self.stream, set_key(self.stream)], args=["sealed", *GROUPS]
            )
            == 1
        )
        assert (
            await self.scripts.shard_create(
                keys=[self.other_shard, set_key(self.other_shard)], args=["sealed", *GROUPS]
            )
            == 1
        )
        for i, g in enumerate(GROUPS):
            await self.redis.set(self.extra[i], f"1:m-{g}")
            await self.redis.hset(self.extra[len(GROUPS) + i], "1-0", "1:0")
        await self.redis.set(self.dedup, "1-0")
        return await add_entries(self.redis, self.stream, entries)

    async def consume(self, group: str, n: int, *, ack: bool = True) -> list[str]:
        ids = await read_group(self.redis, self.stream, group, "c", n)
        if ack and ids:
            await self.redis.xack(self.stream, group, *ids)
        return ids

    async def retire(self, mode: str, required: tuple[str, ...] = GROUPS) -> list[Any]:
        return await self.scripts.retire(
            keys=[self.stream, self.groups, *self.redeliveries, *self.extra],
            args=[mode, len(self.redeliveries), *required],
        )

    async def existing(self) -> set[str]:
        keys = [self.stream, self.groups, *self.extra, self.dedup, self.other_shard]
        return {k for k in keys if await self.redis.exists(k)}

    def all_keys(self) -> set[str]:
        return {self.stream, self.groups, *self.extra, self.dedup, self.other_shard}


@pytest.fixture
def sh(redis: Any, scripts: Scripts, keyspace: Keyspace) -> Shard:
    return Shard(redis, scripts, keyspace)


async def assert_refused(sh: Shard, *words: str, required: tuple[str, ...] = GROUPS) -> None:
    """Both modes refuse with a reason containing one of ``words``; nothing is deleted."""
    for mode in ("check", "retire"):
        reply = await sh.retire(mode, required)
        assert reply[0] == 0, reply
        reason = text(reply[1])
        assert any(w in reason for w in words), reason
        assert await sh.existing() == sh.all_keys()


async def test_drained_shard_passes_the_check_and_is_kept(sh: Shard) -> None:
    await sh.setup(3)
    for g in GROUPS:
        await sh.consume(g, 3)

    assert await sh.retire("check") == [1]
    assert await sh.existing() == sh.all_keys()


async def test_retire_deletes_the_stream_and_its_keys_but_not_the_dedup_record(
    sh: Shard, redis: Any
) -> None:
    await sh.setup(3)
    for g in GROUPS:
        await sh.consume(g, 3)

    assert await sh.retire("retire") == [1]

    assert await sh.existing() == {sh.dedup, sh.other_shard}
    # A stale producer cannot resurrect it.
    assert await redis.xadd(sh.stream, {"n": "9"}, nomkstream=True) is None
    assert await redis.exists(sh.stream) == 0


async def test_a_replayed_dead_letter_not_handled_yet_keeps_the_shard(
    sh: Shard, redis: Any
) -> None:
    """A dead letter replayed to one group (``dlq replay``) waits in that group's
    redelivery stream of the shard: the shard is not drained while it is there, and
    once its owner handled it (XACK + XDEL) the shard retires with the stream."""
    await sh.setup(2)
    for g in GROUPS:
        await sh.consume(g, 2)
    replayed = sh.redeliveries[1]
    await redis.xgroup_create(replayed, GROUPS[1], id="0", mkstream=True)
    entry = await redis.xadd(replayed, {"v": "1"})
    for mode in ("check", "retire"):
        reply = await sh.retire(mode)
        assert reply[0] == 0, reply
        assert "1 replayed dead letter(s) not handled yet" in text(reply[1])
        assert replayed in text(reply[1])
        assert await redis.exists(sh.stream, replayed) == 2

    await read_group(redis, replayed, GROUPS[1], "c", 1)
    assert (await sh.retire("retire"))[0] == 0  # read, not handled: still there
    await redis.xack(replayed, GROUPS[1], entry)
    await redis.xdel(replayed, entry)

    assert await sh.retire("retire") == [1]
    assert await redis.exists(sh.stream, replayed) == 0


async def test_already_gone(sh: Shard) -> None:
    assert await sh.retire("check") == [2]
    assert await sh.retire("retire") == [2]
    await sh.setup(0)
    assert await sh.retire("retire") == [1]
    assert await sh.retire("retire") == [2]


async def test_empty_never_used_shard_is_drained(sh: Shard) -> None:
    await sh.setup(0)
    assert await sh.retire("check") == [1]


async def test_trimmed_drained_shard_is_drained(sh: Shard) -> None:
    await sh.setup(4)
    for g in GROUPS:
        await sh.consume(g, 4)
    assert await sh.scripts.trim(keys=[sh.stream, set_key(sh.stream)], args=[""]) == 4
    assert await sh.retire("check") == [1]


async def test_not_drained_while_a_group_has_pending_entries(sh: Shard) -> None:
    await sh.setup(3)
    await sh.consume(GROUPS[0], 3)
    await sh.consume(GROUPS[1], 3, ack=False)
    await sh.redis.xack(sh.stream, GROUPS[1], "1-0", "3-0")

    await assert_refused(sh, "pending")

    await sh.redis.xack(sh.stream, GROUPS[1], "2-0")
    assert await sh.retire("check") == [1]


async def test_not_drained_while_a_group_lags(sh: Shard) -> None:
    await sh.setup(3)
    await sh.consume(GROUPS[0], 3)
    await sh.consume(GROUPS[1], 2)
    assert (await groups(sh.redis, sh.stream))[GROUPS[1]]["lag"] == 1

    await assert_refused(sh, "lag", "undelivered")


async def test_not_drained_while_lag_is_nil(sh: Shard, redis: Any) -> None:
    """Research 1.3 scenario D: XDEL of an entry the group has not read yet."""
    await sh.setup(3)
    await sh.consume(GROUPS[0], 3)
    await sh.consume(GROUPS[1], 1)
    await redis.xdel(sh.stream, "2-0")  # undelivered for GROUPS[1]
    info = await groups(redis, sh.stream)
    assert info[GROUPS[1]]["lag"] is None, "precondition: scenario D gives lag nil"
    assert info[GROUPS[1]]["pending"] == 0

    await assert_refused(sh, "nil", "unknown")


async def test_not_drained_with_undelivered_entries_even_if_lag_says_zero(
    sh: Shard, redis: Any
) -> None:
    """Lag is not trusted alone: a group whose entries-read was set to entries-added
    reports lag 0 while every entry is still undelivered."""
    await sh.setup(3)
    await sh.consume(GROUPS[0], 3)
    await redis.execute_command("XGROUP", "SETID", sh.stream, GROUPS[1], "0", "ENTRIESREAD", 3)
    g = (await groups(redis, sh.stream))[GROUPS[1]]
    assert (g["lag"], g["pending"], g["last-delivered-id"]) == (0, 0, "0-0"), "precondition"

    await assert_refused(sh, "undelivered")


async def test_not_drained_while_a_required_group_is_missing(sh: Shard) -> None:
    await sh.setup(2)
    for g in GROUPS:
        await sh.consume(g, 2)

    await assert_refused(sh, "missing", required=(*GROUPS, "audit"))
    reply = await sh.retire("check", (*GROUPS, "audit"))
    assert "audit" in text(reply[1])


async def test_unregistered_groups_on_the_shard_are_checked_too(sh: Shard, redis: Any) -> None:
    await sh.setup(2)
    for g in GROUPS:
        await sh.consume(g, 2)
    await redis.xgroup_create(sh.stream, "stray", id="0")  # not in the registry, lag 2

    await assert_refused(sh, "stray")


async def test_check_becomes_drained_once_the_last_group_catches_up(sh: Shard) -> None:
    await sh.setup(5)
    await sh.consume(GROUPS[0], 5)
    for _ in range(5):
        assert (await sh.retire("check"))[0] == 0
        await sh.consume(GROUPS[1], 1)
    assert await sh.retire("retire") == [1]
    assert await sh.existing() == {sh.dedup, sh.other_shard}


async def test_entries_that_no_group_ever_read_are_not_drained(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    key = keyspace.stream(shard("orders", 3))
    await redis.execute_command("XGROUP", "CREATE", key, "tmp", "0", "MKSTREAM")
    await redis.execute_command("XGROUP", "DESTROY", key, "tmp")
    # Empty: retired.
    assert await scripts.retire(keys=[key, set_key(key)], args=["retire", 0]) == [1]
    await redis.execute_command("XGROUP", "CREATE", key, "tmp", "0", "MKSTREAM")
    await redis.execute_command("XGROUP", "DESTROY", key, "tmp")
    await redis.xadd(key, {"v": "1"})
    status, reason = await scripts.retire(keys=[key, set_key(key)], args=["retire", 0])
    assert status == 0 and b"no consumer group" in reason
    assert await redis.exists(key)


# -- the shard's own group set -----------------------------------------------------------


async def test_a_group_on_the_shards_set_is_required_even_if_the_caller_omits_it(
    sh: Shard, redis: Any
) -> None:
    await sh.setup(2)
    for g in GROUPS:
        await sh.consume(g, 2)
    await redis.execute_command("XGROUP", "DESTROY", sh.stream, GROUPS[1])  # lost

    await assert_refused(sh, f"group {GROUPS[1]} missing", required=(GROUPS[0],))


async def test_the_unsealed_marker_does_not_hold_up_retirement(sh: Shard, redis: Any) -> None:
    """The registry groups in ARGV are read in the retiring critical section, which is
    what sealing the set would use: the marker concerns trimming only."""
    await sh.setup(2)
    for g in GROUPS:
        await sh.consume(g, 2)
    await redis.sadd(sh.groups, Keyspace.SHARD_GROUPS_UNSEALED)

    assert await sh.retire("retire") == [1]
    assert await sh.existing() == {sh.dedup, sh.other_shard}


# -- repair of a lag that Redis < 7.4 lost on restart (docs/protocol.md#migrations) ------


async def forget_entries_read(redis: Any, stream: str, group: str) -> None:
    """What an AOF reload on Redis 7.0 leaves (the replayed XCLAIMs do not count reads):
    the position stays, entries-read is back where XGROUP CREATE put it."""
    last = (await groups(redis, stream))[group]["last-delivered-id"]
    await redis.execute_command("XGROUP", "SETID", stream, group, last, "ENTRIESREAD", 0)


async def test_a_fully_read_group_with_a_wrong_lag_is_repaired_then_retired_later(
    sh: Shard, redis: Any
) -> None:
    await sh.setup(5)
    for g in GROUPS:
        await sh.consume(g, 5)
    await sh.scripts.trim(keys=[sh.stream, sh.groups], args=[""])
    await forget_entries_read(redis, sh.stream, GROUPS[1])
    assert (await groups(redis, sh.stream))[GROUPS[1]]["lag"] == 5, "precondition"

    # 'check' writes nothing and says what a retire call would do.
    status, reason = await sh.retire("check")
    assert status == 0 and "a retire call repairs it" in text(reason), reason
    assert (await groups(redis, sh.stream))[GROUPS[1]]["lag"] == 5

    status, reason = await sh.retire("retire")
    assert status == 3 and f"group {GROUPS[1]} lag 5 repaired" in text(reason), reason
    assert await sh.existing() == sh.all_keys()  # repaired, not retired in the same call
    info = (await groups(redis, sh.stream))[GROUPS[1]]
    assert (info["lag"], info["entries-read"]) == (0, 5)

    assert await sh.retire("retire") == [1]  # the later check retires
    assert await sh.existing() == {sh.dedup, sh.other_shard}


async def test_no_repair_while_a_group_has_pending_entries(sh: Shard, redis: Any) -> None:
    await sh.setup(3)
    await sh.consume(GROUPS[0], 3)
    await sh.consume(GROUPS[1], 3, ack=False)
    await forget_entries_read(redis, sh.stream, GROUPS[1])

    await assert_refused(sh, "pending")
    assert (await groups(redis, sh.stream))[GROUPS[1]]["entries-read"] == 0


async def test_no_repair_while_a_registered_group_is_missing(sh: Shard, redis: Any) -> None:
    await sh.setup(3)
    for g in GROUPS:
        await sh.consume(g, 3)
    await forget_entries_read(redis, sh.stream, GROUPS[1])

    await assert_refused(sh, "missing", required=(*GROUPS, "audit"))
    assert (await groups(redis, sh.stream))[GROUPS[1]]["entries-read"] == 0


async def test_no_repair_of_a_group_that_really_lags(sh: Shard, redis: Any) -> None:
    await sh.setup(4)
    await sh.consume(GROUPS[0], 4)
    await sh.consume(GROUPS[1], 2)

    await assert_refused(sh, "lag 2")
    assert (await groups(redis, sh.stream))[GROUPS[1]]["lag"] == 2


async def test_xsetid_below_a_groups_position_does_not_pass_the_proof(
    sh: Shard, redis: Any
) -> None:
    """XSETID lowers last-generated-id below where the groups are; an entry added then
    sits below their position and is never delivered. `>=` would call that drained and
    repair the lag that shows it; equality does not."""
    await sh.setup(5)
    for g in GROUPS:
        await sh.consume(g, 5)
    await redis.execute_command("XTRIM", sh.stream, "MAXLEN", 0)
    await redis.execute_command("XSETID", sh.stream, "2-0")
    await redis.xadd(sh.stream, {"n": "late"}, id="3-0")  # below the groups' 5-0
    for g in GROUPS:
        assert await read_group(redis, sh.stream, g, "c", 10) == [], "never delivered"
    info = await groups(redis, sh.stream)
    assert all(i["last-delivered-id"] == "5-0" and i["pending"] == 0 for i in info.values())
    assert all(i["lag"] != 0 for i in info.values()), info  # the counter shows it

    for _ in range(2):
        await assert_refused(sh, "lag")
    assert all(i["lag"] != 0 for i in (await groups(redis, sh.stream)).values())


async def test_repair_mode_repairs_and_never_deletes(sh: Shard, redis: Any) -> None:
    await sh.setup(3)
    for g in GROUPS:
        await sh.consume(g, 3)
    await forget_entries_read(redis, sh.stream, GROUPS[0])

    status, reason = await sh.retire("repair")
    assert status == 3 and f"group {GROUPS[0]} lag 3 repaired" in text(reason), reason
    assert await sh.retire("repair") == [1]
    assert await sh.existing() == sh.all_keys()
