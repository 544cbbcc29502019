"""Rate limits of a handler: ``rate_limit="200/s"``, group-wide across every member.

A limit is ``<count>/<period>`` with the period in :mod:`streamworks.durations`' units
(``"200/s"``, ``"10/m"``, ``"5/100ms"``, ``"1000/h"``, ``"3/1.5s"``) plus a burst (1
by default: runs are spaced evenly, ``period / count`` apart).

It is enforced with GCRA (the generic cell rate algorithm, a token bucket kept as one
number: the *theoretical arrival time* ``tat``) in Redis, shared by every member of the
group (``redis/lua/rate_take.lua``). A member asks once per read batch for as many
tokens as it has messages and gets back how many it may run within a horizon and when
each may start: a reservation, not a poll, so three workers pulling from one bucket
start runs exactly ``period / count`` apart between them. :func:`reserve` is the same
algorithm in Python: the reference the script is tested against, and what
:func:`start_waits` expands a script reply with.

In any window of length ``W`` at most ``burst + W * count / period`` runs start; with
a backlog, the runs start at that rate. Reserved slots a member does not use (its
lease ended, it drained) are not returned: the rate then falls below the limit, never
above it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta

from streamworks.durations import parse_duration, to_milliseconds
from streamworks.exceptions import ConfigurationError

__all__ = ("MAX_RATE_PER_SECOND", "RateLimit", "Reservation", "reserve", "start_waits")

#: The highest rate a limit may name: a Redis-backed limiter above it costs more than
#: the runs it paces.
MAX_RATE_PER_SECOND = 1_000_000

_SPEC = re.compile(r"\s*(?P<count>[0-9]+)\s*/\s*(?P<period>\S+)\s*")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``count`` runs per ``per``, with bursts of up to ``burst`` runs at once.

    Raises:
        ConfigurationError: a count or burst below 1, an empty period, or a rate above
            :data:`MAX_RATE_PER_SECOND`.
    """

    count: int
    per: timedelta
    burst: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigurationError(
                f"a rate limit's count must be an int >= 1, not {self.count!r}"
            )
        if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
            raise ConfigurationError(f"a rate limit's period must be positive, not {self.per!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigurationError(
                f"a rate limit's burst must be an int >= 1, not {self.burst!r}"
            )
        if self.count / self.per.total_seconds() > MAX_RATE_PER_SECOND:
            raise ConfigurationError(
                f"rate limit {self} is above {MAX_RATE_PER_SECOND:,} per second"
            )

    @classmethod
    def parse(cls, spec: str | RateLimit, *, burst: int = 1) -> RateLimit:
        """``"200/s"`` -> ``RateLimit(200, 1 s)``; a :class:`RateLimit` is returned as is.

        Raises:
            ConfigurationError: not ``<count>/<period>``.
        """
        if isinstance(spec, RateLimit):
            return spec
        if not isinstance(spec, str):
            raise ConfigurationError(f"rate_limit= must be a string like '200/s', not {spec!r}")
        m = _SPEC.fullmatch(spec)
        if m is None:
            raise ConfigurationError(
                f"invalid rate limit {spec!r}: use <count>/<period>, e.g. 200/s, 10/m, 5/100ms"
            )
        per = parse_duration(m["period"], what=f"rate limit period in {spec!r}")
        return cls(int(m["count"]), per, burst)

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two runs at the limit (GCRA's emission interval)."""
        return (self.per / timedelta(milliseconds=1)) / self.count

    @property
    def tolerance_ms(self) -> float:
        """How far ahead of the schedule a run may start (GCRA's burst tolerance)."""
        return (self.burst - 1) * self.interval_ms

    def script_args(self, horizon: timedelta, offset_ms: int) -> list[str | int]:
        """``ARGV[1..4]`` of ``rate_take.lua``: interval, tolerance, horizon, clock offset."""
        return [
            _ms_text(self.interval_ms),
            _ms_text(self.tolerance_ms),
            to_milliseconds(horizon),
            offset_ms,
        ]

    def __str__(self) -> str:
        ms = to_milliseconds(self.per)
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
            if ms % size == 0:
                period = unit if ms == size else f"{ms // size}{unit}"
                break
        else:
            period = f"{ms}ms"
        text = f"{self.count}/{period}"
        return text if self.burst == 1 else f"{text} (burst {self.burst})"


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one bucket granted: ``granted`` runs, the first may start ``base_ms`` - the
    limit's tolerance after now (see :func:`start_waits`); ``tat_ms`` the bucket after."""

    granted: int
    base_ms: float
    tat_ms: float


def reserve(
    tat_ms: float | None,
    now_ms: float,
    wanted: int,
    limit: RateLimit,
    horizon_ms: float,
) -> Reservation:
    """Reserve up to ``wanted`` runs of a bucket whose theoretical arrival time is
    ``tat_ms`` (None: an empty bucket), each starting no later than ``now + horizon``.

    The first run may start at ``max(now, tat - tolerance)``; each run pushes ``tat`` one
    interval on. None is granted when even the first would start beyond the horizon
    (other members reserved the time up to there): the caller asks again
    ``base_ms - tolerance - horizon`` later.
    """
    if horizon_ms < 0:
        raise ValueError(f"horizon must not be negative, not {horizon_ms}")
    t, tau = limit.interval_ms, limit.tolerance_ms
    tat = now_ms if tat_ms is None or tat_ms < now_ms else tat_ms
    base = tat - now_ms
    # Run i waits base + i*t - tau: grant those that start within the horizon. The
    # same arithmetic, in the same order, as rate_take.lua (identical doubles).
    if base - tau > horizon_ms:
        granted = 0
    else:
        granted = min(wanted, math.floor((horizon_ms + tau - base) / t) + 1)
    return Reservation(granted, base, tat + granted * t)


def start_waits(granted: int, base_ms: float, limit: RateLimit) -> list[float]:
    """How long (ms) after the reservation each of the ``granted`` runs must wait."""
    t, tau = limit.interval_ms, limit.tolerance_ms
    return [max(0.0, base_ms + i * t - tau) for i in range(granted)]


def _ms_text(value: float) -> str:
    # Lua reads it with tonumber(); fixed-point text keeps it exact enough (1 ns) and
    # never in an exponent form some parsers refuse.
    return f"{value:.6f}"
