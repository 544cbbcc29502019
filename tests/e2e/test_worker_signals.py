"""Workers as real processes under real signals: SIGKILL, SIGSTOP/SIGCONT, SIGTERM.

One coordinator and three workers of the instrumented app (6 shards) run against the
test's Redis with a 2 s member lease; the test process publishes while it signals a
worker, then checks from the handler's own records that nothing was lost, who
processed what, and that every processing began while its member held the shard's
owner fence.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import anyio
import pytest

from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import GroupInfo
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    Proc,
    Processing,
    Publisher,
    assert_owner_at_start,
    create_stream,
    duplicates,
    in_flight_when_paused,
    live,
    member_of,
    owners,
    processings,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)

LEASE_TTL = 2.0


async def start_group(cluster: Cluster, workers: int = 3, **env: str) -> list[Proc]:
    coordinator = cluster.start_coordinator(**env)
    await wait_ready(coordinator)
    await create_stream(cluster)
    return [cluster.start_worker(f"worker-{i}", **env) for i in range(workers)]


async def processed_by(redis: Any, prefix: str, member: str, count: int, timeout: float) -> None:
    async def enough() -> bool:
        records = await processings(redis, prefix)
        return sum(1 for p in records if p.member == member and p.end) >= count

    await wait_until(enough, timeout, f"{count} events handled by {member[:8]}", 0.1)


async def wait_moved(
    client: CoordinatorClient, shards: list[str], away_from: str, timeout: float
) -> GroupInfo:
    """Wait until every shard in ``shards`` is granted to a live member other than
    ``away_from``."""

    async def moved() -> GroupInfo | None:
        group = await client.group(GROUP)
        held = owners(group)
        ok = all(held.get(s) and away_from not in held[s] for s in shards)
        return group if ok else None

    return await wait_until(moved, timeout, f"shards {shards} to move", 0.02)


def assert_duplicates_only_from(records: list[Processing], in_flight: set[int]) -> int:
    """Every event processed more than once was in flight (``in_flight``: ids of the
    processings under way in the worker that was killed or paused): apart from those
    runs, it was processed exactly once, to the end. Returns how many such events."""
    dups = duplicates(records)
    for event_id, runs in dups.items():
        others = [p for p in runs if id(p) not in in_flight]
        ok = len(others) < len(runs) and len(others) == 1 and others[0].end is not None
        assert ok, f"{event_id} processed by {[str(p) for p in runs]}"
    return len(dups)


@pytest.mark.seed("E8")
@pytest.mark.seed("E22")
async def test_sigkill_worker_shards_move_after_lease_and_nothing_is_lost(
    cluster: Cluster, redis: Any
) -> None:
    """SIGKILL one of three workers under traffic: after the lease TTL its shards go to
    the survivors, which take over its unacknowledged entries; every event is handled,
    and the only duplicates are events the dead worker had in flight (at-least-once)."""
    workers = await start_group(cluster)
    victim = workers[1]
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        group = await wait_stable(client, 3)
        dead = member_of(group, victim)
        assert dead is not None and dead.assigned
        publisher = Publisher(app, "kill")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await processed_by(redis, cluster.prefix, dead.member_id, 30, timeout=15)
            victim.send(signal.SIGKILL)
            killed = time.monotonic()
            await victim.wait_exit(5)
            after = await wait_moved(client, dead.assigned, dead.member_id, LEASE_TTL + 8)
            failover = time.monotonic() - killed
            await publisher.wait_count(len(publisher.published) + 200)
            published = await publisher.stop()
        assert failover <= LEASE_TTL + 2, f"shards moved {failover:.2f}s after SIGKILL"
        assert len(live(after)) == 2
        records = await wait_handled(redis, cluster.prefix, published, timeout=30)
    assert_owner_at_start(records)
    assert_duplicates_only_from(records, {id(p) for p in records if p.member == dead.member_id})
    # The survivors really did take over: they finished events of the dead one's shards.
    taken = {p.shard for p in records if p.shard in dead.assigned and p.member != dead.member_id}
    assert taken == set(dead.assigned)


@pytest.mark.seed("E1")
@pytest.mark.seed("E8")
async def test_sigstop_past_the_lease_fences_the_member_and_it_rejoins(
    cluster: Cluster, redis: Any
) -> None:
    """SIGSTOP a worker longer than its lease: its shards move. On SIGCONT its
    heartbeat is refused (UNKNOWN_MEMBER/FENCED), it drops its shards and rejoins with
    the same member id. No event is lost, and no member ever started an event of a
    shard whose owner fence named another member."""
    workers = await start_group(cluster, E2E_SLEEP="0.002")
    victim = workers[0]
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        group = await wait_stable(client, 3)
        paused = member_of(group, victim)
        assert paused is not None and paused.assigned
        publisher = Publisher(app, "stop")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await processed_by(redis, cluster.prefix, paused.member_id, 30, timeout=15)
            # Freeze it in the middle of a backlog: handlers running, more queued.
            burst = set(await publisher.burst(1500))

            async def busy_with_backlog() -> bool:
                records = await processings(redis, cluster.prefix)
                return sum(p.member == paused.member_id and p.id in burst for p in records) >= 20

            await wait_until(busy_with_backlog, 10, "the worker to work on the backlog", 0.01)
            victim.send(signal.SIGSTOP)
            stopped = time.monotonic()
            await wait_moved(client, paused.assigned, paused.member_id, LEASE_TTL + 8)
            # Let the new owners process the moved shards while the old one is frozen.
            moved = set(paused.assigned)

            async def new_owner_busy() -> bool:
                records = await processings(redis, cluster.prefix)
                return any(
                    p.shard in moved
                    and p.member != paused.member_id
                    and p.fence_member != paused.member_id
                    for p in records
                )

            await wait_until(new_owner_busy, 10, "new owners to process the moved shards")
            # The pause must outlast the lease as the worker itself counts it (the
            # coordinator may expire it sooner: its lease started at the last heartbeat).
            await anyio.sleep(max(0.0, stopped + LEASE_TTL + 0.2 - time.monotonic()))
            resumed_at = time.monotonic()
            victim.send(signal.SIGCONT)
            resumed = await processings(redis, cluster.prefix)
            back = await wait_stable(client, 3)
            rejoined = member_of(back, victim)
            assert rejoined is not None
            assert rejoined.member_id == paused.member_id  # same member id after rejoining
            assert rejoined.assigned
            await processed_by(
                redis,
                cluster.prefix,
                paused.member_id,
                sum(1 for p in resumed if p.member == paused.member_id and p.end) + 10,
                timeout=15,
            )
            published = await publisher.stop()
        records = await wait_handled(redis, cluster.prefix, published, timeout=30)
    output = victim.output()
    assert "UNKNOWN_MEMBER" in output or "FENCED" in output, output[-3000:]
    # Handlers entered before the pause finish after it (in flight); nothing may be
    # started after the resume on a shard whose fence names the new owner.
    under_way = in_flight_when_paused(records, paused.member_id, resumed_at)
    assert_owner_at_start(records, excused=under_way)
    assert_duplicates_only_from(records, under_way)


async def test_sigterm_finishes_in_flight_work_acks_and_leaves_at_once(
    cluster: Cluster, redis: Any
) -> None:
    """SIGTERM a worker while its handler runs a slow event: the handler finishes,
    its ack is flushed, the member leaves and its shards move at once — long before
    the (here 10 s) lease TTL would have moved them. Nothing is processed twice."""
    lease = "10"
    workers = await start_group(cluster, STREAMWORKS_LEASE_TTL=lease)
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        group = await wait_stable(client, 3)
        slow = await app.publish(STREAM, {"id": "slow-1", "sleep": 1.5}, key="slow")
        victim_member = next(m for m in live(group) if slow.shard in m.assigned)
        victim = next(w for w in workers if w.pid == int(victim_member.client["pid"]))
        publisher = Publisher(app, "term")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)

            async def slow_started() -> bool:
                return any(p.id == "slow-1" for p in await processings(redis, cluster.prefix))

            await wait_until(slow_started, 10, "the slow event to start")
            victim.send(signal.SIGTERM)
            termed = time.monotonic()
            code = await victim.wait_exit(15)
            exited = time.monotonic()
            await wait_moved(client, victim_member.assigned, victim_member.member_id, 5)
            moved = time.monotonic()
            await publisher.wait_count(len(publisher.published) + 100)
            published = await publisher.stop()
        assert code == 0, victim.output()[-3000:]
        took = moved - termed
        assert took < float(lease) / 2, f"shards moved {took:.2f}s after SIGTERM"
        assert moved - exited < 2.5
        records = await wait_handled(redis, cluster.prefix, [*published, "slow-1"], timeout=30)
        runs = [p for p in records if p.id == "slow-1"]
        assert [(p.member, p.end is not None) for p in runs] == [(victim_member.member_id, True)]
        assert duplicates(records) == {}
        await assert_drained(client)
    assert_owner_at_start(records)


@pytest.mark.seed("E22")
async def test_second_sigterm_exits_at_once_and_the_event_stays_pending(
    cluster: Cluster, redis: Any
) -> None:
    """A second SIGTERM during a slow handler exits at once with a non-zero code; the
    unfinished event stays pending and another worker processes it after the lease."""
    workers = await start_group(cluster)
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        group = await wait_stable(client, 3)
        slow = await app.publish(
            STREAM, {"id": "slow-2", "sleep": 60, "sleep_once": True}, key="slow"
        )
        victim_member = next(m for m in live(group) if slow.shard in m.assigned)
        victim = next(w for w in workers if w.pid == int(victim_member.client["pid"]))

        async def slow_started() -> bool:
            return any(p.id == "slow-2" for p in await processings(redis, cluster.prefix))

        await wait_until(slow_started, 10, "the slow event to start")
        victim.send(signal.SIGTERM)

        async def stopping() -> bool:
            return "stopping gracefully" in victim.output()

        await wait_until(stopping, 5, "the worker to begin its graceful stop")
        victim.send(signal.SIGTERM)
        second = time.monotonic()
        code = await victim.wait_exit(5)
        assert time.monotonic() - second < 2
        assert code != 0
        await wait_stable(client, 2, timeout=LEASE_TTL + 10)
        records = await wait_handled(redis, cluster.prefix, ["slow-2"], timeout=15)
        runs = [p for p in records if p.id == "slow-2"]
        assert runs[0].member == victim_member.member_id and runs[0].end is None
        assert runs[-1].member != victim_member.member_id and runs[-1].end is not None
        await assert_drained(client)
    assert_owner_at_start(records)


async def assert_drained(client: CoordinatorClient) -> None:
    """Eventually nothing is pending or lagging on any shard (every ack was flushed)."""

    async def drained() -> bool:
        info = await client.stream(STREAM)
        status = await client.status()
        shards = next(s for s in status.streams if s.name == STREAM).shards
        assert len(shards) == len(info.shards)
        return all(g.pending == 0 and g.lag == 0 for s in shards for g in s.groups)

    await wait_until(drained, 10, "every shard drained (pending 0, lag 0)", 0.1)
