"""A coordinator replica killed in every phase of a migration (E2).

Two replica processes serve one stream; workers of the instrumented app and a
producer use both. A migration's state lives in Redis only, so whichever replica is
left picks it up:

1. 6 -> 4: the replica that served the request is SIGKILLed while the migration is
   FENCING (and its stream mutex is left behind, as a crash inside a critical section
   leaves it); the other replica retires the removed shards.
2. 4 -> 2: a replica is SIGKILLed while the migration is DRAINING (a blocker message
   keeps each removed shard pending); the other one completes it once they drain.
3. 2 -> 1: the last replica is killed while FENCING; then, in-process, the test plays
   the dying replica's last step, ``retire.lua`` on the due shard (key deleted, stream
   mutex still held), without committing the metadata. A fresh ``CoordinatorService``
   on the same prefix ticks, finds the key gone and records the retirement.

Killed replicas are restarted on the same port, so every client's URL list stays valid.
"""

from __future__ import annotations

import signal
from typing import Any

import anyio
import pytest

from streamworks import Record
from streamworks.coordinator.service import CoordinatorService
from streamworks.coordinator.store import Conflict
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from tests.e2e.apps import instrumented
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    Proc,
    Publisher,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)
from tests.resharding.helpers import (
    blocked,
    draining,
    fence_of,
    keys_on,
    phase,
    redis_now_ms,
    retired,
)

MUTEX_TTL = 2.0
REPLICA_ENV = {
    "STREAMWORKS_ROUTING_LEASE": "2",  # routing fence = 2 s + 1 s margin
    "STREAMWORKS_COORDINATOR__MUTEX_TTL": str(MUTEX_TTL),
}
WORKER_ENV: dict[str, Any] = {"E2E_SHARDS": "6", "E2E_MAX_ATTEMPTS": "1000000"}


def restart(cluster: Cluster, old: Proc, name: str) -> Proc:
    """Start a new replica process on ``old``'s port (its URL stays valid for clients)."""
    port = old.url.rsplit(":", 1)[1]
    proc = cluster.start(
        name, "coordinator", env={"STREAMWORKS_COORDINATOR__PORT": port, **REPLICA_ENV}
    )
    proc.url = old.url
    cluster.coordinators = [proc if c is old else c for c in cluster.coordinators]
    return proc


async def kill(proc: Proc, redis: Any, mutex: str | None) -> None:
    """SIGKILL a replica; with ``mutex``, leave the stream mutex held as a crash inside
    a critical section would (unless it is held right now anyway)."""
    proc.send(signal.SIGKILL)
    await proc.wait_exit(5)
    if mutex is not None:
        await redis.set(mutex, f"killed:{proc.name}", nx=True, px=int(MUTEX_TTL * 1000))


async def complete(client: Any) -> Any:
    info = await client.stream(STREAM)
    return info if not draining(info) and phase(info) == "NONE" else None


#: Why this test runs on a single node only (``--redis-target=cluster`` skips it).
_ATOMIC_OBSERVER = (
    "its instruments read shard state and handler records in one atomic script, which "
    "a cluster cannot run across slots"
)


@pytest.mark.no_cluster(_ATOMIC_OBSERVER)
@pytest.mark.seed("E2")
async def test_a_replica_killed_in_every_migration_phase(cluster: Cluster, redis: Any) -> None:
    keyspace = Keyspace(cluster.prefix)
    mutex = keyspace.stream_mutex(STREAM)
    a = cluster.start_coordinator("replica-a", **REPLICA_ENV)
    b = cluster.start_coordinator("replica-b", **REPLICA_ENV)
    await wait_ready(a)
    await wait_ready(b)

    def key(i: int) -> str:
        return keyspace.stream(ShardId(STREAM, i, 0))

    async with cluster.client(a) as via_a, cluster.client(b) as via_b:
        await via_a.create_stream(STREAM, 6)
        cluster.start_worker("worker-0", coordinators=[a, b], **WORKER_ENV)
        cluster.start_worker("worker-1", coordinators=[b, a], **WORKER_ENV)
        await wait_stable(via_b, 2)
        app = producer_app(cluster)
        async with app.connect():
            publisher = Publisher(app, "p")
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await publisher.wait_count(100)

                # 1. FENCING: A served the request and dies; B retires 4@0 and 5@0.
                info = await via_a.scale_stream(STREAM, 4)
                fence = fence_of(info)
                assert phase(info) == "FENCING"
                await kill(a, redis, mutex)
                assert await redis_now_ms(redis) < fence, "A was killed after the fence"
                await wait_until(lambda: complete(via_b), 20, "B to complete 6 -> 4")
                assert await redis.exists(key(4), key(5)) == 0

                # 2. DRAINING: B dies while blockers keep 2@0 and 3@0 pending; A' completes.
                a = restart(cluster, a, "replica-a2")
                await wait_ready(a)
                blockers = [
                    Record({"id": f"blocker-{i}", "fail_until_healed": True}, key=k)
                    for i in (2, 3)
                    for k in keys_on(i, 4, stem="blocker")
                ]
                placed = await app.publish_many(STREAM, blockers)
                assert [p.shard for p in placed] == [f"{STREAM}/2@0", f"{STREAM}/3@0"]
                await via_b.scale_stream(STREAM, 2)

                async def pending_after_fence() -> Any:
                    info = await via_b.stream(STREAM)
                    reasons = blocked(info)
                    ok = phase(info) == "DRAINING" and all(
                        "pending" in reasons.get(p.shard, "") for p in placed
                    )
                    return info if ok else None

                await wait_until(pending_after_fence, 20, "B to find 2@0 and 3@0 pending")
                await kill(b, redis, mutex)
                assert await redis.exists(key(2), key(3)) == 2
                for record in blockers:
                    healed = instrumented.healed_key(cluster.prefix, record.value["id"])
                    await redis.set(healed, 1)
                await wait_until(lambda: complete(via_a), 20, "A' to complete 4 -> 2")
                assert await redis.exists(key(2), key(3)) == 0
                published = await publisher.stop()
        ids = published + [r.value["id"] for r in blockers]
        await wait_handled(redis, cluster.prefix, ids, timeout=20)

        # 3. Between the retire script's DEL and the metadata commit.
        info = await via_a.scale_stream(STREAM, 1)
        fence = fence_of(info)
        await kill(a, redis, None)  # no replica runs from here on
        assert await redis_now_ms(redis) < fence

    async def fence_passed() -> bool:
        return await redis_now_ms(redis) >= fence

    await wait_until(fence_passed, 10, "the routing fence", 0.02)
    scripts = Scripts(redis)
    shard = ShardId(STREAM, 1, 0)
    keys = [
        key(1),
        keyspace.shard_groups(shard),
        keyspace.fence(shard, GROUP),
        keyspace.retries(shard, GROUP),
    ]
    # The dying replica holds the stream mutex while it runs the check.
    await redis.set(mutex, "dying-replica", px=int(MUTEX_TTL * 1000))

    async def retired_by_script() -> bool:  # drained (the last acks may still be on their way)
        return bool((await scripts.retire(keys=keys, args=["retire", 0, GROUP]))[0] == 1)

    await wait_until(retired_by_script, 10, "retire.lua to find 1@0 drained")
    assert await redis.exists(*keys) == 0
    # ... and the replica died here: the mutex stays until its TTL, the metadata says DRAINING.
    service = CoordinatorService(redis, cluster.settings(), replica="fresh")
    info = await service.stream_info(STREAM)
    assert draining(info) == [f"{STREAM}/1@0"]

    async def recorded() -> Any:
        try:
            await service.tick_streams()
        except Conflict:  # the dead replica's mutex, until it expires
            return None
        info = await service.stream_info(STREAM)
        return info if not draining(info) and phase(info) == "NONE" else None

    info = await wait_until(recorded, 10, "a fresh service to record the retirement")
    assert [s.shard for s in info.shards] == [f"{STREAM}/0@0"]
    assert f"{STREAM}/1@0" in retired(info)
    assert (await service.routing(STREAM)).shard_count == 1
    assert not await redis.exists(key(1))
