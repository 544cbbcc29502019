"""Handler failure tracebacks: in the dead letter (cut to its last 8 KB), and in the
log at most once per handler per interval."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from streamworks import App, Record, RetryPolicy
from streamworks.runtime.failures import MAX_TRACEBACK, TracebackLog, traceback_text
from streamworks.runtime.message import Message
from streamworks.settings import WorkerSettings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings


class PaymentDeclined(Exception):
    pass


def charge(order: dict[str, Any]) -> None:
    raise PaymentDeclined(f"card of {order['id']} declined")


async def test_a_dead_letter_carries_the_traceback_of_the_last_attempt(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("tb")
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.01, jitter=False))
    async def handle(order: dict[str, Any]) -> None:
        try:
            charge(order)
        except PaymentDeclined as e:
            raise RuntimeError("charging failed") from e

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"id": "o-1"})
        await rt.wait_idle()
        (dead,) = await rt.dead_letters("orders")
    assert dead.reason == "max_attempts" and dead.error == "RuntimeError: charging failed"
    text = dead.fields["traceback"].decode()
    assert text.startswith("Traceback (most recent call last):")
    # The cause's frames and the handler's, down to the line that raised.
    assert "PaymentDeclined: card of o-1 declined" in text
    assert "in charge" in text and "in handle" in text
    assert text.rstrip().endswith("RuntimeError: charging failed")


async def test_a_poison_message_has_no_traceback_field(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("tb")
    app.stream("orders", shards=1)

    @app.handler("orders")
    async def handle(order: dict[str, int]) -> None:
        pass

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"id": "not a number"})
        await rt.wait_idle()
        (dead,) = await rt.dead_letters("orders")
    assert dead.reason == "poison" and "traceback" not in dead.fields


def test_a_long_traceback_keeps_its_end_within_the_limit() -> None:
    # A chain of 200 distinct errors, each raised while handling the one before.
    def fail(n: int) -> None:
        try:
            if n:
                fail(n - 1)
        finally:
            raise ValueError(f"error {n} " + "é" * 20)

    try:
        fail(200)
    except ValueError as e:
        error = e
    text = traceback_text(error)
    assert len(text.encode()) <= MAX_TRACEBACK
    assert text.startswith("... (traceback cut to its last 8192 bytes)")
    assert text.rstrip().endswith("ValueError: error 200 " + "é" * 20)  # the outermost
    assert "error 0 " not in text  # the oldest part was cut
    short = traceback_text(ValueError("never raised"))
    assert short == "ValueError: never raised\n"


async def test_tracebacks_are_logged_at_most_once_per_handler_per_interval(
    streamworks_runtime: Callable[..., TestRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    base = fast_settings()
    settings = base.model_copy(
        update={
            "worker": WorkerSettings(**{**base.worker.model_dump(), "traceback_interval": 3600.0})
        }
    )
    app = App("tb")
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=1))
    async def handle(order: dict[str, Any]) -> None:
        charge(order)

    caplog.set_level(logging.INFO, logger="streamworks")
    async with streamworks_runtime(app, settings=settings) as rt:
        await app.publish_many("orders", [Record({"id": f"o-{i}"}) for i in range(10)])
        await rt.wait_idle()
        dead = await rt.dead_letters("orders")
    assert len(dead) == 10
    assert all(b"PaymentDeclined" in d.fields["traceback"] for d in dead)  # stored always
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert "handler" in logged[0].getMessage() and "traceback" in logged[0].getMessage()
    assert logged[0].exc_info is not None and logged[0].exc_info[0] is PaymentDeclined


def test_the_next_traceback_after_the_interval_counts_the_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    tracebacks = TracebackLog("g", "handle", 60.0, clock=lambda: now[0])
    message = Message._from_entry(b"1-0", "orders", "orders/0@0", None, [b"v", b"{}"])
    caplog.set_level(logging.WARNING, logger="streamworks.handler")
    assert tracebacks.failed(message, ValueError("a"), 1)
    assert not tracebacks.failed(message, ValueError("b"), 1)
    now[0] += 59.9
    assert not tracebacks.failed(message, ValueError("c"), 1)
    now[0] += 0.1
    assert tracebacks.failed(message, ValueError("d"), 1)
    first, second = (r.getMessage() for r in caplog.records)
    assert "suppressed" not in first
    assert "2 more suppressed since the last one" in second
