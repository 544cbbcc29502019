"""An app's open connection: Redis client, scripts, routing and producer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from streamworks.clock import Clock
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import NamespaceCheck
from streamworks.redis.scripts import Scripts
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.producer import Producer
from streamworks.runtime.routing import RoutingSource
from streamworks.settings import Settings

if TYPE_CHECKING:
    from streamworks.runtime.app_view import AppView

__all__ = ("Connection", "create_producer", "dedup_windows", "open_connection")

log = logging.getLogger("streamworks.connection")


@dataclass(slots=True)
class Connection:
    """What publishing (and a worker) needs: Redis, its scripts, keys, routing and the
    coordinator transport (HTTP client or in-process)."""

    settings: Settings
    redis: Any
    scripts: Scripts
    keyspace: Keyspace
    routing: RoutingSource
    producer: Producer
    coordinator: CoordinatorTransport


def create_producer(
    app: AppView,
    settings: Settings,
    redis: Any,
    scripts: Scripts,
    routing: RoutingSource,
    clock: Clock | None = None,
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
        dedup_windows=dedup_windows(app, settings),
        durability={
            s.name: (s.min_replicas, s.replica_timeout)
            for s in app.streams.values()
            if s.min_replicas
        },
        clock=clock,
    )


def dedup_windows(app: AppView, settings: Settings) -> dict[str, float]:
    """Stream -> how long its idempotent-publish records live (s): the stream's
    ``dedup_window``, or ``producer.dedup_ttl`` when the operator set it (one knob
    for the memory those records take, whatever each app declared). Streams
    without dedup stay without it."""
    override = settings.producer.dedup_ttl
    return {
        s.name: override if override is not None else s.dedup_window
        for s in app.streams.values()
        if s.dedup_window
    }


@contextlib.asynccontextmanager
async def open_connection(
    app: AppView,
    settings: Settings,
    *,
    redis: Any = None,
    coordinator: CoordinatorTransport | None = None,
    routing: RoutingSource | None = None,
    ensure_streams: bool = True,
    ensure_timeout: float = 30.0,
    clock: Clock | None = None,
) -> AsyncIterator[Connection]:
    """Open (and finally close) a connection for ``app``.

    Args:
        redis: an existing client to use (not closed here); else one is created.
        coordinator: the coordinator transport; an HTTP client for
            ``settings.coordinator_urls`` by default.
        routing: where routing comes from; the coordinator's leased routing by default
            (refreshed in the background while the connection is open).
        ensure_streams: create the app's declared streams that do not exist yet
            (a declaration never rescales an existing stream).
        ensure_timeout: how long to keep retrying while the coordinator is not
            reachable yet (processes often start before it); then the error is raised.
    """
    keyspace = Keyspace(settings.key_prefix)
    own_redis = redis is None
    client = create_redis(settings) if own_redis else redis
    own_coordinator = coordinator is None
    if coordinator is None:
        coordinator = CoordinatorClient(
            settings.coordinator_urls,
            token=settings.token.get_secret_value() if settings.token else None,
            admin_token=settings.admin_token.get_secret_value() if settings.admin_token else None,
        )
    try:
        scripts = Scripts(client)
        leased: LeasedRouting | None = None
        if routing is None:
            check = NamespaceCheck(client, keyspace, settings.redis_url)
            routing = leased = LeasedRouting(coordinator, clock=clock, namespace=check)
        if ensure_streams:
            for spec in app.streams.values():
                await _ensure_stream(coordinator, spec.name, spec.shards, ensure_timeout)
        producer = create_producer(app, settings, client, scripts, routing, clock)
        connection = Connection(settings, client, scripts, keyspace, routing, producer, coordinator)
        async with anyio.create_task_group() as tg:
            if leased is not None:
                tg.start_soon(leased.run)
            yield connection
            tg.cancel_scope.cancel()
    finally:
        if own_coordinator:
            await coordinator.aclose()
        if own_redis:
            await client.aclose()


async def _ensure_stream(
    coordinator: CoordinatorTransport, name: str, shards: int, timeout: float
) -> None:
    deadline = anyio.current_time() + timeout
    delay = 0.1
    while True:
        try:
            info = await coordinator.ensure_stream(name, shards)
        except CoordinatorError as e:
            if not e.retryable or anyio.current_time() + delay > deadline:
                raise
            # Where and why (e.message names the URLs tried), so a wrong URL shows.
            log.warning("coordinator not ready: %s; retrying in %.1fs", e, delay)
            await anyio.sleep(delay)  # noqa: TID251 -- bounded by a real startup timeout
            delay = min(delay * 2, 2.0)
            continue
        if not info.created and info.shard_count != shards:
            log.warning(
                "stream %r has %d shards but the app declares shards=%d: a declaration "
                "never rescales an existing stream; to rescale it: "
                "streamworks streams scale %s --shards %d",
                name,
                info.shard_count,
                shards,
                name,
                shards,
            )
        return
