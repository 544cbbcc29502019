"""Shared fixtures: a real Redis per session (embedded unless STREAMWORKS_TEST_REDIS_URL),
a fresh key prefix per test, and the anyio backend pinned to asyncio (redis-py's
asyncio client)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(streamworks_redis_url: str) -> Settings:
    """Settings on the session's Redis with a key prefix of this test's own."""
    return Settings(redis_url=streamworks_redis_url, key_prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
def keyspace(settings: Settings) -> Keyspace:
    return Keyspace(settings.key_prefix)


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Any]:
    """An asyncio client; every key of the test's prefix is deleted afterwards."""
    client = create_redis(settings)
    try:
        yield client
    finally:
        for pattern in Keyspace(settings.key_prefix).namespace_patterns():
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
        await client.aclose()


@pytest.fixture
def scripts(redis: Any) -> Scripts:
    return Scripts(redis)


@pytest.fixture
async def server_version(redis: Any) -> str:
    info = await redis.info("server")
    return str(info.get("valkey_version") or info["redis_version"])
