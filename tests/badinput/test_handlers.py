"""Handlers that misbehave, in-process (docs/handlers.md "Acknowledgement, retries and
dead letters"): every kind of exception, odd ``Retry``/``Skip`` arguments, hanging past
``timeout=`` (async, and sync in a thread that cannot be cancelled), return values,
recursive publishing through ``ctx.publish``, and ``idempotency_key`` callables that
fail. Every message ends handled or dead-lettered with the reason, the worker keeps
running, and good messages published afterwards are all handled.

Handlers that raise what ends a process are in ``test_fatal_handlers.py``; handler
failures that used to crash the worker are in ``test_handler_crashes.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App, Context, Message, Retry, RetryPolicy, Skip
from streamworks.exceptions import ConfigurationError
from streamworks.protocol.envelope import MAX_PAYLOAD
from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.support import wait_for

FAST = RetryPolicy(max_attempts=2, backoff=0.001, max_backoff=0.01)


class AppError(Exception):
    """An application's own exception."""


class NoSuperInit(Exception):
    def __init__(self, code: int) -> None:  # does not call Exception.__init__
        self.code = code


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def _raise(kind: str) -> None:
    """Raise the exception named ``kind`` (the way real code would get it)."""
    if kind == "ValueError":
        raise ValueError("bad value")
    if kind == "KeyError":
        _ = {}["missing"]
    if kind == "AppError":
        raise AppError("the application failed")
    if kind == "ExceptionGroup":
        raise ExceptionGroup("several", [ValueError("a"), KeyError("b")])
    if kind == "RecursionError":
        _recurse(0)
    if kind == "MemoryError":
        raise MemoryError
    if kind == "TimeoutError":
        raise TimeoutError("upstream timed out")
    if kind == "OSError":
        open("/nonexistent/dir/file")  # noqa: SIM115 - raises FileNotFoundError
    if kind == "UnicodeDecodeError":
        b"\xff".decode()
    if kind == "AssertionError":
        raise AssertionError
    if kind == "NotImplementedError":
        raise NotImplementedError
    if kind == "StopAsyncIteration":
        raise StopAsyncIteration
    if kind == "NoSuperInit":
        raise NoSuperInit(7)
    if kind == "10 MB message":
        raise AppError("x" * 10_000_000)
    if kind == "empty message":
        raise AppError("")
    if kind == "control characters":
        raise AppError("line1\nline2\r\x1b[31mred\x00nul")
    if kind == "non-ASCII":
        raise AppError("ошибка 🚨 エラー")
    if kind == "StopIteration":
        raise StopIteration
    raise AssertionError(kind)


EXCEPTIONS = [
    "ValueError",
    "KeyError",
    "AppError",
    "ExceptionGroup",
    "RecursionError",
    "MemoryError",
    "TimeoutError",
    "OSError",
    "UnicodeDecodeError",
    "AssertionError",
    "NotImplementedError",
    "StopAsyncIteration",
    "NoSuperInit",
    "10 MB message",
    "empty message",
    "control characters",
    "non-ASCII",
    "StopIteration",
]
#: What the dead letter's error starts with, where it is not the kind itself.
ERROR_START = {
    "10 MB message": "AppError: xxx",
    "empty message": "AppError: ",
    "control characters": "AppError: line1\nline2",
    "non-ASCII": "AppError: ошибка 🚨 エラー",
    "OSError": "FileNotFoundError: ",
    # Python turns a StopIteration leaving a coroutine (or anyio's thread call) into this
    "StopIteration": "RuntimeError: coroutine raised StopIteration",
}


async def test_every_kind_of_exception_is_retried_then_dead_lettered(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("async", shards=2)
    app.stream("sync", shards=2)
    handled: list[str] = []

    @app.handler("async", retry=FAST, ordering="none")
    async def on_async(value: dict[str, str]) -> None:
        if value["raise"]:
            _raise(value["raise"])
        handled.append(value["id"])

    @app.handler("sync", retry=FAST, ordering="none")
    def on_sync(value: dict[str, str]) -> None:
        if value["raise"]:
            _raise(value["raise"])
        handled.append(value["id"])

    async with streamworks_runtime(app) as rt:
        for stream in ("async", "sync"):
            for kind in EXCEPTIONS:
                await app.publish(stream, {"id": f"{stream}:{kind}", "raise": kind}, key=kind)
        await rt.wait_idle(timeout=20)
        for stream in ("async", "sync"):
            await app.publish(stream, {"id": f"{stream}:good", "raise": ""})
        await rt.wait_idle(timeout=20)

        assert sorted(handled) == ["async:good", "sync:good"]
        for stream in ("async", "sync"):
            dead = {d.key: d for d in await rt.dead_letters(stream)}
            assert sorted(dead) == sorted(EXCEPTIONS), stream
            for kind, d in dead.items():
                assert (d.reason, d.attempts) == ("max_attempts", 2), (stream, kind)
                start = ERROR_START.get(kind, f"{kind}: ")
                assert d.error.startswith(start), (stream, kind, d.error[:100])
                assert len(d.error) <= 4000, (stream, kind)  # a 10 MB message is cut
            stats = rt.statistics(stream)
            assert stats["failed"] == 2 * len(EXCEPTIONS), stream
            assert stats["handled"] == 1, stream


async def test_odd_retry_and_skip_signals(streamworks_runtime: Callable[..., TestRuntime]) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    runs: dict[str, int] = {}

    @app.handler("s", retry=RetryPolicy(max_attempts=3, backoff=30), ordering="none")
    async def handle(value: dict[str, str], msg: Message) -> None:
        kind = value["kind"]
        runs[kind] = runs.get(kind, 0) + 1
        if kind == "Retry class":
            raise Retry  # the class, not an instance
        if kind == "Retry(delay=0)":
            raise Retry(delay=0)
        if kind == "Retry(delay=-5)":
            raise Retry(delay=-5)
        if kind == "Retry(delay=nan)":
            raise Retry(delay=float("nan"))
        if kind == "Retry with a 1 MB reason":
            raise Retry(delay=0, reason="r" * 1_000_000)
        if kind == "Retry with an empty reason":
            raise Retry(delay=0, reason="")
        if kind == "Skip class":
            raise Skip
        if kind == "Skip with arguments":
            raise Skip("ignored", 42)
        raise AssertionError(kind)

    kinds = [
        "Retry class",
        "Retry(delay=0)",
        "Retry(delay=-5)",
        "Retry(delay=nan)",
        "Retry with a 1 MB reason",
        "Retry with an empty reason",
        "Skip class",
        "Skip with arguments",
    ]
    async with streamworks_runtime(app) as rt:
        for kind in kinds:
            if kind != "Retry class":  # its policy backoff is 30 s: checked on its own below
                await app.publish("s", {"kind": kind})
        await rt.wait_idle(timeout=10)  # delays <= 0 and NaN mean "now"
        dead = await rt.dead_letters("s")
        assert len(dead) == 5
        assert {(d.reason, d.attempts) for d in dead} == {("max_attempts", 3)}
        errors = sorted(d.error for d in dead)
        assert errors[:4] == ["", "retry requested", "retry requested", "retry requested"]
        assert errors[4] == "r" * 4000  # a 1 MB reason is cut
        assert rt.statistics("s")["skipped"] == 2
        assert runs["Skip class"] == runs["Skip with arguments"] == 1

        # `raise Retry` (the class) uses the policy's backoff: it waits, it is not lost.
        await app.publish("s", {"kind": "Retry class"})
        await wait_for(lambda: rt.statistics("s")["retried"] == 5 * 2 + 1, message="a retry")
        assert runs["Retry class"] == 1
        assert await rt.redis.hlen(rt.keyspace.retries(ShardId("s", 0), app.name)) == 1


async def test_an_async_handler_hanging_past_its_timeout_is_retried_then_dead_lettered(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    handled: list[str] = []

    @app.handler("s", timeout=0.2, retry=FAST, ordering="shard")
    async def handle(value: dict[str, str]) -> None:
        if value["id"] == "hang":
            await anyio.sleep_forever()
        handled.append(value["id"])

    async with streamworks_runtime(app) as rt:
        await app.publish("s", {"id": "hang"})
        await app.publish("s", {"id": "after"})  # waits behind it (shard order)
        await rt.wait_idle(timeout=10)
        [dead] = await rt.dead_letters("s")
        assert (dead.reason, dead.attempts) == ("max_attempts", 2)
        assert dead.error.startswith("TimeoutError")
        assert handled == ["after"]


async def test_a_sync_handler_hanging_past_its_timeout_is_abandoned_and_the_worker_moves_on(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A thread cannot be cancelled: each timed-out attempt leaves its thread behind
    (abandoned) and the worker goes on — even at ``concurrency=1``, since an abandoned
    thread no longer holds the handler's slot. When the threads finally return, their
    results are ignored: no second ack, no crash."""
    app = App("badinput")
    app.stream("s", shards=1)
    release = threading.Event()
    blocked: set[int] = set()
    returned: list[int] = []
    handled: list[str] = []

    @app.handler("s", timeout=0.2, retry=FAST, concurrency=1)
    def handle(value: dict[str, str]) -> None:
        if value["id"] == "hang":
            blocked.add(threading.get_ident())
            assert release.wait(30), "never released"
            returned.append(threading.get_ident())
            return
        handled.append(value["id"])

    async with streamworks_runtime(app) as rt:
        await app.publish("s", {"id": "hang"})
        await wait_for(lambda: rt.statistics("s")["dead_lettered"] == 1, message="dead letter")
        # Both attempts' threads still block (two threads): abandoned, and yet the
        # worker serves other messages.
        assert len(blocked) == 2 and returned == []
        for i in range(5):
            await app.publish("s", {"id": f"after-{i}"})
        await rt.wait_idle(timeout=10)
        assert handled == [f"after-{i}" for i in range(5)]

        release.set()
        await wait_for(lambda: len(returned) == 2, message="the abandoned threads to return")
        assert set(returned) == blocked
        await rt.wait_idle()
        [dead] = await rt.dead_letters("s")
        assert (dead.reason, dead.attempts) == ("max_attempts", 2)
        assert dead.error.startswith("TimeoutError")
        stats = rt.statistics("s")
        assert (stats["handled"], stats["dead_lettered"], stats["failed"]) == (5, 1, 2)


async def test_return_values_are_ignored(streamworks_runtime: Callable[..., TestRuntime]) -> None:
    app = App("badinput")
    app.stream("async", shards=1)
    app.stream("sync", shards=1)
    values: list[Any] = [42, "text", {"a": 1}, [1, 2], b"bytes", False, Exception("x"), object()]

    @app.handler("async", ordering="shard")
    async def on_async(value: dict[str, int]) -> Any:
        return values[value["i"]]

    @app.handler("sync", ordering="shard")
    def on_sync(value: dict[str, int]) -> Any:
        item = values[value["i"]]
        return (x for x in [item]) if value["i"] == 0 else item  # a generator too

    async with streamworks_runtime(app) as rt:
        for stream in ("async", "sync"):
            for i in range(len(values)):
                await app.publish(stream, {"i": i})
        await rt.wait_idle()
        for stream in ("async", "sync"):
            assert rt.handled(stream) == len(values)
            assert await rt.dead_letters(stream) == []


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "coroutine ... was never awaited"
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("shape", ["sync lambda", "async without await"])
async def test_a_handler_returning_a_coroutine_does_not_lose_its_work(
    shape: str, streamworks_runtime: Callable[..., TestRuntime]
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    done: list[int] = []

    async def work(value: dict[str, int]) -> None:
        done.append(value["i"])

    if shape == "sync lambda":
        app.handler("s", retry=FAST)(lambda value: work(value))
    else:

        @app.handler("s", retry=FAST)
        async def handle(value: dict[str, int]) -> Any:
            return work(value)  # the missing `await`

    async with streamworks_runtime(app) as rt:
        await app.publish("s", {"i": 1})
        await rt.wait_idle()
        dead = await rt.dead_letters("s")
        assert done == [1] or (len(dead) == 1 and "await" in dead[0].error), (done, dead)


async def test_handlers_publishing_recursively_through_the_context(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("chain", shards=1)
    app.stream("tree", shards=4)
    app.stream("ping", shards=2)
    app.stream("pong", shards=2)
    chain: list[int] = []
    tree: list[str] = []
    rally: list[int] = []

    @app.handler("chain", ordering="shard", concurrency=1)
    async def on_chain(value: dict[str, int], ctx: Context) -> None:
        chain.append(value["n"])
        if value["n"] < 100:  # publishes to the shard it is reading, in order
            await ctx.publish("chain", {"n": value["n"] + 1})

    @app.handler("tree", ordering="none", concurrency=16)
    async def on_tree(value: dict[str, str], ctx: Context) -> None:
        tree.append(value["path"])
        if len(value["path"]) < 8:
            for branch in "01":
                await ctx.publish("tree", {"path": value["path"] + branch}, key=branch)

    @app.handler("ping")
    async def on_ping(value: dict[str, int], ctx: Context) -> None:
        rally.append(value["n"])
        await ctx.publish("pong", {"n": value["n"] + 1}, key="ball")

    @app.handler("pong")
    async def on_pong(value: dict[str, int], ctx: Context) -> None:
        rally.append(value["n"])
        if value["n"] < 99:
            await ctx.publish("ping", {"n": value["n"] + 1}, key="ball")

    async with streamworks_runtime(app) as rt:
        await app.publish("chain", {"n": 0})
        await app.publish("tree", {"path": "r"})
        await app.publish("ping", {"n": 0}, key="ball")
        await rt.wait_idle(timeout=30)
        assert chain == list(range(101))
        assert sorted(tree) == sorted(
            "r" + format(i, f"0{d}b") if d else "r" for d in range(8) for i in range(2**d)
        )
        assert rally == list(range(100))
        for stream in ("chain", "tree", "ping", "pong"):
            assert await rt.dead_letters(stream) == []


async def test_a_failing_ctx_publish_is_a_failed_attempt(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    app.stream("out", shards=1)
    out: list[Any] = []

    @app.handler("s", retry=FAST, ordering="none")
    async def handle(value: dict[str, str], ctx: Context) -> None:
        kind = value["kind"]
        if kind == "undeclared stream":
            await ctx.publish("nowhere", {"a": 1})
        elif kind == "unencodable value":
            await ctx.publish("out", {"a": object()})
        elif kind == "payload over 64 MiB":
            await ctx.publish("out", b"x" * (MAX_PAYLOAD + 1))
        elif kind == "invalid stream name":
            await ctx.publish("../etc", {"a": 1})
        else:
            await ctx.publish("out", {"ok": kind})

    @app.handler("out")
    async def on_out(value: dict[str, str]) -> None:
        out.append(value)

    async with streamworks_runtime(app) as rt:
        kinds = ["undeclared stream", "unencodable value", "payload over 64 MiB"]
        kinds.append("invalid stream name")
        for kind in kinds:
            await app.publish("s", {"kind": kind})
        await app.publish("s", {"kind": "fine"})
        await rt.wait_idle(timeout=20)
        dead = {d.payload: d for d in await rt.dead_letters("s")}
        assert len(dead) == len(kinds)
        errors = {kind: dead[f'{{"kind":"{kind}"}}'.encode()].error for kind in kinds}
        assert "nowhere" in errors["undeclared stream"]
        assert "object" in errors["unencodable value"]
        assert "exceeds" in errors["payload over 64 MiB"]
        assert "etc" in errors["invalid stream name"]
        assert all(d.reason == "max_attempts" for d in dead.values())
        assert out == [{"ok": "fine"}]
        assert await rt.dead_letters("out") == []


async def test_idempotency_key_callables_that_fail(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    handled: list[str] = []

    def key_of(value: dict[str, str], ctx: Context) -> Any:
        kind = value["kind"]
        if kind == "raises":
            return value["missing"]
        if kind == "raises ExceptionGroup":
            raise ExceptionGroup("keys", [ValueError("no key")])
        if kind == "returns None":
            return None  # no idempotency for this message
        if kind == "returns an int":
            return 5
        if kind == "returns 1 MB":
            return "k" * 1_000_000
        return value["kind"]

    @app.handler("s", retry=FAST, idempotency_key=key_of, ordering="none")
    async def handle(value: dict[str, str], ctx: Context) -> None:
        handled.append(value["kind"])

    async with streamworks_runtime(app) as rt:
        kinds = ["raises", "raises ExceptionGroup", "returns None", "returns an int"]
        kinds += ["returns 1 MB", "normal"]
        for kind in kinds:
            await app.publish("s", {"kind": kind})
        await app.publish("s", {"kind": "normal"})  # a duplicate of the last one
        await rt.wait_idle()
        assert sorted(handled) == sorted(
            ["returns None", "returns an int", "returns 1 MB", "normal"]
        )
        dead = {d.payload: d for d in await rt.dead_letters("s")}
        assert len(dead) == 2
        for d in dead.values():
            assert (d.reason, d.attempts) == ("poison", 0)  # deterministic: never retried
            assert d.error.startswith("idempotency_key failed: ")
        assert rt.statistics("s")["duplicates"] == 1


def test_an_async_idempotency_key_is_refused_at_declaration() -> None:
    app = App("badinput")
    app.stream("s", shards=1)

    async def key_of(value: Any, ctx: Context) -> str:
        return "k"

    with pytest.raises(ConfigurationError):
        app.handler("s", idempotency_key=key_of)(_noop)


async def _noop(value: Any) -> None: ...


async def test_a_cancelled_error_raised_by_the_handler_is_a_failed_attempt(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    attempts: list[int] = []

    @app.handler("s", retry=FAST)
    async def handle(value: dict[str, str], msg: Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt == 1:
            task = asyncio.ensure_future(asyncio.sleep(10))
            task.cancel()
            await task  # raises CancelledError into the handler

    async with streamworks_runtime(app) as rt:
        await app.publish("s", {"a": "1"})
        await rt.wait_idle(timeout=3)
        assert attempts == [1, 2]
        assert rt.handled("s") == 1


async def test_attempts_that_kill_the_worker_count_towards_max_attempts(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)
    attempts: list[int] = []

    @app.handler("s", retry=RetryPolicy(max_attempts=2, backoff=0.001))
    async def handle(value: dict[str, str], msg: Message) -> None:
        attempts.append(msg.attempt)
        await anyio.sleep_forever()  # until the worker dies

    async with streamworks_runtime(app) as rt:
        await app.publish("s", {"a": "1"})
        # The first delivery's run is not counted (a crash can take a message that was
        # read but never started), every run of a taken-over delivery is: the message
        # kills three workers, then the next owner dead-letters it without running it.
        for crash in range(3):
            await wait_for(lambda n=crash: len(attempts) == n + 1, message=f"attempt {crash}")
            await rt.kill_worker(len(rt.slots) - 1)
            await rt.advance(5)  # its lease runs out; the shard moves on
            await rt.add_worker()
        assert attempts == [1, 1, 2]
        await rt.wait_idle(timeout=5)
        [dead] = await rt.dead_letters("s")
        assert (dead.reason, dead.attempts) == ("crashed", 2)
        assert attempts == [1, 1, 2]  # not run again
