"""Dead letters written at most once per (group, shard, entry id), and only by the owner.

Dead-lettering a message takes three steps, each safe to repeat after a crash:

1. **record** the final failure in the shard's retry record of the entry — the
   dead-letter entry's fields (JSON, behind :data:`FINAL`) in place of the
   ``<attempts>:<due ms>`` record — with ``retry_record.lua``, which checks the
   shard's owner fence in the shard's slot (as the fenced read does). A member that
   lost the shard is refused and writes nothing further: no retry record, no
   dead-letter entry. Every retry record (attempt counts, due times, run counters) is
   written through the same fenced script.
2. **write** the dead-letter entry with ``dead_letter.lua``: a marker (source key and
   entry id) in the group's marker set of the dead-letter stream
   (:meth:`Keyspace.dead_letter_markers`, in that stream's slot) is checked and added in
   the same script as the ``XADD``, so a second write of the same entry writes nothing.
   Markers are kept :data:`MARKER_TTL_MS` and then dropped; the set is one key per
   dead-letter stream (docs/dlq.md: what it costs).
3. **ack** the entry (its retry record is deleted with the ack).

An owner that crashes between 1 and 3 leaves the entry pending with its final
record; the next owner claims it with the record (``claim.lua``), does not run the
handler again (no extra attempt), and completes steps 2 and 3 with the recorded
fields: exactly one dead-letter entry, written by an owner.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError

from streamworks.redis.scripts import load_script
from streamworks.redis.wire import Arg, run_batch_wait

if TYPE_CHECKING:
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts
    from streamworks.runtime.message import Message
    from streamworks.runtime.reader import ShardReader

__all__ = (
    "FINAL",
    "DeadLetters",
    "Fields",
    "Written",
    "fenced_count_run",
    "fenced_retry_record",
    "original_fields",
    "parse_final",
)

log = logging.getLogger("streamworks.handler")

#: A retry record that starts with this holds a recorded final failure.
FINAL = b"dlq:"
#: How long a dead-letter marker lives (ms): far longer than an entry stays pending
#: between its final failure and its ack. Past it, a stale member that recorded the
#: final failure while it owned the shard and was then paused this long could write a
#: second entry.
MARKER_TTL_MS = 7 * 24 * 3600 * 1000

#: A dead-letter entry's fields.
Fields = dict[str | bytes, Any]


class Written(enum.Enum):
    """What :meth:`DeadLetters.write` did."""

    NOW = "now"  # the entry was written by this call
    BEFORE = "before"  # it had been written already (by this member or an earlier owner)
    FENCED = "fenced"  # this member no longer owns the shard: nothing was written
    FAILED = "failed"  # Redis trouble: try again later


def original_fields(raw: Any) -> Fields:
    """The entry's own fields, each under ``o.<name>``, from the raw entry."""
    fields: Fields = {}
    if isinstance(raw, list):
        for i in range(0, len(raw) - 1, 2):
            name = raw[i]
            value = raw[i + 1]
            fields[b"o." + (name if isinstance(name, bytes) else str(name).encode())] = (
                value if isinstance(value, bytes) else str(value).encode()
            )
    return fields


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


class DeadLetters:
    """The dead-letter writes of one handler in one worker."""

    def __init__(
        self,
        scripts: Scripts,
        keyspace: Keyspace,
        group: str,
        stream: str,
        *,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        self._scripts = scripts
        self._keyspace = keyspace
        self._group = group
        self.key = keyspace.dead_letters(group, stream)
        # A stream with durable publishing (min_replicas) gets durable dead letters: the
        # dead letter lives on its own node, and a failover there right after the write
        # must not lose it while the original's ack survives on the shard's node.
        self._min_replicas = min_replicas
        self._replica_timeout_ms = max(1, int(replica_timeout * 1000))

    async def write(self, message: Message, fields: Fields) -> Written:
        """Record the final failure of ``message`` (fenced), then write its entry once."""
        reader = message._reader
        assert reader is not None
        # Only the decided fields are recorded; the entry's own come back with the
        # claimed entry.
        decided = {_text(k): _text(v) for k, v in fields.items() if not _is_original(k)}
        try:
            written = await fenced_retry_record(
                self._scripts, reader, message._rid, FINAL + orjson.dumps(decided)
            )
        except RedisError as e:
            log.warning("could not record the final failure of %s: %s", message.id, e)
            return Written.FAILED
        if not written:
            return Written.FENCED
        message._retry_record = True
        message._dead_letter = decided
        return await self._append(message, fields)

    async def resume(self, message: Message) -> Written:
        """Complete the dead-lettering recorded for ``message`` (by this member or an
        earlier owner): write its entry unless written already. The handler is not run."""
        recorded = message._dead_letter
        assert recorded is not None
        fields: Fields = original_fields(message._entry_fields())
        fields.update(recorded)
        return await self._append(message, fields)

    async def _append(self, message: Message, fields: Fields) -> Written:
        reader = message._reader
        assert reader is not None
        # Keyed by the key the entry was read from: a shard stream and a redelivery
        # stream of the same shard may hold entries with the same id.
        keyspace = self._keyspace
        keys = [
            keyspace.dead_letter_markers(self._group, message.stream),
            self.key,
            keyspace.dead_letter_marker(self._group, message.stream, reader.stream_key, message.id),
        ]
        member = keyspace.dead_letter_marker_member(reader.stream_key, message.id)
        args: list[Any] = [MARKER_TTL_MS, member]
        for name, value in fields.items():
            args += [name, value]
        try:
            if self._min_replicas:
                reply = await self._durable(keys, args)
            else:
                reply = await self._scripts.dead_letter(keys=keys, args=args)
        except RedisError as e:
            log.warning("dead-letter write of %s failed (%s); will retry", message.id, e)
            return Written.FAILED
        return Written.NOW if int(reply[0]) == 1 else Written.BEFORE

    async def _durable(self, keys: list[str], args: list[Any]) -> Any:
        """``dead_letter.lua`` and ``WAIT`` in one write on one connection (``WAIT``
        counts the replicas that have this connection's writes). A dead letter that
        fewer replicas acknowledged stays written and is logged, not retried (each
        retry would be answered "written before" and wait again for nothing)."""
        command: list[Arg] = ["EVAL", load_script("dead_letter"), len(keys), *keys]
        command += [a if isinstance(a, bytes | str | int) else str(a) for a in args]
        [reply], [waited] = await run_batch_wait(
            self._scripts.client, [command], self._min_replicas, self._replica_timeout_ms
        )
        if isinstance(reply, Exception):
            raise reply
        if not (type(waited) is int and waited >= self._min_replicas):
            log.warning(
                "dead letter in %s acknowledged by %s replica(s), not %d",
                self.key,
                waited,
                self._min_replicas,
            )
        return reply


def parse_final(record: bytes) -> dict[str, str] | None:
    """The recorded dead-letter fields of a final-failure retry record, or None when
    ``record`` is not one (or is unreadable: the entry is then run again)."""
    if not record.startswith(FINAL):
        return None
    try:
        doc = orjson.loads(record[len(FINAL) :])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, Mapping):
        return None
    return {str(k): str(v) for k, v in doc.items()}


def _is_original(name: str | bytes) -> bool:
    return (name if isinstance(name, bytes) else name.encode()).startswith(b"o.")


async def fenced_retry_record(
    scripts: Scripts, reader: ShardReader, field: bytes, value: bytes | str
) -> bool:
    """Write one retry record of the reader's shard if the reader still owns it
    (``retry_record.lua``); False when fenced (nothing written)."""
    reply = await scripts.retry_record(
        keys=[reader.fence_key, reader.retry_key], args=[reader.token, "set", field, value]
    )
    return int(reply[0]) == 1


async def fenced_count_run(scripts: Scripts, reader: ShardReader, field: bytes) -> int | None:
    """Count one run in a retry record if the reader still owns the shard; the new
    count, or None when fenced (nothing written)."""
    reply = await scripts.retry_record(
        keys=[reader.fence_key, reader.retry_key], args=[reader.token, "incr", field, 1]
    )
    return int(reply[1]) if int(reply[0]) == 1 else None
