"""What a handler receives: :class:`Message` (the entry) and :class:`Context`.

A ``Message`` is created once per delivered entry by the shard reader and carries it
all the way to its ack, so it also holds the runtime's private bookkeeping (the
reader it came from, failures so far, when it is due).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamworks.exceptions import DecodeError
from streamworks.protocol.envelope import FORMAT_VERSION, MAX_PAYLOAD, NO_HEADERS, parse_fields

if TYPE_CHECKING:
    from streamworks.runtime.app_view import AppView
    from streamworks.runtime.producer import Published
    from streamworks.runtime.reader import ShardReader

__all__ = ("Context", "Message", "messages_from_entries")


class Message:
    """One stream entry as delivered to a handler.

    Attributes:
        id: the Redis entry id (``"1718000000000-0"``).
        stream: the logical stream name.
        shard: the shard id (``"orders/3@0"``).
        key: the partition key, or None.
        event_id: the producer's event id, or None.
        headers: string headers.
        attempt: 1 on the first delivery, counting every earlier failed attempt,
            including those made by a member that crashed.
        published_at: publish time, ms since the epoch.
        due_at: a delayed message's due time, ms since the epoch (Redis clock); None
            for a message published without ``delay``/``at``.
        payload: the raw payload bytes.
    """

    # The fields every entry sets live in slots; the ones that almost always keep their
    # default are class attributes, so building a message from an entry (the per-message
    # hot path, :func:`messages_from_entries`) writes 8 attributes, not 15. An instance
    # that changes one of them (a retry, a poison entry) gets a ``__dict__`` for it.
    __slots__ = (
        "__dict__",
        "_fields",
        "_grant",
        "_published",
        "_reader",
        "_rid",
        "key",
        "payload",
        "shard",
        "stream",
    )

    #: Monotonic time before which the message must not run (runtime bookkeeping).
    due: float = 0.0
    event_id: str | None = None
    headers: Mapping[str, str] = NO_HEADERS
    _failures: int = 0
    _claimed: bool = False  # taken over from a pending list (maybe run before)
    _retry_record: bool = False  # a retry record exists in Redis for this entry
    _error: str | None = None  # set when the entry is poison
    _dead_letter: dict[str, str] | None = None  # a recorded final failure

    def __init__(
        self,
        id: str | bytes,
        stream: str,
        shard: str,
        payload: bytes,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        published_at: int = 0,
    ) -> None:
        # Kept as the bytes Redis returned: acks and takeover use them as they are.
        self._rid = id if isinstance(id, bytes) else id.encode()
        self.stream = stream
        self.shard = shard
        self.payload = payload
        self.key = key
        if event_id is not None:
            self.event_id = event_id
        if headers is not None:
            self.headers = headers
        self._published: int | bytes = published_at
        self._reader: ShardReader | None = None
        # The raw entry fields (for the DLQ), or _AS_PARSED (messages_from_entries).
        self._fields: list[Any] | _AsParsed | None = None
        self._grant = 0  # the grant epoch it was read under (Context.fencing_token)

    @classmethod
    def _from_entry(
        cls,
        rid: bytes,
        stream: str,
        shard: str,
        reader: ShardReader,
        fields: list[Any],
    ) -> Message:
        """The reader's constructor: one parse of the raw entry, no validation of
        arguments that come straight from Redis. An unparseable entry becomes a
        message carrying its error (a poison message for the DLQ)."""
        message = cls.__new__(cls)
        message._rid = rid
        message.stream = stream
        message.shard = shard
        message._reader = reader
        message._fields = fields
        message._grant = 0 if reader is None else _grant_epoch(reader.token)
        try:
            (
                message.payload,
                message.key,
                event_id,
                headers,
                message._published,
            ) = parse_fields(fields)
        except DecodeError as e:
            message.payload = b""
            message.key = None
            message._published = 0
            message._error = str(e)
            return message
        if event_id is not None:
            message.event_id = event_id
        if headers is not NO_HEADERS:
            message.headers = headers
        return message

    @property
    def id(self) -> str:
        """The Redis entry id."""
        return self._rid.decode()

    def _entry_fields(self) -> list[Any] | None:
        """The entry's raw fields (what its dead letter copies), as Redis returned them."""
        fields = self._fields
        if not isinstance(fields, _AsParsed):
            return fields
        # Exactly the entry's list: the layout v, t, f[, k] with these values (the time
        # kept as its digits, the key decoded from strict UTF-8, which encodes back
        # to the same bytes).
        rebuilt: list[Any] = [b"v", self.payload, b"t", self._published, b"f", FORMAT_VERSION]
        if self.key is not None:
            rebuilt += (b"k", self.key.encode())
        return rebuilt

    @property
    def published_at(self) -> int:
        """Publish time, ms since the epoch."""
        # Kept as the entry's digits until asked for (few handlers do): the hot path
        # only checks that they are digits (messages_from_entries).
        return int(self._published)

    @property
    def due_at(self) -> int | None:
        """A delayed message's due time (ms since the epoch), from its ``d`` field
        (``delay_add.lua``); None for any other message."""
        # Read from the raw fields only when asked: delayed entries carry 'd', which
        # keeps them off the inline layout, so their raw list is kept (_from_entry).
        fields = self._fields
        if not isinstance(fields, list):
            return None
        for i in range(0, len(fields) - 1, 2):
            if fields[i] == b"d":
                value = fields[i + 1]
                return int(value) if isinstance(value, bytes) and value.isdigit() else None
        return None

    @property
    def attempt(self) -> int:
        """1 on the first delivery; failed attempts so far + 1."""
        return self._failures + 1

    def __repr__(self) -> str:
        return f"Message(shard={self.shard!r}, id={self.id!r}, key={self.key!r})"


class _AsParsed:
    """The ``_fields`` of a message whose entry held exactly the fields it carries (the
    layout :func:`messages_from_entries` parses inline): rebuilt when a dead letter
    needs them (:meth:`Message._entry_fields`) instead of being kept. The entry's list
    then dies with the read's reply, and a message in flight is one object the cyclic
    garbage collector tracks, not two: fewer collections, and less promoted to the old
    generation (whose full collections scan the whole heap)."""

    __slots__ = ()


_AS_PARSED = _AsParsed()


def _grant_epoch(token: str) -> int:
    """The epoch of a grant token ``"<epoch>:<member id>"`` (0 if it has none)."""
    head, _, _ = token.partition(":")
    try:
        return int(head)
    except ValueError:
        return 0


#: Longest publish time taken as digits unconverted (ms since the epoch has 13).
_MAX_TIME_DIGITS = 18


def messages_from_entries(
    entries: list[Any], stream: str, shard: str, reader: ShardReader
) -> list[Message]:
    """The messages of a live read's ``[id, fields]`` pairs, in order: the reader's
    per-batch constructor (the consume hot path).

    An entry in the layout :func:`~streamworks.protocol.envelope.encode_fields` writes
    without event id or headers (``v, t, f[, k]``) is parsed inline, with no call per
    entry; any other entry goes through :meth:`Message._from_entry` (the full parser,
    which turns a malformed entry into a poison message). Both give the same message.
    """
    new = Message.__new__
    slow = Message._from_entry
    version = FORMAT_VERSION
    grant = _grant_epoch(reader.token)  # one token for the whole batch
    out: list[Message] = []
    append = out.append
    for rid, raw in entries:
        n = len(raw) if type(raw) is list else 0
        if (
            (n == 8 or n == 6)
            and raw[0] == b"v"
            and raw[2] == b"t"
            and raw[4] == b"f"
            and raw[5] == version
            and type(payload := raw[1]) is bytes
            and len(payload) <= MAX_PAYLOAD
            and (n == 6 or raw[6] == b"k")
            # ASCII digits of a sane length: int() of them cannot fail, so the time is
            # converted only if a handler asks (Message.published_at); anything else
            # (a sign, spaces, a huge number) is the full parser's to judge.
            and type(published := raw[3]) is bytes
            and published.isdigit()
            and len(published) <= _MAX_TIME_DIGITS
        ):
            try:
                key = raw[7].decode() if n == 8 else None
            except (UnicodeDecodeError, AttributeError):
                append(slow(rid, stream, shard, reader, raw))  # the parser says why
                continue
            message = new(Message)
            message._rid = rid
            message.stream = stream
            message.shard = shard
            message._reader = reader
            message._fields = _AS_PARSED  # not the list: see _AsParsed
            message._grant = grant
            message.payload = payload
            message.key = key
            message._published = published
            append(message)
        else:
            append(slow(rid, stream, shard, reader, raw))
    return out


class Context:
    """Per-message context: the message, its idempotency key, a logger, and publishing.

    Attributes:
        value: the decoded value the handler receives (None when it takes none);
            set when the app has middleware, which may replace it.
        fencing_token: the epoch of the grant under which this member read the message
            (an int). Tokens only grow per (group, shard): a shard changes owner only
            with a strictly higher grant epoch, and the owner fence in Redis refuses
            a lower one. A handler whose side effects must not be applied by a member
            that lost the shard (e.g. one paused by SIGSTOP that resumes its run) can
            store the highest token seen per shard next to its data and refuse a write
            with a lower one (``docs/guarantees.md``).
    """

    __slots__ = ("app", "idempotency_key", "logger", "member_id", "message", "value")

    def __init__(
        self,
        app: AppView,
        message: Message,
        logger: logging.LoggerAdapter[Any],
        member_id: str = "",
    ) -> None:
        self.app = app
        self.message = message
        self.logger = logger
        self.member_id = member_id  # the worker (group member) handling the message
        self.idempotency_key: str | None = None
        self.value: Any = None

    @property
    def fencing_token(self) -> int:
        """The grant epoch the message was read under (see the class docstring)."""
        return self.message._grant

    async def publish(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Published:
        """Publish through the app's connection (same routing as ``app.publish``)."""
        return await self.app.publish(stream, value, key=key, event_id=event_id, headers=headers)

    def publish_sync(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Published:
        """:meth:`publish` for a plain ``def`` handler (it runs in a worker thread)."""
        return self.app.publish_sync(stream, value, key=key, event_id=event_id, headers=headers)
