"""Periodic schedules across real worker processes: exactly one message per tick.

The app (``tests/e2e/apps/scheduled.py``) ticks every second with ``catch_up="all"``,
so the target stream must hold every tick since the schedule started, each once —
no gap, no duplicate — whatever happens: workers SIGKILLed (the schedule shard's
owner among them), workers joining and leaving, the owner SIGKILLed at a
deterministic point mid-tick (after the claim, after the publish), a coordinator
replica SIGKILLed. The entries are read back from Redis, not from a handler (a
redelivered entry is not a second message).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import ScheduleInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.e2e.apps import scheduled
from tests.e2e.harness import Cluster, Proc, live, wait_ready, wait_until

TARGET = "tests.e2e.apps.scheduled:app"
SECOND = 1000


@contextlib.asynccontextmanager
async def start(cluster: Cluster, coordinators: int = 1) -> AsyncIterator[CoordinatorClient]:
    """Coordinators, the streams, and a client of them all."""
    for n in range(coordinators):
        await wait_ready(cluster.start_coordinator(f"coordinator-{n}"))
    async with cluster.client() as client:
        # Created before the workers start (several creating at once race, harness.py).
        await client.create_stream(scheduled.STREAM, scheduled.SHARDS)
        await client.create_stream(Keyspace.SCHEDULE_STREAM, 1)
        yield client


def start_worker(cluster: Cluster, name: str, **env: str) -> Proc:
    return cluster.start_worker(name, target=TARGET, **env)


async def stream_ticks(cluster: Cluster, client: CoordinatorClient, redis: Any) -> list[int]:
    """The tick of every entry of the target stream (from its event id)."""
    keyspace = Keyspace(cluster.prefix)
    info = await client.stream(scheduled.STREAM)
    ticks = []
    for shard in info.shards:
        for _, fields in await redis.xrange(keyspace.stream(ShardId.parse(shard.shard))):
            event = fields[b"e"].decode()
            assert event.startswith(f"sw-tick:{scheduled.GROUP}:every-second:"), event
            ticks.append(int(event.rsplit(":", 1)[1]))
    return ticks


async def wait_ticks(
    cluster: Cluster, client: CoordinatorClient, redis: Any, count: int, timeout: float = 30
) -> list[int]:
    async def enough() -> list[int] | None:
        ticks = await stream_ticks(cluster, client, redis)
        return ticks if len(ticks) >= count else None

    return await wait_until(enough, timeout, f"{count} ticks in the stream")


def assert_each_tick_once(ticks: list[int]) -> None:
    assert len(ticks) == len(set(ticks)), f"a tick published twice: {sorted(ticks)}"
    expected = list(range(min(ticks), max(ticks) + 1, SECOND))
    assert sorted(ticks) == expected, f"ticks missing: {sorted(set(expected) - set(ticks))}"


async def state(client: CoordinatorClient) -> ScheduleInfo:
    [info] = (await client.group(scheduled.GROUP)).schedules
    return info


async def owner(cluster: Cluster, client: CoordinatorClient) -> Proc:
    """The worker process that owns the schedule shard."""

    async def find() -> Proc | None:
        group = await client.group(scheduled.GROUP)
        pids = [
            m.client.get("pid")
            for m in live(group)
            if any(s.startswith(f"{Keyspace.SCHEDULE_STREAM}/") for s in m.assigned)
        ]
        procs = [p for p in cluster.procs if p.alive() and str(p.pid) in pids]
        return procs[0] if len(procs) == 1 else None

    return await wait_until(find, 30, "the owner of the schedule shard")


async def test_three_workers_crashing_and_rejoining_publish_each_tick_once(
    cluster: Cluster, redis: Any
) -> None:
    async with start(cluster) as client:
        for n in range(3):
            start_worker(cluster, f"worker-{n}")
        ticks = await wait_ticks(cluster, client, redis, 3)

        first_owner = await owner(cluster, client)
        first_owner.send(signal.SIGKILL)  # the owner, wherever it is in its tick
        start_worker(cluster, "worker-3")  # and a newcomer
        ticks = await wait_ticks(cluster, client, redis, len(ticks) + 4)
        second_owner = await owner(cluster, client)
        assert second_owner is not first_owner
        second_owner.send(signal.SIGTERM)  # a graceful leave this time
        assert await second_owner.wait_exit(30) == 0
        ticks = await wait_ticks(cluster, client, redis, len(ticks) + 3)

        assert_each_tick_once(ticks)
        info = await state(client)
        assert info.published + info.duplicate >= len(ticks) - 1  # the last may be in flight
        assert info.published <= len(await stream_ticks(cluster, client, redis))
        assert info.skipped == 0


@pytest.mark.parametrize("step", ["claim", "publish"])
async def test_an_owner_sigkilled_mid_tick_leaves_that_tick_published_once(
    cluster: Cluster, redis: Any, tmp_path: Path, step: str
) -> None:
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    (pauses / f"arm-{step}").touch()
    async with start(cluster) as client:
        workers = [
            start_worker(cluster, f"worker-{n}", E2E_PAUSE_DIR=str(pauses)) for n in range(2)
        ]
        paused = pauses / f"paused-{step}"

        async def paused_at() -> tuple[int, int] | None:
            if not paused.exists() or not paused.read_text():
                return None
            pid, tick = paused.read_text().split()
            return int(pid), int(tick)

        pid, tick = await wait_until(paused_at, 30, f"an owner paused after its {step}")
        [victim] = [w for w in workers if w.pid == pid]
        held = await state(client)
        assert held.pending_tick_ms == tick  # claimed, not done
        in_stream = tick in await stream_ticks(cluster, client, redis)
        assert in_stream == (step == "publish")

        victim.send(signal.SIGKILL)
        await victim.wait_exit(10)

        async def done() -> list[int] | None:
            ticks = await stream_ticks(cluster, client, redis)
            return ticks if tick in ticks and max(ticks) >= tick + 3 * SECOND else None

        ticks = await wait_until(done, 30, f"tick {tick} and three more")
        assert ticks.count(tick) == 1
        assert_each_tick_once(ticks)
        info = await state(client)
        assert info.last_tick_ms is not None and info.last_tick_ms >= tick + 2 * SECOND
        assert info.duplicate == (1 if step == "publish" else 0)


async def test_a_coordinator_replica_killed_adds_no_tick_and_loses_none(
    cluster: Cluster, redis: Any
) -> None:
    async with start(cluster, coordinators=2) as client:
        for n in range(2):
            start_worker(cluster, f"worker-{n}")
        ticks = await wait_ticks(cluster, client, redis, 3)

        cluster.coordinators[0].send(signal.SIGKILL)
        await cluster.coordinators[0].wait_exit(10)
        async with cluster.client(cluster.coordinators[1]) as survivor:
            ticks = await wait_ticks(cluster, survivor, redis, len(ticks) + 5)
            # A worker SIGKILLed too: the surviving coordinator moves the schedule shard.
            (await owner(cluster, survivor)).send(signal.SIGKILL)
            ticks = await wait_ticks(cluster, survivor, redis, len(ticks) + 4)

        assert_each_tick_once(ticks)
