from __future__ import annotations

from typing import Any


async def test_server_answers(redis: Any) -> None:
    assert await redis.ping()
