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
from streamworks.protocol.envelope import NO_HEADERS, parse_fields

if TYPE_CHECKING:
    from streamworks.app import App
    from streamworks.runtime.producer import Published
    from streamworks.runtime.reader import ShardReader

__all__ = ("Context", "Message")


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
        payload: the raw payload bytes.
    """

    __slots__ = (
        "_claimed",
        "_dead_letter",
        "_error",
        "_failures",
        "_fields",
        "_grant",
        "_reader",
        "_retry_record",
        "_rid",
        "due",
        "event_id",
        "headers",
        "key",
        "payload",
        "published_at",
        "shard",
        "stream",
    )

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
        self.event_id = event_id
        self.headers: Mapping[str, str] = NO_HEADERS if headers is None else headers
        self.published_at = published_at
        # Runtime bookkeeping.
        self.due = 0.0  # monotonic time before which the message must not run
        self._failures = 0
        self._claimed = False  # taken over from a pending list (maybe run before)
        self._retry_record = False  # a retry record exists in Redis for this entry
        self._dead_letter: dict[str, str] | None = None  # a recorded final failure
        self._reader: ShardReader | None = None
        self._fields: list[Any] | None = None  # raw entry fields (kept for the DLQ)
        self._error: str | None = None  # set when the entry is poison
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
        message.due = 0.0
        message._failures = 0
        message._claimed = False
        message._retry_record = False
        message._grant = _grant_epoch(reader.token)
        message._dead_letter = None
        try:
            (
                message.payload,
                message.key,
                message.event_id,
                message.headers,
                message.published_at,
            ) = parse_fields(fields)
            message._error = None
        except DecodeError as e:
            message.payload = b""
            message.key = message.event_id = None
            message.headers = NO_HEADERS
            message.published_at = 0
            message._error = str(e)
        return message

    @property
    def id(self) -> str:
        """The Redis entry id."""
        return self._rid.decode()

    @property
    def attempt(self) -> int:
        """1 on the first delivery; failed attempts so far + 1."""
        return self._failures + 1

    def __repr__(self) -> str:
        return f"Message(shard={self.shard!r}, id={self.id!r}, key={self.key!r})"


def _grant_epoch(token: str) -> int:
    """The epoch of a grant token ``"<epoch>:<member id>"`` (0 if it has none)."""
    head, _, _ = token.partition(":")
    try:
        return int(head)
    except ValueError:
        return 0


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
        app: App,
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
