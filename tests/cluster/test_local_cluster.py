"""The local cluster of the test infrastructure, and cluster detection by create_redis."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot

from streamworks.redis.client import create_redis, detect_cluster
from streamworks.settings import Settings
from streamworks.testing.cluster import LocalCluster

pytestmark = pytest.mark.cluster


async def test_create_redis_detects_the_target(
    streamworks_redis_url: str, redis: Any, settings: Settings
) -> None:
    on_cluster = detect_cluster(streamworks_redis_url)
    assert isinstance(redis, RedisCluster if on_cluster else Redis)
    forced = create_redis(settings.with_overrides(redis_cluster=on_cluster))
    try:
        assert type(forced) is type(redis)
    finally:
        await forced.aclose()
    keys = [f"{{{settings.key_prefix}:s{i}}}:k" for i in range(16)]
    for k in keys:
        await redis.set(k, "v")
    assert [await redis.get(k) for k in keys] == [b"v"] * len(keys)


def test_cluster_has_three_masters_each_with_a_replica(
    streamworks_local_cluster: LocalCluster,
) -> None:
    nodes = streamworks_local_cluster.nodes()
    masters = [n for n in nodes if n.role == "master"]
    assert len(masters) == 3 and len(nodes) == 6
    assert sum(hi - lo + 1 for m in masters for lo, hi in m.slots) == 16384
    assert {n.master_id for n in nodes if n.role == "replica"} == {m.node_id for m in masters}


async def test_master_kill_promotes_its_replica_and_keeps_data(
    local_cluster: LocalCluster,
) -> None:
    key = f"{{k{uuid.uuid4().hex[:8]}}}:x"
    client = RedisCluster.from_url(local_cluster.url)
    try:
        await client.set(key, "before")
        await client.wait(1, 5000)  # replicated before the kill
        master = local_cluster.master_for_key(key)
        promoted = await anyio.to_thread.run_sync(local_cluster.kill_master, master)
        assert local_cluster.master_for_key(key) == promoted != master
        assert await client.get(key) == b"before"  # redis-py refreshes the slot map
        await anyio.to_thread.run_sync(local_cluster.restart_node, master)
        assert any(n.port == master for n in local_cluster.replicas_of(promoted))
    finally:
        await client.aclose()


async def test_slot_migration_moves_keys_and_clients_follow(
    local_cluster: LocalCluster,
) -> None:
    key = f"{{m{uuid.uuid4().hex[:8]}}}:x"
    client = RedisCluster.from_url(local_cluster.url)
    try:
        await client.set(key, "v")
        slot = key_slot(key.encode())
        src = local_cluster.master_for_slot(slot)
        dst = next(m.port for m in local_cluster.masters() if m.port != src)
        await anyio.to_thread.run_sync(local_cluster.migrate_slot, slot, dst)
        assert local_cluster.master_for_slot(slot) == dst
        assert await client.get(key) == b"v"  # MOVED followed by redis-py
        await client.set(key, "w")
        direct = local_cluster.client(dst)
        try:
            assert direct.get(key) == b"w"
        finally:
            direct.close()
    finally:
        await client.aclose()


async def test_several_seed_urls_reach_the_cluster_while_the_first_is_down(
    streamworks_local_cluster: LocalCluster,
) -> None:
    """``redis_url`` may list a cluster's seed nodes, comma-separated: detection and
    the client's slot map come from the first seed that answers, so a process starts
    while a seed node is down (here the first one names a port nobody listens on)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    live = streamworks_local_cluster.urls[1]
    seeds = f"redis://127.0.0.1:{dead}/0, {live}"
    assert detect_cluster(seeds, timeout=1)
    # A seed that accepts the connection and never answers (a hung node) is passed
    # over too, after its timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hung = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        assert detect_cluster(f"{hung},{live}", timeout=0.5)
    for forced in (None, True):
        client = create_redis(Settings(redis_url=seeds, redis_cluster=forced))
        try:
            assert isinstance(client, RedisCluster)
            keys = [f"{{seed{i}}}:k" for i in range(12)]  # spread over the masters
            for k in keys:
                await client.set(k, "v")
            assert [await client.get(k) for k in keys] == [b"v"] * len(keys)
        finally:
            await client.aclose()


def test_several_urls_for_a_single_node_are_refused(streamworks_single_redis_url: str) -> None:
    two = f"{streamworks_single_redis_url},{streamworks_single_redis_url}"
    with pytest.raises(ValueError, match="not a Redis Cluster"):
        create_redis(Settings(redis_url=two))
