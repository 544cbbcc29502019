"""Log lines about a message carry its group, stream, shard and entry id as fields, so
``--log-format json`` lines can be filtered by them (issue 12)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from streamworks import App, RetryPolicy
from streamworks.cli.logs import JsonFormatter
from streamworks.testing import TestRuntime


async def test_retry_and_dead_letter_lines_name_the_message(
    streamworks_runtime: Callable[..., TestRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    app = App("g")
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.01, max_backoff=0.01))
    async def handle(value: dict[str, Any]) -> None:
        raise RuntimeError("declined")

    caplog.set_level(logging.INFO, logger="streamworks")
    async with streamworks_runtime(app) as rt:
        published = await app.publish("orders", {"n": 1}, key="a")
        await rt.wait_idle()
        [letter] = await rt.dead_letters("orders")
    lines = [
        r
        for r in caplog.records
        if getattr(r, "entry_id", None) == published.entry_id and "failed (attempt" in r.msg
    ]
    dead = [r for r in caplog.records if r.msg.startswith("dead-lettered")]
    assert lines and dead, [r.getMessage() for r in caplog.records]
    for record in (lines[0], dead[0]):
        assert record.group == "g"  # type: ignore[attr-defined]
        assert record.stream == "orders"  # type: ignore[attr-defined]
        assert record.shard == published.shard  # type: ignore[attr-defined]
        assert record.entry_id == published.entry_id  # type: ignore[attr-defined]
        line = JsonFormatter().format(record)
        assert f'"entry_id":"{published.entry_id}"' in line
        assert f'"shard":"{published.shard}"' in line
    assert letter is not None
