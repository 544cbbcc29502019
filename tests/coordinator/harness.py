"""Test doubles and drivers for the coordinator tests.

Everything here wraps real objects (a real Redis, the production service, the real
transports); nothing fakes Redis. Simulated members speak the wire protocol
(``HeartbeatRequest``) to a real :class:`CoordinatorService`, so tests can drive a
group step by step, from any number of replicas.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any

import anyio
import pytest
import uvicorn
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline

from streamworks.clock import Clock
from streamworks.coordinator.http import QuietServer, create_api
from streamworks.coordinator.http_heartbeat import HeartbeatRoute
from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError, CoordinatorUnavailableError
from streamworks.protocol.control import (
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    RoutingResponse,
    StreamInfo,
)
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.redis.client import WaitingRedisCluster, create_redis
from streamworks.settings import Settings
from tests.support import wait_for

__all__ = (
    "CutTransport",
    "RecordingRedis",
    "SimMember",
    "beat",
    "expect_error",
    "keys_per_shard",
    "open_service",
    "serve_api",
    "settle",
)


def beat(
    member_id: str,
    epoch: int,
    *,
    subscriptions: Iterable[str] | None = None,
    owned: Iterable[str] | None = None,
    revoking: Iterable[str] = (),
    version: int = 0,
    fenced: Iterable[str] = (),
    sequence: int | None = None,
) -> HeartbeatRequest:
    """A heartbeat request as a member sends it."""
    return HeartbeatRequest(
        member_id=member_id,
        member_epoch=epoch,
        metadata_version=version,
        subscriptions=sorted(subscriptions) if subscriptions is not None else None,
        owned_shards=sorted(owned) if owned is not None else None,
        revoking_shards=sorted(revoking),
        fenced_shards=sorted(fenced),
        sequence=sequence,
    )


class SimMember:
    """A well-behaved member reduced to its protocol: it reads exactly what it was
    granted, drops revoked shards at once (an instant drain), and rejoins with epoch 0
    when fenced, unknown or told to sync. It numbers its requests as a worker does
    (``sequence``). ``responses`` keeps every answer."""

    def __init__(self, member_id: str, subscriptions: Iterable[str]) -> None:
        self.member_id = member_id
        self.subscriptions = sorted(subscriptions)
        self.epoch = 0
        self.version = 0
        self.sequence = 0
        self.owned: set[str] = set()
        self.responses: list[HeartbeatResponse] = []

    def request(self) -> HeartbeatRequest:
        """The member's next request (a new sequence number)."""
        joining = self.epoch == 0
        self.sequence += 1
        return beat(
            self.member_id,
            self.epoch,
            subscriptions=self.subscriptions,
            owned=() if joining else self.owned,
            version=self.version,
            sequence=self.sequence,
        )

    async def heartbeat(self, coordinator: Any, group: str) -> HeartbeatResponse:
        """One heartbeat to ``coordinator`` (a service or a transport)."""
        response = await coordinator.heartbeat(group, self.request())
        self.apply(response)
        return response

    def apply(self, response: HeartbeatResponse) -> None:
        self.responses.append(response)
        if response.status is not HeartbeatStatus.OK:  # FENCED, UNKNOWN, SYNC_METADATA
            self.epoch, self.version, self.owned = 0, 0, set()
            return
        self.epoch = response.member_epoch
        self.version = response.metadata_version
        revoked = set(response.revoke)
        self.owned = {g.shard for g in response.assigned} - revoked

    @property
    def last(self) -> HeartbeatResponse:
        return self.responses[-1]


async def settle(members: list[SimMember], coordinator: Any, group: str = "g") -> None:
    """Heartbeat every member in turn until the group is STABLE and each member holds
    exactly what the coordinator records for it."""

    async def settled() -> bool:
        for m in members:
            await m.heartbeat(coordinator, group)
        info = await coordinator.group_info(group)
        recorded = {mi.member_id: mi for mi in info.members}
        return info.state == "STABLE" and all(
            m.last.status is HeartbeatStatus.OK
            and recorded[m.member_id].epoch == m.epoch
            and set(recorded[m.member_id].assigned) == m.owned
            for m in members
        )

    await wait_for(settled, timeout=10, message="the group to settle")


@contextlib.asynccontextmanager
async def open_service(
    settings: Settings, *, replica: str = "replica", clock: Clock | None = None
) -> AsyncIterator[CoordinatorService]:
    """A coordinator replica with a Redis client of its own (a separate process, as
    far as Redis can tell)."""
    redis = create_redis(settings)
    try:
        yield CoordinatorService(redis, settings, replica=replica, clock=clock)
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def serve_api(
    service: CoordinatorService, *, log_level: str = "warning", heartbeat_route: bool = True
) -> AsyncIterator[str]:
    """Serve ``create_api(service)`` with uvicorn on 127.0.0.1; yields the base URL.
    uvicorn's records propagate to the root logger (no logging config of its own).
    ``heartbeat_route=False`` leaves the heartbeat to the framework's declared route
    (without the ``http_heartbeat.py`` fast path in front of it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = create_api(service)
    if not heartbeat_route:  # the middleware stack is built on the first request
        api.user_middleware = [m for m in api.user_middleware if m.cls is not HeartbeatRoute]
    config = uvicorn.Config(
        api,
        host="127.0.0.1",
        port=port,
        log_level=log_level,
        log_config=None,
        lifespan="off",
    )
    server = QuietServer(config)
    stopped = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve()
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn exposes no event
                await anyio.sleep(0.005)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            # A graceful stop closes the listening socket; a cancel would not.
            server.should_exit = True
            with anyio.move_on_after(5, shield=True):
                await stopped.wait()


class CutTransport:
    """A coordinator transport whose link the test can cut: while ``cut``, every call
    fails like an unreachable coordinator (``CoordinatorUnavailableError``). Every
    heartbeat request is recorded, sent or not, with whether the link was cut."""

    def __init__(self, inner: CoordinatorTransport) -> None:
        self.inner = inner
        self.cut = False
        #: Cut the link right after delivering an answer with one of these statuses.
        self.cut_on: set[HeartbeatStatus] = set()
        self.heartbeats: list[tuple[bool, HeartbeatRequest]] = []
        self.responses: list[HeartbeatResponse] = []
        self.routing_calls = 0

    def _check(self) -> None:
        if self.cut:
            raise CoordinatorUnavailableError("link cut by the test")

    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        self.heartbeats.append((self.cut, request))
        self._check()
        response = await self.inner.heartbeat(group, request)
        self.responses.append(response)
        if response.status in self.cut_on:
            self.cut = True
        return response

    async def routing(self, stream: str) -> RoutingResponse:
        self.routing_calls += 1
        self._check()
        return await self.inner.routing(stream)

    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        self._check()
        return await self.inner.ensure_stream(name, shards)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def sent_while_cut(self) -> list[HeartbeatRequest]:
        return [r for cut, r in self.heartbeats if cut]


class RecordingRedis(Redis):
    """The real asyncio client (sharing another client's connection pool) that records
    the name of every command it sends, including those queued in pipelines and the
    scripts it runs (``EVALSHA <sha>``)."""

    def __init__(self, real: Redis) -> None:
        super().__init__(connection_pool=real.connection_pool)
        self.commands: list[tuple[str, ...]] = []

    def _record(self, args: tuple[Any, ...]) -> None:
        name = _text(args[0]).upper()
        if name == "XINFO" and len(args) > 1:  # as the hand-packed batch sends it
            name, args = f"XINFO {_text(args[1]).upper()}", args[1:]
        detail = [_text(a) for a in args[1:3]]
        self.commands.append((name, *detail))

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self._record(args)
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _RecordingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint, self
        )


class _RecordingPipeline(Pipeline):
    def __init__(self, pool: Any, callbacks: Any, transaction: bool, hint: Any, owner: Any):
        super().__init__(pool, callbacks, transaction, hint)
        self._owner = owner

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self._owner._record(args)
        return super().execute_command(*args, **kwargs)


class RecordingCluster(WaitingRedisCluster):
    """:class:`RecordingRedis` on a cluster: a cluster client of its own (same nodes)
    recording every command, including those queued in pipelines."""

    commands: list[tuple[str, ...]]

    def _record(self, args: tuple[Any, ...]) -> None:
        RecordingRedis._record(self, args)  # type: ignore[arg-type]

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self._record(args)
        return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        return _RecordingClusterPipeline(self, transaction)


class _RecordingClusterPipeline(ClusterPipeline):
    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.cluster_client._record(args)  # type: ignore[attr-defined]
        return super().execute_command(*args, **kwargs)


def recording_redis(real: Any) -> Any:
    """A client recording the commands it sends: :class:`RecordingRedis` sharing
    ``real``'s pool, or on a cluster a :class:`RecordingCluster` on the same nodes."""
    if isinstance(real, RedisCluster):
        node = next(iter(real.nodes_manager.startup_nodes.values()))
        client = RecordingCluster(host=node.host, port=node.port)
        client.commands = []
        return client
    return RecordingRedis(real)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


async def expect_error(call: Awaitable[Any], code: str) -> CoordinatorError:
    """Await ``call``; assert it raised a ``CoordinatorError`` with ``code``."""
    with pytest.raises(CoordinatorError) as info:
        await call
    assert info.value.code == code, f"expected {code}, got {info.value}"
    return info.value


async def keys_per_shard(runtime: Any, stream: str) -> dict[str, str]:
    """A partition key routed to each shard of ``stream`` (by the runtime's routing)."""
    table = await runtime.connection.routing.routing(stream)
    keys: dict[str, str] = {}
    for i in range(10_000):
        keys.setdefault(str(table.route(f"k{i}").shard), f"k{i}")
        if len(keys) == table.shard_count:
            return keys
    raise AssertionError("no key found for some shard")
