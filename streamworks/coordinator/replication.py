"""Control-plane writes that wait for Redis replicas (``WAIT``), where there are any.

Redis replicates asynchronously: a master acknowledges a write before any replica has
it, and a failover to a replica that had not received it loses it. For the data plane
that loss is a duplicate delivery at worst; for the control plane it is not: a lost
grant, fence or lease renewal lets a member act on something the coordinator then
forgets (two owners, a fencing token that goes down). So the coordinator's commits
(``group_commit.lua``, ``stream_commit.lua``), owner fences (``fence.lua``), lease
renewals (``lease_renew.lua``) and new shard keys (``shard_create.lua``) end with
``WAIT numreplicas timeout`` **in the same write, on the same connection** (``WAIT``
counts the replicas that acknowledged every earlier write of its connection), and a
write that fewer replicas acknowledged in time is treated as **not done**: nothing is
answered on it (a member gets the retryable ``NOT_REPLICATED`` and asks again; the
write stays on the master, and the retry's own ``WAIT`` covers it), a scale or create
stops before its next step. Its effects are then visible to other coordinator
replicas, which is harmless: every answer they give that a member acts on is itself
made after a write of theirs that waits, and ``WAIT`` covers everything the master
wrote before.

How many replicas (``coordinator.replica_wait``): a number, or by default every
replica of the node that is *in sync* — connected, online, and acknowledged within
``coordinator.replica_max_lag`` seconds (``INFO replication``). A node with no such
replica waits for nothing: on a single server the cost is one ``INFO`` every
``coordinator.replica_check_interval`` seconds, nothing per write. On a cluster the
count is taken per master, since each write waits on the node it went to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.asyncio import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from streamworks.clock import boottime
from streamworks.exceptions import CoordinatorError
from streamworks.redis.cluster import node_for_key
from streamworks.redis.scripts import ScriptCall, Scripts
from streamworks.redis.wire import Arg, run_batch, run_batch_wait

__all__ = ("NotReplicated", "ReplicaWaits", "WaitLog", "in_sync_replicas")

log = logging.getLogger("streamworks.coordinator.replication")

#: The key of a single server's one node in the per-node maps.
_SINGLE = ""

#: Seconds between two log lines saying the replicas cannot be counted.
_REPORT_EVERY = 60.0


class NotReplicated(CoordinatorError):
    """Fewer replicas than required acknowledged a control-plane write in time: it is
    treated as not done (retryable)."""

    def __init__(self, what: str, acked: int, required: int, timeout_ms: int) -> None:
        super().__init__(
            "NOT_REPLICATED",
            f"{what}: acknowledged by {acked} replica(s) of {required} within "
            f"{timeout_ms} ms; not done, retry",
            retryable=True,
            status=503,
        )


def in_sync_replicas(info: Mapping[str, Any], max_lag: float) -> int:
    """Replicas an ``INFO replication`` answer shows online and acknowledging within
    ``max_lag`` seconds (redis-py parses each ``slaveN``/``replicaN`` line into a dict)."""
    count = 0
    for name, value in info.items():
        if not isinstance(value, dict) or not name.startswith(("slave", "replica")):
            continue
        if not name.removeprefix("slave").removeprefix("replica").isdigit():
            continue
        lag = value.get("lag")
        if value.get("state") == "online" and lag is not None and float(lag) <= max_lag:
            count += 1
    return count


@dataclass
class WaitLog:
    """The outcome of the ``WAIT``s of one operation, per node: a later ``WAIT`` on a node
    covers every earlier write to it, so only the node's last one counts."""

    last: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (acked, req)
    timeout_ms: int = 0

    def note(self, node: str, acked: int, required: int) -> None:
        self.last[node] = (acked, required)

    def check(self, what: str) -> None:
        """Raise :class:`NotReplicated` if a node's last ``WAIT`` fell short."""
        for acked, required in self.last.values():
            if acked < required:
                raise NotReplicated(what, acked, required, self.timeout_ms)


class ReplicaWaits:
    """Runs scripts followed by ``WAIT`` on their node, with the node's required count.

    Args:
        redis: the coordinator's client (single server or cluster).
        scripts: the scripts registered on it.
        count: replicas to wait for; None: every replica in sync (per node).
        timeout: seconds a ``WAIT`` may take.
        max_lag: a replica whose last acknowledgement is older is not in sync (s).
        check_interval: how often the replicas are counted again (s).
    """

    def __init__(
        self,
        redis: Any,
        scripts: Scripts,
        *,
        count: int | None = None,
        timeout: float = 1.0,
        max_lag: float = 5.0,
        check_interval: float = 1.0,
    ) -> None:
        self.redis = redis
        self.scripts = scripts
        self.count = count
        self.timeout_ms = max(1, int(timeout * 1000))
        self.max_lag = max_lag
        self.check_interval = check_interval
        self._cluster = isinstance(redis, RedisCluster)
        self._required: dict[str, int] = {}
        self._checked = -float("inf")
        self._refusal_logged = -float("inf")
        self._checking = anyio.Lock()

    def log(self) -> WaitLog:
        """A fresh :class:`WaitLog` for one operation."""
        return WaitLog(timeout_ms=self.timeout_ms)

    async def required(self, node: str) -> int:
        """Replicas a write to ``node`` waits for now."""
        if self.count is not None:
            return self.count
        if boottime() - self._checked >= self.check_interval or (node not in self._required):
            await self._count_replicas()
        return self._required.get(node, 0)

    async def _count_replicas(self) -> None:
        async with self._checking:
            if boottime() - self._checked < self.check_interval / 2:
                return  # counted by another task meanwhile
            try:
                if self._cluster:
                    replies = await self.redis.info(
                        "replication", target_nodes=RedisCluster.PRIMARIES
                    )
                    counted = {n: in_sync_replicas(i, self.max_lag) for n, i in replies.items()}
                else:
                    info = await self.redis.info("replication")
                    counted = {_SINGLE: in_sync_replicas(info, self.max_lag)}
            except ResponseError as e:
                # Refused (an ACL user without INFO): the writes cannot know what to
                # wait for, and go on without waiting. Said loudly, not guessed silently.
                self._checked = boottime()
                if boottime() - self._refusal_logged >= _REPORT_EVERY:
                    self._refusal_logged = boottime()
                    log.error(
                        "cannot count the replicas (INFO replication refused: %s): "
                        "control-plane writes do NOT wait for replicas; grant the "
                        "coordinator's Redis user +info and +wait, or set "
                        "coordinator.replica_wait to a number",
                        e,
                    )
                return
            except RedisError as e:
                # Keep the last count: a node that cannot be asked cannot be written
                # either, and the write's own error says so.
                log.debug("counting replicas failed: %s", e)
                return
            if counted != self._required:
                log.info("replicas in sync per node: %s", counted or "none")
            self._required = counted
            self._checked = boottime()

    def node_of(self, key: Arg) -> str:
        """The node a key's writes go to (its name; one name on a single server)."""
        if not self._cluster:
            return _SINGLE
        return str(node_for_key(self.redis, key if isinstance(key, bytes | str) else str(key)).name)

    async def run(self, name: str, keys: Sequence[Arg], args: Sequence[Arg], waits: WaitLog) -> Any:
        """Run script ``name`` and, where replicas are required, ``WAIT`` on the same
        connection; the outcome goes to ``waits``. Returns the script's reply.

        Raises:
            ResponseError: the script's error reply.
        """
        [reply] = await self.run_many([(name, keys, args)], waits)
        return reply

    async def run_many(self, calls: Sequence[ScriptCall], waits: WaitLog) -> list[Any]:
        """Run script ``calls`` (a pipeline per node, the nodes in parallel), each node's
        write ending with its ``WAIT``; the replies in order, outcomes to ``waits``.

        Raises:
            ResponseError: the first error reply.
        """
        if not calls:
            return []
        by_node: dict[str, list[int]] = {}
        for i, (_, keys, _) in enumerate(calls):
            by_node.setdefault(self.node_of(keys[0]), []).append(i)
        replies: list[Any] = [None] * len(calls)

        async def node(name: str, indexes: list[int]) -> None:
            required = await self.required(name)
            got = await self._run_node([calls[i] for i in indexes], required, name, waits)
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply

        if len(by_node) == 1:
            [(name, indexes)] = by_node.items()
            await node(name, indexes)
        else:
            async with anyio.create_task_group() as tg:
                for name, indexes in by_node.items():
                    tg.start_soon(node, name, indexes)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _run_node(
        self, calls: Sequence[ScriptCall], required: int, node: str, waits: WaitLog
    ) -> list[Any]:
        commands = [_evalsha(self.scripts, c) for c in calls]
        replies, acked = await self._send(commands, required)
        missing = [j for j, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            # A restarted or promoted node lost its script cache: load and run those
            # again (NOSCRIPT means they did not run); their WAIT is the one that counts.
            for name in sorted({calls[j][0] for j in missing}):
                await self.scripts.client.script_load(getattr(self.scripts, name).script)
            again, acked = await self._send([commands[j] for j in missing], required)
            for j, reply in zip(missing, again, strict=True):
                replies[j] = reply
        if required:
            waits.note(node, acked, required)
        return replies

    async def _send(self, commands: list[list[Arg]], required: int) -> tuple[list[Any], int]:
        if not required:
            return await run_batch(self.redis, commands), 0
        replies, waited = await run_batch_wait(self.redis, commands, required, self.timeout_ms)
        acked = waited[-1] if waited else 0
        return replies, acked if type(acked) is int else 0


def _evalsha(scripts: Scripts, call: ScriptCall) -> list[Arg]:
    name, keys, args = call
    return ["EVALSHA", getattr(scripts, name).sha, len(keys), *keys, *args]
