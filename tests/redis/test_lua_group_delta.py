"""group_delta.lua + the changelog of group_commit.lua: incremental reloads.

A replica holding a group at revision R catches up with other replicas' commits by
reading only what changed since R. Whatever the commits (members written, deleted,
header changes), what it ends up with equals a full read of the hash; when the
changelog cannot bridge R and now (trimmed, lost writes), it reads everything.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamworks.coordinator import store as store_module
from streamworks.coordinator.core import Group, Member
from streamworks.coordinator.store import Store
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings

TTL = 10_000
IDS = [f"m{i}" for i in range(6)]

# A commit by the writer: (member id, "put" | "delete" | "header"), or a load by the reader.
Op = tuple[str, str]
ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(IDS), st.sampled_from(["put", "delete", "header"])),
        st.just(("", "load")),
    ),
    min_size=1,
    max_size=30,
)


def _member(member_id: str, n: int) -> Member:
    joined = Member.joining(
        member_id,
        subscriptions=frozenset({"s"}),
        rebalance_timeout_ms=1000,
        client={"n": str(n)},
        now_ms=n,
    )
    # Each member holds a shard of its own: holders stay unambiguous.
    return replace(joined, epoch=n, assigned={f"s/{IDS.index(member_id)}@0": n})


class CountingRedis:
    """A client that counts full reads of a group hash (``HGETALL``) and passes every
    command to the real client."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self.full = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    async def hgetall(self, key: str) -> Any:
        self.full += 1
        return await self._redis.hgetall(key)


def _reader(redis: Any, keyspace: Keyspace) -> tuple[Store, CountingRedis]:
    counting = CountingRedis(redis)
    return Store(counting, keyspace), counting


async def _commit(store: Store, group: Group, op: Op, n: int) -> Group:
    loaded = await store.load_group(group.group_id)
    current = loaded.group or group
    member_id, action = op
    members = dict(current.members)
    header_changed = loaded.rev == 0
    changed: set[str] = set()
    removed: set[str] = set()
    if action == "put":
        members[member_id] = _member(member_id, n)
        changed.add(member_id)
    elif action == "delete" and member_id in members:
        del members[member_id]
        changed.add(member_id)
        removed.add(member_id)
    else:
        header_changed = True
    epoch = current.group_epoch + (1 if header_changed else 0)
    new = replace(current, group_epoch=epoch, members=members)
    rev = await store.commit_group(
        loaded.rev,
        new,
        header_changed=header_changed,
        changed=changed,
        removed=removed,
        now_ms=await store.now_ms(),
        lease_ttl_ms=TTL,
    )
    assert rev is not None
    return new


async def _run(url: str, prefix: str, steps: list[Op]) -> None:
    settings = Settings(redis_url=url, key_prefix=prefix)
    redis = create_redis(settings)
    keyspace = Keyspace(prefix)
    group_id = f"g{uuid.uuid4().hex[:8]}"
    try:
        writer = Store(redis, keyspace)
        reader, reads = _reader(redis, keyspace)
        group = await _commit(writer, Group(group_id), ("m0", "put"), 0)
        await reader.load_group(group_id)
        assert reads.full == 1
        expected_full = 1
        since_load: set[str] = set()
        for n, op in enumerate(steps, start=1):
            if op[1] != "load":
                if op[1] == "put" or (op[1] == "delete" and op[0] in group.members):
                    since_load.add(op[0])
                group = await _commit(writer, group, op, n)
                continue
            # More than half of the hash's fields (rev, cid, header, members) changed:
            # the script reads everything instead.
            if len(since_load) > (3 + len(group.members)) / 2:
                expected_full += 1
            since_load.clear()
            loaded = await reader.load_group(group_id)
            fresh = await Store(redis, keyspace).load_group(group_id)
            assert loaded.rev == fresh.rev
            assert loaded.group == fresh.group == group
            assert loaded.group is not None and fresh.group is not None
            assert loaded.group.holders() == fresh.group.holders()
            assert loaded.group.live_count() == fresh.group.live_count()
        # Otherwise catching up never needed a full read: the changelog bridged every gap.
        assert reads.full == expected_full
    finally:
        await redis.delete(keyspace.group_meta(group_id), keyspace.group_changes(group_id))
        await redis.delete(keyspace.group_leases(group_id), keyspace.registry_groups())
        await redis.aclose()


@hsettings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=ops)
def test_incremental_reload_equals_a_full_reload(settings: Settings, steps: list[Op]) -> None:
    anyio.run(_run, settings.redis_url, settings.key_prefix, steps)


async def test_a_trimmed_changelog_falls_back_to_a_full_read(
    redis: Any, keyspace: Keyspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "CHANGELOG_LENGTH", 3)
    writer = Store(redis, keyspace)
    reader, reads = _reader(redis, keyspace)
    group = await _commit(writer, Group("g"), ("m0", "put"), 0)
    await reader.load_group("g")
    for n in range(1, 3):
        group = await _commit(writer, group, (IDS[n], "put"), n)
    assert (await reader.load_group("g")).group == group
    assert reads.full == 1  # two commits behind: bridged
    for n in range(3, 8):
        group = await _commit(writer, group, (IDS[n % 6], "put"), n)
    assert (await reader.load_group("g")).group == group
    assert reads.full == 2  # five behind, three kept: read everything
    assert await redis.llen(keyspace.group_changes("g")) == 3


@pytest.mark.seed("E19")
async def test_a_revision_lost_by_redis_is_not_bridged(redis: Any, keyspace: Keyspace) -> None:
    """After a loss of writes the reader's revision is not in the surviving history:
    whatever the changelog says, it reads the whole hash."""
    writer = Store(redis, keyspace)
    reader, reads = _reader(redis, keyspace)
    group = await _commit(writer, Group("g"), ("m0", "put"), 0)
    meta, changes = keyspace.group_meta("g"), keyspace.group_changes("g")
    snapshot = (await redis.dump(meta), await redis.dump(changes))
    lost = await _commit(writer, group, ("m1", "put"), 1)
    assert (await reader.load_group("g")).group == lost
    await redis.restore(meta, 0, snapshot[0], replace=True)  # failover: m1 is lost
    await redis.restore(changes, 0, snapshot[1], replace=True)
    other = Store(redis, keyspace)
    again = await _commit(other, group, ("m2", "put"), 2)
    loaded = await reader.load_group("g")
    assert loaded.group == again and "m1" not in loaded.group.members
    assert reads.full == 2


async def test_most_members_changed_reads_the_whole_hash(redis: Any, keyspace: Keyspace) -> None:
    writer = Store(redis, keyspace)
    reader, reads = _reader(redis, keyspace)
    group = await _commit(writer, Group("g"), ("m0", "put"), 0)
    group = await _commit(writer, group, ("m1", "put"), 1)
    await reader.load_group("g")
    for n in range(2, 8):  # all six members written: more than half of the hash
        group = await _commit(writer, group, (IDS[n % 6], "put"), n)
    assert (await reader.load_group("g")).group == group
    assert reads.full == 2
