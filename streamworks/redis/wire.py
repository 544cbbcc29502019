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
from dataclasses import dataclass
from typing import Any

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

__all__ = (
    "Atomic",
    "Command",
    "TransactionNotAtomic",
    "call",
    "fold_replies",
    "pack",
    "pack_command",
    "run_batch",
    "run_batch_wait",
)

Arg = bytes | str | int


@dataclass(frozen=True, slots=True)
class Atomic:
    """Commands run as one ``MULTI`` … ``EXEC`` transaction, as one item of a batch.

    Its reply (:func:`fold_replies`) is one of three things, and they must not be
    confused, because the commands are pipelined behind the ``MULTI``:

    * the list of its commands' replies: it ran, as one step; a command that failed
      while running (a script error, ``NOGROUP``) has its error reply in place, as its
      :class:`ResponseError`, and the others ran all the same;
    * an error: Redis refused it before running any of it (a command queued with an
      error, ``MOVED``/``TRYAGAIN`` on a cluster, ``EXECABORT``);
    * a :class:`TransactionNotAtomic`: the ``MULTI`` itself was refused (``NOPERM``: a
      user without ``+multi``), so Redis ran every command behind it *one by one, as it
      arrived*, outside any transaction, and the ``EXEC`` failed afterwards.

    On a cluster it is routed by its first command's key: every key of a transaction
    must be in one slot.
    """

    commands: tuple[Sequence[Arg], ...]


class TransactionNotAtomic(ResponseError):
    """The ``MULTI`` of an :class:`Atomic` was refused, and the commands sent behind it
    ran one by one, outside any transaction: some may have done their work (an
    ``XREADGROUP`` took entries) while others failed. Never "nothing ran".

    Attributes:
        refusal: why ``MULTI`` was refused (a ``NoPermissionError`` for ``NOPERM``).
        replies: each command's own reply, in order (an error reply in place).
    """

    def __init__(self, refusal: BaseException, replies: list[Any]) -> None:
        super().__init__(
            f"MULTI refused ({refusal}): the {len(replies)} command(s) of the transaction "
            "ran one by one, not atomically"
        )
        self.refusal = refusal
        self.replies = replies


#: An item of a batch: a plain command, or a transaction.
Command = Sequence[Arg] | Atomic


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


def pack_command(command: Command) -> tuple[bytes, int]:
    """An item of a batch as RESP, and the number of replies it gets."""
    if isinstance(command, Atomic):
        parts = [pack(("MULTI",)), *[pack(c) for c in command.commands], pack(("EXEC",))]
        return b"".join(parts), len(parts)
    return pack(command), 1


def fold_replies(command: Command, replies: list[Any]) -> Any:
    """The reply of an item of a batch from the raw replies :func:`pack_command` said
    it gets: a transaction's ``EXEC`` reply, why none of it ran, or a
    :class:`TransactionNotAtomic` when its ``MULTI`` was refused (see :class:`Atomic`)."""
    if type(command) is not Atomic:
        return replies[0]
    begun, executed = replies[0], replies[-1]
    if isinstance(begun, Exception):
        # Not in a transaction: each command behind the refused MULTI ran on its own
        # and answered for itself (not QUEUED); the EXEC then failed ("without MULTI",
        # or refused itself). Saying "none of it ran" here would be false.
        return TransactionNotAtomic(begun, list(replies[1:-1]))
    if isinstance(executed, Exception):  # refused as a whole: none of it ran
        queued = next((r for r in replies[1:-1] if isinstance(r, Exception)), None)
        return queued if queued is not None else executed
    return executed


async def run_batch(
    redis: Any, commands: Sequence[Command], *, tryagain: int | None = None
) -> list[Any]:
    """Run ``commands`` in one round trip; one reply per command, in order. An error
    reply is returned as its :class:`ResponseError` (the caller decides).

    Args:
        tryagain: on a cluster, how many ``TRYAGAIN`` replies (a slot migration under
            way) to follow per command before returning the error (default: many).
    """
    if not commands:
        return []
    if type(redis) is not Redis:
        return (await _other_batch(redis, commands, None, tryagain))[0]
    return (await _single_batch(redis, commands, None))[0]


async def run_batch_wait(
    redis: Any, commands: Sequence[Command], replicas: int, timeout_ms: int
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
    redis: Any,
    commands: Sequence[Command],
    wait: tuple[int, int] | None,
    tryagain: int | None = None,
) -> tuple[list[Any], list[Any]]:
    from streamworks.redis.client import WaitingRedisCluster

    if type(redis) in (RedisCluster, WaitingRedisCluster):
        from streamworks.redis.cluster import (  # imports wire: a cycle
            MAX_REDIRECTS,
            run_cluster_batch,
        )

        limit = MAX_REDIRECTS if tryagain is None else tryagain
        return await run_cluster_batch(redis, commands, wait=wait, tryagain=limit)
    # Anything else (a subclass of redis-py's clients, e.g. one recording what it sends,
    # or a pipeline-capable stand-in): its pipeline, as for a single server.
    pipe = redis.pipeline(transaction=False)
    counts = []
    for command in commands:
        items: list[Sequence[Arg]] = (
            [("MULTI",), *command.commands, ("EXEC",)] if isinstance(command, Atomic) else [command]
        )
        for item in items:
            pipe.execute_command(*item)
        counts.append(len(items))
    if wait is not None:
        pipe.execute_command("WAIT", *wait)
    raw = list(await pipe.execute(raise_on_error=False))
    replies, position = [], 0
    for command, count in zip(commands, counts, strict=True):
        replies.append(fold_replies(command, raw[position : position + count]))
        position += count
    if wait is None:
        return replies, [None] * len(commands)
    return replies, [raw[-1]] * len(commands)  # the WAIT's reply, after every command


async def _single_batch(
    redis: Redis, commands: Sequence[Command], wait: tuple[int, int] | None
) -> tuple[list[Any], list[Any]]:
    pool = redis.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    packed, counts = [], []
    atomic = False
    for command in commands:
        if isinstance(command, Atomic):
            data, count = pack_command(command)
            atomic = True
        else:
            data, count = pack(command), 1
        packed.append(data)
        counts.append(count)
    if wait is not None:
        packed.append(pack(["WAIT", *wait]))
        counts.append(1)
    try:
        await connection.send_packed_command(b"".join(packed))
        raw: list[Any] = []
        for _ in range(sum(counts)):
            try:
                raw.append(await connection.read_response())
            except ResponseError as e:  # an error reply; the connection stays in sync
                raw.append(e)
    except BaseException:
        await _discard(pool, connection)
        raise
    await pool.release(connection)
    if atomic:
        replies, position = [], 0
        for command, count in zip(commands, counts, strict=False):
            replies.append(fold_replies(command, raw[position : position + count]))
            position += count
        if wait is not None:
            replies.append(raw[-1])
    else:
        replies = raw
    if wait is None:
        return replies, [None] * len(commands)
    return replies[:-1], [replies[-1]] * len(commands)


async def call(redis: Any, args: Command) -> Any:
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
