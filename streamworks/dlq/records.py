"""What the dead-letter operations take and give (``streamworks.dlq``): the
selection, a dead letter as people read it, and what a replay did."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from streamworks.exceptions import ConfigurationError, StreamworksError

__all__ = (
    "ENTRY_ID",
    "REASONS",
    "DeadLetter",
    "DeadLetterStream",
    "Kept",
    "ReplayError",
    "ReplayResult",
    "Replayed",
    "Selection",
    "entry_ms",
    "field_text",
    "parse_age",
)

#: Why an entry was dead-lettered (the ``reason`` field).
REASONS = ("max_attempts", "poison", "crashed")
#: A dead-letter stream's entry id: ``<ms>-<seq>``.
ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_AGE_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """Seconds of an age such as ``90s``, ``15m``, ``2h``, ``1d12h``, ``1w``.

    Raises:
        ConfigurationError: not an age.
    """
    value = str(text).strip().lower()
    parts = _AGE_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ConfigurationError(f"{text!r} is not an age: use e.g. 90s, 15m, 2h, 1d12h, 1w")
    return sum(float(n) * _UNIT[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters an operation acts on: ids and/or filters (all must match).

    Build it with :meth:`of`, which checks it; ``Selection()`` is every entry.
    """

    ids: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    error: str | None = None
    older_than: float | None = None  # seconds
    newer_than: float | None = None  # seconds
    limit: int | None = None

    @classmethod
    def of(
        cls,
        ids: Sequence[str] = (),
        reasons: Sequence[str] = (),
        error: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
        limit: int | None = None,
    ) -> Selection:
        """A checked selection.

        Raises:
            ConfigurationError: an id that is not a dead-letter id, an unknown reason,
                an age window nothing can match, or a limit below 1.
        """
        for entry_id in ids:
            if not ENTRY_ID.fullmatch(entry_id):
                raise ConfigurationError(
                    f"{entry_id!r} is not a dead-letter id (like 1718000000000-0; see dlq show)"
                )
        for reason in reasons:
            if reason not in REASONS:
                raise ConfigurationError(f"unknown reason {reason!r}: one of {', '.join(REASONS)}")
        if older_than is not None and newer_than is not None and newer_than <= older_than:
            raise ConfigurationError(
                "--newer-than must be longer ago than --older-than: nothing can match"
            )
        if limit is not None and limit < 1:
            raise ConfigurationError("the limit must be at least 1")
        error = error or None
        return cls(tuple(ids), tuple(reasons), error, older_than, newer_than, limit)

    @property
    def narrowed(self) -> bool:
        """Whether anything narrows the selection (else it is every entry)."""
        return bool(
            self.ids or self.reasons or self.error is not None
            or self.older_than is not None or self.newer_than is not None
        )  # fmt: skip

    def matches(self, fields: Mapping[bytes, bytes]) -> bool:
        """Whether an entry's fields pass the reason and error filters."""
        if self.reasons and field_text(fields, "reason") not in self.reasons:
            return False
        return self.error is None or self.error.lower() in field_text(fields, "error").lower()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-letter entry, decoded for people (the ``--json`` schema of an entry)."""

    id: str
    reason: str
    error: str
    traceback: str | None
    attempts: int
    group: str | None
    stream: str | None
    shard: str | None
    entry_id: str | None
    member: str | None
    failed_at_ms: int
    key: str | None
    event_id: str | None
    headers: Any
    payload: str | None
    fields: Mapping[bytes, bytes] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, entry_id: bytes, fields: Mapping[bytes, bytes]) -> DeadLetter:
        headers: Any = None
        raw_headers = fields.get(b"o.h")
        if raw_headers is not None:
            try:
                headers = orjson.loads(raw_headers)
            except orjson.JSONDecodeError:
                headers = raw_headers.decode(errors="replace")
        payload = fields.get(b"o.v")
        failed_at = field_text(fields, "failed_at")
        return cls(
            id=entry_id.decode(),
            reason=field_text(fields, "reason"),
            error=field_text(fields, "error"),
            traceback=field_text(fields, "traceback") or None,
            attempts=int(field_text(fields, "attempts") or 0),
            group=field_text(fields, "group") or None,
            stream=field_text(fields, "stream") or None,
            shard=field_text(fields, "shard") or None,
            entry_id=field_text(fields, "entry_id") or None,
            member=field_text(fields, "member") or None,
            failed_at_ms=int(failed_at) if failed_at.isdigit() else entry_ms(entry_id),
            key=field_text(fields, "o.k") if b"o.k" in fields else None,
            event_id=field_text(fields, "o.e") if b"o.e" in fields else None,
            headers=headers,
            payload=payload.decode(errors="replace") if payload is not None else None,
            fields=dict(fields),
        )

    def as_json(self) -> dict[str, Any]:
        """JSON-ready data (every attribute but the raw fields)."""
        return {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name != "fields"  # the raw entry: bytes, and what the rest decodes
        }


@dataclass(frozen=True, slots=True)
class DeadLetterStream:
    """One group's dead-letter stream of one stream."""

    group: str
    stream: str
    entries: int
    oldest_ms: int | None


@dataclass(frozen=True, slots=True)
class Replayed:
    """A dead letter replayed (or, in a dry run, that would be) to ``shard``."""

    id: str
    shard: str
    redelivery_id: str | None = None  # None in a dry run


@dataclass(frozen=True, slots=True)
class Kept:
    """A dead letter left in the dead-letter stream, and why (it cannot be replayed)."""

    id: str
    why: str


@dataclass(slots=True)
class ReplayResult:
    """What a replay did (or, with ``dry_run``, would do)."""

    group: str
    stream: str
    dry_run: bool
    replayed: list[Replayed] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)


class ReplayError(StreamworksError):
    """A replay stopped at one entry (routing lost, Redis failed): the entries before it
    were replayed (and removed from the dead-letter stream), that one and the rest not.

    Attributes:
        result: what was done before it stopped.
        stopped_at: the dead-letter id it stopped at.
    """

    def __init__(self, cause: StreamworksError, result: ReplayResult, stopped_at: str) -> None:
        done = len(result.replayed)
        if result.dry_run:
            tail = "dry run: nothing was replayed or removed"
        else:
            tail = (
                f"{done} replayed before {stopped_at} (each removed from the DLQ once "
                f"replayed); {stopped_at} and the rest are still in it"
            )
        super().__init__(f"{cause}; {tail}")
        self.result = result
        self.stopped_at = stopped_at


def field_text(fields: Mapping[bytes, bytes], name: str) -> str:
    """A field of a dead-letter entry as text ("" when absent)."""
    value = fields.get(name.encode())
    return value.decode(errors="replace") if value is not None else ""


def entry_ms(entry_id: bytes) -> int:
    """The milliseconds part of a stream entry id."""
    return int(entry_id.split(b"-", 1)[0])
