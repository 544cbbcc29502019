"""Payloads against the handler's parameter type (docs/handlers.md "Parameter
injection"): invalid JSON for dict/model/typed handlers, payloads failing pydantic
validation, non-UTF-8 for ``str`` handlers, and what each annotation accepts.

Each payload is written with a valid envelope to one stream per annotation; what the
annotation cannot take is a ``poison`` dead letter with the decoder's reason, never
retried; what it can take reaches the handler decoded exactly as a reference decoder
decodes it. Good messages published afterwards are all handled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, TypeAdapter
from typing_extensions import TypedDict

from streamworks import App, Message
from streamworks.testing import TestRuntime
from tests.badinput.support import dead_by_origin, entry, xadd_raw


class Order(BaseModel):
    id: str
    amount: int


class OrderDict(TypedDict):
    id: str
    amount: int


def _json(data: bytes) -> Any:
    return orjson.loads(data)


#: annotation kind -> (reference decoder, a fragment of the poison reason)
KINDS: dict[str, tuple[Callable[[bytes], Any], str]] = {
    "dict": (_json, "payload"),
    "model": (Order.model_validate_json, "payload does not validate as Order"),
    "typed": (lambda d: TypeAdapter(list[int]).validate_python(_json(d)), "payload"),
    "typeddict": (lambda d: TypeAdapter(OrderDict).validate_python(_json(d)), "payload"),
    "str": (lambda d: d.decode("utf-8"), "payload is not UTF-8 text"),
    "bytes": (lambda d: d, ""),
    "any": (_json, "payload is not valid JSON"),
}
TEXT = {"str", "bytes"}  # every UTF-8 payload is fine for these
ORDER_LIKE = {"dict", "model", "typeddict", "any", *TEXT}

#: (label, payload, the kinds that accept it); every other kind dead-letters it.
PAYLOADS: list[tuple[str, bytes, set[str]]] = [
    ("empty", b"", TEXT),
    ("invalid JSON", b"{not json", TEXT),
    ("JSON null", b"null", {"any", *TEXT}),
    ("JSON list", b"[1, 2]", {"typed", "any", *TEXT}),
    ("an order", b'{"id": "1", "amount": 1}', ORDER_LIKE),
    ("an order failing validation", b'{"id": "1", "amount": "x"}', {"dict", "any", *TEXT}),
    ("an order missing a field", b'{"id": "1"}', {"dict", "any", *TEXT}),
    ("an order of the wrong shape", b'{"id": {"a": 1}, "amount": []}', {"dict", "any", *TEXT}),
    ("a number as text (lax)", b'{"id": "1", "amount": "5"}', ORDER_LIKE),
    ("a float that is an int (lax)", b'{"id": "1", "amount": 1.0}', ORDER_LIKE),
    ("a fractional float", b'{"id": "1", "amount": 1.5}', {"dict", "any", *TEXT}),
    ("an unknown extra field", b'{"id": "1", "amount": 1, "x": 1}', ORDER_LIKE),
    ("a duplicate key: the last wins", b'{"id": "1", "amount": 1, "id": "2"}', ORDER_LIKE),
    ("mixed list (lax)", b'[1, "2", 3.0]', {"typed", "any", *TEXT}),
    ("not UTF-8", b"\xff\xfe{}", {"bytes"}),
    ("invalid UTF-8 inside a JSON string", b'{"id": "\xff", "amount": 1}', {"bytes"}),
    ("an encoded surrogate inside a JSON string", b'{"id": "\xed\xa0\x80"}', {"bytes"}),
    ("a lone surrogate escape", b'{"id": "\\ud800", "amount": 1}', TEXT),
    ("a UTF-8 byte order mark", b'\xef\xbb\xbf{"id": "1", "amount": 1}', TEXT),
    ("NaN", b"NaN", TEXT),
    ("trailing garbage", b'{"id": "1", "amount": 1} x', TEXT),
    ("nested 10 000 deep", b"[" * 10_000 + b"]" * 10_000, TEXT),
    ("an unterminated string", b'{"id": "1', TEXT),
    ("1 MB of JSON string", orjson.dumps({"id": "x" * 1_000_000, "amount": 1}), ORDER_LIKE),
]


def _app() -> tuple[App, dict[str, dict[str, Any]]]:
    app = App("badinput")
    got: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}

    def register(kind: str, handler: Callable[..., Any]) -> None:
        app.stream(kind, shards=1)
        app.handler(kind)(handler)

    def recorder(kind: str) -> Callable[[Any, str], None]:
        def record(value: Any, entry_id: str) -> None:
            assert entry_id not in got[kind], "handled twice"
            got[kind][entry_id] = value

        return record

    rec = {kind: recorder(kind) for kind in KINDS}

    async def on_dict(value: dict, msg: Message) -> None:  # type: ignore[type-arg]  # plain dict
        rec["dict"](value, msg.id)

    async def on_model(value: Order, msg: Message) -> None:
        rec["model"](value, msg.id)

    async def on_typed(value: list[int], msg: Message) -> None:
        rec["typed"](value, msg.id)

    async def on_typeddict(value: OrderDict, msg: Message) -> None:
        rec["typeddict"](value, msg.id)

    def on_str(value: str, msg: Message) -> None:  # sync handlers decode the same way
        rec["str"](value, msg.id)

    def on_bytes(value: bytes, msg: Message) -> None:
        rec["bytes"](value, msg.id)

    async def on_any(value, msg: Message) -> None:  # type: ignore[no-untyped-def]  # no annotation
        rec["any"](value, msg.id)

    for kind, handler in {
        "dict": on_dict,
        "model": on_model,
        "typed": on_typed,
        "typeddict": on_typeddict,
        "str": on_str,
        "bytes": on_bytes,
        "any": on_any,
    }.items():
        register(kind, handler)
    return app, got


async def test_payloads_the_handler_type_cannot_take_are_poison(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, got = _app()
    async with streamworks_runtime(app) as rt:
        written: dict[str, dict[str, tuple[str, bytes, bool]]] = {kind: {} for kind in KINDS}
        for kind in KINDS:
            for label, payload, accepted_by in PAYLOADS:
                entry_id = await xadd_raw(rt, kind, entry(payload))
                written[kind][entry_id] = (label, payload, kind in accepted_by)
        good = {
            kind: (await app.publish(kind, b"[7]" if kind == "typed" else _good(kind))).entry_id
            for kind in KINDS
        }
        await rt.wait_idle(timeout=20)

        for kind, (decode, reason) in KINDS.items():
            dead = await dead_by_origin(rt, kind)
            for entry_id, (label, payload, accepted) in written[kind].items():
                if accepted:
                    assert entry_id not in dead, (kind, label, dead.get(entry_id))
                    assert got[kind][entry_id] == decode(payload), (kind, label)
                else:
                    assert entry_id not in got[kind], (kind, label, "reached the handler")
                    d = dead[entry_id]
                    assert (d.reason, d.attempts) == ("poison", 0), (kind, label)
                    assert reason in d.error, (kind, label, d.error[:300])
                    assert d.original[b"v"] == payload, (kind, label)
            assert good[kind] in got[kind], kind
            stats = rt.statistics(kind)
            assert stats["failed"] == stats["retried"] == 0, kind  # poison is never retried


def _good(kind: str) -> Any:
    if kind == "model":
        return Order(id="good", amount=1)
    if kind in ("str", "bytes"):
        return "good"
    return {"id": "good", "amount": 1}


BIG = 2**64 + 1  # outside what a 64-bit integer holds


async def test_integers_beyond_64_bits_are_never_silently_rounded(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("badinput")
    app.stream("numbers", shards=1)
    got: list[Any] = []

    @app.handler("numbers")
    async def handle(value: dict[str, Any]) -> None:
        got.append(value["n"])

    async with streamworks_runtime(app) as rt:
        await xadd_raw(rt, "numbers", entry(b'{"n": %d}' % BIG))
        await rt.wait_idle()
        dead = await rt.dead_letters("numbers")
        # Exact, or refused as poison: either is honest. A float is neither.
        assert got == [BIG] or (got == [] and len(dead) == 1), (got, dead)


@pytest.mark.parametrize(
    "bad",
    [
        {"headers": {"n": 1}},
        {"headers": {"n": None}},
        {"headers": {"n": {"nested": "x"}}},
        {"key": b"\xff"},
        {"event_id": b"\xff"},
    ],
    ids=["header int", "header null", "header object", "key bytes", "event id bytes"],
)
async def test_the_producer_refuses_what_its_consumers_cannot_read(
    bad: dict[str, Any], streamworks_runtime: Callable[..., TestRuntime]
) -> None:
    app = App("badinput")
    app.stream("s", shards=1)

    @app.handler("s")
    async def handle(value: dict[str, Any]) -> None: ...

    async with streamworks_runtime(app) as rt:
        refused = False
        try:
            await app.publish("s", {"a": 1}, **bad)
        except (TypeError, ValueError):
            refused = True
        await rt.wait_idle()
        assert await rt.dead_letters("s") == []  # nothing unreadable was written
        assert refused
