"""When a periodic schedule ticks: ``every=`` or ``cron=`` (with a time zone), and
which missed ticks are published after an outage (``catch_up=``).

Pure: no I/O, no clock of its own. Instants are integer milliseconds since the Unix
epoch (the Redis server's clock, as the schedule scripts read it), so a tick has one
identity everywhere: its nominal instant. ``tick_event_id`` turns it into the event id
the tick's message is published with (the shard-level dedup of exactly one message
per tick, docs/design/scheduling.md).

* ``every=timedelta(minutes=5)`` ticks on a fixed grid: ``anchor + k * every`` (the
  anchor is the Unix epoch unless given), so every member computes the same ticks
  whenever it starts, and a tick is never "relative to the last run".
* ``cron="0 * * * *"`` (5 fields, or 6 with seconds first; ``@hourly``, ``@daily``,
  ``@weekly``, ``@monthly``, ``@yearly`` too) is evaluated by `cronsim
  <https://github.com/cuu508/cronsim>`_ in ``tz`` (an IANA name, UTC by default), with
  Debian cron's rules on daylight-saving changes: a fixed-time job in a skipped hour
  runs once right after the change, one in a repeated hour runs once (the first).
* ``catch_up`` decides what happens to ticks missed while nobody could publish:
  ``"latest"`` publishes only the most recent one, ``"all"`` every one (oldest first),
  ``N`` the ``N`` most recent. The others are counted as skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from streamworks.durations import format_duration, to_milliseconds
from streamworks.exceptions import ConfigurationError
from streamworks.protocol.shards import validate_name

__all__ = (
    "MIN_EVERY",
    "SKIPPED_COUNT_CAP",
    "CatchUp",
    "DueTicks",
    "Schedule",
    "tick_event_id",
)

CatchUp = Literal["latest", "all"] | int

#: The shortest ``every=``: each tick costs a few scripts and a dedup record kept for
#: the dedup window, so a sub-second period belongs in a loop, not in a schedule.
MIN_EVERY = timedelta(seconds=1)
#: Missed ticks are counted one by one for a cron schedule; an outage that skipped
#: more than this many reports this many.
SKIPPED_COUNT_CAP = 100_000

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class DueTicks:
    """What to do with the ticks due after the last one handled.

    Attributes:
        publish: the ticks to publish now, oldest first (ms).
        skipped: due ticks the catch-up policy drops (capped at
            :data:`SKIPPED_COUNT_CAP` for cron schedules).
    """

    publish: tuple[int, ...]
    skipped: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule's timing and catch-up policy (validated on creation).

    Raises:
        ConfigurationError: not exactly one of ``every``/``cron``; ``every`` shorter
            than :data:`MIN_EVERY`; a cron expression cronsim refuses; an unknown time
            zone; ``tz`` without ``cron``; a naive ``anchor`` or one without
            ``every``; a catch-up that is not ``"latest"``, ``"all"`` or an int >= 1.
    """

    every: timedelta | None = None
    cron: str | None = None
    tz: str | None = None
    anchor: datetime | None = None
    catch_up: CatchUp = "latest"
    _every_ms: int = field(init=False, repr=False, compare=False, default=0)
    _anchor_ms: int = field(init=False, repr=False, compare=False, default=0)
    _expr: str = field(init=False, repr=False, compare=False, default="")
    _zone: ZoneInfo | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ConfigurationError("a schedule needs exactly one of every= or cron=")
        _check_catch_up(self.catch_up)
        if self.every is not None:
            self._init_every(self.every)
        else:
            assert self.cron is not None
            self._init_cron(self.cron)

    def _init_every(self, every: timedelta) -> None:
        if not isinstance(every, timedelta):
            raise ConfigurationError(f"every= must be a timedelta, not {type(every).__name__}")
        if every < MIN_EVERY:
            raise ConfigurationError(f"every={every} is shorter than the minimum {MIN_EVERY}")
        if self.tz is not None:
            raise ConfigurationError(
                "tz= applies to cron= only: every= ticks on a fixed grid of absolute time"
            )
        anchor_ms = 0
        if self.anchor is not None:
            if not isinstance(self.anchor, datetime) or self.anchor.utcoffset() is None:
                raise ConfigurationError("anchor= must be a timezone-aware datetime")
            anchor_ms = to_milliseconds(self.anchor - _EPOCH)
        object.__setattr__(self, "_every_ms", to_milliseconds(every))
        object.__setattr__(self, "_anchor_ms", anchor_ms)

    def _init_cron(self, cron: str) -> None:
        if not isinstance(cron, str):
            raise ConfigurationError(f"cron= must be a string, not {type(cron).__name__}")
        if self.anchor is not None:
            raise ConfigurationError("anchor= applies to every= only")
        expr = _ALIASES.get(cron.strip().lower(), cron.strip())
        try:
            zone = ZoneInfo(self.tz) if self.tz is not None else None
        except (ZoneInfoNotFoundError, ValueError, TypeError) as e:
            raise ConfigurationError(f"unknown time zone tz={self.tz!r}: {e}") from e
        try:
            CronSim(expr, datetime.now(zone or UTC))
        except (CronSimError, ValueError, KeyError) as e:
            raise ConfigurationError(f"invalid cron expression {cron!r}: {e}") from e
        object.__setattr__(self, "_expr", expr)
        object.__setattr__(self, "_zone", zone)

    # -- ticks -------------------------------------------------------------------------
    def next_tick(self, after_ms: int) -> int:
        """The first tick strictly after ``after_ms``."""
        if self.every is not None:
            k = (after_ms - self._anchor_ms) // self._every_ms + 1
            return self._anchor_ms + k * self._every_ms
        return next(self._forward(after_ms))

    def ticks_after(self, after_ms: int) -> Iterator[int]:
        """Every tick strictly after ``after_ms``, in order (endless)."""
        if self.every is not None:
            tick = self.next_tick(after_ms)
            while True:
                yield tick
                tick += self._every_ms
        else:
            yield from self._forward(after_ms)

    def due(self, last_ms: int, now_ms: int, *, limit: int = 1000) -> DueTicks:
        """The ticks in ``(last_ms, now_ms]`` to publish under the catch-up policy.

        Args:
            last_ms: the last tick handled (published or skipped).
            now_ms: now, on the Redis clock.
            limit: most ticks returned at once with ``catch_up="all"`` (the caller
                publishes them and asks again from the last).
        """
        if now_ms <= last_ms:
            return DueTicks((), 0)
        keep = _keep(self.catch_up)
        if keep is None:  # "all"
            ticks = tuple(islice(self._until(last_ms, now_ms), max(1, limit)))
            return DueTicks(ticks, 0)
        if self.every is not None:
            latest = self._latest_at_or_before(now_ms)
            # last_ms may be off the grid (the period or anchor changed since): count
            # from the first tick after it.
            first = self.next_tick(last_ms)
            total = 0 if first > now_ms else (latest - first) // self._every_ms + 1
            n = min(keep, total)
            publish = tuple(latest - (n - 1 - i) * self._every_ms for i in range(n))
            return DueTicks(publish, total - n)
        recent: list[int] = []
        total = 0
        for tick in self._backward(now_ms):
            if tick <= last_ms or total >= SKIPPED_COUNT_CAP + keep:
                break
            total += 1
            if len(recent) < keep:
                recent.append(tick)
        recent.reverse()
        return DueTicks(tuple(recent), total - len(recent))

    def describe(self) -> str:
        """``every 5m`` or ``cron 0 * * * * (Europe/Paris)``: for status and logs."""
        if self.every is not None:
            text = f"every {format_duration(self.every)}"
            if self.anchor is not None:
                text += f" from {self.anchor.isoformat()}"
            return text
        return f"cron {self.cron} ({self.tz or 'UTC'})"

    # -- helpers -----------------------------------------------------------------------
    def _latest_at_or_before(self, now_ms: int) -> int:
        k = (now_ms - self._anchor_ms) // self._every_ms
        return self._anchor_ms + k * self._every_ms

    def _until(self, last_ms: int, now_ms: int) -> Iterator[int]:
        for tick in self.ticks_after(last_ms):
            if tick > now_ms:
                return
            yield tick

    def _datetime(self, ms: int) -> datetime:
        return (_EPOCH + timedelta(milliseconds=ms)).astimezone(self._zone or UTC)

    def _forward(self, after_ms: int) -> Iterator[int]:
        # cronsim yields ticks strictly after its start (whole seconds).
        for tick in CronSim(self._expr, self._datetime(after_ms)):
            yield to_milliseconds(tick - _EPOCH)

    def _backward(self, now_ms: int) -> Iterator[int]:
        # In reverse, cronsim yields ticks strictly before a whole-second start: start
        # one second after now (floored to the second) to include a tick at now.
        start = self._datetime(now_ms - now_ms % 1000) + _SECOND
        for tick in CronSim(self._expr, start, reverse=True):
            yield to_milliseconds(tick - _EPOCH)


def tick_event_id(group: str, schedule: str, tick_ms: int) -> str:
    """The event id of a schedule's tick: the same for every attempt by any member, so
    the target shard's dedup keeps exactly one message per tick."""
    validate_name("group", group)
    validate_name("schedule", schedule)
    return f"sw-tick:{group}:{schedule}:{tick_ms}"


def _keep(catch_up: CatchUp) -> int | None:
    if catch_up == "latest":
        return 1
    if catch_up == "all":
        return None
    assert isinstance(catch_up, int)
    return catch_up


def _check_catch_up(catch_up: object) -> None:
    if catch_up in ("latest", "all"):
        return
    if isinstance(catch_up, int) and not isinstance(catch_up, bool) and catch_up >= 1:
        return
    raise ConfigurationError(
        f"catch_up= must be 'latest', 'all' or a number of ticks >= 1, not {catch_up!r}"
    )
