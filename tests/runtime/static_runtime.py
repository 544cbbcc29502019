"""``StaticRuntime``: real workers on a *static* shard map, for data-plane tests.

The product's ``TestRuntime`` runs the real coordinator; this harness instead deals
shards round-robin and writes owner fences itself, so a data-plane test can control
fences, leases and drains directly without the protocol reacting to them.

It runs against a real Redis: ``redis_url`` if given, else
:envvar:`STREAMWORKS_TEST_REDIS_URL`, else an embedded server started for the
runtime. Every runtime uses its own key prefix, so tests sharing one server never
see each other's keys. Inside the ``async with`` block the app's ``publish`` and
producers are connected to that Redis without further set-up.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from streamworks.app import App
from streamworks.coordinator.provision import (
    create_group,
    create_shards,
    grant_token,
    write_fence,
)
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.assignment import StaticAssignment
from streamworks.runtime.connection import Connection, open_connection
from streamworks.runtime.routing import StaticRoutingSource
from streamworks.runtime.worker import Worker
from streamworks.settings import Settings
from streamworks.testing.acl import open_role_users
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import RuntimeObservations, _WorkerSlot, delete_prefix

__all__ = ("StaticRuntime",)


class StaticRuntime(RuntimeObservations):
    """Real workers of ``app`` against a real Redis, inside the test process.

    Args:
        app: the app under test.
        workers: number of in-process workers.
        redis_url: Redis to use; else ``STREAMWORKS_TEST_REDIS_URL``, else embedded.
        settings: base settings (the key prefix is replaced by a fresh one).
        key_prefix: use this prefix instead (shared by several runtimes; not cleaned).
        attach: connect the app's ``publish`` to the runtime (default). Off when the
            test connects the app itself.
        acl: workers and the app's producer log in as their role's ACL user (default:
            ``--redis-acl`` / ``STREAMWORKS_TEST_REDIS_ACL``); ``redis`` stays the
            default user (provisioning, the test's reads).
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: App,
        *,
        workers: int = 1,
        redis_url: str | None = None,
        settings: Settings | None = None,
        key_prefix: str | None = None,
        attach: bool = True,
        acl: bool | None = None,
    ) -> None:
        self.app = app
        if acl is None:
            acl = os.environ.get("STREAMWORKS_TEST_REDIS_ACL", "") not in ("", "0")
        self._acl = acl
        self._users: Any = None
        self._role_clients: dict[str, Any] = {}
        self._attach_app = attach
        self._n_workers = workers
        self._redis_url = redis_url or os.environ.get("STREAMWORKS_TEST_REDIS_URL")
        base = settings or Settings()
        # A fresh prefix isolates this runtime; an explicit one lets several runtimes
        # (several groups) share streams, and is left in place on exit.
        self._own_prefix = key_prefix is None
        self.settings = base.with_overrides(key_prefix=key_prefix or f"t{uuid.uuid4().hex[:10]}")
        self.keyspace = Keyspace(self.settings.key_prefix)
        self._server: EmbeddedRedis | None = None
        self._tg: TaskGroup | None = None
        self._exit: Any = None
        self.redis: Any = None
        self.scripts: Scripts | None = None
        self.connection: Connection | None = None
        self.slots: list[_WorkerSlot] = []
        self._epoch = 0
        self._connection_cm: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> StaticRuntime:
        if self._redis_url is None:
            self._server = EmbeddedRedis().start()
            self._redis_url = self._server.url
        self.settings = self.settings.with_overrides(redis_url=self._redis_url)
        self.redis = create_redis(self.settings)
        self.scripts = Scripts(self.redis)
        if self._acl:
            self._users = open_role_users(self.redis, self._redis_url, self.settings.key_prefix)
            users = await self._users.__aenter__()
            self._role_clients = {
                role: create_redis(self.settings.with_overrides(redis_url=url))
                for role, url in users.urls.items()
            }
        await self._provision()
        self._connection_cm = open_connection(
            self.app,
            self.settings,
            redis=self._role_clients.get("producer", self.redis),
            routing=StaticRoutingSource(
                self.keyspace, {s.name: s.shards for s in self.app.streams.values()}
            ),
            coordinator=_NoCoordinator(),
            ensure_streams=False,
        )
        self.connection = await self._connection_cm.__aenter__()
        self._attach = self.app.attached(self.connection) if self._attach_app else None
        if self._attach is not None:
            await self._attach.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for _ in range(self._n_workers):
            await self.add_worker(rebalance=False)
        await self._rebalance()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # A worker task that crashed has cancelled this task through the task group:
        # the wait below then raises at once, and the task group's exit must still run
        # (it raises the worker's error) before the outer context managers are exited.
        tg, self._tg = self._tg, None
        error: BaseException | None = None
        try:
            for slot in self.slots:
                if not slot.done.is_set():
                    slot.worker.request_stop()
            if tg is not None:
                with anyio.move_on_after(self.settings.worker.shutdown_timeout + 5):
                    for slot in self.slots:
                        await slot.done.wait()
        except BaseException as e:
            error = e
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                if error is None:
                    await tg.__aexit__(None, None, None)
                elif not await tg.__aexit__(type(error), error, error.__traceback__):
                    raise error
            elif error is not None:
                raise error
        finally:
            if self._attach is not None:
                await self._attach.__aexit__(None, None, None)
            await self._connection_cm.__aexit__(None, None, None)
            for client in self._role_clients.values():
                await client.aclose()
            if self._users is not None:
                await self._users.__aexit__(None, None, None)  # AclRefusals: Redis refused one
            if self.redis is not None:
                if self._own_prefix:
                    await delete_prefix(self.redis, self.settings.key_prefix)
                await self.redis.aclose()
            if self._server is not None:
                self._server.stop()

    async def _provision(self) -> None:
        """Static mode: create the app's shards with its group (or add the group to
        shards another runtime created)."""
        assert self.scripts is not None
        for spec in self.app.streams.values():
            shards = [ShardId(spec.name, i) for i in range(spec.shards)]
            await create_shards(self.scripts, self.keyspace, shards, [self.app.name])
            await create_group(self.scripts, self.keyspace, shards, self.app.name, spec.start)

    # -- workers -------------------------------------------------------------------------
    async def add_worker(self, *, rebalance: bool = True) -> Worker:
        """Start one more worker."""
        assert self._tg is not None
        worker = Worker(
            self.app,
            self._role_clients.get("worker", self.redis),
            StaticAssignment({}),
            settings=self.settings,
        )
        scope = anyio.CancelScope()
        slot = _WorkerSlot(worker, scope)
        self.slots.append(slot)

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await worker.run(task_status=task_status)
            finally:
                slot.done.set()

        await self._tg.start(run)
        if rebalance:
            await self._rebalance()
        return worker

    async def kill_worker(self, index: int) -> None:
        """Crash worker ``index``: no drain, no ack flush, no leave. Its pending entries
        stay in Redis for the next owner of its shards."""
        slot = self.slots[index]
        slot.scope.cancel()
        await slot.done.wait()
        await self._rebalance()

    async def stop_worker(self, index: int) -> None:
        """Stop worker ``index`` gracefully (SIGTERM semantics)."""
        slot = self.slots[index]
        slot.worker.request_stop()
        await slot.done.wait()
        await self._rebalance()

    async def _rebalance(self) -> None:
        """Static mode: deal every shard round-robin over the live workers, writing new
        fences (a newer epoch per round) before granting."""
        assert self.scripts is not None
        live = [s for s in self.slots if not s.done.is_set()]
        if not live:
            return
        self._epoch += 1
        epoch = self._epoch
        plan: list[dict[ShardId, str]] = [{} for _ in live]
        i = 0
        for spec in self.app.streams.values():
            if spec.name not in self.app.handlers:
                continue
            for index in range(spec.shards):
                shard = ShardId(spec.name, index)
                slot = live[i % len(live)]
                member = slot.worker.member_id
                await write_fence(self.scripts, self.keyspace, shard, self.app.name, epoch, member)
                plan[i % len(live)][shard] = grant_token(epoch, member)
                i += 1
        for slot, grants in zip(live, plan, strict=True):
            worker = slot.worker
            worker.lease.renew(math.inf)
            gone = [s for s in worker.owned_shards() if s not in grants]
            worker.drop_shards(gone)
            worker.apply_assignment(grants)

    # -- observation ---------------------------------------------------------------------
    async def shard_keys(self, stream: str) -> Sequence[str]:
        spec = self.app.streams[stream]
        return [self.keyspace.stream(ShardId(stream, i)) for i in range(spec.shards)]


class _NoCoordinator:
    """Static mode has no coordinator."""

    async def aclose(self) -> None:
        return None
