"""Dead letters as a library: list, show, replay, delete and purge.

One dead-letter stream per group and stream (``Keyspace.dead_letters``). What
``streamworks dlq`` does and what the coordinator's dashboard does are both calls of
:class:`DeadLetters`, with the same :class:`Selection`:

* **ids** (one or many) and/or **filters** (``reasons``, ``error`` text,
  ``older_than`` / ``newer_than`` seconds, ``limit``); every condition must match;
* a group or stream the namespace does not know, or an id that is not in the
  dead-letter stream, is an :class:`~streamworks.exceptions.UnknownNameError` (a typo
  must not look like an empty table or act on nothing);
* **replay** hands each entry back to its **group only**: its original fields go to
  the group's redelivery stream of the shard its key routes to now (the origin shard
  for an unkeyed one while that is routable), through ``redeliver.lua``, which refuses
  a retired shard; the shard's owner in that group handles it with the same handler,
  in its key's order. Nothing is published to the stream, so another group never sees
  it again; and only the group's own dead-letter and redelivery keys are written, so
  an action on one group's dead letters cannot touch another group's. An entry
  without a payload, or whose key or headers cannot be read, is kept and reported;
  each replayed entry is removed from the dead-letter stream right after its write;
* ``dry_run`` computes the same selection (and, for a replay, each target shard) and
  changes nothing.

Routing comes from any object answering ``routing(stream)`` with a
:class:`~streamworks.protocol.control.RoutingResponse`: the coordinator's HTTP client
(the CLI) or the coordinator service itself (the dashboard). Each answer's namespace
id is checked against this Redis and key prefix (``redis/namespace.py``) exactly as a
producer checks it, so a replay into a Redis nobody reads is refused with the same
one-line error. This module imports neither the coordinator nor the runtime
(``.importlinter``), so both shells can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio.lowlevel
import orjson
from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.dlq.records import (
    DeadLetter,
    DeadLetterStream,
    Kept,
    Replayed,
    ReplayError,
    ReplayResult,
    Selection,
    entry_ms,
    field_text,
)
from streamworks.dlq.routing import ReplayRouting, RoutingAnswers
from streamworks.exceptions import (
    BackendError,
    ConfigurationError,
    ShardRetiredError,
    StreamworksError,
    UnknownNameError,
)
from streamworks.protocol.shards import validate_name
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import NamespaceCheck
from streamworks.redis.scripts import Scripts

__all__ = ("DeadLetters",)

#: Entry fields of the original message kept in a dead letter (as ``o.<name>``).
ORIGINAL_FIELDS = (b"v", b"k", b"e", b"h", b"t", b"f")
_SCAN_BATCH = 500


class DeadLetters:
    """The dead-letter operations on one namespace.

    Args:
        redis: a client of the namespace's Redis.
        keyspace: the namespace's keys.
        routing: who answers routing (needed by :meth:`replay` only).
        namespace: checks each routing answer's namespace id against ``redis``; None
            only where nothing else could be meant (the coordinator's own client).
        where: the routing's address, for messages (``coordinator http://...``).
        clock: wall time of the age filters, monotonic time of routing leases.
        max_reroutes: routing refreshes after a replay hit a retired shard.
    """

    def __init__(
        self,
        redis: Any,
        keyspace: Keyspace,
        *,
        routing: RoutingAnswers | None = None,
        namespace: NamespaceCheck | None = None,
        where: str = "the coordinator",
        clock: Clock | None = None,
        max_reroutes: int = 5,
    ) -> None:
        self.redis = redis
        self.keyspace = keyspace
        self.scripts = Scripts(redis)
        self.clock = clock or Clock()
        self._routing = routing
        self._namespace = namespace
        self._where = where
        self._max_reroutes = max_reroutes

    # -- looking ------------------------------------------------------------------------
    async def streams(self, group: str | None = None) -> list[DeadLetterStream]:
        """Every dead-letter stream of the namespace (or of ``group``), sorted."""
        rows = []
        async for raw in self.redis.scan_iter(
            match=self.keyspace.dead_letters_pattern(), count=1000
        ):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                owner, stream = self.keyspace.dead_letters_of(key)
            except ValueError:
                continue  # not a dead-letter stream (a longer prefix sharing ours)
            if group is not None and owner != group:
                continue
            length = int(await self.redis.xlen(key))
            oldest = await self.redis.xrange(key, count=1)
            rows.append(
                DeadLetterStream(owner, stream, length, entry_ms(oldest[0][0]) if oldest else None)
            )
        return sorted(rows, key=lambda r: (r.group, r.stream))

    async def key(self, group: str, stream: str, *, replay: bool = False) -> str:
        """The group's dead-letter stream of ``stream``.

        Raises:
            ConfigurationError: an invalid name.
            UnknownNameError: the namespace knows no such group or stream, or the group
                does not consume the stream; for a replay, also when it no longer does
                (nothing would read a replayed message).
        """
        validate_name("group", group)
        validate_name("stream", stream)
        keyspace = self.keyspace
        key = keyspace.dead_letters(group, stream)
        subscribed = bool(
            await self.redis.sismember(keyspace.registry_subscriptions(stream), group)
        )
        if await self.redis.exists(key) and (subscribed or not replay):
            return key  # dead letters exist: whatever the registry says, they are real
        where = f"in namespace {keyspace.prefix!r}"
        if not await self.redis.sismember(keyspace.registry_streams(), stream):
            raise UnknownNameError(
                f"unknown stream {stream!r} {where} (see streamworks streams ls)"
            )
        if not await self.redis.sismember(keyspace.registry_groups(), group):
            raise UnknownNameError(f"unknown group {group!r} {where} (see streamworks status)")
        if not subscribed:
            raise UnknownNameError(f"group {group!r} does not consume stream {stream!r} {where}")
        return key

    async def total(self, group: str, stream: str) -> int:
        """Entries in the group's dead-letter stream of ``stream``."""
        return int(await self.redis.xlen(await self.key(group, stream)))

    async def select(self, group: str, stream: str, selection: Selection) -> list[DeadLetter]:
        """The selected entries, oldest first.

        Raises:
            UnknownNameError: see :meth:`key`; or a selected id is not in the stream
                (then nothing is returned: an operation on it does nothing).
        """
        key = await self.key(group, stream)
        return [DeadLetter.parse(i, f) for i, f in await self._select(key, selection)]

    async def _select(
        self, key: str, selection: Selection
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        out: list[tuple[bytes, dict[bytes, bytes]]] = []
        now_ms = self.clock.time_ms()
        low = None if selection.newer_than is None else now_ms - int(selection.newer_than * 1000)
        high = None if selection.older_than is None else now_ms - int(selection.older_than * 1000)
        if selection.ids:
            missing = []
            wanted = list(dict.fromkeys(selection.ids))
            for entry_id, found in zip(wanted, await self._entries(key, wanted), strict=True):
                if not found:
                    missing.append(entry_id)
                    continue
                rid, fields = found[0]
                ms = entry_ms(rid)
                in_age = (low is None or ms >= low) and (high is None or ms <= high)
                if in_age and selection.matches(fields):
                    out.append((rid, fields))
            if missing:
                raise UnknownNameError(
                    f"no dead letter {', '.join(missing)} in {key} (nothing was done)"
                )
            out.sort(key=lambda e: tuple(int(p) for p in e[0].split(b"-")))
            return out[: selection.limit] if selection.limit is not None else out
        cursor = "-" if low is None else str(low)
        top = "+" if high is None else str(high)
        while selection.limit is None or len(out) < selection.limit:
            batch = await self.redis.xrange(key, min=cursor, max=top, count=_SCAN_BATCH)
            if not batch:
                break
            for rid, fields in batch:
                if selection.matches(fields):
                    out.append((rid, fields))
                    if selection.limit is not None and len(out) >= selection.limit:
                        break
            cursor = f"({batch[-1][0].decode()}"
            await anyio.lowlevel.checkpoint()
        return out

    async def _entries(self, key: str, ids: Sequence[str]) -> list[Any]:
        """``XRANGE key id id`` of each id, pipelined in batches (one key: one slot)."""
        found: list[Any] = []
        for i in range(0, len(ids), _SCAN_BATCH):
            async with self.redis.pipeline(transaction=False) as pipe:
                for entry_id in ids[i : i + _SCAN_BATCH]:
                    pipe.xrange(key, min=entry_id, max=entry_id)
                found += await pipe.execute()
        return found

    # -- acting -------------------------------------------------------------------------
    async def replay(
        self,
        group: str,
        stream: str,
        selection: Selection,
        *,
        dry_run: bool = False,
        on_entry: Callable[[], None] | None = None,
    ) -> ReplayResult:
        """Hand the selected dead letters back to ``group`` only (module docstring).

        Raises:
            UnknownNameError: see :meth:`key`.
            NamespaceMismatchError: the routing's namespace is not this Redis's.
            ReplayError: it stopped part way (routing or Redis failed).
        """
        if self._routing is None:
            raise ConfigurationError("a replay needs routing (the coordinator)")
        routing = ReplayRouting(self._routing, self._namespace, self._where, self.clock)
        # Another namespace (or no routing) is refused first: in a Redis nobody reads,
        # "unknown group" would be true and useless.
        await routing.table(stream)
        key = await self.key(group, stream, replay=True)
        entries = await self._select(key, selection)
        result = ReplayResult(group, stream, dry_run)
        for entry_id, fields in entries:
            dlq_id = entry_id.decode()
            try:
                if b"o.v" not in fields:
                    raise ValueError("no original payload")
                key_of = _original_key(fields)
                if dry_run:
                    table = await routing.table(stream)
                    target = table.target(key_of, field_text(fields, "shard"))
                    result.replayed.append(Replayed(dlq_id, str(target)))
                    continue
                shard, redelivery_id = await self._redeliver(routing, group, stream, fields)
            except ConfigurationError:
                raise  # another namespace, a stream gone: as they are, before the rest
            except StreamworksError as e:
                raise ReplayError(e, result, dlq_id) from e
            except (ValueError, TypeError) as e:
                # Poison again if replayed (no payload, an unreadable key or headers):
                # kept in the dead-letter stream and reported.
                result.kept.append(Kept(dlq_id, str(e)))
                continue
            try:
                await self.redis.xdel(key, entry_id)
            except RedisError as e:
                raise ReplayError(BackendError(str(e)), result, dlq_id) from e
            result.replayed.append(Replayed(dlq_id, shard, redelivery_id))
            if on_entry is not None:
                on_entry()
        return result

    async def _redeliver(
        self, routing: ReplayRouting, group: str, stream: str, fields: Mapping[bytes, bytes]
    ) -> tuple[str, str]:
        """Write one entry to the group's redelivery stream of its target shard."""
        args: list[bytes | str] = [group]
        for name in ORIGINAL_FIELDS:
            value = fields.get(b"o." + name)
            if value is not None:
                args += [name, value]
        origin = field_text(fields, "shard")
        key_of = _original_key(fields)
        # Where it came from, for whoever looks at the message (ignored by the decoder).
        args += [b"r.origin", f"{origin} {field_text(fields, 'entry_id')}".encode()]
        for _ in range(self._max_reroutes):
            table = await routing.table(stream)
            shard = table.target(key_of, origin)
            try:
                reply = await self.scripts.redeliver(
                    keys=[self.keyspace.stream(shard), self.keyspace.redelivery(shard, group)],
                    args=args,
                )
            except RedisError as e:
                raise BackendError(f"redelivery to {shard} failed: {e}") from e
            if reply[0] == 1:
                entry = reply[1]
                return str(shard), entry.decode() if isinstance(entry, bytes) else str(entry)
            routing.invalidate(stream)  # retired since the table was issued
        raise ShardRetiredError(
            f"stream {stream!r}: routing still pointed at retired shards after "
            f"{self._max_reroutes} refreshes"
        )

    async def delete(
        self, group: str, stream: str, selection: Selection, *, dry_run: bool = False
    ) -> list[str]:
        """Delete the selected entries (a selection that selects nothing in particular
        is refused: :meth:`purge` deletes everything); their ids.

        Raises:
            ConfigurationError: the selection is not narrowed.
            UnknownNameError: see :meth:`select`.
        """
        if not selection.narrowed:
            raise ConfigurationError(
                "select entries by DLQ_ID or a filter (to delete them all: dlq purge)"
            )
        key = await self.key(group, stream)
        ids = [i for i, _ in await self._select(key, selection)]
        if not dry_run:
            for i in range(0, len(ids), _SCAN_BATCH):
                await self.redis.xdel(key, *ids[i : i + _SCAN_BATCH])
        return [i.decode() for i in ids]

    async def purge(self, group: str, stream: str, *, dry_run: bool = False) -> int:
        """Delete every entry of the group's dead-letter stream; how many there were."""
        key = await self.key(group, stream)
        count = int(await self.redis.xlen(key))
        if not dry_run and count:
            await self.redis.delete(key)
        return count


def _original_key(fields: Mapping[bytes, bytes]) -> str | None:
    """The original key; ValueError when the entry would be poison again (a key or
    event id that is not UTF-8, headers that are not a JSON object of strings)."""
    raw_key = fields.get(b"o.k")
    key = raw_key.decode() if raw_key is not None else None  # UnicodeDecodeError: ValueError
    event_id = fields.get(b"o.e")
    if event_id is not None:
        event_id.decode()
    raw_headers = fields.get(b"o.h")
    if raw_headers is not None:
        headers = orjson.loads(raw_headers)  # orjson.JSONDecodeError is a ValueError
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError("headers are not an object of strings")
    return key
