"""``app.stream("orders", shards=8)`` on a stream that has 4 shards: the declaration
never rescales, and connecting says so, with the command that does (issue 12)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from streamworks import App
from streamworks.runtime.connection import open_connection
from streamworks.testing import TestRuntime


async def test_a_declaration_that_differs_from_the_stream_warns_how_to_scale(
    streamworks_runtime: Callable[..., TestRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    four = App("g")
    four.stream("orders", shards=4)
    eight = App("g2")
    eight.stream("orders", shards=8)
    async with streamworks_runtime(four, workers=0) as rt:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="streamworks.connection"):
            async with open_connection(
                eight, rt.settings, redis=rt.redis, coordinator=rt.coordinator
            ):
                pass
        [record] = [r for r in caplog.records if "declares" in r.getMessage()]
        message = record.getMessage()
        assert "has 4 shards" in message and "shards=8" in message
        assert "never rescales" in message
        assert "streamworks streams scale orders --shards 8" in message
        assert rt.service is not None
        info = await rt.service.stream_info("orders")
        assert info.shard_count == 4  # unchanged
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="streamworks.connection"):
            async with open_connection(
                four, rt.settings, redis=rt.redis, coordinator=rt.coordinator
            ):
                pass
        assert not [r for r in caplog.records if "declares" in r.getMessage()]
