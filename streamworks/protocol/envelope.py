"""The stream entry format (SPEC section 5).

Each entry has the fields ``v`` (payload bytes), ``k`` (partition key, optional),
``e`` (event id, optional), ``h`` (headers as a JSON object, optional), ``t``
(publish time, ms) and ``f`` (format version). Optional fields are omitted when
empty so the common entry stays small. An entry the runtime cannot parse is a
poison message (:class:`~streamworks.exceptions.DecodeError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from streamworks.exceptions import DecodeError

__all__ = (
    "FORMAT_VERSION",
    "MAX_PAYLOAD",
    "Envelope",
    "decode_fields",
    "encode_fields",
    "parse_fields",
)

#: The entry format written by this version of streamworks.
FORMAT_VERSION = b"1"
#: Largest payload accepted for publishing or handling (bytes).
MAX_PAYLOAD = 64 * 1024 * 1024

_V, _K, _E, _H, _T, _F = b"v", b"k", b"e", b"h", b"t", b"f"

#: The headers of an entry that has none (shared, read-only).
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded entry (payload still encoded)."""

    payload: bytes
    key: str | None
    event_id: str | None
    headers: Mapping[str, str]
    published_at: int


def encode_fields(
    payload: bytes,
    key: str | None,
    event_id: str | None,
    headers: dict[str, str] | None,
    published_at: int | str,
) -> list[bytes | str]:
    """Return the flat ``field, value, ...`` list for ``XADD``."""
    fields: list[bytes | str] = [_V, payload, _T, str(published_at), _F, FORMAT_VERSION]
    if key is not None:
        fields += (_K, key)
    if event_id is not None:
        fields += (_E, event_id)
    if headers:
        fields += (_H, orjson.dumps(headers))
    return fields


def decode_fields(raw: Any) -> Envelope:
    """Parse the flat field list Redis returns for an entry into an :class:`Envelope`."""
    return Envelope(*parse_fields(raw))


def parse_fields(raw: Any) -> tuple[bytes, str | None, str | None, Mapping[str, str], int]:
    """See :func:`_parse`; anything unexpected (a value that is not bytes, ...) is a
    :class:`DecodeError` too, never another exception."""
    try:
        return _parse(raw)
    except (TypeError, AttributeError) as e:
        raise DecodeError(f"malformed entry: {e}") from e


def _parse(raw: Any) -> tuple[bytes, str | None, str | None, Mapping[str, str], int]:
    """Parse the flat field list Redis returns for an entry into
    ``(payload, key, event_id, headers, published_at)``.

    Entries written by :func:`encode_fields` start with ``v, t, f`` in that order and
    take a fast path; anything else is parsed field by field.

    Raises:
        DecodeError: the entry is deleted, malformed, of an unknown format version, or
            carries a field of the wrong type.
    """
    if (
        type(raw) is list
        and len(raw) >= 6
        and raw[0] == _V
        and raw[2] == _T
        and raw[4] == _F
        and raw[5] == FORMAT_VERSION
    ):
        if len(raw) == 6:
            payload = raw[1]
            if len(payload) > MAX_PAYLOAD:
                raise DecodeError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
            try:
                return payload, None, None, NO_HEADERS, int(raw[3])
            except ValueError as e:
                raise DecodeError(f"malformed entry field: {e}") from e
        if len(raw) == 8 and raw[6] == _K:
            payload = raw[1]
            if len(payload) > MAX_PAYLOAD:
                raise DecodeError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
            try:
                return payload, raw[7].decode(), None, NO_HEADERS, int(raw[3])
            except (ValueError, UnicodeDecodeError) as e:
                raise DecodeError(f"malformed entry field: {e}") from e
    return _parse_any_order(raw)


def _parse_any_order(raw: Any) -> tuple[bytes, str | None, str | None, Mapping[str, str], int]:
    if not raw or not isinstance(raw, list) or len(raw) % 2:
        raise DecodeError("entry has no fields or an odd field list")
    fields: dict[bytes, bytes] = {}
    it = iter(raw)
    for name in it:
        fields[name] = next(it)
    fmt = fields.get(_F)
    if fmt != FORMAT_VERSION:
        raise DecodeError(f"unknown entry format version {fmt!r}")
    payload = fields.get(_V)
    if payload is None:
        raise DecodeError("entry has no 'v' (payload) field")
    if len(payload) > MAX_PAYLOAD:
        raise DecodeError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    try:
        published_at = int(fields.get(_T, b"0"))
        key = fields[_K].decode() if _K in fields else None
        event_id = fields[_E].decode() if _E in fields else None
    except (ValueError, UnicodeDecodeError) as e:
        raise DecodeError(f"malformed entry field: {e}") from e
    headers: Mapping[str, str] = NO_HEADERS
    if _H in fields:
        try:
            parsed = orjson.loads(fields[_H])
        except orjson.JSONDecodeError as e:
            raise DecodeError(f"headers are not valid JSON: {e}") from e
        if not isinstance(parsed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
        ):
            raise DecodeError("headers must be a JSON object of strings")
        headers = parsed
    return payload, key, event_id, headers, published_at
