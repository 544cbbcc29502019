"""Sending batches of commands to a Redis Cluster: one pipelined write per node.

:func:`streamworks.redis.wire.run_batch` hands a cluster client's batches here. Each
command is routed by the slot of its key (redis-py's cluster client keeps the slot →
node map, its ``nodes_manager``); the commands of one node go out in one write on one
of that node's pooled connections, the nodes in parallel, and the replies come back in
the order of the commands.

Redirections are retried, because they mean the command did *not* run:

* ``MOVED`` (the slot lives elsewhere now: a migration finished, a failover): the slot
  map is patched and the command sent to the new owner;
* ``ASK`` (the slot is being migrated and the key is already on the target): the
  command is sent to the target, preceded by ``ASKING``;
* ``TRYAGAIN`` (a multi-key command whose keys are split by a migration in progress)
  and ``CLUSTERDOWN`` (a failover under way): sent again after a short pause, with the
  slot map reloaded.

A connection error is *not* retried: the command may have run and its reply been lost
(re-sending an ``XADD`` would write it twice). The error is raised and the slot map is
reloaded before the next batch, so a promoted replica is found at once.

A batch may end each node's write with ``WAIT numreplicas timeout`` (durable
publishing): the reply of the ``WAIT`` that followed a command on its node's
connection says how many replicas acknowledged every write before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from streamworks.redis.client import _HOLDING
from streamworks.redis.redis_py import reload_slot_map, slot_map_stale
from streamworks.redis.wire import Arg, Atomic, Command, fold_replies, pack, pack_command

__all__ = ("command_key", "node_for_key", "run_cluster_batch")

#: Redirections followed per command before its last error reply is returned.
MAX_REDIRECTS = 16
#: Pause before re-sending after ``TRYAGAIN``/``CLUSTERDOWN`` (seconds, doubling).
_PAUSE = 0.02
_MAX_PAUSE = 0.5


def command_key(command: Command) -> bytes | None:
    """The key a command is routed by, or None for a keyless command.

    ``EVALSHA``/``EVAL``: the first of its ``KEYS``; ``XREAD``/``XREADGROUP``: the
    first stream; a transaction (:class:`~streamworks.redis.wire.Atomic`): its first
    command's; anything else: its first argument (``XADD``, ``XACK``, ``HDEL``...).
    """
    if isinstance(command, Atomic):
        return command_key(command.commands[0])
    name = _text(command[0]).upper()
    if name in ("EVALSHA", "EVAL", "FCALL"):
        return _bytes(command[3]) if int(command[2]) > 0 else None
    if name in ("XREAD", "XREADGROUP"):
        for i, arg in enumerate(command):
            if _text(arg).upper() == "STREAMS":
                return _bytes(command[i + 1])
        return None
    if name in ("WAIT", "PING", "TIME", "CLIENT"):
        return None
    if name == "XINFO":  # XINFO GROUPS|STREAM|CONSUMERS <key>
        return _bytes(command[2])
    return _bytes(command[1])


def node_for_key(cluster: RedisCluster, key: bytes | str) -> ClusterNode:
    """The primary serving ``key``'s slot, per the client's current slot map."""
    return cluster.nodes_manager.get_node_from_slot(key_slot(_bytes(key)))


@dataclass(slots=True)
class _Pending:
    index: int
    node: ClusterNode
    asking: bool = False
    redirects: int = 0
    waits: int = 0  # TRYAGAIN replies followed


@dataclass(slots=True)
class _NodeWrite:
    node: ClusterNode
    items: list[_Pending] = field(default_factory=list)
    replies: list[Any] = field(default_factory=list)
    waited: Any = None
    error: Exception | None = None  # the connection failed: replies unknown


async def run_cluster_batch(
    cluster: RedisCluster,
    commands: Sequence[Command],
    *,
    wait: tuple[int, int] | None = None,
    tryagain: int = MAX_REDIRECTS,
) -> tuple[list[Any], list[Any]]:
    """Run ``commands`` on the cluster, one pipelined write per node per round.

    Args:
        wait: ``(numreplicas, timeout_ms)``: end each node's write with ``WAIT``.
        tryagain: ``TRYAGAIN`` replies followed per command (after a pause) before
            its error is returned: a caller with another way to do the work (the
            fenced read) asks for few, to learn of a slot migration at once.

    Returns:
        ``(replies, waited)``: one reply per command, in order (an error reply as its
        :class:`ResponseError`); with ``wait``, for each command the reply of the
        ``WAIT`` sent after it on its node (an int, or the error), else None.

    Raises:
        ConnectionError, TimeoutError, OSError: a node could not be reached or its
            replies were lost; the commands sent to it may have run (those sent to
            the other nodes did).
    """
    # Like every command of a WaitingRedisCluster (redis/client.py), a batch holds one
    # of its permits (it uses at most one connection per node), so no node's pool is
    # ever exhausted.
    permits: asyncio.Semaphore | None = getattr(cluster, "_permits", None)
    if permits is None or _HOLDING.get():
        return await _run(cluster, commands, wait, tryagain)
    async with permits:
        token = _HOLDING.set(True)
        try:
            return await _run(cluster, commands, wait, tryagain)
        finally:
            _HOLDING.reset(token)


async def _run(
    cluster: RedisCluster,
    commands: Sequence[Command],
    wait: tuple[int, int] | None,
    tryagain: int,
) -> tuple[list[Any], list[Any]]:
    await _refresh_if_needed(cluster)
    replies: list[Any] = [None] * len(commands)
    waited: list[Any] = [None] * len(commands)
    pending = [_Pending(i, _route(cluster, c)) for i, c in enumerate(commands)]
    pause = _PAUSE
    while pending:
        writes: dict[str, _NodeWrite] = {}
        for item in pending:
            write = writes.get(item.node.name)
            if write is None:
                write = writes[item.node.name] = _NodeWrite(item.node)
            write.items.append(item)
        async with anyio.create_task_group() as tg:
            for write in writes.values():
                tg.start_soon(_send, cluster, write, commands, wait)
        failed = next((w.error for w in writes.values() if w.error is not None), None)
        if failed is not None:  # after every node's write ended: the others did run
            raise failed
        again: list[_Pending] = []
        must_pause = reload = False
        for write in writes.values():
            for item, reply in zip(write.items, write.replies, strict=True):
                # ASK: ASKING goes first; before a transaction's MULTI it holds until
                # EXEC (Redis keeps the flag while a client is in MULTI).
                if isinstance(reply, AskError) and item.redirects < MAX_REDIRECTS:
                    item.redirects += 1
                    if isinstance(reply, MovedError):
                        await cluster.nodes_manager.move_slot(reply)
                        item.node, item.asking = _route(cluster, commands[item.index]), False
                    else:
                        item.node, item.asking = _node_at(cluster, reply.host, reply.port), True
                    again.append(item)
                elif isinstance(reply, TryAgainError) and item.waits < tryagain:
                    # Keys split by a slot migration under way: the map is right, wait.
                    item.waits += 1
                    must_pause = True
                    again.append(item)
                elif isinstance(reply, ClusterDownError) and item.redirects < MAX_REDIRECTS:
                    item.redirects += 1
                    must_pause = reload = True
                    again.append(item)
                else:
                    replies[item.index] = reply
                    waited[item.index] = write.waited
        if must_pause:
            if reload:
                reload_slot_map(cluster)  # a failover may be under way: reload the map
            await anyio.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE)
            await _refresh_if_needed(cluster)
            for item in again:
                if not item.asking:
                    item.node = _route(cluster, commands[item.index])
        pending = again
    return replies, waited


async def _send(
    cluster: RedisCluster,
    write: _NodeWrite,
    commands: Sequence[Command],
    wait: tuple[int, int] | None,
) -> None:
    """One write of ``write.items`` (and a trailing ``WAIT``) on one connection."""
    node = write.node
    parts: list[bytes] = []
    expected = 0
    counts: list[int] = []
    for item in write.items:
        if item.asking:
            parts.append(pack(["ASKING"]))
            expected += 1
        data, count = pack_command(commands[item.index])
        parts.append(data)
        counts.append(count)
        expected += count
    if wait is not None:
        parts.append(pack(["WAIT", wait[0], wait[1]]))
        expected += 1
    connection = node.acquire_connection()
    try:
        await connection.send_packed_command(b"".join(parts))
        raw: list[Any] = []
        for _ in range(expected):
            try:
                raw.append(await connection.read_response())
            except ResponseError as e:  # an error reply; the connection stays in sync
                raw.append(e)
    except BaseException as e:
        # Replies may be left unread on the socket: close the connection (shielded, so
        # a cancellation cannot leave it half-closed).
        with anyio.CancelScope(shield=True):
            try:
                await connection.disconnect()
            finally:
                node.release(connection)
        if isinstance(e, Exception):  # raised by run_cluster_batch, not as a group
            # Reload the slot map before the next batch (the node may be gone, its
            # replica promoted). Not after a cancellation (a wait cut short, a worker
            # stopping): nothing is known about the node then, and redis-py's aclose()
            # closes nothing while the reload is pending (its connections would leak).
            reload_slot_map(cluster)
            write.error = e
            return
        raise
    node.release(connection)
    position = 0
    for item, count in zip(write.items, counts, strict=True):
        if item.asking:
            position += 1  # ASKING's +OK
        write.replies.append(fold_replies(commands[item.index], raw[position : position + count]))
        position += count
    if wait is not None:
        write.waited = raw[position]


def _route(cluster: RedisCluster, command: Command) -> ClusterNode:
    key = command_key(command)
    if key is None:
        return cluster.get_default_node()
    return node_for_key(cluster, key)


def _node_at(cluster: RedisCluster, host: str, port: int) -> ClusterNode:
    node = cluster.nodes_manager.get_node(host=host, port=port)
    if node is None:  # a node the map does not know yet: reload, then look again
        reload_slot_map(cluster)
        return cluster.get_default_node()
    return node


async def _refresh_if_needed(cluster: RedisCluster) -> None:
    # redis-py's own flag: set by its commands and by ours after a connection error.
    if slot_map_stale(cluster):
        await cluster.initialize()


def _bytes(value: Arg) -> bytes:
    if type(value) is bytes:
        return value
    return str(value).encode()


def _text(value: Arg) -> str:
    if type(value) is bytes:
        return value.decode()
    return str(value)
