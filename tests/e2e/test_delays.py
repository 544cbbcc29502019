"""Delayed messages with real processes: ``streamworks publish --delay/--at`` through
a real subprocess (and its errors), and a worker SIGKILLed while it moves due
messages into its shards: nothing is lost and no message enters a stream twice."""

from __future__ import annotations

import signal
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from streamworks.protocol.envelope import parse_fields
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import (
    STREAM,
    Cluster,
    create_stream,
    event,
    processings,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)
from tests.e2e.test_cli import assert_one_error_line, text
from tests.e2e.test_worker_signals import assert_duplicates_only_from

SHARDS = 6  # the instrumented app's


async def delayed_total(redis: Any, prefix: str) -> int:
    keyspace = Keyspace(prefix)
    return sum([await redis.zcard(keyspace.delayed(ShardId(STREAM, i))) for i in range(SHARDS)])


async def stream_ids(redis: Any, prefix: str) -> list[str]:
    """The event ids of every entry in the stream's shards (one per entry)."""
    keyspace = Keyspace(prefix)
    ids = []
    for i in range(SHARDS):
        for _, fields in await redis.xrange(keyspace.stream(ShardId(STREAM, i))):
            payload, *_ = parse_fields([x for pair in fields.items() for x in pair])
            ids.append(orjson.loads(payload)["id"])
    return ids


@pytest.mark.timeout(300)  # a CLI process each step (slow on a loaded machine)
async def test_publish_delay_and_at_from_the_cli(cluster: Cluster, redis: Any) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)

    later = await cluster.cli(
        "publish", STREAM, '{"id": "d-1"}', "--key", "k1", "--delay", "30m", "--json"
    )
    assert later.returncode == 0, text(later)
    result = orjson.loads(later.stdout)
    assert result["entry_id"] is None and result["delay_id"] == "0000000000000001"
    now_ms = datetime.now(UTC).timestamp() * 1000
    assert abs(result["due_ms"] - (now_ms + 30 * 60_000)) < 10_000
    assert await delayed_total(redis, cluster.prefix) == 1
    assert await stream_ids(redis, cluster.prefix) == []

    at = (datetime.now(UTC) + timedelta(days=1)).astimezone().replace(microsecond=0)
    human = await cluster.cli("publish", STREAM, '{"id": "d-2"}', "--at", at.isoformat())
    assert human.returncode == 0, text(human)
    assert "delayed on events/" in text(human)[0] and "due at" in text(human)[0], text(human)
    past = await cluster.cli(
        "publish", STREAM, '{"id": "d-3"}', "--at", "2020-01-01T00:00:00Z", "--json"
    )
    assert orjson.loads(past.stdout)["entry_id"] is not None  # due already: in the stream
    assert await delayed_total(redis, cluster.prefix) == 2
    lines = b'{"id": "l-1"}\n{"id": "l-2"}\n'
    many = await cluster.cli("publish", STREAM, "-", "--delay", "1h", "--json", input=lines)
    assert [orjson.loads(x)["delay_id"] is not None for x in many.stdout.splitlines()] == [True] * 2

    # Bad input: one error line, exit 2, nothing written (every case: tests/unit).
    for args, fragment in (
        (["--delay", "-5s"], "negative"),
        (["--at", "2030-01-01T09:00:00"], "no UTC offset"),
    ):
        bad = await cluster.cli("publish", STREAM, '{"id": "x"}', *args)
        assert bad.returncode == 2, text(bad)
        assert_one_error_line(bad, fragment)
    assert await delayed_total(redis, cluster.prefix) == 4


@pytest.mark.seed("E22")
@pytest.mark.timeout(300)
async def test_sigkill_of_the_mover_loses_no_delayed_message_and_adds_none_twice(
    cluster: Cluster, redis: Any
) -> None:
    """400 delayed messages due over 6 s; the only worker is SIGKILLed while it moves
    them, a second one takes its shards: each message enters the stream exactly once
    (the move is one fenced script) and is handled; only runs in flight at the kill
    run twice (at-least-once handling)."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    first = cluster.start_worker("worker-0")
    app = producer_app(cluster)
    count = 400
    async with cluster.client() as client, app.connect():
        await wait_stable(client, 1)  # owns every shard: the moves start as they come due
        records = [replace(event(f"d-{i:06d}"), delay=2.0 + 6.0 * i / count) for i in range(count)]
        published = await app.publish_many(STREAM, records)
    assert all(p.delayed for p in published)
    ids = [f"d-{i:06d}" for i in range(count)]

    async def moving() -> bool:
        records = await processings(redis, cluster.prefix)
        return sum(1 for p in records if p.end) >= 50

    await wait_until(moving, 20, "the first worker to handle some", 0.05)
    first.send(signal.SIGKILL)
    await first.wait_exit(5)
    left = await delayed_total(redis, cluster.prefix)
    assert 0 < left < count, f"{left} still delayed at the kill: not killed mid-way"
    cluster.start_worker("worker-1")

    done = await wait_handled(redis, cluster.prefix, ids, timeout=40)
    assert await delayed_total(redis, cluster.prefix) == 0
    entered = await stream_ids(redis, cluster.prefix)
    assert sorted(entered) == ids  # every message once in the streams, none twice
    dead = {p.member for p in done if p.pid == first.pid}
    assert_duplicates_only_from(done, {id(p) for p in done if p.member in dead})
