"""The consume hot path (``HandlerRuntime._process_simple``) settles a message only
while the lease allows it, whether the handler suspended or not.

No Redis: a real worker whose client never connects; its acker is not running, so
what was acked stays in the acker's buffer, where the test reads it.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from streamworks import App, Settings
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.runtime.assignment import StaticAssignment
from streamworks.runtime.reader import ShardReader
from streamworks.runtime.worker import Worker


def _worker(handler: Callable[[bytes], Awaitable[None]]) -> tuple[Worker, ShardReader]:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", key_prefix=uuid.uuid4().hex)
    app = App("g", settings=settings)
    app.stream("orders", shards=1)
    app.handler("orders")(handler)
    member = uuid.uuid4().hex
    worker = Worker(app, create_redis(settings), StaticAssignment({}), settings=settings,
                    member_id=member)  # fmt: skip
    reader = ShardReader(worker, ShardId("orders", 0), f"1:{member}", worker.handlers["orders"])
    reader.recovering = False  # past its takeover round: what a live read takes is delivered
    return worker, reader


def _entry(i: int) -> list[Any]:
    return [b"%d-0" % i, [b"v", b"p", b"t", b"5", b"f", b"1", b"k", b"k%d" % i]]


def _acked(worker: Worker) -> list[bytes]:
    return [m._rid for batch in worker.acker._buffer.values() for m in batch]


async def _run(worker: Worker, reader: ShardReader, entries: list[list[Any]]) -> None:
    runtime = worker.handlers["orders"]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.dispatcher.run)
            reader._deliver(entries, None)
            await anyio.wait_all_tasks_blocked()  # every runner idle: all of it settled
            tg.cancel_scope.cancel()


async def test_a_run_that_ends_past_the_lease_is_not_acked() -> None:
    lapse: list[bool] = []

    async def handle(payload: bytes) -> None:
        if lapse:  # the lease ran out while the handler ran (e.g. a paused process)
            now = worker.clock.monotonic()
            worker.lease.renew_after_heartbeat(now - 100.0, 10.0, 1.0)

    worker, reader = _worker(handle)
    worker.lease.renew(math.inf)
    await _run(worker, reader, [_entry(1)])
    assert _acked(worker) == [b"1-0"] and worker.handlers["orders"].statistics.handled == 1

    lapse.append(True)
    worker.lease.renew(math.inf)
    reader.recovering = False
    await _run(worker, reader, [_entry(2)])
    # Not settled as handled: it stays pending for the next owner, and the reader
    # claims it again before reading on.
    assert _acked(worker) == [b"1-0"] and worker.handlers["orders"].statistics.handled == 1
    assert reader.recovering and reader.outstanding == 1


async def test_a_suspending_run_that_ends_past_the_lease_is_not_acked() -> None:
    async def handle(payload: bytes) -> None:
        await asyncio.sleep(0)
        now = worker.clock.monotonic()
        worker.lease.renew_after_heartbeat(now - 100.0, 10.0, 1.0)

    worker, reader = _worker(handle)
    worker.lease.renew(math.inf)
    reader.recovering = False
    await _run(worker, reader, [_entry(1)])
    assert _acked(worker) == [] and worker.handlers["orders"].statistics.handled == 0
    assert reader.recovering


async def test_a_run_does_not_start_once_the_lease_ran_out() -> None:
    ran: list[bytes] = []

    async def handle(payload: bytes) -> None:
        ran.append(payload)

    worker, reader = _worker(handle)
    worker.lease.renew(math.inf)
    runtime = worker.handlers["orders"]
    messages = []
    reader._deliver([_entry(1)], None)  # queued: the dispatcher is not running yet
    messages.extend(runtime.dispatcher._ready)
    worker.lease.renew(worker.clock.monotonic() - 1.0)  # ran out while it was queued
    assert runtime._process_simple(messages[0]) is None
    assert ran == [] and _acked(worker) == [] and reader.recovering
