"""``@app.on_startup`` / ``@app.on_shutdown`` and ``App(lifespan=)``, run by a real
TestRuntime and by ``open_worker`` (real Redis, real coordinator): their order, what
they can do (publish), and what a failing hook does."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from streamworks import App, ConfigurationError, StartupError
from streamworks.exceptions import CoordinatorError
from streamworks.runtime.process import open_worker
from streamworks.testing import TestRuntime
from tests.support import wait_for


def make_app(events: list[str]) -> App:
    @contextlib.asynccontextmanager
    async def lifespan(app: App) -> AsyncIterator[None]:
        events.append(f"lifespan enter {app.name}")
        yield
        events.append("lifespan exit")

    app = App("g", lifespan=lifespan)
    app.stream("orders", shards=2)

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        events.append(f"handled {order['n']}")

    return app


async def test_hooks_run_in_order_around_the_workers(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    events: list[str] = []
    app = make_app(events)
    runtime: list[TestRuntime] = []
    loop_thread = threading.get_ident()

    @app.on_startup
    async def connect_first() -> None:
        events.append("startup 1")
        # Connected already: a startup hook may publish.
        await app.publish("orders", {"n": 0})

    @app.on_startup
    def warm_cache() -> None:
        # A plain function runs in a worker thread.
        events.append(f"startup 2 in a thread: {threading.get_ident() != loop_thread}")

    @app.on_shutdown
    async def flush() -> None:
        [rt] = runtime
        events.append(f"shutdown 1 workers stopped: {all(s.done.is_set() for s in rt.slots)}")
        await app.publish("orders", {"n": 99})  # still connected

    @app.on_shutdown
    def close_pool() -> None:
        events.append("shutdown 2")

    rt = streamworks_runtime(app)
    runtime.append(rt)
    async with rt:
        await rt.wait_idle()
        assert events == [
            "startup 1",
            "startup 2 in a thread: True",
            "lifespan enter g",
            "handled 0",
        ]
    assert events[4:] == ["lifespan exit", "shutdown 1 workers stopped: True", "shutdown 2"]


async def test_a_failing_startup_hook_aborts_the_start(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    events: list[str] = []
    app = make_app(events)

    @app.on_startup
    def broken() -> None:
        raise OSError("no database")

    @app.on_startup
    def never() -> None:
        events.append("second startup hook")

    @app.on_shutdown
    def not_started() -> None:
        events.append("shutdown")

    rt = streamworks_runtime(app)
    with pytest.raises(
        StartupError, match=r"startup hook .*broken failed: OSError: no database"
    ) as e:
        async with rt:
            raise AssertionError("the runtime must not start")
    assert isinstance(e.value.__cause__, OSError)
    assert events == []  # no later hook, no lifespan, no shutdown
    assert rt.slots == []  # no worker was started


async def test_a_failing_lifespan_aborts_the_start(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    @contextlib.asynccontextmanager
    async def lifespan(app: App) -> AsyncIterator[None]:
        raise RuntimeError("cannot open")
        yield

    app = App("g", lifespan=lifespan)
    app.stream("orders", shards=1)
    with pytest.raises(StartupError, match=r"lifespan .*failed: RuntimeError: cannot open"):
        async with streamworks_runtime(app):
            pass


async def test_every_shutdown_hook_runs_when_one_fails(
    streamworks_runtime: Callable[..., TestRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    events: list[str] = []
    app = make_app(events)

    @app.on_shutdown
    async def broken() -> None:
        raise RuntimeError("flush failed")

    @app.on_shutdown
    async def after() -> None:
        events.append("second shutdown hook")

    with caplog.at_level(logging.ERROR, logger="streamworks.lifecycle"):
        async with streamworks_runtime(app):
            pass
    assert events[-1] == "second shutdown hook"
    assert any(
        "shutdown hook" in r.getMessage() and "broken" in r.getMessage() for r in caplog.records
    )


async def test_lifespan_false_runs_no_hooks(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    events: list[str] = []
    app = make_app(events)
    app.on_startup(lambda: events.append("startup"))
    async with streamworks_runtime(app, lifespan=False):
        pass
    assert events == []


async def test_open_worker_runs_startup_before_joining_and_shutdown_after_leaving(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The worker process's path (``open_worker``): at startup the member is not in the
    group yet; at shutdown it has left it."""
    events: list[str] = []
    app = make_app(events)
    async with streamworks_runtime(app, workers=0, attach=False, lifespan=False) as rt:
        assert rt.service is not None
        service = rt.service

        async def members() -> list[str]:
            try:
                group = await service.group_info(app.name)
            except CoordinatorError:
                return []  # the group does not exist yet
            return [m.member_id for m in group.members if m.state not in ("EXPIRED", "FENCED")]

        @app.on_startup
        async def started() -> None:
            events.append(f"startup members={len(await members())}")

        @app.on_shutdown
        async def stopped() -> None:
            events.append(f"shutdown members={len(await members())}")

        async with open_worker(app, rt.settings, redis=rt.redis, coordinator=rt.coordinator) as w:
            await wait_for(lambda: bool(w.readers), message="the worker to own its shards")
            assert len(await members()) == 1
        assert events == [
            "startup members=0",
            "lifespan enter g",
            "lifespan exit",
            "shutdown members=0",
        ]


async def test_open_worker_raises_the_startup_error_itself(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        pass

    @app.on_startup
    async def broken() -> None:
        raise KeyError("missing")

    async with streamworks_runtime(app, workers=0, attach=False, lifespan=False) as rt:
        # Not an exception group from the connection's task group: the error itself.
        with pytest.raises(StartupError, match="KeyError: 'missing'"):
            async with open_worker(app, rt.settings, redis=rt.redis, coordinator=rt.coordinator):
                raise AssertionError("the worker must not start")


def test_hooks_take_no_arguments() -> None:
    app = App("g")
    with pytest.raises(ConfigurationError, match="must take no arguments"):
        app.on_startup(lambda app: None)  # type: ignore[arg-type,misc]
    with pytest.raises(ConfigurationError, match="needs a function"):
        app.on_shutdown(42)  # type: ignore[type-var]
