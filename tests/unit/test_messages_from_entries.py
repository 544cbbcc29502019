"""``messages_from_entries`` (the reader's per-batch constructor) gives exactly the
messages ``Message._from_entry`` (the full parser) gives, entry by entry."""

from __future__ import annotations

from typing import Any

from streamworks.protocol.envelope import encode_fields
from streamworks.runtime.message import Message, messages_from_entries


class _Reader:
    token = "7:member"


def _raw(fields: list[Any]) -> list[Any]:
    return [f if isinstance(f, bytes) else str(f).encode() for f in fields]


ENTRIES: list[list[Any]] = [
    _raw(encode_fields(b'{"a":1}', None, None, None, 1718000000000)),  # v t f
    _raw(encode_fields(b"x", "customer-1", None, None, 5)),  # v t f k
    _raw(encode_fields(b"x", "k", "ev-1", {"h": "1"}, 5)),  # + e, h: the full parser
    [b"v", b"x", b"t", b"5", b"f", b"1", b"k", b"\xff"],  # key not UTF-8: poison
    [b"v", b"x", b"t", b"nope", b"f", b"1"],  # bad time: poison
    [b"v", b"x", b"t", b" 5", b"f", b"1"],  # not plain digits: the full parser's int()
    [b"v", b"x", b"t", b"9" * 30, b"f", b"1"],  # too many digits to leave unconverted
    [b"v", b"x", b"t", b"5", b"f", b"2"],  # unknown format version: poison
    [b"t", b"5", b"v", b"x", b"f", b"1"],  # another field order: still parsed
    [b"v", b"x"],  # no version: poison
    [],  # deleted entry: poison
]

ATTRS = (
    "_rid", "stream", "shard", "_reader", "_grant", "payload", "key",
    "event_id", "headers", "published_at", "due", "_failures", "_claimed",
    "_retry_record", "_error", "_dead_letter",
)  # fmt: skip


def test_the_batch_constructor_matches_the_full_parser() -> None:
    reader: Any = _Reader()
    entries = [(b"1-%d" % i, raw) for i, raw in enumerate(ENTRIES)]
    batch = messages_from_entries(entries, "orders", "orders/0@0", reader)
    assert len(batch) == len(entries)
    for message, (rid, raw) in zip(batch, entries, strict=True):
        expected = Message._from_entry(rid, "orders", "orders/0@0", reader, raw)
        for name in ATTRS:
            assert getattr(message, name) == getattr(expected, name), (raw, name)
        # What a dead letter copies: the entry's fields as Redis returned them (the
        # batch constructor rebuilds them rather than keeping the list).
        assert message._entry_fields() == expected._entry_fields() == raw, raw
    assert batch[1].key == "customer-1" and batch[1]._grant == 7
    assert batch[2].event_id == "ev-1" and dict(batch[2].headers) == {"h": "1"}
    assert [m._error is not None for m in batch] == [
        False, False, False, True, True, False, False, True, False, True, True,
    ]  # fmt: skip
    assert (batch[0].published_at, batch[5].published_at) == (1718000000000, 5)
    assert type(batch[0].published_at) is int


def test_a_message_changed_later_keeps_the_change_to_itself() -> None:
    reader: Any = _Reader()
    a, b = messages_from_entries([(b"1-0", ENTRIES[0]), (b"1-1", ENTRIES[0])], "s", "s/0@0", reader)
    a.due = 5.0
    a._failures = 2
    assert (b.due, b._failures) == (0.0, 0)
    assert (Message.due, Message._failures) == (0.0, 0)
