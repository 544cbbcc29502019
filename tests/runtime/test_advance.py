"""``TestRuntime.advance`` moves retry backoffs forward: a retry due in an hour runs
within a second of real time once the clock is moved past its due time, whether it
waits in the dispatcher (the lease survives the jump) or is taken over from its
retry record (the jump ends the lease and the member takes its shard over again)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamworks import App, Message, Retry, RetryPolicy
from streamworks.protocol.shards import ShardId
from streamworks.runtime.worker import Worker
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for

HOUR = 3600.0


def one_shard_app(attempts: list[int], fail_until: int, retry: RetryPolicy | None) -> App:
    """An app whose handler fails the attempts before ``fail_until``: with the policy's
    backoff when ``retry`` is given, else with ``Retry(delay=HOUR)``."""
    app = App("g")
    app.stream("orders", shards=1)

    @app.handler("orders", retry=retry or RetryPolicy(max_attempts=3, backoff=1))
    async def handle(value: dict[str, Any], msg: Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt < fail_until:
            if retry is None:
                raise Retry(delay=HOUR)
            raise RuntimeError("flaky")

    return app


async def due_in(rt: TestRuntime) -> float:
    """Seconds (on the runtime's clock) until the retry of the only message is due,
    from its retry record in Redis."""
    key = rt.keyspace.retries(ShardId("orders", 0), "g")
    records = {k: v for k, v in (await rt.redis.hgetall(key)).items() if b":" not in k}
    [record] = records.values()
    due_ms = int(record.split(b":")[1])
    return (due_ms - rt.clock.time_ms()) / 1000


def parked(worker: Worker) -> int:
    return worker.handlers["orders"].dispatcher.parked


async def test_advance_runs_a_parked_retry_at_once(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Retry(delay=3600) parks the message in the dispatcher; advancing the clock past
    the due time wakes it, with no lease lost (so no takeover brought it back)."""
    attempts: list[int] = []
    app = one_shard_app(attempts, 2, None)
    settings = fast_settings(lease_ttl=4 * HOUR)  # the jump below keeps the lease
    async with streamworks_runtime(app, settings=settings) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: parked(worker) == 1, 5, "the first attempt parked")
        assert attempts == [1]
        assert HOUR - 5 < await due_in(rt) <= HOUR

        await rt.advance(seconds=HOUR - 60)
        assert parked(worker) == 1  # re-timed, still a minute to go

        started = time.monotonic()
        await rt.advance(seconds=61)
        await rt.wait_idle(timeout=5)
        assert time.monotonic() - started < 5
        assert attempts == [1, 2]
        assert rt.handled("orders") == 1
        assert worker.lease.losses == 0


async def test_advance_runs_the_exponential_backoff_of_the_retry_policy(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The policy's backoff (600 s, then 1200 s: no jitter) is on the clock too."""
    attempts: list[int] = []
    policy = RetryPolicy(max_attempts=5, backoff=600, max_backoff=HOUR, jitter=False)
    app = one_shard_app(attempts, 3, policy)
    settings = fast_settings(lease_ttl=4 * HOUR)
    async with streamworks_runtime(app, settings=settings) as rt:
        [worker] = rt.workers
        started = time.monotonic()
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: parked(worker) == 1, 5, "the first attempt parked")
        assert 595 < await due_in(rt) <= 600

        await rt.advance(seconds=590)
        assert parked(worker) == 1 and attempts == [1]
        await rt.advance(seconds=11)
        await wait_for(lambda: attempts == [1, 2] and parked(worker) == 1, 5, "attempt 2")
        assert 1195 < await due_in(rt) <= 1200  # doubled

        await rt.advance(seconds=1201)
        await rt.wait_idle(timeout=5)
        assert attempts == [1, 2, 3]
        assert time.monotonic() - started < 10  # 30 minutes of backoff in real seconds
        stats = rt.statistics("orders")
        assert stats["failed"] == 2 and stats["retried"] == 2 and stats["handled"] == 1
        assert worker.lease.losses == 0


async def test_advance_past_the_lease_brings_a_taken_over_retry_forward(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """With the test-speed 1 s lease, an hour's jump ends the member's lease: the
    parked message is dropped (it stays pending), the member rejoins, takes the shard
    over and restores the retry from its record, whose wall-clock due time is on the
    same clock, so it is due at once."""
    attempts: list[int] = []
    app = one_shard_app(attempts, 2, None)
    async with streamworks_runtime(app) as rt:
        [worker] = rt.workers
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: parked(worker) == 1, 5, "the first attempt parked")
        assert HOUR - 5 < await due_in(rt) <= HOUR

        await rt.advance(seconds=HOUR + 1)
        await rt.wait_idle(timeout=10)
        assert attempts == [1, 2]
        assert rt.handled("orders") == 1
        assert worker.lease.losses >= 1  # it came back through the takeover
