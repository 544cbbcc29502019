"""Stream entries a broken or foreign producer can write with ``XADD``: malformed
envelopes, unknown format versions, fields of the wrong type, binary garbage, huge
headers, payloads over the 64 MiB limit (docs/reliability.md, docs/security.md).

Every case ends as a dead letter with reason ``poison`` and the cause (never retried),
or is handled as documented; the worker keeps running, and good messages published
afterwards are all handled (``wait_idle`` succeeds). Envelope cases use a ``bytes``
handler, so nothing but the envelope is judged. ``tests/runtime/test_retry_dlq.py``
has the first few poison cases; these extend them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from streamworks import App, Message
from streamworks.protocol.envelope import MAX_PAYLOAD
from streamworks.testing import TestRuntime
from tests.badinput.support import dead_by_origin, entry, xadd_raw

GARBAGE = bytes(range(256))[::-1]  # every byte value, high ones first: never UTF-8

#: (label, the entry's fields, a fragment of the dead letter's error)
POISON: list[tuple[str, list[Any], str]] = [
    # format versions
    *(
        (f"format version {v!r}", ["v", b"x", "t", "1", "f", v], "unknown entry format version")
        for v in (b"2", b"0", b"", b"1.0", b"01", b" 1", b"1\n", b"1\x00", b"\xff", b"v1")
    ),
    ("no format version", ["v", b"x", "t", "1"], "unknown entry format version None"),
    ("field names in upper case", ["V", b"x", "T", "1", "F", "1"], "format version None"),
    ("binary garbage field names", [GARBAGE, b"x", b"\x00", b"1"], "format version None"),
    (
        "every field binary garbage",
        ["v", GARBAGE, "t", GARBAGE, "f", GARBAGE, "k", GARBAGE, "e", GARBAGE, "h", GARBAGE],
        "unknown entry format version",
    ),
    # the payload
    ("no payload field", ["f", "1", "t", "1", "k", "a"], "no 'v' (payload) field"),
    # the publish time: a number where a decimal integer is expected
    *(
        (f"time {t[:12]!r}", ["v", b"x", "t", t, "f", "1"], "malformed entry field")
        for t in (b"1.5", b"", b"0x10", b"1e3", b"9" * 5000, GARBAGE, "١٢٣".encode())
    ),
    ("time not an integer, any order", ["f", "1", "t", b"1.5", "v", b"x"], "malformed entry"),
    # partition key and event id: text expected
    ("key overlong UTF-8", entry(b"x", k=b"\xc0\xaf"), "malformed entry field"),
    ("key encoded surrogate", entry(b"x", k=b"\xed\xa0\x80"), "malformed entry field"),
    ("key binary garbage", entry(b"x", k=GARBAGE), "malformed entry field"),
    ("event id not UTF-8", entry(b"x", e=b"\xff"), "malformed entry field"),
    ("event id truncated UTF-8", entry(b"x", e=b"\xe2\x82"), "malformed entry field"),
    # headers: a JSON object of strings expected
    *(
        (f"headers {h!r}", entry(b"x", h=h), "headers must be a JSON object of strings")
        for h in (
            "null",
            '"text"',
            "123",
            "true",
            "[]",
            '{"a": 1}',
            '{"a": null}',
            '{"a": {"b": "c"}}',
            '{"a": ["x"]}',
            '{"a": "b", "n": 1.5}',
        )
    ),
    *(
        (f"headers {h[:20]!r}", entry(b"x", h=h), "headers are not valid JSON")
        for h in (
            b"",
            GARBAGE,
            b"{'a': 'b'}",
            b'{"a": "b"} trailing',
            b'{"a": "\\ud800"}',
            b'{"a": NaN}',
            b"[" * 100_000,
            b'{"a":' * 2_000 + b'"x"' + b"}" * 2_000,
        )
    ),
]

HUGE_HEADERS = {f"h{i}": "x" * 1000 for i in range(8000)}  # 8 MB of valid headers

#: (label, fields, check of the handled message): entries that are not poison.
ACCEPTED: list[tuple[str, list[Any], Callable[[Message], bool]]] = [
    (
        "fields in another order",
        ["f", "1", "k", "K", "v", b"p", "t", "5"],
        lambda m: (m.payload, m.key, m.published_at) == (b"p", "K", 5),
    ),
    ("an unknown extra field", entry(b"p", x=b"y"), lambda m: m.payload == b"p"),
    ("no publish time", ["v", b"p", "f", "1"], lambda m: m.published_at == 0),
    ("empty headers object", entry(b"p", h="{}"), lambda m: dict(m.headers) == {}),
    ("unicode key", entry(b"p", k="ключ🔑"), lambda m: m.key == "ключ🔑"),
    ("empty key", entry(b"p", k=""), lambda m: m.key == ""),
    ("a field given twice: the last wins", [*entry(b"p", k="a"), "k", "b"], lambda m: m.key == "b"),
    ("empty payload", entry(b""), lambda m: m.payload == b""),
    ("binary payload", entry(GARBAGE), lambda m: m.payload == GARBAGE),
    (
        "8 MB of headers",
        entry(b"p", h=orjson.dumps(HUGE_HEADERS)),
        lambda m: dict(m.headers) == HUGE_HEADERS,
    ),
]


def _as_bytes(fields: list[Any]) -> dict[bytes, bytes]:
    def b(x: str | bytes) -> bytes:
        return x.encode() if isinstance(x, str) else x

    return {b(n): b(v) for n, v in zip(fields[::2], fields[1::2], strict=True)}


def _raw_app() -> tuple[App, dict[str, Message]]:
    app = App("badinput")
    app.stream("raw", shards=1)
    seen: dict[str, Message] = {}

    @app.handler("raw")
    async def handle(payload: bytes, msg: Message) -> None:
        assert msg.id not in seen, "handled twice"
        seen[msg.id] = msg

    return app, seen


async def _publish_good(app: App, n: int) -> list[str]:
    return [
        (await app.publish("raw", f"good-{i}".encode(), key=f"k{i % 3}")).entry_id for i in range(n)
    ]


async def test_malformed_entries_are_dead_lettered_with_their_reason(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, seen = _raw_app()
    async with streamworks_runtime(app) as rt:
        poison = {
            await xadd_raw(rt, "raw", fields): (label, fields, why) for label, fields, why in POISON
        }
        accepted = {
            await xadd_raw(rt, "raw", fields): (label, check) for label, fields, check in ACCEPTED
        }
        good = await _publish_good(app, 20)
        await rt.wait_idle(timeout=20)

        dead = await dead_by_origin(rt, "raw")
        assert set(dead) == set(poison), sorted(
            label for i, (label, _, _) in poison.items() if i not in dead
        )
        for entry_id, (label, fields, why) in poison.items():
            d = dead[entry_id]
            assert (d.reason, d.attempts) == ("poison", 0), label  # never retried
            assert why in d.error, (label, d.error)
            assert (d.stream, d.shard) == ("raw", "raw/0@0"), label
            assert d.original == _as_bytes(fields), label  # the original fields, verbatim
        assert set(seen) == set(accepted) | set(good)
        for entry_id, (label, check) in accepted.items():
            assert check(seen[entry_id]), label
        stats = rt.statistics("raw")
        assert stats["poison"] == stats["dead_lettered"] == len(POISON)
        assert stats["handled"] == len(ACCEPTED) + len(good)
        assert stats["failed"] == 0  # a poison entry is no failed attempt
        assert [w for w in rt.workers if w.readers] == rt.workers  # still reading


async def test_poison_entries_between_good_ones_hold_nothing_back(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """In key and shard order a poison entry must not block its lane: interleave bad
    entries with keyed good ones on one shard and check every key's order."""
    app = App("badinput")
    app.stream("raw", shards=1)
    order: dict[str, list[int]] = {}

    @app.handler("raw", ordering="shard")
    async def handle(payload: bytes, msg: Message) -> None:
        assert msg.key is not None
        order.setdefault(msg.key, []).append(int(payload))

    async with streamworks_runtime(app) as rt:
        bad = [fields for _, fields, _ in POISON]
        for i in range(60):
            await app.publish("raw", str(i).encode(), key=f"k{i % 4}")
            await xadd_raw(rt, "raw", bad[i % len(bad)])
        await rt.wait_idle(timeout=20)
        assert order == {f"k{k}": list(range(k, 60, 4)) for k in range(4)}
        assert len(await dead_by_origin(rt, "raw")) == 60


async def _proto_max_bulk_len(rt: TestRuntime) -> int:
    try:
        reply = await rt.redis.config_get("proto-max-bulk-len")
    except Exception:  # CONFIG may be renamed or refused on a managed server
        return 512 * 1024 * 1024  # the default of Redis >= 4 and Valkey
    return int(next(iter(reply.values())))


async def test_payloads_over_64_mib_are_poison_and_64_mib_is_handled(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A 65 MiB payload written with XADD: Redis and Valkey accept it (their
    ``proto-max-bulk-len`` is 512 MiB by default), the runtime refuses it (docs/security.md:
    payloads over 64 MiB are refused) — on the fast path (``v t f`` first) and the
    field-by-field path alike — while exactly 64 MiB is handled."""
    app = App("badinput")
    app.stream("raw", shards=1)
    sizes: dict[str, int] = {}

    @app.handler("raw")
    def handle(payload: bytes, msg: Message) -> None:  # sync: a thread gets 64 MiB
        sizes[msg.id] = len(payload)

    async with streamworks_runtime(app) as rt:
        limit = await _proto_max_bulk_len(rt)
        over = 65 * 1024 * 1024
        if limit < over + 1024:  # pragma: no cover - only on a server configured lower
            pytest.skip(f"this server refuses bulk strings over {limit} bytes")
        big = b"\x00\xff" * (over // 2)
        digest = hashlib.sha256(big).hexdigest()
        fast = await xadd_raw(rt, "raw", entry(big))
        slow = await xadd_raw(rt, "raw", ["f", "1", "h", '{"a": "b"}', "v", big, "k", "x"])
        del big
        exact = await xadd_raw(rt, "raw", entry(b"y" * MAX_PAYLOAD, k="x"))
        good = await _publish_good(app, 3)
        await rt.wait_idle(timeout=60)

        dead = await dead_by_origin(rt, "raw")
        assert set(dead) == {fast, slow}
        for d in dead.values():
            assert d.reason == "poison" and d.attempts == 0
            assert f"payload of {over} bytes exceeds {MAX_PAYLOAD}" in d.error
            assert hashlib.sha256(d.original[b"v"]).hexdigest() == digest
        assert sizes == {exact: MAX_PAYLOAD, **{g: len(b"good-0") for g in good}}
