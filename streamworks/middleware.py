"""Middleware: code that runs around every handler run and every publish.

An app's middleware (``App(middleware=[...])``) is a list of :class:`Middleware`
objects, outermost first, in the spirit of ASGI's call-next and dramatiq's
middleware::

    class Timing(Middleware):
        async def handle(self, ctx, call_next):
            started = time.perf_counter()
            try:
                await call_next(ctx)  # the next middleware, and at the end the handler
            finally:
                log.info("%s took %.3fs", ctx.message.id, time.perf_counter() - started)

What each hook sees:

* :meth:`Middleware.handle` — one run (attempt) of a handler on one message, with its
  :class:`~streamworks.Context` (``ctx.message``, ``ctx.value``). ``call_next(ctx)``
  returns when the handler returned, and raises what it raised: :class:`Skip`,
  :class:`Retry`, or its exception (a timeout is a ``TimeoutError``). Whatever the
  chain raises is the outcome of the attempt, so a middleware may also raise ``Skip``
  or ``Retry`` itself, or swallow an exception (the message then counts as handled).
  Sync handlers run in a worker thread; their middleware runs on the event loop.
* :meth:`Middleware.dead_lettered` — a message was written to the dead-letter stream
  (``reason``: ``max_attempts`` after its last failed attempt, ``poison`` when it
  could not be decoded, ``crashed`` when every run died with its worker). It runs
  after the write; what it raises is logged, never affects the message.
* :meth:`Middleware.publish` — one ``publish``/``publish_many`` call (also from a
  handler's ``ctx.publish`` and ``@app.producer``): the stream and its records;
  ``call_next(stream, records)`` returns one :class:`~streamworks.Published` per
  record. A middleware may pass other records on (``dataclasses.replace(record,
  headers=...)``), e.g. to add headers.

The chains are composed once — the handling chain when a worker starts, the publish
chain when the app's connection opens — and a hook a middleware does not override is
left out of its chain. An app without middleware runs exactly the code it would run
without this module. The runtime sits below this module (``app → middleware →
runtime``, a contract in ``.importlinter``): it gets the handling hooks picked here
(:func:`handling_hooks`) and composes them itself (``streamworks/runtime/chain.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamworks.exceptions import ConfigurationError
from streamworks.runtime.chain import HandleNext, HandlingChain, HandlingHooks

if TYPE_CHECKING:
    from streamworks.runtime.message import Context, Message
    from streamworks.runtime.producer import Producer, Published, Record

__all__ = (
    "HandleNext",
    "HandlingChain",
    "Middleware",
    "PublishNext",
    "check_middleware",
    "compose_publish",
    "handling_hooks",
)

#: ``call_next`` of :meth:`Middleware.publish`.
PublishNext = Callable[[str, Sequence["Record"]], Awaitable[list["Published"]]]


class Middleware:
    """Base class of middleware: every hook passes through until overridden."""

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        """Around one handler run; call ``await call_next(ctx)`` to run it."""
        await call_next(ctx)

    async def publish(
        self, stream: str, records: Sequence[Record], call_next: PublishNext
    ) -> list[Published]:
        """Around one publish of ``records`` to ``stream``; return ``call_next``'s list."""
        return await call_next(stream, records)

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        """After ``message`` was written to the dead-letter stream (then it is acked)."""


_HOOKS = ("handle", "publish", "dead_lettered")


def _overrides(middleware: Middleware, hook: str) -> bool:
    return getattr(type(middleware), hook, None) is not getattr(Middleware, hook)


def check_middleware(middleware: Sequence[Any]) -> Sequence[Middleware]:
    """``middleware`` itself, once every item is known to be a :class:`Middleware`."""
    for item in middleware:
        if not isinstance(item, Middleware):
            raise ConfigurationError(
                f"middleware must be streamworks.Middleware instances, not {item!r}"
            )
        for hook in _HOOKS:
            # A plain `def` hook would fail every message at run time: refuse it now.
            if _overrides(item, hook) and not inspect.iscoroutinefunction(getattr(item, hook)):
                raise ConfigurationError(
                    f"{type(item).__name__}.{hook} must be an `async def` method"
                )
    return middleware


def handling_hooks(middleware: Sequence[Any]) -> HandlingHooks:
    """The hooks of ``middleware`` that wrap handling, outermost first: those it
    overrides (the runtime composes them into a :class:`HandlingChain`)."""
    items = check_middleware(middleware)
    return HandlingHooks(
        handle=tuple(item.handle for item in items if _overrides(item, "handle")),
        dead_lettered=tuple(
            item.dead_lettered for item in items if _overrides(item, "dead_lettered")
        ),
    )


def _publish_layer(middleware: Middleware, call_next: PublishNext) -> PublishNext:
    hook = middleware.publish

    async def call(stream: str, records: Sequence[Record]) -> list[Published]:
        return await hook(stream, records, call_next)

    return call


def compose_publish(middleware: Sequence[Any], producer: Producer) -> PublishNext | None:
    """The publish chain over ``producer``, or None when no middleware wraps publishing."""
    layers = [item for item in check_middleware(middleware) if _overrides(item, "publish")]
    if not layers:
        return None

    async def publish(stream: str, records: Sequence[Record]) -> list[Published]:
        if len(records) == 1:
            return [await producer.publish(stream, records[0])]
        return await producer.publish_many(stream, records)

    run: PublishNext = publish
    for item in reversed(layers):
        run = _publish_layer(item, run)
    return run
