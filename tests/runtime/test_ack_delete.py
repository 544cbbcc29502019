"""Ack-delete and retention trim only what every group has acknowledged, and keep
``lag`` exact (E12) on Redis 7.0 and Valkey 8.1."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from streamworks import App
from streamworks.protocol.shards import ShardId
from streamworks.settings import WorkerSettings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for


def group_app(name: str, seen: list[int], **stream: Any) -> App:
    app = App(name)
    app.stream("orders", shards=2, **stream)

    @app.handler("orders")
    async def handle(value: dict[str, int]) -> None:
        seen.append(value["n"])

    return app


async def lags(rt: TestRuntime) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key in await rt.shard_keys("orders"):
        for g in await rt.redis.xinfo_groups(key):
            out.setdefault(g["name"].decode(), []).append(g["lag"])
    return out


async def total_length(rt: TestRuntime) -> int:
    return sum([await rt.redis.xlen(k) for k in await rt.shard_keys("orders")])


@pytest.mark.cluster
@pytest.mark.seed("E12")
async def test_ack_delete_with_two_groups_keeps_the_slow_groups_entries_and_exact_lag(
    streamworks_redis_url: str,
) -> None:
    settings = fast_settings(worker=WorkerSettings(trim_interval=0.02, block=0.5))
    prefix = f"t{uuid.uuid4().hex[:10]}"
    fast_seen: list[int] = []
    slow_seen: list[int] = []
    fast = group_app("fast", fast_seen, delete_on_ack=True)
    slow = group_app("slow", slow_seen, delete_on_ack=True)
    common = {"redis_url": streamworks_redis_url, "settings": settings, "key_prefix": prefix}
    async with (
        TestRuntime(slow, workers=1, attach=False, **common) as slow_rt,
        TestRuntime(fast, workers=1, **common) as fast_rt,
    ):
        await slow_rt.stop_worker(0)  # subscribed (its consumer groups exist), then gone
        for n in range(200):
            await fast.publish("orders", {"n": n}, key=str(n))
        await wait_for(lambda: len(fast_seen) == 200, message="the fast group")
        fast_worker = fast_rt.workers[0]
        await wait_for(
            lambda: all(not r.acked_since_trim for r in fast_worker.readers.values()),
            message="a trim pass after the acks",
        )
        # The slow group has read nothing: no entry may be gone, lag stays exact.
        assert await total_length(fast_rt) == 200
        lag = await lags(fast_rt)
        assert lag["fast"] == [0, 0]
        assert sum(lag["slow"]) == 200 and None not in lag["slow"]
        await slow_rt.add_worker()
        await wait_for(lambda: len(slow_seen) == 200, message="the slow group")
        await wait_for(
            lambda: _is_empty(fast_rt),
            message="entries trimmed once both groups acked them",
        )
        assert await lags(fast_rt) == {"fast": [0, 0], "slow": [0, 0]}
        # More traffic after the trims: lag is still computed exactly.
        await slow_rt.stop_worker(1)
        for n in range(200, 230):
            await fast.publish("orders", {"n": n}, key=str(n))
        await wait_for(lambda: len(fast_seen) == 230, message="the fast group again")
        lag = await lags(fast_rt)
        assert sum(lag["slow"]) == 30 and lag["fast"] == [0, 0]
    assert sorted(slow_seen) == list(range(200))
    assert sorted(fast_seen) == list(range(230))


async def _is_empty(rt: TestRuntime) -> bool:
    return await total_length(rt) == 0


async def test_retention_trims_only_old_entries_every_group_acked(
    streamworks_redis_url: str,
) -> None:
    settings = fast_settings(worker=WorkerSettings(trim_interval=0.02, block=0.5))
    seen: list[int] = []
    app = group_app("g", seen, retention=3600)
    async with TestRuntime(
        app, workers=1, redis_url=streamworks_redis_url, settings=settings
    ) as rt:
        key = rt.keyspace.stream(ShardId("orders", 0))
        # An entry two hours old (explicit id) and a fresh one.
        await rt.redis.execute_command(
            "XADD", key, "1000-0", "v", b'{"n": -1}', "t", "1000", "f", "1"
        )
        for n in range(10):
            await app.publish("orders", {"n": n}, key="x")
        await rt.wait_idle()
        worker = rt.workers[0]
        await wait_for(
            lambda: all(not r.acked_since_trim for r in worker.readers.values()),
            message="a trim pass",
        )
        ids = [i for i, _ in await rt.redis.xrange(key)]
        assert b"1000-0" not in ids  # older than the retention and acked: trimmed
        assert await total_length(rt) == 10  # recent entries are kept
        assert sorted(seen) == [-1, *range(10)]
