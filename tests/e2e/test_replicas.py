"""Two coordinator replicas as real processes: one group, a rolling stop, a crash.

Workers reach the replicas through ``STREAMWORKS_COORDINATOR_URLS``: half of them
list replica A first, half replica B, so both replicas serve heartbeats of the same
group at once and their writes race on the group's Redis mutex and compare-and-set.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import anyio
import httpx
import pytest

from streamworks.protocol.control import GroupInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import (
    GROUP,
    Cluster,
    Proc,
    Publisher,
    assert_owner_at_start,
    create_stream,
    live,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)


async def heartbeats_answered(replica: Proc) -> int:
    """Heartbeats this replica has answered (its ``/metrics``)."""
    async with httpx.AsyncClient(timeout=2) as http:
        text = (await http.get(f"{replica.url}/metrics")).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("streamworks_coordinator_heartbeats_total{")
        )
    )


async def wait_heartbeats(replica: Proc, more_than: int, timeout: float = 10) -> int:
    async def answered() -> int | None:
        n = await heartbeats_answered(replica)
        return n if n > more_than else None

    return await wait_until(answered, timeout, f"{replica.name} to answer heartbeats")


async def start_replicas(cluster: Cluster, workers: int = 4, **env: str) -> list[Proc]:
    """Replicas A and B, and ``workers`` workers alternating A,B / B,A."""
    a = cluster.start_coordinator("replica-a", **env)
    b = cluster.start_coordinator("replica-b", **env)
    await wait_ready(a)
    await wait_ready(b)
    await create_stream(cluster)
    for i in range(workers):
        order = [a, b] if i % 2 == 0 else [b, a]
        cluster.start_worker(f"worker-{i}", coordinators=order, **env)
    return [a, b]


def assignment(group: GroupInfo) -> dict[str, tuple[int, tuple[str, ...]]]:
    return {m.member_id: (m.epoch, tuple(sorted(m.assigned))) for m in live(group)}


async def assert_fences_match(redis: Any, prefix: str, group: GroupInfo) -> None:
    """Each shard's owner fence in Redis names the member the metadata assigns it to."""
    keyspace = Keyspace(prefix)
    for member in live(group):
        for shard in member.assigned:
            fence = await redis.get(keyspace.fence(ShardId.parse(shard), GROUP))
            assert fence is not None and fence.decode().split(":", 1)[1] == member.member_id


@pytest.mark.seed("E3")
async def test_two_replicas_serve_one_stable_group(cluster: Cluster, redis: Any) -> None:
    """Two replicas serving one group at once agree: the same epochs and assignment
    from either replica, every shard assigned exactly once, each owner fence in Redis
    naming the assigned member, and the group stays at one epoch while both keep
    answering heartbeats. Traffic is processed exactly where the fences say."""
    a, b = await start_replicas(cluster)
    app = producer_app(cluster)
    async with cluster.client(a) as via_a, cluster.client(b) as via_b, app.connect():
        group = await wait_stable(via_a, 4)
        # Both replicas answer heartbeats of this group.
        seen_a = await wait_heartbeats(a, 0)
        seen_b = await wait_heartbeats(b, 0)
        # Over 20 more heartbeats on each replica, nothing changes: a stable group.
        await wait_heartbeats(a, seen_a + 20)
        await wait_heartbeats(b, seen_b + 20)
        from_a, from_b = await via_a.group(GROUP), await via_b.group(GROUP)
        assert from_a.state == from_b.state == "STABLE"
        assert from_a.group_epoch == from_b.group_epoch == group.group_epoch
        assert assignment(from_a) == assignment(from_b) == assignment(group)
        assert sorted(s for m in live(from_a) for s in m.assigned) == sorted(
            s.shard for s in (await via_b.stream("events")).shards
        )
        await assert_fences_match(redis, cluster.prefix, from_a)

        publisher = Publisher(app, "two")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await publisher.wait_count(300)
            published = await publisher.stop()
        records = await wait_handled(redis, cluster.prefix, published, timeout=20)
    assert_owner_at_start(records)
    owner = {s: m.member_id for m in live(group) for s in m.assigned}
    assert all(owner[p.shard] == p.member for p in records)


async def probe_terminating(replica: Proc) -> str | None:
    """What a client sees from a replica that was just told to stop: a retryable
    COORDINATOR_TERMINATING, or nobody listening."""
    async with httpx.AsyncClient(timeout=2) as http:
        try:
            response = await http.get(f"{replica.url}/readyz")
        except httpx.TransportError:
            return "unreachable"
    if response.status_code == 200:
        return None  # not yet
    body = response.json()
    assert response.status_code == 503 and body["retryable"] is True, body
    return str(body["error"])


@pytest.mark.seed("E4")
async def test_sigterm_of_a_replica_under_traffic(cluster: Cluster, redis: Any) -> None:
    """SIGTERM replica A while workers use both replicas and events flow: A answers
    COORDINATOR_TERMINATING or goes away, exits cleanly, leaves no group mutex
    behind (with a 20 s mutex TTL a leaked one would still be there), its clients
    move to B without dropping out of the group, and nothing is lost."""
    a, b = await start_replicas(cluster, STREAMWORKS_COORDINATOR__MUTEX_TTL="20")
    keyspace = Keyspace(cluster.prefix)
    app = producer_app(cluster)
    async with cluster.client(b) as via_b, app.connect():
        group = await wait_stable(via_b, 4)
        members = sorted(m.member_id for m in live(group))
        await wait_heartbeats(a, 10)
        publisher = Publisher(app, "rolling")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await publisher.wait_count(200)
            a.send(signal.SIGTERM)
            seen = await wait_until(
                lambda: probe_terminating(a), 10, "replica A to refuse or go away", 0.01
            )
            assert seen in ("COORDINATOR_TERMINATING", "unreachable")
            assert await a.wait_exit(15) == 0, a.output()[-3000:]

            async def no_mutex() -> bool:
                return not await redis.exists(
                    keyspace.group_mutex(GROUP), keyspace.stream_mutex("events")
                )

            await wait_until(no_mutex, 2, "no group or stream mutex held", 0.01)
            # A's clients now heartbeat through B; nobody dropped out meanwhile.
            await wait_heartbeats(b, await heartbeats_answered(b) + 40)
            after = await via_b.group(GROUP)
            assert sorted(m.member_id for m in live(after)) == members
            assert all(m.state == "STABLE" for m in live(after))
            count = len(publisher.published)
            await publisher.wait_count(count + 200)
            published = await publisher.stop()
        records = await wait_handled(redis, cluster.prefix, published, timeout=20)
    assert_owner_at_start(records)
    assert "terminating" in a.output()


@pytest.mark.seed("E3")
async def test_sigkill_of_a_replica_the_survivor_carries_on(cluster: Cluster, redis: Any) -> None:
    """SIGKILL replica A: B carries on. A mutex a killed replica leaves behind (here
    planted at the moment of the kill, as a crash inside a critical section would
    leave it) only delays B until ``coordinator.mutex_ttl``: a new worker still joins,
    the group settles, and every event is handled."""
    mutex_ttl = 2.0
    a, b = await start_replicas(cluster, STREAMWORKS_COORDINATOR__MUTEX_TTL=str(mutex_ttl))
    keyspace = Keyspace(cluster.prefix)
    mutex = keyspace.group_mutex(GROUP)
    app = producer_app(cluster)
    async with cluster.client(b) as via_b, app.connect():
        await wait_stable(via_b, 4)
        await wait_heartbeats(a, 10)
        publisher = Publisher(app, "crash")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await publisher.wait_count(200)
            a.send(signal.SIGKILL)
            await a.wait_exit(5)
            killed = time.monotonic()
            await redis.set(mutex, "killed-replica", nx=True, px=int(mutex_ttl * 1000))
            assert 0 < await redis.pttl(mutex) <= mutex_ttl * 1000
            cluster.start_worker("late-worker", coordinators=[a, b])

            async def mutex_gone() -> bool:
                return not await redis.exists(mutex) or await redis.get(mutex) != b"killed-replica"

            await wait_until(mutex_gone, mutex_ttl + 1, "the left-behind mutex to expire", 0.01)
            assert time.monotonic() - killed <= mutex_ttl + 1
            await wait_stable(via_b, 5, timeout=20)
            count = len(publisher.published)
            await publisher.wait_count(count + 200)
            published = await publisher.stop()
        records = await wait_handled(redis, cluster.prefix, published, timeout=20)
    assert_owner_at_start(records)
