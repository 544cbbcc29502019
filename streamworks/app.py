"""The application object: streams, handlers and producers of one consumer group.

An :class:`App` is one consumer group. It declares streams (``app.stream``), handlers
(``@app.handler``) and producers (``@app.producer``), and publishes through the
connection opened by ``app.connect()``, by a worker, or by a ``TestRuntime``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from streamworks.app_checks import check_delay_parameters, check_hook
from streamworks.batch import Batch
from streamworks.delay import due_from
from streamworks.exceptions import ConfigurationError, NotConnectedError
from streamworks.middleware import (
    Middleware,
    PublishNext,
    check_middleware,
    compose_publish,
    handling_hooks,
)
from streamworks.protocol.codec import Codec, JsonCodec
from streamworks.protocol.shards import validate_name
from streamworks.ratelimit import RateLimit
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.app_view import Hook
from streamworks.runtime.batch_context import batch_plan
from streamworks.runtime.handler import HandlerSpec, Ordering, build_plan
from streamworks.runtime.message import Context, Message
from streamworks.runtime.producer import Published, Record
from streamworks.runtime.retry import RetryPolicy
from streamworks.runtime.schedule_spec import ScheduleSpec, make_schedule_spec
from streamworks.runtime.stream_spec import StartPosition, StreamSpec
from streamworks.schedule import CatchUp
from streamworks.settings import Settings
from streamworks.sync_publisher import DurablePublisher, SyncPublisher

if TYPE_CHECKING:
    from streamworks.runtime.chain import HandlingHooks
    from streamworks.runtime.connection import Connection
    from streamworks.runtime.idempotency import IdempotencyStore

__all__ = ("App", "StreamSpec")

P = ParamSpec("P")
T = TypeVar("T")
H = TypeVar("H", bound=Hook)
#: ``App(lifespan=...)``: called with the app, returns an async context manager.
Lifespan = Callable[["App"], AbstractAsyncContextManager[Any]]


class App:
    """One consumer group: its streams, handlers and producers.

    Args:
        name: the group id (``[A-Za-z0-9._-]``, at most 100 characters).
        settings: settings; defaults to ``Settings()`` read from ``STREAMWORKS_*``.
        codec: payload codec; orjson by default.
        idempotency_store: store for ``idempotency_key`` handlers; defaults to a
            Redis store in the worker's Redis.
        middleware: :class:`~streamworks.Middleware` around handling and publishing,
            outermost first (see ``docs/middleware.md``).
        lifespan: ``lifespan(app)`` returning an async context manager, entered
            after the ``on_startup`` hooks and exited before the ``on_shutdown``
            hooks, by the same processes (see :meth:`on_startup`).
    """

    def __init__(
        self,
        name: str,
        *,
        settings: Settings | None = None,
        codec: Codec | None = None,
        idempotency_store: IdempotencyStore | None = None,
        middleware: Sequence[Middleware] = (),
        lifespan: Lifespan | None = None,
    ) -> None:
        self.name = validate_name("group", name)
        self._settings = settings
        self.codec: Codec = codec if codec is not None else JsonCodec()
        self.idempotency_store = idempotency_store
        self.middleware: tuple[Middleware, ...] = tuple(check_middleware(tuple(middleware)))
        self.lifespan = lifespan
        self.startup_hooks: list[Hook] = []
        self.shutdown_hooks: list[Hook] = []
        self._publish_chain: PublishNext | None = None
        self.streams: dict[str, StreamSpec] = {}
        self.handlers: dict[str, HandlerSpec] = {}
        #: ``@app.schedule`` declarations (runtime/scheduler.py publishes their ticks).
        self.schedules: dict[str, ScheduleSpec] = {}
        self._connection: Connection | None = None
        self._connection_users = 0
        self._sync_publisher: SyncPublisher | None = None
        self._loop_token: Any = None
        self._loop_thread = 0

    def __repr__(self) -> str:
        return f"App({self.name!r}, streams={list(self.streams)}, handlers={list(self.handlers)})"

    @property
    def settings(self) -> Settings:
        """The app's settings (read from the environment on first use if not given)."""
        if self._settings is None:
            self._settings = Settings()
        return self._settings

    # -- declarations ----------------------------------------------------------------
    def stream(
        self,
        name: str,
        *,
        shards: int,
        retention: float | None = None,
        delete_on_ack: bool = False,
        dedup_window: float | None = None,
        start: StartPosition = "earliest",
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> StreamSpec:
        """Declare a stream. Creating it happens through the coordinator; a declaration
        never rescales an existing stream (use ``streamworks streams scale``)."""
        validate_name("stream", name)
        if name == Keyspace.SCHEDULE_STREAM:
            raise ConfigurationError(
                f"stream name {name!r} is reserved: streamworks runs the app's schedules on it"
            )
        if not isinstance(shards, int) or shards < 0 or shards > 4096:
            raise ConfigurationError(f"stream {name!r}: shards must be an int in 0..4096")
        if retention is not None and retention <= 0:
            raise ConfigurationError(f"stream {name!r}: retention must be positive")
        if start not in ("earliest", "latest"):
            raise ConfigurationError(f"stream {name!r}: start must be 'earliest' or 'latest'")
        if type(min_replicas) is not int or min_replicas < 0:
            raise ConfigurationError(f"stream {name!r}: min_replicas must be an int >= 0")
        if not replica_timeout > 0:
            raise ConfigurationError(f"stream {name!r}: replica_timeout must be positive")
        spec = StreamSpec(
            name,
            shards,
            retention,
            delete_on_ack,
            dedup_window,
            start,
            min_replicas,
            replica_timeout,
        )
        self.streams[name] = spec
        return spec

    def handler(
        self,
        stream: str,
        *,
        retry: RetryPolicy | None = None,
        ordering: Ordering = "key",
        concurrency: int | None = None,
        idempotency_key: Callable[[Any, Context], str | None] | None = None,
        timeout: float | None = None,
        rate_limit: str | RateLimit | None = None,
        rate_limit_key: Callable[[Message], str | None] | None = None,
        batch: Batch | None = None,
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Register the handler of ``stream`` (one per stream per app).

        Args:
            stream: a stream declared with :meth:`stream`.
            retry: attempts and backoff; ``RetryPolicy()`` by default.
            ordering: ``"shard"`` one at a time per shard, ``"key"`` in order per
                partition key (default), ``"none"`` fully parallel.
            concurrency: messages in flight at once in this worker for this handler.
            idempotency_key: ``(value, ctx) -> key``; enables the idempotency hooks.
            timeout: seconds a single attempt may take before it counts as failed.
            rate_limit: runs per period for the whole group, across all its members
                (``"200/s"``, ``RateLimit.parse("10/m", burst=5)``); messages wait for
                their turn, never fail for it (docs/rate-limits.md).
            rate_limit_key: ``(message) -> key``: one limit per key instead (a message
                whose key is None shares the handler's bucket).
            batch: run the handler on lists of messages (docs/batches.md); then
                ``concurrency`` counts batches in flight and defaults to 1.
        """
        if stream not in self.streams:
            raise ConfigurationError(
                f"handler for undeclared stream {stream!r}: "
                f"call app.stream({stream!r}, shards=N) first"
            )
        if stream == Keyspace.SCHEDULE_STREAM:
            raise ConfigurationError(f"{stream!r} is internal: it carries no messages")
        if stream in self.handlers:
            raise ConfigurationError(
                f"stream {stream!r} already has a handler in app {self.name!r}"
            )
        if ordering not in ("shard", "key", "none"):
            raise ConfigurationError(f"ordering must be 'shard', 'key' or 'none', not {ordering!r}")
        if concurrency is None:
            concurrency = 64 if batch is None else 1
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError("concurrency must be a positive int")
        limit = None if rate_limit is None else RateLimit.parse(rate_limit)
        if rate_limit_key is not None and limit is None:
            raise ConfigurationError("rate_limit_key= needs a rate_limit= to apply per key")
        if rate_limit_key is not None and inspect.iscoroutinefunction(rate_limit_key):
            raise ConfigurationError("rate_limit_key must be a plain function (message) -> str")
        if batch is not None and not isinstance(batch, Batch):
            raise ConfigurationError(f"batch= must be a Batch(...), not {batch!r}")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError("timeout must be positive")
        if idempotency_key is not None and inspect.iscoroutinefunction(idempotency_key):
            raise ConfigurationError(
                "idempotency_key must be a plain function (value, ctx) -> str; it is called "
                "for every message before the handler and cannot be awaited"
            )

        def register(fn: Callable[P, T]) -> Callable[P, T]:
            self.handlers[stream] = HandlerSpec(
                stream=stream,
                fn=fn,
                retry=retry or RetryPolicy(),
                ordering=ordering,
                concurrency=concurrency,
                idempotency_key=idempotency_key,
                timeout=timeout,
                plan=build_plan(fn, self.codec) if batch is None else batch_plan(fn, self.codec),
                rate_limit=limit,
                rate_limit_key=rate_limit_key,
                batch=batch,
            )
            return fn

        return register

    def producer(
        self,
        stream: str,
        *,
        key: Callable[[Any], str | None] | None = None,
        event_id: Callable[[Any], str | None] | None = None,
        headers: Callable[[Any], Mapping[str, str] | None] | None = None,
    ) -> Callable[
        [Callable[P, Awaitable[Any]] | Callable[P, Any]], Callable[P, Awaitable[Published]]
    ]:
        """Decorate a function whose return value is published to ``stream``.

        Calling the decorated function runs it, publishes the result to the shard its
        key routes to, and returns :class:`~streamworks.Published`. The call also takes
        the keyword-only ``delay=`` (timedelta or seconds) or ``at=`` (timezone-aware
        datetime), which are not passed to the function: the message is then delayed
        (docs/delays.md); a function with a parameter of either name is refused.
        """
        if stream not in self.streams:
            raise ConfigurationError(
                f"producer for undeclared stream {stream!r}: "
                f"call app.stream({stream!r}, shards=N) first"
            )

        def decorate(fn: Callable[P, Any]) -> Callable[P, Awaitable[Published]]:
            is_async = inspect.iscoroutinefunction(fn)
            check_delay_parameters(fn)

            @functools.wraps(fn)
            async def publish(*args: P.args, **kwargs: P.kwargs) -> Published:
                # Not the function's (refused at decoration): validated before it runs.
                delay: Any = kwargs.pop("delay", None)
                at: Any = kwargs.pop("at", None)
                due_from(delay, at)
                value = await fn(*args, **kwargs) if is_async else fn(*args, **kwargs)
                return await self.publish(
                    stream,
                    value,
                    key=key(value) if key else None,
                    event_id=event_id(value) if event_id else None,
                    headers=headers(value) if headers else None,
                    delay=delay,
                    at=at,
                )

            return publish

        return decorate

    def schedule(
        self,
        name: str,
        *,
        stream: str,
        every: timedelta | None = None,
        cron: str | None = None,
        tz: str | None = None,
        catch_up: CatchUp = "latest",
        anchor: datetime | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Publish one message to ``stream`` per tick of a periodic schedule: exactly
        one per tick, however many workers run (docs/schedules.md).

        The decorated function is called with the :class:`~streamworks.Tick` (or with
        nothing, if it takes no argument) and returns the tick's message; returning
        None publishes the Tick itself.

        Args:
            name: the schedule's name (``[A-Za-z0-9._-]``).
            stream: a stream declared with :meth:`stream` (the app need not consume it).
            every: tick every period, on a fixed grid from ``anchor`` (the Unix epoch).
            cron: a cron expression (5 fields, 6 with seconds first, or ``@hourly``...).
            tz: the IANA time zone of ``cron`` (UTC by default).
            catch_up: ticks missed while no worker could publish: ``"latest"`` only the
                most recent, ``"all"`` every one, or the ``N`` most recent.
            anchor: where the ``every`` grid starts (timezone-aware).
            key: the messages' partition key (the schedule's name by default).
            headers: headers of every tick's message.

        Raises:
            ConfigurationError: at decoration, for any invalid argument or function.
        """
        # Checked now (not at the first tick), with the function checked on decoration.
        check = functools.partial(
            make_schedule_spec,
            name,
            stream=stream,
            streams=self.streams,
            existing=self.schedules,
            every=every,
            cron=cron,
            tz=tz,
            catch_up=catch_up,
            anchor=anchor,
            key=key,
            headers=headers,
        )
        check(fn=None)

        def register(fn: Callable[P, T]) -> Callable[P, T]:
            self.schedules[name] = check(fn=fn)
            # The internal one-shard stream whose owner publishes the ticks (its group
            # subscribes to it: runtime/scheduler.py).
            self.streams.setdefault(
                Keyspace.SCHEDULE_STREAM, StreamSpec(Keyspace.SCHEDULE_STREAM, 1)
            )
            return fn

        return register

    # -- lifecycle -------------------------------------------------------------------
    def on_startup(self, fn: H) -> H:
        """Register a function to run when a process of this app starts.

        Startup hooks run in registration order once per process — a worker
        (``streamworks worker``, ``open_worker``), ``streamworks dev`` and a
        ``TestRuntime`` — after the app is connected (hooks may publish) and before
        any worker joins the group. ``async def`` hooks run on the event loop, plain
        functions in a worker thread. A hook that raises aborts the start with
        :class:`~streamworks.StartupError`. ``app.connect()`` (a producer-only
        process) runs no hooks.
        """
        self.startup_hooks.append(check_hook("on_startup", fn))
        return fn

    def on_shutdown(self, fn: H) -> H:
        """Register a function to run when a process of this app stops.

        Shutdown hooks run in registration order after the workers have left the
        group and their in-flight messages have ended, while the app can still
        publish; every hook runs even if an earlier one failed (failures are
        logged). They run only if the startup completed.
        """
        self.shutdown_hooks.append(check_hook("on_shutdown", fn))
        return fn

    # -- publishing ------------------------------------------------------------------
    @property
    def connection(self) -> Connection:
        """The open connection; raises NotConnectedError outside ``app.connect()``."""
        if self._connection is None:
            raise NotConnectedError(
                f"app {self.name!r} is not connected: publish inside `async with app.connect():`, "
                "a worker, or a TestRuntime"
            )
        return self._connection

    @property
    def current_connection(self) -> Connection | None:
        """The open connection, or None outside one (unlike :attr:`connection`)."""
        return self._connection

    @property
    def handling_hooks(self) -> HandlingHooks:
        """The handling hooks of :attr:`middleware` (a worker composes them when it starts)."""
        return handling_hooks(self.middleware)

    async def publish(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
    ) -> Published:
        """Publish one message to ``stream``.

        ``min_replicas``/``replica_timeout`` override the stream's durable publishing
        (``app.stream(min_replicas=...)``) for this call; see docs/cluster.md.
        ``delay`` (timedelta or seconds) or ``at`` (timezone-aware datetime) delay the
        message: it enters the stream when due (docs/delays.md).
        """
        record = Record(value, key, event_id, headers, delay, at)
        chain = self._chain_for(min_replicas, replica_timeout)
        if chain is None:
            producer = self.connection.producer
            return await producer.publish(
                stream, record, min_replicas=min_replicas, replica_timeout=replica_timeout
            )
        return (await chain(stream, (record,)))[0]

    def _chain_for(
        self, min_replicas: int | None, replica_timeout: float | None
    ) -> PublishNext | None:
        """The publish middleware chain (None: no middleware), ending in a publish
        with this call's durability options when it has any."""
        chain = self._publish_chain
        if chain is None or (min_replicas is None and replica_timeout is None):
            return chain
        return compose_publish(
            self.middleware,
            DurablePublisher(  # type: ignore[arg-type]  # quacks like Producer.publish_many
                self.connection.producer, min_replicas, replica_timeout
            ),
        )

    async def publish_many(
        self,
        stream: str,
        records: Sequence[Record],
        *,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
    ) -> list[Published]:
        """Publish records in one pipeline; one :class:`Published` per record, in order."""
        chain = self._chain_for(min_replicas, replica_timeout)
        if chain is None:
            return await self.connection.producer.publish_many(
                stream, records, min_replicas=min_replicas, replica_timeout=replica_timeout
            )
        return await chain(stream, records)

    # -- connections -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def connect(
        self,
        *,
        redis_url: str | None = None,
        coordinator_urls: Sequence[str] | None = None,
    ) -> AsyncIterator[Connection]:
        """Open the Redis and routing clients for publishing (re-entrant)."""
        if self._connection is not None:
            self._connection_users += 1
            try:
                yield self._connection
            finally:
                self._connection_users -= 1
            return
        from streamworks.runtime.connection import open_connection

        settings = self.settings.with_overrides(
            redis_url=redis_url,
            coordinator_urls=list(coordinator_urls) if coordinator_urls else None,
        )
        async with open_connection(self, settings) as conn, self.attached(conn):
            yield conn

    @contextlib.asynccontextmanager
    async def attached(self, connection: Connection) -> AsyncIterator[Connection]:
        """Use ``connection`` for this app's publishing while the block runs."""
        if self._connection is not None:
            raise ConfigurationError(f"app {self.name!r} is already connected")
        self._connection = connection
        self._connection_users = 1
        # Composed once per connection: publishing without middleware stays as it was.
        self._publish_chain = compose_publish(self.middleware, connection.producer)
        # Synchronous code in other threads (a sync handler, a thread pool) publishes
        # through this connection by handing the call to its event loop.
        self._loop_token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()
        try:
            yield connection
        finally:
            self._connection = None
            self._connection_users = 0
            self._loop_token = None
            self._publish_chain = None

    @contextlib.contextmanager
    def connect_sync(self, **kwargs: Any) -> Iterator[SyncPublisher]:
        """Blocking variant of :meth:`connect` for synchronous code (Django/Flask views).

        Runs an event loop in a background thread for the duration of the block.
        """
        with (
            anyio.from_thread.start_blocking_portal() as portal,
            portal.wrap_async_context_manager(self.connect(**kwargs)),
        ):
            publisher = self._sync_publisher = SyncPublisher(self, portal)
            try:
                yield publisher
            finally:
                self._sync_publisher = None

    def publish_sync(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
    ) -> Published:
        """Publish from synchronous code (a Django/Flask view, a sync handler).

        In a thread other than the event loop's of an open connection (a worker's, a
        TestRuntime's, ``app.connect()``'s) the call is handed to that loop; inside
        ``connect_sync()`` it reuses that connection; otherwise it opens and closes a
        connection around this message. ``delay``/``at`` as in :meth:`publish`.
        """
        timing: dict[str, Any] = {"delay": delay, "at": at}
        token = self._loop_token
        if token is not None and self._connection is not None:
            if threading.get_ident() == self._loop_thread:
                raise ConfigurationError(
                    "publish_sync() called on the event loop's own thread: it would "
                    "block the loop; use `await app.publish(...)` there"
                )
            result: Published = anyio.from_thread.run(
                functools.partial(
                    self.publish,
                    stream,
                    value,
                    key=key,
                    event_id=event_id,
                    headers=headers,
                    **timing,
                ),
                token=token,
            )
            return result
        if self._sync_publisher is not None:
            return self._sync_publisher.publish(
                stream, value, key=key, event_id=event_id, headers=headers, **timing
            )
        with self.connect_sync() as publisher:
            return publisher.publish(
                stream, value, key=key, event_id=event_id, headers=headers, **timing
            )
