"""When a delayed message is due: the ``delay=`` and ``at=`` arguments of a publish.

A delayed message is stored in its shard's slot and enters the stream when due
(``redis/lua/delay_add.lua``, ``delay_move.lua``; docs/design/scheduling.md). Its due
time is decided on the **Redis server's clock**, not the producer's: ``delay=`` is
sent as a relative time and added to Redis ``TIME`` inside the script, ``at=`` as an
absolute instant compared with Redis ``TIME``. So a producer whose clock is off by
minutes still delays by what it asked, and every member agrees on what is due.

Validation happens here, before anything is sent:

* ``delay`` is a :class:`~datetime.timedelta` or a number of seconds, finite and
  not negative (``0`` means due at once);
* ``at`` is a timezone-aware :class:`~datetime.datetime` (a naive one would be read
  in some machine's local zone: refused). An ``at`` in the past is due at once (a
  publish retried after a pause must not fail for being late);
* not both; and neither more than :data:`MAX_DELAY` ahead, which catches unit
  mistakes (milliseconds passed as seconds) before they park a message for years.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from streamworks.durations import to_milliseconds
from streamworks.exceptions import ConfigurationError

__all__ = ("MAX_DELAY", "Due", "due_from")

#: The furthest ahead a message may be delayed.
MAX_DELAY = timedelta(days=366)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Due:
    """When a message is due, as ``delay_add.lua`` takes it.

    Attributes:
        kind: ``"in"``: ``ms`` after the Redis server's now; ``"at"``: at ``ms`` since the
            Unix epoch (compared with the Redis server's clock).
        ms: milliseconds (rounded up: a message is never due early).
    """

    kind: Literal["in", "at"]
    ms: int

    def script_args(self) -> tuple[str, int]:
        """``ARGV[1], ARGV[2]`` of ``delay_add.lua``."""
        return self.kind, self.ms


def due_from(
    delay: timedelta | float | None = None,
    at: datetime | None = None,
    *,
    now: datetime | None = None,
    max_delay: timedelta = MAX_DELAY,
) -> Due | None:
    """Validate a publish's ``delay=`` / ``at=`` and say when the message is due.

    Args:
        delay: how long after it reaches Redis the message is due.
        at: the instant it is due (timezone-aware).
        now: the caller's wall clock, used only to refuse an ``at`` beyond
            ``max_delay`` (the due time itself is decided on the Redis clock).
        max_delay: the furthest ahead a message may be due.

    Returns:
        None when neither is given (an ordinary publish), else the :class:`Due`.

    Raises:
        ConfigurationError: both given, a negative or non-finite delay, a naive
            ``at``, or either beyond ``max_delay``.
    """
    if delay is None and at is None:
        return None
    if delay is not None and at is not None:
        raise ConfigurationError("give delay= or at=, not both")
    if delay is not None:
        return Due("in", _delay_ms(delay, max_delay))
    if not isinstance(at, datetime):
        raise ConfigurationError(f"at= must be a datetime, not {type(at).__name__}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise ConfigurationError(
            f"at= must be timezone-aware (e.g. datetime.now(UTC) + timedelta(hours=1)), "
            f"not the naive {at.isoformat()}: it would be read in some machine's local zone"
        )
    reference = now if now is not None else datetime.now(UTC)
    if at - reference > max_delay:
        raise ConfigurationError(
            f"at={at.isoformat()} is more than {max_delay.days} days ahead; "
            "a message can be delayed by at most that"
        )
    return Due("at", to_milliseconds(at - _EPOCH))


def _delay_ms(delay: timedelta | float, max_delay: timedelta) -> int:
    if isinstance(delay, timedelta):
        value = delay
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        if not math.isfinite(delay):
            raise ConfigurationError(f"delay= must be finite, not {delay!r}")
        if abs(delay) > max_delay.total_seconds():
            raise ConfigurationError(f"delay={delay!r} s is more than {max_delay.days} days")
        value = timedelta(seconds=delay)
    else:
        raise ConfigurationError(
            f"delay= must be a timedelta or a number of seconds, not {type(delay).__name__}"
        )
    if value < timedelta(0):
        raise ConfigurationError(f"delay= must not be negative, not {value}")
    if value > max_delay:
        raise ConfigurationError(
            f"delay={value} is more than {max_delay.days} days; a message can be "
            "delayed by at most that"
        )
    return to_milliseconds(value)
