"""Stream metadata in Redis: loads cached by revision, compare-and-set commits, and the
shard keys found for a stream. A part of :class:`~streamworks.coordinator.store.Store`
(see its docstring for the layout and what a revision is)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.history import stream_committed
from streamworks.coordinator.leases import revision_of, split_revision
from streamworks.exceptions import CoordinatorError
from streamworks.protocol import history
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import ScriptCall

__all__ = ("StreamOps",)


class StreamOps:
    """The stream operations of the store (``redis``, ``keyspace``, the stream cache,
    the fail-closed error, commit ids and waited runs are the store's own)."""

    redis: Any
    keyspace: Keyspace
    _streams: dict[str, tuple[int, StreamMeta]]

    def unavailable(self, message: str) -> CoordinatorError:
        raise NotImplementedError

    def _new_cid(self) -> int:
        raise NotImplementedError

    async def run_waited(self, name: str, keys: list[Any], args: list[Any], what: str) -> Any:
        raise NotImplementedError

    async def run_waited_many(self, calls: Sequence[ScriptCall], what: str) -> list[Any]:
        raise NotImplementedError

    def cached_stream(self, name: str) -> tuple[int, StreamMeta] | None:
        return self._streams.get(name)

    async def stream_revs(self, names: Iterable[str]) -> dict[str, int]:
        names = list(names)
        if not names:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self.keyspace.stream_meta(name), ["rev", "cid"])
        replies = await pipe.execute()
        return {n: revision_of(*r) for n, r in zip(names, replies, strict=True)}

    async def load_streams(self, names: Iterable[str]) -> dict[str, tuple[int, StreamMeta | None]]:
        """Load stream metadata (cached by revision). A stream that never existed maps
        to ``(0, None)``.

        Raises:
            MetadataUnavailable: a registered stream's metadata is missing or corrupt.
        """
        revs = await self.stream_revs(names)
        out: dict[str, tuple[int, StreamMeta | None]] = {}
        for name, rev in revs.items():
            if rev == 0 and await self.redis.sismember(self.keyspace.registry_streams(), name):
                # Registered: re-read the revision (created between our two reads?).
                key = self.keyspace.stream_meta(name)
                rev = revision_of(*await self.redis.hmget(key, ["rev", "cid"]))
            if rev == 0:
                if await self.redis.sismember(self.keyspace.registry_streams(), name):
                    raise self.unavailable(
                        f"stream {name!r} is registered but its metadata is missing; an "
                        "operator must re-initialise it (streamworks admin reinit stream)"
                    )
                out[name] = (0, None)
                continue
            cached = self._streams.get(name)
            if cached is not None and cached[0] == rev:
                out[name] = cached
                continue
            raw_rev, raw_cid, doc = await self.redis.hmget(
                self.keyspace.stream_meta(name), ["rev", "cid", "doc"]
            )
            try:
                meta = StreamMeta.from_dict(orjson.loads(doc))
                loaded = (revision_of(int(raw_rev), raw_cid), meta)
            except (TypeError, ValueError, orjson.JSONDecodeError) as e:
                raise self.unavailable(f"stream {name!r} metadata is corrupt: {e}") from e
            self._streams[name] = loaded
            out[name] = loaded
        return out

    async def load_stream(self, name: str) -> tuple[int, StreamMeta | None]:
        return (await self.load_streams([name]))[name]

    async def commit_stream(self, rev: int, meta: StreamMeta) -> int | None:
        """CAS-write a stream's metadata; the new rev, or None on conflict."""
        expected, expected_cid = split_revision(rev)
        cid = self._new_cid()
        sent = history.now()  # None unless a history is recorded
        reply = await self.run_waited(
            "stream_commit",
            [self.keyspace.stream_meta(meta.name), self.keyspace.registry_streams()],
            [expected, expected_cid, cid, meta.name, orjson.dumps(meta.to_dict())],
            f"committing stream {meta.name!r}",
        )
        if reply[0] != 1:
            self._streams.pop(meta.name, None)
            return None
        new_rev = revision_of(int(reply[1]), cid)
        stream_committed(meta, new_rev, sent)
        self._streams[meta.name] = (new_rev, meta)
        return new_rev

    async def registered_streams(self) -> list[str]:
        return sorted(
            m.decode() for m in await self.redis.smembers(self.keyspace.registry_streams())
        )

    async def existing_shard_keys(self, stream: str) -> list[str]:
        """Shard keys of ``stream`` present in Redis (data-plane evidence that the
        stream existed; a SCAN, used only when creating or re-initialising)."""
        pattern = self.keyspace.stream_pattern(stream)
        return sorted([k.decode() async for k in self.redis.scan_iter(match=pattern, count=1000)])

    async def existing_shards(self, stream: str) -> list[ShardId]:
        """The shards of :meth:`existing_shard_keys`, parsed."""
        return [self.keyspace.shard_of(k) for k in await self.existing_shard_keys(stream)]

    async def entries_added(self, shard: ShardId) -> int:
        """How many entries the shard's stream ever received (``XINFO STREAM``); an
        answer without the field counts as written (1), so nothing is taken as fresh
        on a guess."""
        info = await self.redis.xinfo_stream(self.keyspace.stream(shard))
        return int(info.get("entries-added", 1))

    async def create_shard_keys(
        self, shards: Iterable[ShardId], groups: Sequence[str], *, provisional: bool
    ) -> int:
        """``provision.create_shards`` with every node's write waiting for its replicas
        (raises :class:`~streamworks.coordinator.replication.NotReplicated` when too few
        acknowledged): a scale-out activates shards only once their keys cannot be lost
        to a failover. Returns how many keys were created (existing ones are kept)."""
        mode = "provisional" if provisional else "sealed"
        calls: list[ScriptCall] = [
            (
                "shard_create",
                [self.keyspace.stream(s), self.keyspace.shard_groups(s)],
                [mode, *groups],
            )
            for s in shards
        ]
        replies = await self.run_waited_many(calls, "creating shard keys")
        return sum(int(reply) for reply in replies)
