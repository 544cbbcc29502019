"""The hand-packed batch path (``streamworks.redis.wire``) against a real server."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.wire import pack, run_batch


@given(
    st.sampled_from(["XADD", "XACK", "HDEL", "SET"]),
    st.lists(st.one_of(st.binary(max_size=64), st.text(max_size=32), st.integers()), max_size=12),
)
def test_pack_matches_redis_py(command: str, args: list[Any]) -> None:
    # (redis-py splits its first argument on spaces, as a command name; ours are names.)
    expected = b"".join(Connection().pack_command(command, *args))
    assert pack([command, *args]) == expected


async def test_a_batch_returns_one_reply_per_command_in_order(
    redis: Any, keyspace: Keyspace
) -> None:
    key = f"{keyspace.prefix}:wire"
    replies = await run_batch(
        redis,
        [
            ["XADD", key, "*", "v", b"\x00\xff"],
            ["XLEN", key],
            ["HSET", key, "f", "v"],  # WRONGTYPE: an error reply in the middle
            ["XADD", key, "NOMKSTREAM", "*", "v", "2"],
            ["XADD", f"{key}:missing", "NOMKSTREAM", "*", "v", "3"],
        ],
    )
    assert isinstance(replies[0], bytes) and replies[1] == 1
    assert isinstance(replies[2], ResponseError) and "WRONGTYPE" in str(replies[2])
    assert isinstance(replies[3], bytes)
    assert replies[4] is None  # NOMKSTREAM on a missing key: nil, nothing created
    # The connection went back to the pool in sync: the next command reads its own reply.
    assert await redis.xlen(key) == 2
    assert not await redis.exists(f"{key}:missing")


async def test_a_cancelled_batch_does_not_leave_replies_on_a_pooled_connection(
    redis: Any, keyspace: Keyspace
) -> None:
    # Both keys in one slot: on a cluster, the later commands reuse the same node's pool.
    key = f"{{{keyspace.prefix}:wire}}:block"
    echo = f"{{{keyspace.prefix}:wire}}:echo"
    with anyio.move_on_after(0.05):
        # A blocking read that will not be answered in time, then cancelled mid-read.
        await run_batch(redis, [["XREAD", "BLOCK", "2000", "STREAMS", key, "$"]])
    for n in range(20):
        [reply] = await run_batch(redis, [["SET", echo, f"m{n}", "GET"]])
        assert reply == (f"m{n - 1}".encode() if n else None)


async def test_empty_batch_is_a_no_op(redis: Any) -> None:
    assert await run_batch(redis, []) == []


@pytest.mark.parametrize("value", [0, -1, 2**63])
def test_pack_encodes_integers_as_decimal_text(value: int) -> None:
    assert pack(["SET", "k", value]).endswith(f"${len(str(value))}\r\n{value}\r\n".encode())
