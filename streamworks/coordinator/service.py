"""One coordinator replica: the facade over its parts, shared by the HTTP API, the
event loop and the in-process transport of ``TestRuntime``.

The replica's parts, each a module named after its concept:

* ``discipline.py`` — the write discipline: the local gate (E4), the Redis mutex and
  the shielded critical section every mutation runs in (docs/protocol.md#write-discipline);
* ``heartbeats.py`` — member heartbeats, the fast no-change road and the full one;
* ``subscriptions.py`` — a group's consumer groups on the streams it subscribes to;
* ``loop.py`` — the event loop: group timers and stream migrations;
* ``streams.py`` — creating, scaling (``resharding.py``) and routing streams;
* ``status.py`` — the group, stream and status answers;
* ``identity.py`` — the watch on the namespace id (Redis lost its data?);
* ``admin.py`` — operator actions: unsubscribe, and recovery of lost metadata (E21);
* ``replica.py`` — what the replica remembers between requests (estimates, caches);
* ``store.py`` — every Redis command; the core (``core/``) makes every decision.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio

from streamworks.clock import Clock
from streamworks.coordinator.admin import OperatorActions
from streamworks.coordinator.core import CoreConfig
from streamworks.coordinator.core.clock_steps import ClockStepDetector
from streamworks.coordinator.discipline import Exclusion, WriteDiscipline
from streamworks.coordinator.heartbeats import HeartbeatHandler, short_road_budget
from streamworks.coordinator.identity import NamespaceIdentity
from streamworks.coordinator.loop import EventLoop
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replica import ReplicaState
from streamworks.coordinator.replication import ReplicaWaits
from streamworks.coordinator.resharding import Resharder
from streamworks.coordinator.status import StatusReport
from streamworks.coordinator.store import Store
from streamworks.coordinator.streams import Streams
from streamworks.coordinator.subscriptions import Subscriptions
from streamworks.protocol.control import (
    GroupInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    ReinitializeRequest,
    RoutingResponse,
    StatusResponse,
    StreamInfo,
    UnsubscribeRequest,
)
from streamworks.redis.client import pool_size
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings

__all__ = ("CoordinatorService", "core_config")

log = logging.getLogger("streamworks.coordinator")


def core_config(settings: Settings) -> CoreConfig:
    """The core's timing knobs from settings (seconds -> ms)."""
    interval = int(settings.heartbeat_interval * 1000)
    return CoreConfig(
        lease_ttl_ms=int(settings.lease_ttl * 1000),
        rebalance_timeout_ms=int(settings.rebalance_timeout * 1000),
        heartbeat_interval_ms=interval,
        fast_heartbeat_interval_ms=max(20, min(200, interval // 5)),
        stale_member_retention_ms=max(1, int(settings.stale_member_retention * 1000)),
        assignment_interval_ms=int(settings.coordinator.assignment_interval * 1000),
    )


class CoordinatorService:
    """The coordinator's operations, shared by the HTTP API, the event loop and the
    in-process transport of ``TestRuntime``."""

    def __init__(
        self,
        redis: Any,
        settings: Settings,
        *,
        replica: str = "replica",
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.settings = settings
        self.replica = replica
        self.keyspace = Keyspace(settings.key_prefix)
        coordinator = settings.coordinator
        self.store = Store(
            redis,
            self.keyspace,
            mutex_ttl=coordinator.mutex_ttl,
            mutex_wait=coordinator.mutex_wait,
            clock=self.clock,
        )
        self.store.waits = ReplicaWaits(
            redis,
            self.store.scripts,
            count=coordinator.replica_wait,
            timeout=coordinator.replica_wait_timeout,
            max_lag=coordinator.replica_max_lag,
            check_interval=coordinator.replica_check_interval,
        )
        self.redis = redis
        self.config = core_config(settings)
        self.metrics = CoordinatorMetrics()
        self.discipline = WriteDiscipline(self.store)
        self.state = ReplicaState(
            self.clock,
            clock_steps=ClockStepDetector(
                tolerance_ms=int(coordinator.clock_step_tolerance * 1000),
                drift=coordinator.clock_drift,
                settle_s=settings.lease_ttl,
            ),
            metrics=self.metrics,
        )
        self.store.on_time = self.state.observe_time
        self._namespace_lock = anyio.Lock()
        self.subscriptions = Subscriptions(self.store, self.keyspace)
        self.resharder = Resharder(
            self.store, self.keyspace, settings, self.discipline, self.metrics
        )
        cas_retries = settings.coordinator.cas_retries
        self.heartbeats = HeartbeatHandler(
            store=self.store,
            keyspace=self.keyspace,
            config=self.config,
            cas_retries=cas_retries,
            metrics=self.metrics,
            discipline=self.discipline,
            replica=self.state,
            subscriptions=self.subscriptions,
            short_road_connections=short_road_budget(pool_size(redis)),
        )
        self.loop = EventLoop(
            store=self.store,
            keyspace=self.keyspace,
            config=self.config,
            cas_retries=cas_retries,
            interval=settings.coordinator.loop_interval,
            metrics=self.metrics,
            discipline=self.discipline,
            replica=self.state,
            resharder=self.resharder,
        )
        self.streams = Streams(
            store=self.store,
            keyspace=self.keyspace,
            routing_lease_ms=int(settings.routing_lease * 1000),
            discipline=self.discipline,
            replica=self.state,
            resharder=self.resharder,
        )
        self.report = StatusReport(self.store, self.streams)
        # Redis losing this namespace's data under the running replica (identity.py).
        self.identity = NamespaceIdentity(self, interval=settings.coordinator.loop_interval)
        self.admin = OperatorActions(
            store=self.store,
            keyspace=self.keyspace,
            config=self.config,
            discipline=self.discipline,
            subscriptions=self.subscriptions,
            report=self.report,
        )

    # -- the write discipline (discipline.py) --------------------------------------------
    @property
    def terminating(self) -> bool:
        """Whether this replica refuses new critical sections (E4)."""
        return self.discipline.terminating

    def critical(self, mutex_key: str) -> contextlib.AbstractAsyncContextManager[Exclusion]:
        """A critical section on ``mutex_key`` (:meth:`WriteDiscipline.critical`)."""
        return self.discipline.critical(mutex_key)

    async def terminate(self, timeout: float = 10.0) -> None:
        """Enter terminating mode (E4) and wait for in-flight critical sections."""
        await self.discipline.terminate(timeout)

    async def redis_ok(self) -> bool:
        """Whether Redis answers (readiness)."""
        return await self.store.ping()

    def log_unexpected(self, exc: BaseException) -> None:
        log.error("unexpected error: %r", exc, exc_info=exc)

    # -- heartbeats (heartbeats.py) -------------------------------------------------------
    async def ensure_namespace(self) -> str:
        """The namespace id, claimed once (``SET NX``) and then cached (``redis/namespace.py``)."""
        if self.state.namespace_id is None:
            # One claim at a time: a burst of first heartbeats would otherwise send as
            # many SET NX + GET pairs (and, on a cluster, race the client's first
            # discovery of the slot map).
            async with self._namespace_lock:
                if self.state.namespace_id is None:
                    self.state.namespace_id = await self.store.claim_namespace()
        return self.state.namespace_id

    async def heartbeat(self, group_id: str, body: HeartbeatRequest) -> HeartbeatResponse:
        await self.ensure_namespace()
        return await self.heartbeats.handle(group_id, body)

    # -- the event loop (loop.py) ---------------------------------------------------------
    async def run_loop(self) -> None:
        """The event loop of this replica (every replica runs it; the write discipline
        makes concurrent runs safe), and the watch on the namespace identity. Runs until
        cancelled or terminating."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.identity.run)
            await self.loop.run()
            tg.cancel_scope.cancel()

    async def tick_group(self, group_id: str) -> bool:
        """Run the due timer steps of one group; whether anything was committed."""
        return await self.loop.tick_group(group_id)

    async def tick_streams(self) -> None:
        """Advance stream migrations: check and retire drained shards (resharding)."""
        await self.loop.tick_streams()

    def _loop_sleep(self, interval: float) -> float:
        return self.loop.sleep_time(interval)

    # -- streams (streams.py) -------------------------------------------------------------
    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        """Create ``name`` with ``shards`` shards unless it exists (never rescales)."""
        return await self.streams.ensure(name, shards)

    async def create_stream(self, name: str, shards: int, *, exist_ok: bool = False) -> StreamInfo:
        return await self.streams.create(name, shards, exist_ok=exist_ok)

    async def scale_stream(self, name: str, shards: int) -> StreamInfo:
        """Change a stream's shard count live (``resharding.py``)."""
        return await self.streams.scale(name, shards)

    async def routing(self, stream: str) -> RoutingResponse:
        await self.ensure_namespace()
        return await self.streams.routing(stream)

    async def stream_info(self, name: str) -> StreamInfo:
        return await self.streams.info(name)

    # -- groups and status (status.py) ----------------------------------------------------
    async def group_info(self, group_id: str) -> GroupInfo:
        return await self.report.group_info(group_id)

    async def status(self, *, positions: bool = True) -> StatusResponse:
        """Streams and groups as recorded, with each group's ``pending``/``lag`` per shard
        (read with ``XINFO``; the coordinator never reads messages themselves, E24)."""
        status = await self.report.status(positions=positions)
        alerts = self.identity.alerts()
        return status.model_copy(update={"alerts": alerts}) if alerts else status

    # -- operator actions and recovery (admin.py) -----------------------------------------
    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        """A group stops consuming a stream for good (:meth:`OperatorActions.unsubscribe`)."""
        return await self.admin.unsubscribe(request)

    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        """Re-create lost metadata of one entity (:meth:`OperatorActions.reinitialize`)."""
        return await self.admin.reinitialize(request)
