"""Every client path checks the namespace (issue 22, item 1): ``streamworks publish``
and ``streamworks dlq replay`` pointed at a Redis the coordinator does not serve —
one holding another deployment's keys, or an empty one — refuse with the very line
the library's producer raises, and write nothing there.

(Before, ``publish`` printed ``published to ...`` into a Redis nobody reads, and on an
empty one failed with "messages still routed to retired shards".)"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamworks import App
from streamworks.exceptions import NamespaceMismatchError
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from tests.e2e.harness import GROUP, STREAM, Cluster, create_stream, instrumented, wait_ready
from tests.e2e.test_cli import assert_one_error_line, text
from tests.e2e.test_namespace import other_database

KINDS = ["another-deployment", "empty"]


@pytest.fixture
async def elsewhere(cluster: Cluster, settings: Settings) -> AsyncIterator[Any]:
    """A client of another database of the test's server, under the test's prefix
    (its keys are deleted afterwards)."""
    client = create_redis(
        settings.model_copy(update={"redis_url": other_database(cluster.redis_url)})
    )
    try:
        yield client
    finally:
        for pattern in Keyspace(cluster.prefix).namespace_patterns():
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
        await client.aclose()


async def prepare(cluster: Cluster, elsewhere: Any, kind: str) -> str:
    """The coordinator of the test (its stream created); with ``another-deployment``,
    the other database gets a deployment of its own (its coordinator's namespace id,
    the same stream, a dead letter of the group). The other database's URL."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    url = other_database(cluster.redis_url)
    if kind == "another-deployment":
        other = cluster.start_coordinator("other", STREAMWORKS_REDIS_URL=url)
        await wait_ready(other)
        async with cluster.client(other) as client:
            await client.create_stream(STREAM, instrumented.SHARDS)
        keyspace = Keyspace(cluster.prefix)
        await elsewhere.xadd(
            keyspace.dead_letters(GROUP, STREAM),
            {"reason": "poison", "error": "x", "o.v": b'{"id": "old"}', "shard": f"{STREAM}/0@0"},
        )
        other.send(signal.SIGKILL)  # a deployment that is no longer running
        cluster.coordinators.remove(other)
    return url


async def library_error(cluster: Cluster, url: str) -> str:
    """What the library's producer raises on that Redis: the line every path prints."""
    app = App("e2e-stray", settings=cluster.settings(redis_url=url))
    app.stream(STREAM, shards=instrumented.SHARDS)
    async with app.connect():
        with pytest.raises(NamespaceMismatchError) as caught:
            await app.publish(STREAM, {"id": "lost"}, key="k")
    return str(caught.value)


async def snapshot(redis: Any, prefix: str) -> dict[bytes, Any]:
    """Every key of the prefix with its length (streams) or type."""
    found: dict[bytes, Any] = {}
    for pattern in Keyspace(prefix).namespace_patterns():
        async for key in redis.scan_iter(match=pattern, count=1000):
            kind = await redis.type(key)
            found[key] = await redis.xlen(key) if kind == b"stream" else kind
    return found


@pytest.mark.parametrize("kind", KINDS)
async def test_publish_refuses_a_redis_the_coordinator_does_not_serve(
    cluster: Cluster, elsewhere: Any, kind: str
) -> None:
    url = await prepare(cluster, elsewhere, kind)
    before = await snapshot(elsewhere, cluster.prefix)
    expected = await library_error(cluster, url)
    result = await cluster.cli("publish", STREAM, '{"id": "o-1"}', "--key", "k", "--redis", url)
    assert_one_error_line(result, "namespace mismatch")
    assert text(result)[1].strip() == f"error: {expected}"
    assert result.returncode == 1
    held = "no namespace id" if kind == "empty" else "holds namespace "
    assert held in expected, expected
    assert await snapshot(elsewhere, cluster.prefix) == before  # nothing was written


@pytest.mark.parametrize("kind", KINDS)
async def test_dlq_replay_refuses_a_redis_the_coordinator_does_not_serve(
    cluster: Cluster, elsewhere: Any, kind: str
) -> None:
    url = await prepare(cluster, elsewhere, kind)
    before = await snapshot(elsewhere, cluster.prefix)
    expected = await library_error(cluster, url)
    for extra in ((), ("--dry-run",)):
        result = await cluster.cli("dlq", "replay", GROUP, STREAM, "--redis", url, *extra)
        assert_one_error_line(result, "namespace mismatch")
        assert text(result)[1].strip() == f"error: {expected}"
        assert result.returncode == 1
    assert await snapshot(elsewhere, cluster.prefix) == before  # the dead letter stays
