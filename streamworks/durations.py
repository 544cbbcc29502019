"""Durations written as text: ``"30s"``, ``"5m"``, ``"100ms"``, ``"1.5h"``, ``"2d"``.

One grammar for every place a person types a duration: ``streamworks publish
--delay 30s``, rate limits (``"5/100ms"``, :mod:`streamworks.ratelimit`) and the docs.
A number without a unit is refused rather than guessed (seconds? milliseconds?).
"""

from __future__ import annotations

import re
from datetime import timedelta

from streamworks.exceptions import ConfigurationError

__all__ = ("UNITS", "format_duration", "parse_duration", "to_milliseconds")

#: Unit suffixes and their length in milliseconds.
UNITS: dict[str, int] = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)?(?P<unit>ms|s|m|h|d)")


def parse_duration(text: str, *, what: str = "duration") -> timedelta:
    """Parse ``<number><unit>`` (units ``ms s m h d``; the number may be omitted: ``"s"`` is
    one second) into a positive :class:`~datetime.timedelta`.

    Raises:
        ConfigurationError: not of that form, or zero.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"{what} must be a string like '30s', not {text!r}")
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ConfigurationError(
            f"invalid {what} {text!r}: use a number and a unit, e.g. 100ms, 30s, 5m, 1.5h, 2d"
        )
    number = float(m["number"]) if m["number"] is not None else 1.0
    ms = number * UNITS[m["unit"]]
    if ms <= 0:
        raise ConfigurationError(f"invalid {what} {text!r}: must be more than zero")
    return timedelta(milliseconds=ms)


def to_milliseconds(value: timedelta, *, round_up: bool = True) -> int:
    """Whole milliseconds of ``value``; rounded up by default, so that a time computed
    from it is never early."""
    micros = value // timedelta(microseconds=1)
    return -((-micros) // 1000) if round_up else micros // 1000


def format_duration(value: timedelta) -> str:
    """The shortest exact text :func:`parse_duration` reads back (``90s`` -> ``"90s"``,
    ``1h`` -> ``"1h"``); fractions of a millisecond are rounded up."""
    ms = to_milliseconds(value)
    for unit in ("d", "h", "m", "s"):
        size = UNITS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
