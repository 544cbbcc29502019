"""Middleware, lifecycle hooks and OpenTelemetry tracing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamworks import (
    App,
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
from streamworks.otel import TracingMiddleware
from streamworks.testing import TestRuntime


class Outcomes(Middleware):
    """Counts what became of every handler run, and how long the runs took."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.seconds: list[float] = []

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        started = time.perf_counter()
        try:
            await call_next(ctx)  # the next middleware, and at the end the handler
        except Skip:
            self.count("skipped")
            raise  # re-raise: the runtime settles the message (ack, retry, dead letter)
        except Retry:
            self.count("retry")
            raise
        except Exception:
            self.count("failed")
            raise
        else:
            self.count("handled")
        finally:
            self.seconds.append(time.perf_counter() - started)

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        self.count(f"dead_lettered:{reason}")


class Tenant(Middleware):
    """Stamps every record this app publishes with a header."""

    async def publish(
        self, stream: str, records: Sequence[Record], call_next: PublishNext
    ) -> list[Published]:
        stamped = [
            dataclasses.replace(r, headers={**(r.headers or {}), "tenant": "acme"}) for r in records
        ]
        return await call_next(stream, stamped)


# Spans go to an in-memory exporter here; in production, to your OTLP exporter.
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
outcomes = Outcomes()

# Outermost first: the tracing span covers the other middleware too.
app = App("invoicing", middleware=[TracingMiddleware(tracer_provider=provider), outcomes, Tenant()])
app.stream("invoices", shards=2)
pool: list[str] = []


@app.on_startup
async def open_pool() -> None:
    pool.append("open")  # e.g. a database pool the handlers share


@app.on_shutdown
async def close_pool() -> None:
    pool.append("closed")  # runs after the workers left and in-flight work ended


@app.handler("invoices", retry=RetryPolicy(max_attempts=2, backoff=0.01))
async def send(invoice: dict[str, Any], msg: Message) -> None:
    assert pool == ["open"] and msg.headers["tenant"] == "acme"
    if invoice["amount"] < 0:
        raise ValueError("negative invoice")


async def main() -> None:
    async with TestRuntime(app) as rt:
        await app.publish("invoices", {"amount": 10})
        await app.publish("invoices", {"amount": -1})  # fails twice, then dead-lettered
        await rt.wait_idle()
    assert pool == ["open", "closed"]
    assert outcomes.counts == {"handled": 1, "failed": 2, "dead_lettered:max_attempts": 1}
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == [
        "dead_letter invoices",
        *["process invoices"] * 3,
        *["publish invoices"] * 2,
    ]


if __name__ == "__main__":
    anyio.run(main)
