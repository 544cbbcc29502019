"""Strict decoding of stored documents: a stored group or member record is either
exactly right or an error (fail closed, E21), never silently repaired."""

from __future__ import annotations

from collections.abc import Mapping


def require_mapping(data: object, what: str) -> Mapping[str, object]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: expected an object, got {type(data).__name__}")
    return data


def require_str(doc: Mapping[str, object], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def require_int(doc: Mapping[str, object], key: str) -> int:
    value = doc.get(key)
    # bool is an int subclass; a stored true/false is corruption, not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    return value


def optional_int(doc: Mapping[str, object], key: str) -> int | None:
    if key not in doc:
        raise ValueError(f"{key}: missing")
    if doc[key] is None:
        return None
    return require_int(doc, key)


def require_str_set(doc: Mapping[str, object], key: str) -> frozenset[str]:
    value = doc.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key}: expected a list of strings, got {value!r}")
    return frozenset(value)


def require_int_map(doc: Mapping[str, object], key: str) -> dict[str, int]:
    value = doc.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected an object, got {value!r}")
    out: dict[str, int] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{key}: expected string -> integer, got {k!r}: {v!r}")
        out[k] = v
    return out


def require_str_map(doc: Mapping[str, object], key: str) -> dict[str, str]:
    value = doc.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected an object, got {value!r}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"{key}: expected string -> string, got {k!r}: {v!r}")
        out[k] = v
    return out
