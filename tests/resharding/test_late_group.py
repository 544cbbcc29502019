"""A scale-out racing a group's first subscription (issue 10, part 2), through the real
coordinator service, each interleaving held in place by a hook in the store (no sleeps).

The scale-out commits the new shard PROVISIONING, reads the registry, creates the new
shard, commits the layout that activates it. A group
subscribing for the first time registers, then creates its consumer groups on the
shards of the layout it loads after registering. When the registration lands between
the scale-out's shard creation and its commit, the new shard is created without the
late group's consumer group; the scale-out re-reads the registry after its commit and
puts the late group on the shard's list, so the early group's acks trim nothing there
until the late group's consumer group exists, and the late group then reads every
entry. A whole scale-out between the registration and the provisioning is seen by the
load that follows the registration.
"""

from __future__ import annotations

from typing import Any

import anyio

from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, open_service, settle

EARLY, LATE = "early", "late"
STREAM = "orders"


async def new_shard(service: CoordinatorService) -> ShardId:
    _, meta = await service.store.load_stream(STREAM)
    assert meta is not None
    return ShardId.parse(sorted(meta.shard_ids(), key=lambda s: ShardId.parse(s).index)[-1])


async def consume_all(redis: Any, key: str, group: str) -> list[bytes]:
    """Read and ack everything (as a worker of ``group`` would)."""
    got: list[bytes] = []
    while reply := await redis.xreadgroup(group, "c", {key: ">"}, count=100):
        ids = [i for i, _ in reply[0][1]]
        await redis.xack(key, group, *ids)
        got += ids
    return got


async def trim(service: CoordinatorService, keyspace: Keyspace, shard: ShardId) -> int:
    keys = [keyspace.stream(shard), keyspace.shard_groups(shard)]
    return int(await service.store.scripts.trim(keys=keys, args=[""]))


async def test_a_group_registered_while_a_scale_out_creates_shards_loses_nothing(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream(STREAM, 1)
        await settle([SimMember("e1", [STREAM])], service, EARLY)

        # Hold the scale-out between creating the new shard and committing the layout
        # that activates it (the first commit records it PROVISIONING: no key yet).
        created, release = anyio.Event(), anyio.Event()
        real_commit = service.store.commit_stream
        commits = 0

        async def held_commit(*args: Any, **kwargs: Any) -> Any:
            nonlocal commits
            commits += 1
            if commits == 2:
                created.set()
                await release.wait()
            return await real_commit(*args, **kwargs)

        service.store.commit_stream = held_commit  # type: ignore[method-assign]
        late = SimMember("l1", [STREAM])
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.scale_stream, STREAM, 2)
            await created.wait()
            await late.heartbeat(service, LATE)  # first subscription, old layout
            assert LATE in await service.store.subscribed_groups(STREAM)
            release.set()
        service.store.commit_stream = real_commit  # type: ignore[method-assign]

        shard = await new_shard(service)
        key = keyspace.stream(shard)
        groups_on_shard = {g["name"] for g in await redis.xinfo_groups(key)}
        assert groups_on_shard == {EARLY.encode()}, "precondition: created without LATE"
        assert {m.decode() for m in await redis.smembers(keyspace.shard_groups(shard))} == {
            EARLY,
            LATE,
        }

        ids = [await redis.xadd(key, {"n": str(n)}, nomkstream=True) for n in range(40)]
        assert await consume_all(redis, key, EARLY) == ids
        assert await trim(service, keyspace, shard) == -3  # LATE is missing: refused
        assert await redis.xlen(key) == 40

        # The late group's next heartbeat sees the new layout and creates its group.
        await late.heartbeat(service, LATE)
        assert await consume_all(redis, key, LATE) == ids
        assert await trim(service, keyspace, shard) == 40


async def test_a_scale_out_inside_a_first_subscription_loses_nothing(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream(STREAM, 1)
        await settle([SimMember("e1", [STREAM])], service, EARLY)

        # Hold the late group's first subscription before it registers.
        provisioned, release = anyio.Event(), anyio.Event()
        real_record = service.store.record_subscription

        async def held_record(stream: str, group: str) -> None:
            provisioned.set()
            await release.wait()
            await real_record(stream, group)

        service.store.record_subscription = held_record  # type: ignore[method-assign]
        late = SimMember("l1", [STREAM])
        async with anyio.create_task_group() as tg:
            tg.start_soon(late.heartbeat, service, LATE)
            await provisioned.wait()
            await service.scale_stream(STREAM, 2)  # the whole scale-out, in between
            release.set()
        service.store.record_subscription = real_record  # type: ignore[method-assign]

        shard = await new_shard(service)
        key = keyspace.stream(shard)
        ids = [await redis.xadd(key, {"n": str(n)}, nomkstream=True) for n in range(40)]
        await consume_all(redis, key, EARLY)
        await trim(service, keyspace, shard)
        await late.heartbeat(service, LATE)
        assert await consume_all(redis, key, LATE) == ids
