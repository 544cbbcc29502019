"""Waiting for new entries on the idle shards of a worker: one connection per node.

The first ``worker.own_waits`` idle shards (8 by default) wait on a pooled connection
each, with their fenced read queued behind the wait (``runtime/reader.py``): the
lowest latency, for a worker with few shards. Every other idle shard waits here.

A shard reader whose fenced read found nothing asks the worker's :class:`IdleWaiter`
to wake it when its stream has an entry after the last one it saw
(:meth:`IdleWaiter.wait`). The waiter only *waits*: it reads with a plain ``XREAD``
(no group), which cannot take entries from anybody, and the woken reader then runs
its fenced read as usual (the ``read_gate.lua`` transaction, checked against the owner
fence under a valid lease). A spurious wake-up costs one fenced read; a missed one
cannot happen, because every wait names the last entry id the reader saw.

Per Redis node the waiter holds **one dedicated connection**, whatever the number of
idle shards:

* **a single server**: one ``XREAD BLOCK`` over every idle shard of the worker. When
  a reader joins while it is out, ``CLIENT UNBLOCK`` (from a pooled connection) cuts
  it short so the next one includes the newcomer. Without the permission
  (an ACL user created before streamworks granted ``CLIENT ID``/``CLIENT UNBLOCK``),
  the waits are cut to ``_FALLBACK_BLOCK`` instead, so a newcomer joins that soon.
* **a Redis Cluster**: a multi-key ``XREAD`` must keep its keys in one slot, and every
  shard has its own slot, so the waiter *polls* instead: every ``idle_poll`` seconds,
  one pipelined write of one non-blocking ``XREAD`` per idle shard on the node. An
  idle shard's first entry is thus seen up to ``idle_poll`` late; the cost is one
  cheap command per idle shard per poll.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import RedisCluster
from redis.exceptions import RedisError, ResponseError

from streamworks.redis.redis_py import reload_slot_map
from streamworks.redis.wire import call, pack

__all__ = ("IdleWaiter",)

log = logging.getLogger("streamworks.waiter")

#: Longest ``XREAD BLOCK`` (s) when the waiter cannot ``CLIENT UNBLOCK`` its own waits.
_FALLBACK_BLOCK = 0.1
#: ``CLIENT UNBLOCK`` attempts while the wait is not blocked on the server yet.
_UNBLOCK_TRIES = 20


@dataclass(slots=True)
class _Waiting:
    after: bytes
    woken: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _Node:
    """The waits on one node, and its loop's state."""

    name: str
    connection_factory: Any
    waiting: dict[bytes, _Waiting] = field(default_factory=dict)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    connection: Any = None
    client_id: int | None = None  # of the dedicated connection, for CLIENT UNBLOCK
    can_unblock: bool = True
    blocked: bool = False

    def wake_all(self) -> None:
        for waiting in self.waiting.values():
            waiting.woken.set()


class IdleWaiter:
    """The worker's waits for new entries (see the module docstring).

    Args:
        redis: the worker's client (a single server or a cluster).
        block: longest single wait (s), ``WorkerSettings.block``.
        idle_poll: poll period (s) on a cluster.
        own_waits: how many idle shards may instead wait on a connection of their
            own, with the fenced read queued behind the wait (``reader.py``): the
            lowest latency for a worker with few shards, one pooled connection each.
    """

    def __init__(
        self, redis: Any, *, block: float, idle_poll: float = 0.05, own_waits: int = 0
    ) -> None:
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._block_ms = max(1, int(block * 1000))
        self._idle_poll = idle_poll
        self._nodes: dict[str, _Node] = {}
        self._own_waits = own_waits
        self._own = 0
        self._tg: TaskGroup | None = None
        self.wakeups = 0

    def take_own_wait(self) -> bool:
        """Whether a reader may wait on its own connection (see ``own_waits``); if
        so, it calls :meth:`release_own_wait` when its wait ends."""
        if self._own >= self._own_waits:
            return False
        self._own += 1
        return True

    def release_own_wait(self) -> None:
        self._own -= 1

    def statistics(self) -> dict[str, int]:
        """Nodes with a wait connection, idle shards waited on here, own waits out,
        wake-ups so far."""
        return {
            "nodes": sum(1 for n in self._nodes.values() if n.connection is not None),
            "waiting": sum(len(n.waiting) for n in self._nodes.values()),
            "own": self._own,
            "wakeups": self.wakeups,
        }

    async def run(self) -> None:
        """Run the per-node loops (started as shards go idle); cancel to stop."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await anyio.sleep_forever()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                for node in self._nodes.values():
                    await _close(node)
            self._nodes.clear()

    async def wait(self, key: str, after: bytes, timeout: float) -> bool:
        """Wait until ``key`` has an entry after ``after``, at most ``timeout`` s.

        Returns:
            True when woken (new entries, or the wait failed and the reader should look
            itself), False on timeout. Cancel to interrupt (a lost lease).
        """
        node = self._node_for(key)
        if node is None:  # not running (a reader driven without a worker loop)
            # Real time, as the XREAD BLOCK it stands in for; a lost lease cancels it.
            await anyio.sleep(timeout)  # noqa: TID251
            return False
        name = key.encode()
        waiting = _Waiting(after)
        node.waiting[name] = waiting
        node.joined.set()
        try:
            with anyio.move_on_after(timeout):
                await waiting.woken.wait()
                return True
            return False
        finally:
            if node.waiting.get(name) is waiting:
                del node.waiting[name]

    # -- nodes ---------------------------------------------------------------------------
    def _node_for(self, key: str) -> _Node | None:
        if self._tg is None:
            return None
        if self._cluster:
            from streamworks.redis.cluster import node_for_key  # imports wire: a cycle

            cluster_node = node_for_key(self._redis, key)
            name = cluster_node.name
            factory: Any = lambda n=cluster_node: n.connection_class(**n.connection_kwargs)  # noqa: E731
        else:
            name = ""
            pool = self._redis.connection_pool
            factory = lambda p=pool: p.connection_class(**p.connection_kwargs)  # noqa: E731
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node(name, factory)
            self._tg.start_soon(self._run_node, node)
        return node

    async def _run_node(self, node: _Node) -> None:
        errors = 0
        while True:
            if not node.waiting:
                node.joined.clear()
                await node.joined.wait()
                continue
            try:
                if self._cluster:
                    await self._poll(node)
                else:
                    await self._block(node)
                errors = 0
            except (RedisError, OSError) as e:
                # The readers look themselves (their fenced reads report the trouble).
                node.wake_all()
                await _close(node)
                errors += 1
                delay = min(2.0, 0.05 * 2 ** min(errors, 6))
                log.warning("idle wait on %s failed (%s); retrying in %.2fs", node.name, e, delay)
                await anyio.sleep(delay)  # noqa: TID251 -- backoff against Redis, real time

    async def _connect(self, node: _Node) -> Any:
        if node.connection is None:
            connection = node.connection_factory()
            await connection.connect()
            node.connection = connection
            if not self._cluster and node.can_unblock:
                await connection.send_packed_command(pack(["CLIENT", "ID"]))
                try:
                    node.client_id = int(await connection.read_response())
                except ResponseError as e:
                    node.can_unblock = False
                    log.warning(
                        "cannot CLIENT ID/UNBLOCK (%s): idle shards join a wait up to "
                        "%.0f ms late; grant the worker user +client|id +client|unblock",
                        e,
                        _FALLBACK_BLOCK * 1000,
                    )
        return node.connection

    async def _block(self, node: _Node) -> None:
        """One ``XREAD BLOCK`` over every idle shard of the node."""
        connection = await self._connect(node)
        node.joined.clear()
        keys = list(node.waiting)
        if not keys:  # every reader left while connecting
            return
        ids = [node.waiting[k].after for k in keys]
        block_ms = self._block_ms if node.can_unblock else int(_FALLBACK_BLOCK * 1000)
        await connection.send_packed_command(
            pack(["XREAD", "BLOCK", block_ms, "COUNT", 1, "STREAMS", *keys, *ids])
        )
        outcome: list[Any] = []
        try:
            async with anyio.create_task_group() as tg:
                if node.can_unblock:
                    tg.start_soon(self._unblock_on_join, node)
                try:
                    outcome.append(await connection.read_response())
                except (RedisError, OSError) as e:  # raised below, out of the task group
                    outcome.append(e)
                tg.cancel_scope.cancel()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _close(node)  # a reply may still come on this connection
            raise
        reply = outcome[0]
        if isinstance(reply, Exception):
            if not isinstance(reply, ResponseError):
                with anyio.CancelScope(shield=True):
                    await _close(node)
            raise reply
        streams = reply.keys() if isinstance(reply, dict) else [s[0] for s in reply or ()]
        for key in streams:
            self._wake(node, key)

    async def _unblock_on_join(self, node: _Node) -> None:
        await node.joined.wait()
        # The XREAD was written before this task started, but the server may take the
        # UNBLOCK (another connection) first: 0 means nothing was blocked yet, so again.
        for _ in range(_UNBLOCK_TRIES):
            if node.client_id is None:
                return
            try:
                if await call(self._redis, ["CLIENT", "UNBLOCK", node.client_id]):
                    return
            except ResponseError as e:  # NOPERM: fall back to short waits
                node.can_unblock = False
                log.warning("cannot CLIENT UNBLOCK (%s): idle waits capped", e)
                return
            except (RedisError, OSError):
                return  # the wait ends by its timeout; the newcomer joins the next one
            await anyio.sleep(0.001)  # noqa: TID251 -- a yield to Redis, real time

    async def _poll(self, node: _Node) -> None:
        """One pipelined round of non-blocking ``XREAD`` over the node's idle shards."""
        connection = await self._connect(node)
        keys = list(node.waiting)
        if not keys:
            return
        packed = [pack(["XREAD", "COUNT", 1, "STREAMS", k, node.waiting[k].after]) for k in keys]
        try:
            await connection.send_packed_command(b"".join(packed))
            replies: list[Any] = []
            for _ in keys:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as e:  # MOVED/ASK: the reader's own read follows it
                    replies.append(e)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _close(node)
            raise
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, ResponseError):
                reload_slot_map(self._redis)  # the slot moved: reload the map
                self._wake(node, key)
            elif reply:
                self._wake(node, key)
        await anyio.sleep(self._idle_poll)  # noqa: TID251 -- a Redis poll period, real time

    def _wake(self, node: _Node, key: bytes) -> None:
        waiting = node.waiting.get(key)
        if waiting is not None and not waiting.woken.is_set():
            waiting.woken.set()
            self.wakeups += 1


async def _close(node: _Node) -> None:
    connection, node.connection, node.client_id = node.connection, None, None
    if connection is not None:
        try:
            await connection.disconnect()
        except (RedisError, OSError):
            pass
