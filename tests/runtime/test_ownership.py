"""Takeover of a gained shard, fenced reads, lease expiry, drain and graceful shutdown."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App, Message
from streamworks.coordinator.provision import grant_token, write_fence
from streamworks.protocol.shards import ShardId
from streamworks.runtime.reader import ReaderState
from streamworks.testing import TestRuntime
from tests.runtime.static_runtime import StaticRuntime
from tests.support import lease_lost, wait_for

SHARD = ShardId("orders", 0)


def one_shard_app(ordering: str = "key") -> tuple[App, list[Any]]:
    app = App("g")
    app.stream("orders", shards=1)
    seen: list[Any] = []

    @app.handler("orders", ordering=ordering)  # type: ignore[arg-type]
    async def handle(value: dict[str, Any], msg: Message) -> None:
        seen.append(value["n"])

    return app, seen


async def group_info(rt: TestRuntime | StaticRuntime) -> dict[str, Any]:
    [info] = await rt.redis.xinfo_groups(rt.keyspace.stream(SHARD))
    return dict(info)


@pytest.mark.cluster
async def test_takeover_claims_the_previous_owners_pending_entries_first(
    streamworks_redis_url: str,
) -> None:
    app, seen = one_shard_app(ordering="shard")
    async with StaticRuntime(app, workers=0, redis_url=streamworks_redis_url) as rt:
        key = rt.keyspace.stream(SHARD)
        for n in range(5):
            await app.publish("orders", {"n": n})
        # A previous owner read 3 entries and crashed before acking them.
        await rt.redis.xreadgroup("g", "ghost", {key: ">"}, count=3)
        await app.publish("orders", {"n": 5})
        await rt.add_worker()
        await rt.wait_idle()
        assert sorted(seen) == [0, 1, 2, 3, 4, 5]
        assert seen[:3] == [0, 1, 2]  # the claimed pending entries ran before new ones
        consumers = [c["name"] for c in await rt.redis.xinfo_consumers(key, "g")]
        assert b"ghost" not in consumers  # pruned once it owned nothing


@pytest.mark.cluster
async def test_fenced_read_refuses_a_member_whose_grant_was_replaced(
    streamworks_redis_url: str,
) -> None:
    app, seen = one_shard_app()
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 1})
        await rt.wait_idle()
        # The coordinator grants the shard to someone else (a newer epoch).
        assert rt.scripts is not None
        written, _ = await write_fence(rt.scripts, rt.keyspace, SHARD, "g", 10**6, "other")
        assert written
        await app.publish("orders", {"n": 2})  # wakes the reader; its read is refused
        await wait_for(lambda: SHARD in worker.fenced, message="the reader to be fenced")
        for n in range(3, 6):
            await app.publish("orders", {"n": n})
        info = await group_info(rt)
        assert seen == [1]
        assert info["pending"] == 0  # nothing was pulled into the stale member's PEL
        assert info["lag"] == 4
        assert SHARD not in worker.owned_shards() or not worker.readers[SHARD].accepting


async def test_reads_stop_when_the_lease_expires_and_resume_on_renewal(
    streamworks_redis_url: str,
) -> None:
    app, seen = one_shard_app()
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 0})
        await rt.wait_idle()
        worker.lease.renew(worker.clock.monotonic() - 1)  # the lease ran out
        # Once the loss is noticed (the watchdog cuts the reader's wait short), nothing
        # is read: the fenced read queued behind the wait never runs.
        await wait_for(lambda: lease_lost(worker), message="the lease loss")
        for n in range(1, 4):
            await app.publish("orders", {"n": n})
        info = await group_info(rt)
        assert seen == [0]
        assert info["lag"] == 3 and info["pending"] == 0
        worker.lease.renew(math.inf)
        await rt.wait_idle()
        assert seen == [0, 1, 2, 3]


async def test_a_wait_for_new_entries_ends_before_the_lease_does(
    streamworks_redis_url: str,
) -> None:
    """The fenced read rides behind the blocking wait; the wait is capped at the
    lease's end and cut short by the lease watchdog, so a lease that runs out while
    the shard is idle (no heartbeat renewed it) leaves no read queued that would pull
    entries after the lease ended."""
    app, seen = one_shard_app()
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 0})
        await rt.wait_idle()
        worker.lease.renew(worker.clock.monotonic() + 0.3)  # ends while the reader waits
        await wait_for(lambda: lease_lost(worker), message="the lease loss")
        for n in range(1, 4):
            await app.publish("orders", {"n": n})
        info = await group_info(rt)
        assert seen == [0]
        assert info["lag"] == 3 and info["pending"] == 0
        worker.lease.renew(math.inf)
        await rt.wait_idle()
        assert seen == [0, 1, 2, 3]


async def test_drain_finishes_in_flight_work_acks_and_reads_no_more(
    streamworks_redis_url: str,
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    started = anyio.Event()
    release = anyio.Event()
    done: list[int] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int]) -> None:
        started.set()
        await release.wait()
        done.append(value["n"])

    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 1})
        await started.wait()
        worker.start_drain([SHARD])
        assert worker.revoking_shards() == {SHARD}
        await app.publish("orders", {"n": 2})  # after the drain began: not for us
        assert SHARD in worker.owned_shards()  # still draining: in-flight work
        release.set()
        await wait_for(lambda: SHARD not in worker.owned_shards(), message="drain to finish")
        assert worker.revoking_shards() == frozenset()
        info = await group_info(rt)
        assert done == [1]
        assert info["pending"] == 0  # acked before it was reported drained
        assert info["lag"] == 1  # the later message waits for the next owner


async def test_graceful_shutdown_finishes_in_flight_and_loses_nothing(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    done: list[int] = []

    @app.handler("orders", ordering="none", concurrency=4)
    async def handle(value: dict[str, int]) -> None:
        await anyio.sleep(0.02)  # simulated work in flight during the stop
        done.append(value["n"])

    async with streamworks_runtime(app, workers=1) as rt:
        for n in range(40):
            await app.publish("orders", {"n": n})
        await wait_for(lambda: len(done) >= 4, message="some work to be done")
        await rt.stop_worker(0)
        stopped_with = len(done)
        pending = 0
        for shard in (ShardId("orders", 0), ShardId("orders", 1)):
            [info] = await rt.redis.xinfo_groups(rt.keyspace.stream(shard))
            pending += info["pending"]
        # Everything that started finished and was acked; what was read but not yet
        # started stays pending for the next owner.
        assert pending == 40 - stopped_with - sum(
            [(await rt.redis.xinfo_groups(k))[0]["lag"] for k in await rt.shard_keys("orders")]
        )
        await rt.add_worker()
        await rt.wait_idle()
        assert sorted(done) == list(range(40))  # nothing lost
        assert len(done) == 40 and stopped_with < 40  # and nothing handled twice


@pytest.mark.seed("E22")
async def test_at_least_once_a_crash_after_the_handler_before_the_ack_redelivers(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    effects: list[str] = []
    hang = anyio.Event()

    @app.handler("orders")
    async def handle(value: dict[str, Any], msg: Message) -> None:
        effects.append(msg.id)  # the side effect happened...
        if len(effects) == 1:
            await hang.wait()  # ...and the worker dies before acking

    async with streamworks_runtime(app, workers=2) as rt:
        owner = next(i for i, w in enumerate(rt.workers) if w.owned_shards())
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: len(effects) == 1, message="the first attempt")
        await rt.kill_worker(owner)
        await rt.wait_idle()
        assert len(effects) == 2 and effects[0] == effects[1]  # processed twice, not lost


async def test_a_stopped_reader_reports_why(
    streamworks_redis_url: str,
) -> None:
    app, _ = one_shard_app()
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        reader = worker.readers[SHARD]
        await rt.redis.delete(rt.keyspace.stream(SHARD))  # retired underneath it
        await app.connection.redis.execute_command("PING")
        await wait_for(lambda: reader.stop_reason is not None, message="the reader to stop")
        assert reader.stop_reason == ReaderState.RETIRED
        assert not await rt.redis.exists(rt.keyspace.stream(SHARD))  # never re-created
        assert grant_token(1, "m") == "1:m"
