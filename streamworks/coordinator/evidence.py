"""The coordinator's reads of the data plane as evidence: positions, lengths,
reachability — never a message (E24). A part of :class:`~streamworks.coordinator.store.Store`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from streamworks.protocol.control import ShardGroupInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.wire import Command, run_batch

__all__ = ("EvidenceReads",)


class EvidenceReads:
    """Read-only data-plane reads of the store (``redis`` and ``keyspace`` are the
    store's own)."""

    redis: Any
    keyspace: Keyspace

    # -- the data plane, as evidence (positions and drains; never messages, E24) ------
    async def ping(self) -> bool:
        """Whether Redis answers (any error counts as no)."""
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    async def shard_positions(
        self, shards: Sequence[ShardId]
    ) -> list[tuple[int, list[ShardGroupInfo]] | None]:
        """Per shard, its length and each consumer group's ``pending`` and ``lag``
        (``XLEN`` and ``XINFO GROUPS``, in one batch); None where Redis answered an error
        (e.g. the key is gone). The replies are read as the parser built them: redis-py's
        pipeline costs ~10 µs of CPU per command, 8,192 commands for 4,096 shards."""
        if not shards:
            return []
        commands: list[Command] = []
        for shard in shards:
            key = self.keyspace.stream(shard)
            commands += (("XLEN", key), ("XINFO", "GROUPS", key))
        replies = await run_batch(self.redis, commands)
        out: list[tuple[int, list[ShardGroupInfo]] | None] = []
        for j in range(len(shards)):
            length, groups = replies[2 * j], replies[2 * j + 1]
            if isinstance(length, Exception) or isinstance(groups, Exception):
                out.append(None)
                continue
            infos = []
            for g in groups:
                fields = g if isinstance(g, dict) else dict(zip(g[::2], g[1::2], strict=True))
                lag = fields.get(b"lag")
                infos.append(
                    ShardGroupInfo(
                        group=fields[b"name"].decode(),
                        pending=int(fields[b"pending"]),
                        lag=None if lag is None else int(lag),
                    )
                )
            out.append((int(length), infos))
        return out

    # -- delayed messages: counts and the next due time only (never a payload, E24) ---
    async def delayed_counts(
        self, shards: Sequence[ShardId]
    ) -> list[tuple[int, int | None] | None]:
        """Per shard, how many delayed messages wait in its delayed set and the earliest
        due time (ms; None when it holds none): ``ZCARD`` and ``ZRANGE 0 0 WITHSCORES``,
        pipelined. The set holds ids and due times; the payloads are in another key
        the coordinator never reads. None where Redis answered an error."""
        if not shards:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            key = self.keyspace.delayed(shard)
            pipe.zcard(key)
            pipe.zrange(key, 0, 0, withscores=True)
        replies = await pipe.execute(raise_on_error=False)
        out: list[tuple[int, int | None] | None] = []
        for j in range(len(shards)):
            count, head = replies[2 * j], replies[2 * j + 1]
            if isinstance(count, Exception) or isinstance(head, Exception):
                out.append(None)
                continue
            out.append((int(count), int(head[0][1]) if head else None))
        return out

    # -- dead letters: lengths only, for status views (never an entry, E24) ---------------
    async def dead_letter_lengths(
        self, pairs: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], int]:
        """``XLEN`` of the dead-letter stream of each ``(group, stream)`` (0 where there
        is none), pipelined. Lengths only: the coordinator never reads messages."""
        pairs = list(pairs)
        if not pairs:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for group, stream in pairs:
            pipe.xlen(self.keyspace.dead_letters(group, stream))
        replies = await pipe.execute()
        return {pair: int(n) for pair, n in zip(pairs, replies, strict=True)}
