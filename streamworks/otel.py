"""OpenTelemetry tracing, built on the middleware (the ``streamworks[otel]`` extra).

.. code-block:: python

    from streamworks import App
    from streamworks.otel import TracingMiddleware

    app = App("billing", middleware=[TracingMiddleware()])

:class:`TracingMiddleware` opens

* a ``publish {stream}`` span (kind PRODUCER) around every ``publish`` /
  ``publish_many`` call, and injects its context into every record's headers with
  the global propagator (W3C ``traceparent``/``tracestate`` by default);
* a ``process {stream}`` span (kind CONSUMER) around every handler run, whose parent
  is the context extracted from the message's headers: the handler's span is a
  child of the publish span, in the same trace, across processes. What the handler
  publishes in turn is a child of its span;
* a ``dead_letter {stream}`` span (kind INTERNAL, status ERROR) when a message is
  dead-lettered, in the trace of its publish.

Attributes follow the OpenTelemetry messaging semantic conventions:
``messaging.system`` is ``"redis_streams"`` (Redis Streams has no well-known value;
this names the transport rather than the library), ``messaging.destination.name``
the logical stream, ``messaging.destination.partition.id`` the shard
(``orders/3@0``), ``messaging.message.id`` the Redis entry id,
``messaging.consumer.group.name`` the app's group, ``messaging.operation.type``
``send``/``process``. streamworks adds ``streamworks.attempt`` and
``streamworks.outcome`` (``handled``, ``skipped``, ``retry``, ``failed``). A failed
attempt records its exception and sets the status to ERROR; a ``Retry`` sets ERROR
with its reason; ``Skip`` is not an error.

Importing this module without OpenTelemetry installed raises an :class:`ImportError`
that says which extra to install.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "streamworks.otel needs OpenTelemetry: install the extra with "
        "`pip install 'streamworks[otel]'` (or the opentelemetry-api package)"
    ) from e

from streamworks import __version__
from streamworks.exceptions import Retry, Skip
from streamworks.middleware import HandleNext, Middleware, PublishNext

if TYPE_CHECKING:
    from streamworks.runtime.message import Context, Message
    from streamworks.runtime.producer import Published, Record

__all__ = ("MESSAGING_SYSTEM", "TracingMiddleware")

#: The ``messaging.system`` attribute of every span.
MESSAGING_SYSTEM = "redis_streams"


class TracingMiddleware(Middleware):
    """Spans for publishing and handling, with trace context carried in headers.

    Args:
        tracer_provider: where spans go; the global provider by default.
        propagator: how context is written to and read from headers; the global
            propagator (W3C trace context and baggage by default) when None.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("streamworks", __version__, tracer_provider=tracer_provider)
        self._propagator = propagator

    def _inject(self, carrier: dict[str, str]) -> None:
        if self._propagator is None:
            propagate.inject(carrier)
        else:
            self._propagator.inject(carrier)

    def _extract(self, headers: Any) -> Any:
        if self._propagator is None:
            return propagate.extract(headers)
        return self._propagator.extract(headers)

    async def publish(
        self, stream: str, records: Sequence[Record], call_next: PublishNext
    ) -> list[Published]:
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": stream,
        }
        if len(records) != 1:
            attributes["messaging.batch.message_count"] = len(records)
        with self._tracer.start_as_current_span(
            f"publish {stream}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            self._inject(carrier)  # the context of this span, now current
            if carrier:
                records = [
                    dataclasses.replace(r, headers={**(r.headers or {}), **carrier})
                    for r in records
                ]
            published = await call_next(stream, records)
            if len(published) == 1:
                # A delayed message has no entry id yet (it gets one when due).
                message_id = published[0].entry_id or published[0].delay_id or ""
                span.set_attribute("messaging.message.id", message_id)
                span.set_attribute("messaging.destination.partition.id", published[0].shard)
            return published

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        message = ctx.message
        with self._tracer.start_as_current_span(
            f"process {message.stream}",
            context=self._extract(message.headers),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": MESSAGING_SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": message.stream,
                "messaging.destination.partition.id": message.shard,
                "messaging.message.id": message.id,
                "messaging.consumer.group.name": ctx.app.name,
                "messaging.message.body.size": len(message.payload),
                "streamworks.attempt": message.attempt,
            },
            # Recorded below: Skip and Retry are signals, not exceptions to record.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await call_next(ctx)
            except Skip:
                span.set_attribute("streamworks.outcome", "skipped")
                raise
            except Retry as signal:
                span.set_attribute("streamworks.outcome", "retry")
                span.set_status(Status(StatusCode.ERROR, f"Retry: {signal.reason}"))
                raise
            except Exception as e:
                span.set_attribute("streamworks.outcome", "failed")
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
                raise
            span.set_attribute("streamworks.outcome", "handled")

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        with self._tracer.start_as_current_span(
            f"dead_letter {message.stream}",
            context=self._extract(message.headers),
            kind=SpanKind.INTERNAL,
            attributes={
                "messaging.system": MESSAGING_SYSTEM,
                "messaging.destination.name": message.stream,
                "messaging.destination.partition.id": message.shard,
                "messaging.message.id": message.id,
                "streamworks.dead_letter.reason": reason,
                "streamworks.dead_letter.attempts": message.attempt - 1,
            },
        ) as span:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
