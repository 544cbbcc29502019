"""An app's open connection: Redis client, scripts, routing and producer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.producer import Producer
from streamworks.runtime.routing import RoutingSource, StaticRoutingSource
from streamworks.settings import Settings

if TYPE_CHECKING:
    from streamworks.app import App

__all__ = ("Connection", "create_producer", "open_connection")


@dataclass(slots=True)
class Connection:
    """What publishing (and a worker) needs: Redis, its scripts, keys and routing."""

    settings: Settings
    redis: Any
    scripts: Scripts
    keyspace: Keyspace
    routing: RoutingSource
    producer: Producer


def create_producer(
    app: App, settings: Settings, redis: Any, scripts: Scripts, routing: RoutingSource
) -> Producer:
    """A producer for ``app`` with its streams' dedup windows."""
    return Producer(
        redis,
        scripts,
        Keyspace(settings.key_prefix),
        routing,
        app.codec,
        max_reroutes=settings.producer.max_reroutes,
        sticky_batch=settings.producer.sticky_batch,
        dedup_windows={s.name: s.dedup_window for s in app.streams.values() if s.dedup_window},
    )


@contextlib.asynccontextmanager
async def open_connection(
    app: App,
    settings: Settings,
    *,
    redis: Any = None,
    routing: RoutingSource | None = None,
) -> AsyncIterator[Connection]:
    """Open (and finally close) a connection for ``app``.

    Args:
        redis: an existing client to use (not closed here); else one is created.
        routing: where routing comes from; by default the app's declared layout
            (:class:`StaticRoutingSource`).
    """
    keyspace = Keyspace(settings.key_prefix)
    own_redis = redis is None
    client = create_redis(settings) if own_redis else redis
    try:
        scripts = Scripts(client)
        if routing is None:
            routing = StaticRoutingSource(
                keyspace, {s.name: s.shards for s in app.streams.values()}
            )
        producer = create_producer(app, settings, client, scripts, routing)
        yield Connection(settings, client, scripts, keyspace, routing, producer)
    finally:
        if own_redis:
            await client.aclose()
