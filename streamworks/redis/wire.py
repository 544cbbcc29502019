"""Sending batches of plain commands with less per-command work than redis-py.

redis-py encodes every argument of every command through a generic encoder and
wraps each command of a pipeline in bookkeeping. On the hot paths — ``XADD`` of a
publish batch, ``XACK`` of an ack flush — streamworks already holds its arguments
as ``bytes``/``str``, so it writes the RESP request itself and sends a batch on one
pooled connection in one write, then reads one reply per command. A Redis Cluster
client keeps using redis-py's pipeline (it routes commands per node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

__all__ = ("call", "pack", "run_batch")

Arg = bytes | str | int


def pack(args: Sequence[Arg]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if type(arg) is str:
            data = arg.encode()
        elif type(arg) is bytes:
            data = arg
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


async def run_batch(redis: Any, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """Run ``commands`` in one round trip; one reply per command, in order. An error
    reply is returned as its :class:`ResponseError` (the caller decides)."""
    if not commands:
        return []
    if type(redis) is not Redis:  # cluster (or anything else): redis-py's pipeline
        pipe = redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))
    pool = redis.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(b"".join([pack(c) for c in commands]))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as e:  # an error reply; the connection stays in sync
                replies.append(e)
        return replies
    except BaseException:
        # Anything else (timeout, cancellation, lost connection) may leave replies
        # unread on the socket: it must not go back to the pool as is.
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)


async def call(redis: Any, args: Sequence[Arg]) -> Any:
    """One command on a pooled connection, hand-packed; an error reply raises its
    :class:`ResponseError` (``NoScriptError`` for ``NOSCRIPT``). The reply is the
    parser's, without redis-py's per-command response callbacks."""
    if type(redis) is not Redis:
        return await redis.execute_command(*args)
    pool = redis.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(pack(args))
        return await connection.read_response()
    except ResponseError:
        raise  # a complete error reply: the connection stays in sync
    except BaseException:
        await connection.disconnect()  # a reply may be left unread
        raise
    finally:
        await pool.release(connection)
