"""Payload codecs: how a published value becomes the ``v`` field and back.

The default :class:`JsonCodec` uses orjson. ``bytes`` and ``str`` values travel raw
(UTF-8 for ``str``); pydantic models are dumped by pydantic's own JSON serializer;
anything else orjson can encode is JSON. Decoding is driven by what the handler asks
for, so the codec is told the target type.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import orjson
import pydantic_core
from pydantic import BaseModel

from streamworks.exceptions import DecodeError

__all__ = ("Codec", "JsonCodec")


@runtime_checkable
class Codec(Protocol):
    """Turns values into payload bytes and payload bytes into what a handler asks for."""

    def encode(self, value: Any) -> bytes:
        """Encode a published value; raise TypeError/ValueError when it cannot."""
        ...

    def decode(self, data: bytes) -> Any:
        """Decode a payload into plain data (dicts, lists, scalars); raise DecodeError."""
        ...


class JsonCodec:
    """orjson codec; bytes and str pass through raw, pydantic models via ``model_dump_json``."""

    __slots__ = ()

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, BaseModel):
            return value.model_dump_json().encode()
        try:
            return orjson.dumps(value, default=_default)
        except orjson.JSONEncodeError as e:
            raise TypeError(f"cannot encode {type(value).__name__} as JSON: {e}") from e

    def decode(self, data: bytes) -> Any:
        # pydantic-core's parser, not orjson's: it keeps integers beyond 64 bits exact
        # (orjson would turn them into floats) at the same speed.
        try:
            return pydantic_core.from_json(data, allow_inf_nan=False)
        except ValueError as e:
            raise DecodeError(f"payload is not valid JSON: {e}") from e


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
