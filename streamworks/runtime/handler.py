"""Handler declarations and parameter injection.

``@app.handler`` inspects the handler's signature once and builds a plan: which
parameter receives the decoded value (and how to decode it), which the
:class:`Message`, which the :class:`Context`. Per message, the plan only runs the
chosen decoder, so the cost of injection is paid at declaration time.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError

from streamworks.batch import Batch
from streamworks.exceptions import ConfigurationError, DecodeError
from streamworks.protocol.codec import Codec
from streamworks.ratelimit import RateLimit
from streamworks.runtime.message import Context, Message
from streamworks.runtime.retry import RetryPolicy

__all__ = ("HandlerSpec", "Ordering", "build_plan")

Ordering = Literal["shard", "key", "none"]
Decoder = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """How to call one handler: decode the value, then pass value/message/context."""

    decode: Decoder | None  # None: the handler takes no value parameter
    wants_value: bool
    wants_message: bool
    wants_context: bool
    # Positional order of the three kinds, e.g. ("value", "context").
    order: tuple[str, ...]
    is_async: bool


@dataclass(slots=True)
class HandlerSpec:
    """A registered handler and its options (see ``App.handler``)."""

    stream: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    ordering: Ordering
    concurrency: int
    idempotency_key: Callable[[Any, Context], str | None] | None
    timeout: float | None
    plan: CallPlan = field(repr=False)
    # Issue 21: a group-wide rate limit (runtime/rate_gate.py), optionally per key of
    # the message view; batches (runtime/batching.py: then ``plan`` is a batch plan).
    rate_limit: RateLimit | None = None
    rate_limit_key: Callable[[Message], str | None] | None = None
    batch: Batch | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


def _value_decoder(annotation: Any, codec: Codec) -> Decoder:
    """Pick the decoder for the value parameter from its annotation."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return codec.decode
    if annotation is bytes:
        return _identity
    if annotation is str:
        return _utf8
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        model = annotation
        if _is_json_codec(codec):

            def decode_model(data: bytes) -> Any:
                try:
                    return model.model_validate_json(data)
                except ValidationError as e:
                    raise DecodeError(f"payload does not validate as {model.__name__}: {e}") from e

            return decode_model

        def decode_model_via_codec(data: bytes) -> Any:
            try:
                return model.model_validate(codec.decode(data))
            except ValidationError as e:
                raise DecodeError(f"payload does not validate as {model.__name__}: {e}") from e

        return decode_model_via_codec
    if annotation is dict or annotation is list:
        kind = annotation

        def decode_plain(data: bytes) -> Any:
            value = codec.decode(data)
            if not isinstance(value, kind):
                raise DecodeError(f"payload is a {type(value).__name__}, not a {kind.__name__}")
            return value

        return decode_plain
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)

    def decode_typed(data: bytes) -> Any:
        try:
            return adapter.validate_python(codec.decode(data))
        except ValidationError as e:
            raise DecodeError(f"payload does not validate as {annotation!r}: {e}") from e

    return decode_typed


def _identity(data: bytes) -> bytes:
    return data


def passes_payload(decoder: Decoder | None) -> bool:
    """Whether ``decoder`` hands the payload bytes over unchanged (``payload: bytes``):
    the runtime then skips the call."""
    return decoder is _identity


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"payload is not UTF-8 text: {e}") from e


def _is_json_codec(codec: Codec) -> bool:
    from streamworks.protocol.codec import JsonCodec

    return type(codec) is JsonCodec


def build_plan(fn: Callable[..., Any], codec: Codec) -> CallPlan:
    """Inspect ``fn`` and decide how each message is passed to it.

    Raises:
        ConfigurationError: a parameter cannot be injected, or two parameters want
            the value.
    """
    if not callable(fn):
        raise ConfigurationError(f"handler {fn!r} is not callable")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references
        raise ConfigurationError(f"cannot resolve annotations of {fn!r}: {e}") from e
    order: list[str] = []
    decoder: Decoder | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if annotation is Message:
            order.append("message")
        elif annotation is Context:
            order.append("context")
        elif param.default is not inspect.Parameter.empty and order.count("value"):
            continue  # extra parameters with defaults are left alone
        elif "value" in order:
            raise ConfigurationError(
                f"handler {fn.__qualname__}: parameter {param.name!r} cannot be injected; "
                "a handler takes one value parameter plus optional Message and Context"
            )
        else:
            decoder = _value_decoder(annotation, codec)
            order.append("value")
        if param.kind is param.KEYWORD_ONLY:
            raise ConfigurationError(
                f"handler {fn.__qualname__}: keyword-only parameter {param.name!r} is not supported"
            )
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callables
    )
    return CallPlan(
        decode=decoder,
        wants_value="value" in order,
        wants_message="message" in order,
        wants_context="context" in order,
        order=tuple(order),
        is_async=is_async,
    )


def bind_arguments(
    plan: CallPlan, value: Any, message: Message, context: Context | None
) -> list[Any]:
    """The positional arguments for one call, in the handler's order."""
    args: list[Any] = []
    for kind in plan.order:
        if kind == "value":
            args.append(value)
        elif kind == "message":
            args.append(message)
        else:
            args.append(context)
    return args


# Re-exported for type checkers of callers that hold a handler result.
HandlerResult = Awaitable[None] | None


def discard_awaitable(awaitable: Any) -> None:
    """Close an un-awaited coroutine (no "never awaited" warning on top of the error)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


def invoker(fn: Any, order: tuple[str, ...]) -> Any:
    """``(value, message) -> awaitable`` calling ``fn`` with its parameters in order."""
    if order == ("value",):
        return lambda value, message: fn(value)
    if order == ("value", "message"):
        return lambda value, message: fn(value, message)
    if order == ("message",):
        return lambda value, message: fn(message)
    if order == ("message", "value"):
        return lambda value, message: fn(message, value)
    if order == ():
        return lambda value, message: fn()
    return lambda value, message: fn(*[value if kind == "value" else message for kind in order])
