"""group_commit.lua / stream_commit.lua / lease_renew.lua: revisions never repeat.

A revision is the hash's ``rev`` counter (``max(rev + 1, now)``) together with the id of
the commit that wrote it (``cid``). After Redis lost writes and its clock is behind (a
failover to a lagging replica with a slower clock), the next commit can reach the very
``rev`` a lost commit had; its commit id differs, so a replica that cached the lost
content by revision sees a new revision, reloads, and never renews a lease on it.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.coordinator.core import Group, Member, MemberState
from streamworks.coordinator.core.streams import new_stream
from streamworks.coordinator.leases import MOVED, RENEWED
from streamworks.coordinator.store import Store
from streamworks.redis.keyspace import Keyspace

TTL = 10_000


async def commit(store: Store, rev: int, group: Group, now_ms: int) -> int:
    new = await store.commit_group(
        rev,
        group,
        header_changed=True,
        changed=(),
        removed=(),
        now_ms=now_ms,
        lease_ttl_ms=TTL,
    )
    assert new is not None
    return new


@pytest.mark.seed("E19")
async def test_a_group_revision_lost_by_redis_is_never_issued_again(
    redis: Any, keyspace: Keyspace
) -> None:
    a, b = Store(redis, keyspace), Store(redis, keyspace)
    key = keyspace.group_meta("g")
    now = await a.now_ms()
    first = await commit(a, 0, Group("g", group_epoch=1), now)
    snapshot = await redis.dump(key)
    lost = await commit(a, first, Group("g", group_epoch=2), now)  # a caches epoch 2
    lost_rev = int(await redis.hget(key, "rev"))

    # Failover: the write is lost, and the new primary's clock is behind.
    await redis.restore(key, 0, snapshot, replace=True)
    loaded = await b.load_group("g")
    assert loaded.rev == first and loaded.group is not None
    assert loaded.group.group_epoch == 1
    again = await commit(b, loaded.rev, Group("g", group_epoch=7), now)

    assert int(await redis.hget(key, "rev")) == lost_rev  # the counter repeated...
    assert again != lost  # ...the revision did not
    cached = a.cached_group("g")
    assert cached is not None and cached == (lost, Group("g", group_epoch=2))
    reloaded = await a.load_group("g")
    assert (reloaded.rev, reloaded.group) == (again, Group("g", group_epoch=7))

    # The no-change heartbeat refuses a's stale cached revision, takes the current one.
    await redis.zadd(keyspace.group_leases("g"), {"m1": now + TTL})
    assert (await a.renew_lease("g", "m1", TTL, lost, {}))[0] == MOVED
    assert (await a.renew_lease("g", "m1", TTL, again, {}))[0] == RENEWED
    # And the compare-and-set refuses a write based on the lost content.
    assert (
        await a.commit_group(
            lost,
            Group("g", group_epoch=3),
            header_changed=True,
            changed=(),
            removed=(),
            now_ms=now,
            lease_ttl_ms=TTL,
        )
        is None
    )


async def test_a_stream_revision_lost_by_redis_is_never_issued_again(
    redis: Any, keyspace: Keyspace
) -> None:
    a, b = Store(redis, keyspace), Store(redis, keyspace)
    key = keyspace.stream_meta("orders")
    now = await a.now_ms()
    assert await a.commit_stream(0, new_stream("orders", 2, now)) is not None
    # Stand-in for a clock that is behind: the stored counter is ahead of Redis time,
    # so the next commits count up from it, as after a failover to a slower clock.
    await redis.hset(key, "rev", now + 3_600_000)
    rev, _ = await a.load_stream("orders")
    snapshot = await redis.dump(key)
    lost = await a.commit_stream(rev, new_stream("orders", 4, now))
    assert lost is not None
    lost_rev = int(await redis.hget(key, "rev"))

    await redis.restore(key, 0, snapshot, replace=True)
    rev_b, meta_b = await b.load_stream("orders")
    assert meta_b is not None and meta_b.shard_count == 2
    again = await b.commit_stream(rev_b, new_stream("orders", 8, now))
    assert again is not None

    assert int(await redis.hget(key, "rev")) == lost_rev
    assert again != lost
    assert (await a.stream_revs(["orders"]))["orders"] == again
    _, meta_a = await a.load_stream("orders")
    assert meta_a is not None and meta_a.shard_count == 8
    assert await a.commit_stream(lost, new_stream("orders", 3, now)) is None


async def test_hashes_written_before_the_commit_id_stay_readable_and_writable(
    redis: Any, keyspace: Keyspace
) -> None:
    store = Store(redis, keyspace)
    now = await store.now_ms()
    assert await store.commit_stream(0, new_stream("orders", 2, now)) is not None
    await redis.hdel(keyspace.stream_meta("orders"), "cid")  # as an older version wrote it
    rev, meta = await store.load_stream("orders")
    assert rev == int(await redis.hget(keyspace.stream_meta("orders"), "rev")) << 128
    assert meta is not None
    assert await store.commit_stream(rev, new_stream("orders", 3, now)) is not None
    assert await redis.hget(keyspace.stream_meta("orders"), "cid") is not None


async def test_commit_ids_are_unique_per_commit_and_per_store(
    redis: Any, keyspace: Keyspace
) -> None:
    a, b = Store(redis, keyspace), Store(redis, keyspace)
    now = await a.now_ms()
    seen: set[bytes] = set()
    rev = 0
    for i in range(20):
        store = a if i % 2 else b
        rev = await commit(store, rev, Group("g", group_epoch=i), now)
        cid = await redis.hget(keyspace.group_meta("g"), "cid")
        assert cid not in seen
        seen.add(cid)


async def test_a_commit_of_thousands_of_member_records_goes_through(
    redis: Any, keyspace: Keyspace
) -> None:
    """Lua's unpack refuses more than ~8,000 values: a commit writing, deleting and
    unleasing more member records than that in one go (a mass expiry of a group of
    10,000) is written in chunks."""
    store = Store(redis, keyspace)
    now = await store.now_ms()
    members = {
        f"m{i:05d}": Member.joining(
            f"m{i:05d}",
            subscriptions=frozenset({"s"}),
            rebalance_timeout_ms=1000,
            client={},
            now_ms=now,
        )
        for i in range(6000)
    }
    group = Group("g", group_epoch=1, members=members)
    rev = await store.commit_group(
        0,
        group,
        header_changed=True,
        changed=list(members),
        removed=(),
        now_ms=now,
        renew=list(members),
        lease_ttl_ms=TTL,
    )
    assert rev is not None
    assert await redis.hlen(keyspace.group_meta("g")) == 6000 + 3  # rev, cid, header
    assert await redis.zcard(keyspace.group_leases("g")) == 6000
    # All of them expire (tombstones: their leases go) and half are deleted.
    expired = {
        mid: m.tombstone(MemberState.EXPIRED, now + 1) for mid, m in list(members.items())[:3000]
    }
    rest = dict(list(members.items())[3000:])
    after = Group("g", group_epoch=2, members={**expired})
    rev = await store.commit_group(
        rev,
        after,
        header_changed=True,
        changed=[*expired, *rest],
        removed=list(rest),
        now_ms=now + 1,
        lease_ttl_ms=TTL,
    )
    assert rev is not None
    assert await redis.hlen(keyspace.group_meta("g")) == 3000 + 3
    assert await redis.zcard(keyspace.group_leases("g")) == 0
    loaded = await Store(redis, keyspace).load_group("g")
    assert loaded.group == after
