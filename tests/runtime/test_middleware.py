"""Middleware around handling and publishing, through a real TestRuntime (real Redis):
the order of the chain, what a middleware observes of each outcome, what it may
change, and that an app without middleware keeps the plain path."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from streamworks import (
    App,
    ConfigurationError,
    Context,
    Message,
    Middleware,
    Published,
    Record,
    Retry,
    RetryPolicy,
    Skip,
)
from streamworks.middleware import HandleNext, PublishNext
from streamworks.testing import TestRuntime


class Recorder(Middleware):
    """Records what it sees, tagged with its name."""

    def __init__(self, name: str, log: list[Any]) -> None:
        self.name = name
        self.log = log

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        self.log.append((self.name, "before", ctx.message.id, ctx.value))
        try:
            await call_next(ctx)
        except Skip:
            self.log.append((self.name, "skip", ctx.message.id))
            raise
        except Retry as signal:
            self.log.append((self.name, "retry", ctx.message.id, signal.reason))
            raise
        except Exception as e:
            self.log.append((self.name, "error", ctx.message.id, repr(e)))
            raise
        self.log.append((self.name, "ok", ctx.message.id))

    async def publish(
        self, stream: str, records: Sequence[Record], call_next: PublishNext
    ) -> list[Published]:
        self.log.append((self.name, "publish", stream, [r.value for r in records]))
        published = await call_next(stream, records)
        self.log.append((self.name, "published", stream, published))
        return published

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        self.log.append((self.name, "dead", message.id, reason, error))


async def test_chain_runs_outermost_first_around_the_handler_and_publish(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    log: list[Any] = []
    app = App("g", middleware=[Recorder("outer", log), Recorder("inner", log)])
    app.stream("orders", shards=2)

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        log.append(("handler", order["n"]))

    async with streamworks_runtime(app) as rt:
        published = await app.publish("orders", {"n": 1}, key="a")
        await rt.wait_idle()
    entry = published.entry_id
    assert log == [
        ("outer", "publish", "orders", [{"n": 1}]),
        ("inner", "publish", "orders", [{"n": 1}]),
        ("inner", "published", "orders", [published]),
        ("outer", "published", "orders", [published]),
        ("outer", "before", entry, {"n": 1}),
        ("inner", "before", entry, {"n": 1}),
        ("handler", 1),
        ("inner", "ok", entry),
        ("outer", "ok", entry),
    ]
    assert published.stream == "orders" and published.shard.startswith("orders/")


async def test_outcomes_success_skip_retry_failure_and_dead_letter_are_observed(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    log: list[Any] = []
    app = App("g", middleware=[Recorder("m", log)])
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.001))
    async def handle(order: dict[str, Any], msg: Message) -> None:
        kind = order["kind"]
        if kind == "skip":
            raise Skip
        if kind == "retry" and msg.attempt == 1:
            raise Retry(delay=0, reason="not yet")
        if kind == "fail":
            raise RuntimeError("boom")

    async with streamworks_runtime(app) as rt:
        ids = {
            kind: (await app.publish("orders", {"kind": kind}, key=kind)).entry_id
            for kind in ("ok", "skip", "retry", "fail")
        }
        await rt.wait_idle()
        [dead] = await rt.dead_letters("orders")
        stats = rt.statistics("orders")

    def seen(entry: str) -> list[Any]:
        return [
            item[1:]
            for item in log
            if item[1] != "publish" and item[1] != "published" and item[2] == entry
        ]

    assert seen(ids["ok"]) == [("before", ids["ok"], {"kind": "ok"}), ("ok", ids["ok"])]
    assert seen(ids["skip"]) == [("before", ids["skip"], {"kind": "skip"}), ("skip", ids["skip"])]
    assert seen(ids["retry"]) == [
        ("before", ids["retry"], {"kind": "retry"}),
        ("retry", ids["retry"], "not yet"),
        ("before", ids["retry"], {"kind": "retry"}),
        ("ok", ids["retry"]),
    ]
    fail = ids["fail"]
    assert seen(fail) == [
        ("before", fail, {"kind": "fail"}),
        ("error", fail, "RuntimeError('boom')"),
        ("before", fail, {"kind": "fail"}),
        ("error", fail, "RuntimeError('boom')"),
        ("dead", fail, "max_attempts", "RuntimeError: boom"),
    ]
    assert dead.origin_id == fail and dead.reason == "max_attempts"
    # "handled" counts every acked run, a skipped one too.
    assert stats["handled"] == 3 and stats["skipped"] == 1 and stats["dead_lettered"] == 1


async def test_poison_is_dead_lettered_without_running_the_handler_chain(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    log: list[Any] = []
    app = App("g", middleware=[Recorder("m", log)])
    app.stream("orders", shards=1)

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        raise AssertionError("a list never decodes as a dict")

    async with streamworks_runtime(app) as rt:
        entry = (await app.publish("orders", [1, 2])).entry_id
        await rt.wait_idle()
    handling = [item for item in log if item[1] not in ("publish", "published")]
    assert len(handling) == 1
    assert handling[0][:4] == ("m", "dead", entry, "poison")


class Gate(Middleware):
    """Skips messages flagged ``drop`` and replaces the value of the others."""

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        if ctx.value.get("drop"):
            raise Skip
        ctx.value = {**ctx.value, "seen_by": "gate"}
        await call_next(ctx)


async def test_middleware_may_short_circuit_and_replace_the_value(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g", middleware=[Gate()])
    app.stream("orders", shards=1)
    got: list[dict[str, Any]] = []

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        got.append(order)

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"n": 1, "drop": True})
        await app.publish("orders", {"n": 2})
        await rt.wait_idle()
        stats = rt.statistics("orders")
    assert got == [{"n": 2, "seen_by": "gate"}]
    assert stats["skipped"] == 1 and stats["handled"] == 2  # both acked


class Raising(Middleware):
    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        raise ValueError("middleware broke")


async def test_an_exception_of_the_middleware_is_a_failed_attempt(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g", middleware=[Raising()])
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=1))
    async def handle(order: dict[str, Any]) -> None:
        raise AssertionError("never reached")

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"n": 1})
        await rt.wait_idle()
        [dead] = await rt.dead_letters("orders")
    assert dead.reason == "max_attempts" and dead.error == "ValueError: middleware broke"


class Threads(Middleware):
    def __init__(self) -> None:
        self.threads: list[int] = []

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        self.threads.append(threading.get_ident())
        await call_next(ctx)
        self.threads.append(threading.get_ident())


async def test_sync_handlers_get_async_middleware_on_the_event_loop(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    threads = Threads()
    app = App("g", middleware=[threads])
    app.stream("orders", shards=1)
    handler_threads: list[int] = []

    @app.handler("orders")
    def handle(order: dict[str, Any]) -> None:
        handler_threads.append(threading.get_ident())

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"n": 1})
        await rt.wait_idle()
    loop_thread = threading.get_ident()
    assert threads.threads == [loop_thread, loop_thread]
    assert handler_threads and handler_threads[0] != loop_thread


class Stamp(Middleware):
    """Adds a header to every record it publishes."""

    async def publish(
        self, stream: str, records: Sequence[Record], call_next: PublishNext
    ) -> list[Published]:
        stamped = [
            dataclasses.replace(r, headers={**(r.headers or {}), "stamp": stream}) for r in records
        ]
        return await call_next(stream, stamped)


async def test_publish_middleware_changes_records_of_every_publish_path(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g", middleware=[Stamp()])
    app.stream("orders", shards=2)
    app.stream("audit", shards=1)
    headers: dict[str, list[dict[str, str]]] = {"orders": [], "audit": []}

    @app.handler("orders")
    async def handle(order: dict[str, Any], msg: Message, ctx: Context) -> None:
        headers["orders"].append(dict(msg.headers))
        await ctx.publish("audit", order, headers={"from": "orders"})

    @app.handler("audit")
    async def audit(entry: dict[str, Any], msg: Message) -> None:
        headers["audit"].append(dict(msg.headers))

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"n": 0}, headers={"a": "b"})
        batch = await app.publish_many("orders", [Record({"n": i}, key=str(i)) for i in (1, 2)])
        await rt.wait_idle()
    assert len(batch) == 2 and all(p.stream == "orders" for p in batch)
    assert sorted(h.get("a", "-") for h in headers["orders"]) == ["-", "-", "b"]
    assert all(h["stamp"] == "orders" for h in headers["orders"])
    assert headers["audit"] == [{"from": "orders", "stamp": "audit"}] * 3


async def test_no_middleware_keeps_the_plain_paths(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    plain = App("g")
    plain.stream("orders", shards=1)
    publish_only = App("h", middleware=[Stamp()])
    publish_only.stream("orders", shards=1)
    for app in (plain, publish_only):

        @app.handler("orders")
        async def handle(order: dict[str, Any]) -> None:
            pass

    async with streamworks_runtime(plain) as rt:
        runtime = rt.workers[0].handlers["orders"]
        # No chain at all: the simple async path, and publishing straight to the producer.
        assert runtime._middleware is None
        assert runtime.dispatcher._process == runtime._process_simple
        assert plain._publish_chain is None
    async with streamworks_runtime(publish_only) as rt:
        # Only publishing is wrapped: handling stays plain.
        assert rt.workers[0].handlers["orders"]._middleware is None
        assert publish_only._publish_chain is not None


def test_middleware_must_be_middleware_instances() -> None:
    with pytest.raises(ConfigurationError, match="Middleware instances"):
        App("g", middleware=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="Middleware instances"):
        App("g", middleware=[Stamp])  # type: ignore[list-item]


class SyncHook(Middleware):
    def handle(self, ctx: Context, call_next: HandleNext) -> None:  # type: ignore[override]
        pass


def test_hooks_must_be_async() -> None:
    with pytest.raises(ConfigurationError, match=r"SyncHook.handle must be an `async def`"):
        App("g", middleware=[SyncHook()])
