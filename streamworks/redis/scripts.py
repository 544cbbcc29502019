"""Registry of the Lua scripts in ``streamworks/redis/lua``.

Scripts are read with :mod:`importlib.resources` and registered once per client;
redis-py's script objects call ``EVALSHA`` and reload on ``NOSCRIPT``. Every key a
script touches is passed in ``KEYS`` (built by :class:`~streamworks.redis.keyspace.Keyspace`),
never assembled inside Lua, so each script stays within one Cluster slot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from redis.asyncio import RedisCluster
from redis.exceptions import NoScriptError

from streamworks.redis.wire import Arg, Atomic, call, run_batch

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ("SCRIPT_NAMES", "ReadStatus", "ScriptCall", "Scripts", "load_script", "script_body")

log = logging.getLogger("streamworks.scripts")

#: One script call of :meth:`Scripts.pipelined`: name, ``KEYS``, ``ARGV``.
ScriptCall = tuple[str, Sequence[Arg], Sequence[Arg]]

#: Every script shipped with streamworks (file name without ``.lua``).
SCRIPT_NAMES = (
    "claim",
    "dead_letter",
    "delay_add",
    "delay_move",
    "fence",
    "group_commit",
    "group_create",
    "group_delta",
    "group_destroy",
    "lease_renew",
    "mutex_release",
    "mutex_renew",
    "prune_consumers",
    "publish_dedup",
    "rate_take",
    "read",
    "read_gate",
    "read_ungate",
    "redeliver",
    "redelivery_done",
    "retire",
    "retry_record",
    "schedule_tick",
    "shard_create",
    "shard_groups",
    "stream_commit",
    "trim",
)


class ReadStatus:
    """The status of :meth:`Scripts.fenced_read` (``read.lua``'s, and one more)."""

    ENTRIES = 1  # new entries, read by the owner
    IDLE = 0  # nothing new: wait for entries after the last entry id
    FENCED = -1  # the fence names another grant: what was read is not to be processed
    RETIRED = -2  # the shard key does not exist
    UNCHECKED = 3  # the read ran, its check failed (the gate's error): claim what it took


def _text(value: Arg) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@cache
def load_script(name: str) -> str:
    """Return the source of ``lua/<name>.lua`` from the installed package."""
    return (resources.files("streamworks.redis") / "lua" / f"{name}.lua").read_text("utf-8")


@cache
def script_body(name: str) -> bytes:
    """``lua/<name>.lua`` without its comment lines: what ``EVAL`` sends on a hot path
    (Redis hashes the body on every call)."""
    lines = [line for line in load_script(name).splitlines() if not line.startswith("--")]
    return "\n".join(lines).encode()


class Scripts:
    """The scripts, registered on one redis-py asyncio client."""

    claim: AsyncScript
    dead_letter: AsyncScript
    delay_add: AsyncScript
    delay_move: AsyncScript
    fence: AsyncScript
    group_commit: AsyncScript
    group_create: AsyncScript
    group_delta: AsyncScript
    group_destroy: AsyncScript
    lease_renew: AsyncScript
    mutex_release: AsyncScript
    mutex_renew: AsyncScript
    prune_consumers: AsyncScript
    publish_dedup: AsyncScript
    rate_take: AsyncScript
    read: AsyncScript
    read_gate: AsyncScript
    read_ungate: AsyncScript
    redeliver: AsyncScript
    redelivery_done: AsyncScript
    retire: AsyncScript
    retry_record: AsyncScript
    schedule_tick: AsyncScript
    shard_create: AsyncScript
    shard_groups: AsyncScript
    stream_commit: AsyncScript
    trim: AsyncScript

    def __init__(self, client: Any) -> None:
        self._client = client
        for name in SCRIPT_NAMES:
            setattr(self, name, client.register_script(load_script(name)))

    @property
    def client(self) -> Any:
        """The Redis client the scripts run on."""
        return self._client

    async def call(self, name: str, keys: list[Arg], args: list[Arg]) -> Any:
        """Run script ``name`` with less per-call work than redis-py's script object
        (hand-packed ``EVALSHA``, see :mod:`streamworks.redis.wire`): for the hot
        paths, such as the fenced read. Loads the script on ``NOSCRIPT`` (a restarted
        or flushed server) and runs it again."""
        script = getattr(self, name)
        command: list[Arg] = ["EVALSHA", script.sha, len(keys), *keys, *args]
        try:
            return await call(self._client, command)
        except NoScriptError:
            await self._client.script_load(script.script)
            return await call(self._client, command)

    async def fenced_read(
        self,
        keys: Sequence[Arg],
        group: Arg,
        consumer: Arg,
        token: Arg,
        count: int,
        *,
        after: Sequence[Arg] | None = None,
        tryagain: int | None = None,
    ) -> tuple[int, Any]:
        """A fenced read of new entries: ``read_gate.lua``, ``XREADGROUP`` and
        ``read_ungate.lua`` in one transaction (see the gate), the entries straight
        from ``XREADGROUP``.

        Args:
            keys: the shard stream, the group's owner fence on it, the shard's hold key.
            after: a command to send first on the same connection (``XREAD BLOCK``):
                Redis runs the read the moment it returns.
            tryagain: on a cluster, ``TRYAGAIN`` replies to follow before raising
                (:func:`~streamworks.redis.wire.run_batch`).

        Returns:
            ``(status, value)``: a :class:`ReadStatus`, with the entries (``ENTRIES``),
            the last entry id (``IDLE``) or the current fence (``FENCED``).

        Raises:
            TransactionNotAtomic: ``MULTI`` was refused (the user lacks ``+multi``): the
                gate, the read and the ungate ran one by one, unchecked; what the read
                took is in this consumer's pending list (claim it, fenced).
            TryAgainError: a Redis Cluster slot migration of the shard is under way:
                the transaction (three keys, the hold key never existing outside one)
                is refused until it ends; none of it ran. :meth:`plain_read` serves.
            ResponseError: the transaction was refused (none of it ran), or the group
                is missing on the shard (``NOGROUP``).
        """
        stream, fence, hold = keys
        read = Atomic(
            (
                ("EVAL", script_body("read_gate"), 3, stream, fence, hold, token),
                ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", stream, ">"),
                ("EVAL", script_body("read_ungate"), 2, stream, hold),
            )
        )
        if after is None:
            [reply] = await run_batch(self._client, [read], tryagain=tryagain)
        else:
            waited, reply = await run_batch(self._client, [after, read], tryagain=tryagain)
            if isinstance(waited, Exception):
                raise waited
        if isinstance(reply, Exception):
            raise reply
        verdict, entries, _ = reply
        if isinstance(verdict, Exception):
            # The gate failed (a bug, a server fault, a user without +rename) while the
            # transaction ran: the read ran unchecked. It is not processed; a (fenced)
            # takeover round claims what it took. The caller counts it.
            log.error(
                "fenced read gate failed on %s, the read ran unchecked: %s", _text(stream), verdict
            )
            return ReadStatus.UNCHECKED, verdict
        status = int(verdict[0])
        if status < 0:
            return status, verdict[1] if len(verdict) > 1 else None
        if isinstance(entries, Exception):
            raise entries
        if entries is None:
            return ReadStatus.IDLE, verdict[1]
        # RESP3 answers a map of stream -> entries, RESP2 a list of [stream, entries].
        found = next(iter(entries.values())) if type(entries) is dict else entries[0][1]
        return ReadStatus.ENTRIES, found

    async def plain_read(
        self,
        keys: Sequence[Arg],
        group: Arg,
        consumer: Arg,
        token: Arg,
        count: int,
        *,
        after: Sequence[Arg] | None = None,
    ) -> tuple[int, Any]:
        """The same fenced read as :meth:`fenced_read`, as one script (``read.lua``, the
        entries through Lua: more work for the server) on two keys that always exist,
        the stream and its fence: what serves a shard whose slot a Redis Cluster
        migration is moving, where the transaction gets ``TRYAGAIN`` throughout. It
        still gets ``TRYAGAIN`` while the two keys are on different nodes.

        Args:
            keys: as :meth:`fenced_read` (the hold key is not used).
            after: as :meth:`fenced_read`.
        """
        stream, fence = keys[0], keys[1]
        script_keys: list[Arg] = [stream, fence]
        args: list[Arg] = [group, consumer, token, count]
        if after is None:
            reply = await self.call("read", script_keys, args)
        else:
            reply = await self.call_after(list(after), "read", script_keys, args)
        status = int(reply[0])
        if status == 1:
            return ReadStatus.ENTRIES, reply[1]
        if status == 0:
            return ReadStatus.IDLE, reply[1]
        return status, reply[1] if len(reply) > 1 else None

    async def call_many(
        self, name: str, calls: Sequence[tuple[list[Arg], list[Arg]]], *, chunk: int = 1000
    ) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)`` in ``calls``, ``chunk`` calls per
        round trip (a shard per call: thousands of shards cost a few round trips, not
        one each); the replies in order. Calls refused with ``NOSCRIPT`` (they did not
        run) are run again after loading the script; any other error reply raises."""
        script = getattr(self, name)
        replies: list[Any] = []
        for start in range(0, len(calls), chunk):
            commands: list[list[Arg]] = [
                ["EVALSHA", script.sha, len(keys), *keys, *args]
                for keys, args in calls[start : start + chunk]
            ]
            batch = await run_batch(self._client, commands)
            retry = [j for j, r in enumerate(batch) if isinstance(r, NoScriptError)]
            if retry:
                await self._client.script_load(script.script)
                again = await run_batch(self._client, [commands[j] for j in retry])
                for j, reply in zip(retry, again, strict=True):
                    batch[j] = reply
            for reply in batch:
                if isinstance(reply, Exception):
                    raise reply
            replies += batch
        return replies

    async def call_after(
        self, first: list[Arg], name: str, keys: list[Arg], args: list[Arg]
    ) -> Any:
        """Send ``first`` (a blocking command, such as ``XREAD BLOCK``) and script
        ``name`` in one write on one connection and return the script's reply: Redis
        runs the script the moment ``first`` returns, with no round trip between."""
        script = getattr(self, name)
        waited, reply = await run_batch(
            self._client, [first, ["EVALSHA", script.sha, len(keys), *keys, *args]]
        )
        if isinstance(waited, Exception):
            raise waited
        if isinstance(reply, NoScriptError):
            return await self.call(name, keys, args)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def pipelined(
        self, calls: Sequence[ScriptCall], *, raise_on_error: bool = True
    ) -> list[Any]:
        """Run script ``calls`` in one pipeline (on a cluster: one per node, in
        parallel) and return their replies in order.

        On a single node redis-py's pipeline loads missing scripts before sending. Its
        cluster pipeline does not, so a node that restarted or was promoted answers
        ``NOSCRIPT``: those calls (they did not run) are sent again after loading their
        scripts on every master.

        Args:
            calls: ``(name, keys, args)`` per call.
            raise_on_error: raise the first error reply (else it is returned in place).
        """
        if not calls:
            return []
        if not isinstance(self._client, RedisCluster):
            pipe = self._client.pipeline(transaction=False)
            for name, keys, args in calls:
                await getattr(self, name)(keys=list(keys), args=list(args), client=pipe)
            return list(await pipe.execute(raise_on_error=raise_on_error))
        replies = await self._cluster_pipeline(calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            for name in sorted({calls[i][0] for i in missing}):
                await self._client.script_load(getattr(self, name).script)
            again = await self._cluster_pipeline([calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    async def _cluster_pipeline(self, calls: Sequence[ScriptCall]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.execute_command("EVALSHA", getattr(self, name).sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))
