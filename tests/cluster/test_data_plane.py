"""The data plane on a Redis Cluster: per-node batches, shared idle waits, slot
migrations and failovers under traffic, durable publishing (docs/cluster.md).

These run on real workers with a *static* shard map (``StaticRuntime``), so they test
the data plane alone; the coordinator on a cluster has its own suites.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from streamworks.app import App
from streamworks.exceptions import BackendError, PublishNotDurableError
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.scripts import Scripts
from streamworks.runtime.connection import create_producer
from streamworks.runtime.message import Message
from streamworks.runtime.producer import Record
from streamworks.runtime.retry import RetryPolicy
from streamworks.testing.cluster import LocalCluster
from tests.runtime.static_runtime import StaticRuntime
from tests.support import wait_for


def consuming_app(shards: int, seen: list[int], **stream: Any) -> App:
    app = App("g")
    app.stream("orders", shards=shards, **stream)

    @app.handler("orders", ordering="none", concurrency=64)
    async def handle(value: dict[str, int]) -> None:
        seen.append(value["n"])

    return app


async def wait_xread_connections(rt: StaticRuntime, expected: int) -> dict[str, int]:
    """Connections whose last command was an ``XREAD`` (only the idle waiter sends one)
    per node, once every reader is waiting."""
    counts: dict[str, int] = {}

    async def settled() -> bool:
        nonlocal counts
        counts = await xread_connections(rt.redis)
        return sum(counts.values()) == expected and all(
            r.waiting for w in rt.workers for r in w.readers.values()
        )

    await wait_for(settled, message=f"{expected} idle wait connections (last: {counts})")
    return counts


async def xread_connections(redis: Any) -> dict[str, int]:
    if isinstance(redis, RedisCluster):
        nodes = redis.get_primaries()
        replies = await redis.client_list(target_nodes=nodes)
        if not isinstance(replies, dict):
            replies = {nodes[0].name: replies}
    else:
        replies = {"single": await redis.client_list()}
    return {
        name: sum(1 for c in clients if c.get("cmd") == "xread")
        for name, clients in replies.items()
    }


@pytest.mark.cluster
async def test_idle_shards_of_a_worker_share_one_wait_connection_per_node(
    streamworks_redis_url: str,
) -> None:
    seen: list[int] = []
    app = consuming_app(64, seen)
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        nodes = 3 if isinstance(rt.redis, RedisCluster) else 1
        own = rt.settings.worker.own_waits  # shards waiting on a connection of their own
        counts = await wait_xread_connections(rt, own + nodes)
        assert len(counts) == nodes and all(counts.values()), counts
        [worker] = rt.workers
        stats = worker.waiter.statistics()
        # The shared waits: the readers without a wait of their own and, on one node,
        # every shard's delay mover waiting for its wake stream (docs/delays.md; on a
        # cluster the movers wait on their timers).
        movers = 0 if nodes > 1 else 64
        assert stats["own"] == own and stats["waiting"] == (64 - own) + movers
        assert stats["nodes"] == nodes  # one shared wait connection per node
        # Every idle shard is woken by its first entry.
        await app.publish_many("orders", [Record({"n": n}, key=f"k{n}") for n in range(256)])
        await rt.wait_idle()
        assert sorted(seen) == list(range(256))
        await wait_xread_connections(rt, own + nodes)  # and all of them wait again


@pytest.mark.cluster
async def test_publish_many_writes_each_record_once_across_every_master(
    streamworks_redis_url: str,
) -> None:
    seen: list[int] = []
    app = consuming_app(16, seen)
    async with StaticRuntime(app, workers=2, redis_url=streamworks_redis_url) as rt:
        records = [Record({"n": n}, key=f"k{n % 97}") for n in range(3000)]
        published = await app.publish_many("orders", records)
        assert len(published) == 3000
        singles = [await app.publish("orders", r.value, key=r.key) for r in records[:20]]
        assert [p.shard for p in singles] == [p.shard for p in published[:20]]
        await rt.wait_idle()
        assert Counter(seen) == Counter(list(range(3000)) + list(range(20)))
        if isinstance(rt.redis, RedisCluster):
            masters = {
                rt.redis.get_node_from_key(rt.keyspace.stream(ShardId("orders", i))).name
                for i in range(16)
            }
            assert len(masters) == 3  # the test covers one write per node


async def test_slot_migration_under_traffic_loses_nothing(
    local_cluster: LocalCluster,
) -> None:
    seen: list[int] = []
    app = consuming_app(8, seen)
    async with StaticRuntime(app, workers=2, redis_url=local_cluster.url) as rt:
        acked: list[int] = []
        done = anyio.Event()

        async def produce() -> None:
            n = 0
            while not done.is_set():
                batch = [Record({"n": n + i}, key=f"k{n + i}") for i in range(20)]
                await app.publish_many("orders", batch)
                acked.extend(r.value["n"] for r in batch)
                n += 20
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            await wait_for(lambda: len(seen) > 200, message="traffic")
            for index in (0, 3):
                slot = key_slot(rt.keyspace.stream(ShardId("orders", index)).encode())
                src = local_cluster.master_for_slot(slot)
                dst = next(m.port for m in local_cluster.masters() if m.port != src)
                # Key by key: the shard's keys are split between two nodes for a while
                # (ASK for moved keys, TRYAGAIN for scripts spanning both).
                await anyio.to_thread.run_sync(local_cluster.begin_migration, slot, dst)
                while await anyio.to_thread.run_sync(local_cluster.move_keys, slot, src, dst, 1):
                    await wait_more(seen, 20, "progress during the migration")
                await anyio.to_thread.run_sync(local_cluster.finish_migration, slot, src, dst)
                assert local_cluster.master_for_slot(slot) == dst
            await wait_more(seen, 200, "traffic after the migrations")
            done.set()
        await rt.wait_idle(timeout=30)
        assert set(seen) == set(acked)  # nothing acknowledged to the producer was lost
        assert len(seen) == len(acked)  # and nothing ran twice (no crash, no redelivery)


async def test_a_shard_is_read_throughout_its_slot_migration(
    local_cluster: LocalCluster,
) -> None:
    """The fenced read's transaction names three keys, one of which (the hold key)
    never exists outside it: a node whose slot is migrating answers ``TRYAGAIN`` to it
    for as long as the migration lasts, not a moment. The reader counts it and reads
    with one script on the two keys that exist (``read.lua``) until the transaction
    is accepted again: messages published while the slot is migrating — all keys still
    on the source, then all on the target (``ASK``) — are handled before it ends."""
    seen: list[int] = []
    app = consuming_app(1, seen)
    async with StaticRuntime(app, workers=1, redis_url=local_cluster.url) as rt:
        sent = 0

        async def publish(n: int) -> None:
            nonlocal sent
            await app.publish_many("orders", [Record({"n": sent + i}) for i in range(n)])
            sent += n
            await wait_for(lambda: len(seen) == sent, 15, f"{sent} handled")

        await publish(10)
        slot = key_slot(rt.keyspace.stream(ShardId("orders", 0)).encode())
        dst = next(
            m.port for m in local_cluster.masters() if m.port != local_cluster.master_for_slot(slot)
        )
        src = await anyio.to_thread.run_sync(local_cluster.begin_migration, slot, dst)
        await publish(10)  # MIGRATING, every key still on the source
        while await anyio.to_thread.run_sync(local_cluster.move_keys, slot, src, dst, 100):
            pass
        await publish(10)  # every key on the target, the slot not handed over yet (ASK)
        await anyio.to_thread.run_sync(local_cluster.finish_migration, slot, src, dst)
        await publish(10)
        assert sorted(seen) == list(range(40))
        errors = rt.workers[0].metrics.read_errors
        assert errors.get(("orders", "tryagain"), 0) > 0, errors  # the metric counted it


async def wait_promoted(local_cluster: LocalCluster, key: str, replica: int, redis: Any) -> None:
    """Wait until ``replica`` owns ``key``'s slot, then reload ``redis``'s slot map (a
    client that has not hit the dead node yet still lists it as a primary)."""

    def promoted() -> bool:
        try:
            return local_cluster.master_for_key(key) == replica
        except LookupError:  # nobody owns the slot while the election runs
            return False

    await wait_for(lambda: anyio.to_thread.run_sync(promoted), 30, "the promotion")
    await anyio.to_thread.run_sync(local_cluster.wait_healthy)
    await redis.nodes_manager.initialize()


async def wait_more(items: Any, n: int, what: str, timeout: float = 20.0) -> None:
    """Wait until ``items`` has ``n`` more elements than now (traffic goes on)."""
    mark = len(items)
    await wait_for(lambda: len(items) >= mark + n, timeout, message=what)


def _replica_of(local_cluster: LocalCluster, master: int) -> int:
    [replica] = [n.port for n in local_cluster.replicas_of(master) if n.alive]
    return replica


async def test_durable_publish_survives_a_master_killed_right_after_the_ack(
    local_cluster: LocalCluster,
) -> None:
    app = App("g")
    app.stream("orders", shards=4, min_replicas=1, replica_timeout=5.0)
    async with StaticRuntime(app, workers=0, redis_url=local_cluster.url) as rt:
        key = rt.keyspace.stream(ShardId("orders", 0))
        master = local_cluster.master_for_key(key)
        published = []
        for n in range(50):
            batch = [Record({"n": 10 * n + i}, key=f"k{i}") for i in range(10)]
            published += await app.publish_many("orders", batch)
        replica = _replica_of(local_cluster, master)
        local_cluster.kill_node(master)  # at once: no time for replication to catch up
        await wait_promoted(local_cluster, key, replica, rt.redis)
        check = RedisCluster.from_url(local_cluster.url)
        try:
            present: set[tuple[str, str]] = set()
            for index in range(4):
                shard = ShardId("orders", index)
                entries = await check.xrange(rt.keyspace.stream(shard))
                present |= {(str(shard), rid.decode()) for rid, _ in entries}
        finally:
            await check.aclose()
        assert {(p.shard, p.entry_id) for p in published} <= present


async def test_without_a_replica_ack_a_failover_loses_the_acknowledged_entry(
    local_cluster: LocalCluster,
) -> None:
    """The window of asynchronous replication, made deterministic: the replica is
    stopped and cut off, so the primary acknowledges writes no replica has; killing the
    primary then loses them. With ``min_replicas=1`` the same publish raises."""
    app = App("g")
    app.stream("orders", shards=1)
    async with StaticRuntime(app, workers=0, redis_url=local_cluster.url) as rt:
        key = rt.keyspace.stream(ShardId("orders", 0))
        before = await app.publish("orders", {"n": 0}, min_replicas=1, replica_timeout=5.0)
        master = local_cluster.master_for_key(key)
        replica = _replica_of(local_cluster, master)
        pid = local_cluster._servers[replica].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with local_cluster.client(master) as client:
                client.execute_command("CLIENT", "KILL", "TYPE", "replica")
            lost = await app.publish("orders", {"n": 1})  # acknowledged by the primary
            with pytest.raises(PublishNotDurableError) as raised:
                await app.publish("orders", {"n": 2}, min_replicas=1, replica_timeout=0.2)
            assert raised.value.published[0].shard == str(ShardId("orders", 0))
            local_cluster.kill_node(master)
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_promoted(local_cluster, key, replica, rt.redis)
        ids = [rid.decode() for rid, _ in await rt.redis.xrange(key)]
        assert before.entry_id in ids  # replicated before the replica was cut off
        assert lost.entry_id not in ids  # acknowledged, then lost with the primary


async def test_chaos_smoke_migration_and_master_kill_with_durable_publishing(
    local_cluster: LocalCluster,
) -> None:
    """Traffic through a slot migration and a master kill: every publish acknowledged
    as durable is handled (0 lost); a shard is never handled by two at once (0
    overlaps). Publishes that fail during the failover are retried with their event
    id, which the shard's dedup window turns into a duplicate, not a second entry."""
    handled: Counter[int] = Counter()
    in_flight: Counter[str] = Counter()
    overlaps: list[str] = []
    app = App("g")
    app.stream("orders", shards=8, min_replicas=1, replica_timeout=2.0, dedup_window=600)

    @app.handler("orders", ordering="shard")
    async def handle(value: dict[str, int], msg: Message) -> None:
        in_flight[msg.shard] += 1
        if in_flight[msg.shard] > 1:
            overlaps.append(msg.shard)
        await anyio.lowlevel.checkpoint()
        in_flight[msg.shard] -= 1
        handled[value["n"]] += 1

    async with StaticRuntime(app, workers=2, redis_url=local_cluster.url) as rt:
        acked: set[int] = set()
        failures: list[str] = []
        done = anyio.Event()

        async def produce() -> None:
            n = 0
            while not done.is_set():
                record = Record({"n": n}, key=f"k{n}", event_id=f"e{n}")
                while True:  # until acknowledged as durable
                    try:
                        await app.publish_many("orders", [record])
                        break
                    except (BackendError, PublishNotDurableError) as e:
                        failures.append(f"{type(e).__name__}: {e}")
                        await anyio.sleep(0.05)
                acked.add(n)
                n += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            await wait_for(lambda: len(handled) > 100, message="traffic")
            slot = key_slot(rt.keyspace.stream(ShardId("orders", 1)).encode())
            src = local_cluster.master_for_slot(slot)
            dst = next(m.port for m in local_cluster.masters() if m.port != src)
            await anyio.to_thread.run_sync(local_cluster.migrate_slot, slot, dst)
            await wait_more(handled, 100, "traffic after the migration")
            victim = local_cluster.master_for_key(rt.keyspace.stream(ShardId("orders", 2)))
            await anyio.to_thread.run_sync(local_cluster.kill_master, victim)
            # The promoted replica has no replica of its own: durable publishes to its
            # shards fail (PublishNotDurableError) until the old master is back, as a
            # replica of it.
            await anyio.to_thread.run_sync(local_cluster.restart_node, victim)
            await wait_more(handled, 100, "traffic after the failover", 60)
            done.set()
        await rt.wait_idle(timeout=60)
        lost = acked - set(handled)
        assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:10]}"
        assert not overlaps
        assert failures  # the kill was felt by the producer (and retried)


async def test_dead_letters_of_a_durable_stream_wait_for_a_replica(
    local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead letter lives on its own node; its write ends with WAIT, so a failover
    there cannot lose it while the ack of the original survives. Without a connected
    replica the wait is seen to fail (logged), and the dead letter is still written."""
    app = App("g")
    app.stream("orders", shards=1, min_replicas=1, replica_timeout=0.2)

    @app.handler("orders", retry=RetryPolicy(max_attempts=1))
    async def handle(value: dict[str, int]) -> None:
        raise RuntimeError("always")

    async with StaticRuntime(app, workers=1, redis_url=local_cluster.url) as rt:
        await app.publish("orders", {"n": 0})
        await rt.wait_idle()
        assert len(await rt.dead_letters("orders")) == 1
        assert "acknowledged by" not in caplog.text
        dlq = rt.keyspace.dead_letters("g", "orders")
        master = local_cluster.master_for_key(dlq)
        pid = local_cluster._servers[_replica_of(local_cluster, master)].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with local_cluster.client(master) as client:
                client.execute_command("CLIENT", "KILL", "TYPE", "replica")
            await app.publish("orders", {"n": 1}, min_replicas=0)
            await rt.wait_idle()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(await rt.dead_letters("orders")) == 2
        assert "acknowledged by 0 replica(s), not 1" in caplog.text


async def test_a_durable_retry_answered_as_a_duplicate_still_waits_for_the_replica(
    local_cluster: LocalCluster,
) -> None:
    """Retrying a PublishNotDurableError with the same event id, from another
    connection, finds the entry (a duplicate) and is acknowledged only once a replica
    has it: the dedup script writes even then, so WAIT covers the earlier entry."""
    app = App("g")
    app.stream("orders", shards=1, dedup_window=600)
    async with StaticRuntime(app, workers=0, redis_url=local_cluster.url) as rt:
        assert rt.connection is not None
        key = rt.keyspace.stream(ShardId("orders", 0))
        master = local_cluster.master_for_key(key)
        pid = local_cluster._servers[_replica_of(local_cluster, master)].pid
        assert pid is not None
        other = create_redis(rt.settings)  # a retry from another producer process
        retrying = create_producer(app, rt.settings, other, Scripts(other), rt.connection.routing)
        record = Record({"n": 1}, event_id="e1")
        # Discover the cluster now: the client's seed URL is the first live node, which
        # after earlier failovers may be the very replica stopped below.
        await other.initialize()
        os.kill(pid, signal.SIGSTOP)  # connected, but acknowledging nothing
        try:
            with pytest.raises(PublishNotDurableError) as first:
                await app.publish("orders", {"n": 1}, event_id="e1", replica_timeout=0.2,
                                  min_replicas=1)  # fmt: skip
            with pytest.raises(PublishNotDurableError) as again:
                await retrying.publish("orders", record, min_replicas=1, replica_timeout=0.2)
            [written] = first.value.published
            [duplicate] = again.value.published
            assert duplicate.duplicate and duplicate.entry_id == written.entry_id
        finally:
            os.kill(pid, signal.SIGCONT)
        try:
            done = await retrying.publish("orders", record, min_replicas=1, replica_timeout=10)
        finally:
            await other.aclose()
        assert done.duplicate and done.entry_id == written.entry_id
        assert len(await rt.redis.xrange(key)) == 1
