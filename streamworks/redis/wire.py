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

import anyio
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
    except BaseException:
        await _discard(pool, connection)
        raise
    await pool.release(connection)
    return replies


async def call(redis: Any, args: Sequence[Arg]) -> Any:
    """One command, as :func:`run_batch` sends it; an error reply raises its
    :class:`ResponseError` (``NoScriptError`` for ``NOSCRIPT``). The reply is the
    parser's, without redis-py's per-command response callbacks."""
    [reply] = await run_batch(redis, [args])
    if isinstance(reply, Exception):
        raise reply
    return reply


async def _discard(pool: Any, connection: Any) -> None:
    """After a timeout, a cancellation or a lost connection, replies may be left unread
    on the socket (or a command queued behind a blocking one): close the connection
    before it goes back to the pool. Shielded, so a cancellation cannot leave it
    half-closed or out of the pool."""
    with anyio.CancelScope(shield=True):
        try:
            await connection.disconnect()
        finally:
            await pool.release(connection)
