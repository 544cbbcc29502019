"""A periodic schedule as the app declares it: ``@app.schedule(...)``.

The timing (``every=`` / ``cron=`` + ``tz=``, ``catch_up=``) is the pure
:class:`~streamworks.schedule.Schedule`; this module adds what the runtime needs to
publish a tick: the target stream, the key its ticks are routed by, and the optional
function that makes the tick's message. It is checked when the decorator runs, so a
mistake is a :class:`~streamworks.exceptions.ConfigurationError` at import time, not
a failure at the first tick hours later.

How the ticks are published, exactly one message per tick, is
``runtime/scheduler.py`` (docs/schedules.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from streamworks.exceptions import ConfigurationError
from streamworks.protocol.shards import validate_name
from streamworks.redis.keyspace import Keyspace
from streamworks.schedule import CatchUp, Schedule

__all__ = ("ScheduleSpec", "Tick", "make_schedule_spec")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: ``fn(tick)`` of a schedule: returns the tick's message (None: the Tick itself).
TickFunction = Callable[..., Any]


class Tick(BaseModel):
    """One tick of a schedule: what its function is called with, and the message
    published when the function returns None (or the schedule has none).

    Attributes:
        schedule: the schedule's name.
        at: the tick's nominal instant (UTC; for a cron schedule, the instant of the
            cron time in its ``tz``), never the late time it was published at.
        tick_ms: the same instant in milliseconds since the epoch: the tick's
            identity (its event id is ``sw-tick:<group>:<schedule>:<tick_ms>``).
        skipped: ticks the catch-up policy skipped right before this one (0 when
            this tick was finished by a new owner after a crash: counted then).
    """

    model_config = ConfigDict(frozen=True)

    schedule: str
    at: datetime
    tick_ms: int
    skipped: int = 0

    @classmethod
    def of(cls, schedule: str, tick_ms: int, skipped: int = 0) -> Tick:
        return cls(
            schedule=schedule,
            at=_EPOCH + timedelta(milliseconds=tick_ms),
            tick_ms=tick_ms,
            skipped=skipped,
        )


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A registered schedule.

    Attributes:
        name: its name (part of its Redis keys and of every tick's event id).
        stream: the declared stream each tick is published to.
        schedule: when it ticks and what happens to missed ticks.
        key: the partition key of its messages (the name by default, so one
            schedule's ticks keep their order on one shard).
        headers: headers of every tick's message.
        fn: ``fn(tick)`` returning the message (async or not; None publishes the
            :class:`Tick`); None publishes the Tick.
        wants_tick: ``fn`` takes the tick as its one parameter.
    """

    name: str
    stream: str
    schedule: Schedule
    key: str
    headers: Mapping[str, str] | None = None
    fn: TickFunction | None = None
    wants_tick: bool = True

    @property
    def is_async(self) -> bool:
        return self.fn is not None and inspect.iscoroutinefunction(self.fn)


def make_schedule_spec(
    name: str,
    *,
    stream: str,
    streams: Mapping[str, object],
    existing: Mapping[str, ScheduleSpec],
    every: timedelta | None,
    cron: str | None,
    tz: str | None,
    catch_up: CatchUp,
    anchor: datetime | None,
    key: str | None,
    headers: Mapping[str, str] | None,
    fn: TickFunction | None,
) -> ScheduleSpec:
    """Check a schedule's declaration; the spec :meth:`App.schedule` registers.

    Raises:
        ConfigurationError: an invalid name, a name already used, an undeclared or
            internal target stream, invalid timing (see
            :class:`~streamworks.schedule.Schedule`), a key or headers that are not
            strings, a function that does not take ``(tick)`` or ``()``.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"a schedule's name must be a str, not {type(name).__name__}")
    validate_name("schedule", name)
    if name in existing:
        raise ConfigurationError(f"schedule {name!r} is declared twice")
    if stream == Keyspace.SCHEDULE_STREAM:
        raise ConfigurationError(
            f"schedule {name!r}: {stream!r} is streamworks' internal schedule stream; "
            "publish the ticks to a stream of your own"
        )
    if stream not in streams:
        raise ConfigurationError(
            f"schedule {name!r} publishes to undeclared stream {stream!r}: "
            f"call app.stream({stream!r}, shards=N) first"
        )
    schedule = Schedule(every=every, cron=cron, tz=tz, anchor=anchor, catch_up=catch_up)
    if key is not None and type(key) is not str:
        raise ConfigurationError(f"schedule {name!r}: key= must be a str")
    if headers is not None and not all(
        type(k) is str and type(v) is str for k, v in headers.items()
    ):
        raise ConfigurationError(f"schedule {name!r}: headers= must map str to str")
    wants_tick = _check_function(name, fn)
    return ScheduleSpec(
        name=name,
        stream=stream,
        schedule=schedule,
        key=name if key is None else key,
        headers=dict(headers) if headers else None,
        fn=fn,
        wants_tick=wants_tick,
    )


def _check_function(name: str, fn: TickFunction | None) -> bool:
    if fn is None:
        return True
    if not callable(fn):
        raise ConfigurationError(f"@app.schedule({name!r}) needs a function, not {fn!r}")
    try:
        signature = inspect.signature(fn)
    except ValueError:
        return True  # no signature to inspect (some builtins): trust it
    try:
        signature.bind(None)
        return True
    except TypeError:
        pass
    try:
        signature.bind()
        return False
    except TypeError:
        raise ConfigurationError(
            f"schedule {name!r}: {getattr(fn, '__qualname__', fn)!r} must take the tick "
            "as its one argument (def fn(tick: Tick) -> message), or no argument"
        ) from None
