"""The coordinator on a Redis Cluster whose topology changes under it: a master killed
and its replica promoted (the promoted node has no scripts loaded: grants go through
the NOSCRIPT path), and the control slot migrated to another master while members
heartbeat (MOVED/ASK/TRYAGAIN, followed by redis-py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import RedisError

from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings
from streamworks.testing.cluster import LocalCluster
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, beat, settle

SHARDS = 8


@pytest.fixture
async def on_cluster(local_cluster: LocalCluster) -> AsyncIterator[tuple[Settings, Any]]:
    """Settings on the local cluster (a prefix of the test's own) and a client; every
    key of the prefix is deleted afterwards."""
    settings = fast_settings(
        Settings(redis_url=local_cluster.url, key_prefix=f"t{uuid.uuid4().hex[:10]}")
    )
    # The test's own reads: redis-py's default retries (the product's client has none,
    # so its first command to a dead master fails once before the slot map refreshes).
    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", port) for port in local_cluster.ports]
    )
    try:
        yield settings, client
    finally:
        for pattern in Keyspace(settings.key_prefix).namespace_patterns():
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            for key in keys:
                await client.delete(key)
        await client.aclose()


async def fences_match(redis: Any, keyspace: Keyspace, members: list[SimMember]) -> bool:
    """Every shard a member holds has that member's owner fence in Redis."""
    for member in members:
        for shard in member.owned:
            value = await redis.get(keyspace.fence(ShardId.parse(shard), "g"))
            if value is None or value.decode().split(":", 1)[1] != member.member_id:
                return False
    return True


async def through_failover(step: Callable[[], Awaitable[object]]) -> int:
    """Run ``step`` until it succeeds, accepting the errors of a client that has yet to
    learn a new topology (its first command to a dead master fails, and the next one
    refreshes the slot map); returns how many attempts failed."""
    failures = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            await step()
            return failures
        except (RedisError, CoordinatorError, AssertionError) as e:
            if getattr(e, "code", "") == "METADATA_UNAVAILABLE" or time.monotonic() > deadline:
                raise
            failures += 1


async def test_grants_keep_working_after_masters_fail_over(
    local_cluster: LocalCluster, on_cluster: tuple[Settings, Any]
) -> None:
    """Kill the control slot's master, then a master holding fences: each time the
    replica takes over without fence.lua loaded, and the next grant on it loads the
    script and writes the fence (NOSCRIPT handled per node)."""
    settings, redis = on_cluster
    keyspace = Keyspace(settings.key_prefix)
    service_redis = create_redis(settings)
    try:
        service = CoordinatorService(service_redis, settings)
        await service.create_stream("orders", SHARDS)
        members = [SimMember("m1", ["orders"])]
        await settle(members, service)
        fence_sha = Scripts(redis).fence.sha

        control = local_cluster.master_for_key(keyspace.registry_groups())
        shard_nodes = {
            local_cluster.master_for_key(keyspace.fence(ShardId("orders", i, 0), "g"))
            for i in range(SHARDS)
        }
        victims = [control, *sorted(shard_nodes - {control})][:2]
        for round_, victim in enumerate(victims, start=1):
            promoted = await anyio.to_thread.run_sync(local_cluster.kill_master, victim)
            node = local_cluster.client(promoted)
            try:
                assert node.script_exists(fence_sha) == [False]  # scripts are not replicated
            finally:
                node.close()
            # Every member leaves and a new one joins: every shard is granted again, so
            # every fence is written again, on every node.
            failed = 0
            for old in members:
                leave = beat(old.member_id, -1)
                failed += await through_failover(lambda r=leave: service.heartbeat("g", r))
            members = [SimMember(f"new{round_}", ["orders"])]
            failed += await through_failover(lambda m=members: settle(m, service))
            assert failed <= 3, failed  # the first commands to the dead node, no more
            assert len(members[0].owned) == SHARDS
            assert await fences_match(redis, keyspace, members)
            if victim in shard_nodes:  # some of its fences now live on the promoted replica
                node = local_cluster.client(promoted)
                try:
                    assert node.script_exists(fence_sha) == [True]  # loaded on NOSCRIPT
                finally:
                    node.close()
            await anyio.to_thread.run_sync(local_cluster.restart_node, victim)
    finally:
        await service_redis.aclose()


async def test_control_slot_migrates_while_members_heartbeat(
    local_cluster: LocalCluster, on_cluster: tuple[Settings, Any]
) -> None:
    """Move the control slot to another master one key at a time while three members
    heartbeat without pause: every heartbeat is answered (redis-py follows ASK for moved
    keys, retries TRYAGAIN for scripts whose keys are split), and the group stays
    whole."""
    settings, redis = on_cluster
    keyspace = Keyspace(settings.key_prefix)
    service_redis = create_redis(settings)
    try:
        service = CoordinatorService(service_redis, settings)
        await service.create_stream("orders", SHARDS)
        members = [SimMember(f"m{i}", ["orders"]) for i in range(3)]
        await settle(members, service)
        slot = key_slot(keyspace.registry_groups().encode())
        src = local_cluster.master_for_slot(slot)
        dst = next(m.port for m in local_cluster.masters() if m.port != src)
        answered: list[HeartbeatStatus] = []
        moving = True

        async def heartbeats() -> None:
            while moving:
                answered.extend([(await m.heartbeat(service, "g")).status for m in members])
                await anyio.lowlevel.checkpoint()

        def migrate() -> None:
            local_cluster.begin_migration(slot, dst)
            while local_cluster.move_keys(slot, src, dst, count=1):
                pass
            local_cluster.finish_migration(slot, src, dst)

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeats)
            await anyio.to_thread.run_sync(migrate)
            moving = False
        assert local_cluster.master_for_key(keyspace.registry_groups()) == dst
        assert len(answered) > 10
        assert set(answered) == {HeartbeatStatus.OK}
        members.append(SimMember("m3", ["orders"]))
        await settle(members, service)
        assert await fences_match(redis, keyspace, members)
    finally:
        await service_redis.aclose()


async def test_the_lag_repair_asks_every_node_which_server_it_is(
    on_cluster: tuple[Settings, Any],
) -> None:
    """The ACTIVE lag repair runs only where a node loses ``entries-read`` on a reload
    (``lag_repair.py``): on a cluster it asks every node the client knows (``HELLO``),
    from a client that has not sent a command yet too."""
    from streamworks.coordinator.core.streams import new_stream
    from streamworks.coordinator.lag_repair import ActiveLagRepair, loses_entries_read
    from streamworks.coordinator.metrics import CoordinatorMetrics
    from streamworks.coordinator.store import Store

    settings, client = on_cluster
    info = await client.info("server", target_nodes=RedisCluster.RANDOM)
    server = "valkey" if info.get("valkey_version") else "redis"
    version = str(info.get("valkey_version") or info["redis_version"])
    redis = create_redis(settings)  # fresh: its node list is not loaded yet
    keyspace = Keyspace(settings.key_prefix)
    try:
        repair = ActiveLagRepair(Store(redis, keyspace), keyspace, CoordinatorMetrics())
        await repair.maybe_repair("orders", new_stream("orders", 2, 1))
        # A pass reads the shards only where it is needed (an error asking: it is).
        assert repair.passes == int(loses_entries_read(server, version))
    finally:
        await redis.aclose()
