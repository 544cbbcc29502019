"""What a batch handler receives: a list of values and one :class:`BatchContext`.

``@app.handler("events", batch=Batch(...))`` takes a function whose first parameter is
a ``list[T]`` (each item decoded as a per-message handler's ``T`` would be;
``list[Message]`` for the messages themselves) and optionally a :class:`BatchContext`:

.. code-block:: python

    @app.handler("events", batch=Batch(max_size=500))
    async def write(events: list[Event], ctx: BatchContext) -> None:
        for i, event in enumerate(events):
            try:
                insert(event)
            except IntegrityError as e:
                ctx.fail(i, e)  # this item only: retried or dead-lettered alone

Raising fails the whole batch (every item counts a failed attempt).
"""

from __future__ import annotations

import inspect
import logging
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from streamworks.exceptions import ConfigurationError
from streamworks.protocol.codec import Codec
from streamworks.runtime.handler import CallPlan, _value_decoder
from streamworks.runtime.message import Message

if TYPE_CHECKING:
    from streamworks.runtime.app_view import AppView
    from streamworks.runtime.producer import Published

__all__ = ("BatchContext", "ItemFailure", "batch_plan")


class ItemFailure:
    """One item the handler failed with :meth:`BatchContext.fail`."""

    __slots__ = ("delay", "error", "exception")

    def __init__(self, error: str, exception: BaseException | None, delay: float | None) -> None:
        self.error = error
        self.exception = exception
        self.delay = delay


class BatchContext:
    """The context of one batch.

    Attributes:
        messages: the messages of the batch, in the order of the handler's list.
        idempotency_keys: each item's idempotency key (None without ``idempotency_key=``).
        logger: the handler's logger.
        member_id: the worker (group member) running the batch.
    """

    __slots__ = ("_failed", "app", "idempotency_keys", "logger", "member_id", "messages")

    def __init__(
        self,
        app: AppView,
        messages: Sequence[Message],
        idempotency_keys: Sequence[str | None],
        logger: logging.LoggerAdapter[Any],
        member_id: str = "",
    ) -> None:
        self.app = app
        self.messages = list(messages)
        self.idempotency_keys = list(idempotency_keys)
        self.logger = logger
        self.member_id = member_id
        self._failed: dict[int, ItemFailure] = {}

    def fail(
        self, index: int, error: BaseException | str, retry_delay: float | None = None
    ) -> None:
        """Fail item ``index`` only: it counts a failed attempt and is retried after
        ``retry_delay`` seconds (default: the handler's backoff), or dead-lettered when
        its attempts are used up. Later items of its key in this batch are not acked:
        they run again after it (per-key order); the other items are acked.

        Raises:
            IndexError: no such item.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"fail() takes the item's index in the list, not {index!r}")
        if not 0 <= index < len(self.messages):
            raise IndexError(f"item {index} is not in a batch of {len(self.messages)}")
        if retry_delay is not None and not (
            isinstance(retry_delay, int | float) and math.isfinite(retry_delay) and retry_delay >= 0
        ):
            raise ValueError(f"retry_delay must be a finite number >= 0, not {retry_delay!r}")
        if isinstance(error, BaseException):
            text, exception = f"{type(error).__name__}: {error}", error
        else:
            text, exception = str(error), None
        self._failed[index] = ItemFailure(text, exception, retry_delay)

    @property
    def failed(self) -> Mapping[int, ItemFailure]:
        """The items failed so far, by index."""
        return self._failed

    @property
    def fencing_tokens(self) -> list[int]:
        """Each item's fencing token (see :attr:`Context.fencing_token`)."""
        return [m._grant for m in self.messages]

    async def publish(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Published:
        """Publish through the app's connection (same routing as ``app.publish``)."""
        return await self.app.publish(stream, value, key=key, event_id=event_id, headers=headers)


def batch_plan(fn: Callable[..., Any], codec: Codec) -> CallPlan:
    """The call plan of a batch handler: a ``list[T]`` parameter, then optionally a
    :class:`BatchContext`. ``decode`` decodes one item (None: the items are the
    :class:`Message` objects).

    Raises:
        ConfigurationError: any other signature.
    """
    if not callable(fn):
        raise ConfigurationError(f"batch handler {fn!r} is not callable")
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise ConfigurationError(f"cannot resolve annotations of {fn!r}: {e}") from e
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
    ]
    usage = f"batch handler {name}: takes (items: list[T]) or (items: list[T], ctx: BatchContext)"
    if not 1 <= len(params) <= 2 or any(p.kind is p.KEYWORD_ONLY for p in params):
        raise ConfigurationError(usage)
    items = hints.get(params[0].name, inspect.Parameter.empty)
    origin = typing.get_origin(items)
    if items is not list and origin not in (list, Sequence):
        raise ConfigurationError(f"{usage}; {params[0].name!r} is annotated {items!r}")
    args = typing.get_args(items)
    element = args[0] if args else inspect.Parameter.empty
    order: tuple[str, ...] = ("value",)
    if len(params) == 2:
        if hints.get(params[1].name) is not BatchContext:
            raise ConfigurationError(f"{usage}; annotate {params[1].name!r} as BatchContext")
        order = ("value", "context")
    decode = None if element is Message else _value_decoder(element, codec)
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callables
    )
    return CallPlan(
        decode=decode,
        wants_value=True,
        wants_message=element is Message,
        wants_context=len(order) == 2,
        order=order,
        is_async=is_async,
    )
