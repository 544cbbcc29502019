"""Properties of ``parse_fields`` (the entry envelope, docs/reliability.md): whatever field list it
is given, it returns a well-typed ``(payload, key, event_id, headers, published_at)``
or raises ``DecodeError`` — never anything else, since anything else would escape the
poison path. No Redis needed: this is the pure parser the reader runs on every entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamworks.exceptions import DecodeError
from streamworks.protocol.envelope import FORMAT_VERSION, encode_fields, parse_fields

NAMES = [b"v", b"k", b"e", b"h", b"t", b"f"]

#: Values that look right, or nearly, for each field (so the parser's deeper branches
#: run, not only the "unknown format version" exit).
NEAR_VALUES: dict[bytes, st.SearchStrategy[bytes]] = {
    b"v": st.binary(max_size=64),
    b"k": st.text(max_size=8).map(str.encode) | st.binary(max_size=8),
    b"e": st.text(max_size=8).map(str.encode) | st.binary(max_size=8),
    b"h": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3).map(orjson.dumps)
    | st.sampled_from([b"null", b"[]", b'{"a": 1}', b'{"a": null}', b"{", b"", b'"x"'])
    | st.binary(max_size=16),
    b"t": st.integers(-(2**70), 2**70).map(lambda i: str(i).encode())
    | st.sampled_from([b"", b"1.5", b"1e3", b" 1", b"0x1", b"\xff"])
    | st.binary(max_size=8),
    b"f": st.sampled_from([FORMAT_VERSION, FORMAT_VERSION, b"2", b"", b"1 ", b"\x01"])
    | st.binary(max_size=3),
}


@st.composite
def field_lists(draw: st.DrawFn) -> list[bytes]:
    """Flat field lists as XADD can write them (pairs of byte strings, any names, any
    order, repeats allowed), biased towards the real field names."""
    names = draw(
        st.lists(st.sampled_from(NAMES) | st.binary(max_size=4), max_size=10)
        | st.permutations(NAMES).map(list)
    )
    fields: list[bytes] = []
    for name in names:
        value = draw(NEAR_VALUES.get(name, st.binary(max_size=16)))
        fields += [name, value]
    return fields


def _check_well_typed(result: Any) -> None:
    payload, key, event_id, headers, published_at = result
    assert isinstance(payload, bytes)
    assert key is None or isinstance(key, str)
    assert event_id is None or isinstance(event_id, str)
    assert isinstance(headers, Mapping)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    assert type(published_at) is int


def _parse(raw: Any) -> None:
    try:
        result = parse_fields(raw)
    except DecodeError:
        return
    _check_well_typed(result)


@settings(max_examples=500, deadline=None)
@given(field_lists())
@example([b"v", b"p", b"t", b"1", b"f", b"1"])  # the fast path
@example([b"v", b"p", b"t", b"1", b"f", b"1", b"k", b"\xff"])  # the keyed fast path
@example([b"v", b"p", b"t", b"9" * 5000, b"f", b"1"])  # int() digit limit
@example([b"f", b"1", b"v", b"p", b"h", b'{"a": "b"}', b"h", b"[]"])  # repeated field
def test_any_field_list_parses_well_typed_or_raises_decode_error(raw: list[bytes]) -> None:
    _parse(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=8), max_size=9))  # odd lengths included
def test_flat_lists_of_any_length_parse_or_raise_decode_error(raw: list[bytes]) -> None:
    _parse(raw)


@pytest.mark.parametrize("raw", [None, [], b"", b"v", [b"v"], [b"v", b"p", b"t"]])
def test_deleted_empty_and_odd_entries_are_decode_errors(raw: Any) -> None:
    """A deleted entry (nil fields, as XCLAIM returns it), an empty or an odd list."""
    with pytest.raises(DecodeError):
        parse_fields(raw)


@settings(max_examples=500, deadline=None)
@given(
    payload=st.binary(max_size=64),
    key=st.none() | st.text(max_size=8),
    event_id=st.none() | st.text(max_size=8),
    headers=st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
    published_at=st.integers(0, 2**50),
    order=st.randoms(use_true_random=False),
)
def test_what_the_producer_writes_parses_back_in_any_field_order(
    payload: bytes,
    key: str | None,
    event_id: str | None,
    headers: dict[str, str] | None,
    published_at: int,
    order: Any,
) -> None:
    # Redis gives every field back as bytes.
    flat = [
        x.encode() if isinstance(x, str) else x
        for x in encode_fields(payload, key, event_id, headers, published_at)
    ]
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    expected = (payload, key, event_id, headers or {}, published_at)
    assert _tuple(parse_fields(flat)) == expected  # fast path where it applies
    order.shuffle(pairs)
    assert _tuple(parse_fields([x for pair in pairs for x in pair])) == expected


def _tuple(parsed: Any) -> tuple[Any, ...]:
    payload, key, event_id, headers, published_at = parsed
    return (payload, key, event_id, dict(headers), published_at)


#: What a RESP reply can hold besides bulk strings: integers, nils, nested arrays.
RESP = st.recursive(
    st.none() | st.integers() | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), RESP), min_size=1, max_size=6))
@example([(b"v", 5), (b"t", b"1"), (b"f", b"1")])  # an integer payload, fast path
def test_fields_of_any_resp_type_parse_or_raise_decode_error(pairs: list[Any]) -> None:
    _parse([x for pair in pairs for x in pair])
