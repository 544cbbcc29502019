"""A test on the plugin's local Redis Cluster that kills a master.

Run with pytest: the ``local_cluster`` fixture comes with streamworks' plugin.
"""

from __future__ import annotations

import anyio
from redis.asyncio import RedisCluster

from streamworks.testing.cluster import LocalCluster


async def test_a_key_survives_a_failover(local_cluster: LocalCluster) -> None:
    client = RedisCluster.from_url(local_cluster.url)
    try:
        await client.set("{k}:x", "v")
        await client.wait(1, 5000)  # on the replica before the kill
        master = local_cluster.master_for_key("{k}:x")
        promoted = await anyio.to_thread.run_sync(local_cluster.kill_master, master)
        assert local_cluster.master_for_key("{k}:x") == promoted
        assert await client.get("{k}:x") == b"v"
    finally:
        await client.aclose()
