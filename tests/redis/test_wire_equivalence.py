"""``redis/wire.py`` packs RESP by hand for the hot paths (publish batches, ack flushes,
the fenced read, the idle wait). Here it meets redis-py's own packer: byte for byte on
any arguments of the types it takes, and reply for reply on a real server, where the
same commands sent through ``run_batch`` and through redis-py's ``send_command`` on a
connection of the same pool must get the same replies (errors included)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from streamworks.redis.wire import Arg, Atomic, Command, pack, pack_command, run_batch
from streamworks.settings import Settings

_PACKER = Connection()  # never connected: only its pack_command is used

NAMES = st.sampled_from(["SET", "XADD", "EVALSHA", "HSET", "XACK", "client"])
ARGS = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100),  # any unicode, encoded as UTF-8 by both
    st.integers(min_value=-(2**63), max_value=2**64),
)


def _redis_py(args: Sequence[Arg]) -> bytes:
    return b"".join(_PACKER.pack_command(*args))


@given(NAMES, st.lists(ARGS, max_size=12))
def test_pack_is_byte_for_byte_redis_pys_packing(name: str, args: list[Arg]) -> None:
    command = [name, *args]
    assert pack(command) == _redis_py(command)


@pytest.mark.parametrize("size", [0, 1, 5_999, 6_000, 6_001, 1_000_000])
def test_large_values_are_packed_alike(size: int) -> None:
    """redis-py sends values above its buffer cutoff as separate chunks; the bytes on
    the wire are the same."""
    command: list[Arg] = ["SET", "k", b"\x00\r\n" * (size // 3) + b"x" * (size % 3)]
    assert pack(command) == _redis_py(command)


def test_a_transaction_is_packed_as_multi_commands_exec() -> None:
    data, replies = pack_command(Atomic((("INCR", "n"), ("GET", "n"))))
    assert replies == 4
    parts = (("MULTI",), ("INCR", "n"), ("GET", "n"), ("EXEC",))
    assert data == b"".join(_redis_py(c) for c in parts)


def _scenario(tag: str) -> list[Command]:
    """Commands of every reply type (status, bulk, integer, array, nil, error, nested
    arrays, a transaction), arguments of every type the packer takes."""
    k, n, s, h, big = (f"{{{tag}}}:{name}" for name in ("k", "n", "s", "h", "big"))
    return [
        ("SET", k, "välue ✓"),
        ("GET", k),
        ("APPEND", k, b""),
        ("SET", n, 12345),
        ("INCRBY", n, -7),
        ("INCRBY", n, 2**62),
        ("GET", n),
        ("GET", f"{{{tag}}}:missing"),
        ("XADD", s, "1-1", "v", bytes(range(256)), "k", ""),
        ("XADD", s, "2-1", "emoji", "😀"),
        ("XRANGE", s, "-", "+"),
        ("XLEN", s),
        ("HSET", h, "f1", b"\x00\r\n$*", "f2", 0),
        ("HGETALL", h),
        ("LPUSH", k, "x"),  # WRONGTYPE
        ("XADD", s, "1-0", "late", "1"),  # an id below the top: an error reply
        ("EVAL", "return {ARGV[1], tonumber(ARGV[2]) + 1, {KEYS[1], false}}", 1, k, "ä", 41),
        ("SET", big, b"x\r\n" * 40_000),
        ("STRLEN", big),
        Atomic((("INCR", n), ("GET", n), ("XLEN", s))),
        Atomic((("INCR", n), ("LPUSH", k, "y"), ("GET", n))),  # ran; one command failed
        ("NOSUCHCOMMAND", k),
    ]


@asynccontextmanager
async def _connection(redis: Any, key: str) -> AsyncIterator[Any]:
    """A pooled connection of ``redis`` to the node serving ``key``."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key)
        connection = node.acquire_connection()
        try:
            yield connection
        finally:
            node.release(connection)
        return
    connection = await redis.connection_pool.get_connection()
    try:
        yield connection
    finally:
        await redis.connection_pool.release(connection)


async def _by_redis_py(redis: Any, commands: list[Command], key: str) -> list[Any]:
    """Each command sent with redis-py's packer, its raw reply read (no callbacks)."""
    replies: list[Any] = []
    async with _connection(redis, key) as connection:
        for command in commands:
            items = (
                [("MULTI",), *command.commands, ("EXEC",)]
                if isinstance(command, Atomic)
                else [command]
            )
            raw = []
            for item in items:
                await connection.send_command(*item)
                try:
                    raw.append(await connection.read_response())
                except ResponseError as e:
                    raw.append(e)
            replies.append(raw[-1])
    return replies


def _comparable(reply: Any) -> Any:
    if isinstance(reply, Exception):
        return (type(reply).__name__, str(reply))
    if isinstance(reply, list | tuple):
        return [_comparable(r) for r in reply]
    if isinstance(reply, dict):
        return {_comparable(k): _comparable(v) for k, v in reply.items()}
    return reply


@pytest.mark.cluster
async def test_run_batch_gets_the_replies_redis_pys_packing_gets(
    redis: Any, settings: Settings
) -> None:
    tag = f"{settings.key_prefix}:wire"
    commands = _scenario(tag)
    keys = [f"{{{tag}}}:{name}" for name in ("k", "n", "s", "h", "big")]
    # The hand-packed roads: _single_batch for exactly a Redis, cluster.py for a cluster.
    assert type(redis) is Redis or isinstance(redis, RedisCluster), type(redis)

    by_hand = await run_batch(redis, commands)
    await redis.delete(*keys)
    by_redis_py = await _by_redis_py(redis, commands, keys[0])
    await redis.delete(*keys)

    assert [_comparable(r) for r in by_hand] == [_comparable(r) for r in by_redis_py]
    # The scenario reached every kind of reply (so equal is not equally empty).
    assert by_hand[1] == "välue ✓".encode()
    assert by_hand[7] is None
    assert isinstance(by_hand[14], ResponseError) and "WRONGTYPE" in str(by_hand[14])
    assert by_hand[18] == 120_000
    assert isinstance(by_hand[-2][1], ResponseError)  # inside EXEC, in place
    assert isinstance(by_hand[-1], ResponseError)
