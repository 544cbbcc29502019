"""``TestRuntime``: the real coordinator and real workers in the test's own process.

It runs against a real Redis: ``redis_url`` if given, else
:envvar:`STREAMWORKS_TEST_REDIS_URL`, else an embedded server started for the
runtime. The coordinator is the production :class:`CoordinatorService` with its event
loop, reached through an in-process transport (or real HTTP with ``http=True``);
the workers are production :class:`Worker` objects joined through heartbeats. Timers
are fast by default (50 ms heartbeats, 1 s leases) and ``advance()`` moves every
clock forward at once. Every runtime uses its own key prefix, so tests sharing one
server never see each other's keys. Inside the ``async with`` block the app's
``publish`` and producers are connected to that Redis and coordinator. The app's
startup hooks run before the first worker starts, its shutdown hooks after the last
one stopped (``lifespan=False`` runs neither).
"""

from __future__ import annotations

import abc
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from redis.exceptions import ResponseError

from streamworks.app import App
from streamworks.clock import Clock
from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError
from streamworks.lifecycle import open_lifespan
from streamworks.protocol.api import CoordinatorApi
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.local import LocalTransport
from streamworks.protocol.shards import ShardId
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.connection import Connection, open_connection
from streamworks.runtime.membership import CoordinatorAssignment
from streamworks.runtime.worker import Worker
from streamworks.settings import CoordinatorSettings, Settings, WorkerSettings
from streamworks.testing.acl import open_role_users
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.schedules import schedules_problem

__all__ = ("DeadLetter", "RuntimeObservations", "TestRuntime", "fast_settings")


def fast_settings(base: Settings | None = None, **overrides: Any) -> Settings:
    """Settings with test-speed timers: 50 ms heartbeats, 1 s member leases, 5 s
    revocation timeout, 2 s routing lease (so a scale-in's routing fence passes
    quickly), a 50 ms coordinator loop."""
    base = base or Settings()
    values: dict[str, Any] = {
        "heartbeat_interval": 0.05,
        "lease_ttl": 1.0,
        "rebalance_timeout": 5.0,
        "routing_lease": 2.0,
        "stale_member_retention": 30.0,
        "worker": WorkerSettings(
            **{
                **base.worker.model_dump(),
                "block": 0.5,
                "shutdown_timeout": 5.0,
                "lease_grace": 0.3,
            }
        ),
        "coordinator": CoordinatorSettings(
            **{**base.coordinator.model_dump(), "loop_interval": 0.05, "assignment_interval": 0.0}
        ),
    }
    values.update(overrides)
    return base.model_copy(update=values)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a dead-letter stream."""

    entry_id: str
    reason: str
    error: str
    attempts: int
    stream: str
    shard: str
    origin_id: str
    payload: bytes | None
    key: str | None
    fields: dict[str, bytes]


class _WorkerSlot:
    def __init__(self, worker: Worker, scope: anyio.CancelScope) -> None:
        self.worker = worker
        self.scope = scope
        self.done = anyio.Event()


class RuntimeObservations(abc.ABC):
    """What a test asks a runtime: is everything handled, what was handled, what was
    dead-lettered. Shared by :class:`TestRuntime` and test harnesses built on workers."""

    app: App
    redis: Any
    keyspace: Keyspace
    slots: list[_WorkerSlot]

    @property
    def workers(self) -> list[Worker]:
        """Workers that are running (not killed or stopped)."""
        return [s.worker for s in self.slots if not s.done.is_set()]

    @abc.abstractmethod
    async def shard_keys(self, stream: str) -> Sequence[str]:
        """Stream keys of the stream's shards that are not retired."""

    async def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until every group is drained: on every shard ``lag`` 0 and ``pending`` 0,
        and no worker has a message in flight or waiting for a retry.

        Raises:
            TimeoutError: not idle within ``timeout`` seconds (with what is left).
        """
        deadline = time.monotonic() + timeout
        while True:
            left = await self._work_left()
            if not left:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"runtime not idle after {timeout}s: {left}")
            await anyio.sleep(0.01)

    async def _work_left(self) -> list[str]:
        left: list[str] = []
        for worker in self.workers:
            left.extend(
                f"{reader.shard_name}: {reader.outstanding} in flight"
                for reader in worker.readers.values()
                if reader.outstanding
            )
        for name in self.app.handlers:
            for key in await self.shard_keys(name):
                try:
                    groups = await self.redis.xinfo_groups(key)
                except ResponseError:
                    continue  # retired between the two reads: nothing left on it
                for group in groups:
                    gname = group["name"].decode()
                    if group["pending"] or group["lag"] is None or group["lag"]:
                        left.append(f"{key} {gname}: pending={group['pending']} lag={group['lag']}")
        return left

    def handled(self, stream: str) -> int:
        """Messages of ``stream`` whose handler succeeded, over all workers so far."""
        return self.statistics(stream).get("handled", 0)

    def statistics(self, stream: str) -> dict[str, int]:
        """Summed handler counters of ``stream`` over all workers so far."""
        total: dict[str, int] = {}
        for slot in self.slots:
            runtime = slot.worker.handlers.get(stream)
            if runtime is None:
                continue
            for name, value in runtime.statistics.as_dict().items():
                total[name] = total.get(name, 0) + value
        return total

    async def dead_letters(self, stream: str) -> list[DeadLetter]:
        """The app's dead-letter entries for ``stream``, oldest first."""
        key = self.keyspace.dead_letters(self.app.name, stream)
        out = []
        for entry_id, fields in await self.redis.xrange(key):
            text = {k.decode(errors="replace"): v for k, v in fields.items()}
            out.append(
                DeadLetter(
                    entry_id=entry_id.decode(),
                    reason=text["reason"].decode(errors="replace"),
                    error=text["error"].decode(errors="replace"),
                    attempts=int(text.get("attempts", b"0") or 0),
                    stream=text["stream"].decode(errors="replace"),
                    shard=text["shard"].decode(errors="replace"),
                    origin_id=text["entry_id"].decode(errors="replace"),
                    payload=text.get("o.v"),
                    key=text["o.k"].decode(errors="replace") if "o.k" in text else None,
                    fields=text,
                )
            )
        return out


class TestRuntime(RuntimeObservations):
    """The real coordinator and workers of ``app`` against a real Redis, in-process.

    Args:
        app: the app under test.
        workers: number of in-process workers to start.
        redis_url: Redis to use; else ``STREAMWORKS_TEST_REDIS_URL``, else embedded.
        settings: base settings; timers default to :func:`fast_settings`. The key
            prefix is replaced by a fresh one unless ``key_prefix`` is given.
        key_prefix: share this prefix with other runtimes (other groups on the same
            streams, or several coordinator replicas); not cleaned up on exit.
        attach: connect the app's ``publish`` to the runtime (default).
        http: reach the coordinator over real HTTP on 127.0.0.1 instead of in-process.
        lifespan: run the app's startup and shutdown hooks (default).
        acl: connect the coordinator, the workers and the app's producer as the
            least-privilege users ``streamworks admin acl`` prints (created for the
            runtime's key prefix, deleted at exit); the runtime fails at exit if Redis
            refused any of them a command (``ACL LOG``). ``redis`` stays the default
            user, for the test's own reads. Default: ``STREAMWORKS_TEST_REDIS_ACL``
            (set by the pytest plugin's ``--redis-acl``).
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
        http: bool = False,
        lifespan: bool = True,
        acl: bool | None = None,
    ) -> None:
        self.app = app
        self._n_workers = workers
        self._redis_url = redis_url or os.environ.get("STREAMWORKS_TEST_REDIS_URL")
        self._own_prefix = key_prefix is None
        base = settings if settings is not None else fast_settings()
        self.settings = base.with_overrides(key_prefix=key_prefix or f"t{uuid.uuid4().hex[:10]}")
        self.keyspace = Keyspace(self.settings.key_prefix)
        self._attach_app = attach
        self._http = http
        self._run_lifespan = lifespan
        if acl is None:
            acl = os.environ.get("STREAMWORKS_TEST_REDIS_ACL", "") not in ("", "0")
        self._acl = acl
        self._role_clients: dict[str, Any] = {}
        self.clock = Clock()
        #: Fail-stops of in-process workers (reasons): a worker process would have exited.
        self.fail_stops: list[str] = []
        self._server: EmbeddedRedis | None = None
        self._tg: TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self.redis: Any = None
        self.service: CoordinatorService | None = None
        #: How members and the app reach the coordinator (a test may wrap it, e.g. to
        #: cut the link, before it adds a worker).
        self.coordinator: CoordinatorTransport | None = None
        self.connection: Connection | None = None
        self.slots: list[_WorkerSlot] = []
        self.http_url: str | None = None
        self._http_server: Any = None
        self._http_done = anyio.Event()

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> TestRuntime:
        # Everything opened is registered on one exit stack as it is opened, so a failure
        # anywhere unwinds exactly what was opened, innermost first (as the task group's
        # and the connections' cancel scopes require), and every exit runs even when an
        # earlier one raised: a worker task that crashed has cancelled this very task
        # through the task group, so the first await of the unwinding raises, and
        # skipping the rest would hide the worker's error (raised by the task group's
        # exit) and leak the server and the keys.
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._open(stack)
        except BaseException:
            await stack.aclose()  # may raise a worker's error instead
            raise
        self._stack = stack
        return self

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        # Released last, shielded: a cancelled test still deletes its keys and servers.
        stack.push_async_callback(_shielded, self._release_redis)
        if self._redis_url is None:
            self._server = EmbeddedRedis().start()
            self._redis_url = self._server.url
        self.settings = self.settings.with_overrides(redis_url=self._redis_url)
        self.redis = create_redis(self.settings)
        if self._acl:
            role_users = open_role_users(self.redis, self._redis_url, self.settings.key_prefix)
            users = await role_users.__aenter__()
            # Exited as after a clean run whatever happened, so that the check of the
            # ACL LOG runs: AclRefusals when Redis refused one of the users a command.
            stack.push_async_callback(_shielded, role_users.__aexit__, None, None, None)
            for role, url in users.urls.items():
                client = create_redis(self.settings.with_overrides(redis_url=url))
                self._role_clients[role] = client
                stack.push_async_callback(_shielded, client.aclose)
        self.service = CoordinatorService(
            self._client("coordinator"), self.settings, clock=self.clock
        )
        stack.push_async_callback(_shielded, self._close_coordinator)
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        # Exited first of the two: cancel what still runs (the loop, the HTTP server),
        # then the task group's exit raises what a worker crashed with, if one did.
        stack.callback(self._tg.cancel_scope.cancel)
        self._tg.start_soon(self.service.run_loop)
        if self._http:
            await self._tg.start(self._serve_http)
            stack.push_async_exit(self._stop_http)
            assert self.http_url is not None
            self.coordinator = CoordinatorClient(
                [self.http_url],
                token=_secret(self.settings.token),
                admin_token=_secret(self.settings.admin_token),
            )
        else:
            # The service is the in-process transport's API (checked by mypy).
            service: CoordinatorApi = self.service
            self.coordinator = LocalTransport(service)
        self.connection = await stack.enter_async_context(
            open_connection(
                self.app,
                self.settings,
                redis=self._client("producer"),
                coordinator=self.coordinator,
                clock=self.clock,
            )
        )
        if self._attach_app:
            await stack.enter_async_context(self.app.attached(self.connection))
        if self._run_lifespan:
            await stack.enter_async_context(
                open_lifespan(self.app, shutdown_timeout=self.settings.worker.shutdown_timeout)
            )
        stack.push_async_callback(self._stop_workers)
        for _ in range(self._n_workers):
            await self.add_worker(wait=False)
        if self._n_workers:
            await self.wait_assigned()

    async def __aexit__(self, *exc: object) -> None:
        # Unwound as after a clean block: the test's own error is not the task group's
        # (which would wrap it in an ExceptionGroup); it propagates after this returns.
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _stop_workers(self) -> None:
        """Stop every worker as SIGTERM would (finish, ack, leave), in bounded time."""
        for slot in self.slots:
            if not slot.done.is_set():
                slot.worker.request_stop()
        with anyio.move_on_after(self.settings.worker.shutdown_timeout + 5):
            for slot in self.slots:
                await slot.done.wait()

    async def _stop_http(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        """Stop the HTTP server gracefully: that closes its listening socket, a cancel
        would not. After an error the task group's cancellation stops it."""
        if exc is None and self._http_server is not None:
            self._http_server.should_exit = True
            with anyio.move_on_after(5):
                await self._http_done.wait()
        return False

    def _client(self, role: str) -> Any:
        """The Redis client of ``role``'s component (the default user's without acl)."""
        return self._role_clients.get(role, self.redis)

    async def _close_coordinator(self) -> None:
        self._tg = None
        if self.coordinator is not None:
            await self.coordinator.aclose()
        self._role_clients = {}

    async def _release_redis(self) -> None:
        if self.redis is not None:
            if self._own_prefix:
                await delete_prefix(self.redis, self.settings.key_prefix)
            await self.redis.aclose()
            self.redis = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def _serve_http(self, *, task_status: TaskStatus[None]) -> None:
        from streamworks.coordinator.http import QuietServer, create_api, server_config

        assert self.service is not None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = server_config(create_api(self.service), self.settings, host="127.0.0.1", port=port)
        server = QuietServer(config)
        self.http_url = f"http://127.0.0.1:{port}"
        self._http_server = server
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve)
                with anyio.fail_after(10):
                    while not server.started:  # noqa: ASYNC110 - uvicorn exposes no event
                        await anyio.sleep(0.005)
                task_status.started()
        finally:
            self._http_done.set()

    # -- workers -------------------------------------------------------------------------
    async def add_worker(self, *, wait: bool = True) -> Worker:
        """Start one more worker (a new member of the group)."""
        assert self._tg is not None
        assert self.coordinator is not None
        membership = CoordinatorAssignment(self.coordinator, self.settings)
        worker = Worker(
            self.app, self._client("worker"), membership, settings=self.settings, clock=self.clock
        )
        # A run outliving its lease would exit a real worker process; here it would take
        # the test process with it, so the fail-stop is recorded instead.
        worker.fail_stop = self.fail_stops.append
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
        if wait:
            await self.wait_assigned()
        return worker

    async def worker_metrics(self, index: int = 0) -> str:
        """Worker ``index``'s ``/metrics`` text (Prometheus exposition), without a port."""
        return (await self.slots[index].worker.metrics.exposition()).decode()

    async def kill_worker(self, index: int) -> None:
        """Crash worker ``index``: no drain, no ack flush, no leave. Its shards move when
        its lease expires (``advance`` makes that immediate)."""
        slot = self.slots[index]
        slot.scope.cancel()
        await slot.done.wait()

    async def stop_worker(self, index: int) -> None:
        """Stop worker ``index`` gracefully (SIGTERM semantics: finish, ack, leave)."""
        slot = self.slots[index]
        slot.worker.request_stop()
        await slot.done.wait()

    async def advance(self, seconds: float) -> None:
        """Move the coordinator's and workers' clocks forward by ``seconds``: leases,
        revocation deadlines, routing leases and retry backoffs come due without
        waiting (a message parked for a retry that is due now runs at once).

        Moving past ``lease_ttl`` also ends every member's lease, as a pause that long
        would: the members rejoin and take their shards over again."""
        self.clock.advance(seconds)
        for worker in self.workers:
            worker.lease.recheck()  # its watchdog sleeps on real time
        assert self.service is not None
        for group_id in await self.service.store.registered_groups():
            await self.service.tick_group(group_id)

    async def scale(
        self, stream: str, shards: int, *, wait: bool = True, timeout: float = 30.0
    ) -> None:
        """Change ``stream``'s shard count with the real migration (docs/protocol.md#migrations).

        With ``wait`` (default), return once no shard is draining any more and the
        group's assignment has settled on the new layout. A scale-in completes only
        when the removed shards are drained, so running workers (or ones started
        later) must consume them.
        """
        assert self.service is not None
        info = await self.service.scale_stream(stream, shards)
        if self.connection is not None:
            # The runtime's own publishing uses the new routing at once (a producer
            # elsewhere picks it up within its routing lease).
            self.connection.routing.invalidate(stream, info.routing_version - 1)
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while True:
            info = await self.service.stream_info(stream)
            if not any(s.state == "DRAINING" for s in info.shards):
                break
            if time.monotonic() > deadline:
                blocked = (info.migration or {}).get("blocked")
                raise TimeoutError(f"{stream}: still draining after {timeout}s: {blocked}")
            await anyio.sleep(0.02)
        if self.workers and stream in self.app.handlers:
            await self.wait_assigned(timeout=max(1.0, deadline - time.monotonic()))

    # -- observation ---------------------------------------------------------------------
    async def wait_assigned(self, timeout: float = 10.0) -> None:
        """Wait until the group is STABLE and every shard of every handled stream is
        read by exactly one running worker (and, with schedules, one worker runs them,
        each with its next tick planned)."""
        deadline = time.monotonic() + timeout
        while True:
            problem = await self._assignment_problem()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"assignment did not settle within {timeout}s: {problem}")
            await anyio.sleep(0.01)

    async def _assignment_problem(self) -> str | None:
        assert self.service is not None
        workers = self.workers
        if not workers:
            return "no running worker"
        try:
            group = await self.service.group_info(self.app.name)
        except CoordinatorError as e:
            return f"group not available yet ({e.code})"
        if group.state != "STABLE":
            return f"group is {group.state}"
        live = {m.member_id for m in group.members if m.state == "STABLE"}
        for worker in workers:
            if worker.member_id not in live:
                return f"worker {worker.member_id[:8]} has not joined"
        reading: dict[ShardId, int] = {}
        for worker in workers:
            for shard, reader in worker.readers.items():
                if reader.accepting:
                    reading[shard] = reading.get(shard, 0) + 1
        for name in self.app.handlers:
            stream = await self.service.stream_info(name)
            for info in stream.shards:
                if info.state == "RETIRED":
                    continue
                count = reading.get(ShardId.parse(info.shard), 0)
                if count != 1:
                    return f"{info.shard} read by {count} workers"
        if self.app.schedules:
            return await schedules_problem(self.service, self.redis, self.keyspace, workers)
        return None

    async def shard_keys(self, stream: str) -> list[str]:
        """Stream keys of the stream's shards that are not retired."""
        assert self.service is not None
        info = await self.service.stream_info(stream)
        return [
            self.keyspace.stream(ShardId.parse(s.shard))
            for s in info.shards
            if s.state != "RETIRED"
        ]


async def _shielded(release: Callable[..., Awaitable[object]], *args: Any) -> None:
    """``await release(*args)``, shielded from cancellation: what a cancelled test
    opened is closed all the same."""
    with anyio.CancelScope(shield=True):
        await release(*args)


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


async def delete_prefix(redis: Any, prefix: str) -> None:
    """Remove every key of a test prefix (keeps a shared server clean)."""
    for pattern in Keyspace(prefix).namespace_patterns():
        batch = [key async for key in redis.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(batch), 500):
            await redis.delete(*batch[i : i + 500])
