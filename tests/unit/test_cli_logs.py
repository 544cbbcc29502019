"""``--log-format json``: one JSON object per record with the contextual fields."""

from __future__ import annotations

import logging
import sys

import orjson

from streamworks.cli.logs import ContextFilter, JsonFormatter


def record(message: str, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("streamworks.test")
    rec = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, (), None)
    for name, value in extra.items():
        setattr(rec, name, value)
    return rec


def test_json_lines_carry_level_logger_message_and_extra_fields() -> None:
    rec = record("dead-lettered", shard="orders/3@0", entry_id="1-0", stream="orders")
    ContextFilter(group="billing", member="m1").filter(rec)
    doc = orjson.loads(JsonFormatter().format(rec))
    assert doc["level"] == "WARNING" and doc["logger"] == "streamworks.test"
    assert doc["message"] == "dead-lettered"
    assert {k: doc[k] for k in ("group", "member", "stream", "shard", "entry_id")} == {
        "group": "billing",
        "member": "m1",
        "stream": "orders",
        "shard": "orders/3@0",
        "entry_id": "1-0",
    }
    assert "args" not in doc and "msg" not in doc  # no LogRecord internals


def test_a_field_the_record_has_wins_over_the_filter_and_exceptions_are_kept() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info()
        )
    rec.group = "other"
    ContextFilter(group="billing").filter(rec)
    doc = orjson.loads(JsonFormatter().format(rec))
    assert doc["group"] == "other" and doc["message"] == "failed here"
    assert "ValueError: boom" in doc["exception"]
    unencodable = record("x", thing=object())
    assert "object object" in orjson.loads(JsonFormatter().format(unencodable))["thing"]
