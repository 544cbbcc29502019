"""OpenTelemetry tracing (``streamworks.otel``) through a real TestRuntime (real Redis),
spans collected by the SDK's in-memory exporter: a publish span and a handler span in
one trace, parent and child, with the messaging attributes; errors on the span."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamworks import App, Context, Message, Retry, RetryPolicy
from streamworks.otel import MESSAGING_SYSTEM, TracingMiddleware
from streamworks.testing import TestRuntime


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> TracingMiddleware:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracingMiddleware(tracer_provider=provider)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_handler_span_is_a_child_of_the_publish_span(
    streamworks_runtime: Callable[..., TestRuntime],
    tracing: TracingMiddleware,
    exporter: InMemorySpanExporter,
) -> None:
    app = App("billing", middleware=[tracing])
    app.stream("orders", shards=4)
    seen_headers: list[dict[str, str]] = []

    @app.handler("orders")
    async def charge(order: dict[str, Any], msg: Message) -> None:
        seen_headers.append(dict(msg.headers))

    async with streamworks_runtime(app) as rt:
        published = await app.publish("orders", {"id": 1}, key="k1", headers={"x": "y"})
        await rt.wait_idle()
    [publish] = by_name(exporter.get_finished_spans(), "publish orders")
    [process] = by_name(exporter.get_finished_spans(), "process orders")
    assert publish.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert publish.context is not None and process.context is not None
    assert process.context.trace_id == publish.context.trace_id
    assert parent_id(process) == publish.context.span_id
    assert publish.parent is None  # published outside any span: a new trace
    # W3C trace context travelled in the headers, next to the publisher's own.
    [headers] = seen_headers
    assert headers["x"] == "y"
    assert headers["traceparent"].split("-")[2] == format(publish.context.span_id, "016x")
    assert dict(publish.attributes or {}) == {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "orders",
        "messaging.message.id": published.entry_id,
        "messaging.destination.partition.id": published.shard,
    }
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == MESSAGING_SYSTEM
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "orders"
    assert attributes["messaging.destination.partition.id"] == published.shard
    assert attributes["messaging.message.id"] == published.entry_id
    assert attributes["messaging.consumer.group.name"] == "billing"
    assert attributes["streamworks.attempt"] == 1
    assert attributes["streamworks.outcome"] == "handled"
    assert process.status.status_code is StatusCode.UNSET


async def test_a_failing_handler_records_the_error_and_the_dead_letter(
    streamworks_runtime: Callable[..., TestRuntime],
    tracing: TracingMiddleware,
    exporter: InMemorySpanExporter,
) -> None:
    app = App("billing", middleware=[tracing])
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.001))
    async def charge(order: dict[str, Any], msg: Message) -> None:
        if msg.attempt == 1:
            raise Retry(delay=0, reason="card service busy")
        raise ValueError("card declined")

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"id": 1})
        await rt.wait_idle()
    spans = exporter.get_finished_spans()
    [publish] = by_name(spans, "publish orders")
    first, second = by_name(spans, "process orders")
    [dead] = by_name(spans, "dead_letter orders")
    assert publish.context is not None
    for span in (first, second, dead):
        assert span.context is not None and span.context.trace_id == publish.context.trace_id
        assert parent_id(span) == publish.context.span_id
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "Retry: card service busy"
    assert (first.attributes or {})["streamworks.outcome"] == "retry"
    assert not first.events  # a Retry is a signal, not an exception
    assert second.status.status_code is StatusCode.ERROR
    assert second.status.description == "ValueError: card declined"
    assert (second.attributes or {})["streamworks.attempt"] == 2
    assert (second.attributes or {})["streamworks.outcome"] == "failed"
    [event] = second.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert dead.status.status_code is StatusCode.ERROR
    assert (dead.attributes or {})["streamworks.dead_letter.reason"] == "max_attempts"


async def test_what_a_handler_publishes_is_a_child_of_its_span(
    streamworks_runtime: Callable[..., TestRuntime],
    tracing: TracingMiddleware,
    exporter: InMemorySpanExporter,
) -> None:
    app = App("billing", middleware=[tracing])
    app.stream("orders", shards=2)
    app.stream("receipts", shards=2)
    app.stream("archive", shards=1)

    @app.handler("orders")
    async def charge(order: dict[str, Any], ctx: Context) -> None:
        await ctx.publish("receipts", order)

    @app.handler("receipts")
    def mail(receipt: dict[str, Any], ctx: Context) -> None:
        # A sync handler (its span is opened on the loop) publishing from its thread.
        ctx.publish_sync("archive", receipt)

    @app.handler("archive")
    async def archive(receipt: dict[str, Any]) -> None:
        pass

    async with streamworks_runtime(app) as rt:
        await app.publish_many("orders", [])  # an empty batch is still one call
        await app.publish("orders", {"id": 1})
        await rt.wait_idle()
    spans = exporter.get_finished_spans()
    empty, publish = by_name(spans, "publish orders")
    assert (empty.attributes or {})["messaging.batch.message_count"] == 0
    [process] = by_name(spans, "process orders")
    [republish] = by_name(spans, "publish receipts")
    [mailed] = by_name(spans, "process receipts")
    [archived] = by_name(spans, "publish archive")
    [stored] = by_name(spans, "process archive")
    chain = [publish, process, republish, mailed, archived, stored]
    for parent, child in itertools.pairwise(chain):
        assert parent.context is not None
        assert parent_id(child) == parent.context.span_id, (parent.name, child.name)
    assert publish.context is not None
    assert {s.context.trace_id for s in chain if s.context} == {publish.context.trace_id}


def test_import_without_opentelemetry_says_which_extra_to_install() -> None:
    """With ``opentelemetry`` unimportable, the error names the extra (a fresh
    interpreter: this one has it imported already)."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "try:\n"
        "    import streamworks.otel\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'streamworks[otel]'" in out.stdout
