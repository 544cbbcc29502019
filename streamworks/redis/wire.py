"""Sending batches of plain commands with less per-command work than redis-py.

redis-py encodes every argument of every command through a generic encoder and
wraps each command of a pipeline in bookkeeping. On the hot paths — ``XADD`` of a
publish batch, ``XACK`` of an ack flush — streamworks already holds its arguments
as ``bytes``/``str``, so it writes the RESP request itself and sends a batch on one
pooled connection in one write, then reads one reply per command. A Redis Cluster
client's batch goes out the same way, one write per node (:mod:`streamworks.redis.cluster`
groups the commands by slot owner and follows ``MOVED``/``ASK``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

__all__ = ("call", "pack", "run_batch", "run_batch_wait")

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
    if type(redis) is not Redis:
        return (await _other_batch(redis, commands, None))[0]
    return (await _single_batch(redis, commands, None))[0]


async def run_batch_wait(
    redis: Any, commands: Sequence[Sequence[Arg]], replicas: int, timeout_ms: int
) -> tuple[list[Any], list[Any]]:
    """:func:`run_batch`, each write ending with ``WAIT replicas timeout_ms`` on the same
    connection: ``(replies, waited)``, ``waited[i]`` the number of replicas that
    acknowledged command ``i``'s write (or the ``WAIT``'s error reply)."""
    if not commands:
        return [], []
    if type(redis) is not Redis:
        return await _other_batch(redis, commands, (replicas, timeout_ms))
    return await _single_batch(redis, commands, (replicas, timeout_ms))


async def _other_batch(
    redis: Any, commands: Sequence[Sequence[Arg]], wait: tuple[int, int] | None
) -> tuple[list[Any], list[Any]]:
    from streamworks.redis.client import WaitingRedisCluster

    if type(redis) in (RedisCluster, WaitingRedisCluster):
        from streamworks.redis.cluster import run_cluster_batch  # imports wire: a cycle

        return await run_cluster_batch(redis, commands, wait=wait)
    # Anything else (a subclass of redis-py's clients, e.g. one recording what it sends,
    # or a pipeline-capable stand-in): its pipeline, as for a single server.
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    if wait is not None:
        pipe.execute_command("WAIT", *wait)
    replies = list(await pipe.execute(raise_on_error=False))
    if wait is None:
        return replies, [None] * len(commands)
    return replies[:-1], [replies[-1]] * len(commands)


async def _single_batch(
    redis: Redis, commands: Sequence[Sequence[Arg]], wait: tuple[int, int] | None
) -> tuple[list[Any], list[Any]]:
    pool = redis.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    packed = [pack(c) for c in commands]
    if wait is not None:
        packed.append(pack(["WAIT", *wait]))
    try:
        await connection.send_packed_command(b"".join(packed))
        replies: list[Any] = []
        for _ in packed:
            try:
                replies.append(await connection.read_response())
            except ResponseError as e:  # an error reply; the connection stays in sync
                replies.append(e)
    except BaseException:
        await _discard(pool, connection)
        raise
    await pool.release(connection)
    if wait is None:
        return replies, [None] * len(commands)
    return replies[:-1], [replies[-1]] * len(commands)


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
