"""The status gauges of the coordinator's ``/metrics`` over real HTTP: pending and lag
per shard and group, stream lengths, the migration phase, dead-letter lengths — read
from Redis at scrape time, so they are right on any replica."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamworks import App
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), sample.value))
    return out


def values(samples: Samples, name: str, **labels: str) -> list[float]:
    return [
        v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items())
    ]


def by_shard(samples: Samples, name: str, group: str) -> dict[str, float]:
    return {got["shard"]: v for got, v in samples.get(name, []) if got["group"] == group}


async def scraped(
    check: Callable[[], Awaitable[Samples | None]], timeout: float, what: str
) -> Samples:
    """Scrape until ``check`` accepts what it scraped (an observation is reused for up
    to a second, so the next scrape may still show the last one)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = await check()
        if samples is not None:
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(0.05)


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.get("/metrics")
        assert response.status_code == 200
        return parse(response.text)


def _app() -> App:
    app = App("billing")
    app.stream("invoices", shards=3)

    @app.handler("invoices")
    async def handle(value: Any) -> None: ...

    return app


async def test_status_gauges_follow_redis(streamworks_redis_url: str, settings: Settings) -> None:
    async with TestRuntime(
        _app(), http=True, redis_url=streamworks_redis_url, settings=fast_settings(settings)
    ) as rt:
        await rt.wait_assigned()
        url = rt.http_url
        first = await scrape(url)
        assert values(first, "streamworks_coordinator_stream_shards", stream="invoices") == [3]
        assert sorted(by_shard(first, "streamworks_coordinator_shard_lag", "billing")) == [
            "invoices/0@0",
            "invoices/1@0",
            "invoices/2@0",
        ]
        assert values(first, "streamworks_coordinator_live_members", group="billing") == [1]
        assert values(
            first, "streamworks_coordinator_migration_phase", stream="invoices", phase="NONE"
        ) == [1]

        # Nobody reads: every published message is lag, on the shard it went to.
        await rt.kill_worker(0)
        published = [await rt.app.publish("invoices", {"n": n}, key=f"k{n}") for n in range(30)]
        per_shard: dict[str, int] = defaultdict(int)
        for p in published:
            per_shard[p.shard] += 1

        shards = ["invoices/0@0", "invoices/1@0", "invoices/2@0"]
        expected = {s: float(per_shard.get(s, 0)) for s in shards}

        async def lag_seen() -> Samples | None:
            got = await scrape(url)
            lag = by_shard(got, "streamworks_coordinator_shard_lag", "billing")
            return got if lag == expected else None

        samples = await scraped(lag_seen, 10, "lag per shard")
        assert values(
            samples, "streamworks_coordinator_group_lag", group="billing", stream="invoices"
        ) == [30]
        assert values(
            samples, "streamworks_coordinator_group_pending", group="billing", stream="invoices"
        ) == [0]
        lengths = {got["shard"]: v for got, v in samples["streamworks_coordinator_shard_length"]}
        assert sum(lengths.values()) == 30
        assert values(
            samples, "streamworks_coordinator_dead_letters", group="billing", stream="invoices"
        ) == [0]

        # Dead letters, as a worker writes them; a scale-in that cannot drain (lag).
        keyspace = Keyspace(rt.settings.key_prefix)
        for n in range(4):
            await rt.redis.xadd(keyspace.dead_letters("billing", "invoices"), {"n": str(n)})
        assert rt.service is not None
        await rt.service.scale_stream("invoices", 2)

        async def migrating() -> Samples | None:
            got = await scrape(url)
            dlq = values(got, "streamworks_coordinator_dead_letters", group="billing")
            none = values(got, "streamworks_coordinator_migration_phase", phase="NONE")
            return got if dlq == [4] and none == [0] else None

        samples = await scraped(migrating, 10, "the migration and the DLQ")
        phases = {got["phase"]: v for got, v in samples["streamworks_coordinator_migration_phase"]}
        assert phases["FENCING"] + phases["DRAINING"] == 1, phases
        assert values(samples, "streamworks_coordinator_draining_shards", stream="invoices") == [1]
        assert values(samples, "streamworks_coordinator_stream_shards", stream="invoices") == [2]


async def test_status_series_disappear_when_status_cannot_be_read(
    streamworks_redis_url: str, settings: Settings
) -> None:
    """An observation that failed (Redis unreachable) leaves the replica's own counters
    and no stale status values."""
    async with TestRuntime(
        _app(), http=True, redis_url=streamworks_redis_url, settings=fast_settings(settings)
    ) as rt:
        await rt.wait_assigned()
        before = await scrape(rt.http_url)
        assert by_shard(before, "streamworks_coordinator_shard_pending", "billing")
        assert rt.service is not None
        rt.service.metrics.observe_status(None, {})
        text = generate_latest(rt.service.metrics.registry).decode()
        assert "# TYPE streamworks_coordinator_shard_pending gauge" in text
        after = parse(text)
        assert not after.get("streamworks_coordinator_shard_pending")
        assert after["streamworks_coordinator_heartbeats_total"]
