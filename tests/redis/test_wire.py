"""The hand-packed batch path (``streamworks.redis.wire``) against a real server."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import NoPermissionError, ResponseError

from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.wire import Atomic, TransactionNotAtomic, pack, run_batch
from streamworks.settings import Settings
from streamworks.testing.acl import with_credentials


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


@pytest.mark.no_cluster("creates a server-wide user on the single server")
async def test_a_refused_multi_is_reported_as_commands_that_ran_one_by_one(
    redis: Any, keyspace: Keyspace, settings: Settings
) -> None:
    """A user without ``+multi``: Redis refuses the ``MULTI`` and then runs each command
    pipelined behind it on its own. The reply must say so (not "refused, none of it
    ran", which is what a refused ``EXEC`` means when the ``MULTI`` was accepted)."""
    user, password = f"sw-test-nomulti-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    key = f"{keyspace.prefix}:atomic"
    await redis.execute_command(
        "ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{keyspace.prefix}:*",
        "+set", "+get", "+exec", "+ping", "+hello", "+select",
    )  # fmt: skip
    client = create_redis(
        settings.with_overrides(redis_url=with_credentials(settings.redis_url, user, password))
    )
    try:
        [reply] = await run_batch(client, [Atomic((("SET", key, "1"), ("GET", key)))])
        assert isinstance(reply, TransactionNotAtomic), reply
        assert isinstance(reply.refusal, NoPermissionError)
        assert reply.replies == [b"OK", b"1"]  # each ran, and answered for itself
        assert await redis.get(key) == b"1"
        # The same transaction as a user who may run it: one step, its replies.
        [reply] = await run_batch(redis, [Atomic((("SET", key, "2"), ("GET", key)))])
        assert reply == [b"OK", b"2"]
    finally:
        await client.aclose()
        await redis.execute_command("ACL", "DELUSER", user)
